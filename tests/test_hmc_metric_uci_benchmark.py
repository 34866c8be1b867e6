"""benchmarks/hmc_metric_uci.py: the metrics' side-by-side table from real runs, read again without rerunning, and
its refusals."""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_benchmark
from tests.test_uci_benchmark import write_folder
from tests.test_uci_references_benchmark import TINY

bench = load_benchmark("hmc_metric_uci")


@pytest.mark.parametrize("argv, message", [
    (["--metrics", "cholesky"], "--metrics"),
    (["--metrics", ","], "--metrics"),
    (["--samples", "0"], "--samples"),
])
def test_bad_input_exits_2_before_anything_runs(argv, message, tmp_path, capsys):
    assert bench.main([*argv, "--runs-dir", str(tmp_path / "runs")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow  # two zoo train subprocesses with their verdicts and plots (make test-slow)
def test_each_metric_is_run_once_and_compared_with_the_diagonal_per_gradient(tmp_path, capsys):
    write_folder(tmp_path / "uci", "tiny", n_rows=40)
    argv = ["--datasets", "tiny", "--splits", "0", "--metrics", "diagonal,dense", "--samples", "30",
            "--data-dir", str(tmp_path / "uci"), "--runs-dir", str(tmp_path / "runs"), *TINY,
            "--set", "inference.num_chains=4", "--set", "inference.warmup_steps=40",
            "--json", str(tmp_path / "out.json")]
    assert bench.main(argv) == 0
    rows = json.loads((tmp_path / "out.json").read_text())["rows"]
    assert [r["metric"] for r in rows] == ["diagonal", "dense"]
    diagonal, dense = rows
    assert diagonal["draws_per_chain"] == dense["draws_per_chain"] == 30 and diagonal["chains"] == 4
    assert diagonal["metric_directions"] == 0 and dense["metric_directions"] > 0
    # min ESS per 1,000 sampling gradients of one chain, from the run's own steps
    assert dense["ess_min_per_1000_gradients"] == pytest.approx(
        1000 * dense["ess_min"] / (dense["sampling_gradients_per_chain"] * 4))
    assert dense["ess_per_gradient_ratio_to_diagonal"] == pytest.approx(
        dense["ess_min_per_1000_gradients"] / diagonal["ess_min_per_1000_gradients"])
    assert "ess_per_gradient_ratio_to_diagonal" not in diagonal
    # the same command again reads the finished runs: nothing is sampled twice
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").rglob("samples.pt")}
    assert bench.main(argv) == 0
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").rglob("samples.pt")} == stamps
    assert "HMC metrics on UCI" in capsys.readouterr().out
    # another number of draws than the finished runs hold is refused, not silently read
    assert bench.main([*argv[:7], "31", *argv[8:]]) == 2
    assert "holds a finished run of 30 draws per chain" in capsys.readouterr().err
