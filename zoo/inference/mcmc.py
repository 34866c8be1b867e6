"""Markov chain Monte Carlo on a family's own Pyro model: Pyro's NUTS, and a many-chain HMC tuned by ChEES.

Both samplers see one thing: the potential energy U(z) = -log p(w, y | x) - log|det J| of the family's model
on the full training set, at C stacked points ``z [C, D]`` of unconstrained coordinates. It is evaluated as
one tensor computation for all C points: the prior terms come from one trace of the model (each latent
site's prior, with its plate scale), the likelihood from the family's batched ``log_likelihood``; at start-up
it is checked against the model itself, traced at each point, and that exact (slower) evaluation is used
whenever the two disagree.

``nuts`` runs Pyro's NUTS kernel chain after chain (step size and diagonal mass matrix adapted in warm-up), one
draw at a time under the zoo's own loop, so that a chain can be checkpointed between draws and stopped within one.
``hmc`` runs all chains in lockstep (Hoffman, Radul & Sountsov 2021, "An adaptive MCMC scheme for setting trajectory
lengths in HMC"), so each leapfrog step is one batched gradient for all chains. Warm-up adapts, shared by all
chains: the step size (dual averaging on the chains' mean acceptance; sampling uses the iterates' geometric mean
over the second half of the last window), a diagonal mass matrix (within-chain variance pooled over chains, in
Stan's layout: an initial buffer of 15% of warm-up under the unit metric while the chains leave their starting
points, then windows over 15-30% and 30-60%, the rest for the step size and T under the last metric) and a jittered
trajectory length T. After every mass-matrix update T restarts at a quarter turn of the slowest whitened direction,
pi/2 sqrt(lambda_max) (so a collapsed or looping start cannot survive), and ChEES refines it by Adam on log T. By
default ChEES measures the jumps of the training rows' log-likelihoods (``trajectory_criterion: function``):
function space is what predictions depend on, and it is the same for every permutation of hidden units, where the
weights' own criterion rewards the slowest weight direction. The sampling phase uses a running average of log T
since the last metric change.

The metric is diagonal by default; ``inference.metric: low_rank`` or ``dense`` modifies it along the directions
where the window's draws and gradients say the posterior is far narrower or wider than the diagonal
(``zoo.inference.metric``), and both kernels then move in the coordinates it whitens.

The many-chain sampler has two kernels under that one adaptation (``inference.kernel``): ``chees``, HMC with a
Gaussian momentum, and ``mams``, the Metropolis-adjusted microcanonical sampler (Robnik, Cohn-Gordon & Seljak 2025):
a unit-speed velocity in the whitened coordinates, refreshed uniformly on the sphere every draw, moved by the
isokinetic (ESH) dynamics, whose exact velocity update under a constant gradient gives a kinetic energy change that
replaces HMC's kinetic energy in the Metropolis test. MAMS aims at 0.9 acceptance and measures its step and length in
units sqrt(D) larger (unit speed against HMC's |p| ~ sqrt(D)). Either integrates by leapfrog or by McLachlan's
minimal-norm two-stage scheme (``inference.integrator``).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import pyro
import torch
from pydantic import Field, PositiveFloat, PositiveInt, model_validator
from pyro import poutine
from pyro.infer.mcmc import NUTS
from tqdm.auto import tqdm

from zoo import distributed
from zoo.distributed import World
from zoo.errors import TrainingDiverged, ZooInputError
from zoo.inference.base import FitContext
from zoo.inference.draws import SAMPLES_FILE, MCMCResult, StoredDraws, load_samples
from zoo.inference.metric import Metric, MetricKind, fit_metric, usable
from zoo.inference.potential import Coordinates, Potential, initial_points, refuse_batch_dependent
from zoo.interrupts import Interrupted, deferred_interrupt
from zoo.posterior import ChainPosterior, Posterior
from zoo.runs import checkpoint_exists, load_checkpoint, save_checkpoint
from zoo.sections import Tempered

# a step of each integrator: its kick coefficients (b0, b1, ..., b0) and drift coefficients, in units of the step
MCLACHLAN_B = 0.1931833275037836  # McLachlan's minimal-norm two-stage scheme (also BlackJAX's MAMS default)
INTEGRATORS = {"leapfrog": ((0.5, 0.5), (1.0,)),
               "mclachlan": ((MCLACHLAN_B, 1.0 - 2.0 * MCLACHLAN_B, MCLACHLAN_B), (0.5, 0.5))}
HMC_ONLY_DEFAULTS = {"kernel": "chees", "integrator": "leapfrog", "metric": "diagonal"}  # what NUTS (Pyro's) runs
MAX_METRIC_RANK = 1024  # beyond this, a dense metric (inference.metric: dense) is the cheaper way to the same end
MAMS_TARGET_ACCEPT = 0.9  # Robnik et al. 2025's recommended acceptance rate for MAMS
MAX_ENERGY_ERROR = 1000.0  # a leapfrog trajectory whose energy error exceeds this is a divergence (as Stan, Pyro)
# warm-up fractions: the initial buffer in which only the step size adapts (chains in transit from their starting
# points would give the metric variances 3x too large, median over weights), and the ends of the mass-matrix windows
# that follow it (docs/results/hmc.md, "The warm-up in Stan's layout": half the warm-up gradients of windows from
# iteration 1)
METRIC_BUFFER = 0.15
METRIC_WINDOW_ENDS = (0.3, 0.6)
# a chain that accepted no proposal in an initial buffer of at least this many iterations is stuck (a start where the
# shared step is far too long for it: on UCI concrete, a prior draw with a 0.03 noise and a poor fit, potential 2e8)
# and restarts at a moving chain's position; in a shorter buffer a healthy chain can still be waiting for its step
STUCK_CHAIN_MIN_BUFFER = 10
# a chain whose potential ends warm-up more than this many times the dimension above the lowest chain's has not
# reached where that chain is: within one typical set the potential varies by about sqrt(D/2), and two modes whose
# typical sets are that far apart in potential would need widths e^10 apart in every direction to hold comparable mass
# (UCI kin8nm from prior draws: seven of eight chains 1.3e5-5.5e5 above the lowest, D = 502; docs/results/hmc.md)
FAR_CHAIN_GAP_PER_DIM = 10.0


def gradients_per_step(integrator: str) -> int:
    """Gradient evaluations in one step of ``integrator`` (one per drift: leapfrog 1, McLachlan 2)."""
    return len(INTEGRATORS[integrator][1])


class MCMCSpec(Tempered):
    """Markov chain Monte Carlo on the family's own Pyro model (full batch): the gold-standard posterior.

    ``nuts`` is Pyro's NUTS kernel, one chain after another. ``hmc`` is the zoo's sampler that runs all chains as
    one tensor computation and tunes a shared, jittered trajectory length by the ChEES criterion, in function space
    by default (use many chains, e.g. 64-256), with an HMC (``kernel: chees``) or a MAMS (``kernel: mams``)
    transition. Both methods adapt the step size and a diagonal mass matrix during warm-up; ``hmc`` can adapt a
    low-rank-modified or dense one instead (``metric``).
    """

    method: Literal["nuts", "hmc"] = Field(description=(
        "nuts (Pyro's NUTS, chain after chain) or hmc (the zoo's many-chain ChEES-HMC)"))
    num_chains: PositiveInt = Field(4, description="independent chains (hmc: use many, e.g. 64-256)")
    warmup_steps: PositiveInt = Field(500, description="adaptation steps per chain, discarded")
    num_samples: PositiveInt = Field(500, description="draws kept per chain")
    kernel: Literal["chees", "mams"] = Field("chees", description=(
        "hmc: the transition: chees (Hamiltonian dynamics, Gaussian momentum) or mams (the Metropolis-adjusted "
        "microcanonical sampler: isokinetic dynamics, a unit-speed velocity; Robnik et al. 2025), both exact and "
        "tuned by the same many-chain adaptation"))
    integrator: Literal["leapfrog", "mclachlan"] = Field("leapfrog", description=(
        "hmc: leapfrog (velocity Verlet, one gradient a step) or mclachlan (the minimal-norm two-stage scheme: two "
        "gradients a step, a ~10x smaller energy error at the same step size); max_leapfrog_steps counts its steps"))
    target_accept_prob: float = Field(0.8, gt=0.0, lt=1.0, description=(
        "the acceptance rate the step-size adaptation aims at (left out: 0.8, and 0.9 for kernel mams, the rate "
        "its paper recommends)"))
    step_size: PositiveFloat = Field(0.01, description="initial step size (adapted during warm-up)")
    max_tree_depth: PositiveInt = Field(10, le=15, description="nuts: at most 2^depth leapfrog steps per draw")
    trajectory_length: PositiveFloat = Field(1.0, description="hmc: integration time until the first mass-matrix "
                                             "update (then pi/2 sqrt(largest whitened variance), refined by ChEES)")
    adapt_trajectory_length: bool = Field(True, description="hmc: tune the trajectory length by ChEES in warm-up")
    trajectory_criterion: Literal["function", "weights"] = Field(
        "function", description="hmc: what ChEES measures the jumps of: the training rows' log-likelihoods (function "
        "space, what predictions depend on) or the whitened weights (the original ChEES criterion)")
    max_leapfrog_steps: PositiveInt = Field(
        2048, description="hmc: cap on leapfrog steps per draw, and so on the sampling trajectory length (at 1,024 "
        "it clamped bostonHousing's ChEES length from 2.26 to 1.60, and min ESS fell 6x; docs/results/hmc.md)")
    compile: bool = Field(False, description="trace the potential with its gradient into one graph and compile it "
                          "(a one-off compile of a few seconds per chain count); on CPU here ~3.6x faster gradients "
                          "for 64 lockstep HMC chains and ~2x faster NUTS iterations")
    adapt_mass_matrix: bool = Field(True, description="adapt the mass matrix (the metric) during warm-up")
    metric: MetricKind = Field("diagonal", description=(
        "hmc: the adapted metric: diagonal (each weight's variance over the warm-up window, pooled over chains), "
        "low_rank (that diagonal, modified along the directions where the posterior's covariance, estimated from the "
        "window's draws and gradients as nutpie does, differs from it by over 100x: the stiff directions a learned "
        "low noise makes) or dense (every direction of that estimate kept; for small D). Measured on UCI: level "
        "with diagonal on bostonHousing, 3.7x the step on energy but no sooner converged (docs/results/hmc.md)"))
    metric_rank: PositiveInt | None = Field(None, le=MAX_METRIC_RANK, description=(
        "hmc, metric low_rank: at most this many modified directions, the farthest from the diagonal first (left "
        "out: every direction beyond the cutoff)"))
    chain_chunk: PositiveInt | None = Field(
        None, description="hmc: evaluate the potential for at most this many chains per call (None: all at once); "
        "on nets whose activations for all chains outgrow the CPU caches, chunks are faster (benchmarks/"
        "hmc_chain_chunk.py)")
    init: str = Field("prior", description="'prior', 'weights' (every chain at the net's own weights, e.g. "
                      "trained ones: net.weights), or a run directory (MAP or VI fit of the same spec): chains start "
                      "at its draws")
    max_weights: PositiveInt = Field(20_000, description="refuse models with more latent dimensions than this")
    checkpoint_every: PositiveInt = Field(100, description="iterations between checkpoints (nuts: within a chain, "
                                          "in a one-process run)")
    predictive_samples: PositiveInt = Field(400, description="draws (over all chains) used for test metrics")

    @model_validator(mode="before")
    @classmethod
    def _many_chain_options(cls, data: object) -> object:
        """``kernel`` and ``integrator`` other than their defaults belong to the many-chain ``hmc`` (NUTS is Pyro's
        kernel and leapfrog); MAMS aims at 0.9 acceptance unless the spec says otherwise."""
        if not isinstance(data, dict):
            return data
        for name, default in HMC_ONLY_DEFAULTS.items():
            if data.get(name) not in (None, default) and data.get("method") != "hmc":
                raise ValueError(f"{name} '{data[name]}' is an option of the many-chain method 'hmc', not of "
                                 f"'{data.get('method')}': set inference.method: hmc, or drop inference.{name}")
        if data.get("metric_rank") is not None and data.get("metric") != "low_rank":
            raise ValueError(f"metric_rank is a setting of inference.metric: low_rank, not of "
                             f"'{data.get('metric', 'diagonal')}': set inference.metric: low_rank, or drop "
                             "inference.metric_rank")
        if data.get("metric") not in (None, "diagonal") and data.get("adapt_mass_matrix") is False:
            raise ValueError(f"metric '{data['metric']}' is adapted during warm-up, which adapt_mass_matrix: false "
                             "turns off: drop one of the two")
        if data.get("kernel") == "mams" and data.get("target_accept_prob") is None:
            return {**data, "target_accept_prob": MAMS_TARGET_ACCEPT}
        return data


def check_size(coords: Coordinates, spec: MCMCSpec) -> None:
    """Refuse models too large for full-batch MCMC."""
    if coords.dim > spec.max_weights:
        raise ZooInputError("inference.method", spec.method, f"the model has {coords.dim:,} latent dimensions, more "
                            f"than inference.max_weights = {spec.max_weights:,}; use inference.method: svi, a smaller "
                            "net, a subnetwork, or raise inference.max_weights")
    if spec.metric_rank is not None and spec.metric_rank > coords.dim:
        raise ZooInputError("inference.metric_rank", spec.metric_rank, f"the model has {coords.dim:,} latent "
                            f"dimensions, fewer than the rank asked for; set inference.metric_rank <= {coords.dim:,}, "
                            "or inference.metric: dense for a full matrix")


# ------------------------------------------------------------------------------------------ NUTS (Pyro)
class DrawStopped(Exception):
    """A NUTS draw given up part-way because a signal arrived (the kernel is back where the draw started)."""


class RecordingNUTS(NUTS):
    """Pyro's NUTS kernel, also recording per draw: energy, tree depth, acceptance, divergence, step size.

    ``stop`` is asked before every subtree (down to single leapfrog steps); when it answers a signal, the draw is
    abandoned with :class:`DrawStopped`. Pyro's kernel changes its state only at the end of a draw, except the point
    it caches when a subtree is accepted: that cache and the random stream are put back, so the chain goes on from
    :meth:`state_dict` exactly as if the draw had never started.
    """

    def __init__(self, *args, stop: Callable[[], int] = lambda: 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.stop = stop
        self.records: list[tuple[float, int, float, bool, float]] = []
        self._nesting = 0

    def _build_tree(self, z, r, z_grads, log_slice, direction, tree_depth, energy_current):
        if self.stop():
            raise DrawStopped
        top = self._nesting == 0
        self._nesting += 1
        try:
            tree = super()._build_tree(z, r, z_grads, log_slice, direction, tree_depth, energy_current)
        finally:
            self._nesting -= 1
        if top:  # one doubling of this draw's trajectory
            draw = self._draw
            draw["energy"] = float(energy_current)
            draw["depth"] = tree_depth + 1
            draw["accept"] += float(tree.sum_accept_probs)
            draw["proposals"] += int(tree.num_proposals)
            draw["diverging"] |= bool(tree.diverging)
        return tree

    def sample(self, params):
        self._draw = {"energy": float("nan"), "depth": 0, "accept": 0.0, "proposals": 0, "diverging": False}
        step_size = self.step_size
        device = self._potential_energy_last.device
        before = _rng_state(device), self._z_last, self._potential_energy_last, self._z_grads_last
        try:
            out = super().sample(params)
        except DrawStopped:
            _set_rng_state(before[0], device)
            self._cache(*before[1:])
            raise
        d = self._draw
        self.records.append((d["energy"], d["depth"], d["accept"] / max(d["proposals"], 1), d["diverging"],
                             step_size))
        return out

    def logging(self):
        info = super().logging()
        info["divergences"] = str(len(self._divergences))
        return info

    def state_dict(self) -> dict:
        """What this kernel carries from one draw to the next (step-size and mass-matrix adaptation, the cached
        point, divergences, the records), as plain values: with :meth:`load_state_dict` a chain goes on exactly."""
        return _attributes(self)

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` into a kernel set up (``setup``) for the same chain and warm-up length."""
        _restore_attributes(self, state)


