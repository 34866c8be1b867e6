"""Subnetwork inference (Daxberger et al. 2021): a selected subset of a MAP net's weights is random, the rest fixed.

The Pyro model has one latent site, ``subnet [D]``: the selected weights (flat indices into the net's
``parameters_to_vector`` order) under their Normal priors; every other weight stays at its MAP value. The Laplace
method fits a full-covariance Gaussian guide to it (``zoo/inference/laplace.py``), but the model is an ordinary
Pyro model: NUTS samples it (subnetwork HMC) and SVI fits it with a full-rank guide, selected in the spec.

Before any inference the family fits its structure (:meth:`~SubnetworkBNN.fit_structure`): it fits the MAP net
(SVI on the all-weights model with a Delta guide, the zoo's MAP member) or reuses one, then selects the subnetwork
with one of the small mask objects in :data:`SELECTIONS`. Both are stored in the run directory, so a resumed or
reloaded run reuses them.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pyro
import pyro.distributions as dist
import torch
from pydantic import Field, field_validator
from torch import nn

from guides.delta import DeltaGuide
from zoo.curvature import (
    KroneckerBlock,
    LayerFactors,
    LowRankScale,
    OutputJacobian,
    ParameterLayout,
    ParameterSlot,
    factored,
)
from zoo.data.base import Dataset
from zoo.errors import ZooInputError
from zoo.likelihoods import Likelihood, PredictiveDraws, draw_latents, observation, observe_rows
from zoo.models.all_weights import AllWeightsBNN
from zoo.models.base import FamilySection, ModelFamily, ModuleChoice, StructureFit, restore_buffers
from zoo.nets import ParameterSwap, evaluation_mode, forward_stacked
from zoo.priors import PriorSection
from zoo.runs import (
    CHECKPOINT_FILE,
    MEMORY_SHARE,
    POINT_ESTIMATE_FILE,
    check_covariance_fits,
    load_point_values,
    load_torch,
    most_covariance_dim,
    save_checkpoint,
    save_torch,
)
from zoo.sections import Strict, SVIFitting, SVISpec
from zoo.sites import WEIGHT_VECTOR, LatentSite

SITE = "subnet"
SUBNET_FILE = "subnetwork.pt"
MAP_DIR = "map"


# ------------------------------------------------------------------------------------------ selection
@dataclass
class SelectionContext:
    """What a subnetwork selection may look at: the MAP net, its layout, the training data and the curvature."""

    net: nn.Module
    layout: ParameterLayout
    data: Dataset
    likelihood: Likelihood
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


def check_subnet_fits(count: int, size: int | float, element_size: int = 4, copies: int = 4) -> None:
    """Refuse a subnetwork whose k x k matrices (a full-covariance guide's: for the Laplace guide the GGN, its
    Cholesky factor, the covariance and the guide's scale_tril) would not fit in memory, naming the largest count
    that does.

    :param count: the subnet's weights k.
    :param size: ``model.selection.size`` as given.
    :param element_size: bytes an entry.
    :param copies: how many k x k matrices are kept at once.
    :raises ZooInputError: naming ``model.selection.size``.
    """
    check_covariance_fits("model.selection.size", size, count, element_size, copies,
                          lambda most: f"use model.selection.size: {max(1, most):,} or fewer weights (a count), "
                          "or a diagonal covariance (guide.covariance: diag with inference.method: laplace)")


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
        diag = torch.zeros(layout.size, dtype=data.dtype, device=data.device)
        for x, _ in data.train_chunks(context.chunk_size):  # streamed from a loader where the rows are
            factors = LayerFactors(context.net, layout, x)
            diag += factors.diagonal_ggn(layout, context.likelihood.output_hessian_root(factors.f, context.noise))
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
        return candidates[chosen].to(context.data.device)


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
        ranges = [torch.arange(s.offset, s.offset + s.numel) for s in layout.slots
                  if s.module_name in wanted and s.selectable]
        return torch.cat(ranges).to(context.data.device)


class EveryWeight(Selection):
    """Every weight and bias the subnetwork can take: the whole net but its normalisation layers, which stay at
    their MAP (laplace-torch's ``subset_of_weights='all'``)."""

    def select(self, context: SelectionContext) -> torch.Tensor:
        return context.layout.selectable(context.data.device).nonzero()[:, 0]


SIZED_SELECTIONS: dict[str, type[Selection]] = {
    "largest_variance": LargestVariance, "largest_magnitude": LargestMagnitude, "random": RandomSelection}
SELECTIONS = {**{name: cls.__doc__ for name, cls in SIZED_SELECTIONS.items()},
              "last_layer": "Every weight and bias of the output layer.", "modules": ByModule.__doc__,
              "all": EveryWeight.__doc__}


class SubnetSelectionSpec(Strict):
    """Which weights of the MAP net become the subnetwork (Daxberger et al. 2021); the rest stay at MAP."""

    strategy: Literal["largest_variance", "largest_magnitude", "random", "last_layer", "modules", "all"] = Field(
        "largest_variance", description="largest_variance: largest marginal variance under a diagonal GGN Laplace "
        "(the paper's Wasserstein criterion); largest_magnitude: largest |w|; random; last_layer: every weight "
        "and bias of the output layer; modules: every weight and bias of the modules named in `modules`; all: every "
        "weight but the normalisation layers' (with guide.covariance: diag for a large net)")
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


def build_selection(spec: SubnetSelectionSpec) -> Selection:
    """The mask object the spec names."""
    if spec.strategy == "modules":
        return ByModule(spec.modules)
    if spec.modules:
        raise ZooInputError("model.selection.modules", spec.modules, "only the 'modules' strategy takes module names")
    if spec.strategy == "last_layer":
        return ByModule(None)
    if spec.strategy == "all":
        return EveryWeight()
    return SIZED_SELECTIONS[spec.strategy](spec.size)


# ------------------------------------------------------------------------------------------ the family
class SubnetworkBNN(ModelFamily):
    """Pyro model over a selected subset of a MAP net's weights (site ``subnet``); every other weight at its MAP.

    :param net: the deterministic net (set to its MAP weights by :meth:`fit_structure`).
    :param priors: the zero-mean Normal prior of every parameter, by name.
    :param likelihood: the observation model.
    :param spec: the family's section (selection and MAP settings).
    """

    def __init__(self, net: nn.Module, priors: dict[str, PriorSection], likelihood: Likelihood,
                 spec: SubnetworkModelSpec) -> None:
        spec.check_priors(priors)
        self.net, self.likelihood, self.spec = net, likelihood, spec
        self.prior_configs = priors
        self.layout = ParameterLayout(net, spec.chosen)
        self._swap = ParameterSwap(net)
        self._params = dict(net.named_parameters())  # the same Parameter objects across .to() and MAP copies
        self.indices: torch.Tensor | None = None
        self._parts: list = []  # layout.split(indices), kept with the indices: weights() runs every model call
        self._whole: list[ParameterSlot] | None = None  # the tensors the subnet holds whole, when it holds only such
        self._modules: set[str] = set()  # the modules the subnet touches
        self.prior_precision: torch.Tensor | None = None
        self.map_values: dict[str, torch.Tensor] = {}
        self._map_fit: dict[str, object] | None = None  # the MAP net fitted without a run directory, kept in memory

    @staticmethod
    def prior_sites(net: nn.Module) -> list[str]:
        """The spec's priors are assigned per parameter tensor; the subnet takes each weight's own.

        :param net: the deterministic net.
        :returns: its parameter names.
        """
        return [name for name, _ in net.named_parameters()]

    # -- its structure: the MAP net and the subnetwork ---------------------------------------------------
    def fit_structure(self, data: Dataset, how: StructureFit) -> None:
        """Fit (or load) the MAP net and select the subnetwork; stored in ``how.run_dir`` for resumes and reloads
        (:data:`SUBNET_FILE`, and the MAP fit in :data:`MAP_DIR`), or kept in memory without one
        (:meth:`save_structure` writes them later).

        ``how.fit_map`` is the SVI fit the pipeline hands down (the family does not know inference methods).

        :param data: the training data.
        :param how: where to keep it and how to fit the MAP net.
        """
        run_dir, seed, log = how.run_dir, how.seed, how.log
        path = Path(run_dir) / SUBNET_FILE if run_dir is not None else None
        flat_precision = self._flat_prior_precision(torch.zeros((), device=data.device, dtype=data.dtype))
        if path is not None and path.exists():
            state = load_torch(path, data.x_train.device)
            self._set_map(state["map"])
            restore_buffers(self, state.get("buffers"))
            self._set_indices(state["indices"])
            self.structure_seconds = float(state.get("seconds", 0.0))
            self.structure_chosen = dict(state.get("chosen", {}))
            log(f"subnetwork: {len(self.indices):,} of {self.layout.size:,} weights, from {path}")
        else:
            started = time.perf_counter()
            element_size = data.x_train.element_size()
            selection_spec = self.spec.selection
            if selection_spec.strategy in SIZED_SELECTIONS:  # refused (or a fraction capped) before the MAP fit
                selection_spec = self._sized_to_fit(data, how, element_size, log)
            self._set_map(self._map_values(data, how))  # the fit left its statistics
            self._estimate_missing_noise(data, log)
            selection = build_selection(selection_spec)
            context = SelectionContext(self.net, self.layout, data, self.likelihood, self.map_noise(),
                                       flat_precision, seed)
            chosen = selection.select(context)
            if how.factored_layers_only and self.spec.selection.strategy == "all":
                chosen = self._factored_only(chosen, log)
            if how.dense_matrices and self.spec.selection.strategy not in SIZED_SELECTIONS:  # (sized: checked above)
                check_subnet_fits(len(chosen), self.spec.selection.strategy, element_size, how.dense_matrices)
            self._set_indices(chosen.to(data.x_train.device))
            self.structure_seconds = time.perf_counter() - started
            if path is not None:
                save_torch(path, self._structure_state())
            log(f"subnetwork: {len(self.indices):,} of {self.layout.size:,} weights "
                f"({_percent(len(self.indices), self.layout.size)}), selected by {self.spec.selection.strategy}; "
                f"{self.count_by_parameter()}")
        self.prior_precision = flat_precision[self.indices]

    def _sized_to_fit(self, data: Dataset, how: StructureFit, element_size: int, log) -> SubnetSelectionSpec:
        """The sized selection, checked before the MAP fit against what the run can hold: the guide's dense k x k
        matrices in memory, and the inference method's own bound (a classification Laplace's Jacobian of every
        row). A count it cannot hold is refused; a fraction asks for a share of the net, so it is capped at the most
        the run can hold, with a log line (a preset's 10 % of a large net is still a fit, not a refusal)."""
        size = self.spec.selection.size
        count = subnet_size(size, self.layout.size)
        bounds = []
        most_dense = most_covariance_dim(element_size, how.dense_matrices) if how.dense_matrices else None
        if most_dense is not None:
            bounds.append((most_dense, f"the guide's {how.dense_matrices} dense k x k matrices in {MEMORY_SHARE:.0%} "
                                       "of the memory available"))
        outputs = self.likelihood.net_outputs(data.out_dim)
        method_bound = how.most_weights(self.likelihood, data.n_train, outputs) if how.most_weights else None
        if method_bound is not None:
            bounds.append(method_bound)
        most, why = min(bounds, default=(count, ""))
        if count <= most:
            return self.spec.selection
        if isinstance(size, int) or most < 1:
            if how.dense_matrices:
                check_subnet_fits(count, size, element_size, how.dense_matrices)  # the memory's own refusal first
            raise ZooInputError("model.selection.size", size, f"{count:,} weights are more than this run can hold "
                                f"({why}): give model.selection.size: {max(most, 1):,} or fewer weights, or a "
                                "fraction (capped at what the run can hold)")
        log(f"subnetwork: model.selection.size {size} is {count:,} of {self.layout.size:,} weights, more than this "
            f"run can hold ({why}): capped at {most:,} ({_percent(most, self.layout.size)})")
        return self.spec.selection.model_copy(update={"size": most})

    def _map_values(self, data: Dataset, how: StructureFit) -> dict[str, torch.Tensor]:
        log = how.log
        if self.spec.map_from == "net":  # a trained net: post-hoc Laplace at its own weights and statistics
            log("MAP net: the net's own weights (model.map_from: net)")
            return {n: p.detach().clone() for n, p in self.net.named_parameters()}
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
            return {n: v.to(device=data.device, dtype=data.dtype) for n, v in values.items()}
        # the zoo's MAP member: SVI on the all-weights model with a Delta guide, checkpointed in run_dir/map (kept in
        # memory without a run directory); a frozen parameter (requires_grad=False) keeps its value, as it stays
        # out of the subnetwork
        trainable = [n for n, p in self.net.named_parameters() if p.requires_grad]
        all_weights = AllWeightsBNN(self.net, self.prior_configs, self.likelihood, trainable)
        guide = DeltaGuide(all_weights.latent_sites()).to(device=data.device, dtype=data.dtype)
        map_dir = Path(how.run_dir) / MAP_DIR if how.run_dir is not None else None
        resume = map_dir is not None and (map_dir / "checkpoint.pt").exists()
        log("fitting the MAP net (SVI with a Delta guide)" + (", resumed" if resume else ""))
        # its candidate runs (lr, noise start) scored as the MAP member's are where the rows set the predictive's σ
        spec = SVISpec.model_validate({**self.spec.map.model_dump(exclude_unset=True), "noise_by": how.map_noise_by})
        fitted = how.fit_map(all_weights, guide, data, spec, how.seed, run_dir=map_dir, resume=resume, log=log,
                             progress=how.progress)
        # its lr is the model's map section's; the settings it chose besides (a noise's start) are the run's own
        self.structure_chosen = {f"model.map.{key.removeprefix('inference.')}" if key.startswith("inference.")
                                 else key: value for key, value in fitted.chosen.items()}
        values = {**{n: p.detach().clone() for n, p in self.net.named_parameters() if not p.requires_grad},
                  **guide.point_estimate()}
        if map_dir is not None:  # a point estimate that guide.init_from / model.map_from of other runs can read
            save_torch(map_dir / POINT_ESTIMATE_FILE, values)
        else:  # what save_structure writes to run_dir/map
            self._map_fit = {"values": values, "guide": guide.state_dict(),
                             "seconds": float(getattr(fitted, "seconds", 0.0))}
        return values

    def save_structure(self, run_dir: Path) -> None:
        """Write the MAP net and the subnetwork fitted in memory: :data:`SUBNET_FILE` (what a reload reads) and,
        where this fit fitted the MAP net itself, :data:`MAP_DIR` with its ``point_estimate.pt`` (what
        ``guide.init_from`` and ``model.map_from`` of other runs read) and the final state of its fit
        (``checkpoint.pt``: the Delta guide and the BatchNorm statistics; no optimiser state, as it is finished).

        :param run_dir: the run directory, claimed by the caller.
        """
        if self.indices is None:
            return
        run = Path(run_dir)
        save_torch(run / SUBNET_FILE, self._structure_state())
        if self._map_fit is not None:
            save_torch(run / MAP_DIR / POINT_ESTIMATE_FILE, self._map_fit["values"])
            save_checkpoint(run / MAP_DIR / CHECKPOINT_FILE, {
                "guide": self._map_fit["guide"], "point_parameters": [], "buffers": self.buffers(),
                "seconds": self._map_fit["seconds"], "done": True})

    def _structure_state(self) -> dict:
        """What :data:`SUBNET_FILE` holds: the MAP values, the subnet's indices, the buffers, the fit's seconds and what
        it chose."""
        return {"map": self.map_values, "indices": self.indices, "buffers": self.buffers(),
                "seconds": self.structure_seconds, "chosen": dict(self.structure_chosen)}

    def _map_run_buffers(self, source: Path, device: torch.device) -> list[torch.Tensor]:
        """A BatchNorm net's running statistics from the MAP run's checkpoint (a point-estimate file has none)."""
        checkpoint = source / CHECKPOINT_FILE
        if not checkpoint.exists():
            raise ZooInputError("model.map_from", str(source), "this net has BatchNorm, whose running statistics "
                                "the MAP run's checkpoint.pt holds: give the MAP run's directory")
        buffers = load_torch(checkpoint, device).get("buffers")
        if not buffers:
            raise ZooInputError("model.map_from", str(source), "its checkpoint.pt holds no BatchNorm statistics "
                                "(written before the zoo saved them); refit the MAP run")
        return buffers

    def _factored_only(self, chosen: torch.Tensor, log) -> torch.Tensor:
        """Every weight under KFAC: the layers it cannot factor (an Embedding) stay at their MAP, as normalisation
        layers do, with a log line naming them."""
        unfactored = [s for s in self.layout.slots if s.selectable and not factored(s.module)]
        if not unfactored:
            return chosen
        kept = torch.ones(self.layout.size, dtype=torch.bool, device=chosen.device)
        for slot in unfactored:
            kept[slot.offset:slot.offset + slot.numel] = False
        names = ", ".join(sorted({f"{s.module_name} ({type(s.module).__name__})" for s in unfactored}))
        log(f"subnetwork: KFAC factors Linear and Conv2d layers; {names} stay at the MAP")
        return chosen[kept[chosen]]

    def _set_indices(self, indices: torch.Tensor) -> None:
        self.indices = indices
        self._parts = self.layout.split(indices)
        self._modules = {slot.module_name for slot, _, _ in self._parts}  # those whose layer factors are needed
        self._whole = _whole_tensors(self._parts)

    def _set_map(self, values: dict[str, torch.Tensor]) -> None:
        """Set the net to its MAP weights; from here on it runs in eval mode, so the subnet's posterior is over one
        fixed function of its weights (at the MAP's BatchNorm running statistics)."""
        with torch.no_grad():
            for name, param in self.net.named_parameters():
                param.copy_(values[name])
        self.net.eval()
        self.map_values = {n: v.detach().clone() for n, v in values.items()}

    def _estimate_missing_noise(self, data: Dataset, log) -> None:
        """A learned Gaussian noise that the MAP values do not hold (a trained net's own weights, ``map_from: net``,
        or a point estimate written without it) starts at its maximum-likelihood value at those weights, the root
        mean square of the training residuals; the Laplace fit then tunes it by the evidence."""
        site = getattr(self.likelihood, "noise_site", None)
        if site is None or getattr(self.likelihood, "fixed_noise", 0.0) is not None or site in self.map_values:
            return
        total, rows = 0.0, 0
        with torch.no_grad():
            for xc, yc in data.train_chunks(4096):
                total += float((self.net(xc)[:, 0] - yc).square().sum())
                rows += len(yc)
        sigma = max(math.sqrt(total / max(rows, 1)), 1e-6)
        self.map_values[site] = torch.tensor(sigma, device=data.device, dtype=data.dtype)
        log(f"noise: {sigma:.3g} (standardised), the residuals' root mean square at the MAP weights, which hold no "
            "learned noise")

    def map_noise(self) -> torch.Tensor | float | None:
        """The Gaussian noise sigma at the MAP (fixed, or the MAP of a learned one); None for classification."""
        return self.likelihood.noise(self.map_values)

    def _flat_prior_precision(self, like: torch.Tensor) -> torch.Tensor:
        parts = [torch.full((s.numel,), self.prior_configs[s.name].gaussian_precision()) for s in self.layout.slots]
        return torch.cat(parts).to(like)

    def count_by_parameter(self) -> str:
        """How many selected weights each parameter tensor holds, e.g. ``hidden0.weight 12, out.bias 1``."""
        names = self.layout.names_of(self.indices)
        return ", ".join(f"{n} {names.count(n)}" for n in dict.fromkeys(names))

    def parameter_names(self) -> list[str]:
        """The parameter tensor (``hidden0.weight``, ...) of each subnet element, in site order."""
        return self.layout.names_of(self.indices)

    def _require_structure(self) -> torch.Tensor:
        if self.indices is None:
            raise RuntimeError("the subnetwork family's structure is not fitted: call family.fit_structure(data, ...) "
                               "first")
        return self.indices

    # -- what the guides and inference methods see ------------------------------------------------------
    def latent_sites(self) -> dict[str, LatentSite]:
        """The subnet ``[D]`` (initialised at its MAP values) and the likelihood's latents (at their MAP)."""
        indices = self._require_structure()
        flat = nn.utils.parameters_to_vector(self.net.parameters()).detach()
        whole = self.whole_tensors()
        blocks = None if whole is None else tuple((s.shape[0], s.numel // s.shape[0]) for s in whole)
        sites = {SITE: LatentSite(torch.Size([len(indices)]), flat[indices].clone(), blocks=blocks)}
        for name, site in self.likelihood.latent_sites().items():
            init = self.map_values.get(name, site.init)
            sites[name] = LatentSite(site.shape, init.detach().clone().to(site.init), site.support, site.plate)
        return sites

    def whole_tensors(self) -> list[ParameterSlot] | None:
        """The parameter tensors the subnet holds, in site order, when it holds each one whole and in order (a
        selection of layers: ``all``, ``last_layer``, ``modules``); None when it holds parts of tensors."""
        return self._whole

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
        if precision.shape != (len(self._require_structure()),) or not bool((precision > 0).all()):
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
        self._require_structure()
        subnet = pyro.sample(SITE, self.prior())
        observe_rows(self.likelihood, x, y, batch, lambda rows: self.forward(subnet, rows))

    def weights(self, subnet: torch.Tensor, around_zero: bool = False) -> dict[str, torch.Tensor]:
        """The parameters the subnet touches, MAP values with the subnet's entries replaced: ``{name: [S, ...]}``
        for subnet draws ``[S, D]``; ``around_zero``: zeros instead of the MAP values (tangents of the subnet)."""
        out = {}
        self._require_structure()
        for slot, positions, local in self._parts:
            flat = self._params[slot.name].detach().flatten()
            base = (torch.zeros_like(flat) if around_zero else flat).expand(subnet.shape[0], -1)
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
        return forward_stacked(self.net, self.weights(subnet), x)

    def predict(self, draws: dict[str, torch.Tensor], x: torch.Tensor) -> PredictiveDraws:
        """Per-draw predictive distributions at ``x`` under S joint draws (the net itself, not linearised)."""
        return self.likelihood.predictive(self.forward_draws(draws, x), draws)

    def log_likelihood(self, draws: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Pointwise log p(y_i | x_i, subnet_s) of the model's ``obs`` site under S draws: ``[S, B]``."""
        fn = observation(self.likelihood, self.forward_draws(draws, x), draw_latents(self.likelihood, draws, 1))
        return fn.log_prob(y)

    # -- linearisation (what the Laplace method needs) ---------------------------------------------------
    def linearise(self, x: torch.Tensor) -> tuple[torch.Tensor, OutputJacobian]:
        """The MAP net's outputs ``f [B, O]`` and their Jacobian with respect to the subnet ``J [B, O, D]``, as a
        linear map: factored when the subnet is whole Linear layers (``last_layer``, ``modules``), else dense."""
        factors = LayerFactors(self.net, self.layout, x, self._modules)
        return factors.f, factors.output_jacobian(self.layout, self._require_structure(), self._whole)

    def diagonal_ggn(self, x: torch.Tensor, noise: torch.Tensor | float | None,
                     y: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The MAP net's outputs ``f [B, O]`` and the diagonal of the subnet's GGN over these rows ``[D]`` (with
        targets ``y``: the empirical Fisher's), from the layer factors (no Jacobian is formed: what a diagonal
        Laplace over every weight of a large net needs).

        :param x: inputs ``[B, ...]``.
        :param noise: a Gaussian likelihood's noise σ (None otherwise).
        :param y: the rows' targets, for the empirical Fisher (None: the GGN).
        :returns: ``f`` and the diagonal.
        """
        factors = LayerFactors(self.net, self.layout, x, self._modules)
        root = self._curvature_root(factors.f, noise, y)
        return factors.f, factors.diagonal_ggn(self.layout, root)[self._require_structure()]

    def kronecker_factors(self, x: torch.Tensor, noise: torch.Tensor | float | None, y: torch.Tensor | None = None
                          ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor, int]]]:
        """The MAP net's outputs ``f [B, O]`` and KFAC's sums over these rows for each parameter tensor of the subnet
        (:meth:`~zoo.curvature.LayerFactors.kronecker_factors`), of the GGN (with targets ``y``: of the empirical
        Fisher).

        :param x: inputs ``[B, ...]``.
        :param noise: a Gaussian likelihood's noise σ (None otherwise).
        :param y: the rows' targets, for the empirical Fisher (None: the GGN).
        :returns: ``f`` and, per tensor in site order, the sums G, Σ h hᵀ and their count.
        :raises ZooInputError: a layer KFAC does not factor (an Embedding), named with the fix.
        """
        factors = LayerFactors(self.net, self.layout, x, self._modules)
        root = self._curvature_root(factors.f, noise, y)
        return factors.f, factors.kronecker_factors(self._kronecker_slots(), root)

    def _curvature_root(self, f: torch.Tensor, noise: torch.Tensor | float | None,
                        y: torch.Tensor | None) -> torch.Tensor:
        """The output Hessians' roots (the GGN), or with targets the loss gradients' (the empirical Fisher)."""
        if y is None:
            return self.likelihood.output_hessian_root(f, noise)
        return self.likelihood.output_gradient_root(f, y, noise)

    def _kronecker_slots(self) -> list[ParameterSlot]:
        if self._whole is None:  # the spec and the Laplace guide refuse such a subnet for kron before any fit
            raise RuntimeError("Kronecker factors need a subnet of whole tensors (LatentSite.blocks)")
        return self._whole

    def linearised_covariance(self, x: torch.Tensor, covariance: torch.Tensor | list[KroneckerBlock] | LowRankScale
                              ) -> tuple[torch.Tensor, torch.Tensor]:
        """The MAP net's outputs ``f [B, O]`` and the covariance ``J Σ Jᵀ [B, O, O]`` of the linearised net's outputs,
        from the layer factors (no Jacobian is formed), for Σ diagonal (the variances ``[D]``), Kronecker-factored
        (one :class:`~zoo.curvature.KroneckerBlock` per parameter tensor of the subnet) or low-rank
        (:class:`~zoo.curvature.LowRankScale`: the diagonal part from the factors, the rank-k part by k forward-mode
        products).
        """
        if isinstance(covariance, LowRankScale):
            f, diagonal_part = self.linearised_covariance(x, covariance.prior_scale.square())
            directions = (covariance.prior_scale[:, None] * covariance.basis).T  # the columns of S - diag(scale)
            moved = self.linearised_outputs(x, directions.to(f.dtype)) - f  # J diag(scale) basis: [k, B, O]
            weights = covariance.covariance_weights().to(f.dtype)
            return f, diagonal_part + torch.einsum("kbo,k,kbp->bop", moved, weights, moved)
        factors = LayerFactors(self.net, self.layout, x, self._modules)
        if isinstance(covariance, list):
            return factors.f, factors.kronecker_output_covariance(self._kronecker_slots(), covariance)
        flat = covariance.new_zeros(self.layout.size).index_copy(0, self._require_structure(), covariance)
        return factors.f, factors.output_covariance(self.layout, flat)

    def curvature_times(self, x: torch.Tensor, vectors: torch.Tensor, noise: torch.Tensor | float | None,
                        y: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The MAP net's outputs ``f [B, O]`` and the subnet's GGN over these rows (with targets ``y``: the empirical
        Fisher) times S vectors, Σ_b J_bᵀ R_bᵀ R_b J_b v, by one forward-mode and one reverse-mode product per vector
        (no Jacobian is formed: what a low-rank Laplace over every weight of a large net needs).

        :param x: inputs ``[B, ...]``.
        :param vectors: ``[S, D]``.
        :param noise: a Gaussian likelihood's noise σ (None otherwise).
        :param y: the rows' targets, for the empirical Fisher (None: the GGN).
        :returns: ``f`` and the products ``[S, D]``.
        """
        indices = self._require_structure()
        centre = nn.utils.parameters_to_vector(self.net.parameters()).detach()[indices]
        moved_and_f = self.linearised_outputs(x, torch.cat([vectors, torch.zeros_like(vectors[:1])])).detach()
        f, moved = moved_and_f[-1], moved_and_f[:-1] - moved_and_f[-1]  # f, and J v per vector
        root = self._curvature_root(f, noise, y)  # [B, K, O]
        weighted = torch.einsum("bko,bkp,sbp->sbo", root, root, moved)

        def outputs(subnet: torch.Tensor) -> torch.Tensor:
            weights = {name: w[0] for name, w in self.weights(subnet[None]).items()}
            return torch.func.functional_call(self.net, weights, (x,))

        with evaluation_mode(self.net), torch.enable_grad():
            _, pullback = torch.func.vjp(outputs, centre)
            return f, torch.func.vmap(pullback)(weighted)[0].detach()

    def linearised_outputs(self, x: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
        """The linearised net f + J δ at S subnet shifts δ ``[S, D]`` from the MAP: ``[S, B, O]``, by forward-mode
        products (no Jacobian is formed)."""
        tangents = self.weights(shifts, around_zero=True)
        primals = {name: self._params[name].detach() for name in tangents}

        def outputs(weights: dict[str, torch.Tensor]) -> torch.Tensor:
            return torch.func.functional_call(self.net, weights, (x,))

        with evaluation_mode(self.net):  # f (the same at every shift) and J δ, per shift
            f, moved = torch.func.vmap(lambda t: torch.func.jvp(outputs, (primals,), (t,)))(tangents)
        return f + moved


class SubnetworkModelSpec(FamilySection, ModuleChoice):
    """Subnetwork inference: a selected subset of a MAP net's weights is random (one site), the rest fixed."""

    offers = frozenset({WEIGHT_VECTOR})
    linearisable = True
    needs_every_row = True  # the MAP's curvature and the selection are computed over every training row
    needs_global_noise = True  # its linearised Laplace takes a Gaussian of one noise (fixed or learned)
    files = {SUBNET_FILE: "its selected subnetwork", MAP_DIR: "its MAP net"}

    family: Literal["subnetwork"] = Field(description=(
        "subnetwork: a selected subset of a MAP net's weights gets a full-covariance posterior"))
    selection: SubnetSelectionSpec = Field(default_factory=SubnetSelectionSpec, description=(
        "which weights form the subnetwork (section model.selection)"))
    map: SVIFitting = Field(default_factory=lambda: SVIFitting(epochs=200, lr=1e-2),
                         description="how the MAP net (the linearisation point) is fitted: SVI with a Delta guide")
    map_from: str | None = Field(None, description="reuse a MAP fit instead: 'net' (the net's own weights, e.g. "
                                 "trained ones: net.weights; post-hoc Laplace), a run directory (family all_weights, "
                                 "guide delta, the same net and data) or its point_estimate.pt")

    def prior_sites(self, net: nn.Module) -> list[str]:
        self.check_modules(net)
        return SubnetworkBNN.prior_sites(net)

    def refusals(self, priors: list[PriorSection]) -> list[tuple[str, Any, str]]:
        """Every weight needs a zero-mean Normal prior: the Gaussian prior precision the Laplace posterior adds."""
        return [("prior.name", p.name, "the subnetwork family needs a zero-mean Normal prior on every weight (the "
                 "Gaussian prior precision the Laplace posterior adds to); use prior: {name: normal, scale: ...}")
                for p in priors if p.gaussian_precision() is None]

    def build(self, net: nn.Module, priors: dict[str, PriorSection], likelihood: Likelihood) -> SubnetworkBNN:
        return SubnetworkBNN(net, priors, likelihood, self)


def _whole_tensors(parts: list[tuple[ParameterSlot, torch.Tensor, torch.Tensor]]) -> list[ParameterSlot] | None:
    """The tensors of ``layout.split(indices)`` when the indices cover each one whole, in order, one after another;
    else None."""
    start = 0
    for slot, positions, local in parts:
        in_order = bool((local.diff() == 1).all() and (positions.diff() == 1).all())
        if len(local) != slot.numel or int(positions[0]) != start or not in_order:
            return None
        start += slot.numel
    return [slot for slot, _, _ in parts] or None


def _percent(part: int, whole: int) -> str:
    """``part`` of ``whole`` as a percentage to two significant figures (``11%``, ``0.55%``, ``100%``)."""
    share = 100 * part / whole
    return f"{share:.0f}%" if share >= 10 else f"{share:.2g}%"
