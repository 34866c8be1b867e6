"""The rank-1 speed benchmark runs tiny, prints its tables and writes its figures: every ratio under a key
containing 'ratio', and parameter counts that match the closed forms of the rank-1 net and of the bound."""

import json
import sys
from itertools import pairwise
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import rank1_speed  # noqa: E402

from zoo.data.digits import load_digits  # noqa: E402

CASES = {"digits 64-100-10": [64, 100, 10], "784-400-400-10": [784, 400, 400, 10]}


def expected_counts(sizes: list[int], k: int) -> dict:
    layers = list(pairwise(sizes))
    weights = sum(i * o for i, o in layers)
    biases = sum(o for _, o in layers)
    fans = sum(i + o for i, o in layers)
    deterministic = weights + biases
    return {"params_deterministic": deterministic, "params_rank1_shared_weights": weights,
            "params_rank1_member_biases": k * biases, "params_rank1_factor_guide": 2 * k * fans,
            "params_rank1": weights + k * biases + 2 * k * fans,
            "params_rank1_factor_means_only": weights + k * biases + k * fans,
            "params_bound": deterministic + k * fans + k * biases}


@pytest.mark.slow  # the benchmark end to end: ~80 s (make test-slow)
def test_benchmark_writes_ratios_and_parameter_counts(tmp_path, capsys):
    out = tmp_path / "rank1.json"
    k = 3
    rank1_speed.main(["--members", str(k), "--batch", "16", "--rounds", "1", "--steps", "2", "--warmup", "1",
                      "--synthetic-rows", "64", "--json", str(out)])
    figures = json.loads(out.read_text())
    assert figures["members"] == k and figures["batch_size"] == 16 and figures["rounds"] == 1
    assert set(figures["cases"]) == set(CASES)
    for name, sizes in CASES.items():
        case = figures["cases"][name]
        assert case["sizes"] == sizes
        for mode in ("eager", "compiled"):
            timing = case[mode]
            assert {"ratio_median", "ratio_of_best", "ratios"} <= {key for key in timing if "ratio" in key}
            assert timing["ratio_median"] > 0 and timing["ratio_of_best"] > 0 and len(timing["ratios"]) == 1
            assert timing["rank1_us_per_step"] > 0 and timing["deterministic_us_per_step"] > 0
            assert timing["ratio_median"] == timing["rank1_us_per_step"] / timing["deterministic_us_per_step"]
        assert case["compiled"]["ratio_median_vs_eager_deterministic"] == (
            case["compiled"]["rank1_us_per_step"] / case["eager"]["deterministic_us_per_step"])
        assert case["ratio_median_best_mode"] == min(case[m]["ratio_median"] for m in ("eager", "compiled"))
        for key, value in expected_counts(sizes, k).items():
            assert case[key] == value, (name, key)
        # loc and rho per factor: the mixture exceeds the bound by K·Σ(fan-in + fan-out) − Σ biases;
        # the factor means alone (BatchEnsemble's count) stay within it
        assert case["params_rank1"] > case["params_bound"] and case["bound_holds"] is False
        assert case["bound_holds_factor_means_only"] is True
        assert case["median_within_target"] is (case["ratio_median_best_mode"] <= 1.5)
    printed = capsys.readouterr().out
    assert "ratio" in printed and "bound" in printed and "digits 64-100-10" in printed


@pytest.mark.parametrize("compile", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["eager", "compiled"])
def test_rank1_and_deterministic_steps_both_learn(compile):
    digits = load_digits(seed=0)
    spec = rank1_speed.SVISpec(lr=1e-2)
    rank1 = rank1_speed.rank1_step([64, 16, 10], digits.x_train, digits.y_train, spec, 2, 64, compile=compile)
    det = rank1_speed.deterministic_step([64, 16, 10], digits.x_train, digits.y_train, spec, 2, 64, compile=compile)
    rank1_losses = [rank1() for _ in range(30)]
    det_losses = [det() for _ in range(30)]
    assert sum(rank1_losses[-5:]) < sum(rank1_losses[:5]) and sum(det_losses[-5:]) < sum(det_losses[:5])
