"""The HMC speed benchmark runs tiny, prints its tables and writes its figures: per-sampler ESS, R-hat and
divergences, and the ratios zoo best ÷ NumPyro best and zoo best ÷ BlackJAX best as the quotients of the reported
ESS/s; and its NumPyro model, and the log density BlackJAX samples, are the zoo's model (the same potential energy
at the same weights, the same f(x)), on the toy and on bostonHousing (a tiny folder of that name written by the
test, so it runs without the UCI data)."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("numpyro", reason="the NumPyro side needs the bench extra: pip install -e .[bench]")
pytest.importorskip("arviz", reason="the benchmark's ESS and R-hat need ArviZ: pip install arviz")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import hmc_speed  # noqa: E402

from zoo.inference.potential import Potential  # noqa: E402
from zoo.pipeline import prepare  # noqa: E402
from zoo.spec import load_spec  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED_UCI = REPO.parent / "shared" / "data" / "uci"

ROW_KEYS = {"side", "method", "chains", "warmup", "samples", "seconds", "compile_seconds", "divergences",
            "ess_bulk", "min_ess", "rhat", "rhat_max", "min_ess_per_s", "min_ess_per_s_compile_inclusive",
            "leapfrog_steps_per_draw"}


@pytest.mark.slow  # every side compiled and run tiny: ~20 s (make test-slow)
def test_benchmark_writes_ess_per_second_and_their_ratio(tmp_path, capsys):
    pytest.importorskip("blackjax", reason="the BlackJAX side needs the bench extra: pip install -e .[bench]")
    out = tmp_path / "hmc_speed.json"
    hmc_speed.main(["--warmup", "10", "--samples", "10", "--zoo-methods", "hmc:4,mams:4", "--numpyro-methods",
                    "vectorized:2", "--blackjax-methods", "chees:2,adjusted_mclmc:2", "--zoo-set",
                    "inference.max_leapfrog_steps=8", "--json", str(out)])
    figures = json.loads(out.read_text())
    assert figures["warmup"] == 10 and figures["samples"] == 10 and figures["n_train"] == 100
    assert figures["noise_original_units"] == 0.1
    assert figures["noise_standardised"] == pytest.approx(0.1 / figures["y_std"])
    assert len(figures["x_eval"]) == len(figures["x_eval_standardised"]) == 5
    assert set(figures["zoo"]) == {"hmc:4", "mams:4"} and set(figures["numpyro"]) == {"vectorized:2"}
    assert figures["numpyro_best"] == "vectorized:2"
    assert set(figures["blackjax"]) == {"chees:2", "adjusted_mclmc:2"}
    zoo, npy, bjx = figures["zoo"]["hmc:4"], figures["numpyro"]["vectorized:2"], figures["blackjax"]["chees:2"]
    mams, mclmc = figures["zoo"]["mams:4"], figures["blackjax"]["adjusted_mclmc:2"]
    # what a gradient buys: ESS per 1,000 of the sampling phase's gradients (McLachlan takes two a step)
    for row, per_step in ((zoo, 1), (mams, 1), (npy, 1), (bjx, 1), (mclmc, 2)):
        assert row["gradients_per_draw"] == per_step * row["leapfrog_steps_per_draw"]
        assert row["min_ess_per_1k_gradients"] == pytest.approx(
            1000 * row["min_ess"] / (row["gradients_per_draw"] * row["chains"] * row["samples"]))
    # and, where the sampler reports its warm-up, what all of the run's gradients buy: the zoo counts every warm-up
    # step (at most 8 here, one gradient each), BlackJAX's ChEES its adaptation's integration steps
    for row in (zoo, mams, bjx):
        assert 10 <= row["warmup_gradients_per_chain"] <= (80 if row["side"] == "zoo" else 10 * 1000)
        assert row["min_ess_per_1k_gradients_with_warmup"] == pytest.approx(1000 * row["min_ess"] / (
            row["chains"] * (row["gradients_per_draw"] * row["samples"] + row["warmup_gradients_per_chain"])))
    assert mclmc["warmup_gradients_per_chain"] is None and mclmc["min_ess_per_1k_gradients_with_warmup"] is None
    assert mams["leapfrog_steps_per_draw"] <= 8
    assert set(mclmc["settings"]) == {"step_size", "trajectory_length", "chains_tuned_to_nan"}
    # the best of a side is its highest min ESS/s, and the ratios are the best's
    for side in ("zoo", "blackjax"):
        assert figures[f"{side}_best"] == max(figures[side], key=lambda k: figures[side][k]["min_ess_per_s"])
    zoo_best, bjx_best = figures["zoo"][figures["zoo_best"]], figures["blackjax"][figures["blackjax_best"]]
    assert set(bjx) == set(npy) | {"settings"} and bjx["side"] == "blackjax"
    assert npy["warmup_gradients_per_chain"] is None  # NumPyro's warm-up is not counted
    assert set(bjx["settings"]) == {"step_size", "trajectory_length"}
    assert bjx["settings"]["step_size"] > 0 and bjx["settings"]["trajectory_length"] > 0
    assert 1 <= bjx["leapfrog_steps_per_draw"] <= 1000
    for row, chains in ((zoo, 4), (npy, 2), (bjx, 2)):
        assert ROW_KEYS <= set(row)
        assert row["chains"] == chains and row["samples"] == 10 and row["warmup"] == 10
        assert len(row["ess_bulk"]) == 5 and len(row["rhat"]) == 5
        assert row["min_ess"] == min(row["ess_bulk"]) and row["rhat_max"] == max(row["rhat"])
        assert row["seconds"] > 0 and row["min_ess"] > 0 and row["divergences"] >= 0
        assert row["min_ess_per_s"] == row["min_ess"] / row["seconds"]
    assert zoo["leapfrog_steps_per_draw"] <= 8  # the --zoo-set override reached the sampler
    assert npy["compile_seconds"] > 0 and npy["seconds_compile_inclusive"] == pytest.approx(
        npy["seconds"] + npy["compile_seconds"])
    assert npy["min_ess_per_s_compile_inclusive"] == npy["min_ess"] / npy["seconds_compile_inclusive"]
    assert bjx["compile_seconds"] > 0 and bjx["seconds_compile_inclusive"] == pytest.approx(
        bjx["seconds"] + bjx["compile_seconds"])
    assert bjx["min_ess_per_s_compile_inclusive"] == bjx["min_ess"] / bjx["seconds_compile_inclusive"]
    assert {"ratio_zoo_over_numpyro", "ratio_zoo_over_numpyro_compile_inclusive"} <= {k for k in figures if
                                                                                       "ratio" in k}
    assert figures["zoo_best_min_ess_per_s"] == zoo_best["min_ess_per_s"]
    assert figures["numpyro_best_min_ess_per_s"] == npy["min_ess_per_s"]
    assert figures["ratio_zoo_over_numpyro"] == zoo_best["min_ess_per_s"] / npy["min_ess_per_s"]
    assert figures["blackjax_best_min_ess_per_s"] == bjx_best["min_ess_per_s"]
    assert figures["ratio_zoo_over_blackjax"] == zoo_best["min_ess_per_s"] / bjx_best["min_ess_per_s"]
    assert {"blackjax", "optax"} <= set(figures["versions"])
    assert zoo["compile_seconds"] >= 0 and zoo["seconds_compile_inclusive"] == pytest.approx(
        zoo["seconds"] + zoo["compile_seconds"])
    assert zoo["min_ess_per_s_compile_inclusive"] == zoo["min_ess"] / zoo["seconds_compile_inclusive"]
    inclusive_best = figures["zoo"][figures["zoo_best_compile_inclusive"]]
    assert figures["ratio_zoo_over_numpyro_compile_inclusive"] == (
        inclusive_best["min_ess_per_s_compile_inclusive"] / npy["min_ess_per_s_compile_inclusive"])
    assert figures["ratio_within_target"] is (figures["ratio_zoo_over_numpyro"] >= hmc_speed.TARGET_RATIO)
    printed = capsys.readouterr().out
    assert "zoo hmc:4" in printed and "numpyro vectorized:2" in printed and "blackjax chees:2" in printed
    assert "zoo mams:4" in printed and "blackjax adjusted_mclmc:2" in printed and "ESS/1k grad" in printed
    assert "ratio" in printed and "÷ BlackJAX" in printed
    assert "…" not in printed  # no column cut short when the output is not a terminal
    # ten draws per chain cannot reach ESS 400: no candidate is converged, so no "converged" best or ratio
    assert not any(row["converged"] for side in ("zoo", "numpyro", "blackjax") for row in figures[side].values())
    assert figures["zoo_best_converged"] is None and figures["ratio_zoo_over_numpyro_converged"] is None
    assert hmc_speed.converged({"rhat_max": 1.005, "min_ess": 400.0, "divergences": 0})
    assert not hmc_speed.converged({"rhat_max": 1.011, "min_ess": 9000.0, "divergences": 0})
    # the stored figures print again, with the same ratios, without sampling anything
    again = hmc_speed.main(["--from-json", str(out)])
    assert again["ratio_zoo_over_numpyro"] == figures["ratio_zoo_over_numpyro"]
    assert "zoo hmc:4" in capsys.readouterr().out


def zoo_energy_at_three_weights():
    """The benchmark's model built as a zoo run, U at three seeded weight draws, and the NumPyro model of it."""
    spec = hmc_speed.build_spec("hmc", 3, 10, 10, [])
    data, family, _, _ = prepare(spec)
    potential = Potential(family, data)
    torch.manual_seed(0)
    z = torch.randn(3, potential.coords.dim)
    values, _ = potential.coords.unpack(z)
    model = hmc_speed.numpyro_model(50, 1.0, family.likelihood.fixed_noise)
    return data, family, potential, potential(z), values, model


