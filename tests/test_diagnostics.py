"""ArviZ conversion, R-hat/ESS/divergence/BFMI/Pareto-k checks, HMC-vs-VI comparison and the diagnose/compare CLI."""

from __future__ import annotations

import json
import math
import shutil

import arviz as az
import numpy as np
import pyro
import pytest
import torch
import xarray as xr
from rich.console import Console
from rich.text import Text
from scipy.stats import wasserstein_distance

from guides.delta import DeltaGuide
from zoo.cli import STRICT_EXIT, main
from zoo.data.base import Dataset
from zoo.diagnostics import (
    INFERENCE_DATA_FILE,
    check,
    compare,
    diagnose,
    diagnose_report,
    energy_exploration,
    guide_log_density,
    khat_interpretation,
    lp_moves_with,
    pareto_k,
    reference_standing,
    run_predictive,
    save_inference_data,
    site_dims,
    to_inference_data,
    verdict,
)
from zoo.errors import ZooInputError
from zoo.inference.draws import SAMPLES_FILE, load_samples
from zoo.inference.potential import LogJoint
from zoo.likelihoods import PredictiveDraws
from zoo.metrics import coverage
from zoo.pipeline import load_run, train
from zoo.runs import METRICS_FILE, SPEC_FILE, save_torch
from zoo.sites import LatentSite
from zoo.spec import load_spec
from zoo.tasks import TASKS

torch.set_num_threads(1)

TOY = {"data": {"name": "toy_gap", "n_train": 20}, "net": {"hidden": [3], "activation": "tanh"},
       "likelihood": {"noise": 0.1}, "device": "cpu", "seed": 0}
HMC = {**TOY, "inference": {"method": "hmc", "num_chains": 2, "warmup_steps": 30, "num_samples": 30,
                            "predictive_samples": 20}}
VI = {**TOY, "inference": {"num_steps": 60, "lr": 0.02, "predictive_samples": 20}}
MOONS = {"data": {"name": "two_moons", "n_train": 40}, "net": {"hidden": [4]}, "device": "cpu", "seed": 0,
         "inference": {"num_steps": 30, "predictive_samples": 10}}


def _train(tree: dict, path):
    return train(load_spec(tree), path, progress=False, echo=None).run_dir


@pytest.fixture(scope="module")
def hmc_dir(tmp_path_factory):
    return _train(HMC, tmp_path_factory.mktemp("diag") / "hmc")


@pytest.fixture(scope="module")
def vi_dir(tmp_path_factory):
    return _train(VI, tmp_path_factory.mktemp("diag") / "vi")


@pytest.fixture(scope="module")
def moons_dir(tmp_path_factory):
    return _train(MOONS, tmp_path_factory.mktemp("diag") / "moons")


@pytest.fixture(scope="module")
def hmc(hmc_dir):
    """(data, posterior, MCMCResult, InferenceData) of the HMC run."""
    _, data, posterior = load_run(hmc_dir)
    result = load_samples(hmc_dir, posterior.family)
    idata = to_inference_data(posterior, data, chains=result.draws, stats=result.stats)
    return data, posterior, result, idata


@pytest.fixture(scope="module")
def stuck_dir(hmc_dir, hmc, tmp_path_factory):
    """A run directory whose two chains sit at two different points for every draw, energy a random walk and one
    divergent transition: every MCMC check must warn."""
    _, _, result, _ = hmc
    run = tmp_path_factory.mktemp("diag") / "stuck"
    run.mkdir()
    for name in (SPEC_FILE, METRICS_FILE):
        shutil.copy(hmc_dir / name, run / name)
    n = result.draws["out.bias"].shape[1]
    draws = {k: v[:, :1].expand(-1, n, *v.shape[2:]).clone() for k, v in result.draws.items()}
    gen = torch.Generator().manual_seed(0)
    stats = {k: v.clone() for k, v in result.stats.items()}
    stats["energy"] = torch.arange(n).expand(2, n) + 0.1 * torch.randn(2, n, generator=gen)  # drifting: BFMI ~ 0.01
    stats["diverging"] = torch.zeros(2, n, dtype=torch.bool)
    stats["diverging"][1, 5] = True
    save_torch(run / SAMPLES_FILE, {"z0": None, "method": "hmc", "done": True, "draws": draws, "stats": stats,
                                    "seconds": 0.0, "settings": {}})
    return run


