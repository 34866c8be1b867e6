"""MNIST-1D (Greydanus 2020): 40-sample 1-D signals of 10 digit templates, generated offline by the ``mnist1d`` package.

The package is optional and imported lazily; generation is seeded and leaves the global RNGs as they were.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import Field

from zoo.data.base import Dataset, HeldOutTestData, given, make_dataset, split_holding_out
from zoo.errors import ZooInputError


def load_mnist1d(
    seed: int, test_fraction: float = 0.2, ood_classes: Sequence[int] = (), num_samples: int = 5000,
) -> Dataset:
    """Generate MNIST-1D with the package's default transforms (seeded), then a stratified split with hold-outs."""
    try:
        from mnist1d.data import get_dataset_args
        from mnist1d.data import make_dataset as generate
    except Exception as err:  # any import failure means the optional package is unusable
        raise ZooInputError("data.name", "mnist1d", f"the generator is an optional package ({type(err).__name__}): "
                            "pip install mnist1d") from None
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 100:
        raise ZooInputError("num_samples", num_samples, "use a whole number of at least 100")
    args = get_dataset_args()
    args.num_samples, args.seed = int(num_samples), int(seed)
    np_state, py_state = np.random.get_state(), random.getstate()
    try:  # the generator seeds and draws from the global numpy / random state
        raw = generate(args)
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    x = np.concatenate([raw["x"], raw["x_test"]]).astype(np.float64)
    y = np.concatenate([raw["y"], raw["y_test"]]).astype(np.int64)
    x_tr, y_tr, x_te, y_te, x_held, kept = split_holding_out(x, y, seed, test_fraction, ood_classes, 10)
    ood = {"heldout_classes": x_held} if x_held is not None else {}
    return make_dataset("mnist1d", "classification", x_tr, y_tr, x_te, y_te, x_ood=ood,
                        n_classes=len(kept), class_names=[str(c) for c in kept])


class MNIST1DData(HeldOutTestData):
    """MNIST-1D signals (40 features, 10 classes), generated offline; needs `pip install mnist1d`."""

    catalogue = {"mnist1d": "MNIST-1D signals (40 features, 10 classes), generated offline; needs `pip install "
                            "mnist1d`"}

    name: Literal["mnist1d"] = Field(description="mnist1d")

    def load(self, seed: int) -> Dataset:
        return load_mnist1d(seed, **given(self, "test_fraction", "ood_classes"))
