"""The Laplace method's curvature and prior options: the empirical Fisher (``inference.curvature: ef``) against
laplace-torch and its closed form, one prior precision per weight (``inference.prior_structure: weight``), and
their refusals."""

from __future__ import annotations

import math

import pytest
import torch

from tests.laplace_reference import assert_agrees_with_laplace_torch, require_laplace
from tests.test_subnetwork import MOONS, TOY, _fitted, spec
from zoo.errors import ZooInputError
from zoo.models.subnetwork import SITE


@pytest.mark.parametrize(("covariance", "subset"), [("diag", "all"), ("diag", "last_layer"), ("kron", "all"),
                                                    ("kron", "last_layer")])
def test_empirical_fisher_agrees_with_laplace_torch(covariance, subset, tmp_path):
    """The same log evidence and probit predictive as laplace-torch's empirical-Fisher Laplace at the same prior
    precision, to 1e-6 relative (its BackPACK backend for the diagonal: its curvlinops one gives another evidence
    over the last layer; curvlinops for KFAC, which BackPACK does not offer)."""
    require_laplace()
    from laplace.curvature import BackPackEF, CurvlinopsEF

    _, data, posterior = _fitted(MOONS, tmp_path, f"guide.covariance={covariance}",
                                 f"model.selection.strategy={subset}", "inference.curvature=ef")
    assert_agrees_with_laplace_torch(posterior, data, tmp_path / "run", subset, covariance,
                                     backend=BackPackEF if covariance == "diag" else CurvlinopsEF)


def test_empirical_fisher_of_a_gaussian_is_its_squared_residuals_over_sigma_to_the_fourth(tmp_path):
    """With a learned noise σ the empirical Fisher's diagonal is Σ_n (y_n - f_n)² J_n² / σ⁴ (the loss gradient is
    (f - y)/σ²), and the posterior variance is 1 / (that + λ), unlike the GGN's Σ_n J_n² / σ²."""
    _, data, posterior = _fitted(TOY, tmp_path, "guide.covariance=diag", "model.selection.strategy=all",
                                 "inference.curvature=ef", "inference.tune=true", "likelihood.noise=learned")
    family = posterior.family
    noise = posterior.guide.point_estimate()["noise_scale"]
    f, J = family.linearise(data.x_train)
    J = J.dense()
    residual = data.y_train - f[:, 0]
    fisher = (residual[:, None] * J[:, 0]).square().sum(0) / noise**4
    torch.testing.assert_close(posterior.guide.variance(SITE), 1 / (fisher + family.prior_precision))


@pytest.mark.parametrize("covariance", ["full", "diag"])
def test_one_prior_precision_per_weight_finds_at_least_the_per_layer_evidence(covariance, tmp_path):
    """Automatic relevance determination (one precision per weight, each tuned by the evidence) reaches at least
    the evidence of one precision per layer, whose values are one of its choices; the precisions differ."""
    found = {}
    for structure in ("layer", "weight"):
        _fitted(MOONS, tmp_path / structure, f"guide.covariance={covariance}", "model.selection.strategy=last_layer",
                "inference.tune=true", f"inference.prior_structure={structure}")
        found[structure] = torch.load(tmp_path / structure / "run" / "checkpoint.pt", weights_only=False)
    weights = found["weight"]["prior_precision"]
    assert len(weights) == 14  # the output layer of the 2-6-2 net: 12 weights and 2 biases
    assert found["weight"]["log_evidence"] >= found["layer"]["log_evidence"] - 1e-6
    assert max(weights.values()) / min(weights.values()) > 1.5
    assert all(math.isfinite(v) and v > 0 for v in weights.values())


def test_refusals():
    with pytest.raises(ZooInputError, match="empirical Fisher is offered with guide.covariance: diag, kron or lowrank"):
        spec(MOONS, "inference.curvature=ef")  # a full covariance
    with pytest.raises(ZooInputError, match="one prior precision per weight tensor"):
        spec(MOONS, "guide.covariance=kron", "model.selection.strategy=all", "inference.prior_structure=weight")
    with pytest.raises(ZooInputError, match="inference.curvature"):
        spec(MOONS, "guide.covariance=diag", "inference.curvature=hessian")


