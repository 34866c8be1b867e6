"""Every family and sampler on CUDA (tests marked ``cuda``; they skip on a machine without a GPU). A run on the GPU
must keep its tensors there and give finite metrics; the many-chain HMC draws its momenta on the device. So must what
reads a run afterwards: the shift and OOD report with temperature scaling, SWAG and SG-MCMC (whose chains start at the
net's initialisation and a learned noise's host-made initial value), subnetwork Laplace's GLM predictive, an
autoguide, ``zoo eval``, ``zoo prune``, ``zoo diagnose`` and ``zoo compare``.

``ZOO_TEST_DEVICE=cpu`` runs the same tests on the CPU (how ``make gpu-check DEVICE=cpu`` smoke-tests the GPU check
where no GPU is); the test of rows kept in host memory is CUDA's alone.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch

from tests.conftest import make_spec
from tests.test_image_nets import FAMILIES, spec_of
from zoo import assemble, metrics
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


@pytest.mark.parametrize(("method", "kernel"), [("hmc", {}), ("hmc", {"kernel": "mams", "integrator": "mclachlan"}),
                                               ("nuts", {})], ids=["hmc", "hmc-mams-mclachlan", "nuts"])
def test_samplers_run_on_cuda(method, kernel, tmp_path):
    spec = load_spec({"data": {"name": "toy_gap", "n_train": 40}, "net": {"hidden": [8], "activation": "tanh"},
                      "model": {"family": "all_weights"}, "guide": {"name": "delta"}, "likelihood": {"noise": 0.1},
                      "inference": {"method": method, "num_chains": 4 if method == "hmc" else 1,
                                    "warmup_steps": 20, "num_samples": 20, **kernel}, "device": DEVICE, "seed": 0})
    summary = train(spec, tmp_path / method, progress=False, echo=None)
    assert math.isfinite(summary.metrics["test_ll"])


def test_the_compiled_potential_on_cuda_is_a_cuda_graph_whose_results_outlive_the_next_call():
    """On a GPU the compiled potential is captured as a CUDA graph (on the CPU: compiled alone). A replay writes
    into the last one's output memory, so each call's results must be copies that the next call leaves alone (the
    sampler keeps the accepted point's gradient while it evaluates proposals)."""
    from zoo.inference.potential import Potential
    from zoo.pipeline import prepare

    spec = make_spec("toy", "net.hidden=[8]", "net.activation=tanh", f"device={DEVICE}")
    data, family, _, _ = prepare(spec)
    eager, compiled = Potential(family, data), Potential(family, data, compile=True)
    gen = torch.Generator().manual_seed(0)
    points = [torch.randn(16, eager.coords.dim, generator=gen).to(DEVICE) for _ in range(3)]
    results = [compiled.value_and_grad(z) for z in points]  # the first call compiles (and captures) the graph
    assert compiled.compiled, "the potential did not compile"
    for z, (energy, grad) in zip(points, results, strict=True):
        assert on_device(energy) and on_device(grad)
        reference_energy, reference_grad = eager.value_and_grad(z)
        torch.testing.assert_close(energy, reference_energy, rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(grad, reference_grad, rtol=1e-3, atol=1e-3)
    assert results[1][1].data_ptr() != results[2][1].data_ptr()


@pytest.mark.parametrize("overrides", [["inference.local_reparam=true"], ["inference.local_reparam=false"]],
                         ids=["local_reparam", "weight_sample"])
def test_the_compiled_svi_step_on_cuda_is_captured_with_its_draws_passed_in(overrides):
    """On a GPU the compiled SVI step is a CUDA graph whose random draws are made eagerly and passed in: the same
    losses as the eager step at the same seed (within float32 and a fused kernel's rounding), step after step."""
    from zoo.inference.elbo import LazyTraceMeanField_ELBO
    from zoo.inference.svi import SVIStep, make_optimizer
    from zoo.pipeline import prepare

    losses = []
    for compile in (False, True):
        spec = make_spec("toy", *overrides, f"device={DEVICE}", f"inference.compile={str(compile).lower()}")
        data, family, guide, _ = prepare(spec)
        params = list(guide.parameters()) + family.point_parameters()
        step = SVIStep(family.model, guide, LazyTraceMeanField_ELBO(), make_optimizer(params, spec.inference),
                       spec.inference.local_reparam, compile)
        batch = torch.arange(32, device=data.x_train.device)
        step(data.x_train, data.y_train, batch)  # the first step validates eagerly (and the compiled run traces)
        run = []
        for i in range(5):
            torch.manual_seed(i)
            run.append(float(step(data.x_train, data.y_train, batch)))
        assert not compile or step.compiled, "the compiled path was not taken"
        losses.append(run)
    assert losses[1][1:] == pytest.approx(losses[0][1:], rel=2e-3, abs=2e-2)  # step 0 traces (it draws ahead)


@pytest.mark.parametrize("inference", [
    "{method: swag, num_models: 2, epochs: 4, pretrain_epochs: 4, batch_size: 10, rank: 2, compile: true}",
    "{method: sgld, num_chains: 2, epochs: 10, batch_size: 10, burn_in_epochs: 5, thin: 2, lr: 0.01, compile: true}",
], ids=["multiswag", "sgld"])
def test_compiled_minibatch_updates_run_as_cuda_graphs(inference, tmp_path):
    summary = train(toy(f"inference:={inference}"), tmp_path / "run", progress=False, echo=None)
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

    monkeypatch.setattr(assemble, "training_rows_stay_on_host", lambda *args, **kwargs: True)
    lines: list[str] = []
    summary = train(spec_of("rank1", "device=cuda"), tmp_path / "run", progress=False, echo=lines.append)
    assert any("stay in host memory" in line for line in lines) and math.isfinite(summary.metrics["nll"])


# ------------------------------------------------------------------------------------------ reading a run back
def all_finite(values) -> bool:
    """Every number in a (nested) report is finite (None, for a figure left out, passes)."""
    if isinstance(values, dict):
        return all(all_finite(v) for v in values.values())
    if isinstance(values, list | tuple):
        return all(all_finite(v) for v in values)
    return values is None or isinstance(values, str) or math.isfinite(values)


def toy(*overrides: str):
    """The conftest toy regression (a learned noise: a latent site whose initial value is made on the host), 40 rows,
    on the device."""
    return make_spec("toy", f"device={DEVICE}", "data.n_train=40", *overrides)


def test_shift_and_ood_report_with_temperature_scaling_on_cuda(tmp_path, capsys):
    from zoo.cli import main
    from zoo.shift import fit_temperature, generated_suite, rotation_suite, shift_report, temperature_scaled

    spec = make_spec("digits", "guide.name=delta", "prior:={name: normal}", "inference.local_reparam=false",
                     "inference.num_steps=20", "inference.predictive_samples=2", "data.calibration_fraction=0.1",
                     f"device={DEVICE}")
    run = train(spec, tmp_path / "run", progress=False, echo=None).run_dir
    _, data, posterior = load_run(run)
    noisy, turned = next(generated_suite(data, 0, ("gaussian_noise",), (5,))), next(rotation_suite(data, (90.0,)))
    assert on_device(data.x_calibration) and all(on_device(t) for t in (noisy.x, noisy.y, turned.x))
    log_probs = posterior.predict(data.x_calibration, 2).log_probs
    temperature = fit_temperature(log_probs, data.y_calibration)
    assert temperature > 0 and on_device(temperature_scaled(log_probs, temperature))
    # a published CIFAR-10-C layout: its labels are read onto the device
    labels = data.y_test.cpu().numpy().astype(np.uint8)
    raw = data.inputs_in_original_units(data.x_test).cpu().numpy() / data.pixel_max * 255
    images = np.round(raw).clip(0, 255).astype(np.uint8).reshape(-1, *data.image_shape[1:], 1)
    published = tmp_path / "cifar_c"
    published.mkdir()
    np.save(published / "labels.npy", np.tile(labels, 5))
    np.save(published / "contrast.npy", np.concatenate([images // (s + 1) for s in range(5)]))
    report = shift_report(posterior, data, str(published), 2, temperature_scale=True)
    assert len(report["rows"]) == 6 and all_finite([report["rows"], report["summary"], report["ood"]])
    # rotated digits end to end, as zoo eval writes them (OOD AUROC, AUPR, FPR95 of the held-out classes)
    assert main(["eval", str(run), "--shift", "rotation", "--temperature-scale"]) == 0
    capsys.readouterr()
    written = json.loads((run / "shift_rotation_ts.json").read_text())
    assert written["temperature"] > 0 and all_finite([written["summary"], written["by_severity"], written["ood"]])
    assert set(written["ood"]["heldout_classes"]["entropy"]) == {"auroc", "aupr_in", "aupr_out", "fpr95"}


@pytest.mark.parametrize("inference", [
    "{method: swag, num_models: 2, epochs: 4, pretrain_epochs: 4, batch_size: 10, rank: 2, predictive_samples: 8}",
    "{method: sgld, num_chains: 2, epochs: 10, batch_size: 10, burn_in_epochs: 5, thin: 2, lr: 0.01, "
    "predictive_samples: 8}",
], ids=["multiswag", "sgld"])
def test_swag_and_sgmcmc_start_at_the_nets_initialisation_on_cuda(inference, tmp_path):
    from zoo.diagnostics import diagnose
    from zoo.posterior import ChainPosterior

    summary = train(toy(f"inference:={inference}"), tmp_path / "run", progress=False, echo=None)  # init: net
    assert math.isfinite(summary.metrics["test_ll"])
    _, data, posterior = load_run(summary.run_dir)
    draws = posterior.sample(4)
    assert "noise_scale" in draws and all(on_device(v) for v in draws.values())
    assert on_device(posterior.predict(data.x_test[:8], draws=draws).loc)
    if isinstance(posterior, ChainPosterior):
        assert all(on_device(v) for v in posterior.stats.values())
    result = diagnose(summary.run_dir, num_samples=16, plots=False)  # SWAG: its Gaussians score their own draws
    assert all_finite(result["function_space"]) and ("pareto_k" in result) == (not summary.chains)


def test_subnetwork_laplace_regression_predicts_on_cuda(tmp_path):
    summary = train(toy("model:={family: subnetwork, selection: {size: 10}, map: {num_steps: 50, batch_size: 40}}",
                        "guide:={name: laplace}", "inference:={method: laplace, predictive_samples: 8}"),
                    tmp_path / "run", progress=False, echo=None)
    assert math.isfinite(summary.metrics["test_ll"])
    _, data, posterior = load_run(summary.run_dir)
    assert on_device(posterior.family.prior_precision) and all(on_device(p) for p in posterior.guide.parameters())
    closed = posterior.predict(data.x_test[:8])  # the GLM's closed form, its noise a device tensor
    linearised = posterior.predict(data.x_test[:8], draws=posterior.sample(4))  # the linearised net at draws
    assert all(on_device(t) and bool(torch.isfinite(t).all())
               for t in (closed.loc, closed.scale, linearised.loc, linearised.scale))


def test_zoo_eval_prune_diagnose_and_compare_read_cuda_runs(tmp_path, capsys):
    from zoo.cli import main
    from zoo.diagnostics import compare, diagnose
    from zoo.evaluate import prune_by_snr

    settings = ("inference.num_steps=30", "inference.batch_size=20", "inference.predictive_samples=8")
    mean_field = train(toy(*settings), tmp_path / "mean_field", progress=False, echo=None).run_dir
    # an autoguide over one joint latent: the learned noise's host-made initial value concatenated with the weights'
    mvn = train(toy(*settings, "guide:={name: auto, auto: mvn}"), tmp_path / "mvn", progress=False, echo=None).run_dir
    assert main(["eval", str(mean_field)]) == 0 and main(["prune", str(mean_field), "--fractions", "0.5"]) == 0
    capsys.readouterr()
    assert all_finite(json.loads((mean_field / "prune.json").read_text()))
    _, _, posterior = load_run(mean_field)
    assert all(on_device(v) for v in prune_by_snr(posterior, 0.5).sample(2).values())
    for run in (mean_field, mvn):
        _, _, posterior = load_run(run)
        assert all(on_device(p) for p in posterior.guide.parameters())
        result = diagnose(run, num_samples=16, plots=False)
        assert all_finite(result["function_space"]) and result["pareto_k"]["num_draws"] == 16
    rows = compare(mean_field, mvn, num_samples=8, allow_unconverged=True).rows
    assert len(rows) == 2 and all(math.isfinite(r["w1"]) and 0 <= r["coverage_95"] <= 1 for r in rows)


def test_regression_metrics_take_a_float_noise_beside_draws_on_cuda():
    loc, y = torch.zeros(3, 5, device=DEVICE), torch.ones(5, device=DEVICE)
    out = metrics.regression_metrics(loc, 0.5, y, y_std=2.0)
    assert out["rmse"] == pytest.approx(2.0) and math.isfinite(out["test_ll"])
