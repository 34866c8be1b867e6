"""Every tutorial notebook runs end to end at a small size (ZOO_NOTEBOOK_SIZE=small) and is a page of the docs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="notebook tests need nbformat and nbclient (pip install -e .[dev])")
nbclient = pytest.importorskip("nbclient", reason="notebook tests need nbformat and nbclient (pip install -e .[dev])")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


# every notebook, with a file its run must leave behind
NOTEBOOK_OUTPUTS = {
    "hmc_vs_vi_regression.ipynb": "hmc/samples.pt",  # both HMC-vs-VI notebooks sample the many-chain HMC
    "hmc_vs_vi_classification.ipynb": "hmc/samples.pt",
    "bayes_by_backprop.ipynb": "digits_gaussian/metrics.json",  # the prior swapped by one override
    "rank1.ipynb": "digits_batchensemble/metrics.json",
    "subnet_laplace.ipynb": "untuned/metrics.json",
    "baselines.ipynb": "concrete_toy/metrics.json",
    "autoguides.ipynb": "auto_mvn/posterior.nc",  # diagnose wrote ArviZ's file
    "sgmcmc_swag.ipynb": "sghmc_scale_adapted/samples.pt",
    "swapping_parts.ipynb": "sghmc/samples.pt",  # the inference method swapped by one override
    "scaling_out.ipynb": "hmc_2/samples.pt",  # written by rank 0 of two processes
    "your_model.ipynb": "rank-1 (4 members)/metrics.json",  # the last of the post-hoc fits of the trained net
    "your_net_vs_exact.ipynb": "reference/samples.pt",  # zoo.reference's checkpointed chains
}
NEEDS_UCI = {"your_net_vs_exact.ipynb"}  # reads bostonHousing from $ZOO_DATA_DIR (../shared/data/uci in CI)


def test_every_notebook_is_tested_and_is_a_tutorial_page():
    assert {p.name for p in NOTEBOOKS.glob("*.ipynb")} == set(NOTEBOOK_OUTPUTS)
    tutorials = NOTEBOOKS.parent / "docs" / "tutorials"
    assert {p.name for p in tutorials.glob("*.ipynb")} == set(NOTEBOOK_OUTPUTS)
    assert all((tutorials / name).resolve() == NOTEBOOKS / name for name in NOTEBOOK_OUTPUTS)  # links, not copies


@pytest.mark.slow  # every tutorial executed at small size: 15-210 s each (make test-slow)
@pytest.mark.parametrize("name", list(NOTEBOOK_OUTPUTS))
def test_notebook_runs_at_small_size(name, tmp_path, monkeypatch):
    uci = os.environ.get("ZOO_DATA_DIR")
    if name in NEEDS_UCI and not (uci and (Path(uci) / "bostonHousing").is_dir()):
        pytest.skip("needs the UCI sets: set ZOO_DATA_DIR to a folder holding bostonHousing (../shared/data/uci)")
    monkeypatch.setenv("ZOO_NOTEBOOK_SIZE", "small")
    monkeypatch.setenv("ZOO_NOTEBOOK_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    book = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(book, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute(env=dict(os.environ))
    outputs = [out for cell in book.cells if cell.cell_type == "code" for out in cell.get("outputs", [])]
    assert not [out for out in outputs if out.get("output_type") == "error"]
    assert any(out.get("output_type") in ("display_data", "execute_result") and "image/png" in out.get("data", {})
               for out in outputs)  # a figure shown (a zoo figure as a cell's value is an execute_result)
    assert (tmp_path / "runs" / NOTEBOOK_OUTPUTS[name]).exists()
