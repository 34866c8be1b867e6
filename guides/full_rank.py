"""Full-rank Gaussian guide: q(w) = N(mu, L Lᵀ) with a trained Cholesky factor per vector site (for SVI).

Fitting it by SVI on the subnetwork family's model is the variational counterpart of the Laplace posterior:
both are full-covariance Gaussians over the subnet. Scalar constrained sites (a noise scale) get the mean-field
guide's LogNormal.
"""

from __future__ import annotations

from typing import Literal

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn
from torch.distributions import constraints

from guides.base import ExactDrawMultivariateNormal, GuideSection, InitRho, param_key
from guides.mean_field import MeanFieldNormalGuide
from zoo.errors import ZooInputError
from zoo.runs import check_covariance_fits
from zoo.sites import WEIGHT_VECTOR, LatentSite


class FullRankGuide(MeanFieldNormalGuide):
    """q(w) = N(mu, L Lᵀ) over each vector weight site, L lower-triangular with a softplus diagonal.

    :param sites: the family's latent sites (its weights as vector sites).
    :param init_rho: the initial rho of the diagonal of L.
    """

    def __init__(self, sites: dict[str, LatentSite], init_rho: float = -5.0) -> None:
        wide = [n for n, s in sites.items() if s.is_weight and s.event_dim > 1]
        if wide:
            raise ZooInputError("guide.name", "full_rank", f"the full-rank guide takes vector sites, and {wide[:2]} "
                                "are matrices; use it with model.family: subnetwork, or use the mean_field guide")
        full = [n for n in sites if sites[n].support is constraints.real and sites[n].event_dim == 1
                and sites[n].plate is None]
        dim = max((sites[n].shape[0] for n in full), default=0)
        check_covariance_fits("guide.name", "full_rank", dim, 4, 4, lambda most: f"a full covariance fits up to "
                              f"about {most:,} weights here; use a smaller subnetwork (model.selection.size) or the "
                              "mean_field guide")
        super().__init__(sites, init_rho)
        self.off_diagonal = nn.ParameterDict({
            param_key(n): nn.Parameter(torch.zeros(s.shape[0], s.shape[0])) for n, s in sites.items() if self._full(n)
        })

    def _full(self, name: str) -> bool:
        site = self.sites[name]
        return site.support is constraints.real and site.event_dim == 1 and site.plate is None

    def scale_tril(self, name: str) -> torch.Tensor:
        """The Cholesky factor L of q's covariance for a vector site."""
        key = param_key(name)
        return self.off_diagonal[key].tril(-1) + torch.diag(F.softplus(self.rho[key]))

    def scale(self, name: str) -> torch.Tensor:
        """Posterior standard deviation of each element: the row norms of L for a full-covariance site (so
        signal-to-noise pruning reads the marginal sd), the mean-field softplus(rho) for the rest."""
        if self._full(name):
            return self.scale_tril(name).norm(dim=-1)
        return super().scale(name)

    def distribution(self, name: str) -> dist.TorchDistribution:
        """N(mu, L Lᵀ) for vector weight sites; the mean-field guide's distribution for the rest."""
        if self._full(name):
            return ExactDrawMultivariateNormal(self.loc[param_key(name)], scale_tril=self.scale_tril(name))
        return super().distribution(name)


class FullRankGuideSpec(GuideSection):
    """A full-covariance Gaussian over a vector of weights, fitted by SVI (the variational twin of Laplace)."""

    needs = frozenset({WEIGHT_VECTOR})

    name: Literal["full_rank"] = Field(description="full_rank")
    init_rho: InitRho

    @property
    def dense_matrices(self) -> int:
        return 4  # L, its gradient and the optimiser's two moments

    def build(self, sites: dict[str, LatentSite]) -> FullRankGuide:
        return FullRankGuide(sites, init_rho=self.init_rho)