# ------------------------------------------------------------------------------------------ InferenceData
def test_site_dims_name_weights_and_share_plates():
    site = LatentSite(torch.Size([3, 2]), torch.zeros(3, 2))
    assert site_dims("hidden0.weight", site) == ["hidden0.weight_out", "hidden0.weight_in"]
    assert site_dims("out.bias", LatentSite(torch.Size([2]), torch.zeros(2))) == ["out.bias_out"]
    assert site_dims("noise_scale", LatentSite(torch.Size([]), torch.ones(()))) == []
    plated = LatentSite(torch.Size([4, 5]), torch.ones(4, 5), plate=("members", 4))
    assert site_dims("hidden0.r", plated) == ["members", "hidden0.r_unit"]


def test_members_of_a_draw_form_one_mixture_predictive():
    """A rank-1 BNN predicts K rows per draw: y is drawn from the draw's uniform mixture over its members."""
    s, k, b = 3, 2, 500
    loc = torch.tensor([-100.0, 100.0]).repeat(s)[:, None].expand(s * k, b)  # draw-major: member 0, 1, 0, 1, ...
    pred = PredictiveDraws(loc=loc, scale=torch.full_like(loc, 1e-3))
    mix_loc, mix_scale = TASKS["regression"].mixture(pred, s)
    assert mix_loc.shape == mix_scale.shape == (s, k, b) and (mix_loc[:, 0] == -100).all()
    y = TASKS["regression"].replicate(pred, s, Dataset("x", "regression", *[torch.zeros(1, 1)] * 4),
                                      torch.Generator().manual_seed(0))
    assert y.shape == (s, b) and np.allclose(np.abs(y), 100, atol=0.01)
    assert 0.4 < (y > 0).mean() < 0.6
    one_class_each = torch.tensor([[0.0, -1e30], [-1e30, 0.0]])  # member 0 says class 0, member 1 class 1
    log_probs = one_class_each.repeat(s, 1)[:, None].expand(-1, b, -1)
    labels = TASKS["classification"].replicate(PredictiveDraws(log_probs=log_probs), s, Dataset(
        "x", "classification", *[torch.zeros(1, 1)] * 4, n_classes=2), torch.Generator().manual_seed(0))
    assert labels.shape == (s, b) and 0.4 < labels.mean() < 0.6


def test_inference_data_groups_dims_and_shapes(hmc):
    data, posterior, result, idata = hmc
    assert set(idata.groups()) == {"posterior", "posterior_predictive", "log_likelihood", "sample_stats",
                                   "observed_data"}
    post = idata.posterior
    assert post["hidden0.weight"].dims == ("chain", "draw", "hidden0.weight_out", "hidden0.weight_in")
    assert post["hidden0.weight"].shape == (2, 30, 3, 1)
    assert post["out.bias"].dims == ("chain", "draw", "out.bias_out")
    assert post["f_test"].dims == ("chain", "draw", "test_point") and post["f_test"].shape == (2, 30, 8)
    assert post["lp"].shape == (2, 30)
    # the chains are kept as they were sampled
    for name, value in result.draws.items():
        np.testing.assert_array_equal(post[name].values, value.numpy())
    # test points spread over the (1-D, sorted) test inputs
    assert list(np.diff(post["test_x"].values) > 0) == [True] * 7
    n = data.n_train
    assert idata.posterior_predictive["y"].shape == (2, 30, n)
    assert idata.log_likelihood["y"].shape == (2, 30, n)
    assert idata.observed_data["y"].dims == ("train_point",)
    np.testing.assert_allclose(idata.observed_data["y"].values,
                               data.y_train.double().numpy() * data.y_std + data.y_mean)
    assert set(idata.sample_stats.data_vars) == {"diverging", "energy", "step_size", "n_steps", "acceptance_rate",
                                                 "lp"}
    assert idata.sample_stats["diverging"].dtype == bool
    # lp is the model's log joint; the log-likelihood is the model's term in original units
    flat = {k: v[1] for k, v in result.draws.items()}
    np.testing.assert_allclose(post["lp"].values[1], LogJoint(posterior.family, data.x_train, data.y_train)(flat),
                               rtol=1e-5)
    ll = posterior.family.log_likelihood(flat, data.x_train, data.y_train) - math.log(data.y_std)
    np.testing.assert_allclose(idata.log_likelihood["y"].values[1], ll.numpy(), rtol=1e-5)
    # f_test: the predictive location in original units at the chosen test inputs
    index = torch.tensor(post["test_point"].values)
    loc = posterior.predict(data.x_test[index], draws=flat).loc * data.y_std + data.y_mean
    np.testing.assert_allclose(post["f_test"].values[1], loc.numpy(), rtol=1e-5, atol=1e-6)


