"""Run directories: claimed by one writer at a time, every file written atomically, checkpoints kept twice.

* A run directory is claimed with an OS lock (``.zoo-run.lock``, released by the OS when its process dies), so two
  ``zoo train`` never write one directory; a directory holding files that are not a zoo run is refused.
* Every file is written to a temp file beside it and renamed over it, so a crash never leaves half a file; files get
  the mode the user's umask asks for (``tempfile`` alone would make them 0600).
* A checkpoint's previous version is kept beside it (``checkpoint.prev.pt``), so a truncated or garbage checkpoint
  never loses the run: loading falls back to the previous one with a warning.
* Unreadable files and OS errors (permissions, a full disk) become :class:`ZooInputError` naming the path.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import torch

from zoo import distributed
from zoo.errors import ZooInputError, ZooWarning

SPEC_FILE = "spec.yaml"
METRICS_FILE = "metrics.json"
CHOSEN_FILE = "chosen.json"  # what a fit chose on its calibration rows, by spec field (BNN.chosen)
CHECKPOINT_FILE = "checkpoint.pt"
POINT_ESTIMATE_FILE = "point_estimate.pt"  # a fit's point values by site name (guide.init_from reads it)
LOG_FILE = "train.log"
MARKER_FILE = ".zoo-run"  # written when a run directory is claimed: what tells a zoo run from the user's files
SWEEP_MARKER = ".zoo-sweep"  # written when a sweep directory is claimed: what tells a sweep from a run
LOCK_FILE = ".zoo-run.lock"  # holds an OS lock while a process writes the run, and that process's pid
SAVED_FROM_MEMORY = "saved_from_memory"  # the marker's key for a run written from a fit kept in memory


def _file_mode() -> int:
    """The mode ``open()`` would give a new file under the current umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomically(path: Path, write_to: Callable[[Path], object], keep_previous: Path | None = None) -> Path:
    """Have ``write_to(tmp)`` write a temp file beside ``path``, flush it to disk, then rename it to ``path``.

    A crash or Ctrl-C at any point leaves the previous ``path`` intact (or no file), never a partial one; with
    ``keep_previous``, the file being replaced is first renamed there (the new one is already on disk). An OS error
    (a full disk, permissions) is a :class:`ZooInputError` naming ``path``. In a distributed job only rank 0 writes;
    the other ranks hold the same state and skip the write.

    :param path: the file to write; its folder is made when missing.
    :param write_to: writes the whole content to the temp file whose path it is given.
    :param keep_previous: where to keep the file being replaced, if anywhere.
    :returns: ``path``.
    :raises ZooInputError: on an OS error while writing.
    """
    path = Path(path)
    if not distributed.world().is_writer:
        return path
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        tmp = Path(name)
        write_to(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, _file_mode())
        if keep_previous is not None and path.exists():
            os.replace(path, keep_previous)
        os.replace(tmp, path)
    except BaseException as err:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise ZooInputError(str(path), err.strerror, "", message=f"cannot write {path}: "
                                f"{err.strerror or err}; its previous version (if any) is intact") from None
        raise
    return path


