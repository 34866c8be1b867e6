"""One pipeline for every run: spec -> data -> net + prior -> model family + guide -> inference -> Posterior.

``train`` writes the run directory; ``load_run`` rebuilds the fitted posterior from one.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import pyro
import torch

from guides.base import Guide
from zoo import distributed, registry
from zoo.data import load_dataset
from zoo.data.base import Dataset
from zoo.errors import ZooInputError
from zoo.evaluate import ValidationMonitor, evaluate, plot_predictive
from zoo.inference.svi import SVI
from zoo.likelihoods import AutoLikelihoodSpec, Likelihood, LikelihoodSection
from zoo.models.base import ModelFamily, StructureFit
from zoo.models.subnetwork import MAP_DIR, SUBNET_FILE
from zoo.nets import build_net
from zoo.posterior import ChainPosterior, GuidePosterior, Posterior
from zoo.priors import assign_priors
from zoo.runs import (
    METRICS_FILE,
    POINT_ESTIMATE_FILE,
    SPEC_FILE,
    RunLog,
    claimed_run_directory,
    load_point_values,
    save_torch,
    write_json,
    write_text,
)
from zoo.spec import RunSpec, load_spec, spec_to_yaml
from zoo.tasks import task_of


def describe(spec: RunSpec) -> str:
    """``family ..., guide ...`` (a method that fits the spec's guide) or ``family ..., <the method's phrase>``
    (``sampled by hmc``, ``laplace (glm predictive)``): what a run fits, in one phrase."""
    method = registry.method_of(spec)
    how = f"guide {spec.guide.label}" if method.fits_guide else method.describe(spec.inference)
    return f"family {spec.model.family}, {how}"


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when present, else CPU; asking for CUDA without it is an input error. Under ``torchrun``
    each process takes the GPU of its local rank."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ZooInputError("device", name, "no CUDA device is visible here; use device: auto or cpu")
    if name == "cuda" and distributed.launched_by_torchrun():
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device(name)


def build_likelihood(spec: LikelihoodSection | AutoLikelihoodSpec, data: Dataset) -> Likelihood:
    """The observation model for the data's task (``auto`` picks it).

    :param spec: the spec's likelihood section.
    :param data: the data set.
    :returns: the likelihood.
    :raises ZooInputError: a likelihood of another task.
    """
    task = task_of(data)
    section = spec.resolve(task.likelihood) if isinstance(spec, AutoLikelihoodSpec) else spec
    if section.task != task.name:
        raise ZooInputError("likelihood.name", section.name, f"{data.name} is a {task.name} task; use "
                            f"{task.likelihood} or auto")
    return section.build(data)


def build(spec: RunSpec, data: Dataset, run_dir: Path | None = None, log: RunLog | None = None,
          progress: bool = False) -> tuple[ModelFamily, Guide]:
    """Net, priors, likelihood, family and guide for ``spec`` on ``data`` (seeded: same spec, same init).

    A family whose structure depends on a fit to the data (the subnetwork family: a MAP net and a selected
    subnet) fits it here (:meth:`~zoo.models.base.ModelFamily.fit_structure`), keeping what it fitted in
    ``run_dir`` for resumes and reloads.

    :param spec: the run spec.
    :param data: the data, on the run's device and dtype.
    :param run_dir: where a family keeps what it fits of its structure (None: nowhere).
    :param log: the run's log.
    :param progress: whether to show progress bars.
    :returns: the family and the guide.
    """
    pyro.set_rng_seed(spec.seed)
    likelihood = build_likelihood(spec.likelihood, data)
    net = build_net(spec.net, data.in_dim, likelihood.net_outputs(data.out_dim), data.image_shape, data.name)
    family = spec.model.build(net, assign_priors(spec.prior, spec.model.prior_sites(net)), likelihood)
    family.to(data.device, data.x_test.dtype)
    # handed the SVI fit for a MAP net: families do not import inference methods
    family.fit_structure(data, StructureFit(run_dir, spec.seed, log or RunLog(None, echo=None), progress,
                                            fit_map=SVI().fit))
    pyro.set_rng_seed(spec.seed)
    guide = spec.guide.build(family.latent_sites())
    # a guide built on the model itself (Pyro's autoguides) traces it at two rows
    guide.bind(family.model, data.x_train[:2].to(data.device), data.y_train[:2].to(data.device))
    if spec.guide.init_from:
        matched = guide.init_from(load_point_values(spec.guide.init_from))
        if not matched:
            raise ZooInputError("guide.init_from", spec.guide.init_from, "no site name and shape matches this net")
    return family, guide


def as_spec(spec: RunSpec | dict | str | Path, caller: str) -> RunSpec:
    """``spec`` itself, or the RunSpec that :func:`zoo.spec.load_spec` reads from a dict or a YAML path; anything
    else is a TypeError naming ``caller`` (``train(spec, out_dir)``) and load_spec."""
    if isinstance(spec, RunSpec):
        return spec
    if not isinstance(spec, dict | str | os.PathLike):
        raise TypeError(f"zoo.pipeline.{caller}: spec is a RunSpec, a dict of sections or the path of a YAML spec, "
                        f"not {type(spec).__name__}; build one with zoo.spec.load_spec")
    return load_spec(spec)


def prepare(spec: RunSpec | dict | str | Path, run_dir: Path | None = None, log: RunLog | None = None,
            progress: bool = False) -> tuple[Dataset, ModelFamily, Guide, torch.device]:
    """Load the data and build the family and guide on the spec's device and dtype (``spec`` as for
    :func:`train`)."""
    spec = as_spec(spec, "prepare(spec)")
    device, dtype = resolve_device(spec.device), getattr(torch, spec.dtype)
    data = load_dataset(spec.data, spec.seed)
    on_host = training_rows_stay_on_host(data, device, dtype)
    if on_host:
        check_host_rows(spec, data)
        (log or RunLog(None, echo=None))(
            f"the training rows ({data.training_bytes(dtype) / 2**30:.1f} GiB) stay in host memory: more than "
            f"{DEVICE_SHARE:.0%} of the GPU's free memory; each minibatch is moved to the GPU as SVI steps")
    data = data.to(device, dtype, training_rows_on_host=on_host)
    family, guide = build(spec, data, run_dir, log, progress)
    guide.to(device=device, dtype=dtype)
    return data, family, guide, device


DEVICE_SHARE = 0.5  # the most of a GPU's free memory the training rows may take (the rest: the net, activations)


def training_rows_stay_on_host(data: Dataset, device: torch.device, dtype: torch.dtype,
                               free_bytes: int | None = None) -> bool:
    """Whether the training rows are too large for the device: on CUDA, more than :data:`DEVICE_SHARE` of its free
    memory (``free_bytes``, else asked of the device). A CPU run holds everything in memory as it is."""
    if device.type != "cuda":
        return False
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info(device)[0]
    return data.training_bytes(dtype) > DEVICE_SHARE * free_bytes


def check_host_rows(spec: RunSpec, data: Dataset) -> None:
    """Refuse what cannot step on training rows kept in host memory: a method that does not stream them a batch at
    a time, or a family or guide that needs every row on the device at once.

    :param spec: the run spec.
    :param data: the data set (in host memory).
    :raises ZooInputError: what cannot work on rows in host memory, with what to change.
    """
    why = ("the training rows do not fit on the GPU (more than half its free memory), so they stay in host memory "
           "and are moved a minibatch at a time")
    registry.method_of(spec).check_rows_on_host(spec.inference, data.n_train, why)
    if spec.guide.needs_every_row:
        raise ZooInputError(*spec.guide.chosen_by, f"{why}; completing this guide takes every row on the "
                            "device: use another guide, or a smaller data set")
    if spec.model.needs_every_row:
        raise ZooInputError("model.family", spec.model.family, f"{why}; this family fits its structure on every row "
                            "on the device: use another family, or a smaller data set")


@dataclass
class RunSummary:
    """Where a run's outputs went and its headline metrics."""

    run_dir: Path
    metrics: dict[str, float]
    plot: Path | None
    chains: bool = False  # the posterior is draws stored chain by chain (MCMC): convergence can be checked


