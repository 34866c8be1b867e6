"""The typed, validated run spec: data, net, prior, model, guide, likelihood, inference, seed, device."""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from zoo.errors import ZooInputError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DataSpec(_Strict):
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
    target: str | None = Field(None, description="file: the target column")
    task: Literal["regression", "classification"] | None = Field(None, description="file: the task")
    split_column: str | None = Field(None, description="file: column marking test rows (test/1/true)")
    ood_classes: list[int] = Field(default_factory=list, description="classes held out of training as an OOD set")
    n_train: int | None = Field(None, gt=1, description="synthetic sets: number of training points")
    noise: float | None = Field(None, ge=0.0, description="synthetic sets: observation noise")
    rotation: float = Field(0.0, ge=-360.0, le=360.0, description="mnist5k: rotate the TEST images by this many "
                            "degrees (rotated MNIST, a distribution-shift benchmark)")


# ----------------------------------------------------------------------------------------------- net
class NetSpec(_Strict):
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
class NormalPrior(_Strict):
    """Normal(loc, scale) on every element of the site."""

    name: Literal["normal"] = "normal"
    loc: float = 0.0
    scale: PositiveFloat = 1.0


class LaplacePrior(_Strict):
    """Laplace(loc, scale): sparsity-promoting, analytic KL against a Normal guide."""

    name: Literal["laplace"]
    loc: float = 0.0
    scale: PositiveFloat = 1.0


class CauchyPrior(_Strict):
    """Cauchy(loc, scale): heavy tails; the KL falls back to Monte Carlo."""

    name: Literal["cauchy"]
    loc: float = 0.0
    scale: PositiveFloat = 1.0


class ScaleMixturePrior(_Strict):
    """Bayes-by-Backprop prior pi N(0, sigma1^2) + (1 - pi) N(0, sigma2^2); Monte Carlo KL."""

    name: Literal["scale_mixture"]
    pi: float = Field(0.5, gt=0.0, lt=1.0)
    sigma1: PositiveFloat = 1.0
    sigma2: PositiveFloat = 0.0024787521766663585  # e^-6, as in Blundell et al. 2015


class GaussianScaleMixturePrior(_Strict):
    """Hierarchical Gaussian scale mixture in non-centred form (rank-1 factors only): factor = loc + tau * z,
    z ~ N(0, 1) per member, one scale tau per neuron shared by the members, tau ~ half-Cauchy(scale) or
    LogNormal(log scale, log_scale_sd). On an ``.s`` site the hierarchy runs over the layer's input neurons, on
    an ``.r`` site over its output neurons, on both with a glob matching both."""

    name: Literal["gsm"]
    loc: float = 1.0
    scale_prior: Literal["half_cauchy", "log_normal"] = "half_cauchy"
    scale: PositiveFloat = 0.1
    log_scale_sd: PositiveFloat = 1.0


PriorConfig = Annotated[
    NormalPrior | LaplacePrior | CauchyPrior | ScaleMixturePrior | GaussianScaleMixturePrior,
    Field(discriminator="name"),
]


class PriorSpec(_Strict):
    """A default prior for every weight site plus overrides by site-name glob (first match wins).

    Written flat in YAML (``prior: {name: normal, scale: 1.0, sites: {"*.bias": {...}}}``).
    """

    default: PriorConfig = Field(default_factory=NormalPrior)
    sites: dict[str, PriorConfig] = Field(default_factory=dict)

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
class MeanFieldModelSpec(_Strict):
    """Every weight and bias a latent site (mean-field VI, MAP, HMC)."""

    family: Literal["mean_field"] = "mean_field"


class Rank1ModelSpec(_Strict):
    """Rank-1 BNN: shared point-estimated weights, rank-1 factors per ensemble member."""

    family: Literal["rank1"]
    members: PositiveInt = Field(4, description="ensemble members K")
    member_likelihood: Literal["mixture", "average"] = Field(
        "average", description="mean of the members' log-likelihoods (average), or log of their mean "
        "likelihood (mixture; lets members specialise on parts of the data)")
    weight_decay: PositiveFloat | None = Field(None, description="scale of a Normal prior on the shared W")


