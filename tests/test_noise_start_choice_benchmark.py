"""benchmarks/noise_start_choice.py: a small run fits both starts and names the one the validation rows prefer; bad
options are refused."""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_benchmark
from zoo.errors import ZooInputError

choice = load_benchmark("noise_start_choice")


def test_a_small_run_fits_both_starts_and_names_the_rows_choice(tmp_path):
    out = tmp_path / "starts.json"
    summary = choice.main(["--size", "small", "--cases", "toy", "--seeds", "0", "--members", "map",
                           "--json", str(out)])
    (r,) = summary["results"]
    assert r["low"] != r["median"]  # two fits from two starts
    assert r["preferred"] == max(("low", "median"), key=lambda s: r[s]["val_ll"])
    assert r["lower_test_rmse"] == min(("low", "median"), key=lambda s: r[s]["rmse"])
    assert summary["agreement_ratio"] == summary["agreeing"] / 1
    assert json.loads(out.read_text())["results"] == summary["results"]


@pytest.mark.parametrize("option, value", [("--cases", "twoclass"), ("--cases", "nope"), ("--members", "nope")])
def test_a_classification_or_unknown_name_is_refused(option, value):
    with pytest.raises(ZooInputError, match=option):
        choice.main(["--size", "small", option, value])
