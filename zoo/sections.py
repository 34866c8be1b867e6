"""The sections of a run spec (data, net, prior, model, guide, likelihood, SVI), typed and validated.

The modules that build each part read their section from here; :mod:`zoo.spec` composes the sections into a
whole :class:`~zoo.spec.RunSpec` and checks the names in them against the registry.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)


class Strict(BaseModel):
    """A spec section: unknown keys are refused, and so is inf or NaN in any float field (no scale, rate,
    temperature or bound of the zoo means anything there)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class DataSpec(Strict):
    """Which data set, which split, and where its files live."""

    name: str = Field(description="toy_gap | two_moons | digits | mnist1d | mnist5k | mnist | fashion_mnist | "
                      "cifar10 | cifar100 | svhn | "
                      "uci:<folder> | file:<path.csv|.npz> (zoo list shows them)")
    split: int = Field(0, ge=0, description="UCI split index (0..n_splits-1)")
    dir: str | None = Field(None, description="data directory for UCI folders; falls back to $ZOO_DATA_DIR")
    test_fraction: float = Field(0.2, gt=0.0, lt=1.0, description="seeded test share where no split is given")
    validation_fraction: float = Field(
        0.0, ge=0.0, lt=1.0,
        description="tuning mode: > 0 carves this seeded share of the TRAINING rows out as the evaluation set "
        "(reported as 'test'); the real test split is never read and statistics come from the remaining rows",
    )
    calibration_fraction: float = Field(
        0.0, ge=0.0, lt=1.0,
        description="> 0 holds this seeded share of the training rows out of training as calibration rows, "
        "for post-hoc calibration (zoo eval --temperature-scale); the test split is unchanged")
    target: str | None = Field(None, description="file: the target column")
    task: Literal["regression", "classification"] | None = Field(None, description="file: the task")
    split_column: str | None = Field(None, description="file: column marking test rows (test/1/true)")
    ood_classes: list[int] = Field(default_factory=list, description="classes held out of training as an OOD set")
    n_train: int | None = Field(None, gt=1, description="synthetic sets: number of training points")
    noise: float | None = Field(None, ge=0.0, description="synthetic sets: observation noise")
    rotation: float = Field(0.0, ge=-360.0, le=360.0, description="mnist5k: rotate the TEST images by this many "
                            "degrees (rotated MNIST, a distribution-shift benchmark)")


# ----------------------------------------------------------------------------------------------- net
class NetSpec(Strict):
    """A deterministic architecture; input and output widths come from the data."""

    name: str = Field("mlp", description="mlp | cnn | lenet5 | resnet | wrn | torchvision (zoo list shows them)")
    hidden: list[int] = Field(default_factory=lambda: [50], description="hidden layer widths")
    activation: str = Field("relu", description="relu | tanh | gelu | elu | silu | sigmoid")
    channels: list[int] = Field(default_factory=lambda: [16, 32], description="cnn: channels of the conv layers")
    in_channels: PositiveInt = Field(1, description="image nets: channels of the input images; a row holds "
                                     "in_channels * side * side pixels, channel-major (C, H, W)")
    depth: PositiveInt | None = Field(None, description="resnet: 6n + 2 layers (default 20); wrn: 6n + 4 (default 28)")
    widen: PositiveInt = Field(1, description="resnet / wrn: channel multiplier k (WRN-28-10 is depth 28, widen 10)")
    arch: str | None = Field(None, description="torchvision: the torchvision.models constructor, e.g. resnet18")

    @field_validator("hidden", "channels")
    @classmethod
    def _positive_widths(cls, v: list[int]) -> list[int]:
        if any(w < 1 for w in v):
            raise ValueError(f"widths must be positive integers, got {v}")
        return v


# --------------------------------------------------------------------------------------------- priors
class NormalPrior(Strict):
    """Normal(loc, scale) on every element of the site."""

    name: Literal["normal"] = Field("normal", description="normal")
    loc: float = Field(0.0, description="mean")
    scale: PositiveFloat = Field(1.0, description="standard deviation")


