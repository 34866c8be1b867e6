"""Shared fixtures: tiny run specs and a few small end-to-end runs trained once per test session."""

from __future__ import annotations

import copy
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from zoo.cli import main
from zoo.pipeline import train
from zoo.runs import CHECKPOINT_FILE
from zoo.spec import RunSpec, load_spec

# Tiny tensors: one thread is faster than two, and far faster when another process keeps a core busy.
torch.set_num_threads(1)

# Tiny but real: a few hundred milliseconds of training each on one CPU core.
SPECS: dict[str, dict] = {
    "toy": {
        "data": {"name": "toy_gap"},
        "net": {"hidden": [8], "activation": "tanh"},
        "inference": {"num_steps": 200, "batch_size": 32, "lr": 0.01, "checkpoint_every": 100,
                      "predictive_samples": 20},
        "device": "cpu",
        "seed": 0,
    },
    "digits": {
        "data": {"name": "digits", "ood_classes": [8, 9]},
        "net": {"hidden": [16]},
        "prior": {"name": "scale_mixture", "pi": 0.5, "sigma1": 1.0, "sigma2": 0.0025,
                  "sites": {"*.bias": {"name": "normal", "scale": 1.0}}},
        "guide": {"init_rho": -5.0},
        "inference": {"num_steps": 100, "batch_size": 64, "lr": 0.01, "local_reparam": True,
                      "predictive_samples": 20},
        "device": "cpu",
        "seed": 0,
    },
}


def refused(argv: list[str], capsys, fragments: str | tuple[str, ...], expected: int = 2) -> str:
    """``zoo ARGV`` (in-process) exits ``expected`` with one ``error:`` paragraph holding every fragment, and no
    traceback; returns the message."""
    code = main(argv)
    captured = capsys.readouterr()
    message = captured.err.strip()
    assert code == expected, captured
    assert message.startswith("error: "), message
    assert "Traceback" not in captured.err + captured.out
    assert_fragments(message, fragments)
    return message


def sandbox(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """A refusal test's folders: ``in`` for its input files, ``out`` for the run; the working directory and Python's
    temporary directory moved under ``tmp_path``, so that whatever a refused command writes is found there.

    :returns: the ``in`` and ``out`` folders (``in`` created).
    """
    (tmp_path / "in").mkdir()
    (tmp_path / "tmp").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return tmp_path / "in", tmp_path / "out"


def assert_fragments(message: str, fragments: str | tuple[str, ...]) -> None:
    """Every fragment (one string or several) is in the message."""
    for fragment in (fragments,) if isinstance(fragments, str) else fragments:
        assert fragment in message, (fragment, message)


def assert_input_error(tree: dict, overrides: list[str], patterns: list[str], tmp_path: Path, capsys) -> str:
    """``zoo train`` of spec ``tree`` with ``--set`` overrides exits 2 with a one-line error (no traceback) that
    matches every regex in ``patterns``, and leaves no checkpoint; returns the message."""
    import yaml

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(tree))
    argv = ["train", str(spec), "--out", str(tmp_path / "run"), "--no-progress"]
    for override in overrides:
        argv += ["--set", override]
    code = main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2, captured
    assert err.startswith("error: ") and "Traceback" not in captured.err + captured.out
    for pattern in patterns:
        assert re.search(pattern, err), (pattern, err)
    assert not (tmp_path / "run" / CHECKPOINT_FILE).exists()
    return err


# Tests of compiled steps need a C++ compiler (torch.compile's CPU backend), and there a fallback to eager is an
# error, so that they cannot pass by comparing eager with eager.
COMPILED_STEP_MARKS = [
    pytest.mark.skipif(not any(shutil.which(c) for c in (os.environ.get("CXX", "g++"), "g++", "clang++")),
                       reason="torch.compile's CPU backend needs a C++ compiler (steps fall back to eager without)"),
    pytest.mark.filterwarnings("error:compiling"),
]


def compiled_step(test):
    """Decorator: the marks of a test that runs compiled steps."""
    for mark in COMPILED_STEP_MARKS:
        test = mark(test)
    return test


