"""The Laplace guide: a full-covariance Gaussian over each vector weight site, set (not trained) by the Laplace method.

``zoo/inference/laplace.py`` fills in the covariance from the GGN and the tuned prior; other sites (e.g. a
Gaussian noise scale tuned by the evidence) are point values. Its state (means, Cholesky factors) is an ordinary
``state_dict``, so a run directory restores it like any other guide.
"""

from __future__ import annotations

from typing import Literal

import pyro.distributions as dist
import torch
from pydantic import Field
from torch import nn
from torch.distributions import biject_to, constraints

from guides.base import GuideSection, SiteGuide, param_key
from zoo.sites import WEIGHT_VECTOR, LatentSite


class LaplaceGuide(SiteGuide):
    """q(w) = N(w_MAP, Σ) on vector weight sites (Σ from the Laplace method); a Delta on every other site.

    :param sites: the family's latent sites.
    """

    def __init__(self, sites: dict[str, LatentSite]) -> None:
        super().__init__(sites)
        self.scale_tril = nn.ParameterDict({
            param_key(n): nn.Parameter(torch.eye(s.shape[0]) * 1e-3, requires_grad=False)
            for n, s in sites.items() if self.is_gaussian(n)
        })

    def is_gaussian(self, name: str) -> bool:
        """Whether site ``name`` gets the full-covariance Gaussian (a real vector site outside any plate)."""
        site = self.sites[name]
        return site.support is constraints.real and site.event_dim == 1 and site.plate is None

    def set_gaussian(self, name: str, loc: torch.Tensor, scale_tril: torch.Tensor) -> None:
        """Set q(site) = N(loc, scale_tril scale_trilᵀ)."""
        with torch.no_grad():
            self.loc[param_key(name)].copy_(loc)
            self.scale_tril[param_key(name)].copy_(scale_tril)

    def set_point(self, name: str, value: torch.Tensor) -> None:
        """Set a point-valued site to ``value`` (constrained space)."""
        with torch.no_grad():
            self.loc[param_key(name)].copy_(biject_to(self.sites[name].support).inv(value))

    def distribution(self, name: str) -> dist.TorchDistribution:
        """N(mean, Σ) for the Gaussian sites, a Delta at the point value for the rest."""
        site = self.sites[name]
        if self.is_gaussian(name):
            return dist.MultivariateNormal(self.loc[param_key(name)], scale_tril=self.scale_tril[param_key(name)])
        return dist.Delta(biject_to(site.support)(self.loc[param_key(name)]), event_dim=site.event_dim)


class LaplaceGuideSpec(GuideSection):
    """The Laplace method's Gaussian: built by inference.method: laplace, not trained (it names it itself)."""

    needs = frozenset({WEIGHT_VECTOR})

    name: Literal["laplace"] = Field(description="laplace")

    def build(self, sites: dict[str, LatentSite]) -> LaplaceGuide:
        return LaplaceGuide(sites)
