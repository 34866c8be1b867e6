"""Weight priors against closed forms: KL to a Normal guide, the scale mixture's density and moments, shapes."""

from __future__ import annotations

import math

import numpy as np
import pyro.distributions as dist
import pytest
import torch
from scipy import stats
from torch.distributions import kl_divergence

from zoo.priors import ScaleMixtureNormal, prior_distribution
from zoo.spec import CauchyPrior, LaplacePrior, NormalPrior, ScaleMixturePrior

SHAPE = torch.Size([3, 4])


def _normal_guide(shape: torch.Size, seed: int = 0) -> dist.TorchDistribution:
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(shape, generator=g, dtype=torch.float64)
    scale = 0.05 + torch.rand(shape, generator=g, dtype=torch.float64)
    return dist.Normal(loc, scale).to_event(len(shape))


def test_kl_normal_guide_vs_normal_prior_is_the_closed_form():
    q = _normal_guide(SHAPE)
    p = prior_distribution(NormalPrior(loc=0.3, scale=1.7), SHAPE, dtype=torch.float64)
    m_q, s_q = q.base_dist.loc, q.base_dist.scale
    m_p, s_p = 0.3, 1.7
    expected = 0.5 * torch.sum(s_q**2 / s_p**2 + (m_q - m_p) ** 2 / s_p**2 - 1 - torch.log(s_q**2 / s_p**2))
    kl = kl_divergence(q, p)
    assert kl.shape == torch.Size([])  # one number for the whole site
    assert torch.allclose(kl, expected, rtol=1e-12, atol=1e-12)


def test_kl_normal_guide_vs_laplace_prior_is_analytic_and_matches_monte_carlo():
    q = _normal_guide(torch.Size([5]), seed=1)
    p = prior_distribution(LaplacePrior(name="laplace", loc=0.1, scale=0.8), torch.Size([5]), dtype=torch.float64)
    kl = kl_divergence(q, p)
    torch.manual_seed(0)
    w = q.sample((200_000,))
    mc = (q.log_prob(w) - p.log_prob(w)).mean()
    assert abs(float(kl - mc)) < 0.02


def test_kl_normal_guide_vs_cauchy_or_mixture_prior_has_no_closed_form():
    q = _normal_guide(SHAPE)
    for cfg in (CauchyPrior(name="cauchy"), ScaleMixturePrior(name="scale_mixture")):
        with pytest.raises(NotImplementedError):
            kl_divergence(q, prior_distribution(cfg, SHAPE, dtype=torch.float64))


@pytest.mark.parametrize(("pi", "s1", "s2"), [(0.5, 1.0, math.exp(-6)), (0.25, 2.0, 0.3), (0.9, 0.1, 3.0)])
def test_scale_mixture_log_prob_matches_scipy(pi, s1, s2):
    x = np.array([-7.0, -2.5, -0.4, -1e-3, 0.0, 1e-3, 0.2, 1.0, 3.3, 12.0])
    expected = np.log(pi * stats.norm.pdf(x, 0, s1) + (1 - pi) * stats.norm.pdf(x, 0, s2))
    # far in the tails the narrow component underflows in pdf space: compare in log space there via logsumexp
    expected_stable = np.logaddexp(np.log(pi) + stats.norm.logpdf(x, 0, s1),
                                   np.log1p(-pi) + stats.norm.logpdf(x, 0, s2))
    finite = np.isfinite(expected)
    assert np.allclose(expected[finite], expected_stable[finite], rtol=1e-10)
    d = ScaleMixtureNormal(torch.tensor(pi, dtype=torch.float64), torch.tensor(s1, dtype=torch.float64),
                           torch.tensor(s2, dtype=torch.float64))
    got = d.log_prob(torch.tensor(x, dtype=torch.float64)).numpy()
    assert np.allclose(got, expected_stable, rtol=1e-10, atol=1e-10)


def test_scale_mixture_prior_distribution_sums_the_site():
    cfg = ScaleMixturePrior(name="scale_mixture", pi=0.3, sigma1=1.5, sigma2=0.05)
    p = prior_distribution(cfg, SHAPE, dtype=torch.float64)
    assert p.event_shape == SHAPE and p.batch_shape == torch.Size([])
    w = torch.linspace(-2, 2, SHAPE.numel(), dtype=torch.float64).reshape(SHAPE)
    per_elem = np.logaddexp(np.log(0.3) + stats.norm.logpdf(w.numpy(), 0, 1.5),
                            np.log(0.7) + stats.norm.logpdf(w.numpy(), 0, 0.05))
    assert math.isclose(float(p.log_prob(w)), float(per_elem.sum()), rel_tol=1e-10)