def test_numpyro_model_has_the_zoo_potential():
    from numpyro.infer.util import potential_energy

    data, family, potential, zoo_energy, values, model = zoo_energy_at_three_weights()
    x, y = data.x_train.numpy(), data.y_train.numpy()
    for i in range(3):
        params = {name: value[i].numpy() for name, value in values.items()}
        numpyro_energy = float(potential_energy(model, (x, y), {}, params))
        assert numpyro_energy == pytest.approx(float(zoo_energy[i]), rel=1e-4)
    # and f(x) of NumPyro's draws is computed as the zoo's net computes it
    x_eval = hmc_speed.eval_inputs(data)
    with torch.no_grad():
        expected = family.forward_draws(values, x_eval)[..., 0]
    got = hmc_speed.numpy_forward({k: v.unsqueeze(0).numpy() for k, v in values.items()}, x_eval.double().numpy())
    assert got.shape == (1, 3, 5)
    assert torch.allclose(torch.from_numpy(got[0]).float(), expected, atol=1e-4)


def test_blackjax_log_density_is_minus_the_zoo_potential():
    pytest.importorskip("blackjax", reason="the BlackJAX side needs the bench extra: pip install -e .[bench]")
    import jax
    import numpy as np
    from jax.flatten_util import ravel_pytree

    data, family, potential, zoo_energy, values, model = zoo_energy_at_three_weights()
    logdensity, positions, site_values = hmc_speed.blackjax_problem(model, data, 3, jax.random.PRNGKey(0))
    # one flat start per chain, from independent prior draws, that unravels into the zoo's sites and shapes
    assert positions.shape == (3, potential.coords.dim)
    assert not np.allclose(positions[0], positions[1]) and not np.allclose(positions[1], positions[2])
    start = site_values(positions[0])
    assert {k: tuple(v.shape) for k, v in start.items()} == {k: tuple(v.shape[1:]) for k, v in values.items()}
    for i in range(3):
        params = {name: jax.numpy.asarray(value[i].numpy()) for name, value in values.items()}
        flat = ravel_pytree(params)[0]
        assert {k: np.asarray(v).tolist() for k, v in site_values(flat).items()} == {
            k: np.asarray(v).tolist() for k, v in params.items()}
        assert float(logdensity(flat)) == pytest.approx(-float(zoo_energy[i]), rel=1e-4)