# not state: the adapter's warm-up windows (setup() rebuilds them alike) and the kernel's stop question
_NOT_STATE = frozenset({"_adaptation_schedule", "stop"})


def _is_object(value: object) -> bool:
    return hasattr(value, "__dict__") and not isinstance(value, torch.Tensor) and not callable(value)


def _attributes(obj: object) -> dict:
    """``obj``'s data attributes, nested objects (and dicts of them) as their own attributes; functions left out."""
    state = {}
    for name, value in vars(obj).items():
        if callable(value) or name in _NOT_STATE:
            continue
        if _is_object(value):
            state[name] = _attributes(value)
        elif isinstance(value, dict) and value and all(_is_object(v) for v in value.values()):
            state[name] = {key: _attributes(v) for key, v in value.items()}
        else:
            state[name] = copy.deepcopy(value)
    return state


def _restore_attributes(obj: object, state: dict) -> None:
    """Set :func:`_attributes`' ``state`` back into ``obj`` (whose nested objects exist already)."""
    for name, saved in state.items():
        current = getattr(obj, name, None)
        if _is_object(current):
            _restore_attributes(current, saved)
        elif isinstance(current, dict) and current and all(_is_object(v) for v in current.values()):
            for key, part in saved.items():
                _restore_attributes(current[key], part)
        else:
            setattr(obj, name, saved)


