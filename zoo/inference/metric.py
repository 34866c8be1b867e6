"""The many-chain HMC's metric: a diagonal, optionally modified along a few directions, adapted from draws and scores.

The inverse mass matrix is ``M^-1 = S (I + U (diag(lam) - I) U^T) S`` with ``S = diag(sqrt(variance))`` and ``U``
``[D, k]`` orthonormal: the diagonal metric everywhere except along the k directions ``S U``, where the whitened
variance is ``lam`` instead of 1. ``k = 0`` is the diagonal metric; ``k = D`` a dense one. The sampler moves in
whitened coordinates through the factor ``L = S (I + U (sqrt(lam) - 1) U^T)`` (``L L^T = M^-1``): positions move by
``L v`` and velocities are kicked by ``L^T grad``, so HMC's momentum and MAMS's unit velocity live where the metric
is the identity.

Why: with a learned noise sigma the likelihood's curvature grows like 1/sigma^2 along a few combinations of weights
(the top of the Gauss-Newton matrix). A diagonal cannot express them, so the step is set by the stiffest of them and
the trajectory must span the widest direction: thousands of leapfrog steps per draw on low-noise UCI sets.

:func:`fit_metric` estimates the metric from the warm-up window's draws and the potential's gradients there, as
nutpie's low-rank modified mass matrix does (Seyboldt et al.), with one change: the diagonal is the draws' own
variances, the diagonal metric's, so that a low-rank metric with nothing beyond its cutoff is the diagonal metric
(nutpie's sqrt(Var[z] / Var[grad]) is the option ``diagonal="scores"``: stiff directions pull it down, and on a
Gaussian with two stiff tilted directions it kept one of them and left a whitened condition number of 1,440 where
the draws' variances left 7; tests/test_metric.py). In those units
it takes the subspace spanned by the centred draws and gradients and, there, the SPD geometric mean of Cov[z] and
Cov[grad]^-1, the matrix ``A`` with ``A Cov[grad] A = Cov[z]``. For a Gaussian target the gradient is
``Sigma^-1 (z - mu)``, and that mean is ``Sigma`` itself from any number of draws (within their span): the gradients
carry the curvature that few draws cannot resolve. Its eigenvalues far from 1 (beyond a factor ``cutoff``) become
the metric's directions.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

# directions whose whitened variance differs from the diagonal's by less than this factor are left to the diagonal
# (nutpie's default cutoff): the estimate from a warm-up window is noisy by a factor of that order
EIGENVALUE_CUTOFF = 100.0
# regularisation of the projected covariances, relative to the sample covariance over the window's rows (nutpie's
# gamma): directions the draws do not span keep the diagonal's scale
REGULARISATION = 1e-5
MetricKind = Literal["diagonal", "low_rank", "dense"]


class Metric:
    """An inverse mass matrix ``S (I + U (diag(eigen) - I) U^T) S``: a diagonal ``variance`` modified along the
    orthonormal columns of ``basis`` (none: the diagonal metric).

    :param variance: the diagonal ``S^2`` ``[D]`` (the inverse mass of each coordinate).
    :param basis: ``U``, ``[D, k]`` with orthonormal columns, in coordinates whitened by ``S``.
    :param eigen: the whitened variance along each column of ``basis`` ``[k]`` (1 would change nothing).
    """

    def __init__(self, variance: torch.Tensor, basis: torch.Tensor | None = None,
                 eigen: torch.Tensor | None = None) -> None:
        self.variance = variance
        self.basis = variance.new_zeros(len(variance), 0) if basis is None else basis.to(variance)
        self.eigen = variance.new_zeros(0) if eigen is None else eigen.to(variance)
        self.std = variance.sqrt()

    @property
    def rank(self) -> int:
        """How many directions modify the diagonal."""
        return self.basis.shape[1]

    def _along(self, x: torch.Tensor, power: float) -> torch.Tensor:
        """``(I + U (eigen^power - 1) U^T) x`` over the last dimension."""
        if not self.rank:
            return x
        return x + ((x @ self.basis) * (self.eigen**power - 1)) @ self.basis.T

    def scale(self, v: torch.Tensor) -> torch.Tensor:
        """``L v``: a whitened velocity as the rate of change of the position.

        :param v: whitened vectors ``[..., D]``.
        :returns: ``L v``, the same shape.
        """
        return self.std * self._along(v, 0.5)

    def scale_transposed(self, grad: torch.Tensor) -> torch.Tensor:
        """``L^T grad``: a gradient in whitened coordinates (what kicks a whitened velocity).

        :param grad: gradients ``[..., D]`` in the sampler's coordinates.
        :returns: ``L^T grad``, the same shape.
        """
        return self._along(self.std * grad, 0.5)

    def whiten(self, x: torch.Tensor) -> torch.Tensor:
        """``L^-1 x``: a displacement in coordinates where the metric is the identity.

        :param x: displacements ``[..., D]`` in the sampler's coordinates.
        :returns: ``L^-1 x``, the same shape.
        """
        return self._along(x / self.std, -0.5)

    def covariance(self) -> torch.Tensor:
        """The dense inverse mass matrix (for tests and reports; the sampler never forms it).

        :returns: ``M^-1`` ``[D, D]``.
        """
        return self.scale(self.scale(torch.eye(len(self.variance), dtype=self.variance.dtype,
                                               device=self.variance.device)).T)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The tensors that rebuild this metric.

        :returns: ``variance``, ``basis`` and ``eigen``: ``Metric(**state)`` is this metric again.
        """
        return {"variance": self.variance, "basis": self.basis, "eigen": self.eigen}

    def describe(self) -> str:
        """One line for the run log.

        :returns: the modified directions and how far their variances are from the diagonal's.
        """
        if not self.rank:
            return "diagonal"
        low, high = float(self.eigen.min()), float(self.eigen.max())
        return f"diagonal + {self.rank} direction{'s' if self.rank > 1 else ''} (whitened variances {low:.3g} to " \
               f"{high:.3g})"


