"""Data sets by name: the catalogue shown by ``zoo list`` and the dispatch from a :class:`DataSpec` to a loader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zoo.data.base import Dataset, carve_validation, make_dataset
from zoo.errors import ZooInputError
from zoo.spec import DataSpec

__all__ = ["DATASETS", "Dataset", "carve_validation", "check_data_spec", "load_dataset", "make_dataset"]

DATASETS: dict[str, str] = {
    "toy_gap": "1-D regression, two input clusters with a gap between them (in-between uncertainty)",
    "two_moons": "2-D classification, scikit-learn's two interleaved half-circles (2 classes)",
    "digits": "scikit-learn's 8x8 digits (64 features, 10 classes); OOD: held-out classes, photo patches",
    "mnist1d": "MNIST-1D signals (40 features, 10 classes), generated offline; needs `pip install mnist1d`",
    "mnist": "MNIST 28x28 (784 features) from --data-dir; needs the optional torchvision extra",
    "fashion_mnist": "FashionMNIST 28x28 (784 features) from --data-dir; needs the optional torchvision extra",
    "uci:<folder>": "UCI regression folder in the standard 20-split format, from --data-dir or $ZOO_DATA_DIR",
    "file:<path>": "your own .csv (header row) or .npz table; needs data.target and data.task",
}

# which optional spec fields each built-in loader understands (beyond seed)
_FIELDS: dict[str, tuple[str, ...]] = {
    "toy_gap": ("n_train", "noise"),
    "two_moons": ("n_train", "noise"),
    "digits": ("test_fraction", "ood_classes"),
    "mnist1d": ("test_fraction", "ood_classes"),
    "mnist": ("dir", "ood_classes", "n_train"),
    "fashion_mnist": ("dir", "ood_classes", "n_train"),
    "uci:": ("dir", "split"),
    "file:": ("target", "task", "split_column", "test_fraction"),
}


def data_kind(name: str) -> str:
    """The catalogue entry ``name`` falls under (the name itself, ``uci:`` or ``file:``); refuses unknown names."""
    if not isinstance(name, str):
        raise ZooInputError("data.name", name, f"use one of {', '.join(DATASETS)}")
    kind = next((p for p in ("uci:", "file:") if name.startswith(p)), name)
    if kind not in _FIELDS:
        raise ZooInputError("data.name", name, f"use one of {', '.join(DATASETS)}")
    rest = name[len(kind):]
    if kind == "uci:" and not rest.strip():
        raise ZooInputError("data.name", name, "name the UCI folder after the prefix, e.g. uci:housing")
    if kind == "file:" and Path(rest).expanduser().suffix.lower() not in (".csv", ".npz"):
        raise ZooInputError("data.name", name, "give the path of a .csv or .npz file after the prefix, "
                            "e.g. file:data/table.csv")
    return kind


def check_data_spec(spec: DataSpec) -> str:
    """Refuse, before any file is read, what no loader can use: an unknown name, a set-but-ignored field (a
    silently ignored ``ood_classes`` would mislead a whole study) and a file: set without target or task.
    Pure (reads no file), so the run spec calls it up front. Returns the data set's kind."""
    kind = data_kind(spec.name)
    used = _FIELDS[kind]
    unset = {"ood_classes": [], "split": 0}
    for field in ("ood_classes", "n_train", "noise", "target", "task", "split_column", "split"):
        value = getattr(spec, field)
        if field not in used and value != unset.get(field):
            users = sorted(k for k, v in _FIELDS.items() if field in v)
            raise ZooInputError(f"data.{field}", value, f"{spec.name!r} does not use it; it applies to {users}")
    if kind == "file:":
        for field in ("target", "task"):
            if getattr(spec, field) is None:
                raise ZooInputError(f"data.{field}", None, f"a file: data set needs data.{field} "
                                    f"({'the target column' if field == 'target' else 'regression or classification'})")
    return kind


def _given(spec: DataSpec, *fields: str) -> dict[str, Any]:
    """The spec fields that are set (not None), so that loader defaults apply to the rest."""
    return {f: getattr(spec, f) for f in fields if getattr(spec, f) is not None}


def load_dataset(spec: DataSpec, seed: int) -> Dataset:
    """Load the data set that ``spec`` names, standardised with its training statistics.

    With ``validation_fraction > 0`` the evaluation set is a seeded share of the training rows instead of the
    test split (see :func:`zoo.data.base.carve_validation`), for every data set alike.
    """
    data = _load(spec, seed)
    return carve_validation(data, spec.validation_fraction, seed) if spec.validation_fraction > 0 else data


def _load(spec: DataSpec, seed: int) -> Dataset:
    """The data set as its loader returns it (train and real test split)."""
    name = spec.name
    kind = check_data_spec(spec)
    if kind == "toy_gap":
        from zoo.data.toy import load_toy_gap

        return load_toy_gap(seed, **_given(spec, "n_train", "noise"))
    if kind == "two_moons":
        from zoo.data.toy import load_two_moons

        return load_two_moons(seed, **_given(spec, "n_train", "noise"))
    if kind == "digits":
        from zoo.data.digits import load_digits

        return load_digits(seed, **_given(spec, "test_fraction", "ood_classes"))
    if kind == "mnist1d":
        from zoo.data.mnist1d import load_mnist1d

        return load_mnist1d(seed, **_given(spec, "test_fraction", "ood_classes"))
    if kind in ("mnist", "fashion_mnist"):
        from zoo.data.vision import load_vision

        return load_vision(name, spec.dir, seed, **_given(spec, "ood_classes", "n_train"))
    if kind == "uci:":
        from zoo.data.uci import load_uci

        return load_uci(name[len("uci:"):], spec.split, spec.dir)
    from zoo.data.table import load_table

    return load_table(name[len("file:"):], spec.target, spec.task, seed,
                      **_given(spec, "test_fraction", "split_column"))
