"""Pyro's autoguides on the zoo's families (``guide.name: auto``): the conjugate posterior, the density each scores
its draws with, checkpoints, isolation from Pyro's global parameter store, and the refusals."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine

from guides.auto import AutoGuide
from guides.base import ExactDrawMultivariateNormal
from guides.full_rank import FullRankGuide
from tests.test_mcmc import NOISE, closed_form, linear_spec
from zoo.diagnostics.checks import guide_log_density, pareto_k
from zoo.errors import ZooInputError
from zoo.inference.svi import SVI
from zoo.pipeline import load_run, prepare, train
from zoo.runs import CHECKPOINT_FILE, load_checkpoint
from zoo.sites import LatentSite
from zoo.spec import AutoGuideSpec, load_spec

FIT = {"num_steps": 1500, "batch_size": None, "optimizer": "clipped_adam", "lr": 0.03, "lr_decay": 0.997,
       "num_particles": 4}


def _auto(kind: str, **inference) -> dict:
    return {**linear_spec("svi", **{**FIT, **inference}), "guide": {"name": "auto", "auto": kind, "init_rho": -2.0}}


def _flat(values: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.stack([values["out.weight"].reshape(-1), values["out.bias"].reshape(-1)], dim=-1)


@pytest.mark.slow  # a long SVI fit to a closed form: ~45 s (make test-slow)
def test_the_full_covariance_autoguide_recovers_the_conjugate_posterior():
    spec = load_spec(_auto("mvn"))
    data, family, guide, _ = prepare(spec)
    SVI().fit(family, guide, data, spec.inference, spec.seed, progress=False)
    mean, cov = closed_form(data, NOISE / data.y_std)
    with torch.no_grad():
        draws = _flat({n: torch.stack([guide()[n] for _ in range(4000)]) for n in ("out.weight", "out.bias")})
    sd = cov.diagonal().sqrt()
    assert ((draws.mean(0).double() - mean).abs() / sd).max() < 0.1
    torch.testing.assert_close(torch.cov(draws.double().T), cov, rtol=0.1, atol=0.1 * float(sd.min()) ** 2)


@pytest.mark.slow  # a long SVI fit to a closed form: ~23 s (make test-slow)
def test_autonormal_finds_the_mean_field_optimum():
    # the best factorised Gaussian for N(m, S) has mean m and variances 1 / (S^-1)_ii
    spec = load_spec(_auto("normal"))
    data, family, guide, _ = prepare(spec)
    SVI().fit(family, guide, data, spec.inference, spec.seed, progress=False)
    mean, cov = closed_form(data, NOISE / data.y_std)
    want_sd = (1 / torch.linalg.inv(cov).diagonal()).sqrt()
    with torch.no_grad():
        draws = _flat({n: torch.stack([guide()[n] for _ in range(4000)]) for n in ("out.weight", "out.bias")})
    got_mean, got_sd = draws.mean(0).double(), draws.std(0).double()
    assert ((got_mean - mean).abs() / want_sd).max() < 0.1
    torch.testing.assert_close(got_sd, want_sd, rtol=0.1, atol=0.0)


@pytest.mark.parametrize("kind", ["mvn", "low_rank_mvn", "normal"])
def test_autoguides_score_their_draws_with_the_density_they_sampled_from(kind):
    # learned noise: a positive site, so the log|det| of its unconstrained coordinate matters. The trace's log-prob
    # sums the auxiliary draw's density and the site's log|det du/dw| (AutoNormal: per site); log_density sees only
    # the sites' values
    spec = load_spec({**_auto(kind), "likelihood": {"noise": "learned"}}, "guide.rank=2")  # of the 3 dimensions
    _, _, guide, _ = prepare(spec)
    with torch.no_grad():
        traces = [poutine.trace(guide).get_trace() for _ in range(5)]
    draws = {n: torch.stack([t.nodes[n]["value"] for t in traces]) for n in guide.sites}
    torch.testing.assert_close(guide.log_density(draws), torch.stack([t.log_prob_sum() for t in traces]))


def test_autonormal_on_the_rank1_family_trains_predicts_and_has_a_pareto_k(tmp_path):
    # its draws are the model's sites only (not AutoNormal's auxiliary <site>_unconstrained, which the rank-1 family
    # took for factors), and its density is defined: no site is a point mass
    spec = load_spec("configs/rank1_toy.yaml", ["guide:={name: auto, auto: normal}", "inference.num_steps=30",
                                                 "inference.predictive_samples=4"])
    summary = train(spec, tmp_path / "run", progress=False)
    assert torch.isfinite(torch.tensor(summary.metrics["test_ll"]))
    _, _, posterior = load_run(tmp_path / "run")
    draws = posterior.sample(3)
    assert set(draws) == set(posterior.family.latent_sites())
    log_q, point_mass, _ = guide_log_density(posterior.guide, draws)
    assert point_mass == [] and log_q.shape == (3,) and torch.isfinite(log_q).all()


def _ill_conditioned_factor(dim: int = 200, seed: int = 0) -> torch.Tensor:
    """0.01 x a unit lower-triangular matrix whose inverse has entries of about 5e7 (float64)."""
    generator = torch.Generator().manual_seed(seed)
    unit = torch.eye(dim, dtype=torch.float64) + (0.5 * torch.randn(dim, dim, generator=generator,
                                                                  dtype=torch.float64)).tril(-1)
    assert torch.linalg.inv(unit).abs().max() > 1e7
    return 0.01 * unit


def test_a_gaussian_scores_its_own_draw_from_its_noise_where_float32_solves_fail():
    factor = _ill_conditioned_factor()
    loc = torch.ones(len(factor), dtype=torch.float64)
    # float64: the noise path and torch's triangular solve agree, so the formula is torch's density
    q64 = ExactDrawMultivariateNormal(loc, scale_tril=factor)
    draw = q64.rsample()
    torch.testing.assert_close(q64.log_prob(draw), dist.MultivariateNormal(loc, scale_tril=factor).log_prob(draw),
                               rtol=1e-9, atol=1e-6)
    # float32: the same draw as torch's (one random stream) and the exact log q of the noise that made it
    q32 = ExactDrawMultivariateNormal(loc.float(), scale_tril=factor.float())
    torch.manual_seed(3)
    draw = q32.rsample()
    torch.manual_seed(3)
    noise = torch.empty(len(factor)).normal_().double()
    torch.manual_seed(3)
    torch.testing.assert_close(draw, dist.MultivariateNormal(loc.float(), scale_tril=factor.float()).rsample())
    exact = (-0.5 * (len(factor) * torch.log(torch.tensor(2 * torch.pi, dtype=torch.float64)) + noise.pow(2).sum())
             - factor.float().double().diagonal().log().sum())
    torch.testing.assert_close(q32.log_prob(draw).double(), exact, rtol=1e-5, atol=1e-3)
    solved = dist.MultivariateNormal(loc.float(), scale_tril=factor.float()).log_prob(draw).double()
    assert not torch.isfinite(solved) or (solved - exact).abs() > 100  # why: the solve amplifies round-off
    assert q32.log_prob(draw.clone()).item() != q32.log_prob(draw).item()  # any other value: the usual solve


def test_the_joint_and_full_rank_gaussians_score_their_draws_from_their_noise():
    spec = load_spec({**_auto("mvn"), "likelihood": {"noise": "learned"}})
    _, _, guide, _ = prepare(spec)
    assert isinstance(guide.auto.get_posterior(), ExactDrawMultivariateNormal)
    sites = {"w": LatentSite(torch.Size([3]), torch.zeros(3))}
    assert isinstance(FullRankGuide(sites).distribution("w"), ExactDrawMultivariateNormal)


def test_an_ill_conditioned_full_covariance_autoguide_refuses_to_score_given_draws():
    spec = load_spec({**_auto("mvn"), "likelihood": {"noise": "learned"}, "dtype": "float32"})
    _, _, guide, _ = prepare(spec)
    assert guide.density_unavailable is None
    with torch.no_grad():  # a unit-triangular factor with L^-1 entries of 1e8: float32 draws lose their noise
        guide.auto.scale_tril_unconstrained[1, 0] = 1e8
    reason = guide.density_unavailable
    assert reason is not None and "ill-conditioned" in reason
    assert pareto_k(guide, {}, torch.zeros(3))["interpretation"] == f"undefined: {reason}"


def test_an_autoguide_run_round_trips_and_names_its_autoguide(tmp_path):
    spec = load_spec(_auto("low_rank_mvn", num_steps=200), ["guide.rank=1", "inference.predictive_samples=20"])
    summary = train(spec, tmp_path / "run", progress=False, echo=None)
    log = (summary.run_dir / "train.log").read_text()
    assert "guide auto:low_rank_mvn" in log
    _, _, posterior = load_run(summary.run_dir)
    saved = load_checkpoint(summary.run_dir / CHECKPOINT_FILE)["guide"]
    loaded = posterior.guide.state_dict()
    assert set(saved) == set(loaded) and all(torch.equal(saved[n], loaded[n]) for n in saved)
    fresh = prepare(spec)[2].state_dict()
    assert not all(torch.equal(fresh[n], loaded[n]) for n in loaded)  # the fitted values, not a fresh build


def test_two_autoguides_in_one_process_do_not_share_parameters():
    spec = load_spec(_auto("normal", num_steps=50))
    data, family, first, _ = prepare(spec)
    _, _, second, _ = prepare(spec)
    before = {n: p.detach().clone() for n, p in second.named_parameters()}
    SVI().fit(family, first, data, spec.inference, spec.seed, progress=False)
    assert all(torch.equal(p, before[n]) for n, p in second.named_parameters())
    assert len(pyro.get_param_store()) == 0


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_the_laplace_approximation_is_the_exact_tempered_posterior_of_the_conjugate_model(temperature):
    # Gaussian likelihood, Normal prior: -log p is quadratic, so the mode and inverse Hessian are the posterior's
    # moments (of p(y | w)^(1/T) p(w) when tempered); a short, noisy MAP fit is polished into the mode
    spec = load_spec({**_auto("laplace_approximation", num_steps=100, num_particles=1, temperature=temperature),
                      "dtype": "float64"})
    data, family, guide, _ = prepare(spec)
    SVI().fit(family, guide, data, spec.inference, spec.seed, progress=False)
    mean, cov = closed_form(data, NOISE / data.y_std * temperature ** 0.5)  # p(y | w)^(1/T): the noise var. x T
    laplace = guide.active
    torch.testing.assert_close(laplace.loc.double(), mean, rtol=1e-6, atol=1e-8)
    got_cov = laplace.scale_tril.double() * laplace.scale.double()[:, None]
    torch.testing.assert_close(got_cov @ got_cov.T, cov, rtol=1e-5, atol=1e-10)
    with torch.no_grad():
        draws = {n: torch.stack([guide()[n] for _ in range(5)]) for n in guide.sites}
    assert guide.log_density(draws) is not None  # PSIS k-hat scores the Gaussian, not the MAP point


def test_a_laplace_run_round_trips_its_covariance_through_the_checkpoint(tmp_path):
    spec = load_spec({**_auto("laplace_approximation", num_steps=50, num_particles=1), "dtype": "float64"},
                     ["inference.predictive_samples=20"])
    summary = train(spec, tmp_path / "run", progress=False, echo=None)
    assert "laplace_approximation: MAP point polished by L-BFGS" in (summary.run_dir / "train.log").read_text()
    _, _, posterior = load_run(summary.run_dir)
    assert bool(posterior.guide.laplace_ready) and posterior.guide.active is posterior.guide.laplace
    saved = load_checkpoint(summary.run_dir / CHECKPOINT_FILE)["guide"]
    assert any(n.startswith("laplace.") for n in saved)
    assert all(torch.equal(saved[n], t) for n, t in posterior.guide.state_dict().items())


def test_a_laplace_approximation_at_a_point_that_is_not_a_mode_is_refused():
    def model(x, y=None):  # -log p = -w^2 / 2 + w^4 / 4 has a maximum at 0; L-BFGS from 0 stays there
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        pyro.factor("double_well", -(w ** 4) / 4 + w ** 2)

    sites = {"w": LatentSite(torch.Size([]), torch.zeros(()))}
    guide = AutoGuide(sites, AutoGuideSpec(name="auto", auto="laplace_approximation"))
    guide.bind(model, torch.zeros(2, 1))
    with pytest.raises(ZooInputError, match="is not positive definite, so the point is not a mode"):
        guide.finish(torch.zeros(2, 1))
    assert not bool(guide.laplace_ready)


def test_a_laplace_approximation_whose_learned_noise_collapses_says_so():
    """More weights than rows: the MAP polish shrinks the learned noise onto a fit that interpolates them, -log p has
    no mode, and the refusal names the noise's fall and the fix (a fixed noise), not a longer MAP fit."""
    from torch.distributions import constraints

    from zoo.likelihoods.gaussian import Gaussian

    noise = Gaussian.noise_site
    x = torch.tensor([[1.0, 0.5, -0.3, 0.2, 0.8, -1.0], [0.1, -0.7, 0.4, 1.2, -0.5, 0.3],
                      [-0.6, 0.9, 1.1, -0.2, 0.4, 0.7]])
    y = torch.tensor([0.3, -1.2, 0.8])
    x, y = x.double(), y.double()  # (in float32 the fall ends in 0 and a NaN)

    def model(x, y=None):
        one = torch.ones((), dtype=x.dtype)
        w = pyro.sample("w", dist.Normal(0 * one, one).expand([6]).to_event(1))
        sigma = pyro.sample(noise, dist.HalfNormal(one))
        with pyro.plate("rows", len(x)):
            pyro.sample("y", dist.Normal(x @ w, sigma), obs=y)

    sites = {"w": LatentSite(torch.Size([6]), torch.zeros(6, dtype=torch.float64)),
             noise: LatentSite(torch.Size([]), torch.tensor(1.0, dtype=torch.float64), constraints.positive)}
    guide = AutoGuide(sites, AutoGuideSpec(name="auto", auto="laplace_approximation"))
    guide.bind(model, x, y)
    with pytest.raises(ZooInputError, match=r"learned noise σ fell from 1 to .* in the polish.*fix likelihood.noise"):
        guide.finish(x, y)
    assert not bool(guide.laplace_ready)


def test_an_autoguide_refuses_a_discrete_latent_site_by_name():
    def model(x, y=None):
        pyro.sample("switch", dist.Bernoulli(0.5))
        pyro.sample("w", dist.Normal(0.0, 1.0))

    sites = {"w": LatentSite(torch.Size([]), torch.zeros(()))}
    guide = AutoGuide(sites, AutoGuideSpec(name="auto", auto="normal"))
    with pytest.raises(ZooInputError, match="site 'switch' is discrete") as err:
        guide.bind(model, torch.zeros(2, 1))
    assert err.value.field == "guide.auto"


def test_the_spec_refuses_autoguides_where_a_family_takes_none():
    with pytest.raises(ZooInputError, match="family 'deep_ensemble' takes the guides: delta"):
        load_spec({**_auto("normal"), "model": {"family": "deep_ensemble"}})
    with pytest.raises(ZooInputError, match="guide.auto"):
        load_spec({**_auto("normal"), "guide": {"name": "auto", "auto": "nf"}})
