"""Every shipped toy config trains at its defaults with ``zoo train`` and exits 0 (``make test-configs``; CI runs it).

The NUTS configs are left out: Pyro's NUTS runs its chains one after another, tens of minutes each on one core, and
their headers say so. The same rule holds for every other shipped config (UCI, digits, images), which need data
or minutes to hours; they are trained by the benchmarks.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from zoo.cli import main
from zoo.spec import load_spec

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TOY = sorted(CONFIGS.glob("*_toy.yaml"))
LONG = [p for p in TOY if load_spec(p).inference.method == "nuts"]


def test_the_long_nuts_configs_state_their_time_in_their_header():
    assert LONG, "no NUTS toy config found: is the selection below still right?"
    for path in LONG:
        header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
        assert re.search(r"\d+\s*(min|minutes|h\b|hours)", header), f"{path.name}: state its run time in the header"


@pytest.mark.configs
@pytest.mark.parametrize("path", [p for p in TOY if p not in LONG], ids=lambda p: p.stem)
def test_a_shipped_toy_config_trains_at_its_defaults(path, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", str(path), "--out", str(out), "--no-progress"])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    assert code == 0, f"{path.name} exited {code}:\n{captured.err[-2000:]}"
    assert (out / "metrics.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # nothing written beside the run
