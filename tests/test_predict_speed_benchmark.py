"""benchmarks/predict_speed.py, tiny: its table, JSON and ratios, and its refusals; and the rule it measures,
``zoo.nets.forward_stacked``: the same outputs as one draw at a time, with vmap only for nets without convolutions."""

import json

import pytest
import torch
from torch.func import functional_call

from tests.conftest import load_benchmark
from zoo.nets import base, build_lenet5, build_mlp, forward_stacked

speed = load_benchmark("predict_speed")


def test_tiny_run_prints_and_writes_every_net_and_shape(tmp_path, capsys):
    out = tmp_path / "predict.json"
    assert speed.main(["--shapes", "3x5,2x7", "--rounds", "1", "--steps", "1", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert [(c["net"].split(",")[0], c["draws"], c["rows"]) for c in saved["cases"]] == [
        ("LeNet-5", 3, 5), ("LeNet-5", 2, 7), ("MLP 64-100-10", 3, 5), ("MLP 64-100-10", 2, 7)]
    for case in saved["cases"]:
        assert case["ratio_vmap_to_loop"] == pytest.approx(case["vmap_us"] / case["loop_us"])
    assert "vmap ÷ loop" in capsys.readouterr().out


@pytest.mark.parametrize("shapes", ["", "3", "3x0", "ax5"])
def test_bad_shapes_exit_2(shapes, capsys):
    assert speed.main(["--shapes", shapes]) == 2
    assert "--shapes" in capsys.readouterr().err


@pytest.mark.parametrize("net, width, vmapped", [(build_lenet5(784, 10), 784, False),
                                                 (build_mlp(64, 10, [16]), 64, True)])
def test_forward_stacked_equals_one_draw_at_a_time_and_vmaps_only_nets_without_convolutions(
        net, width, vmapped, monkeypatch):
    gen = torch.Generator().manual_seed(0)
    stacked = {n: p.detach() + 0.1 * torch.randn(4, *p.shape, generator=gen) for n, p in net.named_parameters()}
    x = torch.randn(6, width, generator=gen)
    expected = torch.stack([functional_call(net, {n: v[s] for n, v in stacked.items()}, (x,)) for s in range(4)])
    calls = []
    real = base.vmap
    monkeypatch.setattr(base, "vmap", lambda fn: calls.append(fn) or real(fn))
    with torch.no_grad():
        out = forward_stacked(net, stacked, x)
    assert out.shape == (4, 6, 10)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert bool(calls) == vmapped
