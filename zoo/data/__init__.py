"""Data sets by name: every loader registers once here (its module, its catalogue line, the spec fields it reads);
``zoo list`` prints the catalogue and :func:`load_dataset` dispatches a :class:`DataSpec` through it."""

from __future__ import annotations

from zoo.data import digits, mnist1d, mnist5k, table, toy, uci, vision
from zoo.data.base import Dataset, Loader, carve_validation, hold_out_calibration, make_dataset
from zoo.errors import ZooInputError
from zoo.sections import DataSpec

__all__ = ["DATASETS", "LOADERS", "Dataset", "Loader", "carve_validation", "check_data_spec", "load_dataset",
           "make_dataset"]

LOADERS: dict[str, Loader] = {loader.name: loader for loader in (
    toy.TOY_GAP, toy.TWO_MOONS, digits.LOADER, mnist1d.LOADER, mnist5k.LOADER, *vision.LOADERS, uci.LOADER,
    table.LOADER)}
DATASETS: dict[str, str] = {loader.shown_as or loader.name: loader.description for loader in LOADERS.values()}
# the optional DataSpec fields and their unset values: a loader that does not read a field refuses it when set
_OPTIONAL_FIELDS = {"ood_classes": [], "split": 0, "n_train": None, "noise": None, "target": None, "task": None,
                    "split_column": None, "rotation": 0.0}


def find_loader(name: str) -> Loader:
    """The loader that serves ``name`` (its own entry, or the prefix it starts with); refuses unknown names."""
    if not isinstance(name, str):
        raise ZooInputError("data.name", name, f"use one of {', '.join(DATASETS)}")
    loader = LOADERS.get(name) or next((v for k, v in LOADERS.items() if v.prefixed and name.startswith(k)), None)
    if loader is None:
        raise ZooInputError("data.name", name, f"use one of {', '.join(DATASETS)}")
    if loader.check_name is not None:
        loader.check_name(name[len(loader.name):])
    return loader


def check_data_spec(spec: DataSpec) -> str:
    """Refuse, before any file is read, what no loader can use: an unknown name, a set-but-ignored field and a
    missing required one. Pure (reads no file), so the run spec calls it up front. Returns the loader's name."""
    loader = find_loader(spec.name)
    for field, unset in _OPTIONAL_FIELDS.items():
        value = getattr(spec, field)
        if field not in loader.fields and value != unset:
            users = sorted(k for k, v in LOADERS.items() if field in v.fields)
            raise ZooInputError(f"data.{field}", value, f"{spec.name!r} does not use it; it applies to {users}")
    for field, what in loader.required.items():
        if getattr(spec, field) is None:
            raise ZooInputError(f"data.{field}", None, f"a {loader.name} data set needs data.{field} ({what})")
    return loader.name


def load_dataset(spec: DataSpec, seed: int) -> Dataset:
    """Load the data set that ``spec`` names, standardised with its training statistics.

    With ``validation_fraction > 0`` the evaluation set is a seeded share of the training rows instead of the test
    split (:func:`zoo.data.base.carve_validation`); with ``calibration_fraction > 0`` a seeded share of the
    remaining training rows is held out of training as calibration rows
    (:func:`zoo.data.base.hold_out_calibration`), for every data set alike.
    """
    check_data_spec(spec)
    data = find_loader(spec.name).load(spec, seed)
    if spec.validation_fraction > 0:
        data = carve_validation(data, spec.validation_fraction, seed)
    if spec.calibration_fraction > 0:  # after the carve, which rebuilds the data set: the calibration rows survive
        data = hold_out_calibration(data, spec.calibration_fraction, seed)
    return data