class LaplacePrior(Strict):
    """Laplace(loc, scale): sparsity-promoting, analytic KL against a Normal guide."""

    name: Literal["laplace"] = Field(description="laplace")
    loc: float = Field(0.0, description="location (the median)")
    scale: PositiveFloat = Field(1.0, description="scale b (the variance is 2 b^2)")


class CauchyPrior(Strict):
    """Cauchy(loc, scale): heavy tails; the KL falls back to Monte Carlo."""

    name: Literal["cauchy"] = Field(description="cauchy")
    loc: float = Field(0.0, description="location (the median)")
    scale: PositiveFloat = Field(1.0, description="half width at half maximum")


class ScaleMixturePrior(Strict):
    """Bayes-by-Backprop prior pi N(0, sigma1^2) + (1 - pi) N(0, sigma2^2); Monte Carlo KL."""

    name: Literal["scale_mixture"] = Field(description="scale_mixture")
    pi: float = Field(0.5, gt=0.0, lt=1.0, description="weight of the wide component N(0, sigma1^2)")
    sigma1: PositiveFloat = Field(1.0, description="standard deviation of the wide component")
    sigma2: PositiveFloat = Field(0.0024787521766663585, description=(
        "standard deviation of the narrow component (e^-6, as in Blundell et al. 2015)"))


class GaussianScaleMixturePrior(Strict):
    """Hierarchical Gaussian scale mixture in non-centred form (rank-1 factors only): factor = loc + tau * z,
    z ~ N(0, 1) per member, one scale tau per neuron shared by the members, tau ~ half-Cauchy(scale) or
    LogNormal(log scale, log_scale_sd). On an ``.s`` site the hierarchy runs over the layer's input neurons, on
    an ``.r`` site over its output neurons, on both with a glob matching both."""

    name: Literal["gsm"] = Field(description="gsm")
    loc: float = Field(1.0, description="centre of the factors (1: a member starts at the shared weights)")
    scale_prior: Literal["half_cauchy", "log_normal"] = Field("half_cauchy", description=(
        "prior of the per-neuron scale tau: half_cauchy(scale) or log_normal(log scale, log_scale_sd)"))
    scale: PositiveFloat = Field(0.1, description="scale of the per-neuron tau's prior")
    log_scale_sd: PositiveFloat = Field(1.0, description="log_normal: standard deviation of log tau")


PriorConfig = Annotated[
    NormalPrior | LaplacePrior | CauchyPrior | ScaleMixturePrior | GaussianScaleMixturePrior,
    Field(discriminator="name"),
]


class PriorSpec(Strict):
    """A default prior for every weight site plus overrides by site-name glob (first match wins).

    Written flat in YAML (``prior: {name: normal, scale: 1.0, sites: {"*.bias": {...}}}``).
    """

    default: PriorConfig = Field(default_factory=NormalPrior, description=(
        "the prior of every weight site no glob of sites matches (written flat: prior: {name: normal, ...})"))
    sites: dict[str, PriorConfig] = Field(default_factory=dict, description=(
        "overrides by site-name glob, e.g. {'*.bias': {name: normal, scale: 10}}; the first match wins"))

    @model_validator(mode="before")
    @classmethod
    def _flat_form(cls, v: Any) -> Any:
        # Accept the flat YAML form; a prior written without a name is a Normal.
        if not isinstance(v, dict):
            return v
        v = dict(v)
        if "default" not in v:
            sites = v.pop("sites", {})
            v = {"default": v, "sites": sites}
        if isinstance(v["default"], dict):
            v["default"] = {"name": "normal", **v["default"]}
        if isinstance(v.get("sites"), dict):
            v["sites"] = {k: {"name": "normal", **c} if isinstance(c, dict) else c for k, c in v["sites"].items()}
        return v


# ---------------------------------------------------------------------------------------- model/guide
class MeanFieldModelSpec(Strict):
    """Every weight and bias a latent site (mean-field VI, MAP, HMC)."""

    family: Literal["mean_field"] = Field("mean_field", description="mean_field: every weight and bias a latent site")


