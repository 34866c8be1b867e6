"""The many-chain HMC's metric (zoo.inference.metric): its algebra, its estimate from draws and gradients against
closed forms, its checks in the spec, and what it does for the sampler on a stiff Gaussian."""

from __future__ import annotations

import math

import pytest
import torch

from tests.test_mcmc import linear_spec
from zoo.errors import ZooInputError
from zoo.inference import mcmc
from zoo.inference.mcmc import MCMC
from zoo.inference.metric import Metric, fit_metric, usable, window_variance
from zoo.pipeline import prepare
from zoo.spec import load_spec

DOUBLE = torch.float64


def spiked(dim: int = 8, seed: int = 0, eigen: tuple[float, ...] = (1e4, 1e-3)) -> Metric:
    """A covariance of the metric's own form: a diagonal modified along two tilted directions, by default one 10^4
    times wider and one 10^3 times narrower than the diagonal says."""
    gen = torch.Generator().manual_seed(seed)
    variance = torch.rand(dim, generator=gen, dtype=DOUBLE) + 0.5
    basis = torch.linalg.qr(torch.randn(dim, 2, generator=gen, dtype=DOUBLE))[0]
    return Metric(variance, basis, torch.tensor(eigen, dtype=DOUBLE))


def gaussian_window(cov: torch.Tensor, draws: int = 50, chains: int = 3, seed: int = 1):
    """Draws ``[draws, chains, D]`` of N(mu_c, cov), each chain about its own mean, and the potential's gradients
    cov^-1 (z - mu_c) there."""
    gen = torch.Generator().manual_seed(seed)
    dim = len(cov)
    means = 10.0 * torch.randn(1, chains, dim, generator=gen, dtype=DOUBLE)  # chains far apart: within-chain
    noise = torch.randn(draws, chains, dim, generator=gen, dtype=DOUBLE)
    centred = noise @ torch.linalg.cholesky(cov).T
    return means + centred, centred @ torch.linalg.inv(cov)


def condition(metric: Metric, cov: torch.Tensor) -> float:
    """The condition number of ``cov`` whitened by ``metric``: what sets the leapfrog steps per draw."""
    values = torch.linalg.eigvalsh(metric.whiten(metric.whiten(cov).T))
    return float(values.max() / values.min())


def test_the_metric_factor_squares_to_its_covariance_and_whitening_undoes_it():
    metric = spiked()
    eye = torch.eye(8, dtype=DOUBLE)
    factor = metric.scale(eye).T  # L, column by column
    torch.testing.assert_close(factor @ factor.T, metric.covariance())
    torch.testing.assert_close(metric.scale_transposed(eye), factor)  # rows L^T e_i: L^T's columns are L's rows
    v = torch.randn(5, 8, dtype=DOUBLE)
    torch.testing.assert_close(metric.whiten(metric.scale(v)), v)
    # the covariance is S (I + U (diag(lam) - I) U^T) S, written out
    s = metric.variance.sqrt()
    inner = eye + metric.basis @ torch.diag(metric.eigen - 1) @ metric.basis.T
    torch.testing.assert_close(metric.covariance(), s[:, None] * inner * s[None, :])
    # without directions it is the diagonal metric: L = S
    diagonal = Metric(metric.variance)
    assert diagonal.rank == 0 and diagonal.describe() == "diagonal"
    torch.testing.assert_close(diagonal.scale(v), v * s)
    assert Metric(**metric.state_dict()).covariance().equal(metric.covariance())


def test_dense_fit_from_draws_and_gradients_is_a_gaussians_covariance_from_few_draws():
    # the geometric mean of Cov[z] and Cov[grad]^-1 is Sigma itself for a Gaussian (grad = Sigma^-1 (z - mu)), from
    # 20 draws a chain in 6 dimensions, where the draws' own covariance is off by tens of percent
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(6, 6, generator=gen, dtype=DOUBLE)
    cov = a @ a.T + 0.1 * torch.eye(6, dtype=DOUBLE)
    draws, grads = gaussian_window(cov, draws=20)
    fitted = fit_metric(draws, grads, "dense", regularisation=1e-12)
    torch.testing.assert_close(fitted.covariance(), cov, rtol=1e-6, atol=1e-8)
    sample = torch.cov((draws - draws.mean(0)).reshape(-1, 6).T)
    assert float((sample - cov).norm() / cov.norm()) > 0.05  # what the draws alone would have given


def test_low_rank_fit_whitens_a_stiff_gaussian_and_keeps_only_the_directions_beyond_the_cutoff():
    # two stiff directions, as a learned low noise makes them: the draws' variances are the bulk's
    cov = spiked(eigen=(1e-4, 1e-3)).covariance()
    draws, grads = gaussian_window(cov)
    diagonal, low_rank = fit_metric(draws), fit_metric(draws, grads, "low_rank")
    assert condition(diagonal, cov) > 1e3  # a diagonal cannot express the two tilted directions ...
    assert condition(low_rank, cov) < 10  # ... the low-rank modification can
    assert low_rank.rank == 2 and usable(low_rank)
    assert float(low_rank.eigen.max()) < 0.01  # both narrower than the draws' own variances say
    # nutpie's diagonal from the scores, sqrt(Var z / Var grad), is pulled down by the stiff directions, and one of
    # them no longer stands out beyond the cutoff
    scores = fit_metric(draws, grads, "low_rank", diagonal="scores")
    assert scores.rank < 2 and condition(scores, cov) > 100 * condition(low_rank, cov)
    one = fit_metric(draws, grads, "low_rank", rank=1)  # the cap keeps the direction farthest from the diagonal
    assert one.rank == 1 and float(one.eigen[0]) == pytest.approx(float(low_rank.eigen.min()))
    # on a Gaussian with independent coordinates nothing is beyond the cutoff: the low-rank metric is the diagonal one
    variance = torch.linspace(0.01, 100.0, 8, dtype=DOUBLE)
    draws, grads = gaussian_window(torch.diag(variance))
    independent = fit_metric(draws, grads, "low_rank")
    assert independent.rank == 0
    torch.testing.assert_close(independent.variance, fit_metric(draws).variance)


