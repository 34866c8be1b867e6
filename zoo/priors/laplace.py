"""The Laplace prior: sparsity-promoting, with torch's analytic KL against a Normal guide."""

from __future__ import annotations

from typing import Literal

import pyro.distributions as dist
import torch
from pydantic import Field, PositiveFloat

from zoo.priors.base import PriorSection


class LaplacePrior(PriorSection):
    """Laplace(loc, scale): sparsity-promoting, analytic KL against a Normal guide."""

    name: Literal["laplace"] = Field(description="laplace")
    loc: float = Field(0.0, description="location (the median)")
    scale: PositiveFloat = Field(1.0, description="scale b (the variance is 2 b^2)")

    @property
    def centre(self) -> float:
        return self.loc

    def element(self, device: torch.device | str, dtype: torch.dtype) -> dist.Laplace:
        return dist.Laplace(torch.tensor(self.loc, device=device, dtype=dtype),
                            torch.tensor(self.scale, device=device, dtype=dtype))
