"""The DataLoader benchmark runs both paths on every case, prints its table and writes every ratio under a key
containing 'ratio'."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import dataloader_speed  # noqa: E402


def test_benchmark_writes_a_ratio_per_case(tmp_path, capsys):
    out = tmp_path / "loader.json"
    assert dataloader_speed.main(["--steps", "3", "--rounds", "2", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert set(figures["cases"]) == set(dataloader_speed.cases())
    for case in figures["cases"].values():
        low, high = case["dataloader_ratio_quartiles"]
        assert case["dataloader_ratio"] > 0 and 0 < low <= high
    assert "ratio" in capsys.readouterr().out


def test_bad_counts_exit_2(tmp_path):
    assert dataloader_speed.main(["--steps", "0"]) == 2
