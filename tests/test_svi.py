"""End-to-end SVI through ``zoo.pipeline.train``: run files, exact reproducibility and resume, divergence,
KL annealing, MAP initialisation, pruning and the learned noise."""

from __future__ import annotations

import json
import math
import os
import signal
import warnings

import pyro
import pytest
import torch

import zoo.inference.svi as svi
import zoo.pipeline as pipeline
from guides.base import INIT_RHO_CANDIDATES
from tests.conftest import (
    choice_in_log,
    compiled_step,
    crash_in_the_second_candidate,
    different_entries,
    interrupt_at,
)
from zoo import assemble
from zoo import bnn as bnn_module
from zoo.data import load_dataset
from zoo.errors import TrainingDiverged, ZooInputError, ZooWarning
from zoo.evaluate import prune_by_snr
from zoo.inference.elbo import ANALYTIC, ELBOS, LazyTraceMeanField_ELBO
from zoo.inference.lr_choice import chooses_lr
from zoo.interrupts import Interrupted
from zoo.pipeline import POINT_ESTIMATE_FILE, load_run, prepare, train
from zoo.posterior import GuidePosterior
from zoo.runs import CHECKPOINT_FILE, METRICS_FILE, SPEC_FILE, load_torch
from zoo.sections import DEFAULT_LR, DEFAULT_LR_DECAY_TO, DEFAULT_LR_HOLD, LR_CANDIDATES, PRIOR_SCALE_FACTORS
from zoo.spec import load_spec

REGRESSION_KEYS = {"rmse", "test_ll", "train_seconds"}
CLASSIFICATION_KEYS = {"accuracy", "nll", "ece", "brier", "ood_auroc_entropy", "ood_auroc_mi", "train_seconds"}


def run(spec, out, **kwargs):
    return train(spec, out, progress=False, echo=None, **kwargs)


def checkpoint(run_dir):
    return load_torch(run_dir / CHECKPOINT_FILE)


def metrics_without_time(run_dir):
    metrics = json.loads((run_dir / METRICS_FILE).read_text())
    metrics.pop("train_seconds")
    return metrics


def assert_same_guide(dir_a, dir_b):
    a, b = checkpoint(dir_a), checkpoint(dir_b)
    assert a["step"] == b["step"]
    assert different_entries(a["guide"], b["guide"]) == []
    assert a["losses"] == b["losses"]


@pytest.fixture
def guide_hook(monkeypatch):
    """``guide_hook(fn)``: call ``fn(guide, call_index)`` after every guide run inside ``train``."""

    def install(fn, pre=False):
        real_build = bnn_module.build
        calls = []

        def build(spec, data, *args, **kwargs):
            family, guide = real_build(spec, data, *args, **kwargs)

            def hook(module, *args):
                calls.append(None)
                fn(module, len(calls) - 1)

            (guide.register_forward_pre_hook if pre else guide.register_forward_hook)(hook)
            return family, guide

        monkeypatch.setattr(bnn_module, "build", build)
        return calls

    return install


# ------------------------------------------------------------------------------------------- run files
def test_regression_run_directory(toy_run, spec_factory):
    out = toy_run.run_dir
    for name in (SPEC_FILE, METRICS_FILE, CHECKPOINT_FILE, POINT_ESTIMATE_FILE, "uncertainty.png", "train.log"):
        assert (out / name).is_file(), name
    assert toy_run.plot == out / "uncertainty.png"
    metrics = json.loads((out / METRICS_FILE).read_text())
    assert set(metrics) == REGRESSION_KEYS
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())
    assert metrics == toy_run.metrics
    assert load_spec(out / SPEC_FILE) == spec_factory("toy")
    state = checkpoint(out)
    assert state["step"] == 200 and state["done"] is True and len(state["losses"]) == 200
    point = load_torch(out / POINT_ESTIMATE_FILE)
    assert set(point) == {"hidden0.weight", "hidden0.bias", "out.weight", "out.bias", "noise_scale"}
    assert point["hidden0.weight"].shape == (8, 1) and float(point["noise_scale"]) > 0


def test_classification_run_directory(tmp_path, spec_factory):
    summary = run(spec_factory("digits"), tmp_path / "digits")
    out = summary.run_dir
    for name in (SPEC_FILE, METRICS_FILE, CHECKPOINT_FILE, POINT_ESTIMATE_FILE, "reliability.png"):
        assert (out / name).is_file(), name
    assert summary.plot == out / "reliability.png"
    metrics = json.loads((out / METRICS_FILE).read_text())
    assert CLASSIFICATION_KEYS <= set(metrics)
    assert {"ood_auroc_entropy_heldout_classes", "ood_auroc_entropy_image_patches"} <= set(metrics)
    assert metrics["ood_auroc_entropy"] == metrics["ood_auroc_entropy_heldout_classes"]
    assert metrics["ood_auroc_mi"] == metrics["ood_auroc_mi_heldout_classes"]
    assert all(math.isfinite(v) for v in metrics.values())
    assert metrics["accuracy"] > 0.85  # 8 classes: chance is 0.125; 100 steps of BBB with local reparam learn
    kl = checkpoint(out)["kl_methods"]
    assert kl == {"hidden0.weight": "monte_carlo", "hidden0.bias": "analytic",
                  "out.weight": "monte_carlo", "out.bias": "analytic"}


# --------------------------------------------------------------------------------- reproducibility
def test_seeded_runs_reproduce_exactly(toy_run, tmp_path, spec_factory):
    again = run(spec_factory("toy"), tmp_path / "again")
    assert metrics_without_time(again.run_dir) == metrics_without_time(toy_run.run_dir)
    assert_same_guide(again.run_dir, toy_run.run_dir)
    a, b = load_torch(again.run_dir / POINT_ESTIMATE_FILE), load_torch(toy_run.run_dir / POINT_ESTIMATE_FILE)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_another_seed_gives_another_run(toy_run, tmp_path, spec_factory):
    other = run(spec_factory("toy", "seed=1", "inference.num_steps=20"), tmp_path / "other")
    a, b = checkpoint(other.run_dir)["guide"], checkpoint(toy_run.run_dir)["guide"]
    assert not torch.equal(a["loc.hidden0/weight"], b["loc.hidden0/weight"])