@pytest.mark.parametrize(("pi", "s1", "s2"), [(0.5, 1.0, 0.0025), (0.2, 2.0, 0.5)])
def test_scale_mixture_sample_moments(pi, s1, s2):
    d = ScaleMixtureNormal(torch.tensor(pi), torch.tensor(s1), torch.tensor(s2), torch.Size([200, 500]))
    torch.manual_seed(0)
    w = d.sample().double()
    assert w.shape == (200, 500)
    var = pi * s1**2 + (1 - pi) * s2**2
    assert abs(float(w.mean())) < 4 * math.sqrt(var / w.numel())
    assert float(w.var()) == pytest.approx(var, rel=0.03)
    # the share of draws from the wide component shows in the share of |w| beyond the narrow one's reach
    wide = float((w.abs() > 6 * s2).double().mean()) if s1 > 6 * s2 else None
    if wide is not None:
        expected_wide = pi * 2 * stats.norm.sf(6 * s2 / s1)
        assert wide == pytest.approx(expected_wide, abs=0.01)
    # the distribution's own moments say the same
    assert torch.allclose(d.variance, torch.full((200, 500), var))
    assert torch.equal(d.mean, torch.zeros(200, 500))


def test_scale_mixture_sample_shape_and_seeding():
    d = prior_distribution(ScaleMixturePrior(name="scale_mixture"), SHAPE)
    torch.manual_seed(5)
    a = d.sample((7,))
    torch.manual_seed(5)
    b = d.sample((7,))
    assert a.shape == (7, *SHAPE) and torch.equal(a, b)


def test_laplace_prior_log_density_and_shape():
    p = prior_distribution(LaplacePrior(name="laplace", loc=0.5, scale=0.3), SHAPE, dtype=torch.float64)
    assert p.event_shape == SHAPE and p.batch_shape == torch.Size([])
    w = torch.linspace(-3, 3, SHAPE.numel(), dtype=torch.float64).reshape(SHAPE)
    expected = stats.laplace.logpdf(w.numpy(), loc=0.5, scale=0.3).sum()
    assert math.isclose(float(p.log_prob(w)), float(expected), rel_tol=1e-12)


def test_cauchy_prior_log_density_and_shape():
    p = prior_distribution(CauchyPrior(name="cauchy", loc=-0.2, scale=2.5), SHAPE, dtype=torch.float64)
    assert p.event_shape == SHAPE and p.batch_shape == torch.Size([])
    w = torch.linspace(-30, 30, SHAPE.numel(), dtype=torch.float64).reshape(SHAPE)
    expected = stats.cauchy.logpdf(w.numpy(), loc=-0.2, scale=2.5).sum()
    assert math.isclose(float(p.log_prob(w)), float(expected), rel_tol=1e-12)


def test_normal_prior_log_density():
    p = prior_distribution(NormalPrior(loc=1.0, scale=0.5), SHAPE, dtype=torch.float64)
    w = torch.linspace(-1, 3, SHAPE.numel(), dtype=torch.float64).reshape(SHAPE)
    assert math.isclose(float(p.log_prob(w)), float(stats.norm.logpdf(w.numpy(), 1.0, 0.5).sum()), rel_tol=1e-12)


@pytest.mark.parametrize("cfg", [NormalPrior(), LaplacePrior(name="laplace"), CauchyPrior(name="cauchy"),
                                 ScaleMixturePrior(name="scale_mixture")])
@pytest.mark.parametrize("shape", [torch.Size([5]), torch.Size([4, 3]), torch.Size([2, 3, 4])])
def test_prior_event_shape_is_the_site_shape(cfg, shape):
    p = prior_distribution(cfg, shape)
    assert p.event_shape == shape and p.batch_shape == torch.Size([])
    w = p.sample()
    assert w.shape == shape and w.dtype == torch.float32
    assert p.log_prob(w).shape == torch.Size([])


@pytest.mark.parametrize("cfg", [NormalPrior(), LaplacePrior(name="laplace"), CauchyPrior(name="cauchy"),
                                 ScaleMixturePrior(name="scale_mixture")])
def test_prior_dtype_follows_the_request(cfg):
    p = prior_distribution(cfg, torch.Size([2]), dtype=torch.float64)
    assert p.sample().dtype == torch.float64
    assert p.log_prob(torch.zeros(2, dtype=torch.float64)).dtype == torch.float64