def load_benchmark(name: str, as_name: str | None = None):
    """The script ``benchmarks/<name>.py`` as a module (the benchmarks are scripts, not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(as_name or f"{name}_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import would: a dataclass defined in it looks its module up there
    spec.loader.exec_module(module)
    return module


def make_spec(base: str = "toy", *overrides: str) -> RunSpec:
    """A validated tiny spec, with ``--set``-style overrides."""
    return load_spec(copy.deepcopy(SPECS[base]), list(overrides))


@pytest.fixture(scope="session")
def spec_factory():
    """``spec_factory("toy", "inference.num_steps=10", ...)`` -> RunSpec."""
    return make_spec


@pytest.fixture(scope="session")
def toy_run(tmp_path_factory):
    """The reference toy_gap run (mean-field, learned noise, minibatches of 32, checkpoints every 100 steps)."""
    return train(make_spec("toy"), tmp_path_factory.mktemp("toy") / "run", progress=False, echo=None)


@pytest.fixture(scope="session")
def map_run(tmp_path_factory):
    """A MAP fit (Delta guide) of the toy net, for initialising mean-field guides."""
    spec = make_spec("toy", "guide.name=delta", "inference.num_steps=100", "inference.predictive_samples=2")
    return train(spec, tmp_path_factory.mktemp("map") / "run", progress=False, echo=None)


def different_entries(a: dict, b: dict) -> list[str]:
    """The keys where two state dicts differ: a tensor not equal element for element, or any other entry (a guide's
    extra state, e.g. a chosen dropout rate) not equal; a key in one only counts too."""
    keys = a.keys() | b.keys()
    return sorted(k for k in keys if k not in a or k not in b or not (
        torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) and torch.is_tensor(b[k]) else a[k] == b[k]))


def choice_in_log(lines: list[str], what: str) -> tuple[float, dict[float, float], str]:
    """A choice on the calibration rows as its log line states it (``svi: <what> <kept>[ at lr <lr>], chosen on ... by a
    whole run at each (-test LL <candidate>[ at lr <lr>]: <score>, ...)``): the value kept, each candidate's score
    (by ``(value, lr)`` where the candidates ran at each lr), and the line."""
    line = next(x for x in lines if x.startswith(f"svi: {what} ") and "chosen on" in x)
    kept = float(line.split(f"svi: {what} ")[1].split(",")[0].split(" at lr ")[0])

    def candidate(name: str) -> float | tuple[float, float]:  # a joint choice's candidates: (value, lr)
        value, _, lr = name.partition(" at lr ")
        return (float(value), float(lr)) if lr else float(value)

    scores = {candidate(k): float(v) for k, v in (pair.split(": ") for pair in
                                                   line.split("(-test LL ")[1].rstrip(")").split(", "))}
    return kept, scores, line


def crash_in_the_second_candidate(monkeypatch, step: int, nth: int = 2) -> list[int]:
    """Raise ``RuntimeError("simulated")`` once, when SVI reaches ``step`` for the ``nth`` time (by default in the
    second of a choice's candidate runs); returns the list of steps taken, appended as they come (``kl_weight`` is
    asked once a step)."""
    import zoo.inference.svi as svi

    real, seen, crashed = svi.kl_weight, [], []

    def weight(at, spec, n_steps=None):
        seen.append(at)
        if at == step and seen.count(step) == nth and not crashed:
            crashed.append(at)
            raise RuntimeError("simulated")
        return real(at, spec, n_steps)

    monkeypatch.setattr(svi, "kl_weight", weight)
    return seen


def interrupt_at(monkeypatch, step, exc=KeyboardInterrupt):
    """Raise ``exc`` at the start of SVI step ``step`` (before it draws anything)."""
    import zoo.inference.svi as svi

    real = svi.kl_weight

    def kl_weight(s, spec, n_steps=None):
        if s == step:
            raise exc("simulated")
        return real(s, spec, n_steps)

    monkeypatch.setattr(svi, "kl_weight", kl_weight)


def tiny_hmc(**inference) -> dict:
    """The smallest many-chain HMC run spec: a 3-unit toy net on 20 rows (``inference`` overrides)."""
    return {"data": {"name": "toy_gap", "n_train": 20}, "net": {"hidden": [3]}, "likelihood": {"noise": 0.3},
            "inference": {"method": "hmc", "num_chains": 2, "warmup_steps": 4, "num_samples": 4,
                          "checkpoint_every": 2, "predictive_samples": 4, **inference},
            "device": "cpu"}


def sigterm_ends_cleanly(job) -> str:
    """Send SIGTERM to a running ``zoo train`` subprocess; it must exit 143 with a message and no traceback.
    Returns its stderr (the job is killed if it does not end)."""
    import signal

    try:
        job.send_signal(signal.SIGTERM)
        _, stderr = job.communicate(timeout=120)
    finally:
        job.kill()
    assert job.returncode == 143, stderr
    assert "interrupted by SIGTERM" in stderr and "Traceback" not in stderr, stderr
    return stderr


def record_checkpoints(monkeypatch, module) -> list[dict]:
    """Every checkpoint ``module`` saves (still written to disk), as loaded back: a list that grows as it runs."""
    from zoo import runs

    saved: list[dict] = []
    real_save = runs.save_checkpoint

    def keep(path, obj):
        saved.append(torch.load(real_save(path, obj), weights_only=False))
        return path

    monkeypatch.setattr(module, "save_checkpoint", keep)
    return saved



def release_check() -> dict:
    """The names ``.ci/check_release`` defines (its small sizes, its contents check), loaded without running it."""
    import runpy

    return runpy.run_path(str(Path(__file__).resolve().parents[1] / ".ci" / "check_release"))


def pytest_terminal_summary(terminalreporter) -> None:
    """Close the log with what the docs test checked (tests/test_docs_blocks.py records it; the property travels
    from an xdist worker with its report)."""
    for report in terminalreporter.stats.get("passed", []):
        for key, value in getattr(report, "user_properties", []):
            if key == "docs_blocks":
                terminalreporter.write_line(f"docs: {value}")