class DeepEnsembleModelSpec(_Strict):
    """Deep ensemble: K independently initialised copies of the net, each a MAP fit under the prior."""

    family: Literal["deep_ensemble"]
    members: PositiveInt = Field(5, description="ensemble members K (each a full copy of the net)")


class SubnetSelectionSpec(_Strict):
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


class SubnetworkModelSpec(_Strict):
    """Subnetwork inference: a selected subset of a MAP net's weights is random (one site), the rest fixed."""

    family: Literal["subnetwork"]
    selection: SubnetSelectionSpec = Field(default_factory=SubnetSelectionSpec)
    map: SVISpec = Field(default_factory=lambda: SVISpec(epochs=200, lr=1e-2),
                         description="how the MAP net (the linearisation point) is fitted: SVI with a Delta guide")
    map_from: str | None = Field(None, description="reuse a MAP fit instead: a run directory (family mean_field, "
                                 "guide delta, the same net and data) or its point_estimate.pt")


ModelSpec = Annotated[MeanFieldModelSpec | Rank1ModelSpec | DeepEnsembleModelSpec | SubnetworkModelSpec,
                      Field(discriminator="family")]


def _owners(field: str) -> list[str]:
    """The priors/families/methods that do have a setting called ``field`` (for 'not permitted here' messages)."""
    return sorted(tag for tag, cls in _UNION_MEMBERS.items() if field in cls.model_fields)


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


class GuideSpec(_Strict):
    """The variational family and its initialisation."""

    name: str = "mean_field"
    init_rho: float = Field(-5.0, description=f"initial rho of sigma = softplus(rho), in [{INIT_RHO_MIN:g}, "
                            f"{INIT_RHO_MAX:g}] (sigma {softplus(INIT_RHO_MIN):.1e} .. {softplus(INIT_RHO_MAX):.3g}):"
                            " below, sigma^2 leaves float32's normal range; above, the initial noise swamps the means")
    init_from: str | None = Field(None, description="run directory or checkpoint whose weights become the means")
    component: Literal["normal", "cauchy"] = Field("normal", description="mixture: family of each component")
    init_sign_prob: float = Field(0.5, ge=0.0, le=1.0, description="mixture/batch_ensemble: P(+1) of the factor "
                                  "means' random-sign initialisation (normal/cauchy/laplace factor priors; a gsm "
                                  "factor's standardised z starts at 0, i.e. every member at factor 1)")
    init_scale: PositiveFloat = Field(0.03, description="mixture: initial standard deviation of the factors")
    dropout_rate: float = Field(0.05, gt=0.0, lt=1.0, description="dropout: probability p of dropping an input "
                                "unit of every weight matrix but the first layer's (MC dropout)")

    @field_validator("init_rho")
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


class NoisePrior(_Strict):
    """LogNormal(loc, scale) prior on the noise sigma, in standardised target units."""

    loc: float = -1.0
    scale: PositiveFloat = 1.0


class LikelihoodSpec(_Strict):
    """Observation model: categorical for classes, Gaussian (fixed or learned noise) for regression."""

    name: Literal["auto", "categorical", "gaussian"] = "auto"
    noise: float | Literal["learned", "heteroscedastic"] = Field(
        "learned", description="fixed sigma in ORIGINAL target units, 'learned' (a latent under noise_prior), or "
        "'heteroscedastic' (the net outputs a mean and sigma(x) = softplus(raw) + min_noise for every input)"
    )
    noise_prior: NoisePrior = Field(default_factory=NoisePrior)
    min_noise: PositiveFloat = Field(1e-3, description="heteroscedastic: the floor of sigma(x), in standardised "
                                     "target units (keeps the density bounded)")

    @field_validator("noise")
    @classmethod
    def _positive_noise(cls, v: float | str) -> float | str:
        if not isinstance(v, str) and v <= 0:
            raise ValueError(f"a fixed noise must be > 0, got {v}")
        return v


