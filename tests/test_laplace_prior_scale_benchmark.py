"""benchmarks/laplace_prior_scale.py: the shifted inputs are what they say, a small run fits the defaults and the
evidence's prior, tables both and resumes from its cells, and bad options are refused."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import load_benchmark
from zoo.errors import ZooInputError

bench = load_benchmark("laplace_prior_scale")


def test_each_row_s_features_are_permuted_alike_and_square_images_rotated():
    x = torch.arange(2 * 64, dtype=torch.float32).reshape(2, 64)
    shifted = bench.shifted_inputs(x)
    assert set(shifted) == {"permuted", "rotated"}
    order = shifted["permuted"][0].long()  # row 0 holds 0..63: its permuted copy is the order itself
    assert sorted(order.tolist()) == list(range(64)) and order.tolist() != list(range(64))
    torch.testing.assert_close(shifted["permuted"][1], x[1, order])
    torch.testing.assert_close(shifted["rotated"][0].reshape(8, 8), x[0].reshape(8, 8).rot90(1, (0, 1)))
    images = x.reshape(2, 1, 8, 8)  # an image batch keeps its shape
    assert {k: v.shape for k, v in bench.shifted_inputs(images).items()} == {"permuted": images.shape,
                                                                              "rotated": images.shape}
    assert set(bench.shifted_inputs(torch.zeros(3, 8))) == {"permuted"}  # not a square image
    assert set(bench.shifted_inputs(torch.zeros(3, 16))) == {"permuted"}  # 4 x 4: too small to be an image


def test_a_small_run_fits_both_priors_tables_them_and_resumes_from_its_cells(tmp_path, monkeypatch):
    argv = ["--size", "small", "--cases", "digits", "--members", "diagonal_laplace", "--seeds", "0",
            "--cells", str(tmp_path / "cells.jsonl"), "--json", str(tmp_path / "out.json")]
    report = bench.main(argv)
    row = report["cases"]["digits"]["members"]["diagonal_laplace"]
    assert set(row) == {"default", "evidence"} and row["evidence"]["rejected"] == 0
    assert report["cases"]["digits"]["shifts"] == ["permuted", "rotated"]
    assert report["ratios"] == {"digits/diagonal_laplace/nll_ratio_default_to_evidence":
                                pytest.approx(row["default"]["nll"] / row["evidence"]["nll"])}
    cells = [json.loads(line) for line in (tmp_path / "cells.jsonl").read_text().splitlines()]
    assert [c["prior"] for c in cells] == ["default", "evidence"] and cells[1]["precision_scale"] is None
    assert json.loads((tmp_path / "out.json").read_text()) == json.loads(json.dumps(report))
    monkeypatch.setattr(bench, "scored_fit", lambda *a, **k: pytest.fail("a finished cell was fitted again"))
    assert bench.main(argv)["cases"] == report["cases"]


def test_a_fit_s_auroc_tells_shifted_rows_from_test_rows_by_the_predictive_entropy(monkeypatch):
    """A cell's AUROC is sklearn's, of the entropy of the predictive's class probabilities, shifted rows positive."""
    from sklearn.metrics import roc_auc_score

    defaults = load_benchmark("defaults")
    fitted = []
    monkeypatch.setattr(bench, "fitted_member", lambda *a, **k: fitted.append(defaults.fitted_member(*a, **k))
                        or fitted[-1])
    case = defaults.ALL_CASES["digits"]
    rows = case.rows(0, "small", None)
    cell = bench.scored_fit("small", "digits", rows, 0, "kfac_laplace", "evidence", defaults.SMALL_EPOCHS)
    assert cell["precision_scale"] is None and cell["nll"] == fitted[0].evaluate((rows.x_test, rows.y_test))["nll"]

    def entropy(x):
        p = fitted[0].predict(x, num_samples=bench.DRAWS).probs.double()
        return -(p * p.clamp_min(1e-300).log()).sum(-1)

    inside = entropy(rows.x_test)
    for name, x in bench.shifted_inputs(rows.x_test).items():
        labels = [0] * len(inside) + [1] * len(x)
        expected = roc_auc_score(labels, torch.cat([inside, entropy(x)]).numpy())
        assert cell["auroc"][name] == pytest.approx(expected, abs=1e-6), name


@pytest.mark.parametrize("argv, option", [(["--cases", "sequence"], "--cases"), (["--cases", "uci"], "--cases"),
                                          (["--cases", "cifar"], "--cases"), (["--members", "map"], "--members")])
def test_bad_options_name_the_option(argv, option):
    with pytest.raises(ZooInputError, match=option):
        bench.main(argv)