def test_netcdf_round_trip_is_atomic_and_exact(hmc, tmp_path):
    idata = hmc[3]
    path = save_inference_data(idata, tmp_path)
    assert path == tmp_path / INFERENCE_DATA_FILE
    assert sorted(p.name for p in tmp_path.iterdir()) == [INFERENCE_DATA_FILE]  # no temp file left behind
    back = az.from_netcdf(path)
    for group in idata.groups():
        xr.testing.assert_identical(getattr(back, group).load().drop_attrs(), getattr(idata, group).drop_attrs())
    assert back.posterior.attrs["draws"] == "mcmc" and back.sample_stats["diverging"].dtype == bool


def test_loo_works_on_the_inference_data(hmc):
    idata = hmc[3]
    with pytest.warns(UserWarning):  # a 3-unit net on 60 draws: some Pareto k of PSIS-LOO are high
        loo = az.loo(idata, pointwise=True)
    assert math.isfinite(loo.elpd_loo) and loo.n_data_points == hmc[0].n_train


def test_guide_draws_are_one_seeded_chain_and_thinning_keeps_every_kth_draw(vi_dir, hmc):
    _, data, posterior = load_run(vi_dir)
    a = to_inference_data(posterior, data, num_samples=12, seed=3)
    b = to_inference_data(posterior, data, num_samples=12, seed=3)
    assert a.posterior.sizes["chain"] == 1 and a.posterior.sizes["draw"] == 12
    assert set(a.sample_stats.data_vars) == {"lp"}
    xr.testing.assert_equal(a.posterior, b.posterior)
    data, posterior, result, _ = hmc
    thinned = to_inference_data(posterior, data, chains=result.draws, stats=result.stats, num_samples=20)
    assert thinned.posterior.sizes["draw"] == 10
    np.testing.assert_array_equal(thinned.posterior["out.weight"].values, result.draws["out.weight"][:, ::3].numpy())
    np.testing.assert_array_equal(thinned.sample_stats["energy"].values, result.stats["energy"][:, ::3].numpy())


# ------------------------------------------------------------------------------------------ checks
def test_rhat_and_ess_are_arviz_own(hmc):
    idata = hmc[3]
    result = check(idata)
    rows = {r["variable"]: r for r in result["function_space"]}
    f = idata.posterior["f_test"]
    rhat, bulk = az.rhat(idata.posterior, var_names=["f_test", "lp"]), az.ess(idata.posterior, var_names=["lp"])
    tail = az.ess(f.values[:, :, 3], method="tail")
    point = int(f["test_point"].values[3])
    assert rows[f"f_test[{point}]"]["r_hat"] == pytest.approx(float(rhat["f_test"][3]), rel=1e-12)
    assert rows[f"f_test[{point}]"]["ess_tail"] == pytest.approx(float(tail), rel=1e-12)
    assert rows["lp"]["r_hat"] == pytest.approx(float(rhat["lp"]), rel=1e-12)
    assert rows["lp"]["ess_bulk"] == pytest.approx(float(bulk["lp"]), rel=1e-12)
    # weights: quantiles over every element, the worst ten only
    sites = [n for n in idata.posterior.data_vars if n not in ("f_test", "lp")]
    all_rhat = np.concatenate([az.rhat(idata.posterior[sites])[n].values.ravel() for n in sites])
    weights = result["weights"]
    assert weights["n_elements"] == all_rhat.size == 10
    assert weights["r_hat_quantiles"]["max"] == pytest.approx(all_rhat.max())
    assert weights["r_hat_quantiles"]["50%"] == pytest.approx(np.quantile(all_rhat, 0.5))
    worst = [w["r_hat"] for w in weights["worst"]]
    assert worst == sorted(worst, reverse=True) and len(worst) == 10
    assert worst[0] == pytest.approx(all_rhat.max())


