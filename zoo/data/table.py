"""The user's own table (``file:<path>``): a .csv with a header row or a .npz of named arrays.

Owns reading the columns, validating them cell by cell, encoding class labels and choosing the split.
"""

from __future__ import annotations

import csv
import io
import warnings
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from zoo.data.base import (
    LABELLED,
    TEST_FRACTION_DOC,
    DataSection,
    Dataset,
    check_test_fraction,
    given,
    make_dataset,
)
from zoo.errors import ZooInputError, ZooWarning

TEST_MARKERS = {"test", "1", "true", "1.0"}
TASKS = ("regression", "classification")


def _read_csv(path: Path) -> dict[str, list[str]]:
    """Columns of a comma-separated file with a header row, as stripped strings."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise ZooInputError(str(path), f"byte 0x{raw[err.start]:02x} on line {line}", "a .csv must be UTF-8 text: "
                            "save it as UTF-8 (a spreadsheet's 'CSV UTF-8'; or iconv -f latin1 -t utf-8)") from None
    with io.StringIO(text, newline="") as fh:
        reader = csv.reader(fh)
        header = None
        columns: list[list[str]] = []
        for row in reader:
            if not row or all(not cell.strip() for cell in row):
                continue  # blank lines
            if header is None:
                header = [cell.strip() for cell in row]
                if any(not h for h in header):
                    raise ZooInputError(str(path), f"header {header}", "every column needs a name in the header row")
                dupes = sorted({h for h in header if header.count(h) > 1})
                if dupes:
                    raise ZooInputError(str(path), f"duplicate columns {dupes}", "column names must be unique")
                columns = [[] for _ in header]
                continue
            if len(row) != len(header):
                raise ZooInputError(str(path), f"line {reader.line_num} has {len(row)} cells",
                                    f"every row must have {len(header)} cells like the header (ragged rows)")
            for col, cell in zip(columns, row, strict=True):
                col.append(cell.strip())
    if header is None:
        raise ZooInputError(str(path), "empty file", "a .csv needs a header row and data rows")
    return dict(zip(header, columns, strict=True))


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """Columns of a .npz: 1-D arrays by key, 2-D arrays ``k`` as ``k_0..k_{d-1}``."""
    try:
        archive = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as err:
        raise ZooInputError(str(path), str(err)[:80],
                            "a readable .npz of numeric or string arrays (no pickles)") from None
    out: dict[str, np.ndarray] = {}
    with archive:
        for key in archive.files:
            try:
                arr = archive[key]
            except ValueError:
                raise ZooInputError(str(path), f"array {key!r} holds Python objects",
                                    "store numeric or string arrays (allow_pickle is off)") from None
            if arr.ndim == 1:
                out[key] = arr
            elif arr.ndim == 2:
                for j in range(arr.shape[1]):
                    out[f"{key}_{j}"] = arr[:, j]
            else:
                raise ZooInputError(str(path), f"array {key!r} has shape {arr.shape}",
                                    "use 1-D arrays (one column) or 2-D arrays (one column per index)")
    if not out:
        raise ZooInputError(str(path), "no arrays", "the .npz must hold at least the target and one feature")
    lengths = {k: len(v) for k, v in out.items()}
    first = next(iter(lengths))
    for k, n in lengths.items():
        if n != lengths[first]:
            raise ZooInputError(str(path), f"column {k!r} has {n} rows, {first!r} has {lengths[first]}",
                                "every column must have the same number of rows")
    return out


def _numeric(values: list[str] | np.ndarray, column: str, path: Path) -> np.ndarray:
    """A column as floats, refusing empty, non-numeric and NaN cells with the column and row."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "biuf":
        arr = values.astype(np.float64)
    else:
        arr = np.empty(len(values), dtype=np.float64)
        for i, cell in enumerate(values):
            text = str(cell).strip()
            if not text:
                raise ZooInputError(f"column {column!r}", f"empty cell in data row {i + 1}",
                                    f"fill or drop that row of {path.name}")
            try:
                arr[i] = float(text)
            except ValueError:
                raise ZooInputError(f"column {column!r}", f"{text!r} in data row {i + 1}",
                                    "feature and regression-target columns must be numeric") from None
    bad = ~np.isfinite(arr)
    if bad.any():
        raise ZooInputError(f"column {column!r}", f"NaN/inf in data row {int(np.argmax(bad)) + 1}",
                            f"fill or drop that row of {path.name}")
    return arr


def _encode_labels(values: list[str] | np.ndarray, column: str) -> tuple[np.ndarray, list[str]]:
    """Map sorted unique labels (numeric order if all numeric, else string order) to ``0..C-1``.

    Numeric labels must be whole numbers (a fractional one means a continuous target, i.e. regression); more
    distinct classes than half the rows (and more than 2) is warned about as implausible.
    """
    cells = [str(v).strip() for v in values]
    for i, cell in enumerate(cells):
        if not cell or cell.lower() == "nan":
            raise ZooInputError(f"column {column!r}", f"missing label in data row {i + 1}", "every row needs a label")
    try:
        numbers = [float(c) for c in cells]
    except ValueError:
        numbers = None
    if numbers is not None:
        fractional = [i for i, u in enumerate(numbers) if not u.is_integer()]
        if fractional:
            i = fractional[0]
            raise ZooInputError(f"column {column!r}", f"{cells[i]!r} in data row {i + 1}",
                                f"data.task is classification, but {len(fractional)} of {len(cells)} labels are not "
                                "whole numbers: class labels are whole numbers or names; for a continuous target "
                                "use data.task: regression")
        keys = numbers
        unique = sorted(set(numbers))
        names = [str(int(u)) for u in unique]
    else:
        keys = cells
        unique = sorted(set(cells))
        names = list(unique)
    index = {u: i for i, u in enumerate(unique)}
    labels = np.array([index[k] for k in keys], dtype=np.int64)
    if len(unique) < 2:
        raise ZooInputError(f"column {column!r}", f"{len(unique)} class ({names})", "classification needs >= 2 classes")
    if len(unique) > 2 and len(unique) > len(cells) / 2:
        warnings.warn(f"column {column!r}: {len(unique)} classes from {len(cells)} rows; with most classes seen "
                      "once or twice a classifier cannot learn them: is the target continuous (use data.task: "
                      "regression) or an identifier?", ZooWarning, stacklevel=2)
    return labels, names


