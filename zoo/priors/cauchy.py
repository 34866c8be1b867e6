"""The Cauchy prior: heavy tails; no closed-form KL, so the ELBO estimates it by Monte Carlo."""

from __future__ import annotations

from typing import Literal

import pyro.distributions as dist
import torch
from pydantic import Field, PositiveFloat

from zoo.priors.base import PriorSection


class CauchyPrior(PriorSection):
    """Cauchy(loc, scale): heavy tails; the KL falls back to Monte Carlo."""

    name: Literal["cauchy"] = Field(description="cauchy")
    loc: float = Field(0.0, description="location (the median)")
    scale: PositiveFloat = Field(1.0, description="half width at half maximum")

    @property
    def centre(self) -> float:
        return self.loc

    def element(self, device: torch.device | str, dtype: torch.dtype) -> dist.Cauchy:
        return dist.Cauchy(torch.tensor(self.loc, device=device, dtype=dtype),
                           torch.tensor(self.scale, device=device, dtype=dtype))
