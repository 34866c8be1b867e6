"""Data sets by name: each is one module holding its loader and its ``data`` section, registered here once.

:data:`DATA_SETS` is the registry: ``zoo list`` prints its catalogue, the spec's ``data`` section takes any
registered data set (``data.name``: a name, or a prefix and a path such as ``uci:<folder>``), and
:func:`load_dataset` loads one. Adding a data set is its module (a :class:`~zoo.data.base.DataSection` with its
settings, catalogue line and ``load``) and one entry below.
"""

from __future__ import annotations

from typing import Any

from zoo.data.base import DataSection, Dataset, carve_validation, hold_out_calibration, make_dataset
from zoo.data.digits import DigitsData
from zoo.data.given import GIVEN_FILE, GivenData, dataset_from
from zoo.data.mnist1d import MNIST1DData
from zoo.data.mnist5k import MNIST5kData
from zoo.data.python import PythonData
from zoo.data.table import TableData
from zoo.data.toy import ToyGapData, TwoMoonsData
from zoo.data.uci import UCIData
from zoo.data.vision import VisionData
from zoo.parts import Catalogue

__all__ = ["DATASETS", "DATA_SETS", "GIVEN_FILE", "DataConfig", "DataSection", "Dataset", "GivenData", "PythonData",
           "carve_validation", "data_section", "dataset_from", "load_dataset", "make_dataset"]

DATA_SETS = Catalogue("data", ToyGapData, TwoMoonsData, DigitsData, MNIST1DData, MNIST5kData, VisionData, UCIData,
                      TableData, PythonData, GivenData, field="data.name",
                      names_of=lambda section: section.served_names(),
                      shown={"uci:": "uci:<folder>", "file:": "file:<path>"})
DataConfig = DATA_SETS.union()
# ``zoo list``'s catalogue: every name (a prefix as ``uci:<folder>``) with its line
DATASETS: dict[str, str] = {name: line for section in dict.fromkeys(DATA_SETS.sections.values())
                            for name, line in section.catalogue.items()}


def data_section(**fields: Any) -> DataSection:
    """The section of the data set ``fields["name"]`` names, validated as the spec validates it.

    :param fields: the ``data`` section's fields, e.g. ``name="uci:bostonHousing", split=3``.
    :returns: the section.
    :raises ZooInputError: an unknown name, another data set's setting, an invalid value.
    """
    return DATA_SETS.validate(fields)


def load_dataset(spec: DataSection, seed: int) -> Dataset:
    """Load the data set that ``spec`` names, standardised with its training statistics.

    With ``validation_fraction > 0`` the evaluation set is a seeded share of the training rows instead of the test
    split (:func:`zoo.data.base.carve_validation`); with ``calibration_fraction > 0`` a seeded share of the
    remaining training rows is held out of training as calibration rows
    (:func:`zoo.data.base.hold_out_calibration`), for every data set alike.

    :param spec: the spec's data section.
    :param seed: seeds any random split.
    :returns: the data set.
    """
    data = spec.load(seed)
    if spec.validation_fraction > 0:
        data = carve_validation(data, spec.validation_fraction, seed)
    if spec.calibration_fraction > 0:  # after the carve, which rebuilds the data set: the calibration rows survive
        data = hold_out_calibration(data, spec.calibration_fraction, seed)
    return data
