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
from typing import Literal

import pyro
import torch
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from zoo.errors import TrainingDiverged, ZooInputError
from zoo.inference.base import FitContext, copy_point_parameters, hyperparameter_record, widen_priors
from zoo.inference.draws import SAMPLES_FILE, MCMCResult, StoredDraws, load_samples
from zoo.inference.loop import TrainingLoop, steps_per_epoch
from zoo.inference.lr_choice import JointSetting, fit_choosing_lr
from zoo.inference.potential import MinibatchPotential, initial_points, refuse_batch_dependent
from zoo.posterior import ChainPosterior
from zoo.runs import save_checkpoint
from zoo.sections import DEFAULT_LR, LR_CANDIDATES, ChoosesLR, Epochs, ScalesPrior, SetsNoise

DEFAULT_SGMCMC_LR = 0.1  # the lr where none is set
SGMCMC_LR_CANDIDATES = (0.01, 0.03, 0.1)  # inference.lr_by: calibration's lrs (docs/results/defaults.md)
SGMCMC_LR_LOWER = (0.003, 0.001)  # ... and a decade below, one rung at a time while the lowest lr run scores best
# or all diverge (UCI energy: SGLD's lowest candidate won, cyclical SGHMC diverged at all)
MIN_KEPT_DRAWS = 20  # draws per chain a run keeps at the least, where it has that many sampling steps and no thin


class SGMCMCSpec(ChoosesLR, ScalesPrior, SetsNoise):
    """Stochastic-gradient MCMC (SGLD or cyclical SGHMC) on minibatches, several chains at once."""

    method: Literal["sgld", "sghmc"] = Field(description=(
        "sgld (Welling & Teh 2011) or sghmc (cyclical SGHMC, Zhang et al. 2020)"))
    num_chains: PositiveInt = Field(4, description=(
        "chains run in lockstep on the same minibatches, each with its own noise"))
    epochs: Epochs = Field(200, description="passes over the training rows")
    batch_size: PositiveInt | None = Field(128, description="minibatch size; null = full batch")
    lr: PositiveFloat | None = Field(None, description=(
        f"learning rate of the per-row loss U/N (the step on U is lr / N); null: {DEFAULT_SGMCMC_LR:g}, or the best "
        f"of {', '.join(f'{c:g}' for c in SGMCMC_LR_CANDIDATES)} on the fit's calibration rows where it has them "
        f"(lr_by; then {', '.join(f'{c:g}' for c in SGMCMC_LR_LOWER)} in turn while the lowest lr run scores best "
        "or every run diverged)"))
    schedule: Literal["cyclical", "polynomial", "constant"] | None = Field(
        None, description="step-size schedule; default cyclical for sghmc (Zhang et al. 2020), polynomial for sgld")
    cycles: PositiveInt = Field(4, description="cyclical: number of cosine cycles over the run")
    exploration: float = Field(0.5, ge=0.0, lt=1.0, description="cyclical: share of each cycle run without noise "
                               "(SGD with momentum); draws come from the rest")
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="sghmc: 1 - friction (the SGD momentum)")
    burn_in_epochs: NonNegativeFloat | None = Field(None, description=(
        "epochs before the first kept draw; null: a quarter of the run's epochs (50 of the default 200), three "
        "quarters where the burn-in explores (explore_burn_in), so that any number of epochs keeps draws"))
    explore_burn_in: bool | None = Field(None, description=(
        "burn-in steps without noise that climb to a mode as the zoo's MAP fit does (Adam at explore_lr on "
        "each chain), where the sampling steps start: far fewer steps than noisy ones take to reach the "
        "posterior's bulk, and no draw is kept from them; null: true for sgld without a preconditioner (its own "
        "steps have no momentum); for sghmc without one, chosen with the lr on the fit's calibration rows where it "
        "chooses its lr, between no climb (its cyclical schedule explores in every cycle, which serves some nets "
        "better) and a climb at each of the MAP's lrs, else false; "
        "false for a preconditioned run (its metric is estimated from the burn-in's noisy steps)"))
    explore_lr: PositiveFloat | None = Field(None, description=(
        f"Adam's step in an exploring burn-in; null: {DEFAULT_LR:g} (the zoo's MAP fit's), or, where the fit chooses "
        "its lr and the burn-in climbs or may (sgld's default, sghmc's left open, explore_burn_in: true), chosen "
        "with it among the MAP's own "
        f"{', '.join(f'{c:g}' for c in LR_CANDIDATES)}"))
    thin: PositiveInt | None = Field(None, description=(
        "keep every thin-th step's state after burn-in; null: every 10th, or closer where the run is short, so that "
        f"each chain keeps {MIN_KEPT_DRAWS} draws where it has that many sampling steps"))
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
    compile: bool = Field(False, description="trace each step (gradient and move, the noise passed in) into one "
                          "graph per minibatch size and compile it (a one-off compile of seconds; on a GPU also a "
                          "CUDA graph); while the preconditioner adapts, the gradient alone is compiled")

    @model_validator(mode="after")
    def _default_schedule(self) -> SGMCMCSpec:
        if self.schedule is None:
            self.schedule = "cyclical" if self.method == "sghmc" else "polynomial"
        if self.explore_burn_in is None and (self.method == "sgld" or self.preconditioner != "none"):
            self.explore_burn_in = self.method == "sgld" and self.preconditioner == "none"  # sghmc's: left open
        if self.explore_lr is not None and self.explore_burn_in is False:
            raise ValueError(f"inference.explore_lr: got {self.explore_lr:g} for a burn-in that does not climb "
                             "(explore_burn_in: false, or a preconditioner): drop explore_lr, or set "
                             "explore_burn_in: true")
        if self.explore_burn_in and self.preconditioner != "none":
            raise ValueError(f"inference.explore_burn_in: got true with the {self.preconditioner} preconditioner, "
                             "which is estimated from the burn-in's noisy gradients (noise-free steps near a mode "
                             "would set it far too large): drop explore_burn_in, or use preconditioner: none")
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


