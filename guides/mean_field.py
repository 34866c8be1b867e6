"""Bayes-by-Backprop guide: a factorised Normal per weight, sigma = softplus(rho)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn
from torch.distributions import biject_to, constraints

from guides.base import (
    DEFAULT_INIT_RHO,
    INIT_RHO_CANDIDATES,
    GuideSection,
    OpenInitRho,
    SettingChoice,
    SiteGuide,
    param_key,
)
from zoo.sites import LatentSite


class FactorNormal(dist.Normal):
    """A Normal whose loc and scale already have one shape (the guide's factors): no broadcasting on
    construction, and one fused op per reparameterised draw. An SVI step builds one per site, so this counts."""

    def __init__(self, loc: torch.Tensor, scale: torch.Tensor) -> None:
        self.loc, self.scale = loc, scale
        torch.distributions.Distribution.__init__(self, loc.shape)

    def expand(self, batch_shape: torch.Size, _instance=None) -> dist.Normal:
        """A plain Normal over ``batch_shape``."""
        return dist.Normal(self.loc.expand(batch_shape), self.scale.expand(batch_shape))

    def rsample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:
        """loc + scale * eps with eps ~ N(0, 1)."""
        if sample_shape:
            return super().rsample(sample_shape)
        return torch.addcmul(self.loc, torch.randn_like(self.loc), self.scale)


class MeanFieldNormalGuide(SiteGuide):
    """q(w) = prod_i N(mu_i, softplus(rho_i)^2); constrained sites (noise scales) get a Normal in log space.

    :param sites: the family's latent sites (the means start at their initial values).
    :param init_rho: the initial rho of every site; None: left for the fit to choose from
        :data:`INIT_RHO_CANDIDATES` (:meth:`open_setting`), meanwhile :data:`DEFAULT_INIT_RHO`.
    """

    prior_scale_open = True  # given validation rows, the fit chooses its priors' scale (docs: the defaults page)

    def __init__(self, sites: dict[str, LatentSite], init_rho: float | None = DEFAULT_INIT_RHO) -> None:
        super().__init__(sites)
        self.rho_open = init_rho is None
        self.init_rho = DEFAULT_INIT_RHO if init_rho is None else init_rho  # read by the NaN diagnosis
        self.rho = nn.ParameterDict(
            {param_key(n): nn.Parameter(torch.full_like(self.loc[param_key(n)], self.init_rho)) for n in sites}
        )

    def open_setting(self) -> SettingChoice | None:
        """Where every site's rho starts, where the section left it null."""
        return SettingChoice("guide.init_rho", self.init_rho, INIT_RHO_CANDIDATES) if self.rho_open else None

    def take_setting(self, value: float) -> None:
        """Start every site's rho at ``value`` again; the means keep their start."""
        self.init_rho = float(value)
        with torch.no_grad():
            for rho in self.rho.values():
                rho.fill_(value)

    def scale(self, name: str) -> torch.Tensor:
        """Posterior standard deviation (in unconstrained space) of site ``name``."""
        return F.softplus(self.rho[param_key(name)])

    def distribution(self, name: str) -> dist.TorchDistribution:
        """N(mu, softplus(rho)^2) over the site, pushed through the support's bijection when constrained."""
        site = self.sites[name]
        loc, scale = self.loc[param_key(name)], self.scale(name)
        if site.support is constraints.real:
            base = FactorNormal(loc, scale)
        elif site.support is constraints.positive:
            # the same q as Normal pushed through biject_to(positive), but as a LogNormal, which kl_divergence
            # pairs with a LogNormal prior analytically (torch's composed exp transform it cannot match)
            base = dist.LogNormal(loc, scale)
        else:
            base = dist.TransformedDistribution(dist.Normal(loc, scale), [biject_to(site.support)])
        return base.to_event(site.event_dim)

    def signal_to_noise(self) -> dict[str, torch.Tensor]:
        """|mu| / sigma for every weight site: Blundell et al.'s criterion for pruning.

        :returns: per weight site, shaped like the site.
        """
        with torch.no_grad():
            return {n: self.loc[param_key(n)].abs() / self.scale(n) for n, s in self.sites.items() if s.is_weight}


class MeanFieldGuideSpec(GuideSection):
    """Bayes by Backprop: a factorised Normal per weight, sigma = softplus(rho)."""

    former_defaults: ClassVar[dict[str, tuple[Any, ...]]] = {"init_rho": (DEFAULT_INIT_RHO,)}  # until 2026-12-06

    name: Literal["mean_field"] = Field("mean_field", description="mean_field")
    init_rho: OpenInitRho

    def build(self, sites: dict[str, LatentSite]) -> MeanFieldNormalGuide:
        return MeanFieldNormalGuide(sites, init_rho=self.init_rho)