def _rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """The random streams NUTS draws from: torch's CPU one, and the device's where the chain lives on a GPU."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"].cpu())
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def chain_seed(seed: int, chain: int) -> int:
    """The seed of NUTS chain ``chain`` of a run seeded ``seed``: its own stream, apart from the one that drew the
    starting points, and the same whichever process runs the chain; below 2**32, the seeds NumPy takes (Pyro seeds
    it too), so every spec seed works (a seed up to 4293 gives the stream it always gave)."""
    return ((seed + 1) * 1_000_003 + chain) % 2**32


def _run_nuts(potential: Potential, z0: torch.Tensor, spec: MCMCSpec, seed: int, progress: bool, log,
              done: list[dict], unfinished: dict[int, dict], save, team: World) -> None:
    """Chain after chain with Pyro's NUTS, each chain seeded by :func:`chain_seed`; ``done`` gathers finished chains (in
    chain order), ``unfinished`` the saved state of chains stopped part-way (by chain), and ``save`` stores both.

    Ctrl-C and SIGTERM stop a chain within a leapfrog step (the draw in progress is given up, see
    :class:`RecordingNUTS`): its state joins ``unfinished``, is saved, and :class:`Interrupted` is raised; a chain
    found in ``unfinished`` goes on from there, exactly as if it had never stopped. In one process a running chain is
    also saved every ``checkpoint_every`` iterations. Several processes run the remaining chains in rounds, one chain
    each, and every process gathers each round's chains (finished or stopped), so a chain is the same whichever
    process ran it.
    """
    device = z0.device
    total = spec.warmup_steps + spec.num_samples

    def potential_fn(params: dict[str, torch.Tensor]) -> torch.Tensor:
        return potential.energy(params["z"].unsqueeze(0))[0]

    def run_chain(chain: int, signalled: Callable[[], int]) -> dict:
        """Chain ``chain`` from its start (or its state in ``unfinished``) to its end, or until a signal: then its
        state before the draw in progress, marked ``"unfinished"``."""
        pyro.set_rng_seed(chain_seed(seed, chain))
        kernel = RecordingNUTS(potential_fn=potential_fn, step_size=spec.step_size,
                               target_accept_prob=spec.target_accept_prob, max_tree_depth=spec.max_tree_depth,
                               adapt_mass_matrix=spec.adapt_mass_matrix, full_mass=False, stop=signalled)
        kernel.initial_params = {"z": z0[chain]}
        with poutine.block():  # as Pyro's MCMC.run: the kernel's own sample sites reach no outer handler
            kernel.setup(spec.warmup_steps)
        params, kept, iteration, seconds = kernel.initial_params, [], 0, 0.0
        saved = unfinished.get(chain)
        if saved is not None:
            kernel.load_state_dict(saved["kernel"])
            params, kept = {"z": saved["z"]}, list(saved["kept"])
            iteration, seconds = saved["iteration"], saved["seconds"]
            _set_rng_state(saved["rng"], device)
            log(f"chain {chain}: resumed at iteration {iteration}/{total}")
        bar = tqdm(total=total, initial=iteration, disable=not progress, desc=f"NUTS chain {chain}", mininterval=0.5,
                   leave=False)
        started = time.perf_counter()

        def state() -> dict:
            return {"chain": chain, "unfinished": True, "iteration": iteration, "z": params["z"].detach().clone(),
                    "kept": torch.stack(kept) if kept else z0.new_zeros(0, z0.shape[1]),
                    "kernel": kernel.state_dict(), "rng": _rng_state(device),
                    "seconds": seconds + time.perf_counter() - started}

        try:
            while iteration < total:
                if signalled():
                    return state()
                try:
                    with poutine.block():
                        params = kernel.sample(params)
                except DrawStopped:
                    return state()
                iteration += 1
                if iteration > spec.warmup_steps:
                    kept.append(params["z"].detach().clone())
                bar.update(1)
                if team.size == 1 and iteration % spec.checkpoint_every == 0 and iteration < total:
                    unfinished[chain] = state()
                    save()
        finally:
            bar.close()
        kernel.cleanup()
        energy, depth, accept, diverging, step = map(torch.tensor, zip(*kernel.records[-spec.num_samples:],
                                                                      strict=True))
        return {"chain": chain, "z": torch.stack(kept), "seconds": seconds + time.perf_counter() - started,
                "stats": {"energy": energy, "tree_depth": depth, "acceptance_rate": accept,
                          "diverging": diverging, "step_size": step},
                "settings": {"step_size": float(kernel.step_size)}}

    finished = {c.get("chain", i) for i, c in enumerate(done)}
    todo = [c for c in range(spec.num_chains) if c not in finished]
    with deferred_interrupt() as signalled:
        for first in range(0, len(todo), team.size):
            this_round = todo[first:first + team.size]
            mine = run_chain(this_round[team.rank], signalled) if team.rank < len(this_round) else None
            stopped = []
            for result in team.every_object(mine):
                if result is None:
                    continue
                if result.get("unfinished"):
                    unfinished[result["chain"]] = result
                    stopped.append(f"chain {result['chain']} at iteration {result['iteration']}/{total}")
                    continue
                unfinished.pop(result["chain"], None)
                done.append(result)
                accept, depth = result["stats"]["acceptance_rate"], result["stats"]["tree_depth"]
                log(f"chain {result['chain']}: {int(result['stats']['diverging'].sum())} divergences, mean "
                    f"acceptance {float(accept.mean()):.3f}, step size {result['settings']['step_size']:.3g}, mean "
                    f"tree depth {float(depth.float().mean()):.2f}")
            done.sort(key=lambda c: c.get("chain", 0))
            save()
            stop = team.agreed_signal(signalled())
            if stop and (stopped or first + team.size < len(todo)):
                where = f"; {', '.join(stopped)}" if stopped else ""
                log(f"interrupted with {len(done)} of {spec.num_chains} chains finished{where}; state saved, "
                    "continue with --resume")
                raise Interrupted(stop)


# ------------------------------------------------------------------------------------------ many-chain HMC
class DualAveraging:
    """Nesterov dual averaging of log step size towards a target acceptance (Hoffman & Gelman 2014)."""

    def __init__(self, step_size: float, target: float, gamma: float = 0.05, t0: float = 10.0,
                 kappa: float = 0.75) -> None:
        self.target, self.gamma, self.t0, self.kappa = target, gamma, t0, kappa
        self.reset(step_size)

    def reset(self, step_size: float) -> None:
        """Restart around ``step_size`` (e.g. after the mass matrix changed)."""
        self.mu, self.t, self.h_bar = math.log(10 * step_size), 0, 0.0
        self.log_step, self.log_step_bar = math.log(step_size), math.log(step_size)

    def update(self, accept: float) -> float:
        """Feed one iteration's acceptance; returns the next step size."""
        self.t += 1
        eta = 1.0 / (self.t + self.t0)
        self.h_bar = (1 - eta) * self.h_bar + eta * (self.target - accept)
        self.log_step = self.mu - math.sqrt(self.t) / self.gamma * self.h_bar
        weight = self.t ** -self.kappa
        self.log_step_bar = weight * self.log_step + (1 - weight) * self.log_step_bar
        return math.exp(self.log_step)

    @property
    def final(self) -> float:
        """The averaged step size used after warm-up."""
        return math.exp(self.log_step_bar)


