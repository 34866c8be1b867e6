"""Run directories: every file is written atomically (temp file + rename), so a crash never leaves half a file."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch

SPEC_FILE = "spec.yaml"
METRICS_FILE = "metrics.json"
CHECKPOINT_FILE = "checkpoint.pt"
POINT_ESTIMATE_FILE = "point_estimate.pt"  # a fit's point values by site name (guide.init_from reads it)
LOG_FILE = "train.log"


def write_atomically(path: Path, write_to: Callable[[Path], object]) -> Path:
    """Have ``write_to(tmp)`` write a temp file beside ``path``, flush it to disk, then rename it to ``path``.

    A crash or Ctrl-C at any point leaves the previous ``path`` intact (or no file), never a partial one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write_to(Path(tmp))
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _atomic(path: Path, write: Callable[[BinaryIO], object]) -> Path:
    def to_file(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            write(handle)

    return write_atomically(path, to_file)


def write_text(path: Path, text: str) -> Path:
    """Atomically write a text file."""
    return _atomic(path, lambda h: h.write(text.encode()))


def write_json(path: Path, obj: Any) -> Path:
    """Atomically write ``obj`` as indented JSON."""
    return write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def save_torch(path: Path, obj: Any) -> Path:
    """Atomically ``torch.save`` ``obj`` (the previous file stays intact until the new one is complete)."""
    return _atomic(path, lambda h: torch.save(obj, h))


def load_torch(path: Path, device: torch.device | str = "cpu") -> Any:
    """Load a checkpoint written by :func:`save_torch` onto ``device``."""
    return torch.load(path, map_location=device, weights_only=False)


class RunLog:
    """Appends lines to the run's ``train.log`` and echoes them to the console."""

    def __init__(self, run_dir: Path | None, echo=print) -> None:
        self.path = Path(run_dir) / LOG_FILE if run_dir is not None else None
        self.echo = echo

    def __call__(self, message: str) -> None:
        """Record one line."""
        if self.echo is not None:
            self.echo(message)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as handle:
                handle.write(message + "\n")
