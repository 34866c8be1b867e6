"""Posterior tempering (``inference.temperature``): every method targets p(w | D)^(1/T), checked on Bayesian linear
regression, whose tempered posterior is N(mean, T cov) with the untempered closed-form mean and covariance."""

from __future__ import annotations

import math

import pyro
import pytest
import torch

from tests.test_elbo import _linear_setup
from tests.test_mcmc import NOISE, assert_matches_conjugate, closed_form, linear_spec
from zoo.inference.elbo import LazyTraceMeanField_ELBO
from zoo.inference.mcmc import MCMC
from zoo.inference.svi import SVI
from zoo.pipeline import load_run, prepare, train
from zoo.spec import load_spec

T = 0.5


def test_tempered_elbo_adds_one_minus_t_times_the_guide_entropy():
    # T * (negative ELBO of p^(1/T)) = KL(q || p) - E_q log p(y | w) + (1 - T) H[q], with H[q] Gaussian in closed form
    family, guide, x, y = _linear_setup()
    plain, tempered = LazyTraceMeanField_ELBO(), LazyTraceMeanField_ELBO()
    tempered.temperature = T
    pyro.set_rng_seed(3)
    base = plain.differentiable_loss(family.model, guide, x, y, None)
    pyro.set_rng_seed(3)
    cold = tempered.differentiable_loss(family.model, guide, x, y, None)
    scales = torch.cat([guide.scale("out.weight").reshape(-1), guide.scale("out.bias").reshape(-1)])
    entropy = (0.5 * torch.log(2 * math.pi * math.e * scales**2)).sum()
    torch.testing.assert_close(cold - base, (1 - T) * entropy)


@pytest.mark.parametrize("method", ["hmc", "nuts"])
def test_mcmc_samples_the_tempered_conjugate_posterior(method):
    settings = ({"num_chains": 32, "warmup_steps": 150, "num_samples": 100} if method == "hmc"
                else {"num_chains": 2, "warmup_steps": 100, "num_samples": 200})
    spec = load_spec(linear_spec(method, temperature=T, **settings))
    data, family, guide, _ = prepare(spec)
    result = MCMC().fit(family, guide, data, spec.inference, spec.seed, progress=False)
    cov, got_cov = assert_matches_conjugate(result, data, temperature=T)
    # and not the untempered posterior: its sd is sqrt(2) = 1.41 times larger
    assert (got_cov.diagonal().sqrt() / cov.diagonal().sqrt()).max() < 0.85


def test_svi_mean_field_fits_the_tempered_conjugate_posterior():
    # the best mean-field Gaussian for N(m, S) has mean m and variances 1 / (S^-1)_ii; tempered: T / (S^-1)_ii
    spec = load_spec(linear_spec("svi", temperature=T, num_steps=1500, batch_size=None, optimizer="clipped_adam",
                                 lr=0.03, lr_decay=0.997, num_particles=4),
                     ["guide.init_rho=-3"])
    data, family, guide, _ = prepare(spec)
    SVI().fit(family, guide, data, spec.inference, spec.seed, progress=False)
    mean, cov = closed_form(data, NOISE / data.y_std)
    precision_diag = torch.linalg.inv(cov).diagonal()
    got_mean = torch.cat([guide.loc["out/weight"].reshape(-1), guide.loc["out/bias"].reshape(-1)]).double()
    got_sd = torch.cat([guide.scale("out.weight").reshape(-1), guide.scale("out.bias").reshape(-1)]).double()
    want_sd = (T / precision_diag).sqrt()
    assert ((got_mean.detach() - mean).abs() / want_sd).max() < 0.2
    torch.testing.assert_close(got_sd.detach(), want_sd, rtol=0.1, atol=0.0)


def test_laplace_covariance_is_t_times_the_untempered_one(tmp_path):
    base = {**linear_spec("laplace", tune=False), "model": {
        "family": "subnetwork", "selection": {"strategy": "largest_magnitude", "size": 1.0},
        "map": {"num_steps": 2000, "batch_size": None, "lr": 0.05}}}
    runs = {}
    for temperature in (1.0, T):
        spec = {**base, "inference": {**base["inference"], "temperature": temperature}}
        summary = train(load_spec(spec), tmp_path / f"t{temperature}", progress=False, echo=None)
        runs[temperature] = load_run(summary.run_dir)[2]
    tril = {t: next(iter(p.guide.scale_tril.values())).double() for t, p in runs.items()}
    untempered, tempered = (tril[t] @ tril[t].T for t in (1.0, T))
    torch.testing.assert_close(tempered, T * untempered)
    data = load_run(tmp_path / "t1.0")[1]
    _, exact = closed_form(data, NOISE / data.y_std)
    torch.testing.assert_close(untempered, exact, rtol=1e-6, atol=1e-9)