def test_candidates_parse_and_refuse_unknown_methods():
    assert hmc_speed.parse_candidates("hmc:128, nuts:2", hmc_speed.ZOO_METHODS, "--zoo-methods") == [
        ("hmc", 128), ("nuts", 2)]
    for bad in ("hmc", "hmc:0", "mala:4", ""):
        with pytest.raises(ValueError, match="--zoo-methods"):
            hmc_speed.parse_candidates(bad, hmc_speed.ZOO_METHODS, "--zoo-methods")
    assert hmc_speed.parse_candidates("chees:64", hmc_speed.BLACKJAX_METHODS, "--blackjax-methods") == [
        ("chees", 64)]
    with pytest.raises(ValueError, match="--blackjax-methods"):
        hmc_speed.parse_candidates("meads:4", hmc_speed.BLACKJAX_METHODS, "--blackjax-methods")


# ------------------------------------------------------------------------------------------ bostonHousing
def write_boston(root: Path, n_rows: int = 40) -> Path:
    """A tiny ``bostonHousing`` folder in the standard UCI format under ``root`` (returned): 13 features and a
    target column, one split of 32 training and 8 test rows."""
    rng = np.random.default_rng(0)
    data = rng.normal(loc=3.0, scale=2.0, size=(n_rows, 14))
    data[:, 13] = 20 + 3 * data[:, 0] - 2 * data[:, 5] + rng.normal(size=n_rows)
    folder = root / "bostonHousing"
    folder.mkdir(parents=True)
    (folder / "data.txt").write_text("\n".join(" ".join(f"{v:.6f}" for v in row) for row in data) + "\n")
    (folder / "index_features.txt").write_text("\n".join(map(str, range(13))) + "\n")
    (folder / "index_target.txt").write_text("13\n")
    (folder / "n_splits.txt").write_text("1\n")
    perm = rng.permutation(n_rows)
    (folder / "index_train_0.txt").write_text("\n".join(map(str, perm[:32])) + "\n")
    (folder / "index_test_0.txt").write_text("\n".join(map(str, perm[32:])) + "\n")
    return root