def train(spec: RunSpec | dict | str | Path, out_dir: str | Path, resume: bool = False, progress: bool = True,
          echo=print, monitor: ValidationMonitor | None = None) -> RunSummary:
    """Fit ``spec``, evaluate it on the test set, and write spec, checkpoint, metrics and a plot to ``out_dir``.

    ``spec`` is a :class:`~zoo.spec.RunSpec`, or a dict of sections or the path of a YAML spec, read by
    :func:`zoo.spec.load_spec`.

    The run directory is claimed for the whole fit (see :func:`zoo.runs.claimed_run_directory`): a second writer, a
    directory of someone else's files, or an unwritable path is refused before anything is written. Under
    ``torchrun`` every process fits (see :mod:`zoo.distributed`) and rank 0 alone claims, evaluates and writes.
    ``monitor`` scores the fit on its evaluation rows as it goes (see :class:`zoo.evaluate.ValidationMonitor`).
    """
    spec = as_spec(spec, "train(spec, out_dir)")
    with distributed.joined(resolve_device(spec.device)) as team, (
            claimed_run_directory(Path(out_dir), resume) if team.is_writer else contextlib.nullcontext(Path(out_dir))
    ) as out:
        if resume:
            saved = out / SPEC_FILE
            if saved.exists() and load_spec(saved).model_dump() != spec.model_dump():
                raise ZooInputError("--resume", str(out),
                                    "the spec differs from the run's spec.yaml; resume with that spec")
        elif team.is_writer and holds_a_fit(out):
            raise ZooInputError("--out", str(out),
                                "already holds a run; pass --resume to continue it, or pick a new --out")
        write_text(out / SPEC_FILE, spec_to_yaml(spec))
        log = RunLog(out, echo if team.is_writer else None)
        data, family, guide, device = prepare(spec, out, log, progress and team.is_writer)
        log(f"{data.name}: {data.n_train} train / {len(data.y_test)} test, {data.in_dim} inputs -> "
            f"{data.out_dim} outputs; {describe(spec)}, device {device}"
            + (f", {team.size} processes" if team.size > 1 else ""))
        method = registry.method_of(spec)
        result = method.fit(family, guide, data, spec.inference, spec.seed, run_dir=out, resume=resume, log=log,
                            progress=progress and team.is_writer, monitor=monitor, start=starting_posterior(spec))
        if not team.is_writer:  # rank 0 evaluates and writes
            return RunSummary(out, {}, None)
        posterior = result.posterior
        metrics = evaluate(posterior, data, spec.inference.predictive_samples, seed=spec.seed)
        metrics["train_seconds"] = round(result.seconds, 3)
        if isinstance(posterior, GuidePosterior):  # what guide.init_from of a later run reads
            save_torch(out / POINT_ESTIMATE_FILE, guide.point_estimate())
        write_json(out / METRICS_FILE, metrics)
        plot = plot_predictive(posterior, data, out, spec.inference.predictive_samples, seed=spec.seed)
    return RunSummary(out, metrics, plot, isinstance(posterior, ChainPosterior))


