"""Reading a sweep back and reporting it: :class:`SweepResult`, :func:`read_sweep` (the study as it is now), the
trials table of one sweep and the table of many (Markdown and CSV, for ``zoo report``), and the score-per-trial
plot."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from zoo.errors import ZooInputError
from zoo.report import REPORT_MARK
from zoo.runs import write_text
from zoo.sweep.directory import STUDY_FILE, SWEEP_FILE
from zoo.sweep.space import _format_param, load_space
from zoo.sweep.study import open_storage
from zoo.sweep.trials import TrialRow, _best, _caveats, _trial_rows, state_counts


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