def halton(index: int, base: int = 2) -> float:
    """Element ``index`` (from 1) of the van der Corput sequence in (0, 1): evenly spread trajectory jitter."""
    result, fraction = 0.0, 1.0
    while index > 0:
        fraction /= base
        result += fraction * (index % base)
        index //= base
    return result


def slowest_quarter_period(window: torch.Tensor, metric: Metric, iterations: int = 30) -> float:
    """pi/2 sqrt(lambda_max): a quarter turn of HMC along the slowest direction of the draws ``[n, chains, D]``.

    lambda_max is the largest eigenvalue of the within-chain covariance (each chain centred on its own mean,
    pooled over chains) in the coordinates whitened by ``metric``, found by power iteration
    without forming the D x D matrix. A Gaussian direction of variance lambda oscillates with period 2 pi
    sqrt(lambda) under unit mass, so this is the integration time that decorrelates the slowest one: where ChEES
    starts after every metric change, whatever the initial ``trajectory_length`` was.
    """
    centred = metric.whiten(window - window.mean(0))  # [n, chains, D]
    rows = centred.reshape(-1, centred.shape[-1]).double()
    scale = max(1, window.shape[0] - 1) * window.shape[1]
    vector = torch.ones(rows.shape[1], dtype=rows.dtype, device=rows.device)
    value = torch.zeros((), dtype=rows.dtype, device=rows.device)
    for _ in range(iterations):
        product = rows.T @ (rows @ vector) / scale
        value = vector @ product / (vector @ vector)
        vector = product / product.norm().clamp(min=1e-300)
    return math.pi / 2 * math.sqrt(max(float(value), 1e-12))