def starting_posterior(spec: RunSpec) -> Posterior | None:
    """The posterior of the run the spec's inference method starts from (e.g. MCMC's ``inference.init``), if any."""
    source = registry.method_of(spec).start_from(spec.inference)
    return load_run(source)[2] if source is not None else None


def holds_a_fit(run_dir: Path) -> bool:
    """Whether a run directory holds anything a fit wrote (any method's files, or a subnetwork's MAP stage)."""
    run = Path(run_dir)
    return (any(method.holds_fit(run) for method in registry.METHODS.values())
            or (run / SUBNET_FILE).exists() or (run / MAP_DIR).exists())


def load_run(run_dir: str | Path) -> tuple[RunSpec, Dataset, Posterior]:
    """Rebuild a trained run's data and posterior from its spec.yaml and what its inference method stored.

    An unfinished SVI run loads at the step it reached, with a :class:`~zoo.errors.ZooWarning` saying so; an
    unfinished MCMC run is refused (its draws are not there yet).
    """
    run = Path(run_dir)
    if not (run / SPEC_FILE).exists():
        raise ZooInputError("RUN_DIR", str(run), "not a run directory (it has no spec.yaml)")
    spec = load_spec(run / SPEC_FILE)
    method = registry.method_of(spec)
    if not method.holds_fit(run):
        stage = "its MAP net is being fitted" if (run / MAP_DIR).exists() else "nothing was fitted yet"
        raise ZooInputError("RUN_DIR", str(run), f"holds no {' or '.join(method.files)} ({stage}); finish it with "
                            "zoo train --resume")
    data, family, guide, device = prepare(spec, run)
    # a fitted run needs the run it started from only for the point parameters it did not fit itself (rank-1's W)
    start = starting_posterior(spec) if family.point_parameters() else None
    posterior = method.load(family, guide, spec.inference, run, device, start=start)
    return spec, data, posterior