@pytest.fixture(params=["tiny", "shared"])
def boston_root(request, tmp_path) -> Path:
    """A folder holding bostonHousing: the tiny one this test writes, or the real data beside the repository."""
    if request.param == "tiny":
        return write_boston(tmp_path)
    if not (SHARED_UCI / "bostonHousing").is_dir():
        pytest.skip(f"the UCI data is not at {SHARED_UCI} (the tiny folder's case runs everywhere)")
    return SHARED_UCI


def boston_energy_at_three_points(root: Path):
    """The benchmark's bostonHousing model built as a zoo run, U at three seeded unconstrained points (weights and
    log noise), the constrained values there, and the NumPyro model written from the spec."""
    spec = hmc_speed.build_spec("hmc", 3, 10, 10, [], hmc_speed.BOSTON, str(root))
    data, family, _, _ = prepare(spec)
    potential = Potential(family, data)
    torch.manual_seed(0)
    z = torch.randn(3, potential.coords.dim)
    values, _ = potential.coords.unpack(z)
    unconstrained = {name: potential.coords.transforms[name].inv(value) for name, value in values.items()}
    return data, family, potential, potential(z), values, unconstrained, hmc_speed.numpyro_model_of(spec, family)


def test_boston_model_is_that_of_the_hmc_uci_config(tmp_path):
    spec = hmc_speed.build_spec("hmc", 3, 10, 10, [], hmc_speed.BOSTON, str(tmp_path))
    config = load_spec(REPO / "configs" / "hmc_uci.yaml")
    for section in ("net", "prior", "likelihood"):
        assert getattr(spec, section) == getattr(config, section), section
    assert (spec.data.name, spec.data.split, spec.data.dir) == ("uci:bostonHousing", 0, str(tmp_path))
    assert (config.data.name, config.data.split) == ("uci:bostonHousing", 0)
    assert spec.likelihood.noise == "learned"


