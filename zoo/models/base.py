"""What every model family shares: the description of a latent site and the family interface."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributions import constraints


@dataclass(frozen=True)
class LatentSite:
    """A latent sample site of a model: its shape, support, and a sensible initial value for guides."""

    shape: torch.Size
    init: torch.Tensor
    support: constraints.Constraint = constraints.real

    @property
    def is_weight(self) -> bool:
        """Real-valued sites are weights (or weight-like factors); constrained ones are e.g. noise scales."""
        return self.support is constraints.real
