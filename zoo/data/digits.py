"""scikit-learn's bundled 8x8 digits, with held-out classes and natural-image patches as OOD sets.

Also owns the class hold-out helpers that the other image-like loaders (mnist1d, vision) share.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.model_selection import train_test_split

from zoo.data.base import Dataset, make_dataset
from zoo.errors import ZooInputError

PATCH_SIZE = 32  # crop side in image pixels, average-pooled 4x4 down to 8x8
BLANK_BELOW = 0.05  # a pixel lit in fewer than this share of all digits counts as frame


def check_test_fraction(test_fraction: float) -> float:
    """Refuse a test share outside (0, 1)."""
    if not (isinstance(test_fraction, int | float) and 0.0 < float(test_fraction) < 1.0):
        raise ZooInputError("data.test_fraction", test_fraction, "use a number strictly between 0 and 1")
    return float(test_fraction)


def check_ood_classes(ood_classes: Sequence[int], n_classes: int) -> list[int]:
    """Validate classes to hold out: each in 0..n_classes-1, and at least 2 classes left for training."""
    held = []
    for c in ood_classes:
        if isinstance(c, bool) or not isinstance(c, int | np.integer) or not 0 <= int(c) < n_classes:
            raise ZooInputError("data.ood_classes", list(ood_classes),
                                f"each class must be an integer in 0..{n_classes - 1}")
        if int(c) not in held:
            held.append(int(c))
    if n_classes - len(held) < 2:
        raise ZooInputError("data.ood_classes", list(ood_classes),
                            f"hold out at most {n_classes - 2} of the {n_classes} classes (at least 2 must remain)")
    return sorted(held)


def split_holding_out(
    x: np.ndarray, y: np.ndarray, seed: int, test_fraction: float, ood_classes: Sequence[int], n_classes: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, list[int]]:
    """Seeded stratified split; held-out classes leave train and test, their test rows become the OOD set.

    Returns ``x_train, y_train, x_test, y_test, x_heldout (or None), kept`` with labels relabelled to
    ``0..len(kept)-1`` in the order of ``kept`` (the original class ids that remain).
    """
    held = check_ood_classes(ood_classes, n_classes)
    test_fraction = check_test_fraction(test_fraction)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_fraction, random_state=seed, stratify=y)
    kept = [c for c in range(n_classes) if c not in held]
    relabel = np.full(n_classes, -1, dtype=np.int64)
    relabel[kept] = np.arange(len(kept))
    in_tr, in_te = ~np.isin(y_tr, held), ~np.isin(y_te, held)
    x_heldout = x_te[~in_te] if held else None
    return x_tr[in_tr], relabel[y_tr[in_tr]], x_te[in_te], relabel[y_te[in_te]], x_heldout, kept


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
                        n_classes=len(kept), class_names=[str(c) for c in kept])
