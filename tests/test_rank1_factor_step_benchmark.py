"""benchmarks/rank1_factor_step.py: the factors step at M times the lr and W at it, M = 1 is the defaults suite's own
fit, a small run's table and ratios, bad options refused."""

from __future__ import annotations

import json

import pytest
import torch

import zoo
from tests.conftest import load_benchmark
from zoo.errors import ZooInputError

step = load_benchmark("rank1_factor_step")
defaults = load_benchmark("defaults")


def test_the_guides_tensors_step_at_the_multiple_and_the_point_parameters_at_the_lr(monkeypatch):
    stepped: list[list[float]] = []
    adam_step = torch.optim.Adam.step

    def recorded(optimizer, closure=None):
        stepped.append([group["lr"] for group in optimizer.param_groups])
        return adam_step(optimizer, closure)

    monkeypatch.setattr(torch.optim.Adam, "step", recorded)
    x = torch.randn(40, 3, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).long()
    bnn = zoo.BNN(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)),
                  member="rank1_normal", device="cpu")
    with step.factor_step(3.0):
        bnn.fit((x, y), num_steps=4, lr=0.01, progress=False)  # a set lr is constant
    assert stepped == [[pytest.approx(0.03), pytest.approx(0.01)]] * 4
    groups = step.factor_groups({"guide.loc.0/r": torch.nn.Parameter(torch.zeros(1)),
                                 "family.0": torch.nn.Parameter(torch.zeros(1))}, 3.0)
    assert [(len(g["params"]), g["lr_scale"]) for g in groups] == [(1, 3.0), (1, 1.0)]


def test_at_one_the_fit_is_the_defaults_suites_and_at_another_multiple_it_is_not():
    case = defaults.ALL_CASES["twoclass"]
    rows = case.rows(0, "small", None)
    suite = defaults.member_fit(case, rows, 0, "rank1_normal", defaults.SMALL_EPOCHS, size="small")
    with step.factor_step(1.0):
        same = defaults.member_fit(case, rows, 0, "rank1_normal", defaults.SMALL_EPOCHS, size="small")
    with step.factor_step(10.0):
        other = defaults.member_fit(case, rows, 0, "rank1_normal", defaults.SMALL_EPOCHS, size="small")
    assert (same["accuracy"], same["nll"]) == (suite["accuracy"], suite["nll"])
    assert other["nll"] != suite["nll"]


def test_a_small_run_tables_every_cell_and_its_ratios_and_resumes_from_its_cells(tmp_path, monkeypatch):
    argv = ["--size", "small", "--cases", "twoclass", "--members", "rank1_normal", "--seeds", "0",
            "--multipliers", "1,3", "--cells", str(tmp_path / "cells.jsonl"), "--json", str(tmp_path / "out.json")]
    report = step.main(argv)
    row = report["cases"]["twoclass"]["members"]["rank1_normal"]
    assert set(row) == {"1", "3"} and all(0 <= r["accuracy"] <= 1 and r["nll"] > 0 for r in row.values())
    assert report["ratios"] == {"twoclass/rank1_normal/x3/nll_ratio_to_x1": pytest.approx(row["3"]["nll"]
                                                                                          / row["1"]["nll"])}
    assert json.loads((tmp_path / "out.json").read_text()) == json.loads(json.dumps(report))
    monkeypatch.setattr(step, "member_fit", lambda *a, **k: pytest.fail("a finished cell was fitted again"))
    assert step.main(argv)["cases"] == report["cases"]


@pytest.mark.parametrize("argv, option", [(["--cases", "cifar"], "--cases"), (["--members", "mean_field"], "--members"),
                                          (["--multipliers", "0"], "--multipliers"),
                                          (["--multipliers", "a"], "--multipliers")])
def test_bad_options_name_the_option(argv, option):
    with pytest.raises(ZooInputError, match=option):
        step.main(argv)
