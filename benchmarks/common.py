"""What the benchmark scripts share besides timing (:mod:`timing`): parsing their list options, the
``mean ± s.e.`` cell of their tables, and the JSON-lines file of finished cells a resumable run reads and appends to.

Imported by the scripts as a sibling module (``from common import parse_seeds``), as :mod:`timing` is; bad input is
a :class:`~zoo.errors.ZooInputError` naming the option, which the scripts' ``exit_code`` turns into exit 2.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Hashable
from pathlib import Path

from zoo.errors import ZooInputError


def parse_ranges(text: str, option: str, noun: str, example: str) -> list[int]:
    """``0-2``, ``0,3,5``, ``3`` or a mix (``0-4,7``) as the integers, in the order written.

    :param text: the option's value.
    :param option: the option, for the message (``--seeds``).
    :param noun: what one integer is, for the message (``seed``).
    :param example: how to write the option, for the message (``0-2 or 0,3,5``).
    :returns: the integers (a range counted up, both ends included).
    :raises ZooInputError: a part that is not ``N`` or ``N-M``, a range that runs backwards, or no integer at all.
    """
    out: list[int] = []
    for part in (p.strip() for p in str(text).split(",") if p.strip()):
        m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if not m:
            raise ZooInputError(option, text, f"write {noun}s as {example}")
        lo, hi = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
        if hi < lo:
            raise ZooInputError(option, text, f"range {part} runs backwards; write {hi}-{lo}")
        out.extend(range(lo, hi + 1))
    if not out:
        raise ZooInputError(option, text, f"give at least one {noun}, e.g. {example}")
    return out


def parse_seeds(text: str) -> list[int]:
    """``--seeds``: ``0-2``, ``0,3,5`` or a mix, as the seeds in the order written (see :func:`parse_ranges`)."""
    return parse_ranges(text, "--seeds", "seed", "0-2 or 0,3,5")


def parse_counts(text: str, option: str, example: str) -> list[int]:
    """Positive integers separated by commas (chain counts, chunk sizes, process counts), in the order written.

    :param text: the option's value.
    :param option: the option, for the message.
    :param example: a good value, for the message (``64,256``).
    :returns: the integers.
    :raises ZooInputError: a part that is not an integer, one below 1, or none at all.
    """
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise ZooInputError(option, text, f"give positive integers separated by commas, e.g. {example}")
    return values


def mean_se_cell(mean: float, se: float, digits: int) -> str:
    """A table cell ``mean ± s.e.``, both to ``digits`` decimals.

    :param mean: the mean over seeds or splits.
    :param se: its standard error.
    :param digits: the decimals shown.
    :returns: the cell, e.g. ``0.912 ± 0.004``.
    """
    return f"{mean:.{digits}f} ± {se:.{digits}f}"


def read_cells(path: Path, key: Callable[[dict], Hashable]) -> dict:
    """The finished cells of an earlier run, by ``key`` of each (a torn last line, from a kill mid-write, is
    skipped; a missing file has none)."""
    out: dict = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                cell = json.loads(line)
            except json.JSONDecodeError:
                continue
            out[key(cell)] = cell
    return out


def append_cell(path: Path, cell: dict) -> None:
    """One finished cell, appended as one line and flushed to disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(cell) + "\n")
        f.flush()
        os.fsync(f.fileno())


def resumed_or_fitted(done: dict, path: Path | None, key: Hashable, fit: Callable[[], dict]) -> tuple[dict, bool]:
    """The finished cell at ``key`` in ``done``, or ``fit()``'s, kept in ``done`` and appended to ``path`` (None:
    kept in memory only); and whether it was fitted now."""
    if key in done:
        return done[key], False
    done[key] = fit()
    if path is not None:
        append_cell(path, done[key])
    return done[key], True


def cells_file(option: str | None, key: Callable[[dict], Hashable]) -> tuple[Path | None, dict]:
    """A ``--cells`` option's file (None where not given) and its finished cells by ``key``."""
    path = Path(option) if option else None
    return path, ({} if path is None else read_cells(path, key))
