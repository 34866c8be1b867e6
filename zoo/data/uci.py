"""UCI regression benchmark folders in the standard format (data.txt, index files, 20 fixed splits).

Owns finding the data directory (explicit, else ``$ZOO_DATA_DIR``) and reading one split of one folder.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
from pydantic import Field, field_validator

from zoo.data.base import DataSection, Dataset, make_dataset
from zoo.errors import ZooInputError

ENV_VAR = "ZOO_DATA_DIR"


def resolve_data_dir(explicit: str | None) -> Path:
    """The data directory: ``explicit`` if given, else ``$ZOO_DATA_DIR``; it must exist."""
    raw = explicit if explicit else os.environ.get(ENV_VAR) or None
    if raw is None:
        raise ZooInputError("data.dir", None, f"pass --data-dir DIR or set {ENV_VAR} to the folder holding the data")
    path = Path(raw).expanduser()
    if not path.is_dir():
        source = "data.dir" if explicit else ENV_VAR
        raise ZooInputError(source, str(path), "no such directory; pass --data-dir DIR or set "
                            f"{ENV_VAR} to an existing folder")
    return path


def _available(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir()
                  if p.is_dir() and ((p / "data.txt").is_file() or (p / "data" / "data.txt").is_file()))


def _folder(folder: str, data_dir: str | None) -> Path:
    """The directory holding ``data.txt`` for ``folder`` (flat layout, or the original ``<folder>/data/``)."""
    root = resolve_data_dir(data_dir)
    if not folder or "/" in folder or "\\" in folder or folder in (".", ".."):
        raise ZooInputError("data.name", f"uci:{folder}", f"use uci:<folder> with one of {_available(root)}")
    for candidate in (root / folder, root / folder / "data"):
        if (candidate / "data.txt").is_file():
            return candidate
    raise ZooInputError("data.name", f"uci:{folder}",
                        f"no folder {folder!r} with a data.txt in {root}; folders there: {_available(root) or 'none'}")


def _text(path: Path) -> str:
    """A UCI text file's contents; a file that is not text (or not UTF-8) is refused with its name."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ZooInputError(str(path), f"byte {err.start} is not UTF-8 text", "the UCI files are plain text "
                            "(numbers separated by whitespace); re-save it as UTF-8 or ASCII") from None


def _read_ints(path: Path) -> np.ndarray:
    """Whitespace-separated integer indices (written as ints or as floats like ``3.0``)."""
    if not path.is_file():
        raise ZooInputError("uci files", str(path), "file is missing; every folder needs data.txt and index files")
    tokens = _text(path).split()
    try:
        values = np.array([float(t) for t in tokens], dtype=np.float64)
    except ValueError as err:
        raise ZooInputError(str(path), str(err), "index files hold whole numbers only") from None
    if len(values) == 0:
        raise ZooInputError(str(path), "empty file", "list at least one 0-based index")
    if not np.all(np.isfinite(values)) or np.any(values != np.round(values)):
        raise ZooInputError(str(path), "non-integer index", "index files hold whole numbers only")
    return values.astype(np.int64)


def _read_table(path: Path) -> np.ndarray:
    """data.txt as a float array, refusing ragged rows, non-numbers and NaNs with the offending line."""
    rows: list[list[float]] = []
    width = None
    for lineno, line in enumerate(_text(path).splitlines(), start=1):
        tokens = line.split()
        if not tokens:
            continue  # blank lines are skipped, as numpy.loadtxt does
        if width is None:
            width = len(tokens)
        elif len(tokens) != width:
            raise ZooInputError(str(path), f"line {lineno} has {len(tokens)} values",
                                f"every row must have {width} values like the first row (ragged rows)")
        try:
            row = [float(t) for t in tokens]
        except ValueError:
            raise ZooInputError(str(path), f"line {lineno}: {line.strip()[:60]!r}",
                                "rows hold whitespace-separated numbers only") from None
        if not all(np.isfinite(row)):
            raise ZooInputError(str(path), f"NaN/inf on line {lineno}", "clean or drop that row")
        rows.append(row)
    if not rows:
        raise ZooInputError(str(path), "no rows", "data.txt must hold one example per line")
    return np.asarray(rows, dtype=np.float64)


