"""Every family and sampler on CUDA (tests marked ``cuda``; they skip on a machine without a GPU). A run on the GPU
must keep its tensors there and give finite metrics; the many-chain HMC draws its momenta on the device.

``ZOO_TEST_DEVICE=cpu`` runs the same tests on the CPU (how ``make gpu-check DEVICE=cpu`` smoke-tests the GPU check
where no GPU is); the test of rows kept in host memory is CUDA's alone.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from tests.test_image_nets import FAMILIES, spec_of
from zoo import bnn as bnn_module
from zoo.pipeline import load_run, train
from zoo.spec import load_spec

DEVICE = os.environ.get("ZOO_TEST_DEVICE", "cuda")
pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                                 reason="no CUDA device on this machine (ZOO_TEST_DEVICE=cpu runs these on the CPU)")]


def on_device(tensor: torch.Tensor) -> bool:
    return tensor.device.type == DEVICE


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_trains_and_predicts_on_cuda(family, tmp_path):
    summary = train(spec_of(family, f"device={DEVICE}"), tmp_path / "run", progress=False, echo=None)
    assert math.isfinite(summary.metrics["nll"])
    _, data, posterior = load_run(summary.run_dir)
    assert on_device(data.x_train) and all(on_device(b) for b in posterior.family.buffers())
    draws = posterior.predict(data.x_test[:8], 2)
    assert on_device(draws.log_probs)


@pytest.mark.parametrize("method", ["hmc", "nuts"])
def test_samplers_run_on_cuda(method, tmp_path):
    spec = load_spec({"data": {"name": "toy_gap", "n_train": 40}, "net": {"hidden": [8], "activation": "tanh"},
                      "model": {"family": "all_weights"}, "guide": {"name": "delta"}, "likelihood": {"noise": 0.1},
                      "inference": {"method": method, "num_chains": 4 if method == "hmc" else 1,
                                    "warmup_steps": 20, "num_samples": 20}, "device": DEVICE, "seed": 0})
    summary = train(spec, tmp_path / method, progress=False, echo=None)
    assert math.isfinite(summary.metrics["test_ll"])


@pytest.mark.parametrize("family", ["mean_field", "rank1", "map"])
def test_bf16_steps_train_every_autocast_family_on_cuda(family, tmp_path):
    summary = train(spec_of(family, f"device={DEVICE}", "inference.autocast=bf16"), tmp_path / "run", progress=False,
                    echo=None)
    assert math.isfinite(summary.metrics["nll"])


def test_a_cuda_run_reads_its_loss_every_fiftieth_step_and_keeps_the_whole_curve(tmp_path):
    from zoo.runs import CHECKPOINT_FILE, load_torch

    summary = train(spec_of("mean_field", f"device={DEVICE}", "inference.num_steps=120",
                            "inference.checkpoint_every=1000"),
                    tmp_path / "run", progress=False, echo=None)
    losses = load_torch(summary.run_dir / CHECKPOINT_FILE)["losses"]
    assert len(losses) == 120 and all(math.isfinite(v) for v in losses)


@pytest.mark.skipif(DEVICE != "cuda", reason="host memory against device memory is CUDA's question")
def test_training_rows_kept_in_host_memory_train_on_cuda(tmp_path, monkeypatch):

    monkeypatch.setattr(bnn_module, "training_rows_stay_on_host", lambda *args, **kwargs: True)
    lines: list[str] = []
    summary = train(spec_of("rank1", "device=cuda"), tmp_path / "run", progress=False, echo=lines.append)
    assert any("stay in host memory" in line for line in lines) and math.isfinite(summary.metrics["nll"])
