"""The GPU check writes one report of every section, ratios under keys containing 'ratio', a failed section with its
error (and exit 1) while the others still run; bad options are refused. The whole check, every section at its tiny
size on the CPU, is CI's ``make gpu-check DEVICE=cpu``."""

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import gpu_check  # noqa: E402

from tests.conftest import compiled_step  # noqa: E402
from zoo.errors import ZooInputError  # noqa: E402


@pytest.mark.slow  # the svi section compiles the zoo's and the hand-written steps: ~30 s (make test-slow)
@compiled_step
def test_the_report_holds_every_section_and_a_failed_one_with_its_error(tmp_path, monkeypatch, capsys):
    def broken(device, size):
        raise RuntimeError("the device fell over")

    monkeypatch.setitem(gpu_check.SECTIONS, "tests", broken)
    code = gpu_check.main(["--device", "cpu", "--only", "tests,svi,dataloader,collectives", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert code == 1 and report["failed"] == ["tests"]
    assert "the device fell over" in report["sections"]["tests"]["error"]
    assert report["size"] == "tiny" and report["device"] == "cpu"
    svi = report["sections"]["svi"]["figures"]["digits MLP 64-100-10"]
    assert svi["zoo_to_hand_ratio"] > 0 and svi["bf16_to_fp32_ratio"] > 0
    assert svi["compiled_to_eager_ratio"] > 0 and svi["compiled_to_hand_compiled_ratio"] > 0
    assert report["sections"]["dataloader"]["figures"]["digits 64-100-10 MLP"]["dataloader_ratio"] > 0
    collectives = report["sections"]["collectives"]["figures"]["one-rank gloo"]
    assert collectives["backend"] == "gloo" and collectives["all_reduce_us"] > 0
    page = (tmp_path / "gpu_check.md").read_text()
    assert "## tests" in page and "**failed**" in page and "| digits MLP 64-100-10 |" in page
    assert "| tests | failed |" in page and "| hmc | not asked for |" in page  # the summary table
    assert "bf16_to_fp32_ratio" in capsys.readouterr().out
    assert not torch.distributed.is_initialized()  # the one-rank group is taken down again


def test_a_spent_budget_stops_new_cases_and_keeps_what_was_measured(tmp_path):
    code = gpu_check.main(["--device", "cpu", "--only", "dataloader,collectives", "--budget-s", "0.001",
                           "--out", str(tmp_path)])
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert code == 0 and report["not_run"] == ["collectives"]
    assert report["sections"]["dataloader"]["figures"]["digits 64-100-10 MLP"]["dataloader_ratio"] > 0
    assert "budget was spent" in report["sections"]["dataloader"]["stopped"]
    page = (tmp_path / "gpu_check.md").read_text()
    assert "Not run" in page and "| collectives | not run |" in page and "| dataloader | cut short |" in page


def test_the_plan_fits_a_short_lease_and_the_full_size_has_a_budget():
    assert sum(gpu_check.PLAN_MINUTES.values()) <= 8 and set(gpu_check.PLAN_MINUTES) == set(gpu_check.SECTIONS)
    assert gpu_check.FULL_BUDGET_S <= 8 * 60


def test_the_resnet_section_times_every_member_in_both_precisions():
    rows = dict(gpu_check.run_resnet(torch.device("cpu"), {**gpu_check.SIZES["tiny"], "resnet_rows": 16}))
    assert set(rows) == {f"{label}, {precision}" for label in gpu_check.RESNET_FAMILIES
                         for precision in ("float32", "bf16")}
    for row in rows.values():
        assert row["images_per_s"] > 0 and row["per_image_ratio"] > 0


def test_bad_options_are_refused_saying_what_to_give(tmp_path):
    with pytest.raises(ZooInputError, match="name sections of"):
        gpu_check.main(["--device", "cpu", "--only", "tests,warp", "--out", str(tmp_path)])
    with pytest.raises(ZooInputError, match="positive number of seconds"):
        gpu_check.main(["--device", "cpu", "--budget-s", "0", "--out", str(tmp_path)])
    if not torch.cuda.is_available():
        with pytest.raises(ZooInputError, match="DEVICE=cpu"):
            gpu_check.main(["--device", "cuda", "--out", str(tmp_path)])
