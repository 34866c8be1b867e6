"""SWAG and MultiSWAG: a Gaussian fitted to the SGD iterates around a mode (Maddox et al. 2019; Wilson & Izmailov
2020), in the unconstrained coordinates of the family's latent sites.

The run descends minibatch estimates of the per-row loss U/N (U as in :mod:`zoo.inference.sgmcmc`: the negative
log joint, minibatch likelihood weighted by N/B). First it pretrains for ``pretrain_epochs`` (skip it when ``init``
names a MAP run): by SGD with momentum and a cosine decay from ``pretrain_lr`` to ``lr`` as in Maddox et al., or by
Adam at ``pretrain_lr``, the zoo's MAP fit (``pretrain_by``; left null, chosen with the lr on the calibration rows).
Then SGD with momentum runs ``epochs`` at the constant ``lr``, collecting the iterate every ``collect_every`` steps
(once per epoch by default). From the collected iterates theta_i come the first and second moments and the last
``rank`` deviations D = [theta_i - mean_i]; a draw is

    theta = mean + sqrt(diag(sq_mean - mean^2) / 2) z1 + D z2 / sqrt(2 (rank - 1)),   z1, z2 ~ N(0, I).

``num_models`` K > 1 is MultiSWAG: K independent SWAG fits from K starting points, run as one batched computation,
and the posterior their equal-weight mixture.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import pyro
import pyro.distributions as dist
import torch
from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, field_validator

from zoo.errors import TrainingDiverged, ZooInputError
from zoo.inference.base import (
    FitContext,
    InferenceMethod,
    copy_point_parameters,
    hyperparameter_record,
    restore_hyperparameters,
    result_record,
    starting_run,
    widen_priors,
)
from zoo.inference.loop import TrainingLoop
from zoo.inference.lr_choice import JointSetting, fit_choosing_lr
from zoo.inference.potential import Coordinates, MinibatchPotential, initial_points, refuse_batch_dependent
from zoo.inference.sgmcmc import adam_move
from zoo.models.base import ModelFamily
from zoo.posterior import Posterior
from zoo.runs import load_checkpoint, save_checkpoint
from zoo.sections import MAX_EPOCHS, ChoosesLR, Epochs, ScalesPrior, SetsNoise

SWAG_FILE = "swag.pt"
DEFAULT_SWAG_LR = 0.01  # the collecting lr where none is set
SWAG_LR_CANDIDATES = (0.003, 0.01, 0.03)  # inference.lr_by: calibration's collecting lrs (docs/results/defaults.md)
DEFAULT_PRETRAIN_LR = 0.05  # SGD pretraining's starting lr where none is set, scaled with the chosen lr
ADAM_PRETRAIN_SHARE = 1 / 3  # Adam pretraining's step per unit of the collecting lr: the candidates 0.003, 0.01, 0.03
# pretrain at 0.001, 0.003, 0.01, the MAP fit's own candidate lrs (zoo.sections.LR_CANDIDATES)
PRETRAINING = JointSetting.over("pretrain_by", ("sgd", "adam"))  # chosen with the lr where pretrain_by is left null


class SWAGSpec(ChoosesLR, ScalesPrior, SetsNoise):
    """SWAG (num_models 1) or MultiSWAG (num_models > 1): a Gaussian from SGD iterates."""

    method: Literal["swag"] = Field(description="swag (num_models > 1: MultiSWAG)")
    num_models: PositiveInt = Field(1, description="independent SWAG fits; > 1 is MultiSWAG (their mixture)")
    epochs: Epochs = Field(50, description="SGD epochs at the constant lr that collect iterates")
    pretrain_epochs: Annotated[NonNegativeInt, Field(le=MAX_EPOCHS)] = Field(100, description=(
        "epochs of pretraining before collecting (0 when init is a MAP run), by pretrain_by; "
        "zoo.BNN.fit(epochs=E) without it pretrains for three quarters of E and collects for the rest"))
    batch_size: PositiveInt | None = Field(128, description="minibatch size; null = full batch")
    lr: PositiveFloat | None = Field(None, description=(
        f"the SWA learning rate of the per-row loss U/N while collecting; null: {DEFAULT_SWAG_LR:g}, or the best of "
        f"{', '.join(f'{c:g}' for c in SWAG_LR_CANDIDATES)} on the fit's calibration rows where it has them (lr_by), "
        "pretrain_lr scaled with it"))
    pretrain_lr: PositiveFloat | None = Field(None, description=(
        f"pretraining's learning rate: sgd's at its start, null: {DEFAULT_PRETRAIN_LR:g} times lr / "
        f"{DEFAULT_SWAG_LR:g}; adam's, null: lr / {1 / ADAM_PRETRAIN_SHARE:g}"))
    pretrain_by: Literal["adam", "sgd"] | None = Field(None, description=(
        "how pretraining climbs to a mode: sgd (SGD with momentum, pretrain_lr decayed to lr by a cosine, as in "
        "Maddox et al.) or adam (Adam at pretrain_lr, the zoo's MAP fit); null: chosen with the lr on the fit's "
        "calibration rows where the lr and pretrain_lr are (each candidate lr pretrained both ways: twice the runs), "
        "else sgd. Adam served the suite's classifiers but one; on a regression with a learned noise it reaches a "
        "mode sharper than SGD at lr can collect from (docs/results/defaults.md)"))
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="SGD momentum while pretraining and collecting")
    rank: PositiveInt = Field(20, ge=2, description="columns of the low-rank covariance (the last rank deviations)")
    collect_every: PositiveInt | None = Field(None, description="steps between collected iterates (default: one "
                                              "per epoch, or as often as reaches the rank when the collecting "
                                              "epochs are fewer than it)")
    init: str = Field("net", description="'net' (the net's own initialisation, redrawn per model), 'prior' "
                      "(prior draws), 'weights' (the net's own weights: SWAG post hoc on a trained net, net.weights), "
                      "or a run directory (e.g. a MAP run of the same spec): SGD starts at its draws")
    checkpoint_every: PositiveInt = Field(1000, description="steps between checkpoints")
    predictive_samples: PositiveInt = Field(100, description="draws used for test metrics")
    compile: bool = Field(False, description="trace each SGD update (gradient and momentum step) into one graph per "
                          "minibatch size and compile it (a one-off compile of seconds; on a GPU also a CUDA graph)")

    @field_validator("temperature")
    @classmethod
    def _untempered(cls, v: float) -> float:
        if v != 1.0:
            raise ValueError("SWAG's covariance comes from SGD iterates, not from a density it could temper: "
                             "leave temperature at 1")
        return v


class SWAGPosterior(Posterior):
    """The (Multi)SWAG Gaussian(s): ``mean``, ``sq_mean`` ``[K, D]`` and ``deviations`` ``[K, R, D]`` in the
    unconstrained coordinates of the family's latent sites; draw s comes from model s mod K.

    :param family: the model family whose latent sites the Gaussians are over.
    :param moments: ``{"mean": [K, D], "sq_mean": [K, D], "deviations": [K, R, D]}``, as :func:`fit_swag` collects
        them.
    """

    def __init__(self, family: ModelFamily, moments: dict[str, torch.Tensor]) -> None:
        super().__init__(family)
        self.coords = Coordinates(family)
        self.mean, self.sq_mean, self.deviations = moments["mean"], moments["sq_mean"], moments["deviations"]

    def sample(self, num_samples: int, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """``num_samples`` draws, the K models taking turns.

        :param num_samples: how many draws ``S`` to take.
        :param generator: the random stream of the draws (None: torch's global one).
        :returns: every latent site's draws ``{site: [S, *site_shape]}``.
        """
        models, rank, dim = self.deviations.shape
        which = torch.arange(num_samples, device=self.mean.device) % models
        variance = self.variance()
        z1 = torch.randn(num_samples, dim, generator=generator, device=self.mean.device, dtype=self.mean.dtype)
        z2 = torch.randn(num_samples, rank, generator=generator, device=self.mean.device, dtype=self.mean.dtype)
        low_rank = torch.einsum("sr,srd->sd", z2, self.deviations[which]) / math.sqrt(2 * (rank - 1))
        z = self.mean[which] + (variance[which] / 2).sqrt() * z1 + low_rank
        with torch.no_grad():
            return self.coords.unpack(z)[0]

    def variance(self, floor: float = 0.0, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Each model's diagonal variance ``sq_mean - mean^2`` ``[K, D]`` computed in ``dtype``, at least ``floor``
        (round-off makes it slightly negative where SGD barely moved).

        :param floor: the smallest variance returned.
        :param dtype: the floating-point type to compute in (None: that of the moments).
        :returns: the variances ``[K, D]``.
        """
        return (self.sq_mean.to(dtype) - self.mean.to(dtype) ** 2).clamp(min=floor)

    def density(self) -> SWAGPosterior:
        """Itself: the Gaussians score their own draws (:meth:`log_density`).

        :returns: this posterior.
        """
        return self

    @property
    def density_unavailable(self) -> str | None:
        """None: a mixture of Gaussians has a density everywhere."""
        return None

    def log_density(self, draws: dict[str, torch.Tensor]) -> torch.Tensor:
        """log q(w) at S draws ``{site: [S, ...]}``: the models' equal-weight mixture of Gaussians in the
        unconstrained coordinates, less each draw's log|det dw/dz| (for the PSIS Pareto k-hat of ``zoo diagnose``).

        :param draws: ``{site: [S, ...]}``.
        :returns: ``[S]``, in the draws' floating-point type (computed in float64).
        """
        with torch.no_grad():
            z = self.coords.pack(draws)
            _, log_det = self.coords.unpack(z)
            models, rank, _ = self.deviations.shape
            # in float64, each coordinate's variance floored at 1e-10 (a coordinate SGD never moved would make the
            # low-rank capacitance matrix singular)
            gaussians = dist.LowRankMultivariateNormal(
                self.mean.double(), self.deviations.double().transpose(-1, -2) / math.sqrt(2 * (rank - 1)),
                self.variance(1e-10, torch.float64) / 2)
            per_model = gaussians.log_prob(z.double().unsqueeze(-2))  # [S, K]
            return (per_model.logsumexp(-1) - math.log(models) - log_det.double()).to(z.dtype)


def pretraining(spec: SWAGSpec) -> tuple[str, float]:
    """How the run pretrains, its unset settings resolved: ``pretrain_by`` (null: sgd) and ``pretrain_lr`` (null:
    SGD's :data:`DEFAULT_PRETRAIN_LR`, or Adam's :data:`ADAM_PRETRAIN_SHARE`, scaled with the collecting lr).

    :param spec: the run's ``inference`` section.
    :returns: ``(way, lr)``: ``sgd`` and its starting lr, or ``adam`` and its step.
    """
    way = spec.pretrain_by or "sgd"
    if spec.pretrain_lr is not None:
        return way, spec.pretrain_lr
    lr = DEFAULT_SWAG_LR if spec.lr is None else spec.lr
    return way, lr * (DEFAULT_PRETRAIN_LR / DEFAULT_SWAG_LR if way == "sgd" else ADAM_PRETRAIN_SHARE)


def learning_rate(spec: SWAGSpec, step: int, pretrain_steps: int, start: float) -> float:
    """SGD's step: a cosine from ``start`` to ``lr`` over pretraining, then ``lr``.

    :param spec: the run's ``inference`` section.
    :param step: the step, from 0.
    :param pretrain_steps: the steps of pretraining.
    :param start: SGD pretraining's first lr (:func:`pretraining`'s, resolved once per run).
    :returns: the learning rate of the per-row loss at ``step``.
    """
    lr = DEFAULT_SWAG_LR if spec.lr is None else spec.lr
    if step >= pretrain_steps:
        return lr
    return lr + (start - lr) * (1 + math.cos(math.pi * step / pretrain_steps)) / 2


def with_lr(spec: SWAGSpec, lr: float) -> SWAGSpec:
    """``spec`` (its lr null) collecting at ``lr``, its pretraining resolved (:func:`pretraining`, an unset lr
    scaled with ``lr``).

    :param spec: an ``inference`` section whose ``lr`` is null.
    :param lr: the collecting lr.
    :returns: the section with ``lr``, ``pretrain_by`` and ``pretrain_lr`` written out (``lr_by: fixed``).
    """
    way, start = pretraining(spec.model_copy(update={"lr": lr}))
    return spec.model_copy(update={"lr": lr, "pretrain_by": way, "pretrain_lr": start, "lr_by": "fixed"})


def default_collect_every(collect_steps: int, per_epoch: int, rank: int) -> int:
    """Steps between collected iterates when none is set: one per epoch, as in SWAG, unless that collects fewer
    iterates than the rank; then as often as collects the rank (every step at most).

    :param collect_steps: the steps of the collecting phase.
    :param per_epoch: steps per epoch.
    :param rank: the covariance's rank.
    :returns: the steps between collections, at least 1.
    """
    if collect_steps // per_epoch >= rank:
        return per_epoch
    return max(1, min(per_epoch, collect_steps // rank))


def fit_swag(fit: FitContext) -> SWAGResult:
    """(Multi)SWAG at the spec's lr, at the default, or at the best of a whole run at each of
    :data:`SWAG_LR_CANDIDATES` on the calibration rows (``inference.lr_by``,
    :func:`~zoo.inference.lr_choice.fit_choosing_lr`), each pretrained both ways where ``pretrain_by`` and
    ``pretrain_lr`` are unset and there is pretraining (:data:`PRETRAINING`); each run is :func:`run_swag`.

    :param fit: the fit's :class:`~zoo.inference.base.FitContext` (as :func:`run_swag` reads it).
    :returns: the wall time and the (Multi)SWAG posterior.
    :raises ZooInputError: as :func:`run_swag`, and ``lr_by: calibration`` without calibration rows.
    :raises TrainingDiverged: when SGD makes the iterates non-finite (with the lr chosen: at every candidate).
    """
    spec = fit.spec
    open_pretraining = spec.pretrain_by is None and spec.pretrain_lr is None and spec.pretrain_epochs > 0
    return fit_choosing_lr(fit, run_swag, with_lr, DEFAULT_SWAG_LR, SWAG_LR_CANDIDATES, SWAG.files, "swag",
                           PRETRAINING if open_pretraining else None)


def run_swag(fit: FitContext) -> SWAGResult:
    """Run ``spec.num_models`` SGD trajectories side by side and fit (Multi)SWAG to their collected iterates.

    The state (iterates, momenta, moments, random streams) is saved atomically to ``run_dir/swag.pt`` every
    ``checkpoint_every`` steps and on Ctrl-C; ``resume=True`` continues exactly.

    :param fit: the fit's :class:`~zoo.inference.base.FitContext`, read as follows. ``family``: the model family whose
        Pyro model's latent sites SGD fits; ``guide``: unused (SWAG fits its own Gaussian); ``data``: the data set,
        its training rows on the device the fit runs on; ``spec``: the run's ``inference`` section; ``seed``: seeds
        the starting points (the minibatch order uses ``seed + 1``); ``run_dir``: where ``swag.pt`` is written; None
        writes nothing; ``resume``: continue from ``run_dir``'s ``swag.pt``; ``log``: the run's log (None: no
        messages); ``progress``: whether to show a progress bar; ``monitor``: scores the final posterior once, at
        the end (None: no scoring); ``start``: the posterior of the run ``inference.init`` names: SGD starts at its
        draws, and a family's point parameters are copied from it.
    :returns: the wall time and the (Multi)SWAG posterior.
    :raises ZooInputError: when fewer iterates than a ``rank`` that was set would be collected (a default rank is
        lowered to the iterates, at least 2), when ``resume`` finds no
        checkpoint, or when the family has point parameters and no ``start`` gives them.
    :raises TrainingDiverged: when an SGD step makes the iterates non-finite.
    """
    family, data, spec = fit.family, fit.data, fit.spec
    refuse_batch_dependent(family, "SWAG")
    widen_priors(family, spec.prior_scale_factor)
    path = fit.file(SWAG_FILE)
    loop = TrainingLoop(data.n_train, spec.batch_size, fit.seed + 1, path, spec.checkpoint_every, "SWAG", fit.progress,
                        fit.log, data.x_train.device, stream=data if data.streamed else None)
    pretrain = spec.pretrain_epochs * loop.per_epoch
    total = (spec.pretrain_epochs + spec.epochs) * loop.per_epoch
    every = spec.collect_every or default_collect_every(spec.epochs * loop.per_epoch, loop.per_epoch, spec.rank)
    collections = (total - pretrain) // every
    rank = spec.rank
    if collections < rank:
        enough = math.ceil(rank * every / loop.per_epoch)  # the fewest collecting epochs that reach the rank
        if "rank" in spec.model_fields_set or collections < 2:
            raise ZooInputError("inference.rank", rank, f"SWAG collects only {collections} iterates here "
                                f"({spec.epochs} collecting epochs x {loop.per_epoch} steps, one every {every} "
                                f"steps), fewer than its rank: collect for {enough} epochs or more (inference.epochs; "
                                f"fit(epochs=E) collects for the last quarter of E), or lower inference.rank to "
                                f"{max(collections, 2)} or less (or collect_every)")
        rank = collections  # the default rank, scaled to a short budget: every iterate is a column
        fit.log(f"SWAG's default rank {spec.rank} lowered to the {collections} iterates that {spec.epochs} "
                f"collecting epochs collect ({enough} collecting epochs or more keep it)")
    potential = MinibatchPotential(family, data, compile=spec.compile)
    coords = potential.coords
    if fit.resume:
        saved = loop.resume(fit.run_dir)
        if fit.start is not None:
            copy_point_parameters(family, fit.start, "inference.init")
        if saved.get("done"):
            fit.log("the run had finished; nothing to resume")
            restore_hyperparameters(family, saved)
            return SWAGResult(saved["seconds"], SWAGPosterior(family, saved["moments"]))
        z, velocity, moments, collected = saved["z"], saved["velocity"], saved["moments"], saved["collected"]
        square = saved.get("square", torch.zeros_like(z))  # written before Adam could pretrain: none needed
        fit.log(f"resumed SWAG at step {loop.step}/{total}")
    else:
        torch.manual_seed(fit.seed)
        pyro.set_rng_seed(fit.seed)
        # fresh, or draws of start
        z = initial_points(family, coords, spec.num_models, data, fit.log, fit.start, spec.init)
        velocity, square, collected = torch.zeros_like(z), torch.zeros_like(z), 0
        moments = {"mean": torch.zeros_like(z), "sq_mean": torch.zeros_like(z),
                   "deviations": z.new_zeros(spec.num_models, rank, coords.dim)}
    way, pretrain_lr = pretraining(spec)
    adam = way == "adam" and pretrain > 0
    fit.log(f"swag: {spec.num_models} model(s) x ({spec.pretrain_epochs} + {spec.epochs}) epochs "
            f"({total:,} steps of {loop.batch} rows; pretraining by "
            f"{'Adam at' if adam else 'SGD from'} {pretrain_lr:g}, collecting by SGD at {spec.lr:g}), {collections} "
            f"iterates collected, rank {rank}, over {coords.dim:,} latent dimensions")
    loop.state = lambda: {"z": z, "velocity": velocity, "square": square, "moments": moments,
                          "collected": collected}

    def update(rows: torch.Tensor | None) -> None:
        nonlocal z, velocity, square, collected
        if adam and loop.step < pretrain:  # Adam's moments sit in the velocity and square slots until collecting
            _, grad = potential.value_and_grad(z, rows)
            new_z, velocity, square = adam_move(z, grad, velocity, square, loop.step, pretrain_lr)
            if not torch.isfinite(new_z).all():
                raise TrainingDiverged(f"swag: Adam pretraining diverged at step {loop.step}; try "
                                       "inference.pretrain_by: sgd")
            z = new_z
            if loop.step + 1 == pretrain:
                velocity = torch.zeros_like(z)  # SGD's momentum starts from rest
            return
        lr = learning_rate(spec, loop.step, pretrain, pretrain_lr)
        _, _, new_z, new_velocity = potential.update(z, rows, sgd_move, velocity, z.new_tensor(lr, dtype=torch.float64),
                                                     momentum=spec.momentum, n_rows=loop.n)
        if not torch.isfinite(new_z).all():
            raise TrainingDiverged(f"swag: SGD diverged at step {loop.step} (lr {lr:.3g}); lower inference.lr or "
                                   "inference.pretrain_lr")
        z, velocity = new_z, new_velocity
        done = loop.step + 1  # steps taken once this one is
        if done > pretrain and (done - pretrain) % every == 0:
            _collect(moments, z, collected, rank)
            collected += 1

    with pyro.validation_enabled(False):
        loop.run(total, update)
    if path is not None:
        save_checkpoint(path, {"moments": moments, "seconds": loop.seconds, "collected": collected, "done": True,
                               **hyperparameter_record(family)})
    fit.log(f"swag: {collected} iterates per model in {loop.seconds:.1f} s")
    result = SWAGResult(loop.seconds, SWAGPosterior(family, moments))
    if fit.monitor is not None:
        fit.monitor.final(result.posterior, data)
    return result


def sgd_move(z: torch.Tensor, energy: torch.Tensor, grad: torch.Tensor, velocity: torch.Tensor, lr: torch.Tensor,
             momentum: float, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One SGD step with momentum on the per-row loss U/N (``n_rows`` = N) from ``z``: the new ``(z, velocity)``.

    :param z: the models' points ``[K, D]``.
    :param energy: U at ``z`` (unused: SGD reads the gradient only).
    :param grad: dU/dz ``[K, D]``.
    :param velocity: the momenta ``[K, D]``.
    :param lr: the step's learning rate, a 0-d float64 tensor (one compiled graph serves every learning rate).
    :param momentum: the SGD momentum.
    :param n_rows: N, the training rows U sums over.
    :returns: the new points and momenta.
    """
    new_velocity = momentum * velocity + grad / n_rows
    return z - lr * new_velocity, new_velocity


def _collect(moments: dict[str, torch.Tensor], z: torch.Tensor, collected: int, rank: int) -> None:
    """Add iterate ``z [K, D]`` to the running moments; its deviation from the new mean replaces the oldest column."""
    weight = 1.0 / (collected + 1)
    moments["mean"].mul_(1 - weight).add_(weight * z)
    moments["sq_mean"].mul_(1 - weight).add_(weight * z**2)
    moments["deviations"][:, collected % rank] = z - moments["mean"]


@dataclass
class SWAGResult:
    """What a SWAG fit leaves: its cost and its posterior.

    :param seconds: the fit's wall time.
    :param posterior: the fitted (Multi)SWAG posterior.
    :param chosen: what the fit chose on its calibration rows, by spec field (``inference.lr`` and
        ``inference.pretrain_by``; :func:`~zoo.inference.lr_choice.fit_choosing_lr`).
    """

    seconds: float
    posterior: SWAGPosterior
    chosen: dict[str, Any] = field(default_factory=dict)


class SWAG(InferenceMethod):
    """SWAG and MultiSWAG from SGD iterates (:func:`fit_swag`)."""

    streams_rows = True
    names = ("swag",)
    spec = SWAGSpec
    fitter = staticmethod(fit_swag)
    files = (SWAG_FILE,)
    summary = ("SWAG: a Gaussian (diagonal + low rank) from SGD iterates (Maddox et al. 2019); num_models > 1 is "
               "MultiSWAG (Wilson & Izmailov 2020)")
    fits_guide = False

    def describe(self, spec: SWAGSpec) -> str:
        return "multiswag" if spec.num_models > 1 else "swag"

    def spend_budget(self, budget: dict, section: dict) -> dict:
        """``fit(epochs=E)``: E epochs in all, the last quarter (at least two) collecting, unless the pretraining
        was set (then E collecting epochs follow it, as ``epochs`` reads in a spec).

        :param budget: the fit's budget, ``{"epochs": E}``.
        :param section: the inference section as set so far (no defaults).
        :returns: ``{"epochs": collecting, "pretrain_epochs": E - collecting}``, or the budget as it came.
        """
        total = budget.get("epochs")
        if not isinstance(total, int) or isinstance(total, bool) or total < 1 or "pretrain_epochs" in section:
            return budget  # a bad budget is refused by the spec, naming it
        collecting = min(total, max(2, total // 4))  # two at least: a covariance needs two iterates
        return {**budget, "epochs": collecting, "pretrain_epochs": total - collecting}

    def start_from(self, spec: SWAGSpec) -> Path | None:
        return starting_run(spec.init, ("net", "prior", "weights"))

    def fit_record(self, result: SWAGResult) -> dict:
        posterior = result.posterior
        return result_record(result) | {"moments": {"mean": posterior.mean, "sq_mean": posterior.sq_mean,
                                                    "deviations": posterior.deviations}}

    def load(self, family, guide, spec, run_dir, device, start=None) -> Posterior:
        if start is not None:
            copy_point_parameters(family, start, "inference.init")
        state = load_checkpoint(Path(run_dir) / SWAG_FILE, device)
        if not state.get("done"):
            raise ZooInputError("RUN_DIR", str(run_dir), f"holds an unfinished SWAG fit (step {state['step']}); "
                                "finish it with zoo train --resume")
        restore_hyperparameters(family, state)
        return SWAGPosterior(family, state["moments"])
