"""The SVI overhead benchmark runs, prints its table and writes every ratio under a key containing 'ratio'."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import svi_overhead  # noqa: E402

from zoo.data.digits import load_digits  # noqa: E402


def test_zoo_and_hand_written_steps_optimise_the_same_objective():
    # Same data, same init, same batches, same estimator: both losses fall, and start from similar values.
    digits = load_digits(seed=0)
    spec = svi_overhead.SVISpec(lr=1e-2)
    zoo = svi_overhead.zoo_step([64, 16, 10], digits.x_train, digits.y_train, spec)
    hand = svi_overhead.hand_step([64, 16, 10], digits.x_train, digits.y_train, spec)
    zoo_losses = [zoo() for _ in range(40)]
    hand_losses = [hand() for _ in range(40)]
    assert abs(zoo_losses[0] - hand_losses[0]) / abs(hand_losses[0]) < 0.2
    assert sum(zoo_losses[-10:]) < sum(zoo_losses[:10]) and sum(hand_losses[-10:]) < sum(hand_losses[:10])


def test_benchmark_writes_ratios(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(svi_overhead, "BATCH", 32)
    out = tmp_path / "svi.json"
    svi_overhead.main(["--rounds", "1", "--steps", "2", "--warmup", "1", "--json", str(out), "--synthetic-rows", "256"])
    figures = json.loads(out.read_text())
    assert set(figures["cases"]) == {"digits 64-100-10", "784-400-400-10"}
    for case in figures["cases"].values():
        assert case["ratio_median"] > 0 and case["ratio_of_best"] > 0
        assert case["ratio_autonormal_to_local_reparam"] > 0
    assert "ratio" in capsys.readouterr().out
