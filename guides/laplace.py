"""The Laplace guide: a full, diagonal, Kronecker-factored or low-rank Gaussian over each vector weight site, set
(not trained) by the Laplace method.

``zoo/inference/laplace.py`` fills in the covariance from the GGN (its diagonal for ``covariance: diag``, its KFAC
approximation for ``covariance: kron``, its leading eigenpairs for ``covariance: lowrank``) and the tuned prior;
other sites (e.g. a Gaussian noise scale tuned by the evidence) are point values. Its state (means, Cholesky
factors, standard deviations, eigenbases) is an ordinary ``state_dict``, so a run directory restores it like any
other guide.
"""

from __future__ import annotations

import math
from typing import Literal

import pyro.distributions as dist
import torch
from pydantic import Field, PositiveInt
from torch import nn
from torch.distributions import biject_to, constraints

from guides.base import GuideSection, SiteGuide, param_key
from zoo.curvature import KroneckerBlock, LowRankScale
from zoo.errors import ZooInputError
from zoo.sites import WEIGHT_VECTOR, LatentSite

LOW_RANK = 10  # guide.rank: the GGN's eigenpairs a lowrank covariance keeps (laplace-torch's default, low_rank=10)
# guide.covariance auto: full up to this many weights, kron above (whole layers). On one core a 4,096-square GGN's
# eigvalsh takes 3.4 s and its Cholesky 0.6 s; mnist5k's conv net's head (15,690 weights) took ~200 s per eigvalsh
FULL_COVARIANCE_MAX = 4096
Covariance = Literal["full", "diag", "kron", "lowrank"]


def resolve_covariance(covariance: Covariance | Literal["auto"], sites: dict[str, LatentSite]) -> Covariance:
    """``auto``: ``full`` over at most :data:`FULL_COVARIANCE_MAX` weights or where the sites are not whole weight
    tensors, ``kron`` (KFAC) over more; any other covariance is itself.

    :param covariance: the spec's ``guide.covariance``.
    :param sites: the Gaussian sites the covariance is over.
    :returns: the covariance the guide holds.
    """
    if covariance != "auto":
        return covariance
    size = sum(site.shape[0] for site in sites.values())
    whole_tensors = all(site.blocks is not None for site in sites.values())
    return "kron" if size > FULL_COVARIANCE_MAX and whole_tensors else "full"


class KroneckerNormal(dist.TorchDistribution):
    """N(loc, Σ) over a vector made of whole weight tensors, Σ block-diagonal over the tensors with each block
    Kronecker-factored (:class:`~zoo.curvature.KroneckerBlock`): draws and densities cost two small matrix products
    per tensor, never a D x D matrix.

    :param loc: the mean ``[D]``.
    :param blocks: each tensor's block, in order; their sizes add up to D.
    """

    arg_constraints: dict = {}
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, loc: torch.Tensor, blocks: list[KroneckerBlock]) -> None:
        self.loc, self.blocks = loc, blocks
        super().__init__(torch.Size(), loc.shape[-1:], validate_args=False)

    def _split(self, values: torch.Tensor) -> list[torch.Tensor]:
        sizes = [b.scale.numel() for b in self.blocks]
        return [v.unflatten(-1, b.scale.shape) for v, b in zip(values.split(sizes, -1), self.blocks, strict=True)]

    def rsample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:
        noise = torch.randn(self._extended_shape(sample_shape), dtype=self.loc.dtype, device=self.loc.device)
        parts = [(b.rows @ (z * b.scale) @ b.cols.T).flatten(-2) for z, b in zip(self._split(noise), self.blocks,
                                                                                   strict=True)]
        return self.loc + torch.cat(parts, -1)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        white = [(b.rows.T @ d @ b.cols) / b.scale for d, b in zip(self._split(value - self.loc), self.blocks,
                                                                     strict=True)]
        log_scale = sum(b.scale.log().sum() for b in self.blocks)
        return (-0.5 * sum(w.square().sum((-2, -1)) for w in white) - log_scale
                - 0.5 * self.loc.shape[-1] * math.log(2 * math.pi))

    @property
    def mean(self) -> torch.Tensor:
        return self.loc

    @property
    def variance(self) -> torch.Tensor:
        """The marginal variances: Σ_ij (Q_G)_ri² (Q_A)_cj² scale_ij² for entry (r, c) of each tensor."""
        return torch.cat([(b.rows.square() @ b.scale.square() @ b.cols.square().T).flatten() for b in self.blocks])


