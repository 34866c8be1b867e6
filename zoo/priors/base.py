"""What every weight prior is: a spec section that turns into a Pyro distribution over one site, and says what it
is (its centre, whether it is a zero-mean Gaussian, whether it is hierarchical) for the families that need to know."""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import ClassVar

import pyro.distributions as dist
import torch

from zoo.parts import Strict


def smallest_scale(dtype: torch.dtype) -> float:
    """The smallest prior scale a run in ``dtype`` can compute with: the KL and the log-density divide by scale², and
    ``1 / scale²`` must stay below the dtype's largest number times its epsilon, so that a site's terms (millions of
    weights) still sum to a finite number (float32: 1.6e-16; float64: 5.0e-147).

    :param dtype: the run's floating-point type.
    :returns: the smallest scale allowed.
    """
    info = torch.finfo(dtype)
    return 1.0 / math.sqrt(info.max * info.eps)


class PriorSection(Strict):
    """A prior on every element of a site; subclasses name themselves with ``name: Literal[...]``."""

    hierarchical: ClassVar[bool] = False  # per-neuron scales shared by ensemble members (rank-1 factors only)
    scale_fields: ClassVar[tuple[str, ...]] = ("scale",)  # the settings the KL / log-density divides by
    # the settings that widen it about its centre (widened); None: its scale_fields
    width_fields: ClassVar[tuple[str, ...] | None] = None

    def widened(self, factor: float) -> PriorSection:
        """This prior with its spread multiplied by ``factor`` about its centre (a zero-mean Normal's scale: a point
        estimate's weight decay divided by ``factor``²); the same prior at a factor of 1.

        :param factor: a positive multiplier.
        :returns: a copy with every :attr:`width_fields` (else :attr:`scale_fields`) setting multiplied.
        """
        return self.model_copy(update={f: getattr(self, f) * factor for f in self.width_fields or self.scale_fields})

    def scale_refusals(self, dtype: torch.dtype) -> list[tuple[str, float, str]]:
        """The scale-like settings too small for a run in ``dtype`` (:func:`smallest_scale`).

        :param dtype: the run's floating-point type.
        :returns: ``(setting, value, what to change)`` for each.
        """
        low, name = smallest_scale(dtype), str(dtype).removeprefix("torch.")
        wider = "" if dtype == torch.float64 else f" (or dtype: float64, down to {smallest_scale(torch.float64):.1e})"
        return [(field, getattr(self, field), f"got {getattr(self, field):g}; the smallest {field} a {name} run "
                 f"allows is {low:.1e}: the KL and log-density divide by {field}², which must stay finite in {name} "
                 f"when summed over a site's weights; use {low:.1e} or more{wider}")
                for field in self.scale_fields if getattr(self, field) < low]

    @abstractmethod
    def element(self, device: torch.device | str, dtype: torch.dtype) -> dist.TorchDistribution:
        """The prior of one element of a site (a scalar distribution).

        :param device: where its parameters live.
        :param dtype: their floating-point type.
        :returns: a distribution with empty batch and event shapes.
        """

    def distribution(self, shape: torch.Size, device: torch.device | str = "cpu",
                     dtype: torch.dtype = torch.float32) -> dist.TorchDistribution:
        """The prior of a whole site: :meth:`element` on every element of ``shape``, as one event.

        :param shape: the site's shape.
        :param device: where its parameters live.
        :param dtype: their floating-point type.
        :returns: a distribution whose event shape is ``shape``.
        """
        return self.element(device, dtype).expand(torch.Size(shape)).to_event(len(shape))

    @property
    def centre(self) -> float:
        """The prior's median: where a weight sits when the data say nothing (0 for a prior centred at zero)."""
        return 0.0

    def gaussian_precision(self) -> float | None:
        """The precision 1/sigma^2 where the prior is a zero-mean Normal (what linearised Laplace adds to the GGN),
        else None.

        :returns: the precision, or None.
        """
        return None
