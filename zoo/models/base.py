"""What every model family is: the :class:`ModelFamily` interface guides, inference methods and the Posterior call,
and the :class:`FamilySection` of the spec that names a family and declares what its latent structure offers.

A family is one module holding its class and its section, registered once in :data:`zoo.models.FAMILIES`. The
combination rules (which guides fit, which methods apply, what can be compiled or streamed) read the section's
declarations, never the family's name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

import pyro
import torch
from pydantic import Field
from torch import nn

from zoo.errors import ZooInputError
from zoo.nets import NORM_LAYERS, check_patterns, module_matches, parametric_modules
from zoo.parts import Strict
from zoo.sites import LatentSite

if TYPE_CHECKING:
    from zoo.curvature import OutputJacobian
    from zoo.data.base import Dataset
    from zoo.likelihoods import Likelihood, PredictiveDraws
    from zoo.priors import PriorSection
    from zoo.runs import RunLog

T = TypeVar("T")


def per_device(cache: dict, ref: torch.Tensor, build: Callable[[torch.device, torch.dtype], T]) -> T:
    """``build(device, dtype)`` once per device and dtype of ``ref`` (e.g. a family's priors); then reused.

    Built without argument validation: a cached distribution is evaluated at every step, its parameters come
    from the validated spec, and a validating instance would re-check every sample against its support (a
    data-dependent branch that also keeps the SVI step from being traced and compiled).

    :param cache: the family's cache, keyed by (device, dtype).
    :param ref: a tensor on the device and dtype wanted.
    :param build: makes the value for a device and dtype.
    :returns: the cached value.
    """
    key = (ref.device, ref.dtype)
    if key not in cache:
        with pyro.validation_enabled(False):
            cache[key] = build(*key)
    return cache[key]


@dataclass
class StructureFit:
    """What a family whose structure is fitted to the data (:meth:`ModelFamily.fit_structure`) is handed.

    :param run_dir: where to keep what it fits, for resumes and reloads (None: nowhere).
    :param seed: the run's seed.
    :param log: the run's log.
    :param progress: whether to show progress bars.
    :param fit_map: the SVI fit, for a family that needs a MAP net (families do not import inference methods).
    :param dense_matrices: how many D x D matrices over its weight vector the run's guide keeps (the guide
        section's ``dense_matrices``), for a family that refuses a size whose covariance would not fit.
    :param factored_layers_only: whether the guide covers only layers KFAC factors (the guide section's
        ``factored_layers_only``): a selection of every weight then keeps the others at their MAP.
    :param map_noise_by: how a MAP phase that chooses its lr or its noise's start on calibration rows scores each
        candidate run of a learned Gaussian noise: ``calibration``, at the σ likeliest on those rows (the run's
        predictive sets its σ there afterwards), or ``fit``, at the σ the run learned
        (:meth:`zoo.inference.base.InferenceMethod.map_noise_by`).
    :param most_weights: the inference method's own bound on a weight vector it fits a Gaussian over, given the
        likelihood, the training rows and the net's outputs: ``(most, why)``, or None for no bound
        (:meth:`zoo.inference.base.InferenceMethod.most_weights`); None: no method bound.
    """

    run_dir: Path | None
    seed: int
    log: RunLog
    progress: bool
    fit_map: Callable[..., object]
    dense_matrices: int = 0
    factored_layers_only: bool = False
    map_noise_by: Literal["calibration", "fit"] = "fit"
    most_weights: Callable[[Likelihood, int, int], tuple[int, str] | None] | None = None


class ModelFamily(ABC):
    """A Pyro model over a plain ``nn.Module``'s weights: the interface guides, inference methods and the
    Posterior rely on; families know nothing else of them."""

    net: nn.Module
    likelihood: Likelihood
    structure_seconds: float = 0.0  # the wall time of fit_structure's fit (a MAP phase), as its files record it
    # what fit_structure's fit chose on its calibration rows, by spec field (a MAP phase's ``model.map.lr``)
    structure_chosen: Mapping[str, Any] = MappingProxyType({})

    @abstractmethod
    def latent_sites(self) -> dict[str, LatentSite]:
        """Every latent sample site of :meth:`model`, with shape, support and an initial value.

        :returns: the sites by name, in the model's order.
        """

    @abstractmethod
    def point_parameters(self) -> list[nn.Parameter]:
        """Parameters fitted as point estimates beside the guide (may be empty).

        :returns: the parameters, in a fixed order (checkpoints store them by position).
        """

    @abstractmethod
    def buffers(self) -> list[torch.Tensor]:
        """State the fit changes that is neither random nor fitted by gradient (BatchNorm running statistics),
        saved with every checkpoint and restored by :func:`restore_buffers`; may be empty.

        :returns: the buffers, in a fixed order.
        """

    @abstractmethod
    def model(self, x: torch.Tensor, y: torch.Tensor | None = None, batch: torch.Tensor | None = None) -> None:
        """The Pyro model: observe ``y`` on rows ``batch`` of ``x``, scaled to all ``len(x)`` rows.

        :param x: every training input ``[N, D]`` (or the rows of a minibatch, with the scale set outside).
        :param y: the targets ``[N]``; None to sample them.
        :param batch: the rows observed (None: all).
        """

    @abstractmethod
    def predict(self, draws: dict[str, torch.Tensor], x: torch.Tensor) -> PredictiveDraws:
        """Per-draw predictive distributions at ``x`` under S joint draws.

        :param draws: ``{site: [S, ...]}``.
        :param x: inputs ``[B, D]``.
        :returns: the predictive of every draw at every input.
        """

    @abstractmethod
    def log_likelihood(self, draws: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Pointwise log-density of the model's observation site at ``(x, y)`` under S draws.

        :param draws: ``{site: [S, ...]}``.
        :param x: inputs ``[B, D]``.
        :param y: targets ``[B]``.
        :returns: ``[S, B]``.
        """

    @abstractmethod
    def to(self, device: torch.device | str, dtype: torch.dtype = torch.float32) -> ModelFamily:
        """Move the family's tensors to ``device``/``dtype``.

        :param device: the device.
        :param dtype: the floating-point type.
        :returns: the family itself.
        """

    def fit_structure(self, data: Dataset, how: StructureFit) -> None:
        """Fit what the family's structure depends on before any inference (the subnetwork family: its MAP net and
        its selected weights). Nothing for a family whose structure is fixed by the net.

        Written to ``how.run_dir`` as it is fitted (the files its section's :attr:`FamilySection.files` names);
        without a run directory it is kept in memory, and :meth:`save_structure` writes it later.

        :param data: the training data.
        :param how: where to keep it and how to fit it.
        """
        return None

    def save_structure(self, run_dir: Path) -> None:
        """Write what :meth:`fit_structure` fitted in memory (a fit without a run directory) into ``run_dir``, as a
        fit with one would have kept it (the files of :attr:`FamilySection.files`), so that the run loads from
        there. Nothing for a family whose structure is fixed by the net.

        :param run_dir: the run directory, claimed by the caller.
        """
        return None

    def hyperparameters(self) -> dict[str, torch.Tensor]:
        """What inference may tune besides the guide (e.g. a prior precision), saved with the checkpoint.

        :returns: the tuned values by name; empty where nothing is tuned.
        """
        return {}

    def set_hyperparameters(self, values: dict[str, torch.Tensor]) -> None:
        """Restore tuned hyperparameters (see :meth:`hyperparameters`).

        :param values: what :meth:`hyperparameters` returned.
        :raises ValueError: values this family does not have.
        """
        if values:
            raise ValueError(f"{type(self).__name__} tunes no hyperparameters, but was given {sorted(values)}")

    def linearise(self, x: torch.Tensor) -> tuple[torch.Tensor, OutputJacobian]:
        """The net's outputs and their Jacobian with respect to the latent weights, at the point estimate.

        :param x: inputs ``[B, D]``.
        :returns: ``f [B, O]`` and ``J [B, O, D_latent]`` as a linear map (``J.dense()`` is the tensor).
        :raises NotImplementedError: a family that is not linearisable (its section's ``linearisable``).
        """
        raise NotImplementedError(f"{type(self).__name__} does not linearise its net")


PRIOR_SCALE_FACTOR = "prior_scale_factor"  # the hyperparameter a family that widens its priors saves


class WidensPriors:
    """A family whose priors a fit can widen by one factor (``inference.prior_scale_factor``: every prior's scale
    times the factor). It is a hyperparameter of the fit (:meth:`ModelFamily.hyperparameters`), saved with its
    checkpoint and restored with it; a factor of 1 is the spec's priors. Mixed into a family that keeps its priors'
    sections in ``prior_configs`` and their distributions' cache in ``_priors``."""

    prior_configs: dict[str, PriorSection]
    _priors: dict
    prior_scale_factor: float = 1.0

    def widen_priors(self, factor: float) -> None:
        """Hold every site's prior, as the spec gave it, widened by ``factor`` (1: as given) from now on.

        :param factor: the multiplier of every prior's scale.
        """
        given = self.__dict__.setdefault("_given_priors", self.prior_configs)
        self.prior_configs = {name: prior.widened(factor) for name, prior in given.items()}
        self._priors = {}  # rebuilt from the widened sections on the next call
        self.prior_scale_factor = float(factor)

    def hyperparameters(self) -> dict[str, torch.Tensor]:
        """The factor, where it is not 1.

        :returns: ``{"prior_scale_factor": factor}``, or empty at a factor of 1 (the spec's priors).
        """
        factor = self.prior_scale_factor
        return {} if factor == 1.0 else {PRIOR_SCALE_FACTOR: torch.tensor(factor, dtype=torch.float64)}

    def set_hyperparameters(self, values: dict[str, torch.Tensor]) -> None:
        """Widen the priors by the saved factor (1 where none was saved).

        :param values: what :meth:`hyperparameters` returned.
        :raises ValueError: values this family does not have.
        """
        unknown = sorted(set(values) - {PRIOR_SCALE_FACTOR})
        if unknown:
            raise ValueError(f"{type(self).__name__} tunes only {PRIOR_SCALE_FACTOR}, but was given {unknown}")
        self.widen_priors(float(values.get(PRIOR_SCALE_FACTOR, 1.0)))


def restore_buffers(family: ModelFamily, saved: list[torch.Tensor] | None) -> None:
    """Copy checkpointed :meth:`ModelFamily.buffers` back (a checkpoint from before buffers were saved has none).

    :param family: the family to restore.
    :param saved: the checkpoint's buffers.
    :raises ValueError: a checkpoint written for another net.
    """
    mine = family.buffers()
    if saved is None and not mine:
        return
    if saved is None or len(saved) != len(mine):
        raise ValueError(f"the checkpoint holds {0 if saved is None else len(saved)} buffers (BatchNorm statistics), "
                         f"the model {len(mine)}: it was written for another net")
    with torch.no_grad():
        for buffer, value in zip(mine, saved, strict=True):
            buffer.copy_(value)


class FamilySection(Strict):
    """The spec's ``model`` section for one family (``family: Literal[...]``), and what the family declares.

    The declarations are class-level; the rules in :mod:`zoo.spec` and the inference methods' checks read them.
    """

    offers: ClassVar[frozenset[str]] = frozenset()  # the kinds of latent sites it has (WEIGHT_MATRICES, ...)
    point_estimates_only: ClassVar[bool] = False  # only point-estimate guides fit it (a deep ensemble: K MAP fits)
    hierarchical_priors: ClassVar[bool] = False  # it can place a hierarchical prior (per-neuron scales)
    linearisable: ClassVar[bool] = False  # it linearises its net around a point estimate (linearised Laplace)
    needs_every_row: ClassVar[bool] = False  # its structure is fitted on every training row at once, on the device
    needs_global_noise: ClassVar[bool] = False  # it takes one observation noise, not a net-predicted one
    supports_autocast: ClassVar[bool] = True  # torch.autocast reaches its layers
    compiles_convolutions: ClassVar[bool] = True  # its step on a convolutional net is no slower compiled
    # The files and folders it keeps in a run directory beside the inference method's (what it fits of its
    # structure, :meth:`ModelFamily.fit_structure`), each with what it holds, for messages
    files: ClassVar[dict[str, str]] = {}

    @abstractmethod
    def prior_sites(self, net: nn.Module) -> list[str]:
        """The site names the spec's priors are assigned to, for ``net``.

        :param net: the deterministic net.
        :returns: the names that ``prior.sites`` globs match against.
        """

    @abstractmethod
    def build(self, net: nn.Module, priors: dict[str, PriorSection], likelihood: Likelihood) -> ModelFamily:
        """The family over ``net`` with this section's settings.

        :param net: the deterministic net.
        :param priors: the prior of every site of :meth:`prior_sites`.
        :param likelihood: the observation model.
        :returns: the family.
        """

    def refusals(self, priors: list[PriorSection]) -> list[tuple[str, Any, str]]:
        """What this family refuses of the spec's priors, before anything is built (e.g. rank-1 factors need
        priors centred at 1).

        :param priors: the default and every override of the spec's prior section.
        :returns: (field, value, what to do) per problem; empty when all fit.
        """
        return []

    def check_size(self, net: nn.Module, rows: torch.Tensor, batch: int) -> None:
        """Refuse, before the family is built, settings whose memory would not fit (a no-op for most families).

        :param net: the deterministic net.
        :param rows: a few training rows the net reads (on the run's device and dtype).
        :param batch: the training rows of one step.
        :raises ZooInputError: naming the setting, the estimate and the largest value that fits
            (:func:`zoo.runs.check_size_fits`).
        """

    def check_priors(self, priors: dict[str, PriorSection]) -> None:
        """Refuse, when the family is built, the first prior of :meth:`refusals`.

        :param priors: the prior of every site.
        :raises ZooInputError: a prior this family cannot take.
        """
        problems = self.refusals(list(priors.values()))
        if problems:
            raise ZooInputError(*problems[0])


class ModuleChoice(Strict):
    """Which of the net's modules a family makes random, by path, glob or layer type: the rest stay point estimates
    (fitted beside the guide, or at the MAP)."""

    include: list[str] | None = Field(None, description=(
        "only these modules' weights are random: module paths, globs or layer types (e.g. [out], ['blocks.*'], "
        "[Linear]); None: every module the family supports"))
    exclude: list[str] = Field(default_factory=list, description=(
        "modules whose weights stay point estimates: paths, globs or layer types (e.g. [embed] or [Embedding]); "
        "a layer the family cannot make random must be excluded (or left out of include)"))

    def chosen(self, name: str, module: nn.Module) -> bool:
        """Whether the spec asks for this module's weights to be random.

        :param name: the module's path in the net.
        :param module: the module.
        :returns: whether it is included and not excluded.
        """
        if self.include is not None and not module_matches(name, module, self.include):
            return False
        return not module_matches(name, module, self.exclude)

    def check_modules(self, net: nn.Module) -> None:
        """Refuse an ``include`` or ``exclude`` pattern that names no module of the net.

        :param net: the net.
        :raises ZooInputError: naming the pattern and the net's modules.
        """
        check_patterns(net, self.include or [], "model.include")
        check_patterns(net, self.exclude, "model.exclude")

    def refuse_unsupported(self, net: nn.Module, supported: tuple[type, ...], what: str) -> None:
        """Refuse a chosen module with weights that the family cannot make random, naming its path and type and
        how to keep it a point estimate (normalisation layers are point estimates anyway).

        :param net: the net.
        :param supported: the layer types the family makes random.
        :param what: the family, for the message (``the rank-1 family``).
        :raises ZooInputError: naming the first such module.
        """
        self.check_modules(net)
        for name, module in parametric_modules(net):
            if self.chosen(name, module) and not isinstance(module, supported + NORM_LAYERS):
                kinds = ", ".join(t.__name__ for t in supported)
                kind = type(module).__name__
                raise ZooInputError("model.exclude", name, f"{what} makes {kinds} layers random, and {name!r} is of "
                                    f"type {kind}: keep it a point estimate with model.exclude: [{name}] (or [{kind}])")