def test_stuck_chains_warn_loudly(stuck_dir, capsys):
    result = diagnose(stuck_dir, plots=False)  # the CLI below draws the plots
    warnings = " | ".join(result["warnings"])
    assert "R-hat > 1.01" in warnings and "function-space summaries" in warnings
    # weight-space R-hat is a note (permuted hidden units make equivalent modes), never a failed check
    assert "latent-site elements" not in warnings and any("latent-site elements" in n for n in result["notes"])
    assert "1 divergent transitions" in warnings and "BFMI" in warnings and "ESS" in warnings
    assert result["divergences"] == {"count": 1, "fraction": 1 / 60, "per_chain": [0, 1]}
    assert all(b < 0.3 for b in result["bfmi"])
    assert result["weights"]["worst"][-1]["r_hat"] > 100  # constant within chains, different between them

    def not_json(constant: str):
        raise AssertionError(f"{constant} in diagnostics.json")

    saved = json.loads((stuck_dir / "diagnostics.json").read_text(), parse_constant=not_json)
    assert saved["warnings"] == result["warnings"]
    # thinned draws still count the divergence (stored draw 5 of chain 1, which every 6th draw skips)
    thinned = diagnose(stuck_dir, num_samples=10, plots=False)
    assert thinned["num_draws"] == 5 and thinned["divergences"]["count"] == 1
    # the report shows each warning as a red line, and failing checks in red
    report = diagnose_report(result)
    red = [r for r in report if isinstance(r, Text) and "red" in str(r.style)]
    assert len(red) == len(result["warnings"]) >= 4
    console = Console(record=True, width=200)
    for renderable in report:
        console.print(renderable)
    assert console.export_text().count("WARNING") == 2 * len(result["warnings"])  # status column + line
    # the CLI: exit 0, with --strict exit 3
    assert main(["diagnose", str(stuck_dir), "--strict"]) == STRICT_EXIT
    out = capsys.readouterr().out
    assert "WARNING: R-hat > 1.01" in out
    for name in ("posterior.nc", "diagnostics.json", "summary.csv", "trace.png", "energy.png", "pair.png"):
        assert (stuck_dir / name).is_file(), name
        assert name in out


def test_well_mixed_iid_chains_do_not_warn(vi_dir):
    _, data, posterior = load_run(vi_dir)
    pyro.set_rng_seed(0)
    draws = posterior.sample(1600)
    chains = {k: v.reshape(4, 400, *v.shape[1:]) for k, v in draws.items()}
    gen = torch.Generator().manual_seed(1)
    stats = {"energy": torch.randn(4, 400, generator=gen), "diverging": torch.zeros(4, 400, dtype=torch.bool)}
    idata = to_inference_data(posterior, data, chains=chains, stats=stats, num_test_points=4)
    result = check(idata)
    assert result["warnings"] == [], result["warnings"]
    assert all(c["ok"] for c in result["checks"]) and len(result["checks"]) >= 7
    assert all(r["r_hat"] <= 1.01 and r["ess_bulk"] >= 100 for r in result["function_space"])
    assert result["divergences"]["count"] == 0 and all(b >= 0.3 for b in result["bfmi"])
    report = diagnose_report(result)
    assert not any(isinstance(r, Text) and "red" in str(r.style) for r in report)


def test_pareto_k_of_a_vi_run(vi_dir):
    result = diagnose(vi_dir, num_samples=100, plots=False)
    pk = result["pareto_k"]
    assert pk["num_draws"] == 100 and math.isfinite(pk["k_hat"])
    assert pk["interpretation"] == khat_interpretation(pk["k_hat"])
    assert (pk["k_hat"] > 0.7) == any("Pareto k-hat" in w for w in result["warnings"])
    assert result["weights"] is None and result["num_chains"] == 1
    # the same k-hat from log w = log p(w, y | x) - log q(w), q's density written out by hand
    _, data, posterior = load_run(vi_dir)
    idata = az.from_netcdf(vi_dir / INFERENCE_DATA_FILE)
    draws = {n: torch.tensor(idata.posterior[n].values[0]) for n in posterior.family.latent_sites()}
    guide = posterior.guide
    with torch.no_grad():
        log_q = sum(torch.stack([guide.distribution(n).log_prob(v[s]) for s in range(100)]) for n, v in draws.items())
    traced, point_mass, scaled = guide_log_density(guide, draws)
    assert point_mass == [] and scaled == [] and "caveat" not in pk
    torch.testing.assert_close(traced, log_q)
    lp = torch.tensor(idata.posterior["lp"].values[0])
    _, k = az.psislw((lp.double() - traced.double()).numpy(), reff=1.0)
    assert pk["k_hat"] == pytest.approx(float(k), rel=1e-9)
    # a point-mass guide has no density: k-hat is reported as undefined, not as a number
    delta = DeltaGuide(posterior.family.latent_sites())
    point = pareto_k(delta, {n: v[:5] for n, v in draws.items()}, lp[:5])
    assert point["k_hat"] is None and "point-mass" in point["interpretation"]


