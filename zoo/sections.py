"""The spec sections that no single part owns (the SVI settings several parts share), typed and validated.

Priors, guides, model families and inference methods hold their own sections (:mod:`zoo.parts`); :mod:`zoo.spec`
composes every section into a whole :class:`~zoo.spec.RunSpec`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from zoo.parts import Strict

__all__ = ["CUDA_READ_LOSS_EVERY", "DEFAULT_LR", "DEFAULT_LR_DECAY_TO", "DEFAULT_LR_HOLD", "LR_CANDIDATES",
           "MAX_EPOCHS", "MAX_STEPS", "PRIOR_SCALE_FACTORS", "ChoosesLR", "Epochs", "SVIFitting", "SVISpec",
           "ScalesPrior", "SetsNoise", "Steps", "Strict", "Tempered"]

# A run's budget has a ceiling: no fit of the zoo takes more (10^5 epochs of one step of 1 ms is a day), and a
# larger number is a slip (1e9 for 1e3, a row count for epochs) that would otherwise start a run that never ends
MAX_EPOCHS = 100_000
MAX_STEPS = 100_000_000


def _at_most(limit: int, unit: str):
    def check(value: int | None) -> int | None:
        if value is not None and value > limit:
            raise ValueError(f"{value:,} {unit} is more than any fit takes: give at most {limit:,}")
        return value
    return AfterValidator(check)


# Whole numbers of epochs (1 or more) and of steps (0 or more) up to the ceiling; a fraction or a negative is refused
Epochs = Annotated[int, Field(gt=0), _at_most(MAX_EPOCHS, "epochs")]
Steps = Annotated[int, Field(ge=0), _at_most(MAX_STEPS, "steps")]


# ------------------------------------------------------------------------------------------ inference
class Tempered(Strict):
    """What every inference method shares: the temperature of the posterior it targets."""

    temperature: PositiveFloat = Field(
        1.0, description="posterior tempering: the target is p(w | D)^(1/T), i.e. (p(y | x, w) p(w))^(1/T) "
        "(Wenzel et al. 2020); T < 1 is a cold posterior, 1 the Bayes posterior. SVI maximises "
        "E_q[log p(y, w)] / T + H[q], MCMC samples exp(-U / T), Laplace scales the covariance by T")


class ChoosesLR(Tempered):
    """The ``inference`` section of a method whose lr (``lr: null``) is its default or chosen on calibration rows
    (:mod:`zoo.inference.lr_choice`): SVI, SWAG, SG-MCMC."""

    lr_by: Literal["calibration", "fixed"] | None = Field(None, description=(
        "with lr: null, where the lr comes from. calibration: a whole fit at each of the method's candidate lrs (see "
        "lr), the one its calibration rows (fit(val=...) or data.calibration_fraction) score best kept (a fit per "
        "candidate); fixed: the default lr; null: calibration where lr is null and the fit has calibration rows, "
        "else fixed"))

    @model_validator(mode="after")
    def _one_source_of_lr(self) -> ChoosesLR:
        if self.lr_by == "calibration" and getattr(self, "lr", None) is not None:
            raise ValueError(f"lr_by: calibration chooses the lr, and lr is set ({self.lr:g}): drop one")
        return self


class SetsNoise(Strict):
    """The ``inference`` section of a method whose predictive's learned Gaussian noise may be set on calibration rows
    once the fit ends (:mod:`zoo.inference.noise_choice`): SVI, SWAG, SG-MCMC. (A Laplace fit sets its own, through
    its GLM predictive; MCMC's reference keeps the noise it sampled.)"""

    noise_by: Literal["calibration", "fit"] | None = Field(None, description=(
        "a learned Gaussian noise σ, for the predictive: calibration, the one σ under which the predictive (each "
        "draw's mean) is likeliest on the calibration rows (fit(val=...) or data.calibration_fraction), set once the "
        "fit ends; fit, each draw's own σ as the fit learned it; null: calibration where the fit has calibration rows "
        "and a learned noise, else fit. The draws of σ themselves (ArviZ, diagnostics) stay the fit's"),
        json_schema_extra={"task": "regression"})


DEFAULT_LR = 1e-2  # SVI's learning rate when none is set, decayed to DEFAULT_LR_DECAY_TO of itself by the last step
DEFAULT_LR_DECAY_TO = 0.1
DEFAULT_LR_HOLD = 0.75  # the default lr's share of the run held at DEFAULT_LR before its decay (benchmarks/defaults.py)
CUDA_READ_LOSS_EVERY = 50  # SVI steps a CUDA run takes between host reads of its loss (see SVISpec.read_loss_every)
# inference.lr_by: calibration runs the whole fit at each of these starting lrs (the plain net's grid in
# benchmarks/defaults.py) from the same start, and keeps the run its calibration rows score best
LR_CANDIDATES = (1e-3, 3e-3, 1e-2)
# a fit whose weights meet their prior as a weight decay, or whose Gaussian guide fits its spread against it
# (inference.prior_scale_factor: null, ScalesPrior), with calibration rows runs its whole fit again at each of these
# factors on its priors' scales (1: the spec's priors) and keeps the best run
PRIOR_SCALE_FACTORS = (1.0, 3.0, 10.0)


class ScalesPrior(Strict):
    """The ``inference`` section of a method whose fit may widen its weights' priors: where the prior is the
    weights' weight decay, which the plain-net recipe tunes on held-out rows (a point estimate's SVI fit, SWAG's SGD,
    SG-MCMC's chains), or where a Gaussian guide fits its spread against it (mean-field, the Gaussian autoguides).
    Its factor on every prior's scale is set, or chosen on the fit's calibration rows."""

    prior_scale_factor: PositiveFloat | None = Field(None, description=(
        "every prior's scale multiplied by this factor for the fit (a point estimate's weight decay divided by its "
        "square); null: 1, except where the fit's weights meet the prior as a weight decay (SVI whose guide's draws "
        "are point values: guide delta, the MAP, a deep ensemble, a Laplace member's MAP phase, guide dropout; SWAG "
        "and MultiSWAG; SGLD and SGHMC) or a Gaussian guide fits its spread against it (guide mean_field, Bayes by "
        "Backprop's; guide auto: normal, low_rank_mvn, mvn) on a family whose weights have priors (all_weights, "
        "deep_ensemble) and the fit has calibration rows: it runs its whole fit again at each of "
        f"{', '.join(f'{c:g}' for c in PRIOR_SCALE_FACTORS)} (at the lr and settings it chose) and keeps the run "
        "its calibration rows score best (NLL, or -test LL for regression; docs: the members page)"))


class SVIFitting(ChoosesLR, ScalesPrior):
    """How SVI fits a guide and how many draws represent it at test time: the ``inference`` section's settings but
    the predictive's noise, and all of a MAP phase's (``model.map``: a MAP net has no predictive of its own)."""

    method: Literal["svi"] = Field("svi", description="svi")
    elbo: Literal["trace_mean_field", "trace"] = Field("trace_mean_field", description=(
        "trace_mean_field (analytic KL where one exists, Pyro's TraceMeanField_ELBO) or trace (Monte Carlo "
        "KL, Trace_ELBO)"))
    epochs: Epochs | None = Field(100, description="passes over the training rows (num_steps overrides it)")
    num_steps: Steps | None = Field(None, description="overrides epochs when set (0: no step, the guide as "
                                             "it starts, e.g. MC dropout at a trained net's weights)")
    batch_size: PositiveInt | None = Field(128, description="minibatch size; null = full batch")
    optimizer: Literal["adam", "clipped_adam"] = Field("adam", description=(
        "adam, or clipped_adam (gradient clipping at clip_norm and a per-step lr decay)"))
    lr: PositiveFloat | None = Field(None, description=(
        f"the optimiser's learning rate, constant unless lr_decay or lr_decay_to is set; null (the default): "
        f"{DEFAULT_LR:g} for the first {DEFAULT_LR_HOLD:.0%} of the run, then decayed to {DEFAULT_LR_DECAY_TO:g} of "
        "it by the run's last step, its starting lr the best of "
        f"{', '.join(f'{c:g}' for c in LR_CANDIDATES)} (each a whole run from the same start) on the fit's "
        "calibration rows where it has them (lr_by; docs: the members page, measured by benchmarks/defaults.py)"))
    lr_by: Literal["calibration", "fixed"] | None = Field(
        None, description="with lr: null, where the default schedule's starting lr comes from. calibration: the "
        f"whole run at each of {', '.join(f'{c:g}' for c in LR_CANDIDATES)} from the same start (held and decayed "
        "as the default is), and the fit keeps the run its calibration rows score best (fit(val=...) or "
        f"data.calibration_fraction; NLL, or -test LL for regression): {len(LR_CANDIDATES)}x the steps "
        f"({2 * len(LR_CANDIDATES)}x where a learned noise's start is chosen too: each start at each lr); fixed: "
        f"{DEFAULT_LR:g}; null: calibration where lr is null and the fit has calibration rows, else fixed")
    clip_norm: PositiveFloat = Field(10.0, description="clipped_adam: the gradient norm clipped to")
    lr_decay: float = Field(1.0, gt=0.0, le=1.0, description="per-step lr decay factor")
    lr_decay_to: float | None = Field(
        None, gt=0.0, le=1.0, description="the share of the lr left at the last step (the per-step decay follows "
        "from the run's length, so it holds when epochs or num_steps change; instead of lr_decay)")
    lr_hold: float | None = Field(
        None, ge=0.0, lt=1.0, description="the share of the run's steps taken at the starting lr before lr_decay or "
        f"lr_decay_to starts to decay it; null: {DEFAULT_LR_HOLD:g} for the default lr (lr: null), else 0")
    num_particles: PositiveInt = Field(1, description="Monte Carlo draws of the ELBO per step")
    kl_annealing_steps: NonNegativeInt = Field(0, description="linear warm-up of the KL weight from 0 to 1")
    kl_annealing_fraction: float | None = Field(
        None, gt=0.0, le=1.0, description="warm the KL weight up over this share of the run's steps (instead of "
        "kl_annealing_steps)")
    local_reparam: bool = Field(False, description=(
        "sample the pre-activations instead of the weights (local reparameterisation, Kingma et al. 2015): "
        "lower-variance gradients for a mean-field guide"))
    augment: Literal["none", "crop_flip"] = Field(
        "none", description="training-time image augmentation of every minibatch: crop_flip = random crop after "
        "4-pixel zero padding and a random horizontal flip (the CIFAR standard); image nets only")
    compile: bool = Field(False, description="trace the ELBO step into one graph per minibatch size and compile it "
                          "(a one-off compile of a few seconds); removes Pyro's per-site cost from every step")
    autocast: Literal["none", "bf16"] = Field(
        "none", description="bf16: each training step under torch.autocast in bfloat16 (the net's matmuls and "
        "convolutions in bf16; parameters, gradients, the optimiser, the likelihood and every KL in float32); "
        "evaluation stays in the spec's dtype. Not with compile or dtype: float64")
    checkpoint_every: PositiveInt = Field(1000, description=(
        "steps between checkpoints (the run resumes from the last one)"))
    read_loss_every: PositiveInt | None = Field(
        None, description="steps between host reads of the loss: 1 checks every loss before its optimiser step (a "
        "non-finite one is never applied); N > 1 lets a GPU queue N steps without waiting for the host, and a "
        "non-finite loss stops the run when it is read (the last checkpoint stays good). Default: 1 on CPU, "
        f"{CUDA_READ_LOSS_EVERY} on CUDA")
    predictive_samples: PositiveInt = Field(100, description="posterior draws used for the test metrics")

    @model_validator(mode="after")
    def _one_way_per_schedule(self) -> SVIFitting:
        if self.lr_decay_to is not None and self.lr_decay != 1.0:
            raise ValueError("set lr_decay (per step) or lr_decay_to (by the last step), not both")
        if self.lr_hold and self.lr is not None and self.lr_decay_to is None and self.lr_decay == 1.0:
            raise ValueError(f"lr_hold: got {self.lr_hold:g}, but lr {self.lr:g} is constant, so there is no decay "
                             "to hold off: set lr_decay_to (or lr_decay), or drop lr_hold")
        if self.kl_annealing_fraction is not None and self.kl_annealing_steps:
            raise ValueError("set kl_annealing_steps or kl_annealing_fraction, not both")
        if self.autocast != "none" and self.compile:
            raise ValueError("autocast: bf16 is not supported with compile: true yet; drop one")
        return self


class SVISpec(SVIFitting, SetsNoise):
    """Stochastic variational inference: how the guide is fitted, how many draws represent it at test time, and
    where a learned Gaussian noise's predictive value comes from."""
