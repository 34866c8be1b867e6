"""The spec's way in: ``zoo train``'s :func:`train` builds a :class:`~zoo.bnn.BNN` from a run spec and fits it, and
:func:`load_run` reads one back; Python users take the same path through :class:`zoo.BNN` itself.

spec -> data -> net + priors -> model family + guide -> inference -> Posterior -> run directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from zoo.assemble import (  # noqa: F401 - the building blocks, re-exported for scripts and tests that assemble a run
    DEVICE_SHARE,
    build,
    build_likelihood,
    check_host_rows,
    describe,
    place,
    resolve_device,
    training_rows_stay_on_host,
)
from zoo.bnn import BNN, holds_a_fit, holds_another_spec, starting_posterior  # noqa: F401
from zoo.data import load_dataset
from zoo.data.base import Dataset
from zoo.evaluate import ValidationMonitor
from zoo.models.base import ModelFamily
from zoo.posterior import Posterior
from zoo.runs import POINT_ESTIMATE_FILE, RunLog  # noqa: F401 - re-exported
from zoo.spec import RunSpec, load_spec


def as_spec(spec: RunSpec | dict | str | Path, caller: str) -> RunSpec:
    """``spec`` itself, or the RunSpec that :func:`zoo.spec.load_spec` reads from a dict or a YAML path; anything
    else is a TypeError naming ``caller`` (``train(spec, out_dir)``) and load_spec.

    :param spec: a spec, a dict of sections, or a YAML path.
    :param caller: the calling function, for the message.
    :returns: the spec.
    :raises TypeError: anything else.
    """
    if isinstance(spec, RunSpec):
        return spec
    if not isinstance(spec, dict | str | os.PathLike):
        raise TypeError(f"zoo.pipeline.{caller}: spec is a RunSpec, a dict of sections or the path of a YAML spec, "
                        f"not {type(spec).__name__}; build one with zoo.spec.load_spec")
    return load_spec(spec)


def prepare(spec: RunSpec | dict | str | Path, run_dir: Path | None = None, log: RunLog | None = None,
            progress: bool = False) -> tuple[Dataset, ModelFamily, object, torch.device]:
    """Load the data and build the family and guide on the spec's device and dtype.

    :param spec: as for :func:`train`.
    :param run_dir: where a family keeps what it fits of its structure (None: nowhere).
    :param log: the run's log.
    :param progress: whether to show progress bars.
    :returns: the data (on the device), the family, the guide and the device.
    """
    spec = as_spec(spec, "prepare(spec)")
    data, device = place(spec, load_dataset(spec.data, spec.seed), log)
    family, guide = build(spec, data, run_dir, log, progress)
    return data, family, guide, device


@dataclass
class RunSummary:
    """Where a run's outputs went and its headline metrics.

    :param run_dir: the run directory.
    :param metrics: the test metrics (``metrics.json``).
    :param plot: the run's picture, where it has one.
    :param chains: whether the posterior is draws stored chain by chain (MCMC), whose convergence can be checked.
    """

    run_dir: Path
    metrics: dict[str, float]
    plot: Path | None
    chains: bool = False


def train(spec: RunSpec | dict | str | Path, out_dir: str | Path, resume: bool = False, progress: bool = True,
          echo=print, monitor: ValidationMonitor | None = None) -> RunSummary:
    """Fit ``spec``, evaluate it on the test set, and write spec, checkpoint, metrics and a plot to ``out_dir``.

    The run directory is claimed for the whole fit (see :func:`zoo.runs.claimed_run_directory`): a second writer, a
    directory of someone else's files, or an unwritable path is refused before anything is written. Under
    ``torchrun`` every process fits (see :mod:`zoo.distributed`) and rank 0 alone claims, evaluates and writes.

    :param spec: a :class:`~zoo.spec.RunSpec`, or a dict of sections or the path of a YAML spec, read by
        :func:`zoo.spec.load_spec`.
    :param out_dir: the run directory.
    :param resume: continue the fit checkpointed there.
    :param progress: show progress bars.
    :param echo: where the run's log lines go besides ``train.log``.
    :param monitor: scores the fit on its evaluation rows as it goes (see :class:`zoo.evaluate.ValidationMonitor`).
    :returns: where the outputs went, and the metrics.
    """
    spec = as_spec(spec, "train(spec, out_dir)")
    bnn = BNN.from_spec(spec).fit(spec.data, out=out_dir, resume=resume, progress=progress, echo=echo,
                                  monitor=monitor)
    return RunSummary(bnn.run_dir, bnn.metrics, bnn.plot, bnn.chains)


def load_run(run_dir: str | Path) -> tuple[RunSpec, Dataset, Posterior]:
    """Rebuild a trained run's data and posterior from its spec.yaml and what its inference method stored (see
    :meth:`zoo.bnn.BNN.load`).

    :param run_dir: the run directory.
    :returns: the spec, the data set and the posterior.
    """
    bnn = BNN.load(run_dir)
    return bnn.spec, bnn.data, bnn.posterior