class Rank1ModelSpec(Strict):
    """Rank-1 BNN: shared point-estimated weights, rank-1 factors per ensemble member."""

    family: Literal["rank1"] = Field(description="rank1: shared point-estimated W, rank-1 factors r, s per member")
    members: PositiveInt = Field(4, description="ensemble members K")
    member_likelihood: Literal["mixture", "average"] = Field(
        "average", description="mean of the members' log-likelihoods (average), or log of their mean "
        "likelihood (mixture; lets members specialise on parts of the data)")
    weight_decay: PositiveFloat | None = Field(None, description="scale of a Normal prior on the shared W")


class DeepEnsembleModelSpec(Strict):
    """Deep ensemble: K independently initialised copies of the net, each a MAP fit under the prior."""

    family: Literal["deep_ensemble"] = Field(description="deep_ensemble: K independent MAP nets")
    members: PositiveInt = Field(5, description="ensemble members K (each a full copy of the net)")


class SubnetSelectionSpec(Strict):
    """Which weights of the MAP net become the subnetwork (Daxberger et al. 2021); the rest stay at MAP."""

    strategy: Literal["largest_variance", "largest_magnitude", "random", "last_layer", "modules"] = Field(
        "largest_variance", description="largest_variance: largest marginal variance under a diagonal GGN Laplace "
        "(the paper's Wasserstein criterion); largest_magnitude: largest |w|; random; last_layer: every weight "
        "and bias of the output layer; modules: every weight and bias of the modules named in `modules`")
    size: int | float = Field(0.05, description="largest_variance/largest_magnitude/random: a count of weights "
                              "(a whole number, e.g. 100) or a fraction of all weights (a decimal in (0, 1], e.g. "
                              "0.05; 1.0 is the whole net)")
    modules: list[str] = Field(default_factory=list, description="modules strategy: module names, e.g. [out]")

    @field_validator("size")
    @classmethod
    def _count_or_fraction(cls, v: int | float) -> int | float:
        if isinstance(v, int) and v < 1:
            raise ValueError(f"a count of weights must be at least 1, got {v}")
        if isinstance(v, float) and not 0.0 < v <= 1.0:
            raise ValueError(f"a fraction of the weights must be in (0, 1], got {v}; give a count as a whole number")
        return v


class SubnetworkModelSpec(Strict):
    """Subnetwork inference: a selected subset of a MAP net's weights is random (one site), the rest fixed."""

    family: Literal["subnetwork"] = Field(description=(
        "subnetwork: a selected subset of a MAP net's weights gets a full-covariance posterior"))
    selection: SubnetSelectionSpec = Field(default_factory=SubnetSelectionSpec, description=(
        "which weights form the subnetwork (section model.selection)"))
    map: SVISpec = Field(default_factory=lambda: SVISpec(epochs=200, lr=1e-2),
                         description="how the MAP net (the linearisation point) is fitted: SVI with a Delta guide")
    map_from: str | None = Field(None, description="reuse a MAP fit instead: a run directory (family mean_field, "
                                 "guide delta, the same net and data) or its point_estimate.pt")


ModelSpec = Annotated[MeanFieldModelSpec | Rank1ModelSpec | DeepEnsembleModelSpec | SubnetworkModelSpec,
                      Field(discriminator="family")]


# guide.init_rho bounds. Low: the Normal's density and its KL against a Normal prior use sigma^2 (and
# (sigma / prior scale)^2), which must stay a normal float32 number (>= 1.2e-38, i.e. sigma >= 1.1e-19,
# rho >= -43.6): below it the KL's gradient is -inf (checked: rho -45), below rho -55 sigma^2 is 0 and the KL
# inf, below rho -104 sigma itself is 0 and Pyro refuses the scale. -30 (sigma 9.4e-14) keeps that
# true for prior scales up to ~1e5 and is already a point mass: use guide.name: delta for one. float64 could go
# lower, but gains nothing. High: weights live in standardised units under priors of scale ~1, so an initial
# sigma above ~5 prior scales drowns the means in noise: each layer's pre-activations grow ~sigma sqrt(fan_in),
# and rho 1e6 trained to an RMSE of 1e6. 5 gives sigma 5.007.
INIT_RHO_MIN, INIT_RHO_MAX = -30.0, 5.0


def softplus(rho: float) -> float:
    """log(1 + e^rho) without overflow (the guides' sigma for a given rho)."""
    return rho + math.log1p(math.exp(-rho)) if rho > 0 else math.log1p(math.exp(rho))


