"""Evaluation under distribution shift and out-of-distribution detection, as the seed papers report them.

A *suite* is a list of shifted copies of a run's test set, each named by a corruption and a severity:

* ``corruptions`` (also spelled ``mnist-c`` or ``cifar-c``): the fourteen corruptions of
  :mod:`zoo.data.corruptions` at severities 1-5, generated from the run's own test images, seeded;
* ``rotation``: the test images rotated by 15, 30, ... 180 degrees (rotated MNIST; the "severity" is the angle);
* a directory holding published files: CIFAR-10-C / CIFAR-100-C (``<corruption>.npy``, five severities of the
  test set stacked, and ``labels.npy``) or MNIST-C (``<corruption>/test_images.npy`` and ``test_labels.npy``,
  one severity, reported as 1).

For every shifted set the report gives NLL, accuracy, ECE and Brier score, and the papers' aggregates over every
type and severity (cNLL, cAcc, cECE, cBrier); for every OOD set of the data, AUROC, AUPR-in/out and FPR at 95 % TPR
for the max-probability, entropy and mutual-information scores (MI left out for a point estimate). All sets are
scored with one set of posterior draws. Temperature scaling (Guo et al. 2017) applied to the pooled predictive
(Ashukha et al. 2020's pool-then-calibrate) is the post-hoc baseline: its temperature is fitted on the run's
calibration rows (``data.calibration_fraction``), never on test rows.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyro
import torch

from zoo import metrics
from zoo.data.base import Dataset
from zoo.data.corruptions import CORRUPTIONS, SEVERITIES, corrupt_images, rotate_images
from zoo.errors import ZooInputError
from zoo.posterior import Posterior
from zoo.tasks import task_of

GENERATED = ("corruptions", "mnist-c", "cifar-c")
IMAGES_HELD = "uint8 images [N, H, W] or [N, H, W, C] with pixel values 0..255"
LABELS_HELD = "integer class labels [N]"
ROTATION_ANGLES = tuple(range(15, 181, 15))
SUITE_HELP = ("corruptions (= mnist-c = cifar-c: 14 corruptions x 5 severities generated from the test images), "
              "rotation (15..180 degrees), or a directory of published CIFAR-10-C / MNIST-C .npy files")


@dataclass
class ShiftedSet:
    """One shifted copy of the test set: its corruption, its severity (or angle) and its standardised rows.

    :param corruption: the corruption's name (``rotation`` for rotated images, ``clean`` for the test set itself).
    :param severity: its severity, 1-5 (the angle in degrees for a rotation; 0 for the clean set).
    :param x: the shifted inputs ``[N, D]``, standardised like the run's training rows.
    :param y: their class labels ``[N]``.
    """

    corruption: str
    severity: float
    x: torch.Tensor
    y: torch.Tensor


# ------------------------------------------------------------------------------------------------ the suites
def _check_images(data: Dataset) -> tuple[int, int, int]:
    if not task_of(data).labelled:
        raise ZooInputError("--shift", data.name, "shift suites evaluate classifiers; this run is a regression")
    if data.image_shape is None:
        raise ZooInputError("--shift", data.name, "image corruptions need an image data set (mnist5k, digits, "
                            "mnist, fashion_mnist, cifar10, cifar100, svhn); this one is a table of features")
    return data.image_shape


def test_images(data: Dataset) -> np.ndarray:
    """The run's test rows as images ``[N, H, W, C]`` in ``[0, 1]`` (raw pixels over ``data.pixel_max``).

    :param data: an image classification data set.
    :returns: the test images ``[N, H, W, C]``, float64.
    :raises ZooInputError: when the run is a regression or its data are not images.
    """
    c, h, w = _check_images(data)
    raw = data.inputs_in_original_units(data.x_test).detach().cpu().double().numpy()
    return np.clip(raw.reshape(-1, c, h, w).transpose(0, 2, 3, 1) / data.pixel_max, 0.0, 1.0)


def image_rows(data: Dataset, images: np.ndarray) -> torch.Tensor:
    """Images ``[N, H, W, C]`` in ``[0, 1]`` as rows standardised like the run's training rows, on its device.

    :param data: the run's image classification data set.
    :param images: the images ``[N, H, W, C]`` in ``[0, 1]``.
    :returns: the rows ``[N, C * H * W]``, in the dtype and on the device of the run's test rows.
    :raises ZooInputError: when the run is a regression, its data are not images, or the images' shape is not the
        run's.
    """
    c, h, w = _check_images(data)
    if tuple(images.shape[1:]) != (h, w, c):
        raise ZooInputError("--shift", f"images of shape {tuple(images.shape[1:])}",
                            f"this run's net reads {h}x{w} images with {c} channel(s)")
    rows = torch.as_tensor(images.transpose(0, 3, 1, 2).reshape(len(images), -1) * data.pixel_max)
    standardised = (rows - data.x_mean.double().cpu()) / data.x_std.double().cpu()
    return standardised.to(device=data.x_test.device, dtype=data.x_test.dtype)


def generated_suite(data: Dataset, seed: int, corruptions: tuple[str, ...] = tuple(CORRUPTIONS),
                    severities: tuple[int, ...] = SEVERITIES) -> Iterator[ShiftedSet]:
    """Every corruption at every severity, generated from the test images with ``seed``.

    :param data: the run's image classification data set.
    :param seed: seeds the corruptions (the same seed gives the same images).
    :param corruptions: the corruptions' names (:data:`zoo.data.corruptions.CORRUPTIONS`).
    :param severities: the severities, 1-5.
    :returns: the shifted sets, one at a time, corruption by corruption.
    :raises ZooInputError: when the run is a regression or its data are not images.
    """
    images = test_images(data)
    for name in corruptions:
        for severity in severities:
            yield ShiftedSet(name, severity, image_rows(data, corrupt_images(images, name, severity, seed)),
                             data.y_test)


def rotation_suite(data: Dataset, angles: tuple[float, ...] = ROTATION_ANGLES) -> Iterator[ShiftedSet]:
    """The test images rotated by each angle (anticlockwise, degrees).

    :param data: the run's image classification data set.
    :param angles: the angles, in degrees.
    :returns: one shifted set per angle (its ``severity``), one at a time.
    :raises ZooInputError: when the run is a regression or its data are not images.
    """
    images = test_images(data)
    for angle in angles:
        yield ShiftedSet("rotation", float(angle), image_rows(data, rotate_images(images, angle)), data.y_test)


def published_suite(data: Dataset, directory: Path) -> Iterator[ShiftedSet]:
    """The shifted sets of a CIFAR-10-C-style directory (``<name>.npy`` of ``5 * N`` images + ``labels.npy``) or an
    MNIST-C-style one (``<name>/test_images.npy`` + ``<name>/test_labels.npy``), in uint8 ``[N, H, W(, C)]``.

    :param data: the run's image classification data set.
    :param directory: the directory of published files.
    :returns: the shifted sets, one at a time (five severities per CIFAR-10-C file; severity 1 for MNIST-C).
    :raises ZooInputError: when the directory holds no shift files, or their images or labels do not fit the run.
    """
    directory = Path(directory)
    cifar_files = sorted(p for p in directory.glob("*.npy") if p.name != "labels.npy")
    mnist_dirs = sorted(p for p in directory.iterdir() if (p / "test_images.npy").is_file())
    if cifar_files and (directory / "labels.npy").is_file():
        labels = _load_npy(directory / "labels.npy", LABELS_HELD)
        for path in cifar_files:
            images = _published_images(_load_npy(path, IMAGES_HELD), path)
            if len(images) != len(labels) or len(images) % len(SEVERITIES):
                raise ZooInputError("--shift", str(path), f"{len(images)} images for {len(labels)} labels: a "
                                    "CIFAR-10-C file stacks the five severities of one test set")
            per = len(images) // len(SEVERITIES)
            for k, severity in enumerate(SEVERITIES):
                part = slice(k * per, (k + 1) * per)
                yield ShiftedSet(path.stem, severity, image_rows(data, images[part]), _labels(data, labels[part]))
    elif mnist_dirs:
        for sub in mnist_dirs:
            labels = _load_npy(sub / "test_labels.npy", LABELS_HELD)
            images = _published_images(_load_npy(sub / "test_images.npy", IMAGES_HELD), sub / "test_images.npy")
            if len(images) != len(labels):
                raise ZooInputError("--shift", str(sub / "test_images.npy"), f"{len(images)} images for {len(labels)} "
                                    f"labels in {sub / 'test_labels.npy'}: an MNIST-C folder holds one label per image")
            yield ShiftedSet(sub.name, 1, image_rows(data, images), _labels(data, labels))
    else:
        raise ZooInputError("--shift", str(directory), "no shift files there: expected CIFAR-10-C's <corruption>.npy "
                            "with labels.npy, or MNIST-C's <corruption>/test_images.npy and test_labels.npy")


def _load_npy(path: Path, holds: str) -> np.ndarray:
    """A published shift file's array, refused naming the file where it is not a NumPy array of whole numbers."""
    with open(path, "rb") as handle:
        magic = handle.read(6)
    if magic != b"\x93NUMPY":
        what = ("a pickle of Python objects (e.g. from pickle.dump or ndarray.dump), which is not loaded (it could "
                "run code)" if magic[:1] == b"\x80" else "an empty file" if not magic else "a file without a NumPy "
                "header")
        raise ZooInputError("--shift", str(path), f"is not a .npy file but {what}; a shift file holds {holds}, saved "
                            "with np.save")
    try:
        array = np.load(path, allow_pickle=False)
    except ValueError as err:
        if "Object arrays" in str(err) or "pickled" in str(err):
            raise ZooInputError("--shift", str(path), f"holds an array of pickled Python objects, which are not "
                                f"loaded (they could run code); a shift file holds {holds}, saved with np.save") \
                from None
        raise ZooInputError("--shift", str(path), f"cannot be read ({err}): it is truncated or corrupt; a shift file "
                            f"holds {holds}, saved with np.save") from None
    if array.dtype.kind not in "ui":
        raise ZooInputError("--shift", str(path), f"holds an array of {array.dtype}; a shift file holds {holds}" + (
            " (images in [0, 1]: save (images * 255).round().astype(np.uint8))"
            if array.dtype.kind == "f" and holds == IMAGES_HELD else ""))
    return array