def test_crash_after_checkpoint_then_resume_is_exact(toy_run, tmp_path, spec_factory, monkeypatch):
    out = tmp_path / "crashed"
    interrupt_at(monkeypatch, 150, exc=RuntimeError)
    with pytest.raises(RuntimeError, match="simulated"):
        run(spec_factory("toy"), out)
    assert checkpoint(out)["step"] == 100  # the crash left the last periodic checkpoint
    monkeypatch.undo()
    resumed = run(spec_factory("toy"), out, resume=True)
    assert_same_guide(out, toy_run.run_dir)
    assert metrics_without_time(resumed.run_dir) == metrics_without_time(toy_run.run_dir)
    assert "resumed from" in (out / "train.log").read_text()


def test_a_resumed_run_continues_the_default_lr_decay_exactly(tmp_path, spec_factory, monkeypatch):
    """The default lr decays with the step count, so a run resumed from a checkpoint takes each later step at the
    lr an uninterrupted run takes it at."""
    settings = ("inference.lr=null", "inference.num_steps=40", "inference.checkpoint_every=20")
    whole = run(spec_factory("toy", *settings), tmp_path / "whole")
    out = tmp_path / "crashed"
    interrupt_at(monkeypatch, 30, exc=RuntimeError)
    with pytest.raises(RuntimeError, match="simulated"):
        run(spec_factory("toy", *settings), out)
    assert checkpoint(out)["step"] == 20
    monkeypatch.undo()
    run(spec_factory("toy", *settings), out, resume=True)
    assert_same_guide(out, whole.run_dir)


# --------------------------------------------------------------------------------- lr_by: calibration
LR_BY = ("inference.lr=null", "inference.lr_by=calibration", "inference.num_steps=40",
         "inference.checkpoint_every=20", "data.calibration_fraction=0.2")


def test_lr_by_calibration_keeps_the_best_candidate_run_exactly_as_a_run_given_that_lr(tmp_path, spec_factory):
    """Each candidate lr's whole run is scored on the calibration rows; the fit keeps the best as it ended, which is
    the run given that lr by hand with the default's hold and decay, step for step."""
    lines = []
    chosen = train(spec_factory("toy", *LR_BY), tmp_path / "chosen", progress=False, echo=lines.append)
    lr, scores, line = choice_in_log(lines, "starting lr")
    assert sorted(scores) == list(LR_CANDIDATES) and lr == min(scores, key=scores.get)
    assert "by a whole run at each" in line
    assert checkpoint(chosen.run_dir)["chosen_lr"] == lr
    assert len(checkpoint(chosen.run_dir)["losses"]) == 40
    assert not (chosen.run_dir / svi.LR_CHOICE_DIR).exists()  # the candidates' checkpoints go once one is kept
    by_hand = run(spec_factory("toy", *LR_BY[2:], f"inference.lr={lr}", f"inference.lr_hold={DEFAULT_LR_HOLD}",
                               f"inference.lr_decay_to={DEFAULT_LR_DECAY_TO}"), tmp_path / "by_hand")
    assert_same_guide(chosen.run_dir, by_hand.run_dir)


def test_an_interrupted_lr_choice_resumes_its_candidates_and_is_exact(tmp_path, spec_factory, monkeypatch):
    """A crash in the second candidate's run (step 30; its checkpoint at 20): the resumed fit takes no step of the
    finished first candidate, 20 of the second, 40 of each later one, 40 of the mean-field guide's other start (at
    the chosen lr), 40 of the learned noise's other start at each candidate lr (the choice after the guide's,
    joint with the lr) and 40 of each other prior scale factor, and ends as the uninterrupted fit did."""
    whole = run(spec_factory("toy", *LR_BY), tmp_path / "whole")
    out, seen = tmp_path / "crashed", crash_in_the_second_candidate(monkeypatch, 30)
    with pytest.raises(RuntimeError, match="simulated"):
        run(spec_factory("toy", *LR_BY), out)
    assert (out / svi.LR_CHOICE_DIR / "0.001" / CHECKPOINT_FILE).exists()
    seen.clear()
    run(spec_factory("toy", *LR_BY), out, resume=True)
    rho_runs = len(INIT_RHO_CANDIDATES) - 1
    assert len(seen) == (20 + 40 * (len(LR_CANDIDATES) - 2) + 40 * rho_runs + 40 * len(LR_CANDIDATES)
                         + 40 * (len(PRIOR_SCALE_FACTORS) - 1))
    assert_same_guide(out, whole.run_dir)
    monkeypatch.setattr(svi.SVIRun, "_best_run", lambda *a: pytest.fail("a finished run chose again"))
    run(spec_factory("toy", *LR_BY), out, resume=True)
    assert_same_guide(out, whole.run_dir)


def test_an_lr_choice_where_every_candidate_diverges_says_so(tmp_path, spec_factory, monkeypatch):
    monkeypatch.setattr(svi, "LR_CANDIDATES", (1e8, 1e9))
    with pytest.raises(TrainingDiverged, match="diverged at every candidate lr .1e[+]08: .*1e[+]09: "):
        run(spec_factory("toy", *LR_BY), tmp_path / "diverged")


def test_an_unset_lr_by_chooses_where_the_lr_is_the_default_and_calibration_rows_exist(spec_factory):
    spec = spec_factory("toy", "inference.lr=null").inference
    unset = spec.model_copy(update={"lr_by": None})
    assert chooses_lr(unset, True)
    assert not chooses_lr(unset, False)
    assert not chooses_lr(unset.model_copy(update={"lr": 0.003}), True)
    assert not chooses_lr(spec.model_copy(update={"lr_by": "fixed"}), True)
    assert chooses_lr(spec.model_copy(update={"lr_by": "calibration"}), True)
    with pytest.raises(ZooInputError, match="needs rows held out of training"):
        chooses_lr(spec.model_copy(update={"lr_by": "calibration"}), False)


def test_a_chosen_starting_lr_scales_the_default_schedule_at_every_step(spec_factory):
    default = spec_factory("toy", "inference.lr=null").inference
    for lr in (1e-3, 3e-3):
        chosen = svi.with_starting_lr(default, lr)
        for step in range(0, 200, 7):
            assert svi.scheduled_lr(chosen, step, 200) == pytest.approx(
                svi.scheduled_lr(default, step, 200) * lr / DEFAULT_LR, rel=1e-12)