def step_size(spec: SGMCMCSpec, step: int, total: int, explored: int = 0) -> tuple[float, bool]:
    """The learning rate at ``step`` of ``total`` and whether this step samples (injects noise; False while a
    cyclical schedule explores).

    :param spec: the run's ``inference`` section (its ``lr``, ``schedule``, ``cycles`` and ``exploration``).
    :param step: the step, from 0.
    :param total: the run's steps.
    :param explored: the exploring burn-in's steps (``explore_burn_in``): taken at ``lr``, the polynomial decay
        starting after them, over the sampling steps.
    :returns: ``(lr, sampling)``.
    """
    lr = DEFAULT_SGMCMC_LR if spec.lr is None else spec.lr
    if spec.schedule == "constant":
        return lr, True
    if spec.schedule == "polynomial":
        return lr * (1.0 + max(0, step - explored) / max(1.0, 0.01 * (total - explored))) ** -0.55, True
    length = math.ceil(total / spec.cycles)
    phase = (step % length) / length
    return lr / 2 * (math.cos(math.pi * phase) + 1.0), phase >= spec.exploration


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


DEFAULT_THIN = 10  # every 10th sampling step becomes a draw where thin is not given, unless the run is short
BURN_IN_SHARE = 0.25  # the share of the run's epochs spent in burn-in when burn_in_epochs is not given
EXPLORE_SHARE = 0.75  # the same where the burn-in explores (Adam's climb): as SWAG's pretraining, three quarters climb
# and the last quarter samples; a quarter left the sampler's small steps to finish the climb (docs/results/defaults.md)
EXPLORE_LR = DEFAULT_LR  # an exploring burn-in's Adam step where none is set or chosen: the zoo's MAP fit's (SVI's)


def burn_in_steps(spec: SGMCMCSpec, per_epoch: int) -> int:
    """The steps before the first kept draw (and over which a preconditioner adapts): ``burn_in_epochs``, or
    :data:`BURN_IN_SHARE` of the run's epochs where it is not given (:data:`EXPLORE_SHARE` where the burn-in explores),
    so a run of any length keeps draws.

    :param spec: the run's ``inference`` section.
    :param per_epoch: steps per epoch.
    :returns: the burn-in steps.
    """
    share = EXPLORE_SHARE if spec.explore_burn_in else BURN_IN_SHARE
    epochs = spec.burn_in_epochs if spec.burn_in_epochs is not None else share * spec.epochs
    return int(epochs * per_epoch)