class GuideSpec(Strict):
    """The variational family and its initialisation."""

    name: str = Field("mean_field", description=(
        "the guide: mean_field, delta, mixture, batch_ensemble, full_rank, dropout, auto, or a method's own "
        "(laplace); zoo list guides names them all"))
    init_rho: float = Field(-5.0, allow_inf_nan=True, description=f"initial rho of sigma = softplus(rho), in "
                            f"[{INIT_RHO_MIN:g}, {INIT_RHO_MAX:g}] (sigma {softplus(INIT_RHO_MIN):.1e} .. "
                            f"{softplus(INIT_RHO_MAX):.3g}): below, sigma^2 leaves float32's normal range; above, the "
                            "initial noise swamps the means")
    init_from: str | None = Field(None, description="run directory or checkpoint whose weights become the means")
    component: Literal["normal", "cauchy"] = Field("normal", description="mixture: family of each component")
    init_sign_prob: float = Field(0.5, ge=0.0, le=1.0, description="mixture/batch_ensemble: P(+1) of the factor "
                                  "means' random-sign initialisation (normal/cauchy/laplace factor priors; a gsm "
                                  "factor's standardised z starts at 0, i.e. every member at factor 1)")
    init_scale: PositiveFloat = Field(0.03, description="mixture: initial standard deviation of the factors")
    dropout_rate: float = Field(0.05, gt=0.0, lt=1.0, description="dropout: probability p of dropping an input "
                                "unit of every weight matrix but the first layer's (the initial p for concrete)")
    dropout: Literal["bernoulli", "gaussian", "concrete"] = Field(
        "bernoulli", description="dropout: the mask, bernoulli (MC dropout), gaussian (1 + sqrt(p/(1-p)) N(0, 1)) "
        "or concrete (a rate learned per layer through a relaxed Bernoulli mask)")
    drop_inputs: bool = Field(False, description="dropout: also drop the first layer's input units (the data's "
                              "features), as Gal & Ghahramani's UCI networks did")
    auto: Literal["normal", "low_rank_mvn", "mvn", "iaf", "laplace_approximation"] = Field(
        "normal", description="auto: which of Pyro's autoguides (AutoNormal, AutoLowRankMultivariateNormal, "
        "AutoMultivariateNormal, AutoIAFNormal, AutoLaplaceApproximation: a MAP fit, then the inverse Hessian "
        "there as covariance) wraps the family's model")
    rank: PositiveInt = Field(10, description="auto (low_rank_mvn): the rank of the covariance's low-rank part")
    flows: PositiveInt = Field(2, description="auto (iaf): number of inverse autoregressive transforms")

    @field_validator("init_rho")  # inf/NaN reach it (allow_inf_nan above), to be refused with the range
    @classmethod
    def _sane_rho(cls, v: float) -> float:
        if INIT_RHO_MIN <= v <= INIT_RHO_MAX:
            return v
        if math.isnan(v):
            why = "rho must be a number"
        elif v < INIT_RHO_MIN:
            sigma = softplus(v)
            why = (f"sigma = softplus(rho) = {sigma:.3g}: " + (
                "its square is below float32's smallest normal number (1.2e-38), where the KL's gradient is already "
                "infinite" + (" and sigma itself rounds to 0, a scale Pyro refuses" if sigma < 1.4e-45 else "")
                if sigma < 1.1e-19
                else "so small that (sigma / prior scale)^2 nears float32's underflow; it is a point mass already "
                "(guide.name: delta is one)"))
        else:
            why = (f"sigma = softplus(rho) = {softplus(v):.3g}: an initial spread far wider than a prior of scale ~1 "
                   "on standardised weights, which swamps the means")
        raise ValueError(f"{why}; use a rho in [{INIT_RHO_MIN:g}, "
                         f"{INIT_RHO_MAX:g}] (sigma {softplus(INIT_RHO_MIN):.1e} .. {softplus(INIT_RHO_MAX):.3g}), "
                         f"typically -5 (the default, sigma {softplus(-5.0):.4f})")


