"""Draws stored chain by chain: what every sampler (MCMC, SG-MCMC) writes to ``samples.pt`` and reads back as a
:class:`~zoo.posterior.ChainPosterior`, and the :class:`StoredDraws` method base they share."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from zoo.errors import ZooInputError
from zoo.inference.base import (
    InferenceMethod,
    copy_point_parameters,
    restore_hyperparameters,
    result_record,
    starting_run,
)
from zoo.models.base import ModelFamily
from zoo.posterior import ChainPosterior, Posterior
from zoo.runs import load_checkpoint

SAMPLES_FILE = "samples.pt"


# ------------------------------------------------------------------------------------------ results
@dataclass
class MCMCResult:
    """Draws ``{site: [chains, samples, *shape]}``, per-draw sampler statistics ``[chains, samples]``, timing.

    :param draws: the draws of every latent site, ``{site: [chains, samples, *shape]}``.
    :param stats: per-draw sampler statistics, ``{name: [chains, samples]}`` (e.g. ``potential``).
    :param seconds: the fit's wall time.
    :param method: the sampler that drew them (``nuts``, ``hmc``, ``sgld``, ...).
    :param settings: the sampler's settings worth recording (e.g. its step size).
    :param posterior: the draws as a posterior over the family, once one is made.
    :param chosen: what the fit chose on its calibration rows, by spec field (SG-MCMC's ``inference.lr`` and its
        burn-in's open settings; :func:`~zoo.inference.lr_choice.fit_choosing_lr`).
    """

    draws: dict[str, torch.Tensor]
    stats: dict[str, torch.Tensor]
    seconds: float = 0.0
    method: str = "nuts"
    settings: dict[str, float] = field(default_factory=dict)
    posterior: Posterior | None = None
    chosen: dict[str, Any] = field(default_factory=dict)

    def flat_draws(self) -> dict[str, torch.Tensor]:
        """All chains' draws, chain after chain.

        :returns: ``{site: [chains * samples, *shape]}``.
        """
        return {n: v.flatten(0, 1) for n, v in self.draws.items()}


def load_samples(run_dir: Path, family: ModelFamily, device: torch.device | str = "cpu") -> MCMCResult:
    """The MCMC result stored in a run directory (``samples.pt``), with its posterior over ``family``.

    :param run_dir: the run directory.
    :param family: the model family the draws are of.
    :param device: where the draws go.
    :returns: the stored result, its :attr:`~MCMCResult.posterior` a :class:`~zoo.posterior.ChainPosterior`.
    :raises ZooInputError: when the run is unfinished.
    """
    state = load_checkpoint(Path(run_dir) / SAMPLES_FILE, device)
    if not state.get("done", False):
        raise ZooInputError("RUN_DIR", str(run_dir), f"holds an unfinished MCMC run ({sampling_progress(state)}); "
                            "finish it with zoo train --resume")
    restore_hyperparameters(family, state)  # a prior widened by the fit's factor
    result = MCMCResult(state["draws"], state["stats"], state["seconds"], state["method"], state["settings"])
    result.posterior = ChainPosterior(family, result.draws, result.stats, result.settings)
    return result


def sampling_progress(state: dict) -> str:
    """How far a stored, unfinished MCMC run got: ``iteration 120`` (HMC) or ``2 chain(s) finished; chain 2 at
    iteration 300/1000`` (NUTS).

    :param state: the stored state of ``samples.pt``.
    :returns: the phrase.
    """
    if "sampler" in state:
        return f"iteration {state['sampler']['iteration']}"
    running = [f"chain {c} at iteration {u['iteration']}" for c, u in sorted(state.get("unfinished", {}).items())]
    return "; ".join([f"{len(state.get('chains', []))} chain(s) finished", *running])


class StoredDraws(InferenceMethod):
    """What the samplers share: draws stored chain by chain in ``samples.pt`` (a :class:`ChainPosterior` on load),
    chains started fresh (``fresh_starts``) or at the posterior of the run ``inference.init`` names."""

    files = (SAMPLES_FILE,)
    fits_guide = False
    fresh_starts: tuple[str, ...] = ("prior",)

    def start_from(self, spec) -> Path | None:
        return starting_run(spec.init, self.fresh_starts)

    def fit_record(self, result: MCMCResult) -> dict:
        return result_record(result)  # the draws, their statistics, the sampler and its settings

    def load(self, family, guide, spec, run_dir, device, start=None) -> Posterior:
        if start is not None:  # e.g. rank-1's W, fitted by the run the chains started from
            copy_point_parameters(family, start, "inference.init")
        return load_samples(run_dir, family, device).posterior


