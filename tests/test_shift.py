"""Shift and OOD evaluation: the corruptions (determinism, damage growing with severity), the OOD metrics against
hand counts, temperature scaling against a known temperature, calibration rows, the published-file readers and
``zoo eval --shift`` end to end."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from tests.conftest import make_spec
from zoo import metrics
from zoo.cli import main
from zoo.data import load_dataset
from zoo.data.base import hold_out_calibration
from zoo.data.corruptions import CORRUPTIONS, SEVERITIES, corrupt_images, rotate_images
from zoo.errors import ZooInputError
from zoo.pipeline import load_run, train
from zoo.shift import fit_temperature, shift_report, temperature_scaled


def digit_images(n: int = 40, side: int = 28) -> np.ndarray:
    """Real digits (scikit-learn's, enlarged to ``side``) as ``[n, side, side, 1]`` in [0, 1]."""
    from scipy.ndimage import zoom
    from sklearn.datasets import load_digits

    small = load_digits().images[:n] / 16.0
    return np.clip(zoom(small, (1, side / 8, side / 8), order=1), 0, 1)[..., None]


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_each_corruption_is_deterministic_by_seed_and_stays_an_image(name):
    images = digit_images()
    first, again = corrupt_images(images, name, 3, seed=0), corrupt_images(images, name, 3, seed=0)
    assert np.array_equal(first, again)
    assert first.shape == images.shape and first.min() >= 0.0 and first.max() <= 1.0
    assert not np.array_equal(first, images)
    colour = corrupt_images(np.repeat(images[:4, :8, :8], 3, axis=-1), name, 2, seed=1)  # RGB and small images too
    assert colour.shape == (4, 8, 8, 3) and np.isfinite(colour).all()


RANDOM = {"gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise", "glass_blur", "motion_blur",
          "elastic_transform"}


@pytest.mark.parametrize("name", sorted(RANDOM))
def test_random_corruptions_change_with_the_seed(name):
    images = digit_images(10)
    assert not np.array_equal(corrupt_images(images, name, 3, seed=0), corrupt_images(images, name, 3, seed=1))


# CIFAR-10-C's elastic table lowers the affine jitter (0.08 -> 0.03 of the side) as the elastic field grows, so its
# pixel damage falls with severity (measured here: 0.11 at 1, 0.07 at 5 on MNIST); the other 13 grow.
@pytest.mark.parametrize("name", [n for n in CORRUPTIONS if n != "elastic_transform"])
def test_severity_5_damages_more_than_severity_1(name):
    images = digit_images()
    damage = [np.abs(corrupt_images(images, name, s, seed=0) - images).mean() for s in (1, 5)]
    assert damage[1] > damage[0]


@pytest.mark.parametrize(("name", "severity", "match"), [
    ("fog", 3, "use one of gaussian_noise"), ("gaussian_noise", 0, "from 1"), ("contrast", 6, "from 1"),
    ("contrast", 2.0, "integer")])
def test_unknown_corruption_or_severity_is_refused_listing_the_valid_ones(name, severity, match):
    with pytest.raises(ZooInputError, match=match):
        corrupt_images(digit_images(2), name, severity, seed=0)


def test_rotation_by_a_full_turn_is_the_identity_and_a_half_turn_flips():
    images = digit_images(3)
    assert np.allclose(rotate_images(images, 360), images)
    assert np.allclose(rotate_images(images, 180), images[:, ::-1, ::-1], atol=1e-9)


# ------------------------------------------------------------------------------------------------ OOD metrics
def _point_log_probs(top: np.ndarray) -> torch.Tensor:
    """One draw of two-class log-probabilities whose top probability is ``top`` (uncertainty 1 - top)."""
    p = torch.as_tensor(np.stack([top, 1 - top], axis=-1), dtype=torch.float64)
    return p.log()[None]


def test_ood_detection_matches_hand_counts():
    top_in = np.linspace(0.99, 0.6, 100)  # max-prob uncertainty 0.01 .. 0.40
    top_out = np.linspace(0.8, 0.5, 60)  # 0.20 .. 0.50
    out = metrics.ood_detection(_point_log_probs(top_in), _point_log_probs(top_out))
    assert set(out) == {"max_prob", "entropy"}  # a point estimate: no mutual information
    u_in, u_out = 1 - top_in, 1 - top_out
    threshold = np.sort(u_in)[math.ceil(0.95 * len(u_in)) - 1]  # keeps 95 of the 100 in-distribution points
    assert out["max_prob"]["fpr95"] == pytest.approx(np.mean(u_out <= threshold))
    pairs = (u_out[:, None] > u_in[None, :]).mean() + 0.5 * (u_out[:, None] == u_in[None, :]).mean()
    assert out["max_prob"]["auroc"] == pytest.approx(pairs)
    separable = metrics.ood_detection(_point_log_probs(np.full(5, 0.99)), _point_log_probs(np.full(7, 0.5)))
    assert separable["entropy"] == {"auroc": 1.0, "aupr_in": 1.0, "aupr_out": 1.0, "fpr95": 0.0}


def test_mutual_information_is_reported_only_where_draws_differ():
    generator = torch.Generator().manual_seed(0)
    differing = torch.log_softmax(torch.randn(4, 30, 3, generator=generator, dtype=torch.float64), -1)
    assert "mi" in metrics.ood_detection(differing[:, :15], differing[:, 15:])
    assert "mi" in metrics.ood_auroc(differing[:, :15], differing[:, 15:])
    same = differing[:1].expand(4, -1, -1)
    assert "mi" not in metrics.ood_auroc(same[:, :15], same[:, 15:])


# ------------------------------------------------------------------------------------------ temperature scaling
def test_temperature_scaling_recovers_the_temperature_that_made_the_labels():
    generator = torch.Generator().manual_seed(1)
    logits = 3 * torch.randn(20000, 5, generator=generator, dtype=torch.float64)
    labels = torch.multinomial(torch.softmax(logits / 2.0, -1), 1, generator=generator)[:, 0]
    overconfident = torch.log_softmax(logits, -1)[None]
    assert fit_temperature(overconfident, labels) == pytest.approx(2.0, rel=0.05)
    scaled = temperature_scaled(overconfident, 2.0)
    assert scaled.shape == overconfident.shape
    assert metrics.nll(scaled, labels) < metrics.nll(overconfident, labels)


def test_calibration_rows_are_held_out_of_training_deterministically():
    data = load_dataset(make_spec("digits").data, 0)
    held = hold_out_calibration(data, 0.1, seed=0)
    again = hold_out_calibration(data, 0.1, seed=0)
    assert torch.equal(held.x_calibration, again.x_calibration)
    assert held.n_train + len(held.y_calibration) == data.n_train
    assert len(held.y_calibration) == round(0.1 * data.n_train)
    raw = held.inputs_in_original_units
    assert torch.allclose(raw(held.x_test), data.inputs_in_original_units(data.x_test), atol=1e-4)
    train_rows = {tuple(r) for r in raw(held.x_train).round().int().tolist()}
    calibration_rows = [tuple(r) for r in raw(held.x_calibration).round().int().tolist()]
    assert sum(r in train_rows for r in calibration_rows) <= 2  # (a few digits appear twice in the data set)
    with pytest.raises(ZooInputError, match="calibration_fraction"):
        hold_out_calibration(data, 1.5, seed=0)


def test_calibration_rows_survive_the_validation_carve():
    both = load_dataset(make_spec("digits", "data.validation_fraction=0.2", "data.calibration_fraction=0.1").data, 0)
    carved = load_dataset(make_spec("digits", "data.validation_fraction=0.2").data, 0)
    assert both.x_calibration is not None and len(both.y_calibration) == round(0.1 * carved.n_train)
    assert both.n_train + len(both.y_calibration) == carved.n_train
    assert torch.equal(both.y_test, carved.y_test)  # the evaluation rows are the validation rows in both


# ------------------------------------------------------------------------------------------ reports end to end
@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    """A MAP fit of the tiny digits net with 10 % of its training rows held out for calibration."""
    spec = make_spec("digits", "guide.name=delta", "prior:={name: normal}", "inference.local_reparam=false",
                     "inference.predictive_samples=1", "data.calibration_fraction=0.1")
    return train(spec, tmp_path_factory.mktemp("shift") / "run", progress=False, echo=None)


def test_zoo_eval_shift_writes_the_report_and_its_aggregates(digits_run, capsys):
    run = digits_run.run_dir
    assert main(["eval", str(run), "--shift", "mnist-c", "--temperature-scale"]) == 0
    printed = capsys.readouterr().out
    assert "c_nll" in printed and "fpr95" in printed
    report = json.loads((run / "shift_mnist-c_ts.json").read_text())
    rows = report["rows"]
    assert len(rows) == 1 + len(CORRUPTIONS) * len(SEVERITIES)
    shifted = [r for r in rows if r["severity"] > 0]
    assert report["summary"]["c_nll"] == pytest.approx(np.mean([r["nll"] for r in shifted]))
    assert report["summary"]["c_accuracy"] < report["summary"]["clean_accuracy"]
    assert report["temperature"] > 0
    assert set(report["ood"]) == {"heldout_classes", "image_patches"}
    assert set(report["ood"]["heldout_classes"]) == {"max_prob", "entropy"}
    for suffix in (".csv", ".png"):
        assert (run / f"shift_mnist-c_ts{suffix}").is_file()
    assert (run / "reliability_shift_mnist-c_ts.png").is_file()


def test_the_same_seed_gives_the_same_shift_report(digits_run):
    spec, data, posterior = load_run(digits_run.run_dir)
    first, again = (shift_report(posterior, data, "rotation", 1, seed=3) for _ in range(2))
    assert first["rows"] == again["rows"]
    assert [r["severity"] for r in first["rows"]] == [0.0, *range(15, 181, 15)]


def test_published_cifar_c_and_mnist_c_layouts_are_read(digits_run, tmp_path):
    spec, data, posterior = load_run(digits_run.run_dir)
    labels = data.y_test.numpy().astype(np.uint8)
    clean = np.round(data.inputs_in_original_units(data.x_test).numpy() / 16 * 255).clip(0, 255).astype(np.uint8)
    images = clean.reshape(-1, 8, 8)
    cifar = tmp_path / "cifar_c"
    cifar.mkdir()
    np.save(cifar / "labels.npy", np.tile(labels, 5))
    np.save(cifar / "contrast.npy", np.concatenate([images // (s + 1) for s in range(5)])[..., None])
    report = shift_report(posterior, data, str(cifar), 1)
    assert [(r["corruption"], r["severity"]) for r in report["rows"][1:]] == [("contrast", s) for s in range(1, 6)]
    assert report["rows"][1]["accuracy"] == pytest.approx(report["rows"][0]["accuracy"], abs=0.02)
    mnist = tmp_path / "mnist_c" / "identity"
    mnist.mkdir(parents=True)
    np.save(mnist / "test_images.npy", images)
    np.save(mnist / "test_labels.npy", labels)
    rows = shift_report(posterior, data, str(mnist.parent), 1)["rows"]
    assert rows[1]["corruption"] == "identity" and rows[1]["accuracy"] == pytest.approx(rows[0]["accuracy"], abs=0.02)


def test_bad_shift_requests_exit_2_naming_the_fix(digits_run, toy_run, tmp_path, capsys):
    assert main(["eval", str(digits_run.run_dir), "--shift", "fog"]) == 2
    assert "use corruptions" in capsys.readouterr().err
    assert main(["eval", str(toy_run.run_dir), "--shift", "corruptions"]) == 2
    assert "classification runs" in capsys.readouterr().err
    spec, data, posterior = load_run(digits_run.run_dir)
    with pytest.raises(ZooInputError, match="table of features"):  # a classification table, not images
        shift_report(posterior, dataclasses.replace(data, image_shape=None), "corruptions", 1)
    no_calibration = train(make_spec("digits", "inference.num_steps=5", "inference.predictive_samples=2"),
                           tmp_path / "run", progress=False, echo=None)
    assert main(["eval", str(no_calibration.run_dir), "--temperature-scale"]) == 2
    assert "data.calibration_fraction" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["eval", str(digits_run.run_dir), "--shift", str(empty)]) == 2
    assert "CIFAR-10-C" in capsys.readouterr().err
