"""``zoo diagnose``: the checks of :mod:`zoo.posterior_checks` applied to a run directory (loaded by
:func:`zoo.pipeline.load_run`), and the files they write there. The checks themselves, their verdict and their report
live in :mod:`zoo.posterior_checks`, below :class:`zoo.BNN`, whose ``diagnose()`` runs them on a fit in memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import arviz as az

from zoo.pipeline import load_run
from zoo.posterior_checks import (  # noqa: F401 - the checks, re-exported as zoo.diagnostics' interface
    BFMI_MIN,
    DIAGNOSTICS_FILE,
    ENERGY_PLOT,
    ESS_MIN,
    KHAT_MAX,
    PAIR_PLOT,
    RHAT_MAX,
    SUMMARY_FILE,
    TRACE_PLOT,
    Diagnosis,
    check,
    diagnose_report,
    diagnosis_of,
    draws_would_help,
    energy_exploration,
    fmt,
    guide_log_density,
    jsonable,
    khat_interpretation,
    lp_moves_with,
    method_label,
    pareto_k,
    sampler_checks,
    verdict,
)


def run_diagnosis(run_dir: str | Path, num_samples: int | None = None) -> Diagnosis:
    """The checks of the fit a run directory holds (:func:`zoo.posterior_checks.diagnosis_of`), writing nothing.

    :param run_dir: the run directory.
    :param num_samples: as :func:`diagnose`'s.
    :returns: the diagnosis.
    :raises ZooInputError: when ``run_dir`` holds no run that can be loaded, or ``num_samples`` is below 1.
    """
    spec, data, posterior = load_run(run_dir)
    return diagnosis_of(spec, data, posterior, run_dir, num_samples)


def diagnosis(run_dir: str | Path, num_samples: int | None = None) -> tuple[dict[str, Any], az.InferenceData]:
    """:func:`diagnose`'s checks of a run directory and the InferenceData they were made on, writing nothing.

    :param run_dir: the run directory.
    :param num_samples: as :func:`diagnose`'s.
    :returns: ``(result, idata)``: :func:`check`'s result with ``run_dir``, ``method``, ``family``, ``data``,
        ``exact_sampler`` and ``advice``, and the InferenceData.
    :raises ZooInputError: when ``run_dir`` holds no run that can be loaded, or ``num_samples`` is below 1.
    """
    found = run_diagnosis(run_dir, num_samples)
    return found.result, found.idata


def diagnose(run_dir: str | Path, num_samples: int | None = None, plots: bool = True) -> dict[str, Any]:
    """Check a run directory's posterior; write posterior.nc, diagnostics.json, summary.csv and plots into it.

    MCMC runs: R-hat, bulk/tail ESS, divergences, BFMI per chain, on every stored draw (``num_samples`` thins
    each chain; divergences and BFMI are still counted on all stored draws). Guide (VI) runs: ``num_samples``
    (default 200) iid draws of q and the PSIS Pareto k-hat of q against the model's log joint.

    :param run_dir: the run directory.
    :param num_samples: the draws to check: about this many stored draws, thinned evenly per chain (MCMC), or this
        many iid draws (default 200) of the approximation; None for every stored draw (MCMC).
    :param plots: also write ``trace.png``, ``pair.png`` and (MCMC) ``energy.png``.
    :returns: the checks' result (:func:`check`'s, with the run's ``method``, ``family``, ``data``,
        ``exact_sampler`` and the ``files`` written), also written to diagnostics.json (NaN and inf as null there).
    :raises ZooInputError: when ``run_dir`` holds no run that can be loaded, or ``num_samples`` is below 1.
    """
    found = run_diagnosis(run_dir, num_samples)
    found.save(run_dir, plots)
    return found.result