class LowRankNormal(dist.TorchDistribution):
    """N(loc, (Λ + U E Uᵀ)⁻¹): a diagonal prior precision plus a rank-k curvature, held as its scale
    (:class:`~zoo.curvature.LowRankScale`): draws and densities cost O(D k), never a D x D matrix.

    :param loc: the mean ``[D]``.
    :param scale: the scale S, Σ = S Sᵀ.
    """

    arg_constraints: dict = {}
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, loc: torch.Tensor, scale: LowRankScale) -> None:
        self.loc, self.scale = loc, scale
        super().__init__(torch.Size(), loc.shape[-1:], validate_args=False)

    def _apply(self, z: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """(I + basis diag(weights) basisᵀ) z, for z ``[..., D]``."""
        return z + ((z @ self.scale.basis) * weights) @ self.scale.basis.T

    def rsample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:
        z = torch.randn(self._extended_shape(sample_shape), dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + self.scale.prior_scale * self._apply(z, self.scale.shrink)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        # S⁻¹ = (I + basis diag(1 / (1 + shrink) - 1) basisᵀ) diag(1 / prior_scale)
        white = self._apply((value - self.loc) / self.scale.prior_scale, 1 / (1 + self.scale.shrink) - 1)
        log_scale = self.scale.prior_scale.log().sum() + torch.log1p(self.scale.shrink).sum()
        return -0.5 * white.square().sum(-1) - log_scale - 0.5 * self.loc.shape[-1] * math.log(2 * math.pi)

    @property
    def mean(self) -> torch.Tensor:
        return self.loc

    @property
    def variance(self) -> torch.Tensor:
        """The marginal variances: prior_scale² (1 + Σ_j basis_ij² b_j), b = (1 + shrink)² - 1."""
        return self.scale.prior_scale.square() * (1 + self.scale.basis.square() @ self.scale.covariance_weights())


class LaplaceGuide(SiteGuide):
    """q(w) = N(w_MAP, Σ) on vector weight sites (Σ from the Laplace method); a Delta on every other site.

    :param sites: the family's latent sites.
    :param covariance: ``auto`` (:func:`resolve_covariance`: full over a few thousand weights, kron over more),
        ``full`` (Σ held as its Cholesky factor, D x D), ``diag`` (Σ diagonal, held as the D
        standard deviations: what fits a Laplace over every weight of a large net) or ``kron`` (Σ block-diagonal over
        the site's weight tensors, each block Kronecker-factored and held in its factors' eigenbases: KFAC; needs a
        site of whole tensors, ``LatentSite.blocks``) or ``lowrank`` (the prior's precision plus the GGN's ``rank``
        leading eigenpairs, held as :class:`~zoo.curvature.LowRankScale`: D x rank numbers).
    :param rank: the eigenpairs a ``lowrank`` covariance keeps (None: :data:`LOW_RANK`, or the site's size where
        that is smaller; unused by the other covariances).
    :raises ZooInputError: ``kron`` on a site that holds parts of weight tensors; a ``rank`` above a site's size.
    """

    def __init__(self, sites: dict[str, LatentSite], covariance: Covariance | Literal["auto"] = "full",
                 rank: int | None = None) -> None:
        super().__init__(sites)
        gaussian = {n: s for n, s in sites.items() if self.is_gaussian(n)}
        self.asked_covariance = covariance  # auto, or the covariance itself
        self.covariance = covariance = resolve_covariance(covariance, gaussian)
        self.low_rank = nn.ParameterDict()
        for name, site in gaussian.items() if covariance == "lowrank" else ():
            size = site.shape[0]
            if rank is not None and rank > size:
                raise ZooInputError("guide.rank", rank, f"a low-rank curvature keeps at most as many eigenpairs as "
                                    f"the {size:,} weights it is over: give guide.rank up to {size:,}")
            kept = min(LOW_RANK, size) if rank is None else rank
            for part, value in zip(LowRankScale._fields, (torch.full((size,), 1e-3), torch.eye(size, kept),
                                                          torch.zeros(kept)), strict=True):
                self.low_rank[f"{param_key(name)}/{part}"] = _fixed(value)
        self.scale_tril = nn.ParameterDict({param_key(n): _fixed(torch.eye(s.shape[0]) * 1e-3)
                                            for n, s in gaussian.items()} if covariance == "full" else {})
        self.scale_diag = nn.ParameterDict({param_key(n): _fixed(torch.full((s.shape[0],), 1e-3))
                                            for n, s in gaussian.items()} if covariance == "diag" else {})
        self.kron_rows, self.kron_cols, self.kron_scale = nn.ParameterDict(), nn.ParameterDict(), nn.ParameterDict()
        for name, site in gaussian.items() if covariance == "kron" else ():
            if site.blocks is None:
                raise ZooInputError("guide.covariance", "kron", "a Kronecker-factored covariance needs whole weight "
                                    "tensors: select whole layers (model.selection.strategy: all, last_layer or "
                                    "modules), or use guide.covariance: full or diag")
            for k, (rows, cols) in enumerate(site.blocks):
                key = _block_key(name, k)
                self.kron_rows[key], self.kron_cols[key] = _fixed(torch.eye(rows)), _fixed(torch.eye(cols))
                self.kron_scale[key] = _fixed(torch.full((rows, cols), 1e-3))

    @property
    def factored(self) -> bool:
        """Whether Σ is held without a D x D matrix (diag, kron or lowrank): what the predictive then computes from
        the layer factors and forward-mode products, never from a Jacobian over every weight."""
        return self.covariance != "full"

    def is_gaussian(self, name: str) -> bool:
        """Whether site ``name`` gets the Gaussian (a real vector site outside any plate)."""
        site = self.sites[name]
        return site.support is constraints.real and site.event_dim == 1 and site.plate is None

    def set_gaussian(self, name: str, loc: torch.Tensor,
                     scale: torch.Tensor | list[KroneckerBlock] | LowRankScale) -> None:
        """Set q(site) = N(loc, L Lᵀ) from its Cholesky factor ``scale = L [D, D]`` (full), N(loc, diag(scale²))
        from its standard deviations ``scale [D]`` (diag), the Kronecker-factored Gaussian of its blocks (kron), or
        the low-rank Gaussian of its :class:`~zoo.curvature.LowRankScale` (lowrank).
        """
        with torch.no_grad():
            self.loc[param_key(name)].copy_(loc)
            if self.covariance == "kron":
                for k, block in enumerate(scale):
                    key = _block_key(name, k)
                    self.kron_rows[key].copy_(block.rows)
                    self.kron_cols[key].copy_(block.cols)
                    self.kron_scale[key].copy_(block.scale)
            elif self.covariance == "lowrank":
                for part, value in zip(LowRankScale._fields, scale, strict=True):
                    self.low_rank[f"{param_key(name)}/{part}"].copy_(value)
            else:
                (self.scale_diag if self.covariance == "diag" else self.scale_tril)[param_key(name)].copy_(scale)

    def kronecker_blocks(self, name: str) -> list[KroneckerBlock]:
        """A kron Gaussian site's blocks, one per weight tensor."""
        return [KroneckerBlock(self.kron_rows[key], self.kron_cols[key], self.kron_scale[key])
                for key in (_block_key(name, k) for k in range(len(self.sites[name].blocks)))]

    def low_rank_scale(self, name: str) -> LowRankScale:
        """A lowrank Gaussian site's scale."""
        return LowRankScale(*(self.low_rank[f"{param_key(name)}/{part}"] for part in LowRankScale._fields))

    def variance(self, name: str) -> torch.Tensor:
        """The marginal variances ``[D]`` of a Gaussian site."""
        if self.covariance == "diag":
            return self.scale_diag[param_key(name)].square()
        if self.covariance in ("kron", "lowrank"):
            return self.distribution(name).variance
        return self.scale_tril[param_key(name)].square().sum(-1)

    def set_point(self, name: str, value: torch.Tensor) -> None:
        """Set a point-valued site to ``value`` (constrained space)."""
        with torch.no_grad():
            self.loc[param_key(name)].copy_(biject_to(self.sites[name].support).inv(value))

    def distribution(self, name: str) -> dist.TorchDistribution:
        """N(mean, Σ) for the Gaussian sites, a Delta at the point value for the rest."""
        site = self.sites[name]
        if self.is_gaussian(name) and self.covariance == "diag":
            return dist.Normal(self.loc[param_key(name)], self.scale_diag[param_key(name)]).to_event(1)
        if self.is_gaussian(name) and self.covariance == "kron":
            return KroneckerNormal(self.loc[param_key(name)], self.kronecker_blocks(name))
        if self.is_gaussian(name) and self.covariance == "lowrank":
            return LowRankNormal(self.loc[param_key(name)], self.low_rank_scale(name))
        if self.is_gaussian(name):  # its factor is a Cholesky factor by construction: checking it on every draw
            # (one distribution a draw) took 3.3 s of 1,000 draws over a 1,010-weight last layer
            return dist.MultivariateNormal(self.loc[param_key(name)], scale_tril=self.scale_tril[param_key(name)],
                                           validate_args=False)
        return dist.Delta(biject_to(site.support)(self.loc[param_key(name)]), event_dim=site.event_dim)


class LaplaceGuideSpec(GuideSection):
    """The Laplace method's Gaussian: built by inference.method: laplace, not trained (it names it itself)."""

    needs = frozenset({WEIGHT_VECTOR})

    name: Literal["laplace"] = Field(description="laplace")
    covariance: Covariance | Literal["auto"] = Field(
        "full", description=f"auto: full over at most {FULL_COVARIANCE_MAX:,} weights (or a selection of single "
        "weights), kron over more whole layers (what last_layer_laplace takes: a conv net's wide head stays "
        "affordable); full: the GGN of the random weights in full (D x D; a subnetwork or a last layer); "
        "diag: its diagonal only (D numbers: every weight of a large net; laplace-torch's hessian_structure='diag'); "
        "kron: KFAC, one Kronecker product of an output and an input factor per weight tensor (whole layers: "
        "selection all, last_layer or modules; laplace-torch's hessian_structure='kron'); lowrank: the GGN's "
        "guide.rank leading eigenpairs plus the prior (D x rank numbers, any selection; laplace-torch's "
        "hessian_structure='lowrank')")
    rank: PositiveInt | None = Field(None, description=f"lowrank: the GGN's eigenpairs kept, found by a randomised "
                                     f"eigensolver on GGN-vector products (unset: {LOW_RANK}, or every weight where "
                                     "there are fewer; at most the number of random weights)")

    @property
    def label(self) -> str:
        return "laplace" if self.covariance == "full" else f"laplace:{self.covariance}"  # (auto: laplace:auto)

    @property
    def dense_matrices(self) -> int:
        # the GGN, its Cholesky factor, the covariance and the guide's scale_tril; none for diag or kron (whose
        # factors are each a layer's width squared), nor auto (full only up to FULL_COVARIANCE_MAX weights)
        return 4 if self.covariance == "full" else 0

    @property
    def factored_layers_only(self) -> bool:
        return self.covariance == "kron"

    def build(self, sites: dict[str, LatentSite]) -> LaplaceGuide:
        return LaplaceGuide(sites, self.covariance, self.rank)


def _fixed(value: torch.Tensor) -> nn.Parameter:
    """A guide parameter the Laplace method sets (no optimiser trains it)."""
    return nn.Parameter(value, requires_grad=False)


def _block_key(name: str, k: int) -> str:
    return f"{param_key(name)}/{k}"
