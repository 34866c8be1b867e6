"""A regression fit's predictive noise set on its calibration rows: the likeliest σ (in closed form for a point
estimate), what the predictive and the test metrics then use, kept by run directories, and refused where it cannot
be set."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import zoo
from zoo.errors import ZooInputError
from zoo.inference.noise_choice import PREDICTIVE_NOISE_FILE, likeliest_noise
from zoo.metrics import regression_metrics


def _rows(n: int = 120, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=generator) * 4 - 2
    return x, torch.sin(2 * x[:, 0]) + 0.5 * x[:, 1] + 0.2 * torch.randn(n, generator=generator)


def _fitted(member: str = "map", val: bool = True, out=None, outputs: int = 1, **settings) -> zoo.BNN:
    x, y = _rows()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, outputs))
    bnn = zoo.BNN(net, member=member, likelihood=settings.pop("likelihood", {"name": "gaussian"}), seed=0)
    return bnn.fit((x[:90], y[:90]), val=(x[90:], y[90:]) if val else None, epochs=settings.pop("epochs", 5),
                   progress=False, lr=0.01, out=out, **settings)


def test_a_point_estimate_gets_the_root_mean_square_of_its_calibration_residuals():
    bnn = _fitted("map")
    data = bnn.data
    loc = bnn.posterior.predict(data.x_calibration, 2).loc[0]
    rms = float(((loc - data.y_calibration) ** 2).mean().sqrt())  # the Gaussian's σ of greatest likelihood
    assert bnn.family.likelihood.predictive_noise == pytest.approx(rms, rel=2e-3)  # the search's tolerance
    assert float(bnn.posterior.predict(data.x_calibration, 2).scale[0, 0]) == pytest.approx(
        bnn.family.likelihood.predictive_noise, rel=1e-6)  # (in float32)


def test_the_noise_set_is_the_likeliest_for_a_sampled_posterior_and_the_metrics_use_it():
    bnn = _fitted("mean_field")
    noise = bnn.family.likelihood.predictive_noise
    data = bnn.data
    torch.manual_seed(1)
    draws = bnn.posterior.predict(data.x_calibration, 50)
    assert torch.all(draws.scale == noise)  # every draw predicts with the one σ
    ll = {f: regression_metrics(draws.loc, torch.tensor(noise * f), data.y_calibration)["test_ll"]
          for f in (0.95, 1.0, 1.05)}  # the same draws: the mixture's likelihood peaks at σ (to the search's 0.1 %)
    assert ll[1.0] > ll[0.95] and ll[1.0] > ll[1.05]
    # the fit's test metrics (here its val rows) are the predictive's with that σ
    assert bnn.metrics["test_ll"] == pytest.approx(bnn.evaluate((data.x_test, data.y_test))["test_ll"], abs=1e-6)
    bnn.family.likelihood.predictive_noise = None
    assert bnn.evaluate((data.x_test, data.y_test))["test_ll"] != pytest.approx(bnn.metrics["test_ll"], abs=1e-3)


def test_the_search_finds_a_closed_form_optimum_whatever_the_fit_s_noise():
    residuals = torch.tensor([0.3, -0.1, 0.2, -0.4])
    loc = torch.zeros(1, 4)
    assert likeliest_noise(loc, residuals) == pytest.approx(float(residuals.pow(2).mean().sqrt()), rel=2e-3)
    # a point estimate's optimum is its residuals' RMS, which is below the largest residual, the window's top
    assert likeliest_noise(loc, 1e3 * residuals) == pytest.approx(1e3 * float(residuals.pow(2).mean().sqrt()),
                                                                  rel=2e-3)


def test_a_fit_that_ends_its_noise_far_below_the_rows_errors_still_gets_their_noise():
    """A MAP whose σ starts low (0.01) ends it far below what its calibration rows miss by; the σ set there is the
    RMS of the rows' residuals, found outside any window around the fit's σ."""
    bnn = _fitted("map", likelihood={"name": "gaussian", "noise_prior": {"init": 1e-4}}, epochs=1)
    data = bnn.data
    loc = bnn.posterior.predict(data.x_calibration, 2).loc[0]
    rms = float(((loc - data.y_calibration) ** 2).mean().sqrt())
    assert float(bnn.posterior.sample(1)["noise_scale"]) < rms / 60  # beyond the former window, e^4 times the fit's
    assert bnn.family.likelihood.predictive_noise == pytest.approx(rms, rel=2e-3)


def test_noise_by_fit_keeps_each_draws_own_noise():
    bnn = _fitted("mean_field", noise_by="fit")
    assert bnn.family.likelihood.predictive_noise is None
    torch.manual_seed(0)
    draws = bnn.posterior.sample(20)
    predicted = bnn.posterior.predict(bnn.data.x_calibration, draws=draws)
    assert torch.equal(predicted.scale[:, 0], draws["noise_scale"])


def test_a_run_directory_keeps_the_noise_set(tmp_path):
    x, y = _rows()
    in_memory, written = _fitted("map"), _fitted("map", out=tmp_path / "run")  # the same fit, twice
    in_memory.save(tmp_path / "saved")  # a fit kept in memory, written afterwards
    noise = in_memory.family.likelihood.predictive_noise
    assert written.family.likelihood.predictive_noise == noise
    for run in ("saved", "run"):
        assert json.loads((tmp_path / run / PREDICTIVE_NOISE_FILE).read_text())["noise"] == noise
        loaded = zoo.load(tmp_path / run)
        assert loaded.family.likelihood.predictive_noise == noise
        assert loaded.evaluate((x[90:], y[90:]))["test_ll"] == pytest.approx(in_memory.metrics["test_ll"], abs=1e-6)


def test_nothing_is_set_without_calibration_rows_or_for_a_classifier():
    assert _fitted("map", val=False).family.likelihood.predictive_noise is None
    x = torch.randn(60, 2)
    y = (x[:, 0] > 0).long()
    bnn = zoo.BNN(nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2)), member="map", seed=0)
    bnn.fit((x[:40], y[:40]), val=(x[40:], y[40:]), epochs=2, progress=False)
    assert bnn.family.likelihood.predictive_noise is None


@pytest.mark.parametrize("val, likelihood, why", [
    (False, {"name": "gaussian"}, "needs rows held out of training"),
    (True, {"name": "gaussian", "noise": 0.3}, "a learned Gaussian noise"),
    (True, {"name": "gaussian", "noise": "heteroscedastic"}, "a learned Gaussian noise"),
])
def test_noise_by_calibration_is_refused_where_it_cannot_be_set(val, likelihood, why):
    outputs = 2 if likelihood.get("noise") == "heteroscedastic" else 1
    with pytest.raises(ZooInputError, match=f"inference.noise_by: got 'calibration'.*{why}"):
        _fitted("map", val=val, likelihood=likelihood, noise_by="calibration", epochs=1, outputs=outputs)


def test_the_reference_sampler_has_no_noise_to_set():
    with pytest.raises(ZooInputError, match="noise_by"):
        zoo.BNN(nn.Linear(2, 1), member="hmc", likelihood={"name": "gaussian"}).fit(
            _rows(), noise_by="calibration", num_samples=2, warmup_steps=2)


def test_a_refusal_comes_before_the_run_directory_is_claimed(tmp_path):
    with pytest.raises(ZooInputError, match="inference.noise_by"):
        _fitted("map", val=False, noise_by="calibration", out=tmp_path / "run")
    assert not (tmp_path / "run").exists()