def test_the_diagonal_fit_is_stans_within_chain_variance():
    draws, _ = gaussian_window(torch.diag(torch.tensor([0.5, 2.0], dtype=DOUBLE)), draws=30)
    n = 30
    pooled = ((draws - draws.mean(0)) ** 2).sum(0).mean(0) / (n - 1)
    torch.testing.assert_close(fit_metric(draws).variance, pooled * n / (n + 5) + 1e-3 * 5 / (n + 5))
    assert window_variance(draws).equal(fit_metric(draws).variance)


def test_metric_settings_are_checked_with_the_fix():
    for settings, message in [
        ({"method": "nuts", "metric": "low_rank"}, "metric 'low_rank' is an option of the many-chain method 'hmc'"),
        ({"method": "hmc", "metric_rank": 4}, "metric_rank is a setting of inference.metric: low_rank"),
        ({"method": "hmc", "metric": "dense", "metric_rank": 4}, "not of 'dense'"),
        ({"method": "hmc", "metric": "low_rank", "adapt_mass_matrix": False}, "drop one of the two"),
        ({"method": "hmc", "metric": "low_rank", "metric_rank": 0}, "metric_rank"),
        ({"method": "hmc", "metric": "low_rank", "metric_rank": -3}, "metric_rank"),
        ({"method": "hmc", "metric": "low_rank", "metric_rank": 10**9}, "metric_rank"),
        ({"method": "hmc", "metric": "cholesky"}, "metric"),
    ]:
        method = settings.pop("method")
        with pytest.raises(ZooInputError, match=message):
            load_spec(linear_spec(method, **settings))
    # a rank beyond the model's dimension (2 here: w and b) is refused before sampling
    spec = load_spec(linear_spec("hmc", num_chains=2, warmup_steps=4, num_samples=2, metric="low_rank",
                                 metric_rank=3))
    data, family, guide, _ = prepare(spec)
    with pytest.raises(ZooInputError, match=r"inference.metric_rank <= 2"):
        MCMC().fit(family, guide, data, spec.inference, 0, progress=False)


def test_a_metric_that_is_not_positive_definite_falls_back_to_the_diagonal_with_a_log_line(monkeypatch):
    spec = load_spec(linear_spec("hmc", num_chains=4, warmup_steps=20, num_samples=2, metric="low_rank"))
    data, family, guide, _ = prepare(spec)

    def broken(draws, grads=None, kind="diagonal", rank=None):
        if kind == "diagonal":
            return Metric(window_variance(draws))
        return Metric(torch.ones(draws.shape[-1], dtype=draws.dtype), torch.eye(draws.shape[-1], 1, dtype=draws.dtype),
                      torch.tensor([-1.0], dtype=draws.dtype))

    monkeypatch.setattr(mcmc, "fit_metric", broken)
    lines: list[str] = []
    potential = mcmc.Potential(family, data)
    z0 = torch.zeros(4, 2, dtype=torch.float64)
    sampler = mcmc.ManyChainHMC(potential, z0, spec.inference, torch.Generator().manual_seed(0), log=lines.append)
    for _ in range(20):
        sampler.step(warmup=True)
    assert sampler.metric.rank == 0 and usable(sampler.metric)
    assert any("not positive definite" in line and "diagonal" in line for line in lines), lines


class StiffGaussian:
    """The potential of N(0, Sigma) in 10 dimensions, Sigma the identity except along one tilted direction whose
    variance is 10^-4: the shape a learned low noise gives a BNN's posterior (one stiff combination of weights)."""

    def __init__(self, dim: int = 10) -> None:
        direction = torch.ones(dim, dtype=DOUBLE) / math.sqrt(dim)
        self.precision = torch.eye(dim, dtype=DOUBLE) + (1e4 - 1) * torch.outer(direction, direction)
        self.evaluations = 0

    def value_and_grad(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.evaluations += 1
        grad = z @ self.precision
        return 0.5 * (grad * z).sum(-1), grad


@pytest.mark.parametrize("metric", ["diagonal", "low_rank"])
def test_on_a_stiff_gaussian_the_low_rank_metric_takes_steps_the_diagonal_cannot(metric):
    spec = load_spec(linear_spec("hmc", num_chains=16, warmup_steps=150, num_samples=1, metric=metric,
                                 trajectory_criterion="weights"))
    potential = StiffGaussian()
    z0 = 0.01 * torch.randn(16, 10, generator=torch.Generator().manual_seed(0), dtype=DOUBLE)
    sampler = mcmc.ManyChainHMC(potential, z0, spec.inference, torch.Generator().manual_seed(1))
    for _ in range(150):
        sampler.step(warmup=True)
    whitened = condition(sampler.metric, torch.linalg.inv(potential.precision))
    steps = sampler.trajectory / sampler.step_size
    if metric == "diagonal":  # the step is set by the stiff direction, the length by the wide ones
        assert whitened > 1000 and steps > 50
    else:  # whitened, the target is near N(0, I): a few steps a draw
        assert whitened < 20 and steps < 10, (whitened, steps)