def kept_steps(spec: SGMCMCSpec, total: int, per_epoch: int) -> list[int]:
    """The steps whose state becomes a draw: after burn-in, every ``thin``-th sampling step.

    :param spec: the run's ``inference`` section.
    :param total: the run's steps.
    :param per_epoch: steps per epoch (for ``burn_in_epochs``).
    :returns: the kept steps, ascending.
    """
    burn_in = burn_in_steps(spec, per_epoch)
    sampling = [t for t in range(burn_in, total) if step_size(spec, t, total)[1]]
    thin = spec.thin if spec.thin is not None else max(1, min(DEFAULT_THIN, len(sampling) // MIN_KEPT_DRAWS))
    return sampling[thin - 1::thin]


EXPLORE_STEP = JointSetting.over("explore_lr", LR_CANDIDATES)  # an exploring burn-in's Adam step, where it is left null


def open_burn_in(spec: SGMCMCSpec, per_epoch: int) -> JointSetting | None:
    """The burn-in settings a choice of the lr also chooses. Where sghmc leaves open whether its burn-in climbs (and
    a climbing burn-in still keeps a draw): no climb, or a climb at each of the MAP's own lrs (at ``explore_lr`` where
    that is given). Where the burn-in climbs and its Adam step is left null: the step, among the MAP's own lrs. Else
    none. The climb is the zoo's MAP fit, so which step serves depends on the net and the data, as the MAP's lr does
    (SGLD's rows chose 0.003 on the MLP on mnist5k, 0.01 on the toy; cyclical SGHMC's 0.003 on that MLP too;
    docs/results/defaults.md).

    :param spec: the run's ``inference`` section.
    :param per_epoch: steps per epoch.
    :returns: the joint settings, or None.
    """
    if spec.explore_burn_in is None:
        exploring = spec.model_copy(update={"explore_burn_in": True})
        if not kept_steps(exploring, spec.epochs * per_epoch, per_epoch):
            return None
        steps = EXPLORE_STEP.options if spec.explore_lr is None else ({"explore_lr": spec.explore_lr},)
        return JointSetting(({"explore_burn_in": False}, *({"explore_burn_in": True} | step for step in steps)))
    return EXPLORE_STEP if spec.explore_burn_in and spec.explore_lr is None else None


def fit_sgmcmc(fit: FitContext) -> MCMCResult:
    """SGLD or cyclical SGHMC at the spec's lr, at the default, or at the best of a whole run at each of
    :data:`SGMCMC_LR_CANDIDATES` on the calibration rows (``inference.lr_by``,
    :func:`~zoo.inference.lr_choice.fit_choosing_lr`), each at every value of the burn-in's open setting
    (:func:`open_burn_in`), and at each of :data:`SGMCMC_LR_LOWER` in turn while the lowest lr run scores best or
    every run diverged; each run is :func:`run_sgmcmc`.

    :param fit: the fit's :class:`~zoo.inference.base.FitContext` (as :func:`run_sgmcmc` reads it).
    :returns: the draws, their statistics, the wall time and the posterior.
    :raises ZooInputError: as :func:`run_sgmcmc`, and ``lr_by: calibration`` without calibration rows.
    :raises TrainingDiverged: when a chain diverges or strays (with the lr chosen: at every candidate and every lower
        lr).
    """
    per_epoch = steps_per_epoch(fit.data.n_train, fit.spec.batch_size, fit.data if fit.data.streamed else None)
    climbs: dict[tuple[float, float], dict] = {}  # shared by the candidates: a climb does not depend on their lr
    return fit_choosing_lr(fit, lambda candidate: run_sgmcmc(candidate, climbs), with_lr, DEFAULT_SGMCMC_LR,
                           SGMCMC_LR_CANDIDATES, (SAMPLES_FILE,), fit.spec.method, open_burn_in(fit.spec, per_epoch),
                           SGMCMC_LR_LOWER)


def with_lr(spec: SGMCMCSpec, lr: float) -> SGMCMCSpec:
    """``spec`` (its lr null) at ``lr``, its burn-in's open settings resolved where nothing chose them (sghmc's
    burn-in does not explore; an exploring one climbs at :data:`EXPLORE_LR`).

    :param spec: an ``inference`` section whose ``lr`` is null.
    :param lr: the lr.
    :returns: the section with ``lr`` and ``explore_burn_in`` written out, and ``explore_lr`` where the burn-in
        climbs (``lr_by: fixed``).
    """
    climbing = bool(spec.explore_burn_in)
    return spec.model_copy(update={"lr": lr, "lr_by": "fixed", "explore_burn_in": climbing,
                                   "explore_lr": explore_step(spec) if climbing else None})


def explore_step(spec: SGMCMCSpec) -> float:
    """An exploring burn-in's Adam step: ``explore_lr``, or :data:`EXPLORE_LR` where it is unset.

    :param spec: the run's ``inference`` section.
    :returns: the step.
    """
    return EXPLORE_LR if spec.explore_lr is None else spec.explore_lr


def run_sgmcmc(fit: FitContext, climbs: dict[tuple[float, float], dict] | None = None) -> MCMCResult:
    """Run ``spec.num_chains`` SGLD/SGHMC chains on minibatches; draws ``{site: [chains, draws, ...]}``.

    The state (chains, momenta, draws so far, random streams) is saved atomically to ``run_dir/samples.pt`` every
    ``checkpoint_every`` steps and on Ctrl-C; ``resume=True`` continues exactly. A step that makes a chain
    non-finite stops the run with the step, the learning rate and the last good draw; so does a chain that strays from
    the others for :data:`STRAY_DRAWS` kept draws in a row (:func:`stray_chains`; the count restarts on resume).

    :param fit: the fit's :class:`~zoo.inference.base.FitContext`, read as follows. ``family``: the model family whose
        Pyro model is sampled; ``guide``: unused (the chains sample the family's own model); ``data``: the data set,
        its training rows on the device the chains run on; ``spec``: the run's ``inference`` section; ``seed``:
        seeds the chains' starts and noise (the minibatch order uses ``seed + 1``); ``run_dir``: where
        ``samples.pt`` is written; None writes nothing; ``resume``: continue from ``run_dir``'s ``samples.pt``;
        ``log``: the run's log (None: no messages); ``progress``: whether to show a progress bar; ``monitor``:
        scores the final posterior once, at the end (None: no scoring); ``start``: the posterior of the run
        ``inference.init`` names: chains start at its draws, and a family's point parameters are copied from it.
    :param climbs: the exploring burn-ins of the runs an lr choice made so far, by Adam step and prior scale factor
        (None: none kept). A fresh run whose climb is there starts where that climb ended, as its own would have (the
        climb does not depend on the sampler's lr); a run that climbs first puts its own there.
    :returns: the draws, their statistics (``potential`` and ``lr`` per draw), the wall time and the posterior.
    :raises ZooInputError: when burn-in and thinning leave no draw to keep, when ``resume`` finds no checkpoint, or
        when the family has point parameters and no ``start`` gives them.
    :raises TrainingDiverged: when a chain becomes non-finite or strays from the others.
    """
    spec = fit.spec
    refuse_batch_dependent(fit.family, spec.method.upper())
    widen_priors(fit.family, spec.prior_scale_factor)
    loop = TrainingLoop(fit.data.n_train, spec.batch_size, fit.seed + 1, fit.file(SAMPLES_FILE),
                        spec.checkpoint_every, spec.method.upper(), fit.progress, fit.log, fit.data.x_train.device,
                        stream=fit.data if fit.data.streamed else None)
    total = spec.epochs * loop.per_epoch
    keep = set(kept_steps(spec, total, loop.per_epoch))
    if not keep:
        if spec.burn_in_epochs is None:
            raise ZooInputError("inference.epochs", spec.epochs, f"{total} steps leave no draw to keep after burn-in "
                                "and thinning: run more epochs" + (", or lower inference.thin" if spec.thin else ""))
        raise ZooInputError("inference.burn_in_epochs", spec.burn_in_epochs, f"leaves no draw to keep in {spec.epochs} "
                            "epochs: lower it or the thinning, or run more epochs")
    chains = _Chains(fit, loop, total, keep, climbs)
    if fit.resume:
        saved = loop.resume(fit.run_dir)
        if saved.get("done"):
            fit.log("the run had finished; nothing to resume")
            return load_samples(fit.run_dir, fit.family, chains.device)
        chains.resume(saved)
    else:
        chains.start()
    chains.announce()
    loop.state = chains.state
    with pyro.validation_enabled(False):
        loop.run(total, chains.step)
    result = chains.result()
    if fit.monitor is not None:
        fit.monitor.final(result.posterior, fit.data)
    return result


class _Chains:
    """The C chains of one SG-MCMC run in lockstep: their state (what a checkpoint holds) and the phases of a step,
    each its own method: adapt the preconditioner, move (:func:`langevin_move`), check the move is finite, keep a
    draw."""

    z: torch.Tensor  # the chains' positions [C, D]
    velocity: torch.Tensor  # sghmc's momenta [C, D] (sgld: zeros)
    square: torch.Tensor  # the decaying average of squared per-row gradients that G is estimated from
    mass: torch.Tensor  # G, the diagonal inverse mass [C, D] (ones: no preconditioner)
    root: torch.Tensor  # G's square root, which scales the noise
    noisy: torch.Tensor  # scale_adapted: the average of squared per-row gradients over the sampling steps
    noisy_steps: int  # the sampling steps in ``noisy``
    draws: list[tuple[torch.Tensor, torch.Tensor, float]]  # (z, potential, lr) at each kept step so far
    strayed: list[int]  # per chain: kept draws in a row at which it was a stray (restarts on resume)

    def __init__(self, fit: FitContext, loop: TrainingLoop, total: int, keep: set[int],
                 climbs: dict[tuple[float, float], dict] | None = None) -> None:
        self.fit, self.spec, self.loop, self.total, self.keep = fit, fit.spec, loop, total, keep
        self.device = fit.data.x_train.device
        self.potential = MinibatchPotential(fit.family, fit.data, self.spec.temperature, compile=self.spec.compile)
        self.noise = torch.Generator(device=self.device).manual_seed(fit.seed)
        preconditioned = self.spec.preconditioner != "none"
        self.adapting = burn_in_steps(self.spec, loop.per_epoch) if preconditioned else 0  # G adapts over these
        self.readapt = self.spec.preconditioner == "scale_adapted"  # G also follows every exploration phase
        self.exploring = burn_in_steps(self.spec, loop.per_epoch) if self.spec.explore_burn_in else 0
        self.explore_lr = explore_step(self.spec)
        self.climbs = climbs if self.exploring else None  # the lr choice's climbs (run_sgmcmc)
        # a climb is the MAP's fit: it depends on its Adam step and the prior, not on the sampler's lr
        self.climb_key = (self.explore_lr, self.spec.prior_scale_factor or 1.0)

    # -- the state ---------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Seed the random streams and put the chains at their starts (fresh, or draws of ``fit.start``), or where an
        earlier run's climb at this Adam step ended (:meth:`branch`)."""
        fit = self.fit
        torch.manual_seed(fit.seed)
        pyro.set_rng_seed(fit.seed)
        z = initial_points(fit.family, self.potential.coords, self.spec.num_chains, fit.data, fit.log, fit.start,
                           self.spec.init)
        self._load(z, torch.zeros_like(z), [], torch.zeros_like(z), torch.ones_like(z), torch.zeros_like(z), 0)
        if self.climbs is not None and self.climb_key in self.climbs:
            self.branch(self.climbs[self.climb_key])

    def resume(self, saved: dict) -> None:
        """Continue from a checkpoint's state ``saved`` (one from before the preconditioner was stored has none)."""
        z = saved["z"]
        self._load(z, saved["velocity"], saved["draws"], saved.get("square", torch.zeros_like(z)),
                   saved.get("inverse_mass", torch.ones_like(z)), saved.get("noisy_square", torch.zeros_like(z)),
                   saved.get("noisy_steps", 0))
        self.noise.set_state(saved["noise_rng"].cpu())
        if self.fit.start is not None:
            copy_point_parameters(self.fit.family, self.fit.start, "inference.init")
        self.fit.log(f"resumed {self.spec.method} at step {self.loop.step}/{self.total}")

    def share_climb(self) -> None:
        """At the climb's last step: put where it ends in the lr choice's climbs (under its Adam step and prior scale
        factor), for its other runs to start from (:meth:`branch`). The loop stands at this step's minibatch order,
        which the next step starts from."""
        if self.climbs is not None and self.climb_key not in self.climbs:
            self.climbs[self.climb_key] = {
                "chains": {k: v.clone() if isinstance(v, torch.Tensor) else v
                           for k, v in self.state().items() if k != "draws"},
                "loop": self.loop.position() | {"step": self.loop.step + 1}}

    def branch(self, climbed: dict) -> None:
        """Start where another run's climb ended (:meth:`share_climb`): the same points, random streams and
        minibatch order its own climb would have reached, without the steps.

        :param climbed: the climb's end, as :meth:`share_climb` kept it.
        """
        saved = climbed["chains"]
        self._load(saved["z"].clone(), saved["velocity"].clone(), [], saved["square"].clone(),
                   saved["inverse_mass"].clone(), saved["noisy_square"].clone(), saved["noisy_steps"])
        self.noise.set_state(saved["noise_rng"])
        self.loop.move_to(climbed["loop"])
        self.fit.log(f"{self.spec.method}: starts where an earlier run's climb (Adam at {self.explore_lr:g}) ended, "
                     f"at step {self.loop.step}: the climb does not depend on the lr")

    def _load(self, z: torch.Tensor, velocity: torch.Tensor, draws: list, square: torch.Tensor, mass: torch.Tensor,
              noisy: torch.Tensor, noisy_steps: int) -> None:
        self.z, self.velocity, self.draws, self.square, self.mass = z, velocity, draws, square, mass
        self.noisy, self.noisy_steps = noisy, noisy_steps
        self.root = mass.sqrt()
        self.strayed = [0] * len(z)

    def state(self) -> dict:
        """The checkpoint's part of the chains (the loop adds its own)."""
        return {"z": self.z, "velocity": self.velocity, "draws": self.draws, "noise_rng": self.noise.get_state(),
                "method": self.spec.method, "square": self.square, "inverse_mass": self.mass,
                "noisy_square": self.noisy, "noisy_steps": self.noisy_steps}

    def announce(self) -> None:
        """Log what the run will do."""
        spec, loop = self.spec, self.loop
        self.fit.log(
            f"{spec.method}: {spec.num_chains} chains x {spec.epochs} epochs ({self.total:,} steps of {loop.batch} "
            f"rows, {spec.schedule} lr from {spec.lr:g}) over {self.potential.coords.dim:,} latent dimensions; "
            f"{len(self.keep)} draws per chain"
            + (f"; the {self.exploring:,} burn-in steps explore (Adam at {self.explore_lr:g}, no noise)"
               if self.exploring else "")
            + (f"; {spec.preconditioner} preconditioner estimated over the {self.adapting:,} burn-in steps"
               + (" and every exploration phase, frozen while draws are kept" if self.readapt else ", then frozen")
               if spec.preconditioner != "none" else ""))

    # -- one step ----------------------------------------------------------------------------------------------
    def step(self, rows: torch.Tensor | None) -> None:
        """One step of every chain on the minibatch ``rows`` (None: every row): the loop's update."""
        if self.loop.step < self.exploring:  # an exploring burn-in step: Adam, no noise, no draw
            energy, grad = self.potential.value_and_grad(self.z, rows)
            new_z, self.velocity, self.square = adam_move(self.z, grad, self.velocity, self.square, self.loop.step,
                                                          self.explore_lr)
            self.check_finite(new_z, energy, self.explore_lr)
            self.z = new_z
            if self.loop.step + 1 == self.exploring:  # sghmc's momenta start from rest, not from Adam's averages
                self.velocity, self.square = torch.zeros_like(self.z), torch.zeros_like(self.z)
                self.share_climb()
            return
        lr, sampling = step_size(self.spec, self.loop.step, self.total, self.exploring)
        eps = self.z.new_tensor(lr / self.loop.n, dtype=torch.float64)  # a tensor: one compiled graph for every lr
        noise = (_randn(self.z, self.noise),) if sampling else ()
        move = {"method": self.spec.method, "momentum": self.spec.momentum}
        if self.loop.step < self.adapting or self.readapt:  # the preconditioner follows this step's gradient first
            energy, grad = self.potential.value_and_grad(self.z, rows)
            self.adapt_preconditioner(grad, sampling)
            new_z, new_velocity = langevin_move(self.z, energy, grad, self.velocity, self.mass, self.root, eps, *noise,
                                                **move)
        else:  # G is fixed: gradient and move are one update
            energy, grad, new_z, new_velocity = self.potential.update(self.z, rows, langevin_move, self.velocity,
                                                                      self.mass, self.root, eps, *noise, **move)
        self.check_finite(new_z, energy, lr)
        self.z, self.velocity = new_z, new_velocity
        if self.loop.step in self.keep:
            self.keep_draw(energy, lr)

    def _averaged(self, average: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """``average`` decayed one step towards the squared per-row gradients ``grad / N``."""
        decay = self.spec.precondition_decay
        return decay * average + (1.0 - decay) * (grad / self.loop.n).square()

    def adapt_preconditioner(self, grad: torch.Tensor, sampling: bool) -> None:
        """Update G from ``grad`` while it adapts: in burn-in, and (scale_adapted) in every exploration phase, there
        no larger than the sampling steps' gradients allow; frozen while draws are kept."""
        step, decay, kind = self.loop.step, self.spec.precondition_decay, self.spec.preconditioner
        if self.readapt and sampling:  # the noisy steps' gradients: the posterior's scale, which bounds G
            self.noisy = self._averaged(self.noisy, grad)
            self.noisy_steps += 1
        if step < self.adapting:
            self.square = self._averaged(self.square, grad)
            self.mass = inverse_mass(self.square, step + 1, decay, kind)
            self.root = self.mass.sqrt()
            if step + 1 == self.adapting:
                after = " (re-estimated in every exploration phase)" if self.readapt else " (mean 1 per chain)"
                self.fit.log(f"{self.spec.method}: preconditioner frozen at step {self.adapting:,}: G from "
                             f"{float(self.mass.min()):.3g} to {float(self.mass.max()):.3g}{after}")
        elif self.readapt and not sampling:  # an exploration phase: G follows the potential
            self.square = self._averaged(self.square, grad)
            mass = inverse_mass(self.square, step + 1, decay, kind)
            if self.noisy_steps:
                mass = torch.minimum(mass, inverse_mass(self.noisy, self.noisy_steps, decay, kind))
            self.mass, self.root = mass, mass.sqrt()

    def check_finite(self, new_z: torch.Tensor, energy: torch.Tensor, lr: float) -> None:
        """Stop the run, saving the state this step started from, when the move left a chain non-finite."""
        if torch.isfinite(new_z).all() and torch.isfinite(energy).all():
            return
        spec, loop = self.spec, self.loop
        loop.save()  # the state this step started from, with every good draw so far
        last = max((t for t in self.keep if t < loop.step), default=None)
        where = f"the draw of step {last}" if last is not None else "no draw yet"
        raise TrainingDiverged(
            f"{spec.method} diverged at step {loop.step} (epoch {loop.step // loop.per_epoch}, lr {lr:.3g}): a "
            f"chain's weights or potential became non-finite; the last good draw is {where}"
            + (f", kept in {loop.path}" if loop.path is not None and last is not None else "")
            + f". Lower inference.lr (now {spec.lr:g})"
            + (" or use batch_size: null" if spec.batch_size is not None else "")
            + PRECONDITION_HINT.get(spec.preconditioner, ""))

    def keep_draw(self, energy: torch.Tensor, lr: float) -> None:
        """Keep the chains' state as a draw, unless a chain has strayed (:func:`stray_chains`) at
        :data:`STRAY_DRAWS` kept draws in a row: then save and stop the run."""
        spec, loop, n = self.spec, self.loop, self.loop.n
        now = set(stray_chains(energy.detach(), n, spec.temperature))
        self.strayed = [count + 1 if c in now else 0 for c, count in enumerate(self.strayed)]
        strays = [c for c, count in enumerate(self.strayed) if count >= STRAY_DRAWS]
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
        self.draws.append((self.z.detach().clone(), energy.detach().clone(), lr))

    # -- the end -----------------------------------------------------------------------------------------------
    def result(self) -> MCMCResult:
        """The kept draws as an MCMC result with its posterior, also saved as the finished ``samples.pt``."""
        spec, loop = self.spec, self.loop
        chain_z = torch.stack([d[0] for d in self.draws], dim=1)  # [C, S, D]
        stats = {"potential": torch.stack([d[1] for d in self.draws], dim=1),
                 "lr": torch.tensor([d[2] for d in self.draws], device=self.device).repeat(len(self.z), 1)}
        with torch.no_grad():
            values, _ = self.potential.coords.unpack(chain_z.flatten(0, 1))
        chains = {name: v.unflatten(0, chain_z.shape[:2]) for name, v in values.items()}
        settings = {"lr": spec.lr, "steps": self.total}  # the burn-in's climb too, which a choice may have set
        if self.exploring:
            settings |= {"explore_lr": self.explore_lr, "explore_steps": self.exploring}
        result = MCMCResult(chains, stats, loop.seconds, spec.method, settings)
        if loop.path is not None:
            save_checkpoint(loop.path, {"method": spec.method, "done": True, "draws": chains, "stats": stats,
                                        "seconds": loop.seconds, "settings": result.settings,
                                        "inverse_mass": self.mass, **hyperparameter_record(self.fit.family)})
        self.fit.log(f"{spec.method}: {chain_z.shape[1]} draws per chain in {loop.seconds:.1f} s")
        result.posterior = ChainPosterior(self.fit.family, chains, stats, result.settings)
        return result


def langevin_move(z: torch.Tensor, energy: torch.Tensor, grad: torch.Tensor, velocity: torch.Tensor,
                  mass: torch.Tensor, root: torch.Tensor, eps: torch.Tensor, *noise: torch.Tensor, method: str,
                  momentum: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The SGLD or SGHMC step of size ``eps`` on U from ``z``, with noise where ``noise`` is given (a sampling step):
    the new ``(z, velocity)``.

    :param z: the chains' points ``[C, D]``.
    :param energy: U at ``z`` (unused: the step reads the gradient only).
    :param grad: dU/dz ``[C, D]``.
    :param velocity: sghmc's momenta ``[C, D]`` (sgld: passed through).
    :param mass: G, the diagonal inverse mass ``[C, D]``.
    :param root: G's square root, which scales the noise.
    :param eps: the step size on U (lr / N), a 0-d float64 tensor (one compiled graph serves every step size).
    :param noise: a sampling step's standard normal draw ``[C, D]``; none in an exploration step.
    :param method: ``sgld`` or ``sghmc``.
    :param momentum: sghmc's 1 - friction.
    :returns: the new points and momenta.
    """
    if method == "sgld":
        new_z = z - eps / 2 * mass * grad
        if noise:
            new_z = new_z + eps.sqrt() * root * noise[0]
        return new_z, velocity
    new_velocity = momentum * velocity - eps * mass * grad
    if noise:
        new_velocity = new_velocity + (2 * (1.0 - momentum) * eps).sqrt() * root * noise[0]
    return z + new_velocity, new_velocity


ADAM_BETAS = (0.9, 0.999)


def adam_move(z: torch.Tensor, grad: torch.Tensor, first: torch.Tensor, second: torch.Tensor, step: int,
              lr: float = EXPLORE_LR) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One Adam step of every chain down U (an exploring burn-in's, SWAG's pretraining), at ``lr``: the new points and
    moment averages (bias-corrected at ``step``, from 0). Adam's per-coordinate scale keeps the step stable where a
    learned noise makes U stiff, which SGD with momentum at the sampler's lr is not.

    :param z: the chains' points ``[C, D]``.
    :param grad: dU/dz ``[C, D]``.
    :param first: the decaying average of the gradients (the chains' ``velocity`` slot during burn-in).
    :param second: the decaying average of the squared gradients (the ``square`` slot; no preconditioner adapts
        while the burn-in explores).
    :param step: the step, from 0.
    :param lr: Adam's step (an exploring burn-in's: :data:`EXPLORE_LR`).
    :returns: ``(z, first, second)`` after the step.
    """
    b1, b2 = ADAM_BETAS
    first = b1 * first + (1.0 - b1) * grad
    second = b2 * second + (1.0 - b2) * grad.square()
    scale = (second / (1.0 - b2 ** (step + 1))).sqrt() + 1e-8
    return z - lr * first / (1.0 - b1 ** (step + 1)) / scale, first, second


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