# ------------------------------------------------------------------------------------------ compare
def test_compare_a_regression_run_with_itself_and_with_hmc(vi_dir, hmc_dir, tmp_path):
    found = compare(vi_dir, vi_dir, hmc_dir, num_samples=50, allow_unconverged=True)
    found.plot(tmp_path / "compare.png")
    rows = found.rows
    reference, itself, hmc = rows
    assert all(r["reference_check"].startswith("FAILS: svi/mean_field is not an exact sampler") for r in rows)
    assert reference["reference"] and not itself["reference"]
    for row in (reference, itself):
        assert row["w1"] == 0.0  # the same draws
        assert row["coverage_95"] == pytest.approx(0.95, abs=0.005)
    assert 0.0 <= hmc["coverage_95"] <= 1.0 and hmc["w1"] > 0.0
    metrics = json.loads((hmc_dir / METRICS_FILE).read_text())
    assert hmc["rmse"] == metrics["rmse"] and hmc["test_ll"] == metrics["test_ll"]
    assert (tmp_path / "compare.png").is_file() and itself["label"] == reference["label"] + " #2"
    # W1 is scipy's on the predictive samples of y, in original units
    a, b = run_predictive(hmc_dir, 50), run_predictive(vi_dir, 50)
    w1 = np.mean([wasserstein_distance(a.draws[:, i], b.draws[:, i]) for i in range(a.draws.shape[1])])
    assert hmc["w1"] == pytest.approx(w1)
    assert a.draws.shape == (2000, 200)


def test_coverage_measures_reference_mass_inside_the_interval():
    rng = np.random.default_rng(0)
    reference = rng.normal(size=(4000, 3))
    assert coverage(rng.normal(size=(4000, 3)), reference).mean() == pytest.approx(0.95, abs=0.01)
    assert coverage(0.3 * rng.normal(size=(4000, 3)), reference).mean() == pytest.approx(0.44, abs=0.03)


def test_compare_a_classification_run_with_itself(moons_dir, tmp_path):
    found = compare(moons_dir, moons_dir, num_samples=20, allow_unconverged=True)
    found.plot(tmp_path / "compare.png")
    rows = found.rows
    assert [r["agreement"] for r in rows] == [1.0, 1.0] and [r["tv"] for r in rows] == [0.0, 0.0]
    assert {"accuracy", "nll", "ece"} <= set(rows[1])
    assert (tmp_path / "compare.png").is_file()


def test_compare_refuses_runs_on_different_data(moons_dir, vi_dir):
    with pytest.raises(ZooInputError, match="its task is regression, the reference's classification; its training "
                       "rows differ from the reference's") as err:
        compare(moons_dir, vi_dir, num_samples=5, allow_unconverged=True)
    assert "its net is" in str(err.value)  # 2 inputs vs 1: another net too


@pytest.fixture(scope="module")
def converged_dir(hmc_dir, hmc, tmp_path_factory):
    """An HMC run directory whose draws pass every ``--strict`` check: 4 chains of 500 independent draws around the
    tiny HMC run's mean (what a long, well-mixed run looks like to the checks), energies iid, no divergences."""
    _, _, result, _ = hmc
    run = tmp_path_factory.mktemp("diag") / "converged"
    run.mkdir()
    for name in (SPEC_FILE, METRICS_FILE):
        shutil.copy(hmc_dir / name, run / name)
    gen = torch.Generator().manual_seed(1)
    draws = {k: v.mean((0, 1)) + 0.05 * torch.randn(4, 500, *v.shape[2:], generator=gen, dtype=v.dtype)
             for k, v in result.draws.items()}
    stats = {"energy": torch.randn(4, 500, generator=gen), "diverging": torch.zeros(4, 500, dtype=torch.bool)}
    save_torch(run / SAMPLES_FILE, {"z0": None, "method": "hmc", "done": True, "draws": draws, "stats": stats,
                                    "seconds": 0.0, "settings": {}})
    return run


