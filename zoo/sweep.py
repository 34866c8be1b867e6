"""Owns ``zoo sweep``: a hyperparameter search over a spec's own keys, scored on validation rows only, on Optuna.

A trial is a whole ``zoo train`` of the spec with the trial's settings, evaluated on ``data.validation_fraction``
of the training rows (never the test rows). Optuna's TPE sampler proposes the settings; a median pruner stops a
trial whose intermediate validation score (10 evenly spaced scores per fit, see
:class:`zoo.evaluate.ValidationMonitor`) falls below the median of earlier trials at the same point.

The sweep directory (``--out``) holds:

* ``sweep.json``: what the sweep is (spec, space, metric, storage) and every trial's state, score and settings;
* ``study.log``: the Optuna study as a journal file, unless ``--storage`` names another storage (an RDB URL such as
  ``postgresql://...`` lets several machines join one sweep, each with its own ``--out``);
* ``trials/NNNN/``: each trial's run directory (``spec.yaml``, ``metrics.json`` on the validation rows, ...);
* ``best.yaml``: the spec with the best trial's settings, ``data.validation_fraction`` set back to 0, ready to train
  on all training rows and evaluate on the test split, with a note for each setting at an edge of its range
  (:meth:`SearchSpace.edges`: the range may have cut the search short);
* ``trials.png``: every trial's score and the best so far;
* ``.zoo-sweep``: the marker that tells a sweep's directory from a run's: ``zoo sweep`` refuses a directory that holds
  a run (or lies inside one), and ``zoo train`` one that is (or lies inside) a sweep's.

A trial that diverges (or ends in a predictive its metrics refuse), or whose settings are refused while it fits (a
:class:`ZooInputError` from the spec or the fit), is a failed trial with its reason, and the sweep goes on. The sweep
says how many trials completed, were pruned and failed, and warns when the best trial is the only survivor of many
failures (its settings were then not chosen by a search). With a shared ``--storage`` the best is taken over every
complete trial of the study, and the sweep says when trials of other processes were still running as it wrote
``best.yaml``.

A sweep that is stopped (Ctrl-C, SIGTERM, a killed process) continues where it stopped when the same command runs
again (``zoo sweep`` has no ``--resume``): the interrupted trials run again with their settings, and the study goes on
to ``--trials`` finished ones. A study file that is missing, cut off or corrupt is refused, naming the file and what
to do, before anything is written.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import multiprocessing
import os
import re
import signal
import socket
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from zoo.errors import TrainingDiverged, ZooInputError, ZooWarning
from zoo.exits import exit_code
from zoo.interrupts import Interrupted, signal_of, sigterm_interrupts
from zoo.report import REPORT_MARK
from zoo.runs import (
    CHECKPOINT_FILE,
    LOCK_FILE,
    LOG_FILE,
    MARKER_FILE,
    METRICS_FILE,
    SPEC_FILE,
    SWEEP_MARKER,
    available_memory,
    check_writable_directory,
    locked_directory,
    write_json,
    write_text,
)
from zoo.spec import RunSpec, find_config, load_spec, set_path, spec_to_yaml, spec_tree
from zoo.tasks import task_of

SWEEP_FILE = "sweep.json"
STUDY_FILE = "study.log"
BEST_SPEC_FILE = "best.yaml"
TRIALS_DIR = "trials"
HISTORY_PLOT = "trials.png"
REPORTS_PER_TRIAL = 10  # intermediate validation scores per fit, what the pruner compares
PRUNER_STARTUP_TRIALS = 5  # finished trials before any is pruned
PRUNER_WARMUP_REPORTS = 3  # no trial is pruned on its first 3 scores (early validation scores are noisy)
# A best value in the outer 5% of its range (log-scaled where the range is) sits at the range's edge: the search was
# cut off there, and a better setting may lie beyond it.
EDGE_SHARE = 0.05
# Spec keys a sweep holds fixed: the data (its validation rows are what every trial is scored on) and the seed.
FIXED_KEYS = ("data", "seed")
# The least memory a spawned worker takes (a Python process with torch, Pyro and Optuna imported): with the sweep
# process's own resident memory, what caps --workers by the memory available.
WORKER_MEMORY_FLOOR = 256 * 2**20
# An inner point of a float range that no spec value is likely to sit at (the golden section): a probe that finds a
# key taking only whole numbers (a range written 10.0 .. 60.0 on inference.num_steps) before a trial does.
INNER_PROBE = 0.381966


# ------------------------------------------------------------------------------------------------ the space
class Dimension(BaseModel):
    """One swept spec key: a range (``low``, ``high``, optional ``log`` scale or ``step``) or a list of ``choices``.

    A range whose ends (and step) are integers is searched over integers. Choices may be whole spec sections (e.g.
    priors), not only numbers and names.

    :ivar low: the range's lower end.
    :ivar high: the range's upper end, above ``low``.
    :ivar log: search the range on a log scale (``low`` > 0, no ``step``).
    :ivar step: the spacing of the values searched, in ``(0, high - low]``; None for a continuous range.
    :ivar choices: the values to choose from, instead of a range.
    """

    model_config = ConfigDict(extra="forbid")
    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    step: int | float | None = None
    choices: list[Any] | None = None

    @model_validator(mode="after")
    def _one_form(self) -> Dimension:
        ranged = self.low is not None or self.high is not None
        if self.choices is not None:
            if ranged or self.log or self.step is not None:
                raise ValueError("give either choices or a range (low, high, log, step), not both")
            if not self.choices:
                raise ValueError("choices is empty; list at least one value")
            return self
        if self.low is None or self.high is None:
            raise ValueError("a range needs both low and high (or give choices: [...])")
        for name, value in (("low", self.low), ("high", self.high), ("step", self.step)):
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name} is {value}; the ends and step of a range are finite numbers")
        if not math.isfinite(float(self.high) - float(self.low)):
            raise ValueError(f"the range from {self.low} to {self.high} is wider than a float holds; narrow it")
        if not self.low < self.high:
            raise ValueError(f"the range is empty or inverted (low {self.low} >= high {self.high}); use low < high")
        if self.log and self.low <= 0:
            raise ValueError(f"a log-scale range needs low > 0 (got {self.low})")
        if self.log and self.step is not None:
            raise ValueError("a log-scale range takes no step")
        if self.step is not None and not 0 < self.step <= self.high - self.low:
            raise ValueError(f"step must lie in (0, high - low] = (0, {self.high - self.low}]")
        return self

    @property
    def integer(self) -> bool:
        """Whether the range is searched over integers (its ends and step are all integers)."""
        ends = [v for v in (self.low, self.high, self.step) if v is not None]
        return self.choices is None and all(isinstance(v, int) and not isinstance(v, bool) for v in ends)

    def probes(self) -> list[Any]:
        """The values every trial's spec must accept: both ends of a range, every choice.

        :returns: the values.
        """
        return list(self.choices) if self.choices is not None else [self.low, self.high]

    def inner_probe(self) -> float | None:
        """A value inside a float range (on its step grid, if any) that is not a whole number where the range allows
        one, for the spec to accept before any trial draws such a value; None for choices and integer ranges.

        :returns: the value, or None.
        """
        if self.choices is not None or self.integer:
            return None
        low, high = float(self.low), float(self.high)
        if self.log:
            value = math.exp(math.log(low) + INNER_PROBE * (math.log(high) - math.log(low)))
        else:
            value = low + INNER_PROBE * (high - low)
        if self.step is not None:
            value = low + round((value - low) / self.step) * self.step
        return value

    def edge(self, value: Any) -> str | None:
        """``"low"`` or ``"high"`` when ``value`` lies in the outer :data:`EDGE_SHARE` of the range at that end (on
        the log scale for a log range), else None; choices have no edge.

        :param value: a value of the dimension.
        :returns: ``"low"``, ``"high"`` or None.
        """
        if self.choices is not None or not isinstance(value, int | float) or isinstance(value, bool):
            return None
        scale = math.log if self.log else float
        low, high, at = scale(self.low), scale(self.high), scale(value)
        share = (at - low) / (high - low)
        return "low" if share <= EDGE_SHARE else "high" if share >= 1 - EDGE_SHARE else None

    def suggest(self, trial, key: str) -> Any:
        """The trial's value for ``key`` (choices that are sections travel through Optuna as one-line YAML).

        :param trial: the Optuna trial.
        :param key: the dotted spec key, the parameter's name in the study.
        :returns: the value suggested (a section choice read back from its YAML).
        """
        if self.choices is not None:
            if all(_primitive(c) for c in self.choices):
                return trial.suggest_categorical(key, self.choices)
            return yaml.safe_load(trial.suggest_categorical(key, [_one_line(c) for c in self.choices]))
        if self.integer:
            return trial.suggest_int(key, self.low, self.high, step=self.step or 1, log=self.log)
        return trial.suggest_float(key, float(self.low), float(self.high), step=self.step, log=self.log)


def _primitive(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def _one_line(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False).strip()


@dataclass(frozen=True)
class SearchSpace:
    """The swept spec keys (dotted, as ``--set`` writes them) and their dimensions, in file order.

    :param dimensions: each swept key's range or choices.
    """

    dimensions: dict[str, Dimension]

    def suggest(self, trial) -> dict[str, Any]:
        """One value per key for an Optuna trial.

        :param trial: the Optuna trial.
        :returns: the trial's settings by spec key.
        """
        return {key: dim.suggest(trial, key) for key, dim in self.dimensions.items()}

    def as_dict(self) -> dict[str, Any]:
        """The space as its YAML file gives it (what ``sweep.json`` records).

        :returns: each key's dimension as a mapping, defaults left out.
        """
        return {k: d.model_dump(exclude_defaults=True) for k, d in self.dimensions.items()}

    def edges(self, params: dict[str, Any]) -> dict[str, str]:
        """The keys whose value in ``params`` sits at an edge of its range, each with a sentence saying which and
        what to do (a sweep's best trial at an edge means the range cut the search short).

        :param params: settings by spec key, e.g. the best trial's.
        :returns: the sentence by key, for the keys at an edge only.
        """
        found = {}
        for key, value in params.items():
            dim = self.dimensions.get(key)
            side = dim.edge(value) if dim is not None else None
            if side is not None:
                found[key] = (f"the best {key} ({_format_param(value)}) is at the {side} end of its range "
                              f"[{_format_param(dim.low)}, {_format_param(dim.high)}]; a better value may lie beyond "
                              f"it: {'lower low' if side == 'low' else 'raise high'} in the space file and sweep again")
        return found


def load_space(source: str | Path | dict) -> SearchSpace:
    """Read and check a space file: a mapping of dotted spec keys to a range or choices (a bare list is choices).

    :param source: a YAML file, or the mapping itself.
    :returns: the search space.
    :raises ZooInputError: when the file is missing or not UTF-8 YAML, the space is empty or not a mapping, a key
        is under ``data`` or ``seed`` (held fixed), or an entry is not a valid range or list of choices.
    """
    if isinstance(source, dict):
        tree, where = source, "space"
    else:
        path = find_config(source)  # a file, or a shipped space (configs/spaces/<name>.yaml) from any folder
        if path is None:
            raise ZooInputError("--space", str(source), "no such file; pass a YAML file of spec keys and their ranges "
                                "(the shipped ones: configs/spaces/<config>.yaml)")
        try:
            tree = yaml.safe_load(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:
            raise ZooInputError("--space", str(path), f"is not UTF-8 text (byte {exc.start} is "
                                f"{exc.object[exc.start]:#x}); save it as UTF-8 and run the command again") from None
        except yaml.YAMLError as exc:
            raise ZooInputError("--space", str(path), f"is not valid YAML: {exc}") from None
        where = str(path)
    if not isinstance(tree, dict) or not tree:
        raise ZooInputError("--space", where, "give a mapping of spec keys to ranges, e.g. "
                            "'inference.lr: {low: 1.0e-4, high: 1.0e-1, log: true}'")
    dimensions = {}
    for key, entry in tree.items():
        key = str(key)
        if key.split(".")[0] in FIXED_KEYS:
            raise ZooInputError(f"space: {key}", entry, "a sweep holds the data and the seed fixed (every trial is "
                                "scored on the same validation rows); sweep another key")
        if isinstance(entry, list):
            entry = {"choices": entry}
        if not isinstance(entry, dict):
            raise ZooInputError(f"space: {key}", entry, "give {low: .., high: ..} (with log: true or step: ..) or "
                                "{choices: [..]}")
        try:
            dimensions[key] = Dimension.model_validate(entry)
        except ValidationError as exc:
            reasons = "; ".join(_reason(e) for e in exc.errors())
            raise ZooInputError(f"space: {key}", entry, reasons) from None
    return SearchSpace(dimensions)


def _reason(error: dict) -> str:
    where = ".".join(str(p) for p in error.get("loc", ()))
    message = str(error.get("msg", "")).removeprefix("Value error, ")
    if error.get("type") == "extra_forbidden":
        message = "unknown setting (use low, high, log, step or choices)"
    return f"{where}: {message}" if where else message


def check_space(space: SearchSpace, tree: dict) -> None:
    """Refuse a key that is not a spec field, or a range end / choice the spec (``tree``, as written) does not
    accept, naming it; and a float range whose inner values it refuses (float ends on a key that takes integers),
    which would otherwise stop the sweep at its first trial.

    :param space: the search space.
    :param tree: the spec as written (:func:`zoo.spec.spec_tree`).
    :raises ZooInputError: naming the key and the value the spec refuses.
    """
    for key, dim in space.dimensions.items():
        for value in dim.probes():
            try:
                trial_spec(tree, {key: value})
            except ZooInputError as err:
                raise ZooInputError(f"space: {key}", value, f"the spec refuses this value: {err}") from None
        inner = dim.inner_probe()
        if inner is None:
            continue
        try:
            trial_spec(tree, {key: inner})
        except ZooInputError as err:
            whole = all(float(v).is_integer() for v in (dim.low, dim.high, dim.step) if v is not None)
            hint = (f"the key takes whole numbers: write the ends as integers (low: {int(dim.low)}, high: "
                    f"{int(dim.high)}, no decimal point) so that the range is searched over integers" if whole else
                    f"the spec accepts both ends but refuses {inner:.6g} inside the range ({err}); narrow the range "
                    "or give choices")
            raise ZooInputError(f"space: {key}", dim.model_dump(exclude_defaults=True), hint) from None


def trial_spec(tree: dict, params: dict[str, Any]) -> RunSpec:
    """The spec ``tree`` (as written) with a trial's settings applied as ``--set`` would apply them, validated.

    :param tree: the spec as written (left unchanged).
    :param params: the trial's settings by dotted spec key.
    :returns: the trial's spec.
    :raises ZooInputError: when the spec refuses the settings.
    """
    tree = copy.deepcopy(tree)
    for key, value in params.items():
        set_path(tree, key, value)
    return load_spec(tree)


# ------------------------------------------------------------------------------------------------ the study
def choose_metric(metric: str | None, task: str) -> tuple[str, str]:
    """The metric a sweep optimises (default: test_ll for regression, nll for classification) and its direction.

    :param metric: the metric asked for; None for the task's default.
    :param task: the data's task, ``regression`` or ``classification``.
    :returns: ``(metric, direction)``, the direction ``"maximize"`` or ``"minimize"``.
    :raises ZooInputError: when the task's sweeps cannot optimise the metric.
    """
    allowed = task_of(task).metrics  # which way is better for each; the first is the default
    name = metric or next(iter(allowed))
    if name not in allowed:
        raise ZooInputError("--metric", name, f"a {task} sweep optimises one of: {', '.join(allowed)}")
    return name, allowed[name]


def open_storage(url: str | None, out: Path):
    """The study's storage: a journal file in ``out`` by default; a path (a journal file elsewhere) or an Optuna
    RDB URL (``sqlite:///...``, ``postgresql://...``, ``mysql://...``) that several machines can share.

    :param url: the storage asked for (``--storage``); None for ``out/study.log``.
    :param out: the sweep directory.
    :returns: the Optuna storage (a journal storage, or an RDB storage whose stale trials are failed and retried
        once).
    :raises ZooInputError: when the storage cannot be opened, or the journal file is cut off or corrupt.
    """
    import optuna
    from optuna.storages.journal import JournalFileBackend

    target = str(out / STUDY_FILE) if url is None else url
    try:
        if "://" in target:  # a trial whose process stops beating for 3 minutes is failed and queued again
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1)
                return optuna.storages.RDBStorage(target, heartbeat_interval=60, grace_period=180,
                                                  heartbeat_stale_trial_callback=retry)
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        check_journal(Path(target))
        return optuna.storages.JournalStorage(JournalFileBackend(target))
    except ZooInputError:
        raise
    except Exception as exc:  # a driver that is not installed, a server that does not answer, a bad path
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ZooInputError("--storage", target, f"cannot be opened: {detail}") from None


def shown_storage(url: str) -> str:
    """A storage URL as best.yaml and the messages show it: a password in it replaced by ``***``.

    :param url: the storage URL or path.
    :returns: the URL to show.
    """
    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", url)


def check_journal(path: Path) -> None:
    """Refuse a journal file (``study.log``) that a crash cut off or that holds a line that is no journal record,
    naming the file, the line and what to do. Optuna reads past a cut-off last record but its next write joins that
    record into a corrupt line, so the check comes before any write; it holds the journal's own lock, so that a write
    another process has under way is not taken for a cut-off one.

    :param path: the journal file; a missing or empty one passes.
    :raises ZooInputError: when the file ends in a cut-off record or holds a line that is no journal record.
    """
    from optuna.storages.journal import JournalFileSymlinkLock

    if not path.is_file() or path.stat().st_size == 0:
        return
    lock = JournalFileSymlinkLock(str(path))
    lock.acquire()
    try:
        data = path.read_bytes()
    finally:
        lock.release()
    again = "run the same command again (zoo sweep has no --resume: the same command continues a sweep)"
    kept = 0
    for number, line in enumerate(data.splitlines(keepends=True), start=1):
        if not line.endswith(b"\n"):
            raise ZooInputError(str(path), "cut off", "", message=f"{path} ends in a cut-off record (line {number}, "
                                f"{len(line)} bytes with no line end: a crash or a full disk stopped a write); the "
                                f"{number - 1} records before it are whole. Keep a copy, drop the cut-off record "
                                f"with: truncate -s {kept} {path}; then {again}")
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not (isinstance(record, dict) and "op_code" in record):
            raise ZooInputError(str(path), "corrupt", "", message=f"{path} is corrupt: line {number} is not an "
                                "Optuna journal record. Restore the file from a backup and " + again + ", or start "
                                "a new sweep with a new --out")
        kept += len(line)


@dataclass
class Tally:
    """How many of a study's trials are finished (complete, pruned, or failed for a reason of their own) and
    running.

    :param finished: the finished trials.
    :param running: the running trials.
    """

    finished: int = 0
    running: int = 0


def tally(study) -> Tally:
    """Count a study's trials; a trial that failed because it was interrupted is not finished (it runs again).

    :param study: the Optuna study.
    :returns: the finished and running trials.
    """
    from optuna.trial import TrialState

    out = Tally()
    for t in study.get_trials(deepcopy=False):
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED) or (t.state == TrialState.FAIL
                                                                     and "failure" in t.user_attrs):
            out.finished += 1
        elif t.state == TrialState.RUNNING:
            out.running += 1
    return out


STATES = ("complete", "pruned", "failed", "interrupted", "running", "waiting")


def state_counts(study) -> dict[str, int]:
    """How many of a study's trials are in each of :data:`STATES`: a failed trial failed for a reason of its own
    (diverged, or refused while it fit); an interrupted one was stopped and runs again.

    :param study: the Optuna study.
    :returns: the count by state, every state present.
    """
    out = dict.fromkeys(STATES, 0)
    for t in study.get_trials(deepcopy=False):
        state = t.state.name.lower()
        if state == "fail":
            state = "failed" if "failure" in t.user_attrs else "interrupted"
        out[state] = out.get(state, 0) + 1
    return out


FAILURE_KINDS = {"TrainingDiverged": "diverged", "ZooInputError": "refused while fitting",
                 "ValueError": "ended in an invalid predictive"}


def failure_kinds(study) -> dict[str, int]:
    """The failed trials by why they failed (``diverged``, ``refused while fitting``), most common first.

    :param study: the Optuna study.
    :returns: the count by reason.
    """
    kinds = Counter(FAILURE_KINDS.get(t.user_attrs["failure"].split(":", 1)[0], "failed")
                    for t in study.get_trials(deepcopy=False) if "failure" in t.user_attrs)
    return dict(kinds.most_common())


def outcome_line(counts: dict[str, int], kinds: dict[str, int]) -> str:
    """One line on how a sweep's trials ended: ``20 trials: 1 complete, 0 pruned, 19 failed (19 diverged)``.

    :param counts: the trials by state (:func:`state_counts`).
    :param kinds: the failed trials by reason (:func:`failure_kinds`).
    :returns: the line.
    """
    total = sum(counts.values())
    line = (f"{total} trial(s): {counts['complete']} complete, {counts['pruned']} pruned, {counts['failed']} failed"
            + (f" ({', '.join(f'{n} {kind}' for kind, n in kinds.items())})" if kinds else ""))
    extra = [f"{counts[s]} {s}" for s in ("interrupted", "running", "waiting") if counts[s]]
    return line + (f", {', '.join(extra)}" if extra else "")


def survival_note(counts: dict[str, int], kinds: dict[str, int], best: TrialRow | None, out: str | Path) -> str | None:
    """A warning when the best trial was not chosen by a search: it is the only complete one among failures, or
    failed trials are half or more of the finished ones; None otherwise.

    :param counts: the trials by state (:func:`state_counts`).
    :param kinds: the failed trials by reason (:func:`failure_kinds`).
    :param best: the best trial, or None.
    :param out: the sweep directory, named in the advice.
    :returns: the warning, or None.
    """
    if best is None or not counts["failed"]:
        return None
    finished = counts["complete"] + counts["pruned"] + counts["failed"]
    failed = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
    see = (f"See each failure's reason in the trials table (zoo report {out} --out trials.md), move the space away "
           "from the failing settings and sweep again")
    if counts["complete"] == 1:
        return (f"the best trial ({best.number}) is the only one of {finished} finished trials that completed "
                f"({failed}, {counts['pruned']} pruned): best.yaml holds the one setting that survived, not the best "
                f"of a search. {see}")
    if 2 * counts["failed"] >= finished:
        return (f"{counts['failed']} of {finished} finished trials failed ({failed}): the best was chosen among only "
                f"{counts['complete']} complete trial(s). {see}")
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def requeue_interrupted(study, out: Path, own_storage: bool = False) -> list[int]:
    """Fail this sweep directory's trials whose process is gone (killed) and queue every interrupted trial's settings
    once more; returns the numbers requeued. Holding ``out``'s lock, no live sweep of this host writes it.

    With ``own_storage`` (the study.log inside ``out``) every trial of this host is this directory's, under whatever
    path it was run (a sweep directory that was moved or copied).

    :param study: the Optuna study.
    :param out: the sweep directory.
    :param own_storage: whether the study lives in ``out``'s own study.log.
    :returns: the numbers of the trials requeued.
    """
    from optuna.trial import TrialState

    here, mine = socket.gethostname(), str(out.resolve())
    retried = {t.user_attrs.get("retry_of") for t in study.get_trials(deepcopy=False)}
    requeued = []
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("host") != here or (not own_storage and t.user_attrs.get("out") != mine):
            continue
        if t.state == TrialState.RUNNING and not _pid_alive(int(t.user_attrs.get("pid", -1))):
            study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        elif not (t.state == TrialState.FAIL and "failure" not in t.user_attrs):
            continue
        if t.number not in retried:
            study.enqueue_trial(t.params, user_attrs={"retry_of": t.number}, skip_if_exists=False)
            requeued.append(t.number)
    return requeued


# ------------------------------------------------------------------------------------------------ one trial
@dataclass
class SweepSetup:
    """What every worker of a sweep needs: picklable, so that spawned processes receive it whole.

    :param spec_yaml: the spec as written, with the user's overrides: where the trials' settings go.
    :param space: the search space as :meth:`SearchSpace.as_dict` gives it.
    :param metric: the validation metric optimised.
    :param direction: ``"maximize"`` or ``"minimize"``.
    :param out: the sweep directory.
    :param storage: the study's storage URL or path; None for ``out/study.log``.
    :param study_name: the study's name in the storage.
    :param n_trials: the finished trials the study is run to.
    :param seed: the spec's seed, which seeds each worker's sampler.
    :param threads: torch threads per worker (see :func:`choose_threads`); None to leave them.
    :param workers: how many worker processes run trials.
    :param startup_trials: random trials before the TPE sampler takes over.
    :param repeat: a spec key and its values: each trial fits once per value; None for one fit.
    """

    spec_yaml: str  # the spec as written, with the user's overrides: where the trials' settings go
    space: dict[str, Any]
    metric: str
    direction: str
    out: str
    storage: str | None
    study_name: str
    n_trials: int
    seed: int
    threads: int | None = None  # torch threads per worker (see choose_threads)
    workers: int = 1
    startup_trials: int = 10
    repeat: tuple[str, list[Any]] | None = None  # a spec key and its values: each trial fits once per value

    def repeat_values(self) -> list[dict[str, Any]]:
        """The extra settings of each of a trial's fits (one empty set without a repeat).

        :returns: one mapping of spec key to value per fit.
        """
        return [{}] if self.repeat is None else [{self.repeat[0]: v} for v in self.repeat[1]]

    @property
    def tree(self) -> dict:
        """The spec as written (see :func:`zoo.spec.spec_tree`)."""
        return yaml.safe_load(self.spec_yaml)


def _objective(setup: SweepSetup, tree: dict, space: SearchSpace) -> Callable:
    """The function Optuna calls per trial: train the trial's spec, return its validation score."""
    import optuna

    from zoo.evaluate import ValidationMonitor
    from zoo.pipeline import train

    repeats = setup.repeat_values()

    def objective(trial: optuna.Trial) -> float:
        params = space.suggest(trial)
        run_dir = Path(setup.out) / TRIALS_DIR / f"{trial.number:04d}"
        for key, value in {"out": str(Path(setup.out).resolve()), "host": socket.gethostname(), "pid": os.getpid(),
                           "run_dir": str(run_dir)}.items():
            trial.set_user_attr(key, value)
        started, scores = time.perf_counter(), []
        for r, extra in enumerate(repeats):  # one fit, or one per repeated value; the score is their mean

            def on_score(k: int, value: float, r: int = r) -> None:
                at = r * REPORTS_PER_TRIAL + k  # later repeats report after the earlier ones' scores
                trial.report((sum(scores) + value) / (len(scores) + 1), at)
                if trial.should_prune():
                    raise optuna.TrialPruned(f"{setup.metric} {value:.4g} after {at}/"
                                             f"{REPORTS_PER_TRIAL * len(repeats)} of its fits")

            try:
                settings = trial_spec(tree, {**params, **extra})
                monitor = ValidationMonitor(setup.metric, on_score, settings.inference.predictive_samples,
                                            settings.seed, REPORTS_PER_TRIAL)
                where = run_dir if len(repeats) == 1 else run_dir / f"repeat{r}"
                summary = train(settings, where, progress=False, echo=None, monitor=monitor)
            except KeyboardInterrupt:
                trial.set_user_attr("interrupted", True)
                raise
            except (TrainingDiverged, ZooInputError) as err:  # these settings cannot be fitted: a finished failure
                trial.set_user_attr("failure", f"{type(err).__name__}: {err}")  # (run_worker goes on to the next)
                raise
            except ValueError as err:  # a degenerate fit the trainer did not flag (a predictive scale of 0, NaN
                # parameters), which torch.distributions or the metrics refuse: these settings failed too
                trial.set_user_attr("failure", f"ValueError: {err}")
                raise TrainingDiverged(f"the fit ended in values its predictive refuses: {err}") from err
            finally:
                trial.set_user_attr("seconds", round(time.perf_counter() - started, 3))
            value = float(summary.metrics[setup.metric])
            if not math.isfinite(value):
                trial.set_user_attr("failure", f"TrainingDiverged: validation {setup.metric} is {value}")
                raise TrainingDiverged(f"validation {setup.metric} is {value}")
            scores.append(value)
        trial.set_user_attr("metrics", summary.metrics if len(repeats) == 1 else {setup.metric: scores})
        return sum(scores) / len(scores)

    return objective


def run_worker(setup: SweepSetup, index: int = 0, parent: int | None = None,
               after_trial: Callable[[], None] | None = None) -> None:
    """Run trials of the study until ``n_trials`` are finished or running (one trial at a time); ``after_trial``
    is called after each.

    :param setup: the sweep's setup.
    :param index: the worker's number, which seeds its sampler with the trials already in the study.
    :param parent: the sweep process's pid: the worker stops after its trial once that is no longer its parent;
        None to run in the sweep process itself.
    :param after_trial: called after each trial (e.g. to update a progress bar); None for nothing.
    """
    import optuna
    import torch

    if setup.threads is not None:
        torch.set_num_threads(setup.threads)
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # the sweep's table reports failed and pruned trials
    storage = open_storage(setup.storage, Path(setup.out))
    # seeded by the worker and by the trials already there, so that a continued sweep does not replay its draws
    started_with = len(optuna.load_study(study_name=setup.study_name, storage=storage).trials)
    study = optuna.load_study(study_name=setup.study_name, storage=storage,
                              sampler=optuna.samplers.TPESampler(seed=setup.seed + 1000 * index + started_with,
                                                                 n_startup_trials=setup.startup_trials),
                              pruner=optuna.pruners.MedianPruner(n_startup_trials=PRUNER_STARTUP_TRIALS,
                                                                 n_warmup_steps=PRUNER_WARMUP_REPORTS))
    objective = _objective(setup, setup.tree, load_space(setup.space))
    while parent is None or os.getppid() == parent:  # a worker whose sweep process died stops after its trial
        count = tally(study)
        if count.finished + count.running >= setup.n_trials:
            return
        # a trial that diverged or whose settings were refused while it fit is a failed trial: the sweep goes on
        study.optimize(objective, n_trials=1, catch=(TrainingDiverged, ZooInputError), gc_after_trial=False,
                       callbacks=[lambda *_: after_trial()] if after_trial is not None else None)


def _end_with_parent() -> None:
    """On Linux, ask the kernel for SIGTERM when the sweep process dies (even by SIGKILL), so that a worker stops at
    its next step instead of finishing its trial; elsewhere a worker stops after its trial (see run_worker)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _worker_main(setup: SweepSetup, index: int, parent: int) -> None:
    """A spawned worker: its own session (the sweep process forwards Ctrl-C and SIGTERM to it once), its exit code
    as ``zoo`` would give it."""

    os.setsid()
    _end_with_parent()
    with sigterm_interrupts():
        code = exit_code(lambda: run_worker(setup, index, parent))
    sys.exit(code)


# ------------------------------------------------------------------------------------------------ the sweep
@dataclass
class TrialRow:
    """One trial as the report shows it.

    :param number: the trial's number in the study.
    :param state: its state, e.g. ``complete``, ``pruned``, ``fail`` or ``running``.
    :param value: its validation score (a pruned trial's last intermediate one), or None.
    :param params: its settings by spec key.
    :param seconds: how long its fits took, where recorded.
    :param note: why it failed, was interrupted or pruned, and which trial it reruns.
    """

    number: int
    state: str
    value: float | None
    params: dict[str, Any]
    seconds: float | None
    note: str = ""


@dataclass
class SweepResult:
    """A sweep's trials, its best one and where it wrote.

    :param out: the sweep directory.
    :param metric: the validation metric optimised.
    :param direction: ``"maximize"`` or ``"minimize"``.
    :param trials: every trial of the study.
    :param best: the best complete trial, or None.
    :param wall_seconds: the sweep's wall time, over every process that ran it.
    :param files: the files written, by kind (``sweep``, ``best``, ``plot``).
    :param edges: the best settings at an edge of their range, with advice (:meth:`SearchSpace.edges`).
    :param counts: the trials by state (:func:`state_counts`).
    :param caveats: what makes the best less than a search's best.
    """

    out: Path
    metric: str
    direction: str
    trials: list[TrialRow]
    best: TrialRow | None
    wall_seconds: float
    files: dict[str, Path] = field(default_factory=dict)
    edges: dict[str, str] = field(default_factory=dict)  # best settings at an edge of their range: SearchSpace.edges
    counts: dict[str, int] = field(default_factory=dict)  # trials by state: state_counts
    caveats: list[str] = field(default_factory=list)  # what makes the best less than a search's best: _caveats


def _trial_rows(study) -> list[TrialRow]:
    rows = []
    for t in study.get_trials(deepcopy=False):
        note = t.user_attrs.get("failure", "")
        if not note and t.user_attrs.get("interrupted"):
            note = "interrupted (runs again)"
        if "retry_of" in t.user_attrs:
            note = (note + "; " if note else "") + f"reruns trial {t.user_attrs['retry_of']}"
        value = t.value if t.value is not None else (t.intermediate_values[max(t.intermediate_values)]
                                                     if t.intermediate_values else None)
        if t.state.name == "PRUNED" and t.intermediate_values:
            note = (note + "; " if note else "") + f"pruned after {max(t.intermediate_values)}/{REPORTS_PER_TRIAL}"
        rows.append(TrialRow(t.number, t.state.name.lower(), value, dict(t.params), t.user_attrs.get("seconds"),
                             note))
    return rows


def _best(rows: list[TrialRow], direction: str) -> TrialRow | None:
    complete = [r for r in rows if r.state == "complete" and r.value is not None]
    if not complete:
        return None
    return (max if direction == "maximize" else min)(complete, key=lambda r: r.value)


def sweep(spec_source: str | Path | dict | RunSpec, space_source: str | Path | dict, n_trials: int, out: str | Path,
          overrides: list[str] | None = None, workers: int = 1, threads: int | None = None,
          storage: str | None = None, study_name: str | None = None, metric: str | None = None,
          repeat: tuple[str, list[Any]] | None = None, progress: bool = True,
          echo: Callable[[str], None] | None = print) -> SweepResult:
    """Search ``space`` for the settings of ``spec`` that score best on its validation rows, in ``n_trials`` finished
    trials; write the sweep directory (see the module docstring) and return its trials and best one.

    ``repeat = (key, values)`` fits every trial once per value of a spec key and scores the mean, e.g.
    ``("data.split", [0, 1, 2])``: three splits' validation rows instead of one (a steadier score on small data).

    ``workers`` processes run trials side by side (at most one per trial left to run, per core, and per share of
    the memory available: see :func:`cap_workers`), each with ``threads`` torch threads (default: the user's own
    setting, else the cores divided among the workers: see :func:`choose_threads`). Running again with the same
    arguments continues a stopped sweep.

    :param spec_source: the spec: a YAML file, a dict or a RunSpec; it must set ``data.validation_fraction``.
    :param space_source: the search space: a YAML file or a mapping (:func:`load_space`).
    :param n_trials: the finished trials to run the study to.
    :param out: the sweep directory.
    :param overrides: ``--set`` overrides of the spec (``key.path=value``).
    :param workers: processes running trials side by side.
    :param threads: torch threads per worker; None to choose them.
    :param storage: a shared study storage (a path or an RDB URL); None for ``out/study.log``.
    :param study_name: the study's name in the storage; None for ``zoo-sweep``.
    :param metric: the validation metric to optimise; None for the task's default (:func:`choose_metric`).
    :param repeat: a spec key and its values to fit every trial once per value; None for one fit per trial.
    :param progress: show a progress bar of finished trials.
    :param echo: prints the sweep's opening and closing lines; None for silence.
    :returns: the trials, the best one, the files written and the caveats.
    :raises ZooInputError: when an argument, the spec, the space, ``repeat`` or ``out`` is refused (e.g. no
        validation rows, a key the spec refuses, a directory holding a run), or a worker stops on bad input.
    :raises Interrupted: when the sweep is stopped (Ctrl-C, SIGTERM); the same command continues it.
    """
    from zoo.data import load_dataset

    if n_trials < 1:
        raise ZooInputError("--trials", n_trials, "run at least one trial")
    if workers < 1:
        raise ZooInputError("--workers", workers, "use 1 or more")
    if threads is not None and threads < 1:
        raise ZooInputError("--threads", threads, "use 1 or more")
    tree = spec_tree(spec_source, overrides)
    spec = load_spec(tree)
    if spec.data.validation_fraction <= 0:
        raise ZooInputError("data.validation_fraction", spec.data.validation_fraction,
                            "a sweep scores its trials on validation rows carved from the training rows, never on "
                            "the test rows: set it, e.g. --set data.validation_fraction=0.2")
    space = load_space(space_source)
    check_space(space, tree)
    if repeat is not None and repeat[0] in space.dimensions:
        raise ZooInputError("--repeat", repeat[0], "is also a key of the space; repeat a key the sweep does not search")
    for extra in ([{}] if repeat is None else _checked_repeat(repeat, tree)):
        variant = trial_spec(tree, extra)  # also checks the data and that the carve leaves rows to train on
        task = load_dataset(variant.data, variant.seed).task
    metric, direction = choose_metric(metric, task)
    with claimed_sweep_directory(Path(out)) as out:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.ERROR)
        name = study_name or "zoo-sweep"
        setup = SweepSetup(yaml.safe_dump(tree, sort_keys=False), space.as_dict(), metric, direction, str(out),
                           storage, name, n_trials, spec.seed, threads, startup_trials=max(1, min(10, n_trials // 2)),
                           repeat=None if repeat is None else (repeat[0], list(repeat[1])))
        study = _open_study(setup, out)
        _check_same_sweep(study, setup, out)
        requeued = requeue_interrupted(study, out, own_storage=storage is None)
        count = tally(study)
        cores = available_cores()
        setup.workers, capped = cap_workers(workers, n_trials - count.finished - count.running, cores,
                                            available_memory(), max(resident_memory(), WORKER_MEMORY_FLOOR))
        if capped:
            warnings.warn(capped, ZooWarning, stacklevel=2)
        setup.threads, source = choose_threads(threads, setup.workers, cores)
        if setup.workers > 1 and setup.workers * setup.threads > cores:
            warnings.warn(f"{setup.workers} workers x {setup.threads} threads ({source}) are more threads than the "
                          f"{cores} cores: the workers slow each other down; pass --threads "
                          f"{max(1, cores // setup.workers)}", ZooWarning, stacklevel=2)
        earlier = _earlier_wall_seconds(out)
        write_json(out / SWEEP_FILE, _sweep_record(setup, study, earlier))
        say = echo or (lambda _: None)
        say(f"sweep of {len(space.dimensions)} key(s) on {spec.data.name}'s validation rows "
            f"({spec.data.validation_fraction:g} of the training rows): {metric} ({direction}), "
            f"{n_trials} trials ({count.finished} finished), {setup.workers} worker(s) x {setup.threads} "
            f"thread(s) ({source})"
            + (f", each trial the mean of {len(setup.repeat[1])} fits ({setup.repeat[0]} = "
               f"{', '.join(map(str, setup.repeat[1]))})" if setup.repeat else "")
            + (f"; rerunning interrupted trial(s) {', '.join(map(str, requeued))}" if requeued else ""))
        started = time.perf_counter()
        try:
            with _progress_bar(study, n_trials, progress) as tick:
                if setup.workers == 1:
                    _run_here(setup, tick)
                else:
                    _run_workers(setup, setup.workers, tick)
        except KeyboardInterrupt as err:
            raise Interrupted(signal_of(err), f"the study is kept in {storage or out / STUDY_FILE}; run the same "
                              "command again to continue it") from None
        finally:  # one wall time, the one recorded: a resumed sweep reads back the figure this one reports
            wall = earlier + time.perf_counter() - started
            write_json(out / SWEEP_FILE, _sweep_record(setup, study, wall))
        result = _finish(setup, study, out, wall)
        say(f"sweep {out}: {outcome_line(result.counts, failure_kinds(study))}")
        for line in result.caveats:
            warnings.warn(line, ZooWarning, stacklevel=2)
        return result


# ------------------------------------------------------------------------------------------------ its directory
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


def _open_study(setup: SweepSetup, out: Path):
    """The sweep's study, created on a first run; refused (naming the study file and what to do) when ``out`` holds
    trials that the study does not: a study file that was lost, replaced or cut short, or another study."""
    import optuna

    where = setup.storage or str(out / STUDY_FILE)
    ran, recorded = _recorded_trials(out, where, setup.study_name)
    dirs = _trial_directories(out)
    again = ("zoo sweep has no --resume: a stopped sweep continues when the same command runs again with its "
             "study")
    elsewhere = f" (its {SWEEP_FILE} names {recorded})" if recorded else ""
    restore = (f"restore {where} from a backup" + (" (or pass the --storage and --study that sweep.json names)"
                                                   if recorded else ""))
    lost = (f"{out} holds an earlier sweep ({max(ran, len(dirs))} trial(s) in {SWEEP_FILE} and {TRIALS_DIR}/) but "
            f"{where} holds no study '{setup.study_name}'{elsewhere}: its study file is lost or was replaced, so the "
            f"sweep cannot continue. {again}: {restore} and run the same command again, or start a new sweep with a "
            "new --out")
    if setup.storage is None and (ran or dirs) and not (out / STUDY_FILE).is_file():
        raise ZooInputError(str(out / STUDY_FILE), "missing", "", message=lost)
    storage = open_storage(setup.storage, out)
    try:
        study = optuna.load_study(study_name=setup.study_name, storage=storage)
    except KeyError:
        if ran or dirs:
            raise ZooInputError(where, "no such study", "", message=lost) from None
        return optuna.create_study(storage=storage, study_name=setup.study_name, direction=setup.direction)
    known = {t.number for t in study.get_trials(deepcopy=False)}
    orphans = [n for n in dirs if n not in known]
    if orphans:
        shown = ", ".join(f"{n:04d}" for n in orphans[:5]) + (", ..." if len(orphans) > 5 else "")
        raise ZooInputError(where, "trials missing", "", message=f"{out / TRIALS_DIR} holds the runs of trial(s) "
                            f"{shown}, which study '{setup.study_name}' in {where} does not record: the study file "
                            f"lost them (cut short or replaced){elsewhere}, and new trials would be written over "
                            f"them. {again}: {restore} and run the same command again; or move those runs aside "
                            f"(e.g. mv {out / TRIALS_DIR / f'{orphans[0]:04d}'} "
                            f"{out / TRIALS_DIR / f'{orphans[0]:04d}.lost'}) and run it again, to go on from the "
                            "trials the study holds; or start a new sweep with a new --out")
    return study


# ------------------------------------------------------------------------------------------------ workers and threads
def available_cores() -> int:
    """The CPU cores this process may run on (its affinity where the OS tells it, else every core).

    :returns: the number of cores, at least 1.
    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def resident_memory() -> int:
    """Bytes of memory this process holds now (a spawned worker, which imports the same and loads the same data,
    takes about as much).

    :returns: the bytes (the peak so far where the current figure is unknown).
    """
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def cap_workers(asked: int, left: int, cores: int, memory: int | None, per_worker: int) -> tuple[int, str | None]:
    """The workers to start for ``--workers asked``: no more than the trials ``left`` to run, the ``cores``, and the
    workers of ``per_worker`` bytes that the ``memory`` available holds (unknown memory caps nothing); with a
    sentence saying why when that is fewer than asked.

    :param asked: the workers asked for.
    :param left: the trials left to run.
    :param cores: the cores available.
    :param memory: the bytes of memory available, or None when unknown.
    :param per_worker: the bytes one worker takes.
    :returns: ``(workers, why)``, ``why`` None when all asked for start.
    """
    limits = {"trials": max(1, left), "cores": max(1, cores)}
    if memory is not None:
        limits["memory"] = max(1, memory // max(1, per_worker))
    used = min(asked, *limits.values())
    if used == asked:
        return asked, None
    gib = 2**30
    why = {"trials": (f"only {left} trial(s) are left to run" if left > 0 else "no trial is left to run"),
           "cores": f"this machine gives the sweep {cores} core(s)",
           "memory": (f"{(memory or 0) / gib:.1f} GiB of memory is available and each worker takes about "
                      f"{per_worker / gib:.1f} GiB")}
    reasons = [why[k] for k, n in limits.items() if n < asked]
    return used, f"--workers {asked}: starting {used} worker(s), as " + "; ".join(reasons)


def choose_threads(threads: int | None, workers: int, cores: int) -> tuple[int, str]:
    """Torch threads per worker, and where that number comes from.

    ``--threads`` when given; else the user's own setting, kept as it is: ``OMP_NUM_THREADS`` (or
    ``MKL_NUM_THREADS``), or this process's torch threads (``torch.set_num_threads``, else torch's default) when
    they are no more than each worker's share of the cores; else that share (``cores // workers``).

    :param threads: ``--threads``, or None.
    :param workers: the workers started.
    :param cores: the cores available.
    :returns: ``(threads, source)``, ``source`` saying where the number comes from.
    :raises ZooInputError: when ``threads`` is below 1.
    """
    import torch

    if threads is not None:
        if threads < 1:
            raise ZooInputError("--threads", threads, "use 1 or more")
        return threads, "--threads"
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        value = os.environ.get(var, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value), f"{var}={value}"
    own = torch.get_num_threads()
    share = max(1, cores // workers)
    if workers == 1 or own <= share:
        return own, "this process's torch threads"
    return share, f"{cores} cores / {workers} workers"


def _earlier_wall_seconds(out: Path) -> float:
    """The wall seconds a continued sweep already spent, from its sweep.json (0 for a new sweep): a sweep's time
    counts every process that ran it, not only the last."""
    try:
        return float(json.loads((out / SWEEP_FILE).read_text()).get("wall_seconds") or 0.0)
    except (OSError, ValueError, TypeError, AttributeError):
        return 0.0


def _checked_repeat(repeat: tuple[str, list[Any]], tree: dict) -> list[dict[str, Any]]:
    """Each repeated value as a trial's extra setting, refused (naming it) unless the spec accepts it."""
    key, values = repeat
    if not values or len(set(map(_one_line, values))) != len(values):
        raise ZooInputError("--repeat", f"{key}={values}", "give two or more distinct values, e.g. data.split=0,1,2")
    for value in values:
        try:
            trial_spec(tree, {key: value})
        except ZooInputError as err:
            raise ZooInputError("--repeat", f"{key}={value}", f"the spec refuses this value: {err}") from None
    return [{key: v} for v in values]


def _check_same_sweep(study, setup: SweepSetup, out: Path) -> None:
    """The first sweep process records what the study is; a later one (a resume, another machine) must agree."""
    identity = {"spec": setup.spec_yaml, "space": setup.space, "metric": setup.metric,
                "repeat": None if setup.repeat is None else [setup.repeat[0], setup.repeat[1]]}
    recorded = study.user_attrs.get("zoo_sweep")
    if recorded is None:
        study.set_user_attr("zoo_sweep", identity)
        return
    for what in ("spec", "space", "metric", "repeat"):
        if recorded.get(what) != identity[what]:
            raise ZooInputError("--out" if setup.storage is None else "--storage", setup.storage or str(out),
                                f"study '{setup.study_name}' there was started with another {what}; continue it with "
                                f"that {what}, or pick a new --out (or --study)")


def _run_here(setup: SweepSetup, tick: Callable[[], None]) -> None:
    """One worker, in this process (its torch threads restored afterwards)."""
    import torch

    before = torch.get_num_threads()
    try:
        run_worker(setup, after_trial=tick)
    finally:
        torch.set_num_threads(before)


def _run_workers(setup: SweepSetup, workers: int, tick: Callable[[], None]) -> None:
    """``workers`` spawned processes, each with its share of the cores; Ctrl-C and SIGTERM are passed on to them."""
    context = multiprocessing.get_context("spawn")
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(setup.threads)  # before the workers import torch
    try:
        procs = [context.Process(target=_worker_main, args=(setup, i, os.getpid()), name=f"zoo-sweep-{i}")
                 for i in range(workers)]
        for p in procs:
            p.start()
    finally:
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = saved
    try:
        while any(p.is_alive() for p in procs):
            for p in procs:
                p.join(timeout=1.0 / len(procs))
            tick()
    except KeyboardInterrupt as err:
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal_of(err))
        for p in procs:
            p.join()
        raise
    tick()
    failed = [(p.name, p.exitcode) for p in procs if p.exitcode]
    if failed:
        code = failed[0][1]
        if code in (130, 143):
            raise Interrupted(code - 128)
        if code == 2:  # a trial's refused settings fail that trial only: this is input every trial shares
            raise ZooInputError("sweep worker", failed[0][0], "stopped on bad input; its message is above")
        raise RuntimeError(f"sweep worker {failed[0][0]} exited with code {code} (its message is above)")


@contextlib.contextmanager
def _progress_bar(study, n_trials: int, enabled: bool) -> Iterator[Callable[[], None]]:
    """A bar of finished trials; ``tick()`` reads the study again (trials of other workers and machines too)."""
    from tqdm.auto import tqdm

    bar = tqdm(total=n_trials, initial=min(n_trials, tally(study).finished), desc="trials", disable=not enabled,
               leave=False)

    def tick() -> None:
        done = min(n_trials, tally(study).finished)
        if done != bar.n:
            bar.update(done - bar.n)
        best = _best(_trial_rows(study), study.direction.name.lower())
        if best is not None:
            bar.set_postfix(best=f"{best.value:.4g}", refresh=False)

    try:
        yield tick
    finally:
        bar.close()


def _sweep_record(setup: SweepSetup, study, wall: float | None) -> dict[str, Any]:
    rows = _trial_rows(study)
    best = _best(rows, setup.direction)
    counts = state_counts(study)
    return {"spec": yaml.safe_load(setup.spec_yaml), "space": setup.space, "metric": setup.metric,
            "direction": setup.direction, "storage": setup.storage or str(Path(setup.out) / STUDY_FILE),
            "own_storage": setup.storage is None,  # the study.log inside the sweep directory, wherever it is moved
            "study": setup.study_name, "n_trials": setup.n_trials, "wall_seconds": wall,
            "workers": setup.workers, "threads": setup.threads,
            "repeat": None if setup.repeat is None else {setup.repeat[0]: setup.repeat[1]},
            "counts": counts, "failures": failure_kinds(study),
            "caveats": _caveats(study, best, setup.study_name, setup.storage, setup.out),
            "best": None if best is None else best.__dict__, "trials": [r.__dict__ for r in rows]}


def _caveats(study, best: TrialRow | None, study_name: str, storage: str | None, where: str | Path) -> list[str]:
    """What makes the best trial less than the best of a finished search: failures all round it
    (:func:`survival_note`), or trials of the shared study still running elsewhere."""
    counts = state_counts(study)
    out = [note] if (note := survival_note(counts, failure_kinds(study), best, where)) else []
    if counts["running"] and best is not None:
        out.append(f"{counts['running']} trial(s) of study '{study_name}' are still running (other sweep processes "
                   f"share {shown_storage(storage) if storage else 'its storage'}): best.yaml holds the best of "
                   f"the {counts['complete']} trials complete so far; run the same command again once they have "
                   "ended to rewrite it from every complete trial of the study")
    return out


def _finish(setup: SweepSetup, study, out: Path, wall: float) -> SweepResult:
    """Write best.yaml (the best of every complete trial in the study, those of other processes sharing its storage
    included) and the plot; the result."""
    rows = _trial_rows(study)
    best = _best(rows, setup.direction)
    space = load_space(setup.space)
    counts = state_counts(study)
    result = SweepResult(out, setup.metric, setup.direction, rows, best, wall,
                         edges={} if best is None else space.edges(best.params), counts=counts,
                         caveats=_caveats(study, best, setup.study_name, setup.storage, out))
    result.files["sweep"] = out / SWEEP_FILE
    if best is not None:
        chosen = trial_spec(setup.tree, best_params(study, best.number, space))
        chosen = load_spec(chosen, "data.validation_fraction=0")
        whose = (f"study '{setup.study_name}' in {shown_storage(setup.storage)}" if setup.storage
                 else f"the sweep in {out}")
        header = (f"# The best of {counts['complete']} complete trials of {whose}: trial {best.number}, validation "
                  f"{setup.metric} {best.value:.6g}.\n"
                  "# data.validation_fraction is set back to 0: train on every training row, evaluate on the test "
                  "split.\n" + "".join(f"# Note: {line}.\n" for line in [*result.caveats, *result.edges.values()]))
        result.files["best"] = write_text(out / BEST_SPEC_FILE, header + spec_to_yaml(chosen))
    result.files["plot"] = plot_history(rows, setup.metric, setup.direction, out / HISTORY_PLOT)
    return result


def best_params(study, number: int, space: SearchSpace) -> dict[str, Any]:
    """A trial's settings by spec key, with section choices read back from their one-line YAML.

    :param study: the Optuna study.
    :param number: the trial's number.
    :param space: the search space.
    :returns: the settings by spec key.
    """
    params = study.trials[number].params
    return {k: (yaml.safe_load(v) if space.dimensions[k].choices is not None
                and not all(_primitive(c) for c in space.dimensions[k].choices) else v) for k, v in params.items()}


def plot_history(rows: list[TrialRow], metric: str, direction: str, path: Path) -> Path:
    """Every trial's score by trial number (pruned ones at their last intermediate score) and the best so far.

    :param rows: the trials.
    :param metric: the validation metric, for the axis label.
    :param direction: ``"maximize"`` or ``"minimize"``.
    :param path: the image file to write.
    :returns: the path written.
    """
    from zoo.plots import new_figure, save_figure

    fig, axes = new_figure(1, 1, (6.0, 3.6))
    ax = axes[0, 0]
    for state, marker, colour in (("complete", "o", "C0"), ("pruned", "x", "C1")):
        shown = [r for r in rows if r.state == state and r.value is not None]
        ax.scatter([r.number for r in shown], [r.value for r in shown], marker=marker, color=colour,
                   label=f"{state} ({len(shown)})", s=18)
    best, xs, ys = None, [], []
    for r in sorted((r for r in rows if r.state == "complete" and r.value is not None), key=lambda r: r.number):
        if best is None or (r.value > best if direction == "maximize" else r.value < best):
            best = r.value
        xs.append(r.number)
        ys.append(best)
    if xs:
        last = max(r.number for r in rows)
        ax.step([*xs, last], [*ys, ys[-1]], where="post", color="k", lw=1.2, label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(f"validation {metric}")
    ax.set_title(f"sweep: validation {metric} per trial ({'higher' if direction == 'maximize' else 'lower'} is better)")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


# ------------------------------------------------------------------------------------------------ reading a sweep
def is_sweep_directory(path: str | Path) -> bool:
    """Whether ``path`` is a sweep's directory (it holds sweep.json).

    :param path: the directory.
    :returns: True when it holds sweep.json.
    """
    return (Path(path) / SWEEP_FILE).is_file()


def read_sweep(sweep_dir: str | Path) -> SweepResult:
    """A sweep directory's trials as its study holds them now (the storage named in sweep.json).

    :param sweep_dir: the sweep directory.
    :returns: its trials, best trial, edges, counts and caveats (no files).
    :raises ZooInputError: when its sweep.json cannot be read, its storage cannot be opened, or the study is not
        there.
    """
    import optuna

    sweep_dir = Path(sweep_dir)
    try:
        record = json.loads((sweep_dir / SWEEP_FILE).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ZooInputError("SWEEP_DIR", str(sweep_dir), f"its {SWEEP_FILE} cannot be read: {exc}") from None
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    own = record.get("own_storage") or record["storage"] == str(sweep_dir / STUDY_FILE)
    storage = str(sweep_dir / STUDY_FILE) if own else record["storage"]
    opened = open_storage(None if own else storage, sweep_dir)
    try:
        study = optuna.load_study(study_name=record["study"], storage=opened)
    except KeyError:
        raise ZooInputError("SWEEP_DIR", str(sweep_dir), f"no study '{record['study']}' in {storage}") from None
    rows = _trial_rows(study)
    best = _best(rows, record["direction"])
    counts = state_counts(study)
    return SweepResult(sweep_dir, record["metric"], record["direction"], rows, best, record.get("wall_seconds") or 0.0,
                       edges={} if best is None else load_space(record["space"]).edges(best.params), counts=counts,
                       caveats=_caveats(study, best, record["study"], None if storage == str(sweep_dir / STUDY_FILE)
                                        else storage, sweep_dir))


def trials_table(result: SweepResult) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the trials, best first (complete trials by score, then pruned, failed and running).

    :param result: the sweep.
    :returns: ``(header, rows)``, every cell text.
    """
    keys = list(dict.fromkeys(k for r in result.trials for k in r.params))
    order = {"complete": 0, "pruned": 1, "fail": 2, "running": 3, "waiting": 4}
    sign = -1 if result.direction == "maximize" else 1

    def rank(r: TrialRow):
        return (order.get(r.state, 5), sign * r.value if r.value is not None else math.inf, r.number)

    header = ["trial", "state", result.metric, *keys, "seconds", "note"]
    rows = []
    for r in sorted(result.trials, key=rank):
        rows.append([str(r.number), r.state + (" (best)" if result.best is r else ""),
                     "—" if r.value is None else f"{r.value:.4g}",
                     *(_format_param(r.params.get(k)) for k in keys),
                     "—" if r.seconds is None else f"{r.seconds:.1f}", r.note.replace("|", "/")])
    return header, rows


def _format_param(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def write_trials_report(sweep_dir: str | Path, out: str | Path) -> tuple[SweepResult, dict[str, Path]]:
    """``zoo report SWEEP_DIR``: the trials as Markdown and CSV, and the score-per-trial plot beside them.

    :param sweep_dir: the sweep directory.
    :param out: the Markdown file to write; the CSV and PNG of the same stem go beside it.
    :returns: ``(result, files)``: the sweep as :func:`read_sweep` reads it and the files written by kind.
    :raises ZooInputError: when :func:`read_sweep` refuses the directory.
    """
    result = read_sweep(sweep_dir)
    out = Path(out)
    files = {**_markdown_and_csv(*trials_table(result), out),
             "plot": plot_history(result.trials, result.metric, result.direction, out.with_suffix(".png"))}
    return result, files


def sweeps_table(results: list[SweepResult]) -> tuple[list[str], list[list[str]]]:
    """Header and one row per sweep: its trials, best score and settings, and the keys whose best value sits at an
    edge of the range (a range that cut the search short).

    :param results: the sweeps.
    :returns: ``(header, rows)``, every cell text.
    """
    header = ["sweep", "trials", "pruned", "failed", "best", "settings", "at edge", "seconds"]
    rows = []
    for r in results:
        states = [t.state for t in r.trials]
        failed = r.counts["failed"] if r.counts else states.count("fail")  # interrupted trials ran again
        rows.append([str(r.out), str(len(states)), str(states.count("pruned")), str(failed),
                     "—" if r.best is None else f"{r.metric} {r.best.value:.4g}",
                     "—" if r.best is None else ", ".join(f"{k}={_format_param(v)}" for k, v in r.best.params.items()),
                     ", ".join(r.edges) or "—", f"{r.wall_seconds:.0f}"])
    return header, rows


def _markdown_and_csv(header: list[str], rows: list[list[str]], out: Path) -> dict[str, Path]:
    import csv
    import io

    markdown = "\n".join([REPORT_MARK, "| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                          *("| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows)]) + "\n"
    buffer = io.StringIO()
    csv.writer(buffer).writerows([header, *rows])
    return {"markdown": write_text(out, markdown), "csv": write_text(out.with_suffix(".csv"), buffer.getvalue())}


def write_sweeps_report(sweep_dirs: list[str | Path], out: str | Path
                        ) -> tuple[list[SweepResult], dict[str, Path]]:
    """``zoo report SWEEP_DIR SWEEP_DIR ...``: one row per sweep (:func:`sweeps_table`) as Markdown and CSV.

    :param sweep_dirs: the sweep directories.
    :param out: the Markdown file to write; the CSV of the same stem goes beside it.
    :returns: ``(results, files)``: each sweep as :func:`read_sweep` reads it and the files written by kind.
    :raises ZooInputError: when :func:`read_sweep` refuses a directory.
    """
    results = [read_sweep(d) for d in sweep_dirs]
    return results, _markdown_and_csv(*sweeps_table(results), Path(out))


def parse_repeat(text: str) -> tuple[str, list[Any]]:
    """``--repeat KEY=V1,V2,...`` as (key, values), each value read as YAML (``data.split=0,1,2``).

    :param text: the option's value.
    :returns: ``(key, values)``.
    :raises ZooInputError: when there is no key or fewer than two values.
    """
    key, sep, raw = str(text).partition("=")
    values = [yaml.safe_load(v) for v in raw.split(",") if v.strip()] if sep else []
    if not key.strip() or len(values) < 2:
        raise ZooInputError("--repeat", text, "write KEY=V1,V2,..., e.g. data.split=0,1,2 (two or more values)")
    return key.strip(), values
