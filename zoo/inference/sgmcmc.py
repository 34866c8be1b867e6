"""Stochastic-gradient MCMC on a family's own Pyro model: SGLD and (cyclical) SGHMC, many chains in lockstep.

Both samplers follow minibatch estimates of the potential U(z) = -log p(w, y | x) / T - log|det J| in the
unconstrained coordinates ``z [C, D]`` of :mod:`zoo.inference.potential` (its
:class:`~zoo.inference.potential.MinibatchPotential`): a minibatch of B rows weights its log-likelihood by N/B, an
unbiased estimate of the full-data term. All C chains take each step as one batched gradient on the same minibatch, with
their own injected noise.

* ``sgld`` (Welling & Teh 2011): z <- z - eps/2 grad U_B(z) + N(0, eps).
* ``sghmc`` (Chen et al. 2014, in the momentum form of Zhang et al. 2020): v <- (1 - a) v - eps grad U_B(z) +
  N(0, 2 a eps), z <- z + v, with a = 1 - momentum the friction.

With a preconditioner both take a diagonal inverse mass G: z <- z - eps/2 G grad U_B + N(0, eps G), and
v <- (1 - a) v - eps G grad U_B + N(0, 2 a eps G). G is 1 / (sqrt(s) + floor) for s a decaying average of the squared
per-row gradients. G is frozen whenever draws are kept, so they come from a sampler with a constant metric (a G that
kept adapting would bias them unless its drift term were added).

* ``rmsprop`` (pSGLD, Li et al. 2016): G rescaled to mean 1 per chain, so that ``lr`` keeps the units of the
  unpreconditioned sampler; estimated during burn-in, then frozen. It evens out directions of unequal stiffness, not
  a stiffness that all of them share.
* ``scale_adapted`` (the scale-adapted SGHMC of Springenberg et al. 2016): G as it is, so a step is about ``lr`` in
  every coordinate whatever the scale of the potential. It is estimated during burn-in and re-estimated in every
  exploration phase of a cyclical schedule (no draw is kept there). A learned noise scale that shrinks as the fit
  improves makes the whole likelihood stiffer by 1 / sigma^2 within one run, and a step that was stable in the
  first cycle diverges at a later restart; this G follows it (UCI energy: configs/sghmc_scale_adapted_uci.yaml).
  In an exploration phase G is also held below what the sampling steps' own squared gradients give (a second
  average, over every noisy step so far): without noise the gradients vanish as SGD converges, and a G taken from
  them alone was so large that the first noisy steps after it diverged (the toy, full batch, at lr 0.001).

``lr`` is the learning rate of the per-row loss U/N, the units of SGD (and of the published settings), so the step on
U is eps = lr / N. Schedules: ``cyclical`` (Zhang et al. 2020, "Cyclical stochastic gradient MCMC for Bayesian deep
learning": a cosine from lr to 0 in each of ``cycles`` cycles; the first ``exploration`` share of a cycle runs
without noise, as SGD with momentum, and draws are collected in the rest), ``polynomial`` (lr (1 + t/t0)^-0.55, the
SGLD paper's decay) and ``constant``. Draws are kept every ``thin`` steps after ``burn_in_epochs`` and stored chain by
chain like MCMC draws (``samples.pt``), so ``zoo diagnose`` and ``zoo compare`` read them as they read MCMC.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import pyro
import torch
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from zoo.data.base import Dataset
from zoo.errors import TrainingDiverged, ZooInputError
from zoo.evaluate import ValidationMonitor
from zoo.inference.base import copy_point_parameters
from zoo.inference.draws import SAMPLES_FILE, MCMCResult, StoredDraws, load_samples
from zoo.inference.loop import TrainingLoop
from zoo.inference.potential import MinibatchPotential, initial_points, refuse_batch_dependent
from zoo.models.base import ModelFamily
from zoo.posterior import ChainPosterior, Posterior
from zoo.runs import RunLog, save_checkpoint
from zoo.sections import Tempered


class SGMCMCSpec(Tempered):
    """Stochastic-gradient MCMC (SGLD or cyclical SGHMC) on minibatches, several chains at once."""

    method: Literal["sgld", "sghmc"] = Field(description=(
        "sgld (Welling & Teh 2011) or sghmc (cyclical SGHMC, Zhang et al. 2020)"))
    num_chains: PositiveInt = Field(4, description=(
        "chains run in lockstep on the same minibatches, each with its own noise"))
    epochs: PositiveInt = Field(200, description="passes over the training rows")
    batch_size: PositiveInt | None = Field(128, description="minibatch size; null = full batch")
    lr: PositiveFloat = Field(0.1, description="learning rate of the per-row loss U/N (the step on U is lr / N)")
    schedule: Literal["cyclical", "polynomial", "constant"] | None = Field(
        None, description="step-size schedule; default cyclical for sghmc (Zhang et al. 2020), polynomial for sgld")
    cycles: PositiveInt = Field(4, description="cyclical: number of cosine cycles over the run")
    exploration: float = Field(0.5, ge=0.0, lt=1.0, description="cyclical: share of each cycle run without noise "
                               "(SGD with momentum); draws come from the rest")
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="sghmc: 1 - friction (the SGD momentum)")
    burn_in_epochs: NonNegativeFloat = Field(50.0, description="epochs before the first kept draw")
    thin: PositiveInt = Field(10, description="keep every thin-th step's state after burn-in")
    preconditioner: Literal["none", "rmsprop", "scale_adapted"] = Field(
        "none", description="a diagonal inverse mass from the squared gradients, frozen while draws are kept. "
        "rmsprop (pSGLD, Li et al. 2016): rescaled to mean 1, estimated in burn-in; for likelihoods stiff in some "
        "directions only. scale_adapted (Springenberg et al. 2016): unscaled, so lr is a step in each coordinate, "
        "re-estimated in every exploration phase (held below what the sampling steps' gradients give); for a "
        "stiffness that grows during the run (a learned noise that shrinks, as on UCI energy)")
    precondition_decay: float = Field(0.99, gt=0.0, lt=1.0, description="rmsprop: decay per step of the average "
                                      "of squared gradients")
    init: str = Field("net", description="'net' (the net's own initialisation, redrawn per chain), 'prior' (prior "
                      "draws), 'weights' (every chain at the net's own weights, e.g. trained ones: net.weights), or a "
                      "run directory (MAP or VI fit of the same spec): chains start at its draws")
    checkpoint_every: PositiveInt = Field(1000, description="steps between checkpoints")
    predictive_samples: PositiveInt = Field(400, description="draws (over all chains) used for test metrics")

    @model_validator(mode="after")
    def _default_schedule(self) -> SGMCMCSpec:
        if self.schedule is None:
            self.schedule = "cyclical" if self.method == "sghmc" else "polynomial"
        explores = self.schedule == "cyclical" and self.exploration > 0
        if self.preconditioner != "none" and self.burn_in_epochs == 0 and not (
                self.preconditioner == "scale_adapted" and explores):
            raise ValueError(f"inference.burn_in_epochs: got 0; the {self.preconditioner} preconditioner is estimated "
                             "during burn-in (scale_adapted: or a cyclical schedule's exploration phases) and frozen "
                             "while draws are kept: give it burn-in epochs (e.g. 50), or preconditioner: none")
        return self


# sqrt(s) is floored at this share of its mean, so G stays below 1 / share times its mean: rmsprop's 100x as
# published; scale_adapted's G is not rescaled, and 10x keeps a coordinate whose gradient vanished at the end of an
# exploration phase from taking a step that the frozen G cannot pull back (UCI energy: a 100x floor diverged on 1 of 20
# splits at lr 0.001 and on split 0 at lr 0.002, a 10x floor on neither; measured before the noisy steps' bound)
PRECONDITIONER_FLOOR = {"rmsprop": 0.01, "scale_adapted": 0.1}
# A chain whose potential exceeds the lowest chain's by more than STRAY_NATS_PER_ROW per training row (on the tempered
# scale) at STRAY_DRAWS kept draws in a row is not sampling the posterior the others sample: every training row is
# e^5 times less likely under it, or worse. Such a chain can stay finite (a learned noise scale of 1e15, say), so the
# non-finite check misses it, while its draws ruin the predictive mean (the mixture's log-likelihood hides them: the
# good chains carry it). Measured on the 465 SGLD and SGHMC UCI runs and sweep trials of the tuned benchmark: the
# healthy ones stay below 1.7 nats per row over 3 draws in a row (single draws reach 8: minibatch noise and SGLD's
# spikes, hence the run of draws), the 26 with runaway chains (SGHMC on energy, noise scales 1e8-1e15) above 5.
STRAY_NATS_PER_ROW = 5.0
STRAY_DRAWS = 3


def inverse_mass(square: torch.Tensor, steps: int, decay: float, kind: str = "rmsprop") -> torch.Tensor:
    """The diagonal inverse mass ``G [C, D]`` from the decaying average ``square`` of squared per-row gradients
    after ``steps`` updates (bias-corrected as Adam's): ``1 / (sqrt(s) + floor)``; ``rmsprop`` rescales it to mean 1
    per chain, ``scale_adapted`` keeps it as it is.

    :param square: the decaying average of squared per-row gradients ``[C, D]``.
    :param steps: the updates averaged so far (at least 1 is assumed), for the bias correction.
    :param decay: the average's decay per step.
    :param kind: ``rmsprop`` or ``scale_adapted`` (which also sets the floor, :data:`PRECONDITIONER_FLOOR`).
    :returns: ``G [C, D]``.
    """
    root = (square / (1.0 - decay ** max(steps, 1))).sqrt()
    floor = PRECONDITIONER_FLOOR[kind] * root.mean(-1, keepdim=True)
    inverse = 1.0 / (root + floor + torch.finfo(root.dtype).tiny)
    return inverse / inverse.mean(-1, keepdim=True) if kind == "rmsprop" else inverse


def step_size(spec: SGMCMCSpec, step: int, total: int) -> tuple[float, bool]:
    """The learning rate at ``step`` of ``total`` and whether this step samples (injects noise; False while a
    cyclical schedule explores).

    :param spec: the run's ``inference`` section (its ``lr``, ``schedule``, ``cycles`` and ``exploration``).
    :param step: the step, from 0.
    :param total: the run's steps.
    :returns: ``(lr, sampling)``.
    """
    if spec.schedule == "constant":
        return spec.lr, True
    if spec.schedule == "polynomial":
        return spec.lr * (1.0 + step / max(1.0, 0.01 * total)) ** -0.55, True
    length = math.ceil(total / spec.cycles)
    phase = (step % length) / length
    return spec.lr / 2 * (math.cos(math.pi * phase) + 1.0), phase >= spec.exploration


def stray_chains(energy: torch.Tensor, rows: int, temperature: float = 1.0) -> list[int]:
    """The chains whose potential ``energy [C]`` at one kept draw exceeds the lowest chain's by more than
    :data:`STRAY_NATS_PER_ROW` per training row (``rows``), on the tempered scale; none with a single chain (nothing to
    compare with). A run stops when a chain is among them at :data:`STRAY_DRAWS` kept draws in a row.

    :param energy: each chain's potential ``[C]`` at one kept draw.
    :param rows: training rows.
    :param temperature: the posterior's temperature (the potential is the tempered one).
    :returns: the stray chains' indices, in order.
    """
    if energy.numel() < 2:
        return []
    gap = energy - energy.min()
    return torch.nonzero(gap > STRAY_NATS_PER_ROW * rows / temperature).flatten().tolist()


# The remedy a divergence names for each preconditioner not yet tried (scale_adapted: none left)
PRECONDITION_HINT = {
    "none": ", or precondition the steps (inference.preconditioner: scale_adapted, with lr about 0.001; it follows a "
            "stiffness that grows as a learned noise shrinks)",
    "rmsprop": ", or use inference.preconditioner: scale_adapted (lr about 0.001), which follows a stiffness that "
               "all coordinates share",
}


def kept_steps(spec: SGMCMCSpec, total: int, per_epoch: int) -> list[int]:
    """The steps whose state becomes a draw: after burn-in, every ``thin``-th sampling step.

    :param spec: the run's ``inference`` section.
    :param total: the run's steps.
    :param per_epoch: steps per epoch (for ``burn_in_epochs``).
    :returns: the kept steps, ascending.
    """
    burn_in = int(spec.burn_in_epochs * per_epoch)
    sampling = [t for t in range(burn_in, total) if step_size(spec, t, total)[1]]
    return sampling[spec.thin - 1::spec.thin]


def fit_sgmcmc(
    family: ModelFamily,
    guide: torch.nn.Module,
    data: Dataset,
    spec: SGMCMCSpec,
    seed: int,
    run_dir: Path | None = None,
    resume: bool = False,
    log: RunLog | None = None,
    progress: bool = True,
    monitor: ValidationMonitor | None = None,
    start: Posterior | None = None,
) -> MCMCResult:
    """Run ``spec.num_chains`` SGLD/SGHMC chains on minibatches; draws ``{site: [chains, draws, ...]}``.

    The state (chains, momenta, draws so far, random streams) is saved atomically to ``run_dir/samples.pt`` every
    ``checkpoint_every`` steps and on Ctrl-C; ``resume=True`` continues exactly. A step that makes a chain
    non-finite stops the run with the step, the learning rate and the last good draw; so does a chain that strays from
    the others for :data:`STRAY_DRAWS` kept draws in a row (:func:`stray_chains`; the count restarts on resume).

    :param family: the model family whose Pyro model is sampled.
    :param guide: unused (the chains sample the family's own model); taken for the common fitter signature.
    :param data: the data set, its training rows on the device the chains run on.
    :param spec: the run's ``inference`` section.
    :param seed: seeds the chains' starts and noise (the minibatch order uses ``seed + 1``).
    :param run_dir: where ``samples.pt`` is written; None writes nothing.
    :param resume: continue from ``run_dir``'s ``samples.pt``.
    :param log: the run's log (None: no messages).
    :param progress: whether to show a progress bar.
    :param monitor: scores the final posterior once, at the end (None: no scoring).
    :param start: the posterior of the run ``inference.init`` names: chains start at its draws, and a family's point
        parameters are copied from it.
    :returns: the draws, their statistics (``potential`` and ``lr`` per draw), the wall time and the posterior.
    :raises ZooInputError: when burn-in and thinning leave no draw to keep, when ``resume`` finds no checkpoint, or
        when the family has point parameters and no ``start`` gives them.
    :raises TrainingDiverged: when a chain becomes non-finite or strays from the others.
    """
    log = log or RunLog(None, echo=None)
    refuse_batch_dependent(family, spec.method.upper())
    device = data.x_train.device
    path = Path(run_dir) / SAMPLES_FILE if run_dir is not None else None
    loop = TrainingLoop(data.n_train, spec.batch_size, seed + 1, path, spec.checkpoint_every, spec.method.upper(),
                        progress, log, device, stream=data if data.streamed else None)
    total, n = spec.epochs * loop.per_epoch, loop.n
    keep = set(kept_steps(spec, total, loop.per_epoch))
    if not keep:
        raise ZooInputError("inference.burn_in_epochs", spec.burn_in_epochs, f"leaves no draw to keep in {spec.epochs} "
                            "epochs: lower it or the thinning, or run more epochs")
    potential = MinibatchPotential(family, data, spec.temperature)
    coords = potential.coords
    noise = torch.Generator(device=device).manual_seed(seed)
    if resume:
        saved = loop.resume(run_dir)
        if saved.get("done"):
            log("the run had finished; nothing to resume")
            return load_samples(run_dir, family, device)
        z, velocity, draws = saved["z"], saved["velocity"], saved["draws"]
        square, mass = saved.get("square", torch.zeros_like(z)), saved.get("inverse_mass", torch.ones_like(z))
        noisy, noisy_steps = saved.get("noisy_square", torch.zeros_like(z)), saved.get("noisy_steps", 0)
        noise.set_state(saved["noise_rng"].cpu())
        if start is not None:
            copy_point_parameters(family, start, "inference.init")
        log(f"resumed {spec.method} at step {loop.step}/{total}")
    else:
        torch.manual_seed(seed)
        pyro.set_rng_seed(seed)
        z = initial_points(family, coords, spec.num_chains, data, log, start, spec.init)  # fresh, or draws of start
        velocity, draws = torch.zeros_like(z), []
        square, mass = torch.zeros_like(z), torch.ones_like(z)  # rmsprop's average and G (1: no preconditioner)
        noisy, noisy_steps = torch.zeros_like(z), 0  # scale_adapted: the average over the sampling steps
    strayed = [0] * len(z)  # per chain: kept draws in a row at which it was a stray
    root = mass.sqrt()  # G's square root scales the noise; both change only while the preconditioner adapts
    adapting = int(spec.burn_in_epochs * loop.per_epoch) if spec.preconditioner != "none" else 0
    readapt = spec.preconditioner == "scale_adapted"  # G also follows the potential in every exploration phase
    log(f"{spec.method}: {spec.num_chains} chains x {spec.epochs} epochs ({total:,} steps of {loop.batch} rows, "
        f"{spec.schedule} lr from {spec.lr:g}) over {coords.dim:,} latent dimensions; {len(keep)} draws per chain"
        + (f"; {spec.preconditioner} preconditioner estimated over the {adapting:,} burn-in steps"
           + (" and every exploration phase, frozen while draws are kept" if readapt else ", then frozen")
           if spec.preconditioner != "none" else ""))
    loop.state = lambda: {"z": z, "velocity": velocity, "draws": draws, "noise_rng": noise.get_state(),
                          "method": spec.method, "square": square, "inverse_mass": mass, "noisy_square": noisy,
                          "noisy_steps": noisy_steps}

    def update(rows: torch.Tensor | None) -> None:
        nonlocal z, velocity, square, mass, root, noisy, noisy_steps
        lr, sampling = step_size(spec, loop.step, total)
        eps = lr / n
        energy, grad = potential.value_and_grad(z, rows)
        decay = spec.precondition_decay
        if readapt and sampling:  # the noisy steps' gradients: the posterior's scale, which bounds G
            noisy = decay * noisy + (1.0 - decay) * (grad / n).square()
            noisy_steps += 1
        if loop.step < adapting:
            square = decay * square + (1.0 - decay) * (grad / n).square()
            mass = inverse_mass(square, loop.step + 1, decay, spec.preconditioner)
            root = mass.sqrt()
            if loop.step + 1 == adapting:
                log(f"{spec.method}: preconditioner frozen at step {adapting:,}: G from {float(mass.min()):.3g} to "
                    f"{float(mass.max()):.3g}" + (" (re-estimated in every exploration phase)" if readapt
                                                  else " (mean 1 per chain)"))
        elif readapt and not sampling:  # an exploration phase: G follows the potential, no larger than the noisy
            square = decay * square + (1.0 - decay) * (grad / n).square()  # steps' gradients allow
            mass = inverse_mass(square, loop.step + 1, decay, spec.preconditioner)
            if noisy_steps:
                mass = torch.minimum(mass, inverse_mass(noisy, noisy_steps, decay, spec.preconditioner))
            root = mass.sqrt()
        if spec.method == "sgld":
            new_z, new_velocity = z - eps / 2 * mass * grad, velocity
            if sampling:
                new_z = new_z + math.sqrt(eps) * root * _randn(z, noise)
        else:
            new_velocity = spec.momentum * velocity - eps * mass * grad
            if sampling:
                spread = math.sqrt(2 * (1.0 - spec.momentum) * eps)
                new_velocity = new_velocity + spread * root * _randn(z, noise)
            new_z = z + new_velocity
        if not (torch.isfinite(new_z).all() and torch.isfinite(energy).all()):
            loop.save()  # the state this step started from, with every good draw so far
            last = max((t for t in keep if t < loop.step), default=None)
            where = f"the draw of step {last}" if last is not None else "no draw yet"
            raise TrainingDiverged(
                f"{spec.method} diverged at step {loop.step} (epoch {loop.step // loop.per_epoch}, lr {lr:.3g}): a "
                f"chain's weights or potential became non-finite; the last good draw is {where}"
                + (f", kept in {path}" if path is not None and last is not None else "")
                + f". Lower inference.lr (now {spec.lr:g})"
                + (" or use batch_size: null" if spec.batch_size is not None else "")
                + PRECONDITION_HINT.get(spec.preconditioner, ""))
        z, velocity = new_z, new_velocity
        if loop.step in keep:
            now = set(stray_chains(energy.detach(), n, spec.temperature))
            strayed[:] = [count + 1 if c in now else 0 for c, count in enumerate(strayed)]
            strays = [c for c, count in enumerate(strayed) if count >= STRAY_DRAWS]
            if strays:
                gap = float((energy[strays] - energy.min()).min())
                loop.save()  # the state at this step, with the draws kept so far (for inspection)
                raise TrainingDiverged(
                    f"{spec.method} chain(s) {', '.join(map(str, strays))} strayed from the others by step {loop.step} "
                    f"(epoch {loop.step // loop.per_epoch}, lr {lr:.3g}): a potential at least {gap:.4g} nats above "
                    f"the best chain's, more than {STRAY_NATS_PER_ROW:g} per training row ({n} rows), at "
                    f"{STRAY_DRAWS} kept draws in a row, so they left (or never "
                    f"reached) the posterior the others sample, and their draws would dominate the predictive mean. "
                    f"Lower inference.lr (now {spec.lr:g})" + PRECONDITION_HINT.get(spec.preconditioner, ""))
            draws.append((z.detach().clone(), energy.detach().clone(), lr))

    with pyro.validation_enabled(False):
        loop.run(total, update)
    chain_z = torch.stack([d[0] for d in draws], dim=1)  # [C, S, D]
    stats = {"potential": torch.stack([d[1] for d in draws], dim=1),
             "lr": torch.tensor([d[2] for d in draws], device=device).repeat(len(z), 1)}
    with torch.no_grad():
        values, _ = coords.unpack(chain_z.flatten(0, 1))
    chains = {name: v.unflatten(0, chain_z.shape[:2]) for name, v in values.items()}
    result = MCMCResult(chains, stats, loop.seconds, spec.method, {"lr": spec.lr, "steps": total})
    if path is not None:
        save_checkpoint(path, {"method": spec.method, "done": True, "draws": chains, "stats": stats,
                               "seconds": loop.seconds, "settings": result.settings, "inverse_mass": mass})
    log(f"{spec.method}: {chain_z.shape[1]} draws per chain in {loop.seconds:.1f} s")
    result.posterior = ChainPosterior(family, chains, stats)
    if monitor is not None:
        monitor.final(result.posterior, data)
    return result


def _randn(like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(like.shape, generator=generator, device=like.device, dtype=like.dtype)


class SGMCMC(StoredDraws):
    """SGLD and cyclical SGHMC on minibatches (:func:`fit_sgmcmc`)."""

    streams_rows = True
    names = ("sgld", "sghmc")
    spec = SGMCMCSpec
    fitter = staticmethod(fit_sgmcmc)
    summary = ("sgld: stochastic-gradient Langevin dynamics (Welling & Teh 2011); sghmc: cyclical stochastic-"
               "gradient HMC (Zhang et al. 2020); minibatches, several chains, stored like MCMC draws")
    fresh_starts = ("net", "prior", "weights")

    def describe(self, spec: SGMCMCSpec) -> str:
        return f"sampled by {spec.method} ({spec.schedule} lr)"