def test_a_converged_exact_sampler_is_a_trusted_reference(converged_dir, vi_dir):
    standing = reference_standing(converged_dir)
    assert standing.trusted and standing.method == "hmc" and standing.column() == "passes --strict"
    rows = compare(converged_dir, vi_dir, num_samples=20).rows
    assert [r["reference_check"] for r in rows] == ["passes --strict"] * 2
    assert not any((converged_dir / name).exists() for name in ("posterior.nc", "diagnostics.json"))  # read only


@pytest.mark.parametrize(("reference", "fragment"), [
    ("vi_dir", "svi/mean_field is not an exact sampler; a reference must be draws of nuts or hmc"),
    ("hmc_dir", "R-hat > 1.01"),  # 2 chains x 30 draws: too short to converge
    ("stuck_dir", "divergent transitions"),
])
def test_compare_refuses_a_reference_that_is_not_one(request, reference, fragment, vi_dir, tmp_path, capsys):
    ref = request.getfixturevalue(reference)
    before = sorted(p.name for p in ref.iterdir())
    code = main(["compare", str(ref), str(vi_dir), "--samples", "5", "--out", str(tmp_path / "out")])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and err.startswith("error: REFERENCE_RUN") and "Traceback" not in err
    assert fragment in err and "--allow-unconverged" in err
    assert not (tmp_path / "out").exists() and sorted(p.name for p in ref.iterdir()) == before  # nothing written
    with pytest.raises(ZooInputError, match="cannot be trusted as a reference"):
        compare(ref, vi_dir, num_samples=5)


def test_compare_refuses_a_list_of_fits_not_unpacked(converged_dir, vi_dir):
    with pytest.raises(TypeError, match=r"give the fits one by one.*compare\(ref, \*fits\)"):
        compare(converged_dir, [str(vi_dir)])


# ------------------------------------------------------------------------------------------ CLI
def test_compare_cli_writes_plot_and_json(hmc_dir, vi_dir, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["compare", str(hmc_dir), str(vi_dir), "--samples", "20", "--out", str(out), "--json",
                 str(tmp_path / "rows.json"), "--allow-unconverged"])
    assert code == 0
    text = capsys.readouterr().out
    assert "coverage_95" in text and "w1" in text and "(reference)" in text
    assert "REFERENCE FAILS: R-hat" in " ".join(text.split())  # the tiny HMC run is marked, loudly
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [r["run"] for r in rows] == [str(hmc_dir), str(vi_dir)] and rows[0]["w1"] == 0.0
    assert (out / "compare.png").is_file()


def test_diagnose_cli_exits_0_without_strict(moons_dir, capsys):
    assert main(["diagnose", str(moons_dir), "--samples", "60"]) == 0
    out = capsys.readouterr().out
    assert "Pareto k-hat" in out and "f_test" in out
    saved = json.loads((moons_dir / "diagnostics.json").read_text())
    assert saved["num_draws"] == 60 and saved["pareto_k"]["num_draws"] == 60
    for name in ("posterior.nc", "summary.csv", "trace.png", "pair.png"):
        assert (moons_dir / name).is_file(), name
    assert not (moons_dir / "energy.png").exists()  # no sampler energy for a guide's draws


