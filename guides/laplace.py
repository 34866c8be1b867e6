"""The Laplace guide: a full or diagonal Gaussian over each vector weight site, set (not trained) by the Laplace
method.

``zoo/inference/laplace.py`` fills in the covariance from the GGN (its diagonal for ``covariance: diag``) and the
tuned prior; other sites (e.g. a Gaussian noise scale tuned by the evidence) are point values. Its state (means,
Cholesky factors or standard deviations) is an ordinary ``state_dict``, so a run directory restores it like any
other guide.
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
    :param covariance: ``full`` (Σ held as its Cholesky factor, D x D) or ``diag`` (Σ diagonal, held as the D
        standard deviations: what fits a Laplace over every weight of a large net).
    """

    def __init__(self, sites: dict[str, LatentSite], covariance: Literal["full", "diag"] = "full") -> None:
        super().__init__(sites)
        self.diagonal = covariance == "diag"
        gaussian = {param_key(n): s.shape[0] for n, s in sites.items() if self.is_gaussian(n)}
        self.scale_tril = nn.ParameterDict({} if self.diagonal else {
            k: nn.Parameter(torch.eye(d) * 1e-3, requires_grad=False) for k, d in gaussian.items()})
        self.scale_diag = nn.ParameterDict({k: nn.Parameter(torch.full((d,), 1e-3), requires_grad=False)
                                            for k, d in gaussian.items()} if self.diagonal else {})

    def is_gaussian(self, name: str) -> bool:
        """Whether site ``name`` gets the full-covariance Gaussian (a real vector site outside any plate)."""
        site = self.sites[name]
        return site.support is constraints.real and site.event_dim == 1 and site.plate is None

    def set_gaussian(self, name: str, loc: torch.Tensor, scale: torch.Tensor) -> None:
        """Set q(site) = N(loc, L Lᵀ) from its Cholesky factor ``scale = L [D, D]`` (full), or N(loc, diag(scale²))
        from its standard deviations ``scale [D]`` (diag)."""
        with torch.no_grad():
            self.loc[param_key(name)].copy_(loc)
            (self.scale_diag if self.diagonal else self.scale_tril)[param_key(name)].copy_(scale)

    def variance(self, name: str) -> torch.Tensor:
        """The marginal variances ``[D]`` of a Gaussian site."""
        if self.diagonal:
            return self.scale_diag[param_key(name)].square()
        return self.scale_tril[param_key(name)].square().sum(-1)

    def set_point(self, name: str, value: torch.Tensor) -> None:
        """Set a point-valued site to ``value`` (constrained space)."""
        with torch.no_grad():
            self.loc[param_key(name)].copy_(biject_to(self.sites[name].support).inv(value))

    def distribution(self, name: str) -> dist.TorchDistribution:
        """N(mean, Σ) for the Gaussian sites, a Delta at the point value for the rest."""
        site = self.sites[name]
        if self.is_gaussian(name) and self.diagonal:
            return dist.Normal(self.loc[param_key(name)], self.scale_diag[param_key(name)]).to_event(1)
        if self.is_gaussian(name):  # its factor is a Cholesky factor by construction: checking it on every draw
            # (one distribution a draw) took 3.3 s of 1,000 draws over a 1,010-weight last layer
            return dist.MultivariateNormal(self.loc[param_key(name)], scale_tril=self.scale_tril[param_key(name)],
                                           validate_args=False)
        return dist.Delta(biject_to(site.support)(self.loc[param_key(name)]), event_dim=site.event_dim)


class LaplaceGuideSpec(GuideSection):
    """The Laplace method's Gaussian: built by inference.method: laplace, not trained (it names it itself)."""

    needs = frozenset({WEIGHT_VECTOR})

    name: Literal["laplace"] = Field(description="laplace")
    covariance: Literal["full", "diag"] = Field(
        "full", description="full: the GGN of the random weights in full (D x D; a subnetwork or a last layer); "
        "diag: its diagonal only (D numbers: every weight of a large net; laplace-torch's hessian_structure='diag')")

    @property
    def label(self) -> str:
        return "laplace" if self.covariance == "full" else "laplace:diag"

    @property
    def dense_matrices(self) -> int:
        # the GGN, its Cholesky factor, the covariance and the guide's scale_tril; none for a diagonal
        return 4 if self.covariance == "full" else 0

    def build(self, sites: dict[str, LatentSite]) -> LaplaceGuide:
        return LaplaceGuide(sites, self.covariance)
