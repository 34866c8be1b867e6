"""``zoo sweep`` itself: :func:`sweep` checks its arguments, claims the directory, opens the study, runs the trials
here or in workers and writes ``sweep.json``, ``best.yaml`` and the plot (:func:`_finish`); :func:`parse_repeat`
reads ``--repeat``."""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from zoo.errors import ZooInputError, ZooWarning
from zoo.interrupts import Interrupted, signal_of
from zoo.runs import available_memory, write_json, write_text
from zoo.spec import RunSpec, load_spec, spec_to_yaml, spec_tree
from zoo.sweep.directory import (
    BEST_SPEC_FILE,
    STUDY_FILE,
    SWEEP_FILE,
    _earlier_wall_seconds,
    claimed_sweep_directory,
)
from zoo.sweep.report import SweepResult, plot_history
from zoo.sweep.space import _one_line, check_space, load_space, trial_spec
from zoo.sweep.study import (
    SweepSetup,
    _check_same_sweep,
    _open_study,
    choose_metric,
    requeue_interrupted,
    shown_storage,
)
from zoo.sweep.trials import (
    _best,
    _caveats,
    _trial_rows,
    best_params,
    failure_kinds,
    outcome_line,
    state_counts,
    tally,
)
from zoo.sweep.workers import _run_here, _run_workers, available_cores, cap_workers, choose_threads, resident_memory

HISTORY_PLOT = "trials.png"

# The least memory a spawned worker takes (a Python process with torch, Pyro and Optuna imported): with the sweep
# process's own resident memory, what caps --workers by the memory available.
WORKER_MEMORY_FLOOR = 256 * 2**20


def sweep(spec_source: str | Path | dict | RunSpec, space_source: str | Path | dict, n_trials: int, out: str | Path,
          overrides: list[str] | None = None, workers: int = 1, threads: int | None = None,
          storage: str | None = None, study_name: str | None = None, metric: str | None = None,
          repeat: tuple[str, list[Any]] | None = None, progress: bool = True,
          echo: Callable[[str], None] | None = print) -> SweepResult:
    """Search ``space`` for the settings of ``spec`` that score best on its validation rows, in ``n_trials`` finished
    trials; write the sweep directory (see :mod:`zoo.sweep`) and return its trials and best one.

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