def test_lr_by_calibration_is_refused_with_a_set_lr_or_without_calibration_rows(tmp_path, spec_factory):
    with pytest.raises(ZooInputError, match="lr_by: calibration chooses the lr, and lr is set"):
        spec_factory("toy", "inference.lr_by=calibration")  # the toy spec sets lr 0.01
    with pytest.raises(ZooInputError, match="inference.lr_by: got 'calibration'; needs rows held out of training"):
        run(spec_factory("toy", *LR_BY[:3]), tmp_path / "no_rows")


def test_ctrl_c_between_steps_then_resume_is_exact(toy_run, tmp_path, spec_factory, monkeypatch):
    out = tmp_path / "interrupted"
    interrupt_at(monkeypatch, 130)
    with pytest.raises(KeyboardInterrupt):
        run(spec_factory("toy"), out)
    assert checkpoint(out)["step"] == 130
    monkeypatch.undo()
    run(spec_factory("toy"), out, resume=True)
    assert_same_guide(out, toy_run.run_dir)


def test_ctrl_c_in_the_middle_of_a_step_then_resume_is_exact(toy_run, tmp_path, spec_factory, guide_hook,
                                                            monkeypatch):
    """Ctrl-C lands while the ELBO is being computed (after the step drew its weights and its minibatch)."""

    def interrupt(guide, call):
        if call == 128:  # step 128 starts an epoch (4 minibatches of 32 per epoch): a new permutation was drawn
            raise KeyboardInterrupt

    out = tmp_path / "mid_step"
    guide_hook(interrupt)
    with pytest.raises(KeyboardInterrupt):
        run(spec_factory("toy"), out)
    assert checkpoint(out)["step"] == 128
    monkeypatch.undo()
    run(spec_factory("toy"), out, resume=True)
    assert_same_guide(out, toy_run.run_dir)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_real_signal_mid_step_finishes_the_step_then_resume_is_exact(toy_run, tmp_path, spec_factory, guide_hook,
                                                                       monkeypatch, signum):
    """A real Ctrl-C (SIGINT) or SIGTERM during a step is deferred: the step completes, is checkpointed, the error
    says which signal it was, and resume is exact."""

    def send_signal(guide, call):
        if call == 77:
            os.kill(os.getpid(), signum)

    out = tmp_path / "signalled"
    guide_hook(send_signal)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(Interrupted) as info:
        run(spec_factory("toy"), out)
    assert info.value.signum == signum and info.value.exit_code == 128 + signum
    assert checkpoint(out)["step"] == 78  # step 77 was not cut in half
    assert {s: signal.getsignal(s) for s in handlers} == handlers  # the handlers are restored
    monkeypatch.undo()
    run(spec_factory("toy"), out, resume=True)
    assert_same_guide(out, toy_run.run_dir)


def test_existing_run_is_not_overwritten(toy_run, spec_factory):
    before = (toy_run.run_dir / CHECKPOINT_FILE).read_bytes()
    with pytest.raises(ZooInputError) as info:
        run(spec_factory("toy"), toy_run.run_dir)
    assert info.value.field == "--out" and "--resume" in str(info.value)
    assert (toy_run.run_dir / CHECKPOINT_FILE).read_bytes() == before


def test_resume_without_checkpoint_is_refused(tmp_path, spec_factory):
    with pytest.raises(ZooInputError) as info:
        run(spec_factory("toy", "inference.num_steps=5"), tmp_path / "fresh", resume=True)
    assert info.value.field == "--resume" and "checkpoint" in str(info.value)
    assert not (tmp_path / "fresh" / CHECKPOINT_FILE).exists()


def test_resume_with_another_spec_is_refused(toy_run, spec_factory):
    with pytest.raises(ZooInputError) as info:
        run(spec_factory("toy", "inference.lr=0.02"), toy_run.run_dir, resume=True)
    assert info.value.field == "--resume" and "spec.yaml" in str(info.value)


def test_resuming_a_finished_run_changes_nothing(tmp_path, spec_factory):
    spec = spec_factory("toy", "inference.num_steps=10", "inference.predictive_samples=3")
    out = tmp_path / "done"
    first = run(spec, out)
    guide_before = checkpoint(out)["guide"]
    second = run(spec, out, resume=True)
    assert all(torch.equal(guide_before[k], v) for k, v in checkpoint(out)["guide"].items())
    assert {k: v for k, v in first.metrics.items() if k != "train_seconds"} == \
        {k: v for k, v in second.metrics.items() if k != "train_seconds"}


# ---------------------------------------------------------------------------------------- divergence
class _Terms:
    last_terms = {"obs": torch.tensor(-5e9), "out.weight": torch.tensor(3e3)}


def _watch(losses_per_row: list[float], rows: int = 100) -> list[str]:
    """Feed a loss curve (per row) step by step to a DivergenceWatch; the warnings it gave."""
    watch = svi.DivergenceWatch(rows, len(losses_per_row))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for step in range(1, len(losses_per_row) + 1):
            watch([v * rows for v in losses_per_row[:step]], step, _Terms(), ["lower inference.lr"], None)
    return [str(w.message) for w in record]


def test_divergence_watch_lets_annealing_and_single_spikes_pass():
    annealing = [0.1 + 300.0 * min(1.0, t / 500) for t in range(1000)]  # the KL (300 nats per row) warmed up
    spikes = [5.0 if t % 37 else 5e6 for t in range(1000)]  # isolated spikes: the window's median ignores them
    for curve in (annealing, spikes):
        assert [w for w in _watch(curve) if "rose from" in w] == []


def test_divergence_watch_warns_then_stops_a_loss_that_stays_blown_up():
    curve = [4.0] * 100 + [4.0 * 10 ** (t / 20) for t in range(1, 400)]  # finite, but orders of magnitude up
    watch = svi.DivergenceWatch(100, len(curve), patience=50)
    with pytest.warns(ZooWarning, match=r"rose from 4 \(its best, by step 20\) to .* by step \d+, over 100x") as record:
        with pytest.raises(TrainingDiverged) as info:
            for step in range(1, len(curve) + 1):
                watch([v * 100 for v in curve[:step]], step, _Terms(), ["lower inference.lr"], None)
    first = int(str(record[0].message).split(" by step ")[2].split(",")[0])
    msg = str(info.value)
    assert f"stayed there since step {first}" in msg and f"by step {first + 50}," in msg
    assert "largest ELBO terms at the last step: obs -5e+09, out.weight 3e+03" in msg
    assert "Try: lower inference.lr" in msg and "No checkpoint was written yet" in msg
    # a blow-up that comes back under the line within the patience only warns
    recovered = [4.0] * 100 + [4e4] * 30 + [4.0] * 200
    watch = svi.DivergenceWatch(100, len(recovered), patience=50)
    with pytest.warns(ZooWarning, match="may be diverging"):
        for step in range(1, len(recovered) + 1):
            watch([v * 100 for v in recovered[:step]], step, _Terms(), ["lower inference.lr"], None)


