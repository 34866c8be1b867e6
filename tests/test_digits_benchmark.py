"""The digits benchmark trains each seed and reports mean ± s.e. of the run metrics."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import digits  # noqa: E402

CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "mean_field_digits.yaml")


def test_parse_seeds():
    assert digits.parse_seeds("0-2,7") == [0, 1, 2, 7]


def test_two_seeds_end_to_end(tmp_path):
    out = tmp_path / "digits.json"
    figures = digits.main(["--spec", CONFIG, "--seeds", "0-1", "--set", "inference.num_steps=5",
                           "--set", "net.hidden=[8]", "--json", str(out)])
    saved = json.loads(out.read_text())
    assert len(saved["runs"]) == 2 and saved["runs"][0] != saved["runs"][1]
    accs = [r["accuracy"] for r in saved["runs"]]
    assert saved["accuracy_mean"] == figures["accuracy_mean"] == sum(accs) / 2
    assert {"ood_auroc_mi_mean", "ood_auroc_mi_se", "ece_mean"} <= set(saved)