def _published_images(array: np.ndarray, path: Path) -> np.ndarray:
    if array.size and (array.min() < 0 or array.max() > 255):
        raise ZooInputError("--shift", str(path), f"pixel values {array.min()}..{array.max()}: a shift file holds "
                            f"{IMAGES_HELD}")
    if array.ndim == 3:
        array = array[..., None]
    if array.ndim != 4:
        raise ZooInputError("--shift", str(path), f"images of shape {array.shape}: expected [N, H, W] or [N, H, W, C]")
    return array.astype(np.float64) / 255.0


def _labels(data: Dataset, labels: np.ndarray) -> torch.Tensor:
    labels = torch.as_tensor(np.asarray(labels).reshape(-1).astype(np.int64), device=data.y_test.device)
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= data.n_classes):
        raise ZooInputError("--shift", f"labels {int(labels.min())}..{int(labels.max())}",
                            f"this run has {data.n_classes} classes")
    return labels


def shifted_sets(data: Dataset, suite: str, seed: int) -> Iterator[ShiftedSet]:
    """The suite's shifted sets (see the module docstring for the names).

    :param data: the run's image classification data set.
    :param suite: ``corruptions`` (or ``mnist-c``, ``cifar-c``), ``rotation``, or a directory of published files.
    :param seed: seeds generated corruptions.
    :returns: the shifted sets, one at a time.
    :raises ZooInputError: when the suite is unknown, or the run's data are not images.
    """
    check_suite(suite)
    if suite in GENERATED:
        return generated_suite(data, seed)
    if suite == "rotation":
        return rotation_suite(data)
    _check_images(data)
    return published_suite(data, Path(suite))


