"""Bayes-by-Backprop guide: a factorised Normal per weight, sigma = softplus(rho)."""

from __future__ import annotations

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import biject_to, constraints

from guides.base import SiteGuide, _key
from zoo.models.base import LatentSite
from zoo.spec import GuideSpec


class MeanFieldNormalGuide(SiteGuide):
    """q(w) = prod_i N(mu_i, softplus(rho_i)^2); constrained sites (noise scales) get a Normal in log space."""

    def __init__(self, sites: dict[str, LatentSite], init_rho: float = -5.0) -> None:
        super().__init__(sites)
        self.rho = nn.ParameterDict(
            {_key(n): nn.Parameter(torch.full_like(self.loc[_key(n)], init_rho)) for n in sites}
        )

    @classmethod
    def from_spec(cls, sites: dict[str, LatentSite], spec: GuideSpec) -> MeanFieldNormalGuide:
        """Build from the spec's guide section (``init_rho``)."""
        return cls(sites, init_rho=spec.init_rho)

    def scale(self, name: str) -> torch.Tensor:
        """Posterior standard deviation (in unconstrained space) of site ``name``."""
        return F.softplus(self.rho[_key(name)])

    def distribution(self, name: str) -> dist.TorchDistribution:
        """N(mu, softplus(rho)^2) over the site, pushed through the support's bijection when constrained."""
        site = self.sites[name]
        base = dist.Normal(self.loc[_key(name)], self.scale(name))
        if site.support is constraints.positive:
            # the same q as Normal pushed through biject_to(positive) (exp, then +0), but as a LogNormal, which
            # kl_divergence pairs with a LogNormal prior analytically (the composed transform it cannot match)
            base = dist.LogNormal(self.loc[_key(name)], self.scale(name))
        elif site.support is not constraints.real:
            base = dist.TransformedDistribution(base, [biject_to(site.support)])
        return base.to_event(len(site.shape))

    def signal_to_noise(self) -> dict[str, torch.Tensor]:
        """|mu| / sigma for every weight site: Blundell et al.'s criterion for pruning."""
        with torch.no_grad():
            return {n: self.loc[_key(n)].abs() / self.scale(n) for n, s in self.sites.items() if s.is_weight}