def test_boston_numpyro_model_has_the_zoo_potential(boston_root):
    from numpyro.infer.util import potential_energy

    data, family, potential, zoo_energy, values, unconstrained, model = boston_energy_at_three_points(boston_root)
    assert data.in_dim == 13 and values["hidden0.weight"].shape == (3, 50, 13)
    assert values["noise_scale"].shape == (3,)  # one scalar sigma per point, the zoo's latent site
    assert torch.allclose(unconstrained["noise_scale"], values["noise_scale"].log())
    x, y = data.x_train.numpy(), data.y_train.numpy()
    for i in range(3):
        # potential_energy takes unconstrained values: NumPyro maps log sigma to sigma with its log-Jacobian, as the
        # zoo's Coordinates do, so the two potentials agree exactly (the zoo drops no constant)
        params = {name: value[i].numpy() for name, value in unconstrained.items()}
        numpyro_energy = float(potential_energy(model, (x, y), {}, params))
        assert numpyro_energy == pytest.approx(float(zoo_energy[i]), rel=1e-4)
    # the noise enters the density: another sigma, another potential on both sides
    params = {name: value[0].numpy() for name, value in unconstrained.items()}
    moved = {**params, "noise_scale": params["noise_scale"] + 0.5}
    assert float(potential_energy(model, (x, y), {}, moved)) != pytest.approx(float(zoo_energy[0]), rel=1e-3)
    # f at the first five test rows (standardised as the zoo holds them) is computed as the zoo's ReLU net does
    x_eval = hmc_speed.BOSTON.eval_inputs(data)
    assert torch.equal(x_eval, data.x_test[:5])
    with torch.no_grad():
        expected = family.forward_draws(values, x_eval)[..., 0]
    got = hmc_speed.numpy_forward({k: v.unsqueeze(0).numpy() for k, v in values.items()}, x_eval.double().numpy(),
                                  "relu")
    assert got.shape == (1, 3, 5)
    assert torch.allclose(torch.from_numpy(got[0]).float(), expected, atol=1e-4)


def test_boston_blackjax_log_density_is_minus_the_zoo_potential(boston_root):
    pytest.importorskip("blackjax", reason="the BlackJAX side needs the bench extra: pip install -e .[bench]")
    import jax
    from jax.flatten_util import ravel_pytree

    data, family, potential, zoo_energy, values, unconstrained, model = boston_energy_at_three_points(boston_root)
    logdensity, positions, site_values = hmc_speed.blackjax_problem(model, data, 3, jax.random.PRNGKey(0))
    assert positions.shape == (3, potential.coords.dim)
    start = site_values(positions[0])
    assert {k: tuple(v.shape) for k, v in start.items()} == {k: tuple(v.shape[1:]) for k, v in values.items()}
    assert float(start["noise_scale"]) > 0  # site_values gives sigma, constrained
    for i in range(3):
        flat = ravel_pytree({name: jax.numpy.asarray(value[i].numpy()) for name, value in unconstrained.items()})[0]
        assert float(logdensity(flat)) == pytest.approx(-float(zoo_energy[i]), rel=1e-4)
        assert float(site_values(flat)["noise_scale"]) == pytest.approx(float(values["noise_scale"][i]), rel=1e-6)


