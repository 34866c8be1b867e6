"""The compiled-step benchmark runs tiny: the four sides on the digits MLP, every ratio under a key containing
'ratio'; impossible settings are refused."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import compiled_step  # noqa: E402

from tests.conftest import compiled_step as compiled_marks  # noqa: E402


@pytest.mark.slow  # compiles the zoo's and the hand-written step: ~20 s (make test-slow)
@compiled_marks
def test_tiny_run_times_four_sides_and_writes_its_ratios(tmp_path, capsys):
    out = tmp_path / "compiled.json"
    figures = compiled_step.main(["--nets", "digits", "--rounds", "2", "--steps", "2", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(figures))
    row = figures["nets"]["digits"]
    assert {side: len(times) for side, times in row["times_us"].items()} == {side: 2 for side in compiled_step.SIDES}
    assert row["ratio_zoo_compiled_to_eager"] > 0 and row["ratio_zoo_compiled_to_hand_compiled"] > 0
    assert "digits MLP 64-100-10" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--nets", "vgg"], ["--rounds", "0"], ["--nets", ""]])
def test_impossible_settings_are_refused(argv):
    with pytest.raises(SystemExit):
        compiled_step.main(argv)