# ------------------------------------------------------------------------------------------ inference
class _Tempered(_Strict):
    """What every inference method shares: the temperature of the posterior it targets."""

    temperature: PositiveFloat = Field(
        1.0, description="posterior tempering: the target is p(w | D)^(1/T), i.e. (p(y | x, w) p(w))^(1/T) "
        "(Wenzel et al. 2020); T < 1 is a cold posterior, 1 the Bayes posterior. SVI maximises "
        "E_q[log p(y, w)] / T + H[q], MCMC samples exp(-U / T), Laplace scales the covariance by T")


class SVISpec(_Tempered):
    """Stochastic variational inference: how the guide is fitted and how many draws represent it at test time."""

    method: Literal["svi"] = "svi"
    elbo: Literal["trace_mean_field", "trace"] = "trace_mean_field"
    epochs: PositiveInt | None = 100
    num_steps: PositiveInt | None = Field(None, description="overrides epochs when set")
    batch_size: PositiveInt | None = Field(128, description="minibatch size; null = full batch")
    optimizer: Literal["adam", "clipped_adam"] = "adam"
    lr: PositiveFloat = 1e-3
    clip_norm: PositiveFloat = 10.0
    lr_decay: float = Field(1.0, gt=0.0, le=1.0, description="clipped_adam: per-step lr decay factor")
    lr_decay_to: float | None = Field(
        None, gt=0.0, le=1.0, description="clipped_adam: the share of the lr left at the last step (the per-step "
        "decay follows from the run's length, so it holds when epochs or num_steps change; instead of lr_decay)")
    num_particles: PositiveInt = 1
    kl_annealing_steps: NonNegativeInt = Field(0, description="linear warm-up of the KL weight from 0 to 1")
    kl_annealing_fraction: float | None = Field(
        None, gt=0.0, le=1.0, description="warm the KL weight up over this share of the run's steps (instead of "
        "kl_annealing_steps)")
    local_reparam: bool = False
    augment: Literal["none", "crop_flip"] = Field(
        "none", description="training-time image augmentation of every minibatch: crop_flip = random crop after "
        "4-pixel zero padding and a random horizontal flip (the CIFAR standard); image nets only")
    compile: bool = Field(False, description="trace the ELBO step into one graph per minibatch size and compile it "
                          "(a one-off compile of a few seconds); removes Pyro's per-site cost from every step")
    checkpoint_every: PositiveInt = 1000
    predictive_samples: PositiveInt = 100

    @model_validator(mode="after")
    def _one_way_per_schedule(self) -> SVISpec:
        if self.lr_decay_to is not None and self.lr_decay != 1.0:
            raise ValueError("set lr_decay (per step) or lr_decay_to (by the last step), not both")
        if self.lr_decay_to is not None and self.optimizer != "clipped_adam":
            raise ValueError("lr_decay_to decays clipped_adam's lr: set optimizer: clipped_adam")
        if self.kl_annealing_fraction is not None and self.kl_annealing_steps:
            raise ValueError("set kl_annealing_steps or kl_annealing_fraction, not both")
        return self