def window_variance(window: torch.Tensor) -> torch.Tensor:
    """Each coordinate's within-chain variance over a window, pooled over the chains, with Stan's regularisation
    towards 1e-3: the diagonal metric (chains in different modes of a BNN posterior must not inflate it).

    :param window: draws ``[n, chains, D]``.
    :returns: the variances ``[D]``.
    """
    n = window.shape[0]
    variance = window.var(0).mean(0)
    return (variance * n / (n + 5.0) + 1e-3 * 5.0 / (n + 5.0)).clamp(min=1e-8)


def _geometric_mean(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The SPD matrix ``X`` with ``X b X = a``: ``b^-1/2 (b^1/2 a b^1/2)^1/2 b^-1/2``, the geometric mean of ``a``
    and ``b^-1``."""
    values, vectors = torch.linalg.eigh(b)
    root = (vectors * values.sqrt()) @ vectors.T
    inverse_root = (vectors / values.sqrt()) @ vectors.T
    inner_values, inner_vectors = torch.linalg.eigh(root @ a @ root)
    inner = (inner_vectors * inner_values.clamp(min=0.0).sqrt()) @ inner_vectors.T
    return inverse_root @ inner @ inverse_root


def fit_metric(draws: torch.Tensor, grads: torch.Tensor | None = None, kind: MetricKind = "diagonal",
               rank: int | None = None,
               cutoff: float = EIGENVALUE_CUTOFF, regularisation: float = REGULARISATION,
               diagonal: Literal["draws", "scores"] = "draws") -> Metric:
    """The metric of ``kind`` from a warm-up window's draws and the potential's gradients at them.

    ``diagonal`` is the within-chain variance of the draws (Stan's). ``low_rank`` and ``dense`` modify a diagonal
    (the same, or nutpie's from the scores) by the geometric mean of the draws' and gradients' covariances in their
    span (module docstring): ``low_rank`` keeps its eigenvalues beyond ``cutoff`` (at most ``rank``, the farthest
    from 1 first), ``dense`` keeps them all. Each chain is centred on its own mean.

    :param draws: positions ``[n, chains, D]``.
    :param grads: the potential's gradients at them (of -log density; the sign does not matter) ``[n, chains, D]``;
        ``diagonal`` does not read them.
    :param kind: ``diagonal``, ``low_rank`` or ``dense``.
    :param rank: ``low_rank``: the most directions kept (None: every one beyond the cutoff).
    :param cutoff: ``low_rank``: the factor by which a direction's whitened variance must differ from 1 to be kept.
    :param regularisation: relative shrinkage of the projected covariances towards the diagonal's scale.
    :param diagonal: the diagonal under the modification: ``draws`` (the diagonal metric's variances) or ``scores``
        (nutpie's sqrt(Var[z] / Var[grad]) per coordinate).
    :returns: the metric, in the draws' dtype; its directions are not yet checked (see :func:`usable`).
    """
    if kind == "diagonal":
        return Metric(window_variance(draws))
    dim = draws.shape[-1]
    x = (draws - draws.mean(0)).double().reshape(-1, dim)
    g = (grads - grads.mean(0)).double().reshape(-1, dim)
    rows = x.shape[0]
    variance = window_variance(draws).double() if diagonal == "draws" else (x.pow(2).sum(0) / g.pow(2).sum(0)).sqrt()
    std = variance.sqrt()
    x, g = x / std, g * std  # in these units the diagonal metric is the identity
    span = torch.cat([torch.linalg.svd(x.T, full_matrices=False)[0], torch.linalg.svd(g.T, full_matrices=False)[0]],
                     dim=1)
    basis = torch.linalg.qr(span)[0]  # [D, q], q <= D
    shrink = regularisation * rows * rows  # the covariances below are sums over rows, in units of the sample's / rows
    identity = torch.eye(basis.shape[1], dtype=x.dtype, device=x.device)
    cov_x = (x @ basis).T @ (x @ basis) / shrink + identity
    cov_g = (g @ basis).T @ (g @ basis) / shrink + identity
    values, vectors = torch.linalg.eigh(_geometric_mean(cov_x, cov_g))
    distance = values.clamp(min=1e-300).log().abs()
    order = torch.argsort(distance, descending=True)
    keep = order[distance[order] > (math.log(cutoff) if kind == "low_rank" else 0.0)]
    if kind == "low_rank" and rank is not None:
        keep = keep[:rank]
    return Metric(variance.to(draws.dtype), (basis @ vectors[:, keep]).to(draws.dtype), values[keep].to(draws.dtype))


def usable(metric: Metric) -> bool:
    """Whether a fitted metric is finite and positive definite (else the sampler keeps a diagonal).

    :param metric: a fitted metric.
    :returns: True when it can be used.
    """
    tensors = (metric.variance, metric.basis, metric.eigen)
    return all(bool(torch.isfinite(t).all()) for t in tensors) and bool((metric.variance > 0).all()) \
        and bool((metric.eigen > 0).all())