def _test_mask(values: list[str] | np.ndarray, column: str) -> np.ndarray:
    """Rows whose split value is test/1/true (any case) are test rows."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "biuf":
        mask = values.astype(np.float64) == 1.0
    else:
        mask = np.array([str(v).strip().lower() in TEST_MARKERS for v in values], dtype=bool)
    if not mask.any() or mask.all():
        raise ZooInputError("data.split_column", column,
                            f"mark some rows (not all) as test with test/1/true; found {int(mask.sum())} "
                            f"of {len(mask)}")
    return mask


def load_table(
    path: str, target: str, task: str, seed: int, test_fraction: float = 0.2, split_column: str | None = None,
) -> Dataset:
    """A .csv or .npz table: every column but the target (and split column) is a numeric feature."""
    if task not in TASKS:
        raise ZooInputError("data.task", task, "use 'regression' or 'classification' for a file: data set")
    if not target:
        raise ZooInputError("data.target", target, "name the target column of the file")
    if split_column is None:
        test_fraction = check_test_fraction(test_fraction)
    file = Path(path).expanduser()
    suffix = file.suffix.lower()
    if suffix not in (".csv", ".npz"):
        raise ZooInputError("data.name", f"file:{path}", "the file must end in .csv or .npz")
    if not file.is_file():
        raise ZooInputError("data.name", f"file:{path}", "no such file")
    columns = _read_csv(file) if suffix == ".csv" else _read_npz(file)
    for field, col in (("data.target", target), ("data.split_column", split_column)):
        if col is not None and col not in columns:
            raise ZooInputError(field, col, f"columns in {file.name}: {list(columns)}")
    if split_column == target:
        raise ZooInputError("data.split_column", split_column, "the split column cannot also be the target")
    feature_names = [c for c in columns if c not in (target, split_column)]
    if not feature_names:
        raise ZooInputError(str(file), f"columns {list(columns)}",
                            "need at least one feature column besides the target")
    n_rows = len(columns[target])
    if n_rows < 3:
        raise ZooInputError(str(file), f"{n_rows} data rows", "need at least 3 rows (2 to train, 1 to test)")
    x = np.stack([_numeric(columns[c], c, file) for c in feature_names], axis=1)
    if LABELLED[task]:
        y, class_names = _encode_labels(columns[target], target)
    else:
        y, class_names = _numeric(columns[target], target, file), None
    if split_column is not None:
        is_test = _test_mask(columns[split_column], split_column)
    else:
        n_test = min(max(1, round(n_rows * test_fraction)), n_rows - 2)
        is_test = np.zeros(n_rows, dtype=bool)
        is_test[np.random.default_rng(seed).permutation(n_rows)[:n_test]] = True
    n_classes = len(class_names) if class_names is not None else None
    return make_dataset(f"file:{file.name}", task, x[~is_test], y[~is_test], x[is_test], y[is_test],
                        n_classes=n_classes, class_names=class_names, feature_names=feature_names,
                        target_name=target)


def check_table_name(rest: str) -> None:
    """Refuse a ``file:`` name that is not a .csv or .npz path (before the file is read)."""
    if Path(rest).expanduser().suffix.lower() not in (".csv", ".npz"):
        raise ZooInputError("data.name", f"file:{rest}", "give the path of a .csv or .npz file after the prefix, "
                            "e.g. file:data/table.csv")


class TableData(DataSection):
    """Your own table (file:<path>): a .csv with a header row, or an .npz; needs data.target and data.task."""

    catalogue = {"file:<path>": "your own .csv (header row) or .npz table; needs data.target and data.task"}
    prefix = "file:"

    name: str = Field(description="file:<path.csv|.npz>")
    target: str | None = Field(None, description="the target column (required)")
    task: Literal["regression", "classification"] | None = Field(None, description="the task (required)")
    split_column: str | None = Field(None, description="column marking test rows (test/1/true)")
    test_fraction: float = Field(0.2, gt=0.0, lt=1.0, description=TEST_FRACTION_DOC)

    @field_validator("name")
    @classmethod
    def _a_table(cls, v: str) -> str:
        check_table_name(v.removeprefix("file:"))
        return v

    @model_validator(mode="after")
    def _target_and_task(self) -> TableData:
        if self.target is None:
            raise ZooInputError("data.target", None, "a file: data set needs data.target (the target column)")
        if self.task is None:
            raise ZooInputError("data.task", None, "a file: data set needs data.task (regression or classification)")
        return self

    def load(self, seed: int) -> Dataset:
        return load_table(self.name.removeprefix("file:"), self.target, self.task, seed,
                          **given(self, "test_fraction", "split_column"))
