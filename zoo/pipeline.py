"""One pipeline for every run: spec -> data -> net + prior -> model family + guide -> inference -> Posterior.

``train`` writes the run directory; ``load_run`` rebuilds the fitted posterior from one.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import pyro
import torch

from guides.base import SiteGuide
from zoo import distributed, registry
from zoo.data import load_dataset
from zoo.data.base import Dataset
from zoo.errors import ZooInputError, ZooWarning
from zoo.evaluate import ValidationMonitor, evaluate, plot_predictive
from zoo.inference.mcmc import SAMPLES_FILE, load_samples
from zoo.likelihoods import Categorical, Gaussian, HeteroscedasticGaussian, Likelihood
from zoo.models.base import ModelFamily, restore_buffers
from zoo.models.subnetwork import MAP_DIR, SUBNET_FILE
from zoo.nets import build_net
from zoo.posterior import GuidePosterior, Posterior
from zoo.priors import assign_priors
from zoo.runs import (
    CHECKPOINT_FILE,
    METRICS_FILE,
    POINT_ESTIMATE_FILE,
    SPEC_FILE,
    RunLog,
    checkpoint_exists,
    claimed_run_directory,
    load_checkpoint,
    load_torch,
    save_torch,
    write_json,
    write_text,
)
from zoo.spec import LikelihoodSpec, RunSpec, load_spec, spec_to_yaml


def describe(spec: RunSpec) -> str:
    """``family ..., guide ...`` (SVI), ``family ..., sampled by <sampler>`` (MCMC) or ``family ..., laplace (glm)``:
    what a run fits, in one phrase."""
    method = spec.inference.method
    if method == "svi":
        how = f"guide {spec.guide.name}"
    elif method == "laplace":
        how = f"laplace ({spec.inference.predictive} predictive)"
    else:
        how = f"sampled by {method}"
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


def build_likelihood(spec: LikelihoodSpec, data: Dataset) -> Likelihood:
    """The observation model for the data's task (``auto`` picks it)."""
    name = spec.name if spec.name != "auto" else ("categorical" if data.task == "classification" else "gaussian")
    expected = "categorical" if data.task == "classification" else "gaussian"
    if name != expected:
        raise ZooInputError("likelihood.name", name, f"{data.name} is a {data.task} task; use {expected} or auto")
    if name == "categorical":
        return Categorical()
    if spec.noise == "heteroscedastic":
        return HeteroscedasticGaussian(spec.min_noise)
    noise = None if spec.noise == "learned" else float(spec.noise) / data.y_std
    return Gaussian(noise, spec.noise_prior.loc, spec.noise_prior.scale)


def load_point_values(source: str) -> dict[str, torch.Tensor]:
    """Point values by site name from a run directory, a point-estimate file or a plain net ``state_dict``."""
    path = Path(source)
    if path.is_dir():
        path = path / POINT_ESTIMATE_FILE
    if not path.is_file():
        raise ZooInputError("guide.init_from", source, "give a run directory (with point_estimate.pt) or a .pt file")
    values = load_torch(path)
    if not isinstance(values, dict) or not all(torch.is_tensor(v) for v in values.values()):
        raise ZooInputError("guide.init_from", source, "the file must hold a dict of tensors keyed by site name")
    return values


def build(spec: RunSpec, data: Dataset, run_dir: Path | None = None, log: RunLog | None = None,
          progress: bool = False) -> tuple[ModelFamily, SiteGuide]:
    """Net, priors, likelihood, family and guide for ``spec`` on ``data`` (seeded: same spec, same init).

    A family whose structure depends on a fit to the data (the subnetwork family: a MAP net and a selected
    subnet) does that in its ``prepare`` here, keeping what it fitted in ``run_dir`` for resumes and reloads.
    """
    pyro.set_rng_seed(spec.seed)
    likelihood = build_likelihood(spec.likelihood, data)
    net = build_net(spec.net, data.in_dim, likelihood.net_outputs(data.out_dim))
    family_cls = registry.FAMILIES[spec.model.family]
    priors = assign_priors(spec.prior, family_cls.prior_sites(net))
    family = family_cls.from_spec(net, priors, likelihood, spec.model)
    family.to(data.x_train.device, data.x_train.dtype)
    if hasattr(family, "prepare"):
        family.prepare(data, run_dir, spec.seed, log or RunLog(None, echo=None), progress)
        pyro.set_rng_seed(spec.seed)
    guide = registry.GUIDES[spec.guide.name].from_spec(family.latent_sites(), spec.guide)
    if spec.guide.init_from:
        matched = guide.init_from(load_point_values(spec.guide.init_from))
        if not matched:
            raise ZooInputError("guide.init_from", spec.guide.init_from, "no site name and shape matches this net")
    return family, guide


def prepare(spec: RunSpec, run_dir: Path | None = None, log: RunLog | None = None,
            progress: bool = False) -> tuple[Dataset, ModelFamily, SiteGuide, torch.device]:
    """Load the data and build the family and guide on the spec's device and dtype."""
    device, dtype = resolve_device(spec.device), getattr(torch, spec.dtype)
    data = load_dataset(spec.data, spec.seed).to(device, dtype)
    family, guide = build(spec, data, run_dir, log, progress)
    guide.to(device=device, dtype=dtype)
    return data, family, guide, device


