"""The conv-speed benchmark runs tiny on a ResNet-8, prints its table and writes every ratio under a key containing
'ratio'; the deterministic side computes on the rows the family does (K x B for the member families)."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import conv_speed  # noqa: E402


def test_tiny_run_writes_ratios_per_family(tmp_path, capsys):
    out = tmp_path / "conv.json"
    figures = conv_speed.main(["--depth", "8", "--batch", "8", "--rows", "32", "--members", "2", "--rounds", "1",
                               "--steps", "1", "--warmup", "0", "--families",
                               "MAP,mean-field (local reparam.),rank-1 (mixture guide)", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(figures))
    rows = figures["rows"]
    assert set(rows) == {"MAP", "mean-field (local reparam.)", "rank-1 (mixture guide)"}
    assert rows["MAP"]["deterministic_rows"] == 8 and rows["rank-1 (mixture guide)"]["deterministic_rows"] == 16
    for row in rows.values():
        assert row["eager"]["versus_deterministic"]["ratio"] > 0
        assert row["eager"]["images_per_s"] > 0 and row["eager"]["per_image"]["ratio"] > 0
    assert rows["MAP"]["eager"]["per_image"] == rows["MAP"]["eager"]["versus_deterministic"]  # B rows already
    assert "rank1_ratio_within_target" in rows["rank-1 (mixture guide)"]["eager"]
    peer = rows["mean-field (local reparam.)"]["eager"]["versus_bayesian_torch"]
    assert "skipped" in peer or (peer["estimator"] == "Flipout" and peer["ratio"] > 0)
    printed = capsys.readouterr().out
    assert "ResNet-8" in printed and "rank-1 (mixture guide)" in printed


@pytest.mark.slow  # compiles a ResNet-8 step both ways: ~100 s here
def test_compiled_mode_times_the_compiled_step_and_reports_a_refused_one(tmp_path):
    figures = conv_speed.main(["--depth", "8", "--batch", "8", "--rows", "16", "--members", "2", "--rounds", "1",
                               "--steps", "1", "--warmup", "0", "--families", "rank-1 (mixture guide),deep ensemble",
                               "--modes", "compiled"])
    row = figures["rows"]["deep ensemble"]
    assert set(row) == {"deterministic_rows", "compiled"} and row["compiled"]["versus_deterministic"]["ratio"] > 0
    assert "slower compiled than eager" in figures["rows"]["rank-1 (mixture guide)"]["compiled"]["refused"]


def test_bf16_runs_every_side_under_autocast(tmp_path):
    figures = conv_speed.main(["--depth", "8", "--batch", "8", "--rows", "16", "--members", "2", "--rounds", "1",
                               "--steps", "1", "--warmup", "0", "--families", "mean-field (weight sample)",
                               "--precision", "bf16"])
    row = figures["rows"]["mean-field (weight sample)"]["eager"]
    assert figures["precision"] == "bf16" and row["images_per_s"] > 0 and "versus_bayesian_torch" not in row


@pytest.mark.parametrize("argv", [["--batch", "0"], ["--families", "nonsense"], ["--modes", "jit"],
                                  ["--precision", "bf16", "--modes", "compiled"]])
def test_impossible_settings_are_refused(argv):
    with pytest.raises(SystemExit):
        conv_speed.main(argv)