class MCMCSpec(_Tempered):
    """Markov chain Monte Carlo on the family's own Pyro model (full batch): the gold-standard posterior.

    ``nuts`` is Pyro's NUTS kernel, one chain after another. ``hmc`` is the zoo's HMC that runs all chains as one
    tensor computation and tunes a shared, jittered trajectory length by the ChEES criterion, in function space by
    default (use many chains, e.g. 64-256). Both adapt the step size and a diagonal mass matrix during warm-up.
    """

    method: Literal["nuts", "hmc"]
    num_chains: PositiveInt = 4
    warmup_steps: PositiveInt = 500
    num_samples: PositiveInt = 500
    target_accept_prob: float = Field(0.8, gt=0.0, lt=1.0)
    step_size: PositiveFloat = Field(0.01, description="initial step size (adapted during warm-up)")
    max_tree_depth: PositiveInt = Field(10, le=15, description="nuts: at most 2^depth leapfrog steps per draw")
    trajectory_length: PositiveFloat = Field(1.0, description="hmc: integration time until the first mass-matrix "
                                             "update (then pi/2 sqrt(largest whitened variance), refined by ChEES)")
    adapt_trajectory_length: bool = Field(True, description="hmc: tune the trajectory length by ChEES in warm-up")
    trajectory_criterion: Literal["function", "weights"] = Field(
        "function", description="hmc: what ChEES measures the jumps of: the training rows' log-likelihoods (function "
        "space, what predictions depend on) or the whitened weights (the original ChEES criterion)")
    max_leapfrog_steps: PositiveInt = Field(1024, description="hmc: cap on leapfrog steps per draw")
    compile: bool = Field(False, description="trace the potential with its gradient into one graph and compile it "
                          "(a one-off compile of a few seconds per chain count); on CPU here ~3.6x faster gradients "
                          "for 64 lockstep HMC chains and ~2x faster NUTS iterations")
    adapt_mass_matrix: bool = True
    chain_chunk: PositiveInt | None = Field(
        None, description="hmc: evaluate the potential for at most this many chains per call (None: all at once); "
        "on nets whose activations for all chains outgrow the CPU caches, chunks are faster (benchmarks/"
        "hmc_chain_chunk.py)")
    init: str = Field("prior", description="'prior', or a run directory (MAP or VI fit of the same spec): "
                      "chains start at its draws")
    max_weights: PositiveInt = Field(20_000, description="refuse models with more latent dimensions than this")
    checkpoint_every: PositiveInt = Field(100, description="hmc: iterations between checkpoints")
    predictive_samples: PositiveInt = Field(400, description="draws (over all chains) used for test metrics")


class LaplaceSpec(_Tempered):
    """Linearised Laplace over the subnetwork family's random weights (Daxberger et al. 2021; Antorán et al. 2022).

    The posterior is N(MAP, (GGN + prior precision)^-1) with the generalised Gauss-Newton matrix of the subnet
    taken at the MAP. The prior precision (and a learned Gaussian noise) is tuned by maximising the linearised
    model's marginal likelihood, evaluated at the linearised model's own mode.
    """

    method: Literal["laplace"]
    prior_structure: Literal["scalar", "layer", "parameter"] = Field(
        "layer", description="one prior precision for all, one per layer (module), or one per parameter tensor "
        "(e.g. hidden0.weight and hidden0.bias apart)")
    tune: bool = Field(True, description="tune the prior precision (and a learned noise) by the evidence")
    tune_iterations: PositiveInt = Field(100, description="L-BFGS iterations of the evidence maximisation")
    evidence_at: Literal["linearised_mode", "map"] = Field(
        "linearised_mode", description="where the evidence is evaluated: the linearised model's own mode for each "
        "prior (Antorán et al. 2022), or the MAP of the net (MacKay; Immer et al. 2021)")
    predictive: Literal["glm", "nn"] = Field(
        "glm", description="glm: the linearised net (closed form for regression); nn: the net itself at draws")
    link: Literal["probit", "mc"] = Field("probit", description="classification glm: probit approximation or "
                                          "Monte Carlo over the linearised logits")
    chunk_size: PositiveInt = Field(256, description="rows per Jacobian batch (memory vs speed)")
    predictive_samples: PositiveInt = Field(200, description="draws used for test metrics")


InferenceSpec = Annotated[SVISpec | MCMCSpec | LaplaceSpec, Field(discriminator="method")]
_UNION_MEMBERS = {tag: cls
                  for union, key in ((PriorConfig, "name"), (ModelSpec, "family"), (InferenceSpec, "method"))
                  for cls in get_args(get_args(union)[0])
                  for tag in get_args(cls.model_fields[key].annotation)}
_UNION_TAGS = set(_UNION_MEMBERS)


