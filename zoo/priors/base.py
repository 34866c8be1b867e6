"""What every weight prior is: a spec section that turns into a Pyro distribution over one site, and says what it
is (its centre, whether it is a zero-mean Gaussian, whether it is hierarchical) for the families that need to know."""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

import pyro.distributions as dist
import torch

from zoo.parts import Strict


class PriorSection(Strict):
    """A prior on every element of a site; subclasses name themselves with ``name: Literal[...]``."""

    hierarchical: ClassVar[bool] = False  # per-neuron scales shared by ensemble members (rank-1 factors only)

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