def test_tuning_on_calibration_rows_picks_the_grid_value_of_least_nll(tmp_path):
    """``tune_by: calibration`` sets the one precision of the grid whose probit predictive has the least NLL on
    the rows held out of training, each candidate scored here by the posterior's own predict."""
    from zoo.inference.laplace import GRID_LOG_PRECISIONS

    _, data, posterior = _fitted(MOONS, tmp_path, "guide.covariance=diag", "model.selection.strategy=all",
                                 "inference.tune_by=calibration", "inference.prior_structure=scalar",
                                 "data.n_train=120", "data.calibration_fraction=0.3")
    family, guide = posterior.family, posterior.guide
    posterior.link = "probit"  # the grid scores the spec's link; link_by then chooses the fit's among the three
    chosen = float(family.prior_precision[0])
    _, ggn_diagonal = family.diagonal_ggn(data.x_train, 1.0)
    x, y = data.x_calibration, data.y_calibration.long()
    losses = []
    for log_precision in GRID_LOG_PRECISIONS:
        guide.set_gaussian(SITE, guide.point_estimate()[SITE], (ggn_diagonal + math.exp(log_precision)).rsqrt())
        log_probs = posterior.predict(x).log_probs[0]
        losses.append(float(-log_probs.gather(1, y[:, None]).mean()))
    assert len(x) == 36 and max(losses) > min(losses)
    assert chosen == pytest.approx(math.exp(GRID_LOG_PRECISIONS[losses.index(min(losses))]), rel=1e-6)


def test_tuning_on_calibration_rows_refuses_a_prior_per_layer_and_data_without_calibration_rows():
    grid = ("guide.covariance=diag", "model.selection.strategy=all", "inference.tune_by=calibration")
    with pytest.raises(ZooInputError, match="prior_structure: scalar"):
        spec(MOONS, *grid, "data.calibration_fraction=0.2")  # the default prior_structure: layer
    with pytest.raises(ZooInputError, match="data.calibration_fraction"):
        spec(MOONS, *grid, "inference.prior_structure=scalar")
    with pytest.raises(ZooInputError) as both:  # every problem at once, not the first alone
        spec(MOONS, *grid)
    assert "inference.tune_by:" in str(both.value) and "inference.prior_structure:" in str(both.value)


def test_tuning_on_calibration_rows_takes_the_val_rows_given_to_fit():
    """Data given in Python bring their calibration rows with ``fit(val=...)``: ``tune_by: calibration`` fits on
    them (it was refused, the spec's data section having no calibration_fraction), and without them it is refused
    at the fit, naming both ways to give them."""
    import zoo

    x = torch.randn(100, 4, generator=torch.Generator().manual_seed(0))
    y = x[:, :3].argmax(-1)
    grid = {"inference": {"tune_by": "calibration", "prior_structure": "scalar"}}
    lines: list[str] = []
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    zoo.BNN(net, member="kfac_laplace", **grid).fit((x[:80], y[:80]), val=(x[80:], y[80:]), epochs=2,
                                                      progress=False, echo=lines.append)
    assert any(line.startswith("laplace: prior precision") and "20 calibration rows" in line for line in lines)
    with pytest.raises(ZooInputError, match="pass val= to fit or set data.calibration_fraction"):
        zoo.BNN(net, member="kfac_laplace", **grid).fit((x[:80], y[:80]), epochs=2, progress=False)


def test_the_evidence_is_taken_where_the_structure_takes_it_and_the_spec_says_so():
    """Left out, ``evidence_at`` is written into the spec as the structure's own (the linearised mode for a full
    covariance, the MAP for diag and kron), so a run's spec.yaml and identity carry the value it used."""
    from zoo.spec import run_identity

    assert spec(MOONS).inference.evidence_at == "linearised_mode"
    for covariance in ("diag", "kron"):
        written = spec(MOONS, f"guide.covariance={covariance}", "model.selection.strategy=all")
        assert written.inference.evidence_at == "map" and run_identity(written)["inference"]["evidence_at"] == "map"
    assert spec(MOONS, "inference.evidence_at=map").inference.evidence_at == "map"  # given: kept


def _closed_form_variance(posterior, data, noise: float) -> torch.Tensor:
    """The linearised outputs' variance jᵀ Σ j on the calibration rows, Σ = (JᵀJ / σ² + Λ)⁻¹ recomputed in closed
    form at noise σ from the training rows' Jacobian and the fit's prior precision."""
    family = posterior.family
    eye = torch.eye(len(family.prior_precision), dtype=torch.float64)
    J_train = (family.linearise(data.x_train)[1] @ eye)[:, 0]
    J = (family.linearise(data.x_calibration)[1] @ eye)[:, 0]
    covariance = torch.linalg.inv(J_train.T @ J_train / noise**2 + torch.diag(family.prior_precision))
    return ((J @ covariance) * J).sum(-1)