class RunSpec(_Strict):
    """A whole run: any valid combination of parts is one spec away."""

    data: DataSpec
    net: NetSpec = Field(default_factory=NetSpec)
    prior: PriorSpec = Field(default_factory=PriorSpec)
    model: ModelSpec = Field(default_factory=MeanFieldModelSpec)
    guide: GuideSpec = Field(default_factory=GuideSpec)
    likelihood: LikelihoodSpec = Field(default_factory=LikelihoodSpec)
    inference: InferenceSpec = Field(default_factory=SVISpec)
    seed: NonNegativeInt = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["float32", "float64"] = "float32"

    @field_validator("model", mode="before")
    @classmethod
    def _default_family(cls, v: Any) -> Any:
        # a model section without a family is the mean-field one, like the section's own default
        return {"family": "mean_field", **v} if isinstance(v, dict) else v

    @field_validator("inference", mode="before")
    @classmethod
    def _default_method(cls, v: Any) -> Any:
        # an inference section without a method is SVI, like the section's own default
        return {"method": "svi", **v} if isinstance(v, dict) else v

    @model_validator(mode="before")
    @classmethod
    def _laplace_guide(cls, v: Any) -> Any:
        # inference: laplace builds its own guide (a Gaussian with the Laplace covariance): name it by default
        if isinstance(v, dict) and isinstance(v.get("inference"), dict) and v["inference"].get("method") == "laplace":
            guide = v.get("guide") or {}
            if isinstance(guide, dict) and "name" not in guide:
                v = {**v, "guide": {**guide, "name": "laplace"}}
        return v

    @model_validator(mode="after")
    def _known_names(self) -> RunSpec:
        from zoo import registry  # registry imports the modules that use this spec
        from zoo.data import check_data_spec  # already imported by registry; reads no file
        from zoo.nets import check_net_settings

        problems: list[ZooInputError] = []

        def check(fn: Any, *args: Any) -> bool:
            try:
                fn(*args)
            except ZooInputError as err:
                problems.append(err)
                return False
            return True

        check(check_data_spec, self.data)
        if check(registry.check_choice, "net.name", self.net.name, registry.NETS):
            check(check_net_settings, self.net)
        check(registry.check_choice, "net.activation", self.net.activation, registry.ACTIVATIONS)
        family = check(registry.check_choice, "model.family", self.model.family, registry.FAMILIES)
        guide = check(registry.check_choice, "guide.name", self.guide.name, registry.GUIDES)
        check(registry.check_choice, "inference.method", self.inference.method, registry.INFERENCE)
        if family and guide:
            check(registry.check_guide_fits, self.model.family, self.guide.name)
        def refuse(field: str, value: Any, allowed: str) -> None:
            problems.append(ZooInputError(field, value, allowed, message=f"{field}: {allowed}"))

        if (self.inference.method == "laplace") != (self.guide.name == "laplace"):
            refuse("guide.name", self.guide.name, "the laplace guide is what inference.method: laplace fits, and only "
                   "that: use both (leave guide.name out with laplace) or neither")
        if self.likelihood.noise == "heteroscedastic" and self.model.family == "subnetwork":
            refuse("likelihood.noise", self.likelihood.noise, "the subnetwork family's linearised Laplace takes a "
                   "Gaussian of one noise (fixed or learned); a heteroscedastic net has two outputs per input: use "
                   "likelihood.noise: learned or a number")
        if self.inference.method == "laplace" and self.model.family != "subnetwork":
            refuse("model.family", self.model.family, "inference.method: laplace linearises a MAP net around a "
                   "selected subnetwork: use model.family: subnetwork (selection size 1.0 gives the whole net)")
        if problems:
            raise _SpecProblems(problems)
        return self


class _SpecProblems(ValueError):
    """Every cross-field problem of a spec at once (pydantic reports one error per validator)."""

    def __init__(self, problems: list[ZooInputError]) -> None:
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


# --------------------------------------------------------------------------------------- load / dump
def _spec_problems(err: ValidationError) -> list[tuple[str, Any, str]]:
    """(dotted field, given value, message line) for every problem in ``err``, in pydantic's order."""
    out = []
    for e in err.errors():
        cause = (e.get("ctx") or {}).get("error")
        causes = cause.problems if isinstance(cause, _SpecProblems) else [cause]
        if all(isinstance(c, ZooInputError) for c in causes):
            for c in causes:  # our own checks name their field themselves
                text = str(c)
                out.append((c.field, c.value, text if c.field in text else f"{c.field}: {text}"))
            continue
        loc = ".".join(str(p) for p in e["loc"]
                       if not str(p).startswith(("function-", "tagged-union")) and p not in _UNION_TAGS)
        given = e.get("input")
        given_txt = "" if isinstance(given, dict) else f"got {given!r}; "
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            owners = _owners(str(e["loc"][-1]))
            msg = "unknown setting here" + (f"; it belongs to: {', '.join(owners)}" if owners else " (a typo?)")
        out.append((loc or "spec", given, f"{loc or 'spec'}: {given_txt}{msg}"))
    return out