@pytest.mark.slow  # every side compiled and run tiny: ~15 s (make test-slow)
def test_boston_benchmark_runs_tiny_and_writes_its_model(tmp_path, capsys):
    pytest.importorskip("blackjax", reason="the BlackJAX side needs the bench extra: pip install -e .[bench]")
    root, out = write_boston(tmp_path / "uci"), tmp_path / "hmc_speed_boston.json"
    with_nutpie = importlib.util.find_spec("nutpie") is not None  # the nutpie extra, where it is installed
    hmc_speed.main(["--model", "uci:bostonHousing", "--data-dir", str(root), "--warmup", "10", "--samples", "10",
                    "--zoo-methods", "hmc:4,hmc_lowrank:4", "--numpyro-methods", "vectorized:2",
                    "--blackjax-methods", "chees:2", "--zoo-set", "inference.max_leapfrog_steps=8", "--json", str(out)]
                   + (["--nutpie-methods", "low_rank:2"] if with_nutpie else []))
    figures = json.loads(out.read_text())
    assert figures["bench_model"] == "uci:bostonHousing" and figures["data"] == "uci:bostonHousing"
    assert figures["split"] == 0 and figures["data_dir"] == str(root.resolve()) and figures["n_train"] == 32
    assert figures["model"] == ("13-50-1 relu, Normal(0, 1) prior, Gaussian likelihood with learned noise, "
                                "LogNormal(-1, 1) prior")
    assert figures["noise"] == "learned" and figures["noise_standardised"] is None
    assert figures["noise_prior"] == {"name": "lognormal", "loc": -1.0, "scale": 1.0, "units": "standardised"}
    assert np.array(figures["x_eval"]).shape == np.array(figures["x_eval_standardised"]).shape == (5, 13)
    sides = [("zoo", "hmc:4"), ("zoo", "hmc_lowrank:4"), ("numpyro", "vectorized:2"), ("blackjax", "chees:2")]
    for side, name in sides + ([("nutpie", "low_rank:2")] if with_nutpie else []):
        row = figures[side][name]
        assert len(row["ess_bulk"]) == 5 and row["min_ess"] == min(row["ess_bulk"]) and row["seconds"] > 0
    if with_nutpie:  # its warm-up's leapfrog steps, and the directions its mass matrix modified
        nutpie_row = figures["nutpie"]["low_rank:2"]
        assert nutpie_row["warmup_gradients_per_chain"] >= 10 and "mass_matrix_directions" in nutpie_row["settings"]
        assert figures["ratio_zoo_over_nutpie"] == pytest.approx(
            figures["zoo_best_min_ess_per_s"] / figures["nutpie_best_min_ess_per_s"])
    printed = " ".join(capsys.readouterr().out.split())  # the title wraps
    assert "learned noise, LogNormal(-1, 1) prior on uci:bostonHousing split 0, 10 warm-up" in printed
    assert "bulk ESS and R-hat of f(x) at the first 5 test rows (min / max of the five)" in printed
    hmc_speed.main(["--from-json", str(out)])
    assert "at the first 5 test rows" in " ".join(capsys.readouterr().out.split())


def test_boston_without_its_data_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        hmc_speed.main(["--model", "uci:bostonHousing", "--data-dir", str(tmp_path / "absent")])
    assert exit_info.value.code == 2 and "absent" in capsys.readouterr().err


def test_boston_pymc_model_for_nutpie_has_the_zoo_potential(boston_root):
    pytest.importorskip("pymc", reason="the nutpie side needs its extra: pip install -e .[nutpie]")
    spec = hmc_speed.build_spec("hmc", 3, 10, 10, [], hmc_speed.BOSTON, str(boston_root))
    data, family, potential, zoo_energy, values, unconstrained, _ = boston_energy_at_three_points(boston_root)
    model = hmc_speed.pymc_model_of(spec, family, data)
    # PyMC samples log sigma (its value variable noise_scale_log__) with the log-Jacobian, as the zoo's coordinates
    logp = model.compile_logp(jacobian=True)
    names = {"noise_scale": "noise_scale_log__"}
    for i in range(3):
        point = {names.get(name, name): value[i].double().numpy() for name, value in unconstrained.items()}
        assert -float(logp(point)) == pytest.approx(float(zoo_energy[i]), rel=1e-4)


def test_the_zoo_candidates_name_their_metric_and_any_uci_folder_is_a_model():
    assert hmc_speed.zoo_sampler("hmc_lowrank") == {"method": "hmc", "metric": "low_rank"}
    assert hmc_speed.zoo_sampler("mams_lowrank") == {"method": "hmc", "kernel": "mams", "metric": "low_rank"}
    assert hmc_speed.zoo_sampler("hmc_mclachlan") == {"method": "hmc", "integrator": "mclachlan"}
    assert hmc_speed.bench_model("uci:bostonHousing") is hmc_speed.BOSTON
    energy = hmc_speed.bench_model("uci:energy")
    assert energy.sections["data"] == {"name": "uci:energy", "split": 0} and energy.uci
    assert energy.sections["net"] == hmc_speed.BOSTON.sections["net"]
    with pytest.raises(ValueError, match="uci:<folder>"):
        hmc_speed.bench_model("energy")
    assert hmc_speed.parse_candidates("diag:4,low_rank:2", hmc_speed.NUTPIE_METHODS, "--nutpie-methods") == [
        ("diag", 4), ("low_rank", 2)]
