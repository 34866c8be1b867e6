"""Bayes by Backprop's scale-mixture prior (Blundell et al. 2015): a wide and a narrow zero-mean Gaussian."""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import pyro.distributions as dist
import torch
from pydantic import Field, PositiveFloat
from torch.distributions import constraints

from zoo.priors.base import PriorSection


class ScaleMixtureNormal(dist.TorchDistribution):
    """Zero-mean two-component Gaussian scale mixture pi N(0, s1^2) + (1 - pi) N(0, s2^2) (Blundell et al. 2015).

    Scalar hyperparameters broadcast over ``batch_shape``; no closed-form KL exists, so ELBOs use Monte Carlo.

    :param pi: the weight of the first component.
    :param sigma1: the first component's standard deviation.
    :param sigma2: the second component's standard deviation.
    :param batch_shape: the shape the scalar hyperparameters broadcast over.
    :param validate_args: torch's argument validation.
    """

    arg_constraints = {"pi": constraints.unit_interval, "sigma1": constraints.positive, "sigma2": constraints.positive}
    support = constraints.real
    has_rsample = False

    def __init__(self, pi: torch.Tensor, sigma1: torch.Tensor, sigma2: torch.Tensor,
                 batch_shape: torch.Size = torch.Size(), validate_args: bool | None = None) -> None:
        self.pi, self.sigma1, self.sigma2 = pi, sigma1, sigma2
        super().__init__(torch.Size(batch_shape), validate_args=validate_args)

    def expand(self, batch_shape: torch.Size, _instance: ScaleMixtureNormal | None = None) -> ScaleMixtureNormal:
        """Same hyperparameters over a larger batch shape (no copies).

        :param batch_shape: the new batch shape.
        :param _instance: torch's instance to fill in; unused, a new distribution is built.
        :returns: the expanded distribution.
        """
        return ScaleMixtureNormal(self.pi, self.sigma1, self.sigma2, torch.Size(batch_shape))

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """log of the mixture density, via logsumexp of the two weighted Normal log densities.

        :param value: points of the batch shape.
        :returns: their log densities.
        """
        half_log_2pi = 0.5 * math.log(2 * math.pi)
        comp1 = torch.log(self.pi) - torch.log(self.sigma1) - half_log_2pi - 0.5 * (value / self.sigma1) ** 2
        comp2 = torch.log1p(-self.pi) - torch.log(self.sigma2) - half_log_2pi - 0.5 * (value / self.sigma2) ** 2
        return torch.logaddexp(comp1, comp2)

    def sample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:
        """Pick a component per element, then draw from it.

        :param sample_shape: leading dimensions of the draws.
        :returns: draws of shape ``sample_shape + batch_shape``.
        """
        shape = self._extended_shape(sample_shape)
        with torch.no_grad():
            first = torch.rand(shape, device=self.pi.device) < self.pi
            sigma = torch.where(first, self.sigma1, self.sigma2)
            return sigma * torch.randn(shape, device=self.pi.device, dtype=self.sigma1.dtype)

    @property
    def mean(self) -> torch.Tensor:
        return torch.zeros(self.batch_shape, device=self.pi.device, dtype=self.sigma1.dtype)

    @property
    def variance(self) -> torch.Tensor:
        var = self.pi * self.sigma1**2 + (1 - self.pi) * self.sigma2**2
        return var.expand(self.batch_shape)


class ScaleMixturePrior(PriorSection):
    """Bayes-by-Backprop prior pi N(0, sigma1^2) + (1 - pi) N(0, sigma2^2); Monte Carlo KL."""

    scale_fields: ClassVar[tuple[str, ...]] = ("sigma1", "sigma2")

    name: Literal["scale_mixture"] = Field(description="scale_mixture")
    pi: float = Field(0.5, gt=0.0, lt=1.0, description="weight of the wide component N(0, sigma1^2)")
    sigma1: PositiveFloat = Field(1.0, description="standard deviation of the wide component")
    sigma2: PositiveFloat = Field(0.0024787521766663585, description=(
        "standard deviation of the narrow component (e^-6, as in Blundell et al. 2015)"))

    def element(self, device: torch.device | str, dtype: torch.dtype) -> ScaleMixtureNormal:
        def t(x: float) -> torch.Tensor:
            return torch.tensor(x, device=device, dtype=dtype)

        return ScaleMixtureNormal(t(self.pi), t(self.sigma1), t(self.sigma2))