def _check_range(idx: np.ndarray, size: int, path: Path, what: str) -> None:
    bad = idx[(idx < 0) | (idx >= size)]
    if len(bad):
        raise ZooInputError(str(path), f"{what} index {int(bad[0])}", f"indices must lie in 0..{size - 1}")


def n_splits(folder: str, data_dir: str | None) -> int:
    """Number of splits of a folder: ``n_splits.txt``, else the count of ``index_train_*.txt`` files."""
    base = _folder(folder, data_dir)
    if (base / "n_splits.txt").is_file():
        return int(_read_ints(base / "n_splits.txt")[0])
    return sum(1 for p in base.iterdir() if re.fullmatch(r"index_train_\d+\.txt", p.name))


def load_uci(folder: str, split: int, data_dir: str | None) -> Dataset:
    """One fixed train/test split of a UCI folder, standardised with that split's training statistics."""
    base = _folder(folder, data_dir)
    count = n_splits(folder, data_dir)
    if isinstance(split, bool) or not isinstance(split, int | np.integer) or not 0 <= split < count:
        raise ZooInputError("data.split", split, f"{folder} has {count} splits: use 0..{count - 1}")
    data = _read_table(base / "data.txt")
    n_rows, n_cols = data.shape
    features = _read_ints(base / "index_features.txt")
    target = _read_ints(base / "index_target.txt")
    if len(target) != 1:
        raise ZooInputError(str(base / "index_target.txt"), f"{len(target)} indices", "name exactly one target column")
    _check_range(features, n_cols, base / "index_features.txt", "column")
    _check_range(target, n_cols, base / "index_target.txt", "column")
    train = _read_ints(base / f"index_train_{split}.txt")
    test = _read_ints(base / f"index_test_{split}.txt")
    _check_range(train, n_rows, base / f"index_train_{split}.txt", "row")
    _check_range(test, n_rows, base / f"index_test_{split}.txt", "row")
    shared = np.intersect1d(train, test)
    if len(shared):
        raise ZooInputError(str(base / f"index_train_{split}.txt"), f"{len(shared)} rows also in the test split "
                            f"(first: row {int(shared[0])})", f"the train and test indices of split {split} must not "
                            "overlap, or the run is scored on rows it trained on; fix the index files")
    if int(target[0]) in set(features.tolist()):
        raise ZooInputError(str(base / "index_features.txt"), f"column {int(target[0])}", "is the target column "
                            "(index_target.txt); drop it from the features, or the net reads the answer")
    x, y = data[:, features], data[:, int(target[0])]
    return make_dataset(f"uci:{folder}", "regression", x[train], y[train], x[test], y[test])


def uci_protocol(folder: str, data_dir: str | None) -> dict[str, int]:
    """The benchmark protocol stored with a folder: n_hidden, n_epochs (and n_splits), where the files exist."""
    base = _folder(folder, data_dir)
    out = {}
    for key in ("n_hidden", "n_epochs", "n_splits"):
        if (base / f"{key}.txt").is_file():
            out[key] = int(_read_ints(base / f"{key}.txt")[0])
    return out


def check_uci_name(rest: str) -> None:
    """Refuse a ``uci:`` name without a folder (before any file is read)."""
    if not rest.strip():
        raise ZooInputError("data.name", f"uci:{rest}", "name the UCI folder after the prefix, e.g. uci:housing")


class UCIData(DataSection):
    """A UCI regression folder in the standard 20-split format (uci:<folder>), from --data-dir or $ZOO_DATA_DIR."""

    catalogue = {"uci:<folder>": "UCI regression folder in the standard 20-split format, from --data-dir or "
                                 "$ZOO_DATA_DIR"}
    prefix = "uci:"

    name: str = Field(description="uci:<folder>, e.g. uci:bostonHousing")
    split: int = Field(0, ge=0, description="the split index (0..n_splits-1)")
    dir: str | None = Field(None, description="data directory holding the UCI folders; falls back to $ZOO_DATA_DIR")

    @field_validator("name")
    @classmethod
    def _a_folder(cls, v: str) -> str:
        check_uci_name(v.removeprefix("uci:"))
        return v

    def load(self, seed: int) -> Dataset:
        return load_uci(self.name.removeprefix("uci:"), self.split, self.dir)
