"""Image classification sets read from a data directory in the layout torchvision downloads them to: MNIST and
FashionMNIST (through torchvision, an optional extra), CIFAR-10, CIFAR-100 and SVHN (read directly from their
published files: Python pickles and MATLAB ``.mat`` files, so they need no torchvision).

Rows are images flattened channel-major (C, H, W) as floats in 0..255; image nets read them back with
``net.in_channels`` (1 for the MNIST sets, 3 for CIFAR and SVHN). Every set comes with the standard far-OOD
companion when its files are in the same directory (MNIST <-> FashionMNIST, CIFAR-10/100 -> SVHN,
SVHN -> CIFAR-10). Nothing is downloaded unless the caller passes ``download=True`` (torchvision sets only).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Literal

import numpy as np
from pydantic import Field

from zoo.data.base import (
    OOD_CLASSES_DOC,
    DataSection,
    Dataset,
    check_ood_classes,
    given,
    hold_out_classes,
    make_dataset,
)
from zoo.data.uci import resolve_data_dir
from zoo.errors import ZooInputError

Images = tuple[np.ndarray, np.ndarray, list[str]]  # rows [N, C*H*W] in 0..255, labels [N], class names

TORCHVISION_SETS = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST"}
COMPANION = {"mnist": "fashion_mnist", "fashion_mnist": "mnist", "cifar10": "svhn", "cifar100": "svhn",
             "svhn": "cifar10"}  # the classic far-OOD pairings


def _import_torchvision_datasets() -> ModuleType:
    try:
        import torchvision.datasets as tv_datasets
    except Exception as err:  # ImportError, or a torch/torchvision ABI mismatch raising anything else
        raise ZooInputError("data.name", "torchvision", "torchvision is an optional extra: pip install "
                            f"'pyro-bnn-zoo[vision]' with a torchvision build matching your torch "
                            f"({type(err).__name__}: {str(err)[:80]})") from None
    return tv_datasets


def _read_torchvision(name: str, root: Path, train: bool, download: bool) -> Images:
    """MNIST / FashionMNIST through torchvision: ``[N, 784]`` rows, labels, class names."""
    cls = getattr(_import_torchvision_datasets(), TORCHVISION_SETS[name])
    try:
        ds = cls(str(root), train=train, download=download)
    except RuntimeError as err:  # torchvision: "Dataset not found. You can use download=True to download it"
        raise ZooInputError("data.dir", str(root), f"{TORCHVISION_SETS[name]} files not found there ({err}); "
                            f"download them once from Python: zoo.data.vision.load_vision({name!r}, "
                            f"{str(root)!r}, 0, download=True)") from None
    x = ds.data.numpy().reshape(len(ds.data), -1).astype(np.float64)
    return x, ds.targets.numpy().astype(np.int64), list(ds.classes)


def _need(root: Path, relative: str, name: str) -> Path:
    """``root / relative``, or a clear refusal naming the missing file."""
    path = root / relative
    if not path.is_file():
        raise ZooInputError("data.dir", str(root), f"{name} needs the file {relative} there (torchvision's layout: "
                            f"what its {name} download unpacks)")
    return path


def _unpickle(path: Path) -> dict:
    """One of CIFAR's pickled batches; a file that does not unpickle to a dict is refused by name (unpickling a
    corrupt file can raise anything, a MemoryError included)."""
    def refuse(what: str) -> ZooInputError:
        return ZooInputError("data.dir", str(path), f"does not hold a CIFAR batch ({what}); download it again")

    try:
        with open(path, "rb") as handle:
            batch = pickle.load(handle, encoding="bytes")
    except Exception as err:  # noqa: BLE001 - any failure here means a corrupt or foreign file
        raise refuse(f"{type(err).__name__}: {str(err)[:120]}") from None
    if not isinstance(batch, dict):
        raise refuse(f"it unpickles to a {type(batch).__name__}")
    return batch


def _read_cifar(root: Path, train: bool, hundred: bool) -> Images:
    """CIFAR-10 (``cifar-10-batches-py/data_batch_1..5``, ``test_batch``, ``batches.meta``) or CIFAR-100
    (``cifar-100-python/train``, ``test``, ``meta``; the 100 fine labels): rows already channel-major."""
    if hundred:
        folder, files, label_key, meta, names_key = (
            "cifar-100-python", ["train"] if train else ["test"], b"fine_labels", "meta", b"fine_label_names")
    else:
        folder, label_key, meta, names_key = "cifar-10-batches-py", b"labels", "batches.meta", b"label_names"
        files = [f"data_batch_{i}" for i in range(1, 6)] if train else ["test_batch"]
    what = "cifar100" if hundred else "cifar10"
    batches = [_unpickle(_need(root, f"{folder}/{f}", what)) for f in files]
    x = np.concatenate([np.asarray(b[b"data"], dtype=np.float64).reshape(len(b[b"data"]), -1) for b in batches])
    y = np.concatenate([np.asarray(b[label_key], dtype=np.int64) for b in batches])
    names = [n.decode() for n in _unpickle(_need(root, f"{folder}/{meta}", what))[names_key]]
    return x, y, names


def _read_svhn(root: Path, train: bool) -> Images:
    """SVHN's cropped digits (``train_32x32.mat``, ``test_32x32.mat``: X [32, 32, 3, N], y [N, 1] with 10 for the
    digit 0), as channel-major rows and labels 0..9."""
    from scipy.io import loadmat

    mat = loadmat(_need(root, "train_32x32.mat" if train else "test_32x32.mat", "svhn"))
    x = np.transpose(mat["X"], (3, 2, 0, 1)).reshape(mat["X"].shape[3], -1).astype(np.float64)
    y = np.asarray(mat["y"], dtype=np.int64).reshape(-1) % 10
    return x, y, [str(d) for d in range(10)]


READERS: dict[str, Callable[[Path, bool, bool], Images]] = {
    "mnist": lambda root, train, download: _read_torchvision("mnist", root, train, download),
    "fashion_mnist": lambda root, train, download: _read_torchvision("fashion_mnist", root, train, download),
    "cifar10": lambda root, train, download: _read_cifar(root, train, hundred=False),
    "cifar100": lambda root, train, download: _read_cifar(root, train, hundred=True),
    "svhn": lambda root, train, download: _read_svhn(root, train),
}


def load_vision(
    name: str, data_dir: str | None, seed: int, ood_classes: Sequence[int] = (), n_train: int | None = None,
    download: bool = False,
) -> Dataset:
    """An image set with its standard train/test split; optional seeded training subset and held-out classes.

    OOD sets: ``heldout_classes`` (test images of ``ood_classes``) and, when its files are already present in
    ``data_dir`` and its images have the same shape, the companion set's test images (see :data:`COMPANION`).
    """
    if name not in READERS:
        raise ZooInputError("data.name", name, f"use one of {sorted(READERS)}")
    if n_train is not None and (isinstance(n_train, bool) or not isinstance(n_train, int) or n_train < 2):
        raise ZooInputError("data.n_train", n_train, "use a whole number of at least 2")
    root = resolve_data_dir(data_dir)
    x_tr, y_tr, names = READERS[name](root, True, download)
    x_te, y_te, _ = READERS[name](root, False, download)
    n_classes = len(names)
    check_ood_classes(ood_classes, n_classes)
    x_tr, y_tr, x_te, y_te, x_held, kept = hold_out_classes(x_tr, y_tr, x_te, y_te, ood_classes, n_classes)
    ood: dict[str, np.ndarray] = {"heldout_classes": x_held} if x_held is not None else {}
    if n_train is not None and n_train < len(x_tr):
        pick = np.sort(np.random.default_rng(seed).choice(len(x_tr), size=n_train, replace=False))
        x_tr, y_tr = x_tr[pick], y_tr[pick]
    companion = COMPANION[name]
    try:
        x_companion = READERS[companion](root, False, False)[0]
    except ZooInputError:
        x_companion = None  # companion not on disk (or torchvision missing): skip it, never download it implicitly
    if x_companion is not None and x_companion.shape[1] == x_tr.shape[1]:
        ood[companion] = x_companion
    channels = 1 if name in TORCHVISION_SETS else 3
    side = int(round((x_tr.shape[1] / channels) ** 0.5))
    return make_dataset(name, "classification", x_tr, y_tr, x_te, y_te, x_ood=ood,
                        n_classes=len(kept), class_names=[names[c] for c in kept],
                        image_shape=(channels, side, side), pixel_max=255.0)


_TITLES = {
    "mnist": "MNIST 28x28 (784 features) from --data-dir; needs the optional torchvision extra",
    "fashion_mnist": "FashionMNIST 28x28 (784 features) from --data-dir; needs the optional torchvision extra",
    "cifar10": "CIFAR-10 32x32x3 (3,072 features, channel-major; net.in_channels: 3) from --data-dir "
               "(cifar-10-batches-py/); OOD: SVHN when present",
    "cifar100": "CIFAR-100 32x32x3, 100 fine classes, from --data-dir (cifar-100-python/); OOD: SVHN when present",
    "svhn": "SVHN cropped digits 32x32x3 from --data-dir (train_32x32.mat, test_32x32.mat); OOD: CIFAR-10",
}
class VisionData(DataSection):
    """Image classification sets read from files on disk (MNIST, FashionMNIST, CIFAR-10/100, SVHN); nothing is
    downloaded."""

    catalogue = _TITLES

    name: Literal["mnist", "fashion_mnist", "cifar10", "cifar100", "svhn"] = Field(description=(
        "mnist | fashion_mnist | cifar10 | cifar100 | svhn"))
    dir: str | None = Field(None, description="data directory holding the set's files; falls back to $ZOO_DATA_DIR")
    ood_classes: list[int] = Field(default_factory=list, description=OOD_CLASSES_DOC)
    n_train: int | None = Field(None, gt=1, description="use only this many (seeded) training images")

    def load(self, seed: int) -> Dataset:
        return load_vision(self.name, self.dir, seed, **given(self, "ood_classes", "n_train"))