def _atomic(path: Path, write: Callable[[BinaryIO], object], keep_previous: Path | None = None) -> Path:
    def to_file(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            write(handle)

    return write_atomically(path, to_file, keep_previous)


def write_text(path: Path, text: str) -> Path:
    """Atomically write a text file (:func:`write_atomically`).

    :param path: the file to write.
    :param text: its content, written as UTF-8.
    :returns: ``path``.
    :raises ZooInputError: on an OS error while writing.
    """
    return _atomic(path, lambda h: h.write(text.encode()))


def recorded_choices(run_dir: Path) -> dict[str, Any]:
    """What a run's fit chose on its calibration rows (:data:`CHOSEN_FILE`, ``BNN.chosen``); {} for a run from before
    the record, or where it cannot be read (the fit loads without it).

    :param run_dir: the run directory.
    :returns: the choices by spec field.
    """
    try:
        stored = json.loads((Path(run_dir) / CHOSEN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return stored if isinstance(stored, dict) else {}


def write_json(path: Path, obj: Any) -> Path:
    """Atomically write ``obj`` as indented JSON, keys sorted.

    :param path: the file to write.
    :param obj: a JSON-serialisable value.
    :returns: ``path``.
    :raises ZooInputError: on an OS error while writing.
    """
    return write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def save_torch(path: Path, obj: Any) -> Path:
    """Atomically ``torch.save`` ``obj`` (the previous file stays intact until the new one is complete).

    :param path: the file to write.
    :param obj: anything ``torch.save`` takes.
    :returns: ``path``.
    :raises ZooInputError: on an OS error while writing.
    """
    return _atomic(path, lambda h: torch.save(obj, h))


def previous_version(path: Path) -> Path:
    """Where :func:`save_checkpoint` keeps the version before the current one: ``checkpoint.prev.pt``.

    :param path: the checkpoint's path.
    :returns: the previous version's path beside it (``<stem>.prev<suffix>``).
    """
    path = Path(path)
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def save_checkpoint(path: Path, obj: Any) -> Path:
    """:func:`save_torch`, keeping the file it replaces as :func:`previous_version` (one corrupt file loses nothing).

    The new file is complete on disk before either rename; a crash between the two renames leaves only the previous
    version, which :func:`load_checkpoint` then reads.

    :param path: the checkpoint file to write.
    :param obj: the checkpoint, anything ``torch.save`` takes.
    :returns: ``path``.
    :raises ZooInputError: on an OS error while writing.
    """
    return _atomic(Path(path), lambda h: torch.save(obj, h), keep_previous=previous_version(path))


def load_torch(path: Path, device: torch.device | str = "cpu") -> Any:
    """Load a file written by :func:`save_torch` onto ``device``; a missing or unreadable one names the file.

    ``torch.save`` writes a zip archive, so anything else is refused before it reaches the unpickler: unpickling
    arbitrary bytes can fail in any way at all (a ``MemoryError`` from a huge length read from noise, a
    ``KeyError``, a ``struct.error`` ...). For the same reason every failure inside ``torch.load`` of a file
    that passed the zip check counts as an unreadable file.

    :param path: the file to load.
    :param device: where to put its tensors.
    :returns: the object the file holds.
    :raises ZooInputError: when the file is missing, empty, not a zip archive or fails to load.
    """
    path = Path(path)
    if not path.exists():
        raise ZooInputError(str(path), "missing", "", message=f"{path} does not exist")
    if path.stat().st_size == 0:
        reason = "empty file"
    elif not zipfile.is_zipfile(path):
        reason = "not a zip archive, the format torch.save writes"
    else:
        try:
            return torch.load(path, map_location=device, weights_only=False)
        except Exception as err:  # noqa: BLE001 - see the docstring: any failure here means a corrupt file
            reason = f"{type(err).__name__}: {str(err)[:120]}"
    raise ZooInputError(str(path), reason, "", message=f"{path} is unreadable ({reason}): it is truncated, "
                        "corrupt or not a file the zoo wrote")


def load_checkpoint(path: Path, device: torch.device | str = "cpu", set_aside: bool = False) -> dict:
    """Load a checkpoint dict, falling back to its previous version (with a warning) when it is missing or corrupt.

    ``set_aside=True`` (a resume, about to write new checkpoints) renames an unreadable file to ``*.corrupt``, so
    that the next save does not rotate it over the good previous version.

    :param path: the checkpoint file.
    :param device: where to put its tensors.
    :param set_aside: rename an unreadable checkpoint to ``*.corrupt`` when falling back to the previous version.
    :returns: the checkpoint's dict.
    :raises ZooInputError: when the checkpoint is unreadable (or holds no dict) and its previous version is missing
        or unreadable too.
    """
    path = Path(path)
    try:
        state = load_torch(path, device)
        if not isinstance(state, dict):
            raise ZooInputError(str(path), type(state).__name__, "", message=f"{path} holds a "
                                f"{type(state).__name__}, not a zoo checkpoint")
        return state
    except ZooInputError as err:
        previous = previous_version(path)
        if not previous.exists():
            raise
        state = load_torch(previous, device)
        if set_aside and path.exists() and distributed.world().is_writer:
            os.replace(path, path.with_name(path.name + ".corrupt"))
        warnings.warn(f"{err}; using the previous checkpoint {previous.name} instead"
                      + (f" (the unreadable file is kept as {path.name}.corrupt)" if set_aside else ""),
                      ZooWarning, stacklevel=2)
        return state


def checkpoint_exists(path: Path) -> bool:
    """Whether a checkpoint (or its previous version) is stored at ``path``.

    :param path: the checkpoint's path.
    :returns: True when either file exists.
    """
    return Path(path).exists() or previous_version(path).exists()


# ------------------------------------------------------------------------------------------ claiming a run directory
def available_memory() -> int | None:
    """Bytes of memory that new processes can still take: the kernel's MemAvailable (or free pages), lowered to
    what the cgroup's limit leaves; None where neither is known.

    :returns: the bytes available, or None.
    """
    found: int | None = None
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    found = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if found is None:
        try:
            found = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            left = int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
            found = left if found is None else min(found, left)
    except (OSError, ValueError):
        pass
    return None if found is None else max(0, found)


MEMORY_SHARE = 0.5  # the share of the memory available that one size asked for may take


def check_size_fits(field: str, value: Any, need: int, fix: str | Callable[[float], str], what: str) -> None:
    """The one size guard: refuse, before anything is allocated, a setting whose estimated memory (``need`` bytes,
    from counts and shapes) is more than :data:`MEMORY_SHARE` of the memory available (never where that is unknown).

    :param field: the option or setting that asked for the size, named in the refusal (e.g. ``--samples``).
    :param value: the value asked for.
    :param need: the estimate in bytes.
    :param fix: what to change, or a function of the bytes allowed that says it (e.g. the largest value that fits).
    :param what: what would take the memory, e.g. ``"100,000,000 draws"``.
    :raises ZooInputError: naming the estimate, the limit and the fix.
    """
    free = available_memory()
    if free is None or need <= free * MEMORY_SHARE:
        return
    allowed = free * MEMORY_SHARE
    advice = fix(allowed) if callable(fix) else fix
    raise ZooInputError(field, value, f"{what} would take about {_gib(need)}, more than {MEMORY_SHARE:.0%} of "
                        f"the {_gib(free)} of memory available ({_gib(allowed)}): {advice}")


def _gib(size: float) -> str:
    """Bytes in GiB (to three significant digits below 1 GiB)."""
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**30:.3g} GiB"


def most_covariance_dim(element_size: int, copies: int) -> int | None:
    """The largest D whose ``copies`` full D x D matrices of ``element_size`` bytes an entry
    :func:`check_covariance_fits` lets through, or None where the memory available is unknown (no bound).

    :param element_size: bytes an entry.
    :param copies: how many D x D matrices are held at once.
    :returns: the largest D, or None.
    """
    free = available_memory()
    return None if free is None else int((free * MEMORY_SHARE / (copies * element_size)) ** 0.5)


def check_covariance_fits(field: str, value: Any, dim: int, element_size: int, copies: int,
                          advice: Callable[[int], str]) -> None:
    """:func:`check_size_fits` for a full D x D matrix (a covariance, its Cholesky factor, a Hessian) kept in
    ``copies`` copies of ``element_size`` bytes an entry: refused before any is allocated.

    :param field: the setting that asked for it.
    :param value: its value.
    :param dim: D.
    :param element_size: bytes an entry.
    :param copies: how many D x D matrices are held at once.
    :param advice: what to change, given the largest D that fits.
    """
    per = copies * element_size
    check_size_fits(field, value, dim * dim * per, lambda allowed: advice(int((allowed / per) ** 0.5)),
                    f"{copies} full {dim:,} x {dim:,} matrices (covariance, Cholesky factor, ...)")


PNG_MARK_KEY = "zoo"  # the PNG text chunk that holds the mark of the zoo command that wrote a plot


def carries_mark(path: Path, mark: str) -> bool:
    """Whether ``path`` is a file that the zoo command whose ``mark`` this is wrote (so that command may replace it):
    a PNG holds the mark in its ``zoo`` text chunk (:func:`zoo.plots.save_figure` with ``mark``), any other file on
    its first line (``zoo report``'s Markdown). A file the user wrote carries no mark, so it is never replaced.

    :param path: the file.
    :param mark: the command's mark.
    :returns: whether ``path`` is a file carrying ``mark``.
    """
    path = Path(path)
    if not path.is_file():
        return False
    if path.suffix.lower() == ".png":
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(path) as image:  # reads the header and the text chunks, not the pixels
                return getattr(image, "text", {}).get(PNG_MARK_KEY) == mark
        except (OSError, UnidentifiedImageError, SyntaxError):  # a user's file that is no readable PNG
            return False
    with open(path, "rb") as handle:
        return handle.readline().decode("utf-8", "replace").rstrip("\r\n") == mark


def refuse_to_replace(path: Path, mark: str, field: str, command: str, fix: str) -> None:
    """The one guard of a command's output files: refuse ``path`` where it is a directory, or a file that does not
    carry the command's ``mark`` (:func:`carries_mark`: the user's own data, never replaced).

    :param path: the file the command is about to write.
    :param mark: the command's mark.
    :param field: the option that named the file (or its folder), for the message.
    :param command: the command, e.g. ``zoo compare``.
    :param fix: what to do instead, e.g. ``choose another --out``.
    :raises ZooInputError: naming the file and the fix.
    """
    path = Path(path)
    if path.is_dir():
        raise ZooInputError(field, str(path), f"{path} is a directory; {command} writes a file there: {fix}")
    if path.exists() and not carries_mark(path, mark):
        raise ZooInputError(field, str(path), f"{path} exists and was not written by {command}, so it is not "
                            f"replaced: {fix}")


def check_writable_directory(out: Path) -> None:
    """Refuse an --out that is a file, lies under a file, or cannot be created or written, before anything runs.

    Creates the directory (and its parents) when missing.

    :param out: the directory asked for.
    :raises ZooInputError: when it cannot hold a run, saying why.
    """
    if out.exists() and not out.is_dir():
        raise ZooInputError("--out", str(out), "is a file; give a directory for the run")
    parent = out
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ZooInputError("--out", str(out), f"{parent} is a file, so no directory can be made under it")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as err:
        raise ZooInputError("--out", str(out), f"cannot write there ({err.strerror}); fix its permissions or pick "
                            "another --out") from None


def _foreign_files(out: Path) -> list[str]:
    """Files in ``out`` that show it is not a zoo run (empty if it is one, or is empty)."""
    names = sorted(p.name for p in out.iterdir() if p.name != LOCK_FILE and not p.name.endswith(".tmp"))
    is_run = MARKER_FILE in names or {SPEC_FILE, LOG_FILE} <= set(names)  # the latter: runs from before the marker
    return [] if is_run else names


def _try_lock(handle: BinaryIO) -> bool:
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        try:
            msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def claimed_run_directory(out: Path, resume: bool = False) -> Iterator[Path]:
    """Hold ``out`` as this process's run directory for the block: one writer at a time, never the user's files.

    Refuses (exit 2) an --out that is a file or unwritable, a non-empty directory that is not a zoo run, and a run
    another live process is writing (naming its pid). The lock is an OS lock, so a process that dies releases it.

    :param out: the run directory, created when missing.
    :param resume: whether the run resumes (a refusal of the directory's files then names ``--resume``, not
        ``--out``).
    :returns: a context manager that yields ``out`` as a Path.
    :raises ZooInputError: when the directory is refused.
    """
    out = Path(out)
    check_writable_directory(out)
    foreign = _foreign_files(out)
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise ZooInputError("--resume" if resume else "--out", str(out), f"holds files that are not a zoo run "
                            f"({shown}); pick a new or empty directory")
    with locked_directory(out, "run", MARKER_FILE):
        yield out


def mark_saved_from_memory(out: Path) -> Path:
    """Mark a run directory as written from a fit kept in memory (:meth:`zoo.BNN.save` after ``fit`` without
    ``out``): it holds the finished fit, not the checkpoints of a fit as it ran, so it loads but does not resume.

    :param out: the run directory, claimed by this process.
    :returns: the marker file.
    """
    return write_json(Path(out) / MARKER_FILE, {"zoo_run": 1, SAVED_FROM_MEMORY: True})


def saved_from_memory(out: Path) -> bool:
    """Whether a run directory was written from a fit kept in memory (:func:`mark_saved_from_memory`).

    :param out: the run directory.
    :returns: whether its marker says so; False for a run written as it was fitted, or no run at all.
    """
    try:
        marker = json.loads((Path(out) / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get(SAVED_FROM_MEMORY) is True


def writer_of(out: Path) -> str | None:
    """Which live process, if any, is writing a run or sweep directory. Takes the lock for an instant when it is
    free, so it never blocks.

    :param out: the run or sweep directory.
    :returns: the pid its lock file names while a live process holds the lock, else None.
    """
    lock = Path(out) / LOCK_FILE
    if not lock.is_file():
        return None
    with open(lock, "rb+") as handle:
        if _try_lock(handle):
            return None  # free: closing the file releases it again
        return handle.read().decode(errors="replace").strip() or "unknown"


@contextlib.contextmanager
def locked_directory(out: Path, what: str, marker: str) -> Iterator[Path]:
    """Hold the OS lock of ``out`` (a ``what``: run or sweep directory) for the block, with this process's pid in
    :data:`LOCK_FILE`, and mark it with ``marker``; refused (exit 2, naming the holder's pid) while another live
    process holds it. A process that dies releases the lock.

    :param out: the directory, which must exist.
    :param what: what the directory is (``run`` or ``sweep``), for the marker's content and the refusal.
    :param marker: the marker file's name (:data:`MARKER_FILE` or :data:`SWEEP_MARKER`), written when missing.
    :returns: a context manager that yields ``out``.
    :raises ZooInputError: while another live process holds the lock.
    """
    handle = open(os.open(out / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666), "rb+")
    try:
        if not _try_lock(handle):
            holder = handle.read().decode(errors="replace").strip() or "unknown"
            raise ZooInputError("--out", str(out), f"another zoo process (pid {holder}) is writing this {what} "
                                "directory; wait for it to end or pick another --out")
        handle.truncate(0)
        handle.write(str(os.getpid()).encode())
        handle.flush()
        if not (out / marker).exists():
            write_json(out / marker, {f"zoo_{what}": 1})
        yield out
    finally:
        handle.close()  # closing the descriptor releases the lock


class RunLog:
    """Appends lines to the run's ``train.log`` and echoes them to the console; call it with each line.

    :param run_dir: the run directory whose ``train.log`` is appended to; None logs to the console only.
    :param echo: prints each line (e.g. ``print``); None for no console output.
    :param keep: also keep the lines in :attr:`lines` (a fit kept in memory, whose ``train.log`` is written when it
        is saved).
    """

    def __init__(self, run_dir: Path | None, echo=print, keep: bool = False) -> None:
        self.path = Path(run_dir) / LOG_FILE if run_dir is not None else None
        self.echo = echo
        self.lines: list[str] | None = [] if keep else None

    def __call__(self, message: str) -> None:
        """Record one line."""
        if self.echo is not None:
            self.echo(message)
        if self.lines is not None:
            self.lines.append(message)
        if self.path is not None and distributed.world().is_writer:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as handle:
                handle.write(message + "\n")


def load_point_values(source: str, field: str = "guide.init_from") -> dict[str, torch.Tensor]:
    """Point values by site name from a run directory, a point-estimate file or a plain net ``state_dict``.

    :param source: a run directory (its ``point_estimate.pt`` is read) or a ``.pt`` file.
    :param field: the spec setting that named ``source``, named in a refusal.
    :returns: the point values ``{site: tensor}``.
    :raises ZooInputError: when no such file exists, it is unreadable, or it holds no dict of tensors.
    """
    path = Path(source)
    if path.is_dir():
        path = path / POINT_ESTIMATE_FILE
    if not path.is_file():
        raise ZooInputError(field, source, "give a run directory (with point_estimate.pt) or a .pt file")
    values = load_torch(path)
    if not isinstance(values, dict) or not all(torch.is_tensor(v) for v in values.values()):
        raise ZooInputError(field, source, "the file must hold a dict of tensors keyed by site name")
    return values
