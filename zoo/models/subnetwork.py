"""Subnetwork inference (Daxberger et al. 2021): a selected subset of a MAP net's weights is random, the rest fixed.

The Pyro model has one latent site, ``subnet [D]``: the selected weights (flat indices into the net's
``parameters_to_vector`` order) under their Normal priors; every other weight stays at its MAP value. The Laplace
method fits a full-covariance Gaussian guide to it (``zoo/inference/laplace.py``), but the model is an ordinary
Pyro model: NUTS samples it (subnetwork HMC) and SVI fits it with a full-rank guide, selected in the spec.

Before any inference the family :meth:`~SubnetworkBNN.prepare`\\ s itself: it fits the MAP net (SVI on the
mean-field model with a Delta guide, the zoo's MAP member) or reuses one, then selects the subnetwork with one
of the small mask objects in :data:`SELECTIONS`. Both are stored in the run directory, so a resumed or reloaded
run reuses them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyro
import pyro.distributions as dist
import torch
from torch import nn
from torch.func import functional_call, vmap

from guides.delta import DeltaGuide
from zoo.curvature import LayerFactors, ParameterLayout, output_hessian_root
from zoo.data.base import Dataset
from zoo.errors import ZooInputError
from zoo.likelihoods import Likelihood, PredictiveDraws, draw_latents, observation, observe_rows
from zoo.models.base import restore_buffers
from zoo.models.mean_field import MeanFieldBNN
from zoo.nets import ParameterSwap
from zoo.runs import POINT_ESTIMATE_FILE, RunLog, load_point_values, load_torch, save_torch
from zoo.sections import NormalPrior, PriorConfig, SubnetSelectionSpec, SubnetworkModelSpec
from zoo.sites import LatentSite

SITE = "subnet"
SUBNET_FILE = "subnetwork.pt"
MAP_DIR = "map"
# How the pipeline fits the MAP net: fit_map(family, guide, data, svi_spec, seed, run_dir=, resume=, log=, progress=)
MapFitter = Callable[..., object]


# ------------------------------------------------------------------------------------------ selection
@dataclass
class SelectionContext:
    """What a subnetwork selection may look at: the MAP net, its layout, the training data and the curvature."""

    net: nn.Module
    layout: ParameterLayout
    data: Dataset
    task: str
    noise: torch.Tensor | float | None  # the Gaussian likelihood's noise sigma (standardised units)
    prior_precision: torch.Tensor  # [P], of every weight
    seed: int
    chunk_size: int = 256


def subnet_size(size: int | float, total: int) -> int:
    """A count (an int) or a fraction in (0, 1] (a float) of ``total`` weights, as a count; a subnet larger than
    the net is refused."""
    count = size if isinstance(size, int) else max(1, round(size * total))
    if count > total:
        raise ZooInputError("model.selection.size", size, f"the net has only {total:,} weights; give at most that "
                            "many, or a fraction up to 1.0")
    return count


class Selection(ABC):
    """A subnetwork mask: which flat weight indices are random."""

    @abstractmethod
    def select(self, context: SelectionContext) -> torch.Tensor:
        """Sorted flat indices of the selected weights."""


def _top(scores: torch.Tensor, count: int, selectable: torch.Tensor) -> torch.Tensor:
    """The ``count`` selectable weights of highest score, sorted."""
    return scores.masked_fill(~selectable, -torch.inf).topk(count).indices.sort().values


class LargestVariance(Selection):
    """The weights with the largest marginal posterior variance under a diagonal GGN Laplace at the MAP.

    For a factorised Gaussian posterior this minimises the Wasserstein distance to the full-covariance one
    (Daxberger et al. 2021); the variance of weight i is 1 / (diag GGN_i + prior precision_i).
    """

    def __init__(self, size: int | float) -> None:
        self.size = size

    def select(self, context: SelectionContext) -> torch.Tensor:
        layout, data = context.layout, context.data
        diag = torch.zeros(layout.size, dtype=data.x_train.dtype, device=data.x_train.device)
        for x in data.x_train.split(context.chunk_size):
            factors = LayerFactors(context.net, layout, x)
            diag += factors.diagonal_ggn(layout, output_hessian_root(context.task, factors.f, context.noise))
        selectable = layout.selectable(diag.device)
        return _top(1.0 / (diag + context.prior_precision), subnet_size(self.size, int(selectable.sum())), selectable)


class LargestMagnitude(Selection):
    """The weights largest in absolute value at the MAP."""

    def __init__(self, size: int | float) -> None:
        self.size = size

    def select(self, context: SelectionContext) -> torch.Tensor:
        flat = nn.utils.parameters_to_vector(context.net.parameters()).detach()
        selectable = context.layout.selectable(flat.device)
        return _top(flat.abs(), subnet_size(self.size, int(selectable.sum())), selectable)


class RandomSelection(Selection):
    """A seeded uniformly random subset of the weights."""

    def __init__(self, size: int | float) -> None:
        self.size = size

    def select(self, context: SelectionContext) -> torch.Tensor:
        candidates = context.layout.selectable().nonzero().squeeze(-1)
        chosen = random_subset(len(candidates), subnet_size(self.size, len(candidates)), context.seed)
        return candidates[chosen].to(context.data.x_train.device)


def random_subset(total: int, count: int, seed: int) -> torch.Tensor:
    """``count`` of ``range(total)``, uniformly at random from ``seed``'s own generator, sorted."""
    return torch.randperm(total, generator=torch.Generator().manual_seed(seed))[:count].sort().values