def _calibration_nll(posterior, data, noise: float) -> float:
    """The calibration rows' mean GLM NLL at noise σ, the posterior recomputed there (:func:`_closed_form_variance`)."""
    variance = noise**2 + _closed_form_variance(posterior, data, noise)
    mean, _ = posterior.glm_moments(data.x_calibration)
    return float(0.5 * ((data.y_calibration - mean[:, 0]) ** 2 / variance + variance.log()).mean())


def test_a_learned_noise_is_the_likeliest_on_the_calibration_rows(tmp_path):
    """With calibration rows, a learned noise σ is set (after the evidence tunes the prior) to the σ whose GLM
    predictive, its posterior recomputed at σ, is likeliest on them: the closed form's NLL there is below its NLL
    2 % either side, the zoo's predictive variance is the closed form's, and ``noise_by: evidence`` keeps the
    evidence's σ, another one."""
    calibrated = ("likelihood.noise=learned", "inference.tune=true", "data.calibration_fraction=0.3")
    _, data, posterior = _fitted(TOY, tmp_path / "a", *calibrated)
    noise = float(posterior.guide.point_estimate()["noise_scale"])
    at_noise = _calibration_nll(posterior, data, noise)
    assert at_noise < min(_calibration_nll(posterior, data, noise * 1.02), _calibration_nll(posterior, data,
                                                                                             noise / 1.02))
    _, own_variance = posterior.glm_moments(data.x_calibration)
    torch.testing.assert_close(own_variance[:, 0, 0], _closed_form_variance(posterior, data, noise), rtol=1e-6,
                               atol=1e-9)
    _, _, by_evidence = _fitted(TOY, tmp_path / "b", *calibrated, "inference.noise_by=evidence")
    assert abs(float(by_evidence.guide.point_estimate()["noise_scale"]) / noise - 1) > 0.05


def test_a_noise_by_calibration_needs_calibration_rows_and_a_learned_noise(tmp_path):
    with pytest.raises(ZooInputError, match="inference.noise_by: got 'calibration'"):
        _fitted(TOY, tmp_path / "a", "likelihood.noise=learned", "inference.noise_by=calibration")
    with pytest.raises(ZooInputError, match="a learned Gaussian noise"):
        _fitted(TOY, tmp_path / "b", "data.calibration_fraction=0.3", "inference.noise_by=calibration")


def test_the_rows_given_to_fit_as_val_calibrate_a_laplace_fits_noise():
    """``fit(val=...)``'s rows are the calibration rows of a post-hoc Laplace: its learned noise is set on them (the
    log says so), where a fit without them keeps the evidence's."""
    import zoo

    g = torch.Generator().manual_seed(0)
    x = torch.randn(240, 3, generator=g)
    y = x[:, 0] - x[:, 1] ** 2 + 0.3 * torch.randn(240, generator=g)
    noises = {}
    for given in ("val", "none"):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        lines: list[str] = []
        bnn = zoo.BNN(net, member="last_layer_laplace", likelihood="gaussian", seed=0)
        bnn.fit((x[:160], y[:160]), val=(x[160:], y[160:]) if given == "val" else None, epochs=5, progress=False,
                echo=lines.append)
        noises[given] = float(bnn.guide.point_estimate()["noise_scale"])
        assert ("80 calibration rows" in "\n".join(lines)) == (given == "val")
    assert noises["val"] != pytest.approx(noises["none"], rel=0.01)


def test_the_calibration_rows_noise_is_found_far_from_the_evidence_s():
    """The σ search spans the calibration rows' own window (from their largest residual down), not a factor around
    the evidence's σ: rows whose errors are hundreds of times the fit's noise get a σ of their errors' size (the
    search once stopped at e⁴ times the evidence's)."""
    import zoo

    g = torch.Generator().manual_seed(0)
    x = torch.randn(240, 3, generator=g)
    y = x[:, 0] - x[:, 1] ** 2 + 0.02 * torch.randn(240, generator=g)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    lines: list[str] = []
    bnn = zoo.BNN(net, member="last_layer_laplace", likelihood="gaussian", seed=0)
    bnn.fit((x[:160], y[:160]), val=(x[160:], y[160:] + 200.0), epochs=5, progress=False, echo=lines.append)
    line = next(x for x in lines if x.startswith("laplace: noise "))  # in the targets' units
    before, after = (float(v) for v in line.split("laplace: noise ")[1].split(", ")[0].split(" -> "))
    assert after / before > math.exp(4.5)  # past the old window's edge, e⁴
    assert after < 200.0 * 1.2  # and below the rows' errors, about the offset, as σ² and the GLM's variance share them
