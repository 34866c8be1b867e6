"""The HMC-versus-VI notebooks run end to end at a small size (ZOO_NOTEBOOK_SIZE=small)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="notebook tests need nbformat and nbclient (pip install -e .[dev])")
nbclient = pytest.importorskip("nbclient", reason="notebook tests need nbformat and nbclient (pip install -e .[dev])")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


@pytest.mark.parametrize("name", ["hmc_vs_vi_regression.ipynb", "hmc_vs_vi_classification.ipynb"])
def test_notebook_runs_at_small_size(name, tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_NOTEBOOK_SIZE", "small")
    monkeypatch.setenv("ZOO_NOTEBOOK_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    book = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(book, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute(env=dict(os.environ))
    outputs = [out for cell in book.cells if cell.cell_type == "code" for out in cell.get("outputs", [])]
    assert not [out for out in outputs if out.get("output_type") == "error"]
    assert any(out.get("output_type") == "display_data" and "image/png" in out.get("data", {}) for out in outputs)
    assert (tmp_path / "runs" / "hmc" / "samples.pt").exists()  # both notebooks sample the many-chain HMC
