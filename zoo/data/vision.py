"""Optional torchvision image sets (MNIST, FashionMNIST) read from a data directory, flattened to 784 features.

torchvision is an optional extra and imported lazily; nothing is downloaded unless the caller passes ``download=True``.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import numpy as np

from zoo.data.base import Dataset, Loader, check_ood_classes, given, hold_out_classes, make_dataset
from zoo.data.uci import resolve_data_dir
from zoo.errors import ZooInputError

VISION_SETS = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST"}
COMPANION = {"mnist": "fashion_mnist", "fashion_mnist": "mnist"}  # the classic far-OOD pairing


def _import_torchvision_datasets() -> ModuleType:
    try:
        import torchvision.datasets as tv_datasets
    except Exception as err:  # ImportError, or a torch/torchvision ABI mismatch raising anything else
        raise ZooInputError("data.name", "torchvision", "torchvision is an optional extra: pip install "
                            f"'pyro-bnn-zoo[vision]' with a torchvision build matching your torch "
                            f"({type(err).__name__}: {str(err)[:80]})") from None
    return tv_datasets


def _read(
    tv_datasets: ModuleType, name: str, root: str, train: bool, download: bool,
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Images flattened to ``[N, 784]`` floats in 0..255, labels, class names."""
    cls = getattr(tv_datasets, VISION_SETS[name])
    try:
        ds = cls(root, train=train, download=download)
    except RuntimeError as err:  # torchvision: "Dataset not found. You can use download=True to download it"
        raise ZooInputError("data.dir", root, f"{VISION_SETS[name]} files not found there ({err}); download them "
                            f"once from Python: zoo.data.vision.load_vision({name!r}, {root!r}, 0, download=True)"
                            ) from None
    x = ds.data.numpy().reshape(len(ds.data), -1).astype(np.float64)
    y = ds.targets.numpy().astype(np.int64)
    return x, y, list(ds.classes)


def load_vision(
    name: str, data_dir: str | None, seed: int, ood_classes: Sequence[int] = (), n_train: int | None = None,
    download: bool = False,
) -> Dataset:
    """MNIST or FashionMNIST with the standard train/test split; optional seeded training subset and hold-outs.

    OOD sets: ``heldout_classes`` (test images of ``ood_classes``) and, when its files are already present in
    ``data_dir``, the companion set's test images (``fashion_mnist`` for MNIST and the other way round).
    """
    if name not in VISION_SETS:
        raise ZooInputError("data.name", name, f"use one of {sorted(VISION_SETS)}")
    if n_train is not None and (isinstance(n_train, bool) or not isinstance(n_train, int) or n_train < 2):
        raise ZooInputError("data.n_train", n_train, "use a whole number of at least 2")
    tv_datasets = _import_torchvision_datasets()
    root = str(resolve_data_dir(data_dir))
    check_ood_classes(ood_classes, 10)
    x_tr, y_tr, names = _read(tv_datasets, name, root, True, download)
    x_te, y_te, _ = _read(tv_datasets, name, root, False, download)
    x_tr, y_tr, x_te, y_te, x_held, kept = hold_out_classes(x_tr, y_tr, x_te, y_te, ood_classes, 10)
    ood: dict[str, np.ndarray] = {"heldout_classes": x_held} if x_held is not None else {}
    if n_train is not None and n_train < len(x_tr):
        pick = np.sort(np.random.default_rng(seed).choice(len(x_tr), size=n_train, replace=False))
        x_tr, y_tr = x_tr[pick], y_tr[pick]
    try:
        ood[COMPANION[name]] = _read(tv_datasets, COMPANION[name], root, False, False)[0]
    except ZooInputError:
        pass  # companion not on disk: skip it, never download it implicitly
    return make_dataset(name, "classification", x_tr, y_tr, x_te, y_te, x_ood=ood,
                        n_classes=len(kept), class_names=[names[c] for c in kept])


LOADERS = tuple(
    Loader(name, f"{title} 28x28 (784 features) from --data-dir; needs the optional torchvision extra",
           ("dir", "ood_classes", "n_train"),
           lambda spec, seed: load_vision(spec.name, spec.dir, seed, **given(spec, "ood_classes", "n_train")))
    for name, title in VISION_SETS.items())
