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

The package's rooms, each importing only the rooms above it in this list:

* :mod:`zoo.sweep.directory`: the sweep directory's files, claiming it, and refusing a run inside a sweep;
* :mod:`zoo.sweep.space`: the search space (:class:`Dimension`, :class:`SearchSpace`, :func:`load_space`,
  :func:`check_space`, :func:`trial_spec`);
* :mod:`zoo.sweep.study`: the Optuna study: the metric, its storage, opening and checking it, requeueing
  interrupted trials, :class:`SweepSetup`;
* :mod:`zoo.sweep.trials`: what the trials came to: tallies, state counts, failure kinds, outcome lines, the best;
* :mod:`zoo.sweep.workers`: the objective, the worker processes, and the cores, memory and threads they take;
* :mod:`zoo.sweep.report`: reading a sweep back (:func:`read_sweep`), its tables and plot (``zoo report``);
* :mod:`zoo.sweep.run`: :func:`sweep` itself and ``--repeat``.

Every public name of the rooms is importable from ``zoo.sweep``.
"""

from zoo.sweep.directory import (
    BEST_SPEC_FILE,
    STUDY_FILE,
    SWEEP_FILE,
    TRIALS_DIR,
    claimed_sweep_directory,
    refuse_run_in_sweep,
)
from zoo.sweep.report import (
    SweepResult,
    is_sweep_directory,
    plot_history,
    read_sweep,
    sweeps_table,
    trials_table,
    write_sweeps_report,
    write_trials_report,
)
from zoo.sweep.run import HISTORY_PLOT, WORKER_MEMORY_FLOOR, parse_repeat, sweep
from zoo.sweep.space import (
    EDGE_SHARE,
    FIXED_KEYS,
    INNER_PROBE,
    Dimension,
    SearchSpace,
    check_space,
    load_space,
    trial_spec,
)
from zoo.sweep.study import SweepSetup, check_journal, choose_metric, open_storage, requeue_interrupted, shown_storage
from zoo.sweep.trials import (
    FAILURE_KINDS,
    REPORTS_PER_TRIAL,
    STATES,
    Tally,
    TrialRow,
    best_params,
    failure_kinds,
    outcome_line,
    state_counts,
    survival_note,
    tally,
)
from zoo.sweep.workers import (
    PRUNER_STARTUP_TRIALS,
    PRUNER_WARMUP_REPORTS,
    available_cores,
    cap_workers,
    choose_threads,
    resident_memory,
    run_worker,
)

__all__ = [
    "SWEEP_FILE", "STUDY_FILE", "BEST_SPEC_FILE", "TRIALS_DIR", "refuse_run_in_sweep", "claimed_sweep_directory",
    "EDGE_SHARE", "FIXED_KEYS", "INNER_PROBE", "Dimension", "SearchSpace", "load_space", "check_space",
    "trial_spec", "choose_metric", "open_storage", "shown_storage", "check_journal", "requeue_interrupted",
    "SweepSetup", "REPORTS_PER_TRIAL", "TrialRow", "Tally", "tally", "STATES", "state_counts", "FAILURE_KINDS",
    "failure_kinds", "outcome_line", "survival_note", "best_params", "PRUNER_STARTUP_TRIALS",
    "PRUNER_WARMUP_REPORTS", "run_worker", "available_cores", "resident_memory", "cap_workers", "choose_threads",
    "SweepResult", "plot_history", "is_sweep_directory", "read_sweep", "trials_table", "write_trials_report",
    "sweeps_table", "write_sweeps_report", "WORKER_MEMORY_FLOOR", "HISTORY_PLOT", "sweep", "parse_repeat",
]
