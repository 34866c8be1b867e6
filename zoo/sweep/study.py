"""The Optuna study of a sweep: the metric it optimises, its storage (a journal file checked before any write, or a
shared RDB), opening it and checking that a continued sweep is the same sweep, requeueing the trials whose process
was stopped, and :class:`SweepSetup`, what every worker needs."""

from __future__ import annotations

import json
import os
import re
import socket
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from zoo.errors import ZooInputError
from zoo.sweep.directory import STUDY_FILE, SWEEP_FILE, TRIALS_DIR, _recorded_trials, _trial_directories
from zoo.tasks import task_of


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
