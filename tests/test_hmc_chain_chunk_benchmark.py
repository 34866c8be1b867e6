"""benchmarks/hmc_chain_chunk.py, tiny: its table, JSON and ratios, and its refusals."""

import json

import pytest

from tests.conftest import load_benchmark
from zoo.errors import ZooInputError

chunk = load_benchmark("hmc_chain_chunk")


def test_tiny_run_prints_and_writes_every_chunk(tmp_path, capsys):
    out = tmp_path / "chunk.json"
    result = chunk.main(["--chains", "4", "--chunks", "4,2", "--modes", "eager", "--reps", "1", "--json", str(out)])
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(result))
    assert saved["chains"] == 4 and saved["data"] == "digits"
    assert [(r["mode"], r["chunk"]) for r in saved["timings"]] == [("eager", 4), ("eager", 2)]
    first, second = saved["timings"]
    assert first["ratio_all_at_once_to_this"] == 1.0
    assert second["ratio_all_at_once_to_this"] == pytest.approx(first["ms_per_call"] / second["ms_per_call"])
    assert second["ms_per_chain"] == pytest.approx(second["ms_per_call"] / 4)
    assert "all at once ÷ this" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--chunks", "0,4"], ["--chunks", "a"], ["--modes", "jit"], ["--reps", "0"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(ZooInputError):
        chunk.main(argv)