@pytest.mark.parametrize(("argv", "fragment"), [
    (["diagnose", "{dir}"], "not a run directory"),
    (["compare", "{dir}", "{dir}"], "not a run directory"),
    (["compare", "{run}", "{dir}"], "not a run directory"),
    (["diagnose", "{run}", "--samples", "0"], "--samples"),
])
def test_cli_bad_input_exits_2(tmp_path, vi_dir, capsys, argv, fragment):
    code = main([a.format(dir=tmp_path, run=vi_dir) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and "Traceback" not in err
    assert fragment in err


def test_compare_cli_on_different_data_exits_2(moons_dir, vi_dir, capsys):
    assert main(["compare", str(moons_dir), str(vi_dir), "--allow-unconverged"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: RUN: got 'vi (svi/mean_field)'; cannot be compared") and "training rows differ" in err


def test_an_r_hat_left_undefined_by_stuck_chains_counts_as_infinite():
    from zoo.posterior_checks import _stuck_as_infinite

    stuck = np.stack([np.full((5, 2), 1.0), np.full((5, 2), 2.0)])  # [chains, draws, element]: apart, each constant
    same = np.ones((2, 5, 2))  # constant and equal: no information either way
    assert np.isinf(_stuck_as_infinite(np.full(2, np.nan), stuck)).all()
    assert np.isnan(_stuck_as_infinite(np.full(2, np.nan), same)).all()
    moving = np.random.default_rng(0).normal(size=(2, 5, 2))
    assert _stuck_as_infinite(np.array([1.2, np.nan]), moving).tolist()[0] == 1.2  # a defined R-hat is kept


def ideal_hmc_energies(dim: int, spread: float, chains: int, draws: int, seed: int = 0) -> np.ndarray:
    """The Hamiltonian at each draw of exact HMC at stationarity, ``[chains, draws]``: a fresh Gaussian momentum adds
    a Gamma(D/2) kinetic energy to the potential U, the trajectory conserves their sum, and it ends anywhere on that
    energy level, where U's share of the sum is Beta(a, D/2) distributed for a potential U ~ Gamma(a) (a Gaussian
    posterior: a = D/2). ``spread``: Var(U) over a Gaussian's D/2, i.e. a = spread * D/2."""
    rng = np.random.default_rng(seed)
    a, b = spread * dim / 2, dim / 2
    u = rng.gamma(a, size=chains)
    out = np.empty((chains, draws))
    for n in range(draws):
        out[:, n] = u + rng.gamma(b, size=chains)  # the draw's energy: U at its start plus the fresh momentum's
        u = out[:, n] * rng.beta(a, b, size=chains)  # where the trajectory ends on that level
    return out


@pytest.mark.parametrize("spread", [1.0, 6.0])
def test_exact_hmc_s_bfmi_is_the_dimension_over_the_energy_variance(spread):
    """E-BFMI of exact HMC = D / (Var(U) + D/2) under any mass matrix: 1 on a Gaussian posterior, 2/7 where the
    potential varies six times as much; every draw changes the energy by D in mean square."""
    dim = 200
    energy = ideal_hmc_energies(dim, spread, chains=4, draws=20_000)
    bfmi = az.bfmi(energy)
    assert bfmi == pytest.approx(np.full(4, dim / (spread * dim / 2 + dim / 2)), rel=0.06)
    rows = energy_exploration(energy, dim)
    assert [r["change_over_dim"] for r in rows] == pytest.approx([1.0] * 4, rel=0.03)
    assert [r["spread_over_gaussian"] for r in rows] == pytest.approx([spread] * 4, rel=0.1)


def test_a_low_bfmi_says_whether_the_posterior_or_the_sampler_caused_it(vi_dir):
    _, data, posterior = load_run(vi_dir)
    pyro.set_rng_seed(0)
    draws = posterior.sample(1600)
    chains = {k: v.reshape(4, 400, *v.shape[1:]) for k, v in draws.items()}
    dim = sum(int(np.prod(v.shape[2:])) for v in chains.values())
    heavy = ideal_hmc_energies(dim, spread=9.0, chains=4, draws=400)  # BFMI about 0.2, draws changing it in full
    slow = np.cumsum(np.random.default_rng(1).normal(0.0, 0.3 * math.sqrt(dim), (4, 400)), axis=1)  # a random walk
    for energy, cause in ((heavy, "log density's variance is"), (slow, "less than fresh momenta would")):
        stats = {"energy": torch.as_tensor(energy), "diverging": torch.zeros(4, 400, dtype=torch.bool)}
        result = check(to_inference_data(posterior, data, chains=chains, stats=stats, num_test_points=4))
        low = [w for w in result["warnings"] if w.startswith("BFMI")]
        assert len(low) == 4 and all(cause in w for w in low), low
        assert len(result["energy"]) == 4 and result["weights"]["n_elements"] == dim
        # the draws are independent, so R-hat and ESS pass: the line does not ask for more draws, which fix neither
        line = verdict(result)
        assert line.startswith("NOT CONVERGED") and "more draws do not fix" in line and "run more" not in line
        if energy is heavy:  # the stated spread is the simulated one, within 400 draws' noise
            assert all(5.0 < float(w.split("variance is ")[1].split("x")[0]) < 13.0 for w in low)
            assert "it moves most with" in low[0] and len(result["lp_moves_with"]) == 2
    moves = lp_moves_with(to_inference_data(posterior, data, chains=chains, num_test_points=4).posterior, top=3)
    assert len(moves) == 3 and all(-1 <= m["correlation"] <= 1 for m in moves)
    assert [abs(m["correlation"]) for m in moves] == sorted((abs(m["correlation"]) for m in moves), reverse=True)