# ------------------------------------------------------------------------------------------ temperature scaling
def fit_temperature(log_probs: torch.Tensor, y: torch.Tensor) -> float:
    """The temperature T minimising the NLL of ``softmax(log p / T)``, ``p`` the pooled predictive of the per-draw
    log-probabilities ``[S, B, C]`` on calibration rows (T in [0.01, 100], a bounded 1-D search on log T).

    :param log_probs: per-draw log class probabilities on the calibration rows ``[S, B, C]``.
    :param y: the calibration rows' class labels ``[B]``.
    :returns: the temperature T.
    :raises ValueError: on inputs that :func:`zoo.metrics.nll` refuses.
    """
    from scipy.optimize import minimize_scalar

    metrics.nll(log_probs, y)  # validates shapes and labels
    pooled = metrics.predictive_log_probs(log_probs.double()).cpu()
    labels = y.long().cpu()

    def loss(log_t: float) -> float:
        scaled = torch.log_softmax(pooled / math.exp(log_t), dim=-1)
        return float(-scaled.gather(-1, labels[:, None]).mean())

    best = minimize_scalar(loss, bounds=(math.log(0.01), math.log(100.0)), method="bounded",
                           options={"xatol": 1e-6})
    return float(math.exp(best.x))


def temperature_scaled(log_probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """The pooled predictive of ``[S, B, C]`` log-probabilities sharpened or softened by ``temperature``, as one
    draw ``[1, B, C]`` (so every metric reads it unchanged).

    :param log_probs: per-draw log class probabilities ``[S, B, C]``.
    :param temperature: T; the pooled log-probabilities are divided by it and normalised again.
    :returns: the scaled predictive's log class probabilities ``[1, B, C]``, in ``log_probs``' dtype.
    """
    pooled = metrics.predictive_log_probs(log_probs.double())
    return torch.log_softmax(pooled / temperature, dim=-1).to(log_probs.dtype)[None]


# ------------------------------------------------------------------------------------------------ the report
def _confidence(log_probs: torch.Tensor, y: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    top, pred = metrics.predictive_log_probs(log_probs).max(dim=-1)
    return top.exp().double().cpu().numpy(), (pred == y).cpu().numpy()


def shift_report(posterior: Posterior, data: Dataset, suite: str | None, num_samples: int, seed: int = 0,
                 temperature_scale: bool = False) -> dict:
    """Metrics on the clean test set, on every shifted set of ``suite`` (none for ``None``) and on every OOD set of
    ``data``.

    Returns ``rows`` (one per set: corruption, severity, accuracy, nll, ece, brier; the clean set first, as
    severity 0), ``summary`` (clean metrics and the means over the shifted sets, ``c_nll`` ... ``c_brier``),
    ``by_severity`` (per severity, the means over corruption types), ``ood`` (per OOD set and score, AUROC,
    AUPR-in/out and FPR95), ``temperature`` (when scaled) and ``reliability`` (per severity, pooled confidences
    and hits, for the plot).

    :param posterior: the fitted posterior; one set of its draws scores every set.
    :param data: the run's classification data set.
    :param suite: the shift suite (see :func:`shifted_sets`), or None for the clean and OOD sets only.
    :param num_samples: posterior draws.
    :param seed: seeds the draws (Pyro's generators are set to ``seed + 1``) and generated corruptions.
    :param temperature_scale: also fit a temperature on the calibration rows and score the scaled predictive.
    :returns: the report, a dict with the keys above, ``suite`` and ``draws``.
    :raises ZooInputError: when ``num_samples`` is below 1, the run is a regression, the suite is refused, or
        temperature scaling is asked for without calibration rows.
    """
    if num_samples < 1:
        raise ZooInputError("--samples", num_samples, "use a positive number of posterior draws")
    if not task_of(data).labelled:
        raise ZooInputError("--shift", data.name, "shift and OOD reports are for classification runs")
    pyro.set_rng_seed(seed + 1)
    draws = posterior.scoring_draws(num_samples)

    def predict(x: torch.Tensor) -> torch.Tensor:
        return posterior.predict(x, num_samples, draws=draws).log_probs

    temperature = None
    if temperature_scale:
        if data.x_calibration is None:
            raise ZooInputError("--temperature-scale", data.name, "temperature scaling needs calibration rows held "
                                "out of training: retrain with data.calibration_fraction: 0.1 (--set "
                                "data.calibration_fraction=0.1)")
        temperature = fit_temperature(predict(data.x_calibration), data.y_calibration)

    def scored(x: torch.Tensor) -> torch.Tensor:
        log_probs = predict(x)
        return log_probs if temperature is None else temperature_scaled(log_probs, temperature)

    clean = scored(data.x_test)
    rows, confidence, correct = [], {}, {}
    sets = shifted_sets(data, suite, seed) if suite is not None else ()
    for shifted in itertools.chain([ShiftedSet("clean", 0.0, data.x_test, data.y_test)], sets):  # one set at a time
        log_probs = clean if shifted.corruption == "clean" else scored(shifted.x)
        rows.append({"corruption": shifted.corruption, "severity": float(shifted.severity),
                     **metrics.classification_metrics(log_probs, shifted.y)})
        conf, hit = _confidence(log_probs, shifted.y)
        confidence.setdefault(float(shifted.severity), []).append(conf)
        correct.setdefault(float(shifted.severity), []).append(hit)
    shifted_rows = rows[1:]
    keys = ("accuracy", "nll", "ece", "brier")
    summary = {f"clean_{k}": rows[0][k] for k in keys}
    if shifted_rows:
        summary.update({f"c_{k}": float(np.mean([r[k] for r in shifted_rows])) for k in keys})
    by_severity = {}
    for level in sorted({r["severity"] for r in rows}):
        at = [r for r in rows if r["severity"] == level]
        by_severity[level] = {k: float(np.mean([r[k] for r in at])) for k in keys}
    ood = {name: metrics.ood_detection(clean, scored(x_ood)) for name, x_ood in data.x_ood.items()}
    return {
        "suite": suite, "draws": num_samples, "temperature": temperature, "rows": rows, "summary": summary,
        "by_severity": by_severity, "ood": ood,
        "reliability": {level: (np.concatenate(confidence[level]), np.concatenate(correct[level]))
                        for level in confidence},
    }


def suite_label(suite: str | None) -> str:
    """A file-name-safe label of a suite (a directory's own name; ``clean`` for none).

    :param suite: the suite's name or directory, or None.
    :returns: the label.
    """
    if suite is None:
        return "clean"
    return suite if suite in GENERATED or suite == "rotation" else Path(suite).name or "files"


def check_suite(suite: str | None) -> None:
    """Refuse an unknown suite name before any work (a directory is checked when it is read).

    :param suite: the suite's name or directory; None (no suite) passes.
    :raises ZooInputError: when it is neither a suite's name nor an existing directory.
    """
    if suite is not None and suite not in GENERATED and suite != "rotation" and not Path(suite).is_dir():
        raise ZooInputError("--shift", suite, f"use {SUITE_HELP}")