def esh_velocity_update(velocity: torch.Tensor, score: torch.Tensor, step: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact isokinetic (ESH) velocity update over time ``step`` under a constant whitened score.

    ``velocity`` ``[C, D]`` has unit norm; ``score`` is the whitened gradient of the log density. The velocity
    turns toward the score and stays on the unit sphere; the returned kinetic energy change is
    (D - 1) (delta - log 2 + log(1 + u.e + (1 - u.e) zeta^2)) with e = score / |score|, delta = step |score| / (D - 1)
    and zeta = exp(-delta) (Robnik et al. 2023, Steeg & Galstyan 2021): what the Metropolis test of MAMS adds to
    the potential's change.
    """
    dim = velocity.shape[-1]
    norm = score.norm(dim=-1, keepdim=True)
    direction = score / norm.clamp(min=1e-30)
    along = (velocity * direction).sum(-1, keepdim=True)
    delta = step * norm / (dim - 1)
    zeta = torch.exp(-delta)
    turned = direction * (1 - zeta) * (1 + zeta + along * (1 - zeta)) + 2 * zeta * velocity
    turned = turned / turned.norm(dim=-1, keepdim=True)
    change = (dim - 1) * (delta - math.log(2.0) + torch.log(1 + along + (1 - along) * zeta**2))
    return turned, change.squeeze(-1)


class ManyChainHMC:
    """HMC for C chains at once, with shared step size, diagonal mass matrix and ChEES-tuned trajectory length.

    With several processes (``team``), each steps its share of the chains. What the adaptation pools over chains
    (acceptance, the ChEES gradient terms, the warm-up windows at a metric update) is gathered from every process
    and pooled in one order, and each process draws the random numbers of all C chains and keeps its own, so the
    chains are exactly those of one process.
    """

    CHAIN_STATE = ("z", "energy", "grad", "centre", "rows", "moves")  # per-chain tensors [chains, ...] in state_dict

    def __init__(self, potential: Potential, z: torch.Tensor, spec: MCMCSpec, generator: torch.Generator,
                 team: World | None = None, log: Callable[[str], None] = lambda message: None) -> None:
        self.potential, self.spec, self.gen, self.log = potential, spec, generator, log
        self.team = team or World()
        self.mine = self.team.chains(len(z))
        self.z = z[self.mine].detach().clone()
        self.energy, self.grad = potential.value_and_grad(self.z)
        # accepted proposals per chain in the initial buffer (None after it): a chain with none is stuck
        self.moves: torch.Tensor | None = torch.zeros(len(self.z), dtype=torch.long, device=self.z.device)
        self.metric = Metric(torch.ones(z.shape[1], dtype=z.dtype, device=z.device))
        # MAMS moves at unit speed in the whitened space, HMC at |p| ~ sqrt(D): the same motion takes sqrt(D)
        # times the integration time, so the spec's HMC-scaled step and length are rescaled
        self.time_scale = math.sqrt(z.shape[1]) if spec.kernel == "mams" else 1.0
        self.step_size = spec.step_size * self.time_scale
        self.trajectory = spec.trajectory_length * self.time_scale
        self.dual = DualAveraging(self.step_size, spec.target_accept_prob)
        self.adam_v, self.adam_t = 0.0, 0  # Adam on log T, with beta1 = 0 as in the ChEES paper
        self.log_trajectory_average, self.average_count = math.log(self.trajectory), 0  # since the last metric change
        self.window: list[torch.Tensor] = []
        self.window_grads: list[torch.Tensor] = []  # the potential's gradients at the window's draws (richer metrics)
        self.log_steps: list[float] = []  # log step-size iterates since dual averaging last restarted
        self.centre: torch.Tensor | None = None  # each chain's running mean position (ChEES)
        self.rows: torch.Tensor | None = None  # function-space ChEES: the rows' log-likelihoods at the chains' z
        self.chees_length: float | None = None  # the length ChEES settled on, before max_leapfrog_steps cut it
        self.iteration = 0
        self.warmup_gradients = 0  # gradient evaluations per chain spent in warm-up (what adaptation costs)

    def state_dict(self) -> dict:
        """Everything needed to continue sampling exactly, with every chain's tensors (whichever process runs it)."""
        state = {k: v for k, v in vars(self).items()
                 if k not in ("potential", "spec", "gen", "dual", "team", "mine", "time_scale", "log")}  # from spec, D
        for key in self.CHAIN_STATE:
            if state[key] is not None:
                state[key] = self.team.all_chains(state[key])
        for key in ("window", "window_grads"):
            state[key] = [self.team.all_chains(w) for w in state[key]]
        return state | {"gen": self.gen.get_state(), "dual": vars(self.dual).copy(), "metric": self.metric.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict` (written by any number of processes)."""
        state = dict(state)
        state.setdefault("moves", None)  # written before stuck chains were restarted: none will be
        self.gen.set_state(state.pop("gen"))
        vars(self.dual).update(state.pop("dual"))
        for key in self.CHAIN_STATE:
            if state[key] is not None:
                state[key] = state[key][self.mine]
        if "inv_mass" in state:  # written before the metric could be more than a diagonal
            state["metric"], state["window_grads"] = {"variance": state.pop("inv_mass")}, []
        for key in ("window", "window_grads"):
            state[key] = [w[self.mine] for w in state[key]]
        state["metric"] = Metric(**state["metric"])
        vars(self).update(state)

    def _all_chains_draw(self, draw, *shape: int) -> torch.Tensor:
        """``draw`` for all C chains (the same numbers as one process), this process's chains kept; drawn on the
        chains' device by its own generator."""
        total = len(self.z) * self.team.size
        return draw((total, *shape), generator=self.gen, dtype=self.z.dtype, device=self.gen.device)[self.mine]

    def _randn(self, shape: torch.Size) -> torch.Tensor:
        return self._all_chains_draw(torch.randn, *shape[1:])

    def integrate(self, z: torch.Tensor, velocity: torch.Tensor, grad: torch.Tensor,
                  steps: int) -> tuple[torch.Tensor, ...]:
        """``steps`` steps of the spec's integrator from ``z`` with ``velocity``: one trajectory of every chain, without
        the Metropolis test (what :meth:`step` builds on, and what ``benchmarks/hmc_step.py`` times).

        Both kernels move a velocity in the coordinates whitened by the metric (``zoo.inference.metric``: the
        position changes at ``L v``, the whitened gradient is ``L^T grad``). One step is the palindrome kick(b0)
        drift(a0) kick(b1) ... drift(a_last) kick(b0): a kick moves the velocity under the whitened gradient (HMC:
        v -= t L^T grad; MAMS: the exact isokinetic turn toward the whitened score, which also returns a kinetic
        energy change), a drift moves the position along it; the last kick of a step and the first of the next are
        one, so a step costs one gradient per drift.

        :param z: the chains' positions ``[C, D]``.
        :param velocity: the whitened velocity ``[C, D]`` (HMC: the whitened momentum, N(0, I) at a refresh; MAMS: a
            unit vector).
        :param grad: the potential's gradient at ``z``.
        :param steps: integrator steps.
        :returns: the end point, its velocity, potential and gradient, and (MAMS) the kinetic energy change along the
            way, which enters MAMS's Metropolis test in place of HMC's kinetic energy.
        """
        kicks, drifts = INTEGRATORS[self.spec.integrator]
        eps, mams, metric = self.step_size, self.spec.kernel == "mams", self.metric

        def kick(velocity, grad, time: float):
            if mams:  # toward the score in whitened coordinates
                return esh_velocity_update(velocity, -metric.scale_transposed(grad), time)
            return velocity - time * metric.scale_transposed(grad), 0.0

        velocity, kinetic = kick(velocity, grad, kicks[0] * eps)
        energy = None
        for i in range(steps):
            for j, drift in enumerate(drifts):
                z = z + drift * eps * metric.scale(velocity)
                energy, grad = self.potential.value_and_grad(z)
                last = j + 1 == len(drifts)
                velocity, change = kick(velocity, grad, (kicks[j + 1] + (kicks[0] if last and i + 1 < steps else 0.0))
                                        * eps)
                kinetic = kinetic + change
        return z, velocity, energy, grad, kinetic

    def step(self, warmup: bool) -> dict[str, torch.Tensor]:
        """One draw for every chain; during warm-up, also adapt. Returns the draw's statistics per chain."""
        self.iteration += 1
        jitter = halton(self.iteration)
        steps = max(1, min(self.spec.max_leapfrog_steps, math.ceil(jitter * self.trajectory / self.step_size)))
        noise = self._randn(self.z.shape)
        if self.spec.kernel == "mams":  # a fresh direction, uniform on the sphere, at unit speed
            velocity = noise / noise.norm(dim=-1, keepdim=True)
            start = self.energy
            z_new, v_new, u_new, g_new, kinetic = self.integrate(self.z, velocity, self.grad, steps)
            end = u_new + kinetic
        else:  # a fresh whitened momentum, N(0, I)
            start = self.energy + 0.5 * (noise**2).sum(-1)
            z_new, v_new, u_new, g_new, _ = self.integrate(self.z, noise, self.grad, steps)
            end = u_new + 0.5 * (v_new**2).sum(-1)
        dz_dt = self.metric.scale(v_new)
        error = torch.where(torch.isfinite(end), end - start, torch.full_like(end, math.inf))
        accept_prob = torch.exp(-error.clamp(min=0.0))
        diverging = error > MAX_ENERGY_ERROR
        accepted = self._all_chains_draw(torch.rand).to(accept_prob.dtype) < accept_prob
        z_old, keep = self.z, accepted.unsqueeze(-1)
        self.z = torch.where(keep, z_new, self.z)
        self.grad = torch.where(keep, g_new, self.grad)
        self.energy = torch.where(accepted, u_new, self.energy)
        info = {"acceptance_rate": accept_prob, "diverging": diverging, "n_steps": torch.full_like(accept_prob, steps),
                "step_size": torch.full_like(accept_prob, self.step_size)}
        if self.spec.kernel != "mams":  # the Hamiltonian, for E-BFMI (MAMS has no Gaussian momentum to compare)
            info = {"energy": torch.where(accepted, end, start)} | info
        if warmup:
            self.warmup_gradients += steps * gradients_per_step(self.spec.integrator)
            if self.moves is not None:
                self.moves += accepted.long()
            self._adapt(z_old, z_new, dz_dt, accept_prob, accepted, steps * self.step_size)
        return info

    def _adapt(self, z_old, z_new, dz_dt, accept_prob, accepted, integration_time: float) -> None:
        spec, t = self.spec, self.iteration
        # step size: dual averaging on the chains' mean acceptance
        every_accept = self.team.all_chains(accept_prob)  # pooled over all C chains, summed in one order
        self.step_size = self.dual.update(float(every_accept.nan_to_num(0.0).mean()))
        self.log_steps.append(math.log(self.step_size))
        # trajectory length: one Adam step on log T along the ChEES gradient estimate (acceptance-weighted), once
        # the chains have left their starting points (after the initial buffer). Each chain's jump is
        # measured from its own running mean, not the mean over chains: chains in different modes of a BNN
        # posterior would otherwise make the criterion measure distances between modes, and T collapses.
        function_space = spec.trajectory_criterion == "function"
        past_buffer = t > METRIC_BUFFER * spec.warmup_steps
        if t == math.floor(METRIC_BUFFER * spec.warmup_steps):  # the initial buffer's last iteration
            if t >= STUCK_CHAIN_MIN_BUFFER:
                self._restart_stuck_chains()
            self.moves = None  # only the buffer's count is read: no more counting, nor checkpointing it
        chees = spec.adapt_trajectory_length and past_buffer
        if spec.adapt_trajectory_length:
            here = self.z
            if function_space:  # the training rows' log-likelihoods: before, at the proposal (with their rate
                # of change along it once ChEES runs) and after the accept step, which the next draw starts from
                old = self.rows if self.rows is not None else self.potential.pointwise(z_old)
                new, velocity = (self.potential.pointwise(z_new, dz_dt) if chees
                                 else (self.potential.pointwise(z_new), None))
                here = self.rows = torch.where(accepted.unsqueeze(-1), new, old)
            self.centre = here.clone() if self.centre is None else self.centre + 0.05 * (here - self.centre)
        if chees:
            if function_space:
                centred_new, centred_old = new - self.centre, old - self.centre
            else:  # in whitened coordinates, where the time derivative of |centred|^2 is 2 centred . velocity
                whiten = self.metric.whiten
                centred_new, centred_old = whiten(z_new - self.centre), whiten(z_old - self.centre)
                velocity = whiten(dz_dt)
            growth = (centred_new**2).sum(-1) - (centred_old**2).sum(-1)
            # d criterion / d log T, with the time this draw actually integrated (jitter x T, capped steps)
            per_chain = integration_time * growth * (centred_new * velocity).sum(-1)
            per_chain = torch.where(torch.isfinite(per_chain), per_chain, torch.zeros_like(per_chain))
            per_chain, weight = self.team.all_chains(per_chain), every_accept.nan_to_num(0.0)
            if weight.sum() > 0:
                gradient = float((weight * per_chain).sum() / weight.sum())
                self.adam_t += 1
                self.adam_v = 0.95 * self.adam_v + 0.05 * gradient**2
                v_hat = self.adam_v / (1 - 0.95**self.adam_t)
                log_t = math.log(self.trajectory) + 0.025 * gradient / (math.sqrt(v_hat) + 1e-8)
                # no bounds from the step size here: its iterate swings by 10x for a few draws after every restart of
                # dual averaging and must not drag T with it (step() takes 1 to max_leapfrog_steps steps anyway)
                self.trajectory = math.exp(log_t)
                # the length kept for sampling: a running average of log T that favours recent iterations
                # (weight k^-1/2 at the k-th update since the metric last changed)
                self.average_count += 1
                rate = self.average_count**-0.5
                self.log_trajectory_average += rate * (log_t - self.log_trajectory_average)
        # the metric: from each chain's draws over a window of warm-up, pooled over the chains (within-chain, as
        # Stan's windows: chains in different modes of a BNN posterior must not inflate it); richer metrics also
        # from the potential's gradients there (zoo.inference.metric)
        if spec.adapt_mass_matrix:
            if past_buffer:
                self.window.append(self.z.detach())
                if spec.metric != "diagonal":
                    self.window_grads.append(self.grad.detach())
            ends = {int(spec.warmup_steps * f) for f in METRIC_WINDOW_ENDS}
            if t in ends and len(self.window) > 2:
                window = self.team.all_chains(torch.stack(self.window), dim=1)  # [window, all C chains, D]
                self.metric = self._fit_metric(window)
                self.window, self.window_grads = [], []
                self.dual.reset(self.step_size)
                self.log_steps = []
                if spec.adapt_trajectory_length:  # T restarts in the new metric's units, ChEES refines it from there
                    self.trajectory = slowest_quarter_period(window, self.metric) * self.time_scale
                    self.adam_v, self.adam_t, self.average_count = 0.0, 0, 0
                    self.log_trajectory_average = math.log(self.trajectory)
        if t == spec.warmup_steps:  # freeze the adapted settings for sampling
            self._warn_far_chains()
            # the step size of the sampling phase: the iterates' geometric mean over the second half of the
            # iterations since the metric last changed (dual averaging's own average still remembers the first
            # draws after its restart, which explore 10x steps and then overshoot to small ones)
            settled = self.log_steps[len(self.log_steps) // 2:]
            self.step_size = math.exp(sum(settled) / len(settled)) if settled else self.dual.final
            if spec.adapt_trajectory_length and self.adam_t > 0:
                self.chees_length = math.exp(self.log_trajectory_average)
                self.trajectory = min(max(self.chees_length, self.step_size), self.step_size * spec.max_leapfrog_steps)

    def _warn_far_chains(self) -> None:
        """At the end of warm-up, a log line naming the chains whose potential is still far above the lowest chain's
        (:data:`FAR_CHAIN_GAP_PER_DIM`): their draws will fail R-hat, which the line says before hours of sampling.
        Only a line: which chains are right is not the sampler's to decide."""
        energy = self.team.all_chains(self.energy)
        lowest = int(energy.argmin())
        gap = energy - energy[lowest]
        far = (gap > FAR_CHAIN_GAP_PER_DIM * self.z.shape[-1]).nonzero().flatten().tolist()
        if not far:
            return
        self.log(f"warm-up ended with chain(s) {', '.join(map(str, far))} at potential "
                 f"{', '.join(f'{float(energy[c]):.4g}' for c in far)}, more than {FAR_CHAIN_GAP_PER_DIM:g} x the "
                 f"{self.z.shape[-1]} dimensions above chain {lowest}'s {float(energy[lowest]):.4g} (within one "
                 f"posterior the potential varies by about {math.sqrt(self.z.shape[-1] / 2):.3g}): they have not "
                 "reached where it is, and their draws will fail R-hat. Start the chains nearer the posterior "
                 "(inference.init: a MAP or VI run of the same spec) or give warm-up more iterations "
                 "(inference.warmup_steps)")

    def _restart_stuck_chains(self) -> None:
        """Move every chain that accepted no proposal in the initial buffer to the position of a chain that moved
        (drawn at random), with a log line; the rest of warm-up separates them again.

        The chains share one step size, which dual averaging sets for the chains' mean acceptance. A chain that
        starts where that step is far too long (a prior draw with a tiny noise and a poor fit: every trajectory
        diverges) rejects every proposal for the whole run: on UCI concrete it was one of 16 chains, 100 of its 100
        draws divergent, its potential 2e8 against ~260, and it held the step of the others down."""
        moves = self.team.all_chains(self.moves)
        stuck, moving = (moves == 0).nonzero().flatten(), (moves > 0).nonzero().flatten()
        if len(stuck) == 0:
            return
        energy = self.team.all_chains(self.energy)
        if len(moving) == 0:
            self.log(f"warm-up: no chain accepted a proposal in the first {self.iteration} iterations (potential "
                     f"{float(energy.median()):.4g}, the step now {self.step_size:.3g}): nothing to restart from; "
                     "lower inference.step_size or start from inference.init: <a MAP or VI run>")
            return
        # every process draws the same numbers (the generator is seeded alike), so all agree on the sources
        pick = torch.rand(len(stuck), generator=self.gen, device=self.gen.device)
        sources = moving[(pick * len(moving)).long().clamp(max=len(moving) - 1).to(moving.device)]
        for key in self.CHAIN_STATE:
            value = getattr(self, key)
            if value is not None:
                every = self.team.all_chains(value).clone()
                every[stuck] = every[sources]
                setattr(self, key, every[self.mine])
        self.log(f"warm-up: chain(s) {', '.join(map(str, stuck.tolist()))} accepted no proposal in the first "
                 f"{self.iteration} iterations (potential {', '.join(f'{float(e):.4g}' for e in energy[stuck])}, "
                 f"against a median {float(energy[moving].median()):.4g} over the chains that moved): stuck where "
                 f"the shared step is far too long for them, restarted at chain(s) "
                 f"{', '.join(map(str, sources.tolist()))}'s position")

    def _fit_metric(self, window: torch.Tensor) -> Metric:
        """The spec's metric from the window's draws (and gradients); a richer metric that comes out non-finite or not
        positive definite falls back to the diagonal, with a log line."""
        spec = self.spec
        if spec.metric == "diagonal":
            return fit_metric(window)
        grads = self.team.all_chains(torch.stack(self.window_grads), dim=1)
        try:
            metric = fit_metric(window, grads, spec.metric, spec.metric_rank)
        except torch.linalg.LinAlgError as error:
            metric, reason = None, f"its eigendecomposition failed ({error})"
        else:
            reason = "it came out non-finite or not positive definite"
        if metric is None or not usable(metric):
            self.log(f"hmc: iteration {self.iteration}: the {spec.metric} metric was not used, {reason}; the "
                     "diagonal of the draws' variances stands in for this window")
            return fit_metric(window)
        self.log(f"hmc: iteration {self.iteration}: metric {metric.describe()}")
        return metric


def _run_hmc(potential: Potential, z0: torch.Tensor, spec: MCMCSpec, seed: int, progress: bool, log,
             ckpt: dict | None, save, team: World) -> dict:
    """All chains in lockstep (this process's share of them); returns every chain's kept draws and statistics."""
    # momenta and acceptance draws are made where the chains live (no host-to-device copy per iteration)
    sampler = ManyChainHMC(potential, z0, spec, torch.Generator(device=z0.device).manual_seed(seed), team, log)
    kept: list[torch.Tensor] = []
    stats: dict[str, list[torch.Tensor]] = {}
    seconds = 0.0
    if ckpt is not None:
        sampler.load_state_dict(ckpt["sampler"])
        mine = sampler.mine
        kept = [z[mine] for z in ckpt["kept"]]
        stats = {k: [v[mine] for v in values] for k, values in ckpt["stats"].items()}
        seconds = ckpt["seconds"]
        log(f"resumed at iteration {sampler.iteration}")
    total = spec.warmup_steps + spec.num_samples
    bar = tqdm(total=total, initial=sampler.iteration, disable=not progress, desc="HMC", mininterval=0.5,
               leave=False)

    def every_chain(draws: list[torch.Tensor]) -> list[torch.Tensor]:  # [C_mine, ...] per draw -> [C, ...]
        if not draws or team.size == 1:
            return draws
        return list(team.all_chains(torch.stack(draws), dim=1).unbind(0))

    def snapshot() -> dict:
        return {"sampler": sampler.state_dict(), "kept": every_chain(kept),
                "stats": {k: every_chain(v) for k, v in stats.items()}, "seconds": seconds}

    started = time.perf_counter()
    divergences = 0
    with deferred_interrupt() as signalled:
        try:
            while sampler.iteration < total:
                warmup = sampler.iteration < spec.warmup_steps
                info = sampler.step(warmup)
                if not warmup:
                    kept.append(sampler.z.clone())
                    for k, v in info.items():
                        stats.setdefault(k, []).append(v)
                    divergences += int(info["diverging"].sum())
                if not torch.isfinite(sampler.energy).all():
                    raise TrainingDiverged("a chain's potential energy became non-finite; lower inference.step_size "
                                           "or start from inference.init: <a MAP or VI run>")
                bar.update(1)
                accept = float(info["acceptance_rate"].mean())
                bar.set_postfix(stage="warm-up" if warmup else "sample", accept=f"{accept:.2f}",
                                step=f"{sampler.step_size:.3g}", L=int(info["n_steps"][0]),
                                divergences=divergences, refresh=False)
                stop = team.agreed_signal(signalled())  # every process stops at the same iteration
                if sampler.iteration % spec.checkpoint_every == 0 or stop:
                    seconds += time.perf_counter() - started
                    started = time.perf_counter()
                    save(snapshot())
                    if stop:
                        log(f"interrupted at iteration {sampler.iteration}; state saved, continue with --resume")
                        raise Interrupted(stop)
        finally:
            bar.close()
    seconds += time.perf_counter() - started
    log(f"hmc: step size {sampler.step_size:.3g}, trajectory length {sampler.trajectory:.3g} "
        f"(~{math.ceil(sampler.trajectory / sampler.step_size)} leapfrog steps at most), "
        f"{potential.evaluations} batched gradients" + (f" per process ({team.size})" if team.size > 1 else "")
        + f"; warm-up took {sampler.warmup_gradients} gradients per chain")
    return {"z": torch.stack(every_chain(kept), dim=1),
            "stats": {k: torch.stack(every_chain(v), dim=1) for k, v in stats.items()},
            "seconds": seconds, "settings": {"step_size": sampler.step_size, "trajectory_length": sampler.trajectory,
                                             "warmup_gradients": sampler.warmup_gradients}
            | ({"chees_trajectory_length": sampler.chees_length} if sampler.chees_length else {})
            | ({"metric_directions": sampler.metric.rank, "metric_narrowest": float(sampler.metric.eigen.min()),
                "metric_widest": float(sampler.metric.eigen.max())} if sampler.metric.rank else {}),
            "sampler": sampler.state_dict()}


def continuation(state: dict, coords: Coordinates, spec: MCMCSpec, run_dir: Path) -> dict:
    """The state that continues a finished many-chain HMC run to ``spec.num_samples`` draws per chain: its sampler
    (positions, adapted settings, random stream) and the draws it kept, as an interrupted run's checkpoint holds
    them, so the chains go on exactly as if they had been asked for more draws from the start.

    :param state: the finished run's samples.pt.
    :param coords: the potential's coordinates (the kept draws are stored by site, the sampler works in ``z``).
    :param spec: the run's ``inference`` section, its ``num_samples`` the new total per chain.
    :param run_dir: the run directory, for the message.
    :returns: the state of an unfinished run at the finished run's last draw.
    :raises ZooInputError: for a NUTS run, or one stored without its sampler's state.
    """
    if state["method"] != "hmc" or "sampler" not in state:
        why = ("NUTS runs its chains one after another and does not keep their kernels" if state["method"] != "hmc"
               else "the run was written before finished runs kept their sampler's state")
        raise ZooInputError("inference.num_samples", spec.num_samples,
                            f"draws can be added only to a finished many-chain HMC run ({why}); train a new run "
                            f"with the number of draws wanted, or resume {run_dir} with its own num_samples")
    draws = state["draws"]
    z = coords.pack({n: v.flatten(0, 1) for n, v in draws.items()}).unflatten(0, next(iter(draws.values())).shape[:2])
    return {"z0": state["z0"], "method": "hmc", "done": False, "sampler": state["sampler"],
            "kept": list(z.unbind(1)), "stats": {k: list(v.unbind(1)) for k, v in state["stats"].items()},
            "seconds": state["seconds"]}


# ------------------------------------------------------------------------------------------ entry point
def fit_mcmc(fit: FitContext) -> MCMCResult:
    """Sample the family's model on the full training set by NUTS or many-chain HMC (the guide is not used).

    Finished NUTS chains, and the state of the running chain (NUTS) or of all chains (HMC) every
    ``checkpoint_every`` iterations and on Ctrl-C or SIGTERM, are saved atomically to ``run_dir/samples.pt``;
    ``resume=True`` continues from there. Under ``torchrun`` the processes share the chains (see
    :mod:`zoo.distributed`) and every process returns all of them. ``start`` is the posterior of the
    run ``inference.init`` names (the pipeline loads it): the chains start at its draws.
    """
    family, data, spec = fit.family, fit.data, fit.spec
    team = distributed.world()
    refuse_batch_dependent(family, "MCMC")
    if spec.method == "hmc":
        distributed.check_chains(spec.num_chains, team.size)
    potential = Potential(family, data, compile=spec.compile, temperature=spec.temperature,
                          chain_chunk=spec.chain_chunk)
    coords = potential.coords
    check_size(coords, spec)
    path = fit.file(SAMPLES_FILE)
    resumable = fit.resume and path is not None and checkpoint_exists(path)
    state = load_checkpoint(path, data.x_train.device, set_aside=True) if resumable else None
    if fit.resume and state is None:
        raise ZooInputError("--resume", str(fit.run_dir), f"no {SAMPLES_FILE} there to resume; drop --resume")
    if state is not None and state.get("done"):
        stored = next(iter(state["draws"].values())).shape[1]
        if spec.num_samples <= stored:
            fit.log("the run had finished; nothing to resume")
            return load_samples(fit.run_dir, family, data.x_train.device)
        state = continuation(state, coords, spec, fit.run_dir)
        fit.log(f"adding draws: {stored} -> {spec.num_samples} per chain, the chains continued where they stopped")
    torch.manual_seed(fit.seed)
    pyro.set_rng_seed(fit.seed)
    z0 = state["z0"] if state is not None else initial_points(family, coords, spec.num_chains, data, fit.log, fit.start,
                                                                          spec.init if fit.start is None else "prior")
    potential.log_joint.verify(coords.unpack(z0[: min(4, len(z0))])[0], fit.log)
    fit.log(f"{spec.method}: {spec.num_chains} chains x ({spec.warmup_steps} warm-up + {spec.num_samples} draws) over "
        f"{coords.dim:,} latent dimensions")

    def write(progress_state: dict) -> None:
        if path is not None:
            save_checkpoint(path, {"z0": z0, "method": spec.method, "done": False, **progress_state})

    with pyro.validation_enabled(False):  # diverging trajectories reach non-finite values: rejected, not errors
        draws, stats, seconds, settings, sampler = _sample(potential, z0, spec, fit.seed, state, fit.progress, fit.log,
                                                           write, team)
    result = MCMCResult(draws, stats, seconds, spec.method, settings)
    if path is not None:  # HMC keeps its sampler's state: draws can be added later (see continuation)
        save_checkpoint(path, {"z0": z0, "method": spec.method, "done": True, "draws": draws, "stats": stats,
                          "seconds": seconds, "settings": settings} | ({"sampler": sampler} if sampler else {}))
    diverging = int(stats["diverging"].sum())
    if diverging:
        fit.log(f"WARNING: {diverging} divergent transitions after warm-up: the draws may be biased; raise "
            "inference.target_accept_prob or reparameterise the prior")
    result.posterior = ChainPosterior(family, result.draws, result.stats, result.settings)
    if fit.monitor is not None:  # no intermediate posterior: scored once, at the end
        fit.monitor.final(result.posterior, data)
    return result


def _sample(potential: Potential, z0: torch.Tensor, spec: MCMCSpec, seed: int, state: dict | None, progress: bool,
            log, write, team: World) -> tuple[dict, dict, float, dict, dict | None]:
    """Run the spec's sampler from ``z0`` (or a saved state); every chain's draws by site ``[chains, samples, ...]``
    (the chains shared by ``team``'s processes), their statistics, seconds, settings and (HMC) the sampler's
    final state."""
    if spec.method == "nuts":
        chains: list[dict] = state["chains"] if state is not None else []
        unfinished: dict[int, dict] = state.get("unfinished", {}) if state is not None else {}
        _run_nuts(potential, z0, spec, seed, progress, log, chains, unfinished,
                  lambda: write({"chains": chains, "unfinished": unfinished}), team)
        z = torch.stack([c["z"] for c in chains])
        stats = {k: torch.stack([c["stats"][k] for c in chains]) for k in chains[0]["stats"]}
        seconds = sum(c["seconds"] for c in chains)
        settings = {"step_size": sum(c["settings"]["step_size"] for c in chains) / len(chains)}
        sampler = None
    else:
        out = _run_hmc(potential, z0, spec, seed, progress, log, state, write, team)
        z, stats, seconds, settings, sampler = out["z"], out["stats"], out["seconds"], out["settings"], out["sampler"]
    with torch.no_grad():
        values, _ = potential.coords.unpack(z.flatten(0, 1))
    return {n: v.unflatten(0, z.shape[:2]) for n, v in values.items()}, stats, seconds, settings, sampler


class MCMC(StoredDraws):
    """Full-batch MCMC on the family's model: Pyro's NUTS or the zoo's many-chain HMC (:func:`fit_mcmc`)."""

    fresh_starts = ("prior", "weights")
    names = ("nuts", "hmc")
    spec = MCMCSpec
    exact = True
    shared_work = {"nuts": "the chains, one per process at a time", "hmc": "the chains, num_chains / N each"}
    adds_draws = ("hmc",)
    fitter = staticmethod(fit_mcmc)
    summary = ("nuts: Pyro's NUTS on the family's model, chain after chain (the gold standard); hmc: all chains as "
               "one tensor computation, ChEES-tuned trajectory length, an HMC or MAMS kernel")

    def describe(self, spec: MCMCSpec) -> str:
        return f"sampled by {spec.method}"

    def convergence_advice(self, spec: MCMCSpec, posterior: Posterior) -> list[str]:
        """For many-chain HMC: whether ``max_leapfrog_steps`` cut the trajectory length ChEES settled on (the
        low-noise regime: a tiny step, so the length it wants takes more steps than the cap allows)."""
        settings = posterior.settings if isinstance(posterior, ChainPosterior) else {}
        wanted, step = settings.get("chees_trajectory_length"), settings.get("step_size")
        if spec.method != "hmc" or not wanted or not step or wanted <= step * spec.max_leapfrog_steps:
            return []
        steps = math.ceil(wanted / step)
        directions = int(settings.get("metric_directions", 0))
        metric = (f", under a {spec.metric} metric modified along {directions} direction"
                  f"{'s' if directions != 1 else ''} (whitened variances {settings['metric_narrowest']:.3g} to "
                  f"{settings['metric_widest']:.3g})" if directions else "")
        return [f"the trajectory was cut at inference.max_leapfrog_steps = {spec.max_leapfrog_steps:,} steps of "
                f"{step:.3g} (length {step * spec.max_leapfrog_steps:.3g}), where ChEES settled on {wanted:.3g} "
                f"({steps:,} steps){metric}: set inference.max_leapfrog_steps={steps} (each draw then costs up to "
                "that many gradients) or draw more; with divergences, also raise inference.target_accept_prob"]

    def check_processes(self, spec: MCMCSpec, nproc: int) -> None:
        if spec.method == "hmc":  # every process steps an equal share of the chains; NUTS deals them out in rounds
            distributed.check_chains(spec.num_chains, nproc)