class NoisePrior(Strict):
    """LogNormal(loc, scale) prior on the noise sigma, in standardised target units."""

    loc: float = Field(-1.0, description="mean of log sigma")
    scale: PositiveFloat = Field(1.0, description="standard deviation of log sigma")


class LikelihoodSpec(Strict):
    """Observation model: categorical for classes, Gaussian (fixed or learned noise) for regression."""

    name: Literal["auto", "categorical", "gaussian"] = Field("auto", description=(
        "auto picks the data's task: categorical for classes, gaussian for regression"))
    noise: float | Literal["learned", "heteroscedastic"] = Field(
        "learned", description="fixed sigma in ORIGINAL target units, 'learned' (a latent under noise_prior), or "
        "'heteroscedastic' (the net outputs a mean and sigma(x) = softplus(raw) + min_noise for every input)"
    )
    noise_prior: NoisePrior = Field(default_factory=NoisePrior, description=(
        "noise: learned: the LogNormal prior of sigma, in standardised target units"))
    min_noise: PositiveFloat = Field(1e-3, description="heteroscedastic: the floor of sigma(x), in standardised "
                                     "target units (keeps the density bounded)")

    @field_validator("noise")
    @classmethod
    def _positive_noise(cls, v: float | str) -> float | str:
        if not isinstance(v, str) and v <= 0:
            raise ValueError(f"a fixed noise must be > 0, got {v}")
        return v


# ------------------------------------------------------------------------------------------ inference
class Tempered(Strict):
    """What every inference method shares: the temperature of the posterior it targets."""

    temperature: PositiveFloat = Field(
        1.0, description="posterior tempering: the target is p(w | D)^(1/T), i.e. (p(y | x, w) p(w))^(1/T) "
        "(Wenzel et al. 2020); T < 1 is a cold posterior, 1 the Bayes posterior. SVI maximises "
        "E_q[log p(y, w)] / T + H[q], MCMC samples exp(-U / T), Laplace scales the covariance by T")


CUDA_READ_LOSS_EVERY = 50  # SVI steps a CUDA run takes between host reads of its loss (see SVISpec.read_loss_every)


class SVISpec(Tempered):
    """Stochastic variational inference: how the guide is fitted and how many draws represent it at test time."""

    method: Literal["svi"] = Field("svi", description="svi")
    elbo: Literal["trace_mean_field", "trace"] = Field("trace_mean_field", description=(
        "trace_mean_field (analytic KL where one exists, Pyro's TraceMeanField_ELBO) or trace (Monte Carlo "
        "KL, Trace_ELBO)"))
    epochs: PositiveInt | None = Field(100, description="passes over the training rows (num_steps overrides it)")
    num_steps: PositiveInt | None = Field(None, description="overrides epochs when set")
    batch_size: PositiveInt | None = Field(128, description="minibatch size; null = full batch")
    optimizer: Literal["adam", "clipped_adam"] = Field("adam", description=(
        "adam, or clipped_adam (gradient clipping at clip_norm and a per-step lr decay)"))
    lr: PositiveFloat = Field(1e-3, description="the optimiser's learning rate")
    clip_norm: PositiveFloat = Field(10.0, description="clipped_adam: the gradient norm clipped to")
    lr_decay: float = Field(1.0, gt=0.0, le=1.0, description="clipped_adam: per-step lr decay factor")
    lr_decay_to: float | None = Field(
        None, gt=0.0, le=1.0, description="clipped_adam: the share of the lr left at the last step (the per-step "
        "decay follows from the run's length, so it holds when epochs or num_steps change; instead of lr_decay)")
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
    def _one_way_per_schedule(self) -> SVISpec:
        if self.lr_decay_to is not None and self.lr_decay != 1.0:
            raise ValueError("set lr_decay (per step) or lr_decay_to (by the last step), not both")
        if self.lr_decay_to is not None and self.optimizer != "clipped_adam":
            raise ValueError("lr_decay_to decays clipped_adam's lr: set optimizer: clipped_adam")
        if self.kl_annealing_fraction is not None and self.kl_annealing_steps:
            raise ValueError("set kl_annealing_steps or kl_annealing_fraction, not both")
        if self.autocast != "none" and self.compile:
            raise ValueError("autocast: bf16 is not supported with compile: true yet; drop one")
        return self
