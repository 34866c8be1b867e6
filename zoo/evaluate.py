"""Test-set evaluation of any Posterior: the flat metrics of metrics.json, the run's plot, and pruning."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyro
import torch

from zoo.data.base import Dataset
from zoo.errors import ZooInputError
from zoo.models.base import ModelFamily
from zoo.posterior import GuidePosterior, MaskedPosterior, Posterior, SamplePosterior
from zoo.runs import check_size_fits
from zoo.tasks import task_of


def evaluate(posterior: Posterior, data: Dataset, num_samples: int, seed: int = 0) -> dict[str, float]:
    """The data's task's test metrics (see :mod:`zoo.tasks`) from ``num_samples`` draws, seeded.

    Classification: accuracy, nll, ece, brier and OOD AUROCs from one set of draws for test and OOD inputs.
    Regression: rmse and test_ll in original units (from the closed form where the posterior has one).

    :param posterior: the fitted posterior.
    :param data: the data set whose test (and OOD) inputs are scored.
    :param num_samples: posterior draws to average over.
    :param seed: seeds the draws (Pyro's generators are set to ``seed + 1``), so that a run scores the same twice.
    :returns: the flat metrics of metrics.json, e.g. ``{"accuracy": ..., "nll": ..., "ece": ..., "brier": ...}``.
    :raises ZooInputError: when ``num_samples`` is below 1, or scoring that many draws would take more than half the
        memory available (:func:`check_draws_fit`).
    """
    if num_samples < 1:
        raise ZooInputError("--samples", num_samples, "use a positive number of posterior draws")
    if len(data.y_test) == 0:
        raise ZooInputError("data", data.name, "has no test rows to score (a run of data given in Python keeps only "
                            "two example rows): score it with zoo.load(run_dir).evaluate((x, y))")
    check_draws_fit(posterior, data, num_samples)
    pyro.set_rng_seed(seed + 1)
    return task_of(data).evaluate(posterior, data, num_samples)


def check_draw_memory(posterior: Posterior | ModelFamily, num_samples: int, rows: int, per_row: int,
                      element_size: int, field: str, scored: str = "rows", also: str = "") -> None:
    """The one estimate of what posterior draws take while they are scored, refused before any draw where it is more
    than half the memory available (:func:`zoo.runs.check_size_fits`): every latent element of each draw, and
    ``per_row`` numbers of each draw for each row scored, at ``element_size`` bytes.

    :param posterior: the posterior whose latent sites are drawn (or, before a fit, its family).
    :param num_samples: the number of draws asked for.
    :param rows: the rows each draw is scored on.
    :param per_row: numbers held per draw and row (e.g. three copies of the net's outputs).
    :param element_size: bytes a number.
    :param field: the option or setting that asked for the draws, named in the refusal.
    :param scored: what the rows are, for the message.
    :param also: a further fix, appended to the largest count that fits.
    :raises ZooInputError: naming the estimate, the limit and the largest count that fits.
    """
    family = getattr(posterior, "family", posterior)
    latent = sum(site.shape.numel() for site in family.latent_sites().values())
    each = (latent + rows * per_row) * element_size  # one draw's bytes
    sep = " " if field.startswith("-") else "=" if field.isidentifier() else ": "  # --samples N, num_samples=N
    check_size_fits(field, num_samples, num_samples * each,
                    lambda allowed: f"use {field}{sep}{max(1, int(allowed // each)):,} or fewer ({each:,} bytes a "
                    f"draw){also}", f"{num_samples:,} draws scored on {rows:,} {scored}")


def check_draws_fit(posterior: Posterior | ModelFamily, data: Dataset, num_samples: int,
                    field: str = "--samples") -> None:
    """Refuse, before any draw, a number of draws whose scoring of the test and OOD inputs would take more than half
    the memory available: three copies of each draw's outputs (the net's output, the predictive's log-probabilities,
    a working copy) on every input (:func:`check_draw_memory`).

    :param posterior: the posterior whose latent sites are drawn (or, before a fit, its family).
    :param data: the data set whose test and OOD inputs are scored.
    :param num_samples: the number of draws asked for.
    :param field: the option or setting that asked for them, named in the refusal.
    :raises ZooInputError: when the draws would take more than half the memory available (never where the memory
        available is unknown).
    """
    rows = len(data.x_test) + sum(len(x) for x in data.x_ood.values())
    check_draw_memory(posterior, num_samples, rows, 3 * max(data.out_dim, 1), data.x_test.element_size(), field)


class ValidationMonitor:
    """Scores a fit's current posterior on its evaluation rows ``reports`` times during the fit, evenly spaced.

    ``on_score(k, value)`` receives the k-th score (k = 1..reports) of ``metric``; it may raise to stop the fit (a
    sweep's pruner does). Scoring draws from its own seeded stream and leaves every random state as it found it, so
    a monitored fit takes exactly the steps an unmonitored one takes. Inference methods without intermediate
    posteriors (MCMC, Laplace) score once, at the end, as report ``reports``.

    :param metric: the key of :func:`evaluate`'s metrics to score, e.g. ``"nll"``.
    :param on_score: called as ``on_score(k, value)`` with each score.
    :param num_samples: posterior draws per score.
    :param seed: seeds each score's draws, as :func:`evaluate`'s ``seed``.
    :param reports: how many scores over the fit.
    :raises ZooInputError: when ``reports`` is below 1.
    """

    def __init__(self, metric: str, on_score: Callable[[int, float], None], num_samples: int, seed: int = 0,
                 reports: int = 10) -> None:
        if reports < 1:
            raise ZooInputError("reports", reports, "score a fit at least once")
        self.metric, self.on_score, self.num_samples, self.seed, self.reports = (metric, on_score, num_samples,
                                                                                 seed, reports)
        self.reported = 0

    def due(self, step: int, total_steps: int) -> bool:
        """Whether ``step`` of ``total_steps`` completes the next report's share of the fit.

        :param step: the fit's steps done so far.
        :param total_steps: the fit's steps in all.
        :returns: True when the next score is due.
        """
        return step * self.reports // max(total_steps, 1) > self.reported

    def __call__(self, step: int, total_steps: int, posterior: Posterior, data: Dataset) -> None:
        """Score ``posterior`` as the report that ``step`` of ``total_steps`` completes."""
        k = min(self.reports, step * self.reports // max(total_steps, 1))
        cpu_rng, py_rng, np_rng = torch.get_rng_state(), random.getstate(), np.random.get_state()
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        try:
            with torch.no_grad():
                value = evaluate(posterior, data, self.num_samples, self.seed)[self.metric]
        finally:
            torch.set_rng_state(cpu_rng)
            random.setstate(py_rng)
            np.random.set_state(np_rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)
        self.reported = k
        self.on_score(k, float(value))

    def final(self, posterior: Posterior, data: Dataset) -> None:
        """Score a finished fit (once, as the last report) unless its last report is already in.

        :param posterior: the finished fit's posterior.
        :param data: the data set whose evaluation rows are scored.
        """
        if self.reported < self.reports:
            self(self.reports, self.reports, posterior, data)


def plot_predictive(posterior: Posterior, data: Dataset, run_dir: Path, num_samples: int, seed: int = 0) -> Path | None:
    """The run's picture: an uncertainty band for 1-D regression, a reliability diagram for classification.

    Seeded like :func:`evaluate`, so a reliability diagram shows the same draws as metrics.json.

    :param posterior: the fitted posterior.
    :param data: the run's data set.
    :param run_dir: the directory the picture is written to (``uncertainty.png`` or ``reliability.png``).
    :param num_samples: posterior draws to plot.
    :param seed: seeds the draws, as :func:`evaluate`'s ``seed``.
    :returns: the picture's path, or None where the task has none for this data (regression with more than one
        input feature).
    """
    pyro.set_rng_seed(seed + 1)
    return task_of(data).plot(posterior, data, run_dir, num_samples)


def _not_prunable(posterior: Posterior) -> tuple[str, str]:
    """What a posterior that cannot be pruned is, and why it cannot: (its kind, the reason)."""
    from guides.delta import DeltaGuide
    from guides.dropout import DropoutGuide
    from guides.mixture import BatchEnsembleGuide, MixtureGuide

    if isinstance(posterior, SamplePosterior):
        return ("stored draws", f"this run's posterior is {len(next(iter(posterior.draws.values()), []))} stored "
                "draws of the weights (an MCMC or SG-MCMC run), with no mean and scale per weight")
    if not isinstance(posterior, GuidePosterior):
        kind = type(posterior).__name__.removesuffix("Posterior") or type(posterior).__name__
        how = ("a Gaussian whose low-rank covariance couples the weights (SWAG)" if kind.startswith("SWAG")
               else f"a {kind} posterior")
        return (kind, f"this run's posterior is {how}, not a mean-field guide's independent scale per weight")
    guide = posterior.guide
    if isinstance(guide, DeltaGuide):
        why = "this run's guide is a point estimate (delta: MAP or an ensemble member), which has no scales"
    elif isinstance(guide, MixtureGuide | BatchEnsembleGuide):
        why = "this run's guide is over rank-1 factors, which scale whole units, not individual weights"
    elif isinstance(guide, DropoutGuide):
        why = "this run's guide is MC dropout's masks, which have no scale per weight"
    elif any(s.plate for s in guide.sites.values()):
        why = "this run's guide has one copy of each weight per ensemble member (a plate), not one scale per weight"
    else:
        why = f"this run's guide ({type(guide).__name__}) has no independent mean and scale per weight"
    return (type(guide).__name__, why)


def prune_by_snr(posterior: Posterior, fraction: float) -> MaskedPosterior:
    """Fix the ``fraction`` of weights with the lowest signal-to-noise |mu|/sigma at zero (Blundell et al. 2015).

    :param posterior: a fitted mean-field guide's posterior over individual weights.
    :param fraction: the share of weights to prune, in ``[0, 1)``.
    :returns: ``posterior`` with the pruned weights masked to zero.
    :raises ZooInputError: when the posterior has no mean-field guide over individual weights (e.g. rank-1
        factors), or ``fraction`` lies outside ``[0, 1)``.
    """
    guide = posterior.guide if isinstance(posterior, GuidePosterior) else None
    snr = guide.signal_to_noise() if guide is not None else None
    if snr is None or any(s.plate for s in guide.sites.values()):
        what, why = _not_prunable(posterior)
        raise ZooInputError("zoo prune", what, f"{why}; pruning ranks weights by |mu|/sigma, the means and scales of "
                            "a mean-field guide over individual weights: prune a run of inference.method: svi with "
                            "guide.name: mean_field")
    if not 0.0 <= fraction < 1.0:
        raise ZooInputError("--fractions", fraction, "each fraction must be in [0, 1)")
    flat = torch.cat([v.flatten() for v in snr.values()])
    k = int(round(fraction * flat.numel()))
    threshold = flat.kthvalue(k).values if k > 0 else flat.new_tensor(-1.0)
    return MaskedPosterior(posterior, {name: (v > threshold).to(v.dtype) for name, v in snr.items()})
