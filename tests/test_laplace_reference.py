"""The two subnetwork-GLM-Laplace references of tests/laplace_reference.py checked against closed forms and
against each other (relative difference <= 1e-4), so that the zoo's own implementation can be tested on them."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from .laplace_reference import dense_glm, laplace_torch_glm, relative_difference, require_laplace

TOL = 1e-4


def _rel_diag(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest elementwise relative difference of the (positive) variances on the output diagonal."""
    da, db = a.diagonal(dim1=-2, dim2=-1), b.diagonal(dim1=-2, dim2=-1)
    return ((da - db).abs() / db).max().item()


def _subnet(net: nn.Module, size: int, seed: int) -> torch.Tensor:
    """`size` random indices into parameters_to_vector(net.parameters()), at least one in every tensor."""
    sizes = [p.numel() for p in net.parameters()]
    offsets = torch.tensor([0, *sizes]).cumsum(0)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(100):
        idx = torch.randperm(sum(sizes), generator=gen)[:size]
        if all(((idx >= lo) & (idx < hi)).any() for lo, hi in zip(offsets[:-1], offsets[1:], strict=True)):
            return idx
    raise AssertionError("no subnet touching every parameter tensor")


@pytest.fixture(scope="module")
def regression():
    """A 1-20-1 tanh MLP fitted briefly (float64) to 60 noisy points of a sine, with test inputs past the data."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(60, 1, generator=gen, dtype=torch.float64) * 4 - 2
    y = torch.sin(2 * x) + 0.1 * torch.randn(60, 1, generator=gen, dtype=torch.float64)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(1, 20), nn.Tanh(), nn.Linear(20, 1)).double()
    opt = torch.optim.Adam(net.parameters(), lr=0.02)
    for _ in range(300):
        opt.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    x_test = torch.linspace(-4, 4, 25, dtype=torch.float64)[:, None]
    return net, _subnet(net, 30, seed=1), x, y, x_test


def _classification(n_classes: int):
    """A 2-8-K tanh MLP fitted briefly (float64) to K Gaussian blobs."""
    gen = torch.Generator().manual_seed(n_classes)
    centres = 2.0 * torch.randn(n_classes, 2, generator=gen, dtype=torch.float64)
    y = torch.arange(n_classes).repeat_interleave(20)
    x = centres[y] + torch.randn(len(y), 2, generator=gen, dtype=torch.float64)
    torch.manual_seed(n_classes)
    net = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, n_classes)).double()
    opt = torch.optim.Adam(net.parameters(), lr=0.02)
    for _ in range(200):
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    x_test = 3.0 * torch.randn(15, 2, generator=gen, dtype=torch.float64)
    return net, _subnet(net, 20, seed=2), x, y, x_test


# ---------------------------------------------------------------- the dense reference against closed forms


def test_dense_is_bayesian_linear_regression_for_a_linear_net():
    """For f = Wx + b the GLM is exact: with features [x, 1] (weight row-major, then bias) and the other
    weights fixed, Σ = (Φ_Sᵀ Φ_S / σ² + diag λ)⁻¹ and var* = φ*_S Σ φ*_Sᵀ, written here without torch.func."""
    gen = torch.Generator().manual_seed(3)
    net = nn.Linear(3, 1).double()
    x = torch.randn(40, 3, generator=gen, dtype=torch.float64)
    y = torch.randn(40, 1, generator=gen, dtype=torch.float64)
    x_test = torch.randn(7, 3, generator=gen, dtype=torch.float64)
    idx = torch.tensor([3, 0, 2])  # bias, w0, w2 (any order)
    prec = torch.tensor([0.5, 2.0, 1.5], dtype=torch.float64)
    sigma = 0.3
    got = dense_glm(net, idx, x, y, x_test, "regression", prec, sigma)
    phi, phi_test = torch.cat([x, torch.ones(40, 1)], 1)[:, idx], torch.cat([x_test, torch.ones(7, 1)], 1)[:, idx]
    cov = torch.linalg.inv(phi.T @ phi / sigma**2 + torch.diag(prec))
    want = torch.einsum("np,pq,nq->n", phi_test, cov, phi_test)
    assert got.mean.shape == (7, 1) and got.var.shape == (7, 1, 1) and got.probs is None
    assert relative_difference(got.mean, net(x_test).detach()) < 1e-12
    assert relative_difference(got.var[:, 0, 0], want) < 1e-10


def test_dense_is_the_softmax_ggn_for_a_linear_classifier():
    """For logits Wx + b, J_n = [I_K ⊗ x_nᵀ, I_K]; GGN = Σ J_nᵀ (diag p − p pᵀ) J_n built by hand."""
    gen = torch.Generator().manual_seed(4)
    net = nn.Linear(2, 3).double()
    x = torch.randn(30, 2, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (30,), generator=gen)
    x_test = torch.randn(5, 2, generator=gen, dtype=torch.float64)
    idx = torch.tensor([8, 1, 4, 6, 2])
    got = dense_glm(net, idx, x, y, x_test, "classification", 0.7, 1.0)

    def jac(xs):
        eye = torch.eye(3, dtype=torch.float64)
        return torch.stack([torch.cat([torch.kron(eye, xn[None, :]), eye], 1) for xn in xs])[:, :, idx]

    with torch.no_grad():
        p = torch.softmax(net(x), -1)
        f_test = net(x_test)
    lam = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    j = jac(x)
    cov = torch.linalg.inv(sum(j[n].T @ lam[n] @ j[n] for n in range(30)) + 0.7 * torch.eye(5, dtype=torch.float64))
    j_test = jac(x_test)
    want = j_test @ cov @ j_test.transpose(1, 2)
    probs = torch.softmax(f_test / torch.sqrt(1 + math.pi / 8 * want.diagonal(dim1=1, dim2=2)), -1)
    assert relative_difference(got.var, want) < 1e-10
    assert relative_difference(got.probs, probs) < 1e-10
    assert torch.allclose(got.probs.sum(-1), torch.ones(5, dtype=torch.float64))


def test_dense_tolerance_separates_wrong_answers(regression):
    """The 1e-4 comparison is not vacuous: the variance is far from zero, grows off the data, is invariant to
    the order of the indices, and a different subnet or noise level moves it by far more than the tolerance."""
    net, idx, x, y, x_test = regression
    ref = dense_glm(net, idx, x, y, x_test, "regression", 1.0, 0.1)
    var = ref.var[:, 0, 0]
    assert var[0] > 10 * var[12] > 0  # x = -4 (off the data) versus x = 0
    assert relative_difference(dense_glm(net, idx.flip(0), x, y, x_test, "regression", 1.0, 0.1).var, ref.var) < 1e-10
    other = _subnet(net, 30, seed=5)
    assert _rel_diag(dense_glm(net, other, x, y, x_test, "regression", 1.0, 0.1).var, ref.var) > 100 * TOL
    assert _rel_diag(dense_glm(net, idx, x, y, x_test, "regression", 1.0, 0.11).var, ref.var) > 100 * TOL


# ---------------------------------------------------------------- laplace-torch against the dense reference


@pytest.mark.parametrize("prior", ["scalar", "per_element"])
def test_laplace_torch_matches_dense_regression(regression, prior):
    require_laplace()
    net, idx, x, y, x_test = regression
    prec = 0.5 if prior == "scalar" else torch.linspace(0.2, 3.0, idx.numel(), dtype=torch.float64)
    before = [p.detach().clone() for p in net.parameters()]
    lt = laplace_torch_glm(net, idx, x, y, x_test, "regression", prec, 0.1)
    ref = dense_glm(net, idx, x, y, x_test, "regression", prec, 0.1)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))  # MAP untouched
    assert lt.mean.shape == ref.mean.shape == (25, 1) and lt.var.shape == ref.var.shape == (25, 1, 1)
    assert lt.probs is None and ref.probs is None
    assert relative_difference(lt.mean, ref.mean) < TOL
    assert _rel_diag(lt.var, ref.var) < TOL


@pytest.mark.parametrize("n_classes", [2, 3])
def test_laplace_torch_matches_dense_classification(n_classes):
    require_laplace()
    net, idx, x, y, x_test = _classification(n_classes)
    lt = laplace_torch_glm(net, idx, x, y, x_test, "classification", 2.0, 1.0)
    ref = dense_glm(net, idx, x, y, x_test, "classification", 2.0, 1.0)
    assert lt.var.shape == ref.var.shape == (15, n_classes, n_classes)
    assert relative_difference(lt.mean, ref.mean) < TOL
    assert _rel_diag(lt.var, ref.var) < TOL
    assert relative_difference(lt.var, ref.var) < TOL  # the off-diagonal (between-class) covariances too
    assert relative_difference(lt.probs, ref.probs) < TOL
    assert ((lt.probs - ref.probs).abs() / ref.probs).max() < TOL
    assert (ref.probs - torch.softmax(ref.mean, -1)).abs().max() > 100 * TOL  # probit actually moved them


def test_classification_refuses_a_noise_level():
    net, idx, x, y, x_test = _classification(2)
    with pytest.raises(ValueError, match="sigma_noise"):
        dense_glm(net, idx, x, y, x_test, "classification", 1.0, 0.5)
