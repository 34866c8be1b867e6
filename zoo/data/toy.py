"""Synthetic toy sets: 1-D regression with a gap between two clusters, and scikit-learn's two moons."""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field
from sklearn.datasets import make_moons

from zoo.data.base import DataSection, Dataset, given, make_dataset
from zoo.errors import ZooInputError

GAP_TRAIN_RANGES = ((-1.0, -0.5), (0.5, 1.0))
GAP_TEST_RANGE = (-1.5, 1.5)


def _check_size_and_noise(n_train: int, noise: float, n_min: int = 2) -> None:
    if int(n_train) != n_train or n_train < n_min:
        raise ZooInputError("data.n_train", n_train, f"use a whole number of at least {n_min}")
    if not np.isfinite(noise) or noise < 0:
        raise ZooInputError("data.noise", noise, "use a finite number >= 0")


def gap_function(x: np.ndarray) -> np.ndarray:
    """The noise-free regression function of ``toy_gap``: smooth, nonlinear, amplitude of order 1."""
    return np.sin(3.0 * x) + 0.3 * np.cos(5.0 * x)


def load_toy_gap(seed: int, n_train: int = 100, noise: float = 0.1) -> Dataset:
    """1-D regression with an empty gap between two training clusters (for "in-between" uncertainty)."""
    _check_size_and_noise(n_train, noise)
    rng = np.random.default_rng(seed)
    n_left = int(n_train) // 2
    (a0, a1), (b0, b1) = GAP_TRAIN_RANGES
    x_train = np.concatenate([rng.uniform(a0, a1, n_left), rng.uniform(b0, b1, int(n_train) - n_left)])
    y_train = gap_function(x_train) + noise * rng.standard_normal(x_train.shape)
    x_test = rng.uniform(*GAP_TEST_RANGE, 200)
    y_test = gap_function(x_test) + noise * rng.standard_normal(x_test.shape)
    ood = {
        "gap": np.linspace(a1 + 0.05, b0 - 0.05, 50)[:, None],
        "outside": np.concatenate([np.linspace(-1.5, -1.05, 25), np.linspace(1.05, 1.5, 25)])[:, None],
    }
    return make_dataset("toy_gap", "regression", x_train[:, None], y_train, x_test[:, None], y_test, x_ood=ood)


def load_two_moons(seed: int, n_train: int = 200, noise: float = 0.1, n_test: int = 500) -> Dataset:
    """Two interleaved half-circles (2 classes), seeded; the test set is drawn the same way from another stream."""
    _check_size_and_noise(n_train, noise)
    if int(n_test) != n_test or n_test < 2:
        raise ZooInputError("n_test", n_test, "use a whole number of at least 2")
    train_stream, test_stream, ood_stream = np.random.SeedSequence(seed).spawn(3)
    x_train, y_train = make_moons(int(n_train), noise=noise, random_state=int(train_stream.generate_state(1)[0]))
    x_test, y_test = make_moons(int(n_test), noise=noise, random_state=int(test_stream.generate_state(1)[0]))
    # far-away inputs: an annulus (radius 3..5) around the moons' centre, for OOD uncertainty checks
    rng = np.random.default_rng(ood_stream)
    angle = rng.uniform(0.0, 2.0 * np.pi, 500)
    radius = np.sqrt(rng.uniform(3.0**2, 5.0**2, 500))
    far = np.stack([0.5 + radius * np.cos(angle), 0.25 + radius * np.sin(angle)], axis=1)
    return make_dataset("two_moons", "classification", x_train, y_train, x_test, y_test, x_ood={"far": far},
                        n_classes=2, class_names=["upper moon", "lower moon"])


class _Synthetic(DataSection):
    n_train: int | None = Field(None, gt=1, description="number of training points (the loader's default: None)")
    noise: float | None = Field(None, ge=0.0, description="observation noise (the loader's default: None)")


class ToyGapData(_Synthetic):
    """1-D regression, two input clusters with a gap between them (in-between uncertainty)."""

    catalogue = {"toy_gap": "1-D regression, two input clusters with a gap between them (in-between uncertainty)"}

    name: Literal["toy_gap"] = Field(description="toy_gap")

    def load(self, seed: int) -> Dataset:
        return load_toy_gap(seed, **given(self, "n_train", "noise"))


class TwoMoonsData(_Synthetic):
    """2-D classification, scikit-learn's two interleaved half-circles (2 classes)."""

    catalogue = {"two_moons": "2-D classification, scikit-learn's two interleaved half-circles (2 classes)"}

    name: Literal["two_moons"] = Field(description="two_moons")

    def load(self, seed: int) -> Dataset:
        return load_two_moons(seed, **given(self, "n_train", "noise"))