class ByModule(Selection):
    """Every weight and bias of the named modules (``last_layer``: the output layer)."""

    def __init__(self, modules: list[str] | None) -> None:
        self.modules = modules  # None: the last layer

    def select(self, context: SelectionContext) -> torch.Tensor:
        layout = context.layout
        wanted = self.modules if self.modules is not None else layout.module_names[-1:]
        unknown = sorted(set(wanted) - set(layout.module_names))
        if unknown or not wanted:
            raise ZooInputError("model.selection.modules", unknown or wanted,
                                f"name modules of this net: {', '.join(layout.module_names)}")
        ranges = [torch.arange(s.offset, s.offset + s.numel) for s in layout.slots if s.module_name in wanted]
        return torch.cat(ranges).to(context.data.x_train.device)


SIZED_SELECTIONS: dict[str, type[Selection]] = {
    "largest_variance": LargestVariance, "largest_magnitude": LargestMagnitude, "random": RandomSelection}
SELECTIONS = {**{name: cls.__doc__ for name, cls in SIZED_SELECTIONS.items()},
              "last_layer": "Every weight and bias of the output layer.", "modules": ByModule.__doc__}


def build_selection(spec: SubnetSelectionSpec) -> Selection:
    """The mask object the spec names."""
    if spec.strategy == "modules":
        return ByModule(spec.modules)
    if spec.modules:
        raise ZooInputError("model.selection.modules", spec.modules, "only the 'modules' strategy takes module names")
    if spec.strategy == "last_layer":
        return ByModule(None)
    return SIZED_SELECTIONS[spec.strategy](spec.size)


