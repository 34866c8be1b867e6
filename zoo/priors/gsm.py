"""The hierarchical Gaussian scale mixture of rank-1 BNNs (Dusenberry et al. 2020), in non-centred form.

A factor is ``loc + tau * z``: ``z ~ N(0, 1)`` per ensemble member, and one scale ``tau`` per neuron shared by
the members, under a half-Cauchy or log-normal prior. Only a family that declares ``hierarchical_priors`` (the
rank-1 family, whose factors are per-member and per-neuron) can place it.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import pyro.distributions as dist
import torch
from pydantic import Field, PositiveFloat

from zoo.errors import ZooInputError
from zoo.priors.base import PriorSection
from zoo.priors.normal import ScalarNormal


class GaussianScaleMixturePrior(PriorSection):
    """Hierarchical Gaussian scale mixture in non-centred form (rank-1 factors only): factor = loc + tau * z,
    z ~ N(0, 1) per member, one scale tau per neuron shared by the members, tau ~ half-Cauchy(scale) or
    LogNormal(log scale, log_scale_sd). On an ``.s`` site the hierarchy runs over the layer's input neurons, on
    an ``.r`` site over its output neurons, on both with a glob matching both."""

    hierarchical = True

    scale_fields: ClassVar[tuple[str, ...]] = ("scale", "log_scale_sd")
    width_fields: ClassVar[tuple[str, ...]] = ("scale",)  # tau's scale; log_scale_sd is a spread of log tau

    name: Literal["gsm"] = Field(description="gsm")
    loc: float = Field(1.0, description="centre of the factors (1: a member starts at the shared weights)")
    scale_prior: Literal["half_cauchy", "log_normal"] = Field("half_cauchy", description=(
        "prior of the per-neuron scale tau: half_cauchy(scale) or log_normal(log scale, log_scale_sd)"))
    scale: PositiveFloat = Field(0.1, description="scale of the per-neuron tau's prior")
    log_scale_sd: PositiveFloat = Field(1.0, description="log_normal: standard deviation of log tau")

    @property
    def centre(self) -> float:
        return self.loc

    def element(self, device: torch.device | str, dtype: torch.dtype) -> dist.TorchDistribution:
        raise ZooInputError("prior.name", "gsm", "the hierarchical gsm prior applies to rank-1 factors (family rank1)")

    def standardised(self, width: int, device: torch.device | str = "cpu",
                     dtype: torch.dtype = torch.float32) -> dist.TorchDistribution:
        """The prior of one member's standardised factor ``z``: N(0, 1) on each of ``width`` neurons, one event.

        :param width: neurons of the factor.
        :param device: where its parameters live.
        :param dtype: their floating-point type.
        :returns: a distribution with event shape ``[width]``.
        """
        return ScalarNormal(0.0, 1.0, torch.Size([width]), device, dtype).to_event(1)

    def scale_distribution(self, width: int, device: torch.device | str = "cpu",
                           dtype: torch.dtype = torch.float32) -> dist.TorchDistribution:
        """The prior of the per-neuron scales ``tau`` (one event of ``width``).

        :param width: neurons of the factor.
        :param device: where its parameters live.
        :param dtype: their floating-point type.
        :returns: a distribution with event shape ``[width]`` on the positive reals.
        """
        scale = torch.tensor(self.scale, device=device, dtype=dtype)
        if self.scale_prior == "half_cauchy":
            base = dist.HalfCauchy(scale)
        else:
            base = dist.LogNormal(scale.log(), torch.tensor(self.log_scale_sd, device=device, dtype=dtype))
        return base.expand(torch.Size([width])).to_event(1)

    def factor(self, z: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
        """The factor ``loc + tau * z`` from its standardised value and its neurons' scales.

        :param z: standardised factors ``[..., width]``.
        :param tau: per-neuron scales ``[width]`` (or broadcastable).
        :returns: the factors, shaped like ``z``.
        """
        return torch.addcmul(torch.full_like(z, self.loc), tau, z)
