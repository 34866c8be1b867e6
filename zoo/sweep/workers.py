"""Running trials: the objective (one trial is one ``zoo train`` scored on validation rows), a worker's loop, the
spawned worker processes and how many of them and their threads the machine takes (cores, memory), run in this
process or in workers."""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from zoo.errors import TrainingDiverged, ZooInputError
from zoo.exits import exit_code
from zoo.interrupts import Interrupted, signal_of, sigterm_interrupts
from zoo.sweep.directory import TRIALS_DIR
from zoo.sweep.space import SearchSpace, load_space, trial_spec
from zoo.sweep.study import SweepSetup, open_storage
from zoo.sweep.trials import REPORTS_PER_TRIAL, tally

PRUNER_STARTUP_TRIALS = 5  # finished trials before any is pruned
PRUNER_WARMUP_REPORTS = 3  # no trial is pruned on its first 3 scores (early validation scores are noisy)


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
