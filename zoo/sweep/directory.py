"""The sweep directory (``--out``): the names of its files, claiming it for one sweep process (never a run's
directory, nor one inside a run or another sweep), refusing a run inside a sweep's, and what earlier processes
recorded in it (its trial directories, the trials and wall time in ``sweep.json``)."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

from zoo.errors import ZooInputError
from zoo.runs import (
    CHECKPOINT_FILE,
    LOCK_FILE,
    LOG_FILE,
    MARKER_FILE,
    METRICS_FILE,
    SPEC_FILE,
    SWEEP_MARKER,
    check_writable_directory,
    locked_directory,
)

SWEEP_FILE = "sweep.json"
STUDY_FILE = "study.log"
BEST_SPEC_FILE = "best.yaml"
TRIALS_DIR = "trials"


def _run_files(path: Path) -> list[str]:
    """The files in ``path`` that show it holds a zoo run (a run's own files, or the run marker of a directory
    that is no sweep); empty for a sweep, an empty directory or one that does not exist."""
    try:
        names = {p.name for p in path.iterdir()}
    except OSError:
        return []
    found = sorted(names & {SPEC_FILE, METRICS_FILE, LOG_FILE, CHECKPOINT_FILE})
    if MARKER_FILE in names and not names & {SWEEP_FILE, SWEEP_MARKER}:
        found.append(MARKER_FILE)
    return found


def _is_run_directory(path: Path) -> bool:
    """Whether ``path`` is a zoo run's directory, as :mod:`zoo.runs` tells one (its marker, or spec.yaml with
    train.log), and no sweep's."""
    names = set(_run_files(path))
    return MARKER_FILE in names or {SPEC_FILE, LOG_FILE} <= names


def _is_sweep_marked(path: Path) -> bool:
    """Whether ``path`` is a zoo sweep's directory: its marker, or (a sweep from before the marker) its sweep.json
    beside the run marker it was claimed with; a sweep.json of the user's own is no zoo sweep."""
    return (path / SWEEP_MARKER).is_file() or ((path / SWEEP_FILE).is_file() and (path / MARKER_FILE).is_file())


def refuse_run_in_sweep(out: str | Path) -> None:
    """Refuse a run's ``--out`` that is, or lies inside, a sweep's directory: a sweep and a run never share one
    (the sweep's own trials are written by the sweep, in its trials/).

    :param out: the run's ``--out``.
    :raises ZooInputError: when ``out`` is or lies inside a sweep's directory.
    """
    out = Path(out)
    for place in (out.resolve(), *out.resolve().parents):
        if _is_sweep_marked(place):
            where = "is" if place == out.resolve() else "lies inside"
            raise ZooInputError("--out", str(out), f"{where} the sweep directory {place}: a run and a sweep never "
                                "share a directory; train into a directory outside it (e.g. zoo train "
                                f"{place / BEST_SPEC_FILE} --out {place.parent / (place.name + '-best')})")


@contextlib.contextmanager
def claimed_sweep_directory(out: Path) -> Iterator[Path]:
    """Hold ``out`` as this process's sweep directory for the block: one sweep process at a time (the OS lock of
    :func:`zoo.runs.claimed_run_directory`), never a run's directory nor the user's files.

    Refuses (exit 2) an ``--out`` that holds a run or lies inside a run or another sweep, and a non-empty directory
    that is not a sweep. The sweep marker (:data:`SWEEP_MARKER`) replaces the run marker that sweeps wrote before
    it, so that ``zoo train`` refuses the directory.

    :param out: the sweep directory, created when missing.
    :returns: a context manager that yields ``out`` as a Path.
    :raises ZooInputError: when the directory is refused, or another live process holds it.
    """
    out = Path(out)
    for parent in out.resolve().parents:
        if _is_run_directory(parent) or _is_sweep_marked(parent):
            what = "run" if _is_run_directory(parent) else "sweep"
            raise ZooInputError("--out", str(out), f"lies inside the {what} directory {parent}; a sweep and a run "
                                "never share a directory: pick an --out outside it")
    check_writable_directory(out)
    run = _run_files(out)
    if run:
        raise ZooInputError("--out", str(out), f"holds a run ({', '.join(run)}); a sweep and a run never share a "
                            "directory (the sweep's files would mix with the run's): pick a new --out for the sweep")
    names = sorted(p.name for p in out.iterdir() if p.name != LOCK_FILE and not p.name.endswith(".tmp"))
    if names and not _is_sweep_marked(out):
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise ZooInputError("--out", str(out), f"holds files that are not a zoo sweep ({shown}); pick a new or empty "
                            "directory")
    with locked_directory(out, "sweep", SWEEP_MARKER):
        (out / MARKER_FILE).unlink(missing_ok=True)  # a sweep from before its own marker carried the run marker
        yield out


def _trial_directories(out: Path) -> list[int]:
    """The trial numbers that ``out/trials`` holds a directory for."""
    folder = out / TRIALS_DIR
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and re.fullmatch(r"\d+", p.name))


def _recorded_trials(out: Path, where: str, study_name: str) -> tuple[int, str | None]:
    """How many trials an earlier process recorded in ``out``'s sweep.json, and where it said the study lives when
    that is not study ``study_name`` in ``where``."""
    try:
        record = json.loads((out / SWEEP_FILE).read_text())
        ran, storage, name = len(record.get("trials") or []), str(record["storage"]), str(record["study"])
        if record.get("own_storage"):
            storage = str(out / STUDY_FILE)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return 0, None

    def same(a: str, b: str) -> bool:
        return a == b or ("://" not in a + b and Path(a).resolve() == Path(b).resolve())

    return ran, None if same(storage, where) and name == study_name else f"study '{name}' in {storage}"


def _earlier_wall_seconds(out: Path) -> float:
    """The wall seconds a continued sweep already spent, from its sweep.json (0 for a new sweep): a sweep's time
    counts every process that ran it, not only the last."""
    try:
        return float(json.loads((out / SWEEP_FILE).read_text()).get("wall_seconds") or 0.0)
    except (OSError, ValueError, TypeError, AttributeError):
        return 0.0
