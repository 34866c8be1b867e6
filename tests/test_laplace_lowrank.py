"""The low-rank Laplace (``guide.covariance: lowrank``): its GGN-vector products and eigenpairs against the dense
GGN, its Gaussian against the dense (Λ + U E Uᵀ)⁻¹, its evidence and predictive against the full covariance at a
rank of every weight, the empirical Fisher, and its refusals. (laplace-torch's low-rank Laplace needs a backend that
is not on PyPI, asdfghjkl, so it is not a peer here.)"""

from __future__ import annotations

import pytest
import torch

from guides.laplace import LowRankNormal
from tests.test_laplace_diagonal import NETS
from tests.test_subnetwork import MOONS, TOY, _fitted
from zoo.curvature import LowRankScale
from zoo.errors import ZooInputError
from zoo.inference.laplace import LowRankStatistics
from zoo.models.subnetwork import SITE

LOW_RANK = ("guide.covariance=lowrank", "model.selection.strategy=all")


def _dense_ggn(family, x: torch.Tensor, noise, y: torch.Tensor | None = None) -> torch.Tensor:
    f, J = family.linearise(x)
    return J.ggn(family._curvature_root(f, noise, y)).double()


@pytest.mark.parametrize("base", ["toy", "moons"])
def test_curvature_products_and_eigenpairs_are_the_dense_ggn_s(base, tmp_path):
    """G v by forward- and reverse-mode products equals the dense GGN's (GGN and empirical Fisher); the fit keeps
    the GGN's leading eigenpairs (rank 5 of 31 weights) and the posterior is (Λ + U E Uᵀ)⁻¹ of them."""
    _, data, posterior = _fitted(TOY if base == "toy" else MOONS, tmp_path, *LOW_RANK, "guide.rank=5")
    family = posterior.family
    noise = family.likelihood.fixed_noise
    x, y = data.x_train, data.y_train
    dense = _dense_ggn(family, x, noise)
    size = dense.shape[0]
    vectors = torch.randn(3, size, dtype=x.dtype)
    _, product = family.curvature_times(x, vectors, noise)
    torch.testing.assert_close(product.double(), vectors.double() @ dense, rtol=1e-4, atol=1e-4)
    _, fisher_product = family.curvature_times(x, vectors, noise, y)
    torch.testing.assert_close(fisher_product.double(), vectors.double() @ _dense_ggn(family, x, noise, y),
                               rtol=1e-4, atol=1e-4)

    scale = posterior.guide.low_rank_scale(SITE)
    assert scale.basis.shape == (size, 5)
    top = torch.linalg.eigvalsh(dense).flip(0)[:5]
    precision = family.prior_precision.double()
    # the posterior precision Λ + U E Uᵀ: its eigenvalues along the basis, Λ elsewhere (one precision per layer here)
    covariance = torch.diag(scale.prior_scale.double()) @ (torch.eye(size, dtype=torch.float64) + scale.basis.double()
                                                           @ torch.diag(scale.covariance_weights().double())
                                                           @ scale.basis.double().T) @ torch.diag(
        scale.prior_scale.double())
    curvature = torch.linalg.inv(covariance) - torch.diag(precision)
    found = torch.linalg.eigvalsh(0.5 * (curvature + curvature.T)).flip(0)[:5]
    torch.testing.assert_close(found, top, rtol=2e-3, atol=1e-4 * float(top[0]))
    assert float(torch.linalg.eigvalsh(0.5 * (curvature + curvature.T))[0]) > -1e-4 * float(top[0])


def test_the_distribution_is_the_dense_gaussian():
    torch.manual_seed(1)
    size, rank = 9, 3
    basis = torch.linalg.qr(torch.randn(size, rank, dtype=torch.float64)).Q
    scale = LowRankScale(torch.rand(size, dtype=torch.float64) + 0.5, basis,
                         torch.tensor([-0.9, -0.5, 0.0], dtype=torch.float64))
    root = torch.diag(scale.prior_scale) @ (torch.eye(size, dtype=torch.float64)
                                            + basis @ torch.diag(scale.shrink) @ basis.T)
    loc = torch.randn(size, dtype=torch.float64)
    q, dense = LowRankNormal(loc, scale), torch.distributions.MultivariateNormal(loc, scale_tril=None,
                                                                               covariance_matrix=root @ root.T)
    values = torch.randn(4, size, dtype=torch.float64)
    torch.testing.assert_close(q.log_prob(values), dense.log_prob(values))
    torch.testing.assert_close(q.variance, dense.variance)
    draws = q.sample(torch.Size([200_000]))
    torch.testing.assert_close(torch.cov(draws.T), root @ root.T, atol=2e-2, rtol=0)