@dataclass
class RunSummary:
    """Where a run's outputs went and its headline metrics."""

    run_dir: Path
    metrics: dict[str, float]
    plot: Path | None


def train(spec: RunSpec, out_dir: str | Path, resume: bool = False, progress: bool = True, echo=print,
          monitor: ValidationMonitor | None = None) -> RunSummary:
    """Fit ``spec``, evaluate it on the test set, and write spec, checkpoint, metrics and a plot to ``out_dir``.

    The run directory is claimed for the whole fit (see :func:`zoo.runs.claimed_run_directory`): a second writer, a
    directory of someone else's files, or an unwritable path is refused before anything is written. Under
    ``torchrun`` every process fits (see :mod:`zoo.distributed`) and rank 0 alone claims, evaluates and writes.
    ``monitor`` scores the fit on its evaluation rows as it goes (see :class:`zoo.evaluate.ValidationMonitor`).
    """
    team = distributed.join(resolve_device(spec.device))
    claim = claimed_run_directory(Path(out_dir), resume) if team.is_writer else contextlib.nullcontext(Path(out_dir))
    try:
        with claim as out:
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
            fit = registry.INFERENCE[spec.inference.method]
            result = fit(family, guide, data, spec.inference, spec.seed, run_dir=out, resume=resume, log=log,
                         progress=progress and team.is_writer, monitor=monitor)
            if not team.is_writer:  # rank 0 evaluates and writes
                return RunSummary(out, {}, None)
            posterior = result.posterior
            metrics = evaluate(posterior, data, spec.inference.predictive_samples, seed=spec.seed)
            metrics["train_seconds"] = round(result.seconds, 3)
            if isinstance(posterior, GuidePosterior):  # what guide.init_from of a later run reads
                save_torch(out / POINT_ESTIMATE_FILE, guide.point_estimate())
            write_json(out / METRICS_FILE, metrics)
            plot = plot_predictive(posterior, data, out, spec.inference.predictive_samples, seed=spec.seed)
    finally:
        distributed.leave()
    return RunSummary(out, metrics, plot)


def holds_a_fit(run_dir: Path) -> bool:
    """Whether a run directory holds anything a fit wrote (a checkpoint, draws, or a subnetwork's MAP stage)."""
    run = Path(run_dir)
    return (any(checkpoint_exists(run / name) for name in (CHECKPOINT_FILE, SAMPLES_FILE))
            or (run / SUBNET_FILE).exists() or (run / MAP_DIR).exists())


def load_run(run_dir: str | Path) -> tuple[RunSpec, Dataset, Posterior]:
    """Rebuild a trained run's data and posterior from its spec.yaml and checkpoint (or MCMC samples).

    An unfinished SVI run loads at the step it reached, with a :class:`~zoo.errors.ZooWarning` saying so; an
    unfinished MCMC run is refused (its draws are not there yet).
    """
    run = Path(run_dir)
    stored = SAMPLES_FILE if checkpoint_exists(run / SAMPLES_FILE) else CHECKPOINT_FILE
    if not (run / SPEC_FILE).exists():
        raise ZooInputError("RUN_DIR", str(run), "not a run directory (it has no spec.yaml)")
    if not checkpoint_exists(run / stored):
        stage = "its MAP net is being fitted" if (run / MAP_DIR).exists() else "nothing was fitted yet"
        raise ZooInputError("RUN_DIR", str(run), f"holds no checkpoint.pt or samples.pt ({stage}); finish it with "
                            "zoo train --resume")
    spec = load_spec(run / SPEC_FILE)
    data, family, guide, device = prepare(spec, run)
    if stored == SAMPLES_FILE:
        if family.point_parameters():  # e.g. rank-1's W, fitted by the run MCMC started from
            _, _, start = load_run(spec.inference.init)
            with torch.no_grad():
                for mine, theirs in zip(family.point_parameters(), start.family.point_parameters(), strict=True):
                    mine.copy_(theirs)
        return spec, data, load_samples(run, family, device).posterior
    state = load_checkpoint(run / CHECKPOINT_FILE, device)
    if not state.get("done", True):
        reached = f"step {state['step']}" + (f" of {state['total_steps']}" if "total_steps" in state else "")
        warnings.warn(f"{run} is an unfinished run: its checkpoint is at {reached}, so this is the posterior of that "
                      "step, not the final one (finish it with zoo train --resume)", ZooWarning, stacklevel=2)
    guide.load_state_dict(state["guide"])
    with torch.no_grad():
        for p, saved in zip(family.point_parameters(), state["point_parameters"], strict=True):
            p.copy_(saved)
    restore_buffers(family, state.get("buffers"))
    if "hyperparameters" in state:  # e.g. a prior precision tuned by the Laplace evidence
        family.set_hyperparameters(state["hyperparameters"])
    return spec, data, registry.GUIDE_POSTERIORS[spec.inference.method](family, guide, spec.inference)