def _format_pydantic_error(err: ValidationError) -> str:
    """One indented line per problem."""
    return "\n".join(f"  {line}" for _, _, line in _spec_problems(err))


def set_path(tree: dict, dotted: str, value: Any) -> None:
    """Set ``tree['a']['b'] = value`` for ``dotted='a.b'``, creating dicts on the way."""
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        if not isinstance(node.get(k, {}), dict):
            raise ZooInputError("--set", dotted, f"'{k}' is not a section, so it has no key '{keys[-1]}'")
        node = node.setdefault(k, {})
    node[keys[-1]] = value


def parse_overrides(pairs: list[str]) -> list[tuple[str, Any]]:
    """Parse ``key.path=value`` strings; values are read as YAML (numbers, lists, booleans, null)."""
    out = []
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise ZooInputError("--set", pair, "write overrides as key.path=value, e.g. --set data.split=3")
        out.append((key.strip(), yaml.safe_load(raw) if raw.strip() else None))
    return out


def _override_list(overrides: Any) -> list[str]:
    """``overrides`` as a list of ``key.path=value`` strings: None, one string, or a list/tuple of strings."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        return [overrides]
    if not isinstance(overrides, list | tuple):
        raise ZooInputError("overrides", overrides, "give one 'key.path=value' string or a list of them, "
                            "e.g. ['seed=3', 'net.hidden=[20, 20]']")
    for item in overrides:
        if not isinstance(item, str):
            raise ZooInputError("overrides", item, "every override is one 'key.path=value' string, e.g. 'seed=3'")
    return list(overrides)


def spec_tree(source: str | Path | dict | RunSpec, overrides: str | list[str] | None = None) -> dict:
    """The spec as written (a YAML file, a dict or a RunSpec's fields) with ``--set`` overrides applied, before
    validation: where further ``key.path=value`` settings go exactly as ``--set`` would put them."""
    overrides = _override_list(overrides)
    if isinstance(source, RunSpec):
        tree = source.model_dump(mode="json")
    elif isinstance(source, Mapping):
        tree = copy.deepcopy(dict(source))
    elif isinstance(source, str | os.PathLike):
        path = Path(source)
        if not path.is_file():
            raise ZooInputError("spec", str(path), "no such file; pass the path of a YAML spec (see configs/)")
        try:
            tree = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ZooInputError("spec", str(path), f"is not valid YAML: {exc}") from None
        if not isinstance(tree, dict):
            raise ZooInputError("spec", str(path), "the top level must be a mapping of sections (data, net, ...)")
    else:
        raise ZooInputError("spec", source, "pass the path of a YAML spec file (a str or pathlib.Path), a dict of "
                            "sections (data, net, ...) or a RunSpec")
    for key, value in parse_overrides(overrides):
        set_path(tree, key, value)
    return tree


def load_spec(source: str | Path | dict | RunSpec, overrides: str | list[str] | None = None) -> RunSpec:
    """Read a spec from a YAML file, a dict or a RunSpec, apply ``--set`` overrides (one ``key.path=value``
    string or a list of them), and validate it."""
    tree = spec_tree(source, overrides)
    try:
        return RunSpec.model_validate(tree)
    except ValidationError as exc:
        problems = _spec_problems(exc)
        text = "\n".join(f"  {line}" for _, _, line in problems)
        field, value, _ = problems[0]
        raise ZooInputError(field, value, text, message=f"invalid spec; fix these fields:\n{text}") from None


def spec_to_yaml(spec: RunSpec) -> str:
    """The fully resolved spec as YAML (what a run directory records)."""
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)
