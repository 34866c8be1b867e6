"""benchmarks/noise_by_region.py: a region's figures in closed form for one draw, a small run, bad options."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.conftest import load_benchmark
from zoo.errors import ZooInputError

regions = load_benchmark("noise_by_region")


def test_a_point_estimates_region_has_the_gaussians_closed_form_nll():
    loc, y, sigma, unit = torch.tensor([[0.1, -0.2, 0.4]]), torch.tensor([0.0, 0.1, 0.1]), 0.25, 2.0
    got = regions.region_figures(loc, torch.full_like(loc, 0.5), sigma, y, unit)
    squares = ((loc[0] - y) ** 2).mean()
    assert got["rmse"] == pytest.approx(float(squares.sqrt()) * unit)
    assert got["spread"] == 0.0
    # in original units: the density of y * unit is the standardised one over unit
    assert got["nll_set"] == pytest.approx(0.5 * math.log(2 * math.pi * sigma**2) + float(squares) / (2 * sigma**2)
                                           + math.log(unit), rel=1e-6)
    assert got["nll_fit"] == pytest.approx(0.5 * math.log(2 * math.pi * 0.25) + float(squares) / 0.5
                                           + math.log(unit), rel=1e-6)


def test_a_small_run_scores_every_test_row_once_in_one_region(tmp_path):
    out = tmp_path / "regions.json"
    results = regions.main(["--size", "small", "--seeds", "0", "--members", "map", "--json", str(out)])
    (r,) = results
    rows = regions.CASES["toy"].rows(0, "small", None)
    assert r["clusters"]["rows"] + r["gap"]["rows"] == len(rows.y_test)
    assert r["clusters"]["rows"] > 0 and r["gap"]["rows"] > 0
    assert r["clusters"]["spread"] == r["gap"]["spread"] == 0.0  # a MAP's draws are one point
    assert json.loads(out.read_text())["results"] == results


def test_an_unknown_member_is_refused():
    with pytest.raises(ZooInputError, match="--members"):
        regions.main(["--size", "small", "--members", "nope"])