# ------------------------------------------------------------------------------------------ the family
class SubnetworkBNN:
    """Pyro model over a selected subset of a MAP net's weights (site ``subnet``); every other weight at its MAP."""

    def __init__(self, net: nn.Module, priors: dict[str, PriorConfig], likelihood: Likelihood,
                 spec: SubnetworkModelSpec) -> None:
        for name, prior in priors.items():
            if not isinstance(prior, NormalPrior) or prior.loc != 0.0:
                raise ZooInputError("prior", name, "the subnetwork family needs a zero-mean Normal prior on every "
                                    "weight (the Gaussian prior precision the Laplace posterior adds to); "
                                    "use prior: {name: normal, scale: ...}")
        self.net, self.likelihood, self.spec = net, likelihood, spec
        self.prior_configs = priors
        self.layout = ParameterLayout(net)
        self._swap = ParameterSwap(net)
        self._params = dict(net.named_parameters())  # the same Parameter objects across .to() and MAP copies
        self.indices: torch.Tensor | None = None
        self._parts: list = []  # layout.split(indices), kept with the indices: weights() runs every model call
        self.prior_precision: torch.Tensor | None = None
        self.map_values: dict[str, torch.Tensor] = {}

    @staticmethod
    def prior_sites(net: nn.Module) -> list[str]:
        """The spec's priors are assigned per parameter tensor; the subnet takes each weight's own."""
        return [name for name, _ in net.named_parameters()]

    @classmethod
    def from_spec(cls, net: nn.Module, priors: dict[str, PriorConfig], likelihood: Likelihood,
                  spec: SubnetworkModelSpec) -> SubnetworkBNN:
        """Build from the spec's model section (selection and MAP settings)."""
        return cls(net, priors, likelihood, spec)

    # -- preparation: the MAP net and the subnetwork -----------------------------------------------------
    def prepare(self, data: Dataset, run_dir: Path | None, seed: int, log: RunLog, progress: bool = True, *,
                fit_map: MapFitter) -> None:
        """Fit (or load) the MAP net and select the subnetwork; stored in ``run_dir`` for resumes and reloads.

        ``fit_map`` is the SVI fit the pipeline hands down (the family does not know inference methods).
        """
        path = Path(run_dir) / SUBNET_FILE if run_dir is not None else None
        flat_precision = self._flat_prior_precision(data.x_train)
        if path is not None and path.exists():
            state = load_torch(path, data.x_train.device)
            self._set_map(state["map"])
            restore_buffers(self, state.get("buffers"))
            self._set_indices(state["indices"])
            log(f"subnetwork: {len(self.indices):,} of {self.layout.size:,} weights, from {path}")
        else:
            self._set_map(self._map_values(data, run_dir, seed, log, progress, fit_map))  # the fit left its statistics
            selection = build_selection(self.spec.selection)
            context = SelectionContext(self.net, self.layout, data, self.likelihood.task, self.map_noise(),
                                       flat_precision, seed)
            self._set_indices(selection.select(context).to(data.x_train.device))
            if path is not None:
                save_torch(path, {"map": self.map_values, "indices": self.indices, "buffers": self.buffers()})
            log(f"subnetwork: {len(self.indices):,} of {self.layout.size:,} weights "
                f"({100 * len(self.indices) / self.layout.size:.2g}%), selected by {self.spec.selection.strategy}; "
                f"{self.count_by_parameter()}")
        self.prior_precision = flat_precision[self.indices]

    def _map_values(self, data: Dataset, run_dir: Path | None, seed: int, log: RunLog,
                    progress: bool, fit_map: MapFitter) -> dict[str, torch.Tensor]:
        if self.spec.map_from is not None:
            values = load_point_values(self.spec.map_from, "model.map_from")
            missing = [n for n, p in self.net.named_parameters()
                       if n not in values or values[n].shape != p.shape]
            if missing:
                raise ZooInputError("model.map_from", self.spec.map_from, f"holds no values for {missing[:3]} of "
                                    "this net's shape; give a MAP run of the same net and data")
            log(f"MAP net from {self.spec.map_from}")
            if self.buffers():
                restore_buffers(self, self._map_run_buffers(Path(self.spec.map_from), data.x_train.device))
            return {n: v.to(data.x_train) for n, v in values.items()}
        # the zoo's MAP member: SVI on the mean-field model with a Delta guide, checkpointed in run_dir/map
        mean_field = MeanFieldBNN(self.net, self.prior_configs, self.likelihood)
        guide = DeltaGuide(mean_field.latent_sites()).to(data.x_train)
        map_dir = Path(run_dir) / MAP_DIR if run_dir is not None else None
        resume = map_dir is not None and (map_dir / "checkpoint.pt").exists()
        log("fitting the MAP net (SVI with a Delta guide)" + (", resumed" if resume else ""))
        fit_map(mean_field, guide, data, self.spec.map, seed, run_dir=map_dir, resume=resume, log=log,
                progress=progress)
        values = guide.point_estimate()
        if map_dir is not None:  # a point estimate that guide.init_from / model.map_from of other runs can read
            save_torch(map_dir / POINT_ESTIMATE_FILE, values)
        return values

    def _map_run_buffers(self, source: Path, device: torch.device) -> list[torch.Tensor]:
        """A BatchNorm net's running statistics from the MAP run's checkpoint (a point-estimate file has none)."""
        checkpoint = source / "checkpoint.pt"
        if not checkpoint.exists():
            raise ZooInputError("model.map_from", str(source), "this net has BatchNorm, whose running statistics "
                                "the MAP run's checkpoint.pt holds: give the MAP run's directory")
        buffers = load_torch(checkpoint, device).get("buffers")
        if not buffers:
            raise ZooInputError("model.map_from", str(source), "its checkpoint.pt holds no BatchNorm statistics "
                                "(written before the zoo saved them); refit the MAP run")
        return buffers

    def _set_indices(self, indices: torch.Tensor) -> None:
        self.indices = indices
        self._parts = self.layout.split(indices)

    def _set_map(self, values: dict[str, torch.Tensor]) -> None:
        """Set the net to its MAP weights; from here on it runs in eval mode, so the subnet's posterior is over one
        fixed function of its weights (at the MAP's BatchNorm running statistics)."""
        with torch.no_grad():
            for name, param in self.net.named_parameters():
                param.copy_(values[name])
        self.net.eval()
        self.map_values = {n: v.detach().clone() for n, v in values.items()}

    def map_noise(self) -> torch.Tensor | float | None:
        """The Gaussian noise sigma at the MAP (fixed, or the MAP of a learned one); None for classification."""
        if self.likelihood.task != "regression":
            return None
        if self.likelihood.fixed_noise is not None:
            return self.likelihood.fixed_noise
        return self.map_values[self.likelihood.noise_site]

    def _flat_prior_precision(self, like: torch.Tensor) -> torch.Tensor:
        parts = [torch.full((s.numel,), 1.0 / self.prior_configs[s.name].scale ** 2) for s in self.layout.slots]
        return torch.cat(parts).to(like)

    def count_by_parameter(self) -> str:
        """How many selected weights each parameter tensor holds, e.g. ``hidden0.weight 12, out.bias 1``."""
        names = self.layout.names_of(self.indices)
        return ", ".join(f"{n} {names.count(n)}" for n in dict.fromkeys(names))

    def parameter_names(self) -> list[str]:
        """The parameter tensor (``hidden0.weight``, ...) of each subnet element, in site order."""
        return self.layout.names_of(self.indices)

    def _require_prepared(self) -> torch.Tensor:
        if self.indices is None:
            raise RuntimeError("the subnetwork family is not prepared: call family.prepare(data, ...) first")
        return self.indices

    # -- what the guides and inference methods see ------------------------------------------------------
    def latent_sites(self) -> dict[str, LatentSite]:
        """The subnet ``[D]`` (initialised at its MAP values) and the likelihood's latents (at their MAP)."""
        indices = self._require_prepared()
        flat = nn.utils.parameters_to_vector(self.net.parameters()).detach()
        sites = {SITE: LatentSite(torch.Size([len(indices)]), flat[indices].clone())}
        for name, site in self.likelihood.latent_sites().items():
            init = self.map_values.get(name, site.init)
            sites[name] = LatentSite(site.shape, init.detach().clone().to(site.init), site.support, site.plate)
        return sites

    def point_parameters(self) -> list[nn.Parameter]:
        """None: the weights outside the subnet are fixed at the MAP, not fitted further."""
        return []

    def buffers(self) -> list[torch.Tensor]:
        """The MAP net's BatchNorm running statistics (fixed after the MAP fit; kept in ``subnetwork.pt``)."""
        return list(self.net.buffers())

    def hyperparameters(self) -> dict[str, torch.Tensor]:
        """What inference may tune besides the guide (saved with the checkpoint): the subnet's prior precision."""
        return {"prior_precision": self.prior_precision}

    def set_hyperparameters(self, values: dict[str, torch.Tensor]) -> None:
        """Restore tuned hyperparameters (see :meth:`hyperparameters`)."""
        precision = values["prior_precision"]
        if precision.shape != (len(self._require_prepared()),) or not bool((precision > 0).all()):
            raise ValueError(f"prior precision must be positive and of shape [{len(self.indices)}]")
        self.prior_precision = precision.to(self.indices.device)

    def to(self, device: torch.device | str, dtype: torch.dtype = torch.float32) -> SubnetworkBNN:
        """Move the net, the indices and the prior precision to ``device``/``dtype``."""
        self.net.to(device=device, dtype=dtype)
        if self.indices is not None:
            self._set_indices(self.indices.to(device))
            self.prior_precision = self.prior_precision.to(device=device, dtype=dtype)
        self.map_values = {n: v.to(device=device, dtype=dtype) for n, v in self.map_values.items()}
        return self

    def prior(self) -> dist.TorchDistribution:
        """N(0, diag(1 / prior precision)) over the subnet."""
        return dist.Normal(torch.zeros_like(self.prior_precision), self.prior_precision.rsqrt()).to_event(1)

    # -- the Pyro model --------------------------------------------------------------------------------
    def model(self, x: torch.Tensor, y: torch.Tensor | None = None, batch: torch.Tensor | None = None) -> None:
        """Sample the subnet, then observe ``y`` on the rows ``batch`` (scaled up to all ``len(x)`` rows)."""
        self._require_prepared()
        subnet = pyro.sample(SITE, self.prior())
        observe_rows(self.likelihood, x, y, batch, lambda rows: self.forward(subnet, rows))

    def weights(self, subnet: torch.Tensor) -> dict[str, torch.Tensor]:
        """The parameters the subnet touches, MAP values with the subnet's entries replaced: ``{name: [S, ...]}``
        for subnet draws ``[S, D]``."""
        out = {}
        self._require_prepared()
        for slot, positions, local in self._parts:
            base = self._params[slot.name].detach().flatten().expand(subnet.shape[0], -1)
            out[slot.name] = base.index_copy(1, local, subnet[:, positions]).view(-1, *slot.shape)
        return out

    def forward(self, subnet: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The net's output with the subnet's weights set to ``subnet [D]``: ``[B, out]``."""
        return self._swap({n: w[0] for n, w in self.weights(subnet.unsqueeze(0)).items()}, x)

    def forward_draws(self, draws: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """Outputs under S subnet draws ``[S, D]`` at once: ``[S, B, out]``."""
        subnet = draws[SITE]
        if subnet.shape[0] == 1:
            return self.forward(subnet[0], x).unsqueeze(0)
        return vmap(lambda w: functional_call(self.net, w, (x,), strict=False))(self.weights(subnet))

    def predict(self, draws: dict[str, torch.Tensor], x: torch.Tensor) -> PredictiveDraws:
        """Per-draw predictive distributions at ``x`` under S joint draws (the net itself, not linearised)."""
        return self.likelihood.predictive(self.forward_draws(draws, x), draws)

    def log_likelihood(self, draws: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Pointwise log p(y_i | x_i, subnet_s) of the model's ``obs`` site under S draws: ``[S, B]``."""
        fn = observation(self.likelihood, self.forward_draws(draws, x), draw_latents(self.likelihood, draws, 1))
        return fn.log_prob(y)

    # -- linearisation (what the Laplace method needs) ---------------------------------------------------
    def linearise(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The MAP net's outputs ``f [B, O]`` and their Jacobian with respect to the subnet ``J [B, O, D]``."""
        factors = LayerFactors(self.net, self.layout, x)
        return factors.f, factors.jacobian(self.layout, self._require_prepared())
