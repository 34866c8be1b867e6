"""Guides for ensemble families: a K-component mixture over per-member factors, and BatchEnsemble (Diracs).

Component k of the mixture is the factorised distribution of member k's factors, so the mixture runs
vectorised as the members plate of the model; sites outside the plate (e.g. a noise scale) stay mean-field.
Factor means start at random signs ±1 (P(+1) configurable), as in Dusenberry et al. 2020.
"""

from __future__ import annotations

import math

import pyro.distributions as dist
import torch
from torch.distributions import biject_to

from guides.base import SiteGuide, _key
from guides.mean_field import MeanFieldNormalGuide
from zoo.sections import GuideSpec
from zoo.sites import LatentSite


def _random_signs(sites: dict[str, LatentSite], guide: SiteGuide, prob_plus: float) -> None:
    with torch.no_grad():
        for name, site in sites.items():
            if site.plate is not None:
                signs = torch.where(torch.rand(site.shape) < prob_plus, 1.0, -1.0)
                guide.unconstrained_loc(name).copy_(site.init * signs)


class MixtureGuide(MeanFieldNormalGuide):
    """q(factors) = (1/K) sum_k prod_i q_k(factor_i): one Normal (or Cauchy) component per member."""

    def __init__(self, sites: dict[str, LatentSite], component: str = "normal", init_sign_prob: float = 0.5,
                 init_scale: float = 0.03, init_rho: float = -5.0) -> None:
        super().__init__(sites, init_rho=init_rho)
        self.component = component
        _random_signs(sites, self, init_sign_prob)
        rho = math.log(math.expm1(init_scale))  # softplus(rho) = init_scale
        with torch.no_grad():
            for name, site in sites.items():
                if site.plate is not None:
                    self.rho[_key(name)].fill_(rho)

    @classmethod
    def from_spec(cls, sites: dict[str, LatentSite], spec: GuideSpec) -> MixtureGuide:
        """Build from the spec's guide section (component, init_sign_prob, init_scale, init_rho)."""
        return cls(sites, spec.component, spec.init_sign_prob, spec.init_scale, spec.init_rho)

    def distribution(self, name: str) -> dist.TorchDistribution:
        """Component distributions of a factor site (batch = members), mean-field for the other sites."""
        site = self.sites[name]
        if site.plate is not None and self.component == "cauchy":
            return dist.Cauchy(self.loc[_key(name)], self.scale(name)).to_event(site.event_dim)
        return super().distribution(name)


class BatchEnsembleGuide(SiteGuide):
    """BatchEnsemble (Wen et al. 2020): every component a Dirac delta, so the factors carry no KL term."""

    plated_terms = False  # a Dirac has no density against the prior: its sites are masked out of the ELBO

    def __init__(self, sites: dict[str, LatentSite], init_sign_prob: float = 0.5) -> None:
        super().__init__(sites)
        _random_signs(sites, self, init_sign_prob)

    @classmethod
    def from_spec(cls, sites: dict[str, LatentSite], spec: GuideSpec) -> BatchEnsembleGuide:
        """Build from the spec's guide section (init_sign_prob)."""
        return cls(sites, spec.init_sign_prob)

    def distribution(self, name: str) -> dist.TorchDistribution:
        """A Dirac at the site's current value."""
        site = self.sites[name]
        return dist.Delta(biject_to(site.support)(self.unconstrained_loc(name)), event_dim=site.event_dim)