def test_a_finite_runaway_elbo_stops_the_cli_with_exit_1(tmp_path, capsys):
    from zoo.cli import main

    code = main(["train", "configs/auto_normal_toy.yaml", "--out", str(tmp_path / "iaf"), "--no-progress",
                 "--set", "guide.auto=iaf", "--set", "inference.lr=0.2", "--set", "inference.num_steps=400",
                 "--set", "inference.checkpoint_every=100"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 1 and "Traceback" not in err
    assert "warning: the SVI loss per training row rose from" in err
    assert "training stopped: diverged:" in err and "Try: lower inference.lr (now 0.2), e.g. to 0.02" in err


def test_nan_elbo_stops_with_the_step_and_the_sites(tmp_path, spec_factory, guide_hook):
    def poison(guide, call):
        if call == 15:  # before step 15 samples: out.bias becomes NaN
            with torch.no_grad():
                guide.loc["out/bias"].fill_(float("nan"))

    guide_hook(poison, pre=True)
    out = tmp_path / "diverged"
    spec = spec_factory("toy", "inference.checkpoint_every=10")
    with pytest.raises(TrainingDiverged) as info:
        run(spec, out)
    msg = str(info.value)
    assert "step 15" in msg
    assert "out.bias" in msg and "out/bias" in msg  # the term of that site and the guide parameter
    assert "hidden0.weight" not in msg
    assert f"last good checkpoint: {out / CHECKPOINT_FILE}" in msg
    state = checkpoint(out)
    assert state["step"] == 10
    with pytest.warns(ZooWarning, match="unfinished run: its checkpoint is at step 10 of 200"):
        _, _, posterior = load_run(out)
    assert all(torch.isfinite(p).all() for p in posterior.guide.parameters())


# ------------------------------------------------------------------------- reading the loss every N steps
def test_reading_the_loss_every_n_steps_takes_the_same_steps(tmp_path, spec_factory):
    common = ("inference.num_steps=30", "inference.checkpoint_every=12", "inference.predictive_samples=3")
    run(spec_factory("toy", *common), tmp_path / "every")
    run(spec_factory("toy", *common, "inference.read_loss_every=7"), tmp_path / "seventh")
    every, seventh = checkpoint(tmp_path / "every"), checkpoint(tmp_path / "seventh")
    assert len(seventh["losses"]) == 30 and seventh["losses"] == every["losses"]
    assert all(torch.equal(every["guide"][k], v) for k, v in seventh["guide"].items())


def test_the_default_reads_every_loss_on_cpu_and_every_fiftieth_on_cuda():
    spec = load_spec({"data": {"name": "toy_gap"}}).inference
    assert svi.loss_read_interval(spec, torch.device("cpu")) == 1
    assert svi.loss_read_interval(spec, torch.device("cuda")) == 50
    chosen = load_spec({"data": {"name": "toy_gap"}, "inference": {"read_loss_every": 5}}).inference
    assert svi.loss_read_interval(chosen, torch.device("cuda")) == 5
    with pytest.raises(ZooInputError, match="read_loss_every"):
        load_spec({"data": {"name": "toy_gap"}, "inference": {"read_loss_every": 0}})


@pytest.mark.parametrize("overrides", [
    ["inference.local_reparam=true"],
    ["guide.name=delta"],
    ["model.family=rank1", "guide.name=mixture", "prior.loc=1.0"],
], ids=["mean_field_local_reparam", "map", "rank1_mixture"])
def test_a_step_that_does_not_read_its_loss_takes_nothing_from_the_device(spec_factory, monkeypatch, overrides):
    """What a GPU needs: after the first (validated) step, a step leaves every value on the device; any host read
    of a tensor (float, bool, item, tolist) inside it fails this test."""
    data, _, step = _step_parts(spec_factory("toy", *overrides))
    step.read_each_step = False
    batch = torch.arange(32)
    step(data.x_train, data.y_train, batch)

    def host_read(*args, **kwargs):
        raise AssertionError("a host read of a tensor inside the step")

    for name in ("__float__", "__bool__", "__int__", "item", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, host_read)
    loss = step(data.x_train, data.y_train, batch)
    monkeypatch.undo()
    assert loss.dim() == 0 and math.isfinite(float(loss))


def test_a_nan_read_late_names_its_own_step_and_keeps_the_last_good_checkpoint(tmp_path, spec_factory, guide_hook):
    def poison(guide, call):
        if call == 15:
            with torch.no_grad():
                guide.loc["out/bias"].fill_(float("nan"))

    guide_hook(poison, pre=True)
    out = tmp_path / "diverged"
    with pytest.raises(TrainingDiverged) as info:
        run(spec_factory("toy", "inference.checkpoint_every=10", "inference.read_loss_every=10"), out)
    msg = str(info.value)
    assert "ELBO is not finite at step 15 (read after step 19" in msg and "out/bias" in msg
    assert f"last good checkpoint: {out / CHECKPOINT_FILE}" in msg
    state = checkpoint(out)
    assert state["step"] == 10 and len(state["losses"]) == 10
    assert all(torch.isfinite(v).all() for v in state["guide"].values())


# ------------------------------------------------------------------------------ training rows in host memory
def test_training_rows_stay_on_the_host_only_where_they_would_crowd_a_gpu(spec_factory):
    data = load_dataset(spec_factory("digits").data, 0)
    size = data.training_bytes(torch.float32)
    assert size == data.x_train.numel() * 4 + data.y_train.numel() * 8  # float inputs, int64 labels
    assert not pipeline.training_rows_stay_on_host(data, torch.device("cpu"), torch.float32, free_bytes=0)
    assert pipeline.training_rows_stay_on_host(data, torch.device("cuda"), torch.float32, free_bytes=2 * size - 1)
    assert not pipeline.training_rows_stay_on_host(data, torch.device("cuda"), torch.float32, free_bytes=2 * size)
    kept = data.to("cpu", torch.float64, training_rows_on_host=True)
    assert kept.training_rows_on_host and kept.x_train.dtype == torch.float64 and kept.device == torch.device("cpu")


@pytest.mark.parametrize("overrides", [
    ["inference.local_reparam=true"],
    ["model.family=rank1", "guide.name=mixture", "prior.loc=1.0"],
], ids=["mean_field_local_reparam", "rank1_mixture"])
def test_minibatches_moved_from_the_host_take_the_same_steps(spec_factory, overrides):
    """The rows of each minibatch taken out and moved (their likelihood scaled by N / B) against the model's own
    subsampling of rows on the device: the same losses and parameters, step by step."""
    losses, params = {}, {}
    for on_host in (False, True):
        data, params[on_host], step = _step_parts(spec_factory("toy", *overrides))
        step.rows_on_host = on_host
        order = torch.Generator().manual_seed(3)
        torch.manual_seed(0)
        losses[on_host] = [float(step(data.x_train, data.y_train, torch.randperm(data.n_train, generator=order)[:32]))
                           for _ in range(5)]
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)
    for a, b in zip(params[True], params[False], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_run_whose_training_rows_stay_on_the_host_trains_and_says_so(tmp_path, spec_factory, monkeypatch):
    monkeypatch.setattr(assemble, "training_rows_stay_on_host", lambda *args, **kwargs: True)
    lines = []
    spec = spec_factory("toy", "inference.num_steps=20", "inference.predictive_samples=3")
    summary = train(spec, tmp_path / "host", progress=False, echo=lines.append)
    assert any("stay in host memory" in line for line in lines)
    monkeypatch.undo()
    same = run(spec, tmp_path / "device")
    assert summary.metrics["test_ll"] == pytest.approx(same.metrics["test_ll"], abs=1e-3)


@pytest.mark.parametrize("override, field", [
    ("inference.batch_size=null", "inference.batch_size"),
    ("inference.compile=true", "inference.compile"),
    ("guide.auto=laplace_approximation", "guide.auto"),
])
def test_what_cannot_step_on_rows_in_host_memory_is_refused(spec_factory, override, field):
    extra = ["guide.name=auto"] if override.startswith("guide.auto") else []
    spec = spec_factory("toy", *extra, override)
    data = load_dataset(spec.data, 0)
    with pytest.raises(ZooInputError, match="do not fit on the GPU") as info:
        pipeline.check_host_rows(spec, data)
    assert info.value.field == field


def test_full_batch_methods_are_refused_rows_in_host_memory():
    from tests.conftest import tiny_hmc

    spec = load_spec(tiny_hmc())
    with pytest.raises(ZooInputError, match="use method svi") as info:
        pipeline.check_host_rows(spec, load_dataset(spec.data, 0))
    assert info.value.field == "inference.method"


# ----------------------------------------------------------------------------------------- bf16 autocast
@pytest.mark.parametrize("overrides", [
    ["inference.local_reparam=true"],
    ["model.family=rank1", "guide.name=mixture", "prior.loc=1.0"],
    ["guide.name=delta"],
], ids=["mean_field_local_reparam", "rank1_mixture", "map"])
def test_a_bf16_step_runs_the_net_in_bf16_and_the_density_and_parameters_in_float32(spec_factory, monkeypatch,
                                                                                   overrides):
    from torch.overrides import TorchFunctionMode

    import zoo.likelihoods as likelihoods

    products = (torch.nn.functional.linear, torch.matmul, torch.Tensor.__matmul__, torch.mm, torch.bmm, torch.addmm,
                torch.baddbmm, torch.einsum, torch.nn.functional.conv2d)

    class Products(TorchFunctionMode):  # the dtypes of the step's matrix products, as autocast leaves them
        def __init__(self):
            super().__init__()
            self.dtypes = set()

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in products:
                self.dtypes.add(out.dtype)
            return out

    densities = []
    real = likelihoods.base.observation

    def observation(*args, **kwargs):
        made = real(*args, **kwargs)
        densities.append(made.log_prob(torch.zeros(made.batch_shape + made.event_shape)).dtype)
        return made

    monkeypatch.setattr(likelihoods.base, "observation", observation)
    losses, matmuls = {}, {}
    for autocast in (None, torch.bfloat16):
        data, params, step = _step_parts(spec_factory("toy", *overrides))
        step.autocast = autocast
        torch.manual_seed(0)
        with Products() as seen:
            losses[autocast] = float(step(data.x_train, data.y_train, torch.arange(32)))
        matmuls[autocast] = seen.dtypes
        assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in params if p.grad is not None)
    assert matmuls == {None: {torch.float32}, torch.bfloat16: {torch.bfloat16}}
    assert densities == [torch.float32, torch.float32]
    assert losses[torch.bfloat16] != losses[None]  # the net did run in bf16 ...
    assert losses[torch.bfloat16] == pytest.approx(losses[None], rel=1e-2)  # ... close to the float32 step


def test_a_bf16_fit_reaches_the_float32_fit(tmp_path, spec_factory):
    common = ("inference.num_steps=300", "inference.predictive_samples=50")
    full = run(spec_factory("toy", *common), tmp_path / "fp32").metrics
    lower = run(spec_factory("toy", *common, "inference.autocast=bf16"), tmp_path / "bf16").metrics
    assert lower["test_ll"] == pytest.approx(full["test_ll"], abs=0.05)
    assert lower["rmse"] == pytest.approx(full["rmse"], rel=0.05)


@pytest.mark.parametrize("extra, message", [
    ({"inference": {"autocast": "bf16", "compile": True}}, "not supported with compile"),
    ({"inference": {"autocast": "bf16"}, "dtype": "float64"}, "with dtype: float64 use autocast: none"),
    ({"inference": {"autocast": "fp16"}}, "inference.autocast"),
    ({"inference": {"autocast": "bf16"}, "model": {"family": "deep_ensemble"}, "guide": {"name": "delta"}},
     "does not reach the deep_ensemble family's vmapped layers"),
])
def test_autocast_refusals_say_what_to_change(extra, message):
    with pytest.raises(ZooInputError, match=message):
        load_spec({"data": {"name": "toy_gap"}, **extra})


def test_bf16_on_a_gpu_without_bfloat16_arithmetic_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100")
    with pytest.raises(ZooInputError, match=r"Tesla V100\) has no bfloat16 arithmetic .*use autocast: none"):
        load_spec({"data": {"name": "toy_gap"}, "device": "auto", "inference": {"autocast": "bf16"}})
    load_spec({"data": {"name": "toy_gap"}, "device": "cpu", "inference": {"autocast": "bf16"}})  # the CPU has it


def test_absurd_learning_rate_diverges_cleanly(tmp_path, spec_factory):
    spec = spec_factory("toy", "inference.lr=1e30", "inference.num_steps=50", "inference.batch_size=null",
                        "likelihood.noise=0.1")
    with pytest.raises(TrainingDiverged, match=r"ELBO is not finite at step \d+"):
        run(spec, tmp_path / "absurd")


# ------------------------------------------------------------------------------------- KL annealing
def test_kl_weight_schedule():
    spec = load_spec({"data": {"name": "toy_gap"}, "inference": {"kl_annealing_steps": 4}}).inference
    assert [svi.kl_weight(s, spec) for s in range(7)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0]
    off = load_spec({"data": {"name": "toy_gap"}}).inference
    assert [svi.kl_weight(s, off) for s in range(3)] == [1.0, 1.0, 1.0]


def test_kl_annealing_is_applied_during_training(monkeypatch, spec_factory):
    seen = []

    class Recording(LazyTraceMeanField_ELBO):
        def differentiable_loss(self, *args, **kwargs):
            seen.append(self.kl_weight)
            return super().differentiable_loss(*args, **kwargs)

    monkeypatch.setitem(ELBOS, "trace_mean_field", lambda n: Recording(n, analytic_kl=True))
    spec = spec_factory("toy", "inference.num_steps=7", "inference.kl_annealing_steps=5")
    data, family, guide, _ = prepare(spec)
    svi.SVI().fit(family, guide, data, spec.inference, spec.seed, progress=False)
    assert seen == [0.2, 0.4, 0.6, 0.8, 1.0, 1.0, 1.0]


def test_schedules_as_shares_of_the_run_follow_its_length():
    """kl_annealing_fraction, lr_decay_to and lr_hold hold whatever the run's length (what a sweep over epochs
    needs)."""
    spec = load_spec({"data": {"name": "toy_gap"}, "inference": {"kl_annealing_fraction": 0.5, "lr": 0.01,
                                                                  "optimizer": "clipped_adam", "lr_decay_to": 0.1}})
    assert [svi.kl_weight(s, spec.inference, 8) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert [svi.kl_weight(s, spec.inference, 4) for s in range(3)] == [0.5, 1.0, 1.0]
    for n in (10, 1000):
        assert svi.lr_hold_steps(spec.inference, n) == 0  # a set lr decays from the first step unless told
        assert svi.lr_decay_per_step(spec.inference, n) ** n == pytest.approx(0.1)
        assert svi.scheduled_lr(spec.inference, n, n) == pytest.approx(0.01 * 0.1)
    with pytest.raises(ValueError, match="share of the run"):
        svi.kl_weight(0, spec.inference)
    held = load_spec({"data": {"name": "toy_gap"}, "inference": {"lr": 0.01, "lr_decay_to": 0.1, "lr_hold": 0.5}})
    default = load_spec({"data": {"name": "toy_gap"}})
    for n in (10, 1000):
        assert svi.lr_hold_steps(held.inference, n) == n // 2
        assert svi.lr_hold_steps(default.inference, n) == int(DEFAULT_LR_HOLD * n)
        for s in (held, default):
            h = svi.lr_hold_steps(s.inference, n)
            lrs = [svi.scheduled_lr(s.inference, step, n) for step in range(n + 1)]
            assert lrs[:h + 1] == [svi.starting_lr(s.inference)] * (h + 1)  # held, then decayed
            assert lrs[n] == pytest.approx(svi.starting_lr(s.inference) * 0.1)
            assert all(a > b for a, b in zip(lrs[h:], lrs[h + 1:], strict=False))


@pytest.mark.parametrize("settings, first, last", [
    # the default: held for DEFAULT_LR_HOLD of the 20 steps, then decayed to DEFAULT_LR_DECAY_TO at step 20
    (["inference.lr=null"], DEFAULT_LR, DEFAULT_LR * DEFAULT_LR_DECAY_TO ** (4 / 5)),
    (["inference.lr=0.003"], 0.003, 0.003),  # a set lr is constant
    (["inference.lr=0.003", "inference.lr_decay_to=0.5"], 0.003, 0.003 * 0.5 ** (19 / 20)),
    (["inference.lr=0.003", "inference.lr_decay_to=0.5", "inference.lr_hold=0.5"], 0.003, 0.003 * 0.5 ** (9 / 10)),
    (["inference.lr=null", "inference.lr_decay=0.9", "inference.lr_hold=0"], DEFAULT_LR, DEFAULT_LR * 0.9 ** 19),
    (["inference.lr=0.003", "inference.lr_decay_to=0.5", "inference.optimizer=clipped_adam"], 0.003,
     0.003 * 0.5 ** (19 / 20)),
])
def test_each_step_is_taken_at_the_scheduled_lr(monkeypatch, spec_factory, settings, first, last):
    """The optimiser's learning rate follows the run's schedule step by step: the default lr is held, then decays
    to DEFAULT_LR_DECAY_TO of itself by the last step; a set lr stays constant unless a decay is set; ClippedAdam
    follows the same schedule."""
    seen = []
    clipped = "inference.optimizer=clipped_adam" in settings
    real = svi.ClippedAdam if clipped else torch.optim.Adam

    class Recording(real):
        def step(self, *args, **kwargs):
            seen.append(self.param_groups[0]["lr"])
            return super().step(*args, **kwargs)

    monkeypatch.setattr(*((svi, "ClippedAdam", Recording) if clipped else (torch.optim, "Adam", Recording)))
    spec = spec_factory("toy", "inference.num_steps=20", *settings)
    data, family, guide, _ = prepare(spec)
    svi.SVI().fit(family, guide, data, spec.inference, spec.seed, progress=False)
    assert len(seen) == 20
    assert seen[0] == pytest.approx(first) and seen[-1] == pytest.approx(last)
    assert all(a >= b for a, b in zip(seen, seen[1:], strict=False))


@pytest.mark.parametrize("inference, pattern", [
    ({"lr_decay": 0.99, "lr_decay_to": 0.1, "optimizer": "clipped_adam"}, "not both"),
    ({"kl_annealing_steps": 10, "kl_annealing_fraction": 0.5}, "not both"),
    ({"kl_annealing_fraction": 1.5}, "kl_annealing_fraction"),
    ({"lr": 0.01, "lr_hold": 0.5}, "no decay to hold off"),
    ({"lr_hold": 1.0}, "lr_hold"),
])
def test_schedule_conflicts_are_refused(inference, pattern):
    with pytest.raises(ZooInputError, match=pattern):
        load_spec({"data": {"name": "toy_gap"}, "inference": inference})


# ---------------------------------------------------------------------------------- MAP initialisation
def test_map_run_writes_its_point_estimate(map_run):
    point = load_torch(map_run.run_dir / POINT_ESTIMATE_FILE)
    _, _, posterior = load_run(map_run.run_dir)
    assert set(point) == set(posterior.guide.point_estimate())
    for name, value in posterior.guide.point_estimate().items():
        assert torch.equal(point[name], value), name
    pyro.set_rng_seed(0)
    draws = posterior.sample(3)  # a Delta posterior: every draw is the point
    for name, value in draws.items():
        assert torch.equal(value, point[name].expand_as(value)), name


@pytest.mark.parametrize("source", ["dir", "file"])
def test_init_from_sets_the_means_to_the_map_values(map_run, spec_factory, source):
    path = map_run.run_dir if source == "dir" else map_run.run_dir / POINT_ESTIMATE_FILE
    point = load_torch(map_run.run_dir / POINT_ESTIMATE_FILE)
    spec = spec_factory("toy", f"guide.init_from={path}", "guide.init_rho=-4")
    _, _, guide, _ = prepare(spec)
    for name, value in point.items():
        assert torch.allclose(guide.point_estimate()[name], value, rtol=1e-6, atol=1e-7), name
    assert torch.allclose(guide.unconstrained_loc("noise_scale"), point["noise_scale"].log(), atol=1e-6)
    assert torch.allclose(guide.scale("out.weight"), torch.nn.functional.softplus(torch.tensor(-4.0)))
    _, _, fresh, _ = prepare(spec_factory("toy"))
    assert not torch.allclose(fresh.point_estimate()["hidden0.weight"], point["hidden0.weight"])


def test_init_from_a_mismatched_net_is_refused(map_run, spec_factory):
    # two_moons with 3 hidden units: no site of the toy MAP net ([8, 1], [8], [1, 8], [1], noise) fits
    spec = spec_factory("toy", f"guide.init_from={map_run.run_dir}", "data.name=two_moons", "net.hidden=[3]")
    with pytest.raises(ZooInputError) as info:
        prepare(spec)
    assert info.value.field == "guide.init_from" and "no site name and shape matches" in str(info.value)


def test_init_from_is_refused_for_a_guide_without_a_location(map_run, spec_factory):
    """AutoIAFNormal's flows have no location to centre at a MAP: the refusal says so and names the autoguides that
    do, not a shape mismatch."""
    spec = spec_factory("toy", f"guide.init_from={map_run.run_dir}", "guide.name=auto", "guide.auto=iaf")
    with pytest.raises(ZooInputError, match="has no location to start its sites at") as info:
        prepare(spec)
    assert info.value.field == "guide.init_from" and "low_rank_mvn" in str(info.value)


def test_init_from_a_missing_path_is_refused(tmp_path, spec_factory):
    with pytest.raises(ZooInputError) as info:
        prepare(spec_factory("toy", f"guide.init_from={tmp_path / 'nowhere'}"))
    assert info.value.field == "guide.init_from"


# --------------------------------------------------------------------------------------------- pruning
def test_prune_masks_exactly_the_lowest_snr_weights(toy_run):
    _, _, posterior = load_run(toy_run.run_dir)
    snr = posterior.guide.signal_to_noise()
    assert set(snr) == {"hidden0.weight", "hidden0.bias", "out.weight", "out.bias"}  # noise is not a weight
    flat = torch.cat([v.flatten() for v in snr.values()])
    assert flat.numel() == 25
    for fraction, count in ((0.2, 5), (0.6, 15), (0.96, 24)):
        pruned = prune_by_snr(posterior, fraction)
        pyro.set_rng_seed(0)
        draws = pruned.sample(4)
        zeros = torch.cat([(draws[n] == 0).flatten(1) for n in snr], dim=1)
        assert zeros.sum(1).tolist() == [count] * 4, fraction
        lowest = set(flat.argsort()[:count].tolist())
        assert set(torch.nonzero(zeros[0]).flatten().tolist()) == lowest
        assert torch.all(draws["noise_scale"] > 0)


def test_prune_fraction_zero_changes_nothing(toy_run):
    _, data, posterior = load_run(toy_run.run_dir)
    pruned = prune_by_snr(posterior, 0.0)
    pyro.set_rng_seed(3)
    base = posterior.sample(5)
    pyro.set_rng_seed(3)
    masked = pruned.sample(5)
    for name in base:
        assert torch.equal(base[name], masked[name]), name


@pytest.mark.parametrize("fraction", [-0.1, 1.0, 1.5])
def test_prune_fraction_outside_unit_interval_is_refused(toy_run, fraction):
    _, _, posterior = load_run(toy_run.run_dir)
    with pytest.raises(ZooInputError):
        prune_by_snr(posterior, fraction)


def test_prune_needs_a_mean_field_guide(map_run):
    _, _, posterior = load_run(map_run.run_dir)
    with pytest.raises(ZooInputError, match="mean-field"):
        prune_by_snr(posterior, 0.5)


# ---------------------------------------------------------------------------------------- learned noise
def test_learned_noise_is_a_latent_with_analytic_kl(toy_run):
    state = checkpoint(toy_run.run_dir)
    assert state["kl_methods"] == {name: ANALYTIC for name in
                                   ("hidden0.weight", "hidden0.bias", "out.weight", "out.bias", "noise_scale")}
    assert "noise_scale" in (toy_run.run_dir / "train.log").read_text()
    _, _, posterior = load_run(toy_run.run_dir)
    assert isinstance(posterior, GuidePosterior)
    pyro.set_rng_seed(0)
    noise = posterior.sample(50)["noise_scale"]
    assert noise.shape == (50,) and torch.all(noise > 0) and noise.std() > 0


def test_fixed_noise_has_no_noise_site(tmp_path, spec_factory):
    spec = spec_factory("toy", "likelihood.noise=0.1", "inference.num_steps=5", "inference.predictive_samples=2")
    out = run(spec, tmp_path / "fixed").run_dir
    assert "noise_scale" not in checkpoint(out)["kl_methods"]
    assert "noise_scale" not in load_torch(out / POINT_ESTIMATE_FILE)


# ------------------------------------------------------------------------------------------ compiled SVI step
def _step_parts(spec):
    data, family, guide, _ = prepare(spec)
    params = list(guide.parameters()) + list(family.point_parameters() if hasattr(family, "point_parameters")
                                               else [])
    optimizer = svi.make_optimizer(params, spec.inference)
    elbo = LazyTraceMeanField_ELBO()
    return data, params, svi.SVIStep(family.model, guide, elbo, optimizer, spec.inference.local_reparam,
                                     spec.inference.compile)


@pytest.mark.slow  # torch.compile of each step: ~20 s a case (make test-slow)
@compiled_step
@pytest.mark.parametrize("overrides", [
    ["guide.name=delta"],  # mean-field family, MAP: no draws
    ["model.family=rank1", "guide.name=batch_ensemble", "prior.loc=1.0"],
    # with draws: compiled graphs draw through torch's own generator (fallback_random), so they draw what eager
    # steps draw; Inductor's generator would differ here (and was slower than eager on CPU)
    ["inference.local_reparam=true"],
    ["inference.local_reparam=false"],
], ids=["map", "batchensemble", "mean_field_local_reparam", "mean_field"])
def test_compiled_svi_steps_follow_the_eager_ones(spec_factory, overrides):
    draws = any(o.startswith("inference.local_reparam") for o in overrides)
    eager_spec = spec_factory("toy", *overrides)
    compiled_spec = spec_factory("toy", *overrides, "inference.compile=true")
    data, eager_params, eager = _step_parts(eager_spec)
    _, compiled_params, compiled = _step_parts(compiled_spec)
    batch = torch.arange(32)
    for i, weight in enumerate((1.0, 1.0, 0.25, 0.0, 1.0)):  # the KL weight reaches the compiled graph as an input
        eager.elbo.kl_weight = compiled.elbo.kl_weight = weight
        torch.manual_seed(i)
        expected = eager(data.x_train, data.y_train, batch)
        torch.manual_seed(i)
        got = compiled(data.x_train, data.y_train, batch)
        if not draws:
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)
        else:  # tracing (step 1) undoes its draws and updates; then compiled rounding moves the parameters slightly,
            # so the same draws give losses within 5e-4 (other draws: ~4e-3)
            torch.testing.assert_close(got, expected, rtol=5e-4, atol=1e-3)
    assert compiled.compiled, "the compiled path was not taken"
    for a, b in zip(compiled_params, eager_params, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4 if not draws else 2e-2, atol=1e-5 if not draws else 2e-3)


@pytest.mark.slow  # torch.compile of the step: ~10 s (make test-slow)
@compiled_step
def test_a_non_finite_loss_in_the_compiled_step_leaves_weights_and_adam_state_as_they_were(spec_factory):
    """A compiled step whose loss is not finite takes no optimiser step, as the eager step does: parameters, moments
    and the step count stay, and the loss comes back for the diagnosis."""
    spec = spec_factory("toy", "guide.name=delta", "inference.compile=true")
    data, params, step = _step_parts(spec)
    batch = torch.arange(32)
    step(data.x_train, data.y_train, batch)
    step(data.x_train, data.y_train, batch)  # traced and compiled

    def state() -> list[torch.Tensor]:
        return [t.detach().clone() for p in params for t in (p, *step.optimizer.state[p].values())]

    before = state()
    broken = data.y_train.clone()
    broken[0] = float("nan")
    value = step(data.x_train, broken, batch)
    assert not math.isfinite(float(value)) and step.compiled
    for now, then in zip(state(), before, strict=True):
        torch.testing.assert_close(now, then, rtol=0, atol=0)
    assert math.isfinite(float(step(data.x_train, data.y_train, batch)))  # and it steps again


def test_traced_elbo_draws_the_same_noise_as_the_eager_one(spec_factory):
    from torch.fx.experimental.proxy_tensor import make_fx

    spec = spec_factory("toy", "model.family=rank1", "guide.name=mixture", "prior.loc=1.0")
    data, params, step = _step_parts(spec)
    batch = torch.arange(32)
    step.validated = True
    graph = make_fx(lambda x, y, b: step.loss(x, y, b))(data.x_train, data.y_train, batch)
    torch.manual_seed(5)
    eager = step.loss(data.x_train, data.y_train, batch)
    eager_grads = torch.autograd.grad(eager, params)
    torch.manual_seed(5)
    traced = graph(data.x_train, data.y_train, batch)
    for a, b in zip(torch.autograd.grad(traced, params), eager_grads, strict=True):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(traced, eager)


@pytest.mark.slow  # torch.compile with a recompile: ~40 s (make test-slow)
@compiled_step
def test_compiled_svi_trains_rank1_with_a_mixture_guide_and_a_short_last_batch(spec_factory, tmp_path):
    spec = spec_factory("toy", "model.family=rank1", "guide.name=mixture", "prior.loc=1.0", "inference.compile=true",
                        "inference.batch_size=30", "inference.kl_annealing_steps=20")
    summary = run(spec, tmp_path / "run")
    losses = load_torch(tmp_path / "run" / CHECKPOINT_FILE)["losses"]
    assert all(math.isfinite(v) for v in losses)
    assert sum(losses[-20:]) / 20 < sum(losses[:20]) / 20
    assert math.isfinite(summary.metrics["test_ll"])


def test_a_model_the_tracer_cannot_follow_falls_back_to_eager_with_a_warning(spec_factory):
    spec = spec_factory("toy", "guide.name=delta", "inference.compile=true")
    data, _, step = _step_parts(spec)
    model = step.model

    def data_dependent(x, y=None, batch=None):
        if float(x.sum()) > -1e9:  # Python control flow on a tensor's value: make_fx cannot trace it
            return model(x, y, batch)

    step.model = data_dependent
    batch = torch.arange(32)
    step(data.x_train, data.y_train, batch)
    with pytest.warns(UserWarning, match="compiling the SVI step failed"):
        value = step(data.x_train, data.y_train, batch)
    assert math.isfinite(value) and not step.compiled
