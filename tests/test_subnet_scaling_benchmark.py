"""The subnetwork-scaling benchmark runs tiny, in fresh processes: it prints its table, writes the same figures
(every ratio under a key containing 'ratio'), its times are positive and add up, and the layer-factor Jacobian
of its dense reference equals the dense Jacobian sliced to the subnet."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import subnet_scaling  # noqa: E402

ROW_KEYS = {"size", "factors_s", "jacobian_s", "ggn_s", "jacobian_ggn_s", "cholesky_s", "total_s", "peak_mib",
            "peak_rss_mib", "baseline_rss_mib", "ggn_mib",
            "stored_jacobian_mib", "finite"}
DENSE_KEYS = {"layer_factor_s", "layer_factor_peak_mib", "dense_s", "dense_peak_mib", "dense_chunk_s",
              "dense_chunk_peak_mib", "dense_time_ratio", "dense_memory_ratio", "chunk_rows", "dense_rows", "scaled",
              "max_abs_difference", "size"}


@pytest.mark.slow  # the benchmark end to end: ~16 s (make test-slow)
def test_benchmark_writes_the_table_figures(tmp_path, capsys):
    out = tmp_path / "subnet_scaling.json"
    returned = subnet_scaling.main(["--widths", "20,16,16,3", "--rows", "50", "--chunk", "20", "--sizes", "20,10",
                                    "--threads", "1", "--device", "cpu", "--json", str(out)])
    figures = json.loads(out.read_text())
    assert figures == json.loads(json.dumps(returned))
    parameters = 20 * 16 + 16 + 16 * 16 + 16 + 16 * 3 + 3
    assert figures["widths"] == [20, 16, 16, 3] and figures["parameters"] == parameters
    assert figures["rows"] == 50 and figures["classes"] == 3 and figures["sizes"] == [10, 20]
    assert "synthetic" in figures["data"] and "initialisation" in figures["linearisation_point"]
    printed = capsys.readouterr().out
    lines = {line.split("│")[1].strip(): line for line in printed.splitlines() if line.count("│") == 7}
    for row, size in zip(figures["by_size"], [10, 20], strict=True):
        assert ROW_KEYS <= set(row) and row["size"] == size and row["finite"] is True
        for key in ("factors_s", "jacobian_s", "ggn_s", "cholesky_s"):
            assert row[key] > 0, key
        assert row["jacobian_ggn_s"] == pytest.approx(row["factors_s"] + row["jacobian_s"] + row["ggn_s"])
        assert row["total_s"] == pytest.approx(row["jacobian_ggn_s"] + row["cholesky_s"])
        assert row["ggn_mib"] == size**2 * 8 / 2**20 and row["peak_mib"] >= 0
        assert row["stored_jacobian_mib"] == 50 * 3 * size * 8 / 2**20
        cells = [c.strip() for c in lines[str(size)].split("│")[1:-1]]  # the table row of this size
        assert cells == [str(size)] + [subnet_scaling.fmt(row[k]) for k in
                                       ("jacobian_ggn_s", "cholesky_s", "total_s", "peak_mib", "ggn_mib")]
    ratios = figures["ratios"]
    assert all("ratio" in key for key in ratios) and ratios["size_ratio"] == 2
    assert ratios["total_ratio_largest_over_smallest"] == pytest.approx(
        figures["by_size"][1]["total_s"] / figures["by_size"][0]["total_s"])
    dense = figures["dense_reference"]
    assert DENSE_KEYS <= set(dense) and dense["size"] == 10
    assert dense["chunk_rows"] == dense["dense_rows"] == 20 and dense["scaled"] is False  # far below 4 GiB
    assert dense["layer_factor_s"] > 0 and dense["dense_s"] > 0
    assert dense["dense_time_ratio"] == pytest.approx(dense["dense_s"] / dense["layer_factor_s"])
    assert dense["max_abs_difference"] <= 1e-5 * max(1.0, dense["max_abs_jacobian"])
    assert "ratio" in printed and "dense" in printed and "synthetic" in printed


def test_dense_plan_measures_fewer_rows_when_the_chunk_is_too_large():
    plan = subnet_scaling.dense_plan(rows=1000, chunk=256, outputs=10, parameters=478_410, max_gib=4.0)
    assert plan["chunk_rows"] == 256 and plan["scaled"] is True
    assert plan["dense_chunk_jacobian_gib"] == pytest.approx(256 * 10 * 478_410 * 4 / 2**30)  # 4.56 GiB
    assert plan["dense_rows"] == 56 and plan["dense_measured_jacobian_gib"] <= 1.0
    small = subnet_scaling.dense_plan(rows=50, chunk=256, outputs=3, parameters=659, max_gib=4.0)
    assert small["chunk_rows"] == small["dense_rows"] == 50 and small["scaled"] is False
