"""scikit-learn's bundled 8x8 digits, with held-out classes and natural-image patches as OOD sets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import Field

from zoo.data.base import Dataset, HeldOutTestData, given, make_dataset, split_holding_out

PATCH_SIZE = 32  # crop side in image pixels, average-pooled 4x4 down to 8x8
BLANK_BELOW = 0.05  # a pixel lit in fewer than this share of all digits counts as frame


def image_patches(n: int, seed: int, blank: np.ndarray | None = None) -> np.ndarray:
    """``n`` grey 8x8 patches (flattened to 64, range 0..16) cut at seeded positions from scikit-learn's photos.

    Pixels flagged in ``blank`` (64 booleans) are set to 0, like the empty frame around every digit.
    """
    from sklearn.datasets import load_sample_images

    images = [img.astype(np.float64) @ np.array([0.299, 0.587, 0.114]) for img in load_sample_images().images]
    rng = np.random.default_rng(np.random.SeedSequence([seed, 8]))
    out = np.empty((n, 64))
    for i in range(n):
        grey = images[int(rng.integers(len(images)))]
        r = int(rng.integers(grey.shape[0] - PATCH_SIZE + 1))
        c = int(rng.integers(grey.shape[1] - PATCH_SIZE + 1))
        crop = grey[r:r + PATCH_SIZE, c:c + PATCH_SIZE]
        pooled = crop.reshape(8, PATCH_SIZE // 8, 8, PATCH_SIZE // 8).mean(axis=(1, 3))
        out[i] = (pooled / 255.0 * 16.0).reshape(-1)
    if blank is not None:
        out[:, blank] = 0.0
    return out


def load_digits(seed: int, test_fraction: float = 0.2, ood_classes: Sequence[int] = ()) -> Dataset:
    """The 8x8 digits (64 features, 0..16): seeded stratified split, optional held-out classes, image-patch OOD."""
    from sklearn.datasets import load_digits as sk_load_digits

    raw = sk_load_digits()
    x, y = raw.data.astype(np.float64), raw.target.astype(np.int64)
    # pixels lit in under 5% of all digits (the frame the digits' preprocessing leaves empty) stay blank in the
    # patches too: they should differ from digits by content, not by lighting pixels whose training std is ~0.05
    # (that would put them hundreds of standard deviations out after standardisation)
    blank = (x > 0).mean(axis=0) < BLANK_BELOW
    x_tr, y_tr, x_te, y_te, x_held, kept = split_holding_out(x, y, seed, test_fraction, ood_classes, 10)
    ood = {"image_patches": image_patches(len(x_te), seed, blank)}
    if x_held is not None:
        ood["heldout_classes"] = x_held
    return make_dataset("digits", "classification", x_tr, y_tr, x_te, y_te, x_ood=ood,
                        n_classes=len(kept), class_names=[str(c) for c in kept], image_shape=(1, 8, 8),
                        pixel_max=16.0)


class DigitsData(HeldOutTestData):
    """scikit-learn's 8x8 digits (64 features, 10 classes); OOD: held-out classes, photo patches."""

    catalogue = {"digits": "scikit-learn's 8x8 digits (64 features, 10 classes); OOD: held-out classes, photo "
                           "patches"}

    name: Literal["digits"] = Field(description="digits")

    def load(self, seed: int) -> Dataset:
        return load_digits(seed, **given(self, "test_fraction", "ood_classes"))
