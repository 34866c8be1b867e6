"""What a study's trials came to: how many are finished and running, the count by state and by reason of failure,
the one-line outcome and the warnings on the best trial, the trials as rows of the report, the best one and its
settings."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from zoo.sweep.space import SearchSpace, _primitive
from zoo.sweep.study import shown_storage

REPORTS_PER_TRIAL = 10  # intermediate validation scores per fit, what the pruner compares


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