def test_a_rank_of_every_weight_is_the_full_laplace(tmp_path):
    """With the rank at the number of weights, the low-rank Laplace is the full one: the same tuned precisions,
    evidence and predictive (the evidence at the MAP for both)."""
    full = _fitted(MOONS, tmp_path / "full", "model.selection.strategy=all", "inference.tune=true",
                   "inference.evidence_at=map")
    size = len(full[2].family.indices)
    low = _fitted(MOONS, tmp_path / "low", *LOW_RANK, f"guide.rank={size}", "inference.tune=true")
    (_, data, full_posterior), (_, _, low_posterior) = full, low
    torch.testing.assert_close(low_posterior.family.prior_precision, full_posterior.family.prior_precision,
                               rtol=1e-3, atol=0)
    mean, cov = low_posterior.glm_moments(data.x_test)
    want_mean, want_cov = full_posterior.glm_moments(data.x_test)
    torch.testing.assert_close(mean, want_mean)
    torch.testing.assert_close(cov, want_cov, rtol=2e-3, atol=1e-5)


def test_the_evidence_is_the_dense_closed_form():
    """log p(y | f) - ½ θᵀΛθ + ½ log|Λ| - ½ log|Λ + U E Uᵀ| by the determinant lemma, per-element precisions."""
    torch.manual_seed(2)
    size, rank = 12, 4
    basis = torch.linalg.qr(torch.randn(size, rank, dtype=torch.float64)).Q
    eigenvalues = torch.tensor([9.0, 4.0, 1.0, 0.2], dtype=torch.float64)
    precision, centre = torch.rand(size, dtype=torch.float64) + 0.1, torch.randn(size, dtype=torch.float64)
    stats = LowRankStatistics(eigenvalues=eigenvalues, basis=basis, log_likelihood=torch.tensor(-3.0).double(),
                              sum_squares=None, n=10)
    posterior = torch.diag(precision) + basis @ torch.diag(eigenvalues) @ basis.T
    want = (-3.0 - 0.5 * (precision * centre**2).sum() + 0.5 * precision.log().sum()
            - 0.5 * torch.logdet(posterior))
    torch.testing.assert_close(stats.evidence(precision, centre, None), want)
    scale = stats.posterior_scale(precision, None, temperature=2.0)
    q = LowRankNormal(centre, scale)
    torch.testing.assert_close(q.variance, 2.0 * torch.linalg.inv(posterior).diagonal())


@pytest.mark.parametrize("kind", sorted(NETS))
def test_fits_nets_with_normalisation_layers(kind, tmp_path):
    """Every weight but the normalisation layers', GGN products through BatchNorm (at its running statistics) and
    LayerNorm: the outputs' covariance equals J Σ Jᵀ with the dense Jacobian and the guide's covariance."""
    import zoo

    torch.manual_seed(0)
    x = torch.randn(60, 16, generator=torch.Generator().manual_seed(0))
    y = x[:, :3].argmax(-1)
    bnn = zoo.BNN(NETS[kind](), member="last_layer_laplace", guide={"name": "laplace", "covariance": "lowrank",
                                                                        "rank": 8},
                  family={"family": "subnetwork", "map_from": "net", "selection": {"strategy": "all"}})
    bnn.fit((x[:40], y[:40]), val=(x[40:], y[40:]), progress=False)
    posterior, family = bnn.posterior, bnn.posterior.family
    scale = posterior.guide.low_rank_scale(SITE)
    root = torch.diag(scale.prior_scale) @ (torch.eye(len(scale.prior_scale)) + scale.basis @ torch.diag(
        scale.shrink) @ scale.basis.T)
    f, J = family.linearise(bnn.data.x_test[:5])
    J = J.dense()
    _, cov = posterior.glm_moments(bnn.data.x_test[:5])
    torch.testing.assert_close(cov, J @ root @ root.T @ J.transpose(1, 2), rtol=1e-4, atol=1e-6)


def test_refusals(tmp_path, monkeypatch):
    import zoo.runs

    with pytest.raises(ZooInputError, match="guide.rank"):
        _fitted(MOONS, tmp_path / "a", *LOW_RANK, "guide.rank=1000")
    with pytest.raises(ZooInputError, match="evidence at the MAP only"):
        _fitted(MOONS, tmp_path / "b", *LOW_RANK, "inference.evidence_at=linearised_mode")
    monkeypatch.setattr(zoo.runs, "available_memory", lambda: 2**20)  # the sketch and its products: 1.07 MB
    with pytest.raises(ZooInputError, match="a sketch of 110 directions over 202 weights"):
        _fitted(MOONS, tmp_path / "c", *LOW_RANK, "guide.rank=100", "net.hidden=[40]", "inference.predictive_samples=1")
