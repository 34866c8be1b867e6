"""Owns ``zoo report``: many run directories' metrics and diagnostics gathered into one Markdown table, CSV and plot.

Each run directory contributes its ``spec.yaml`` (for a short label), its ``metrics.json`` and, after
``zoo diagnose``, a few headline numbers of its ``diagnostics.json`` (largest R-hat, smallest ESS, divergences,
smallest BFMI, Pareto k-hat, number of warnings). Without grouping every run is a row; ``group_by`` aggregates
the runs that share a key (e.g. one config over UCI splits 0..19) into mean ± standard error (population std /
sqrt(n)). A metric a run did not record is shown as "—" and never filled in.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.ticker import MaxNLocator
from rich.markup import escape
from rich.table import Table

from zoo.diagnostics import DIAGNOSTICS_FILE
from zoo.errors import ZooInputError
from zoo.metrics import mean_and_standard_error
from zoo.pipeline import describe
from zoo.plots import new_figure, save_figure
from zoo.runs import MARKER_FILE, METRICS_FILE, SPEC_FILE, SWEEP_MARKER, carries_mark, write_text
from zoo.spec import RunSpec, load_spec

MISSING = "—"
# The first line of every Markdown file zoo report writes: what lets a rerun overwrite it (and its .csv, .png)
REPORT_MARK = "<!-- written by zoo report -->"
# Where the usual metrics.json keys go in the table; any other numeric key follows them, alphabetically.
LEADING_METRICS = ("accuracy", "nll", "ece", "brier", "rmse", "test_ll")
TRAILING_METRICS = ("train_seconds",)
# The numbers taken from diagnostics.json (see diagnostic_metrics), in table order.
DIAGNOSTIC_METRICS = ("r_hat_max", "r_hat_max_weights", "ess_min", "divergences", "bfmi_min", "pareto_k",
                      "diagnostic_warnings")
# --group-by shorthands for spec fields.
GROUP_ALIASES = {"data": "data.name", "family": "model.family", "guide": "guide.name", "method": "inference.method",
                 "prior": "prior.default.name"}
GROUP_HELP = ("label (family, guide/method, prior, data set), name (the run directory's name without a trailing "
              "split/seed number), parent (the parent directory's name), data, family, guide, method, prior, or "
              "any spec field such as data.split, seed, net.hidden")
_TRAILING_INDEX = re.compile(r"(?:[-_.](?:split|seed|run)?[-_.]?|split|seed|run)\d+$")  # not rank1's 1
_PLOT_LABEL_CHARS = 40  # wrap plot labels at this width
_CONSOLE_KEY_CHARS = 48  # the first console column is at most this wide


@dataclass(frozen=True)
class RunRecord:
    """One run directory as the report sees it: where it is, its spec, its label and its numbers.

    :param path: the run directory.
    :param spec: its spec (``spec.yaml``).
    :param label: its short label (:func:`run_label`).
    :param metrics: its numbers by name: metrics.json's numeric values and, after ``zoo diagnose``,
        :func:`diagnostic_metrics`.
    """

    path: Path
    spec: RunSpec
    label: str
    metrics: dict[str, float]


@dataclass(frozen=True)
class Cell:
    """One table entry: a run's value (``se`` None), or the mean and standard error over ``n`` runs.

    :param mean: the run's value, or the mean over the runs.
    :param se: the standard error of the mean; None for one run's value.
    :param n: how many runs the entry is made of.
    """

    mean: float
    se: float | None
    n: int


@dataclass
class ReportRow:
    """A run (``key`` is its directory) or a group of runs (``key`` is the shared value of the group key).

    :param key: the run directory, or the group's value of the group key.
    :param label: the run's label (a group's shared one, or how many different labels it has).
    :param n: how many runs the row is made of.
    :param cells: the row's entries by metric; a metric no run of the row recorded has none.
    """

    key: str
    label: str
    n: int
    cells: dict[str, Cell]


@dataclass
class Report:
    """The rows and metric columns of a report, and the files it was written to.

    :param rows: one per run, or one per group.
    :param metrics: the metric columns, in order.
    :param group_by: the group key the rows aggregate by, or None for one row per run.
    :param files: the files written, by kind (``markdown``, ``csv``, ``plot``); empty until written.
    """

    rows: list[ReportRow]
    metrics: list[str]
    group_by: str | None
    files: dict[str, Path] = field(default_factory=dict)

    @property
    def label_column(self) -> bool:
        """Whether rows show their label beside the key (not when the key is the label itself)."""
        return self.group_by != "label"


# ------------------------------------------------------------------------------------------ reading runs
def run_label(spec: RunSpec) -> str:
    """A short description of what a run fits, on what: family, guide or sampler, prior, data set.

    :param spec: the run's spec.
    :returns: ``family <family>, <guide or method>, prior <prior>, <data set>`` (``[validation]`` after a data set
        carved into validation rows).
    """
    prior = spec.prior.default.name
    if spec.prior.sites:
        rules = len(spec.prior.sites)
        prior += f" (+{rules} site rule{'s' if rules > 1 else ''})"
    data = spec.data.name + (" [validation]" if spec.data.validation_fraction > 0 else "")
    return f"{describe(spec)}, prior {prior}, {data}"


def _number(value: Any) -> float | None:
    """``value`` as a float if it is a JSON number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def diagnostic_metrics(diagnostics: dict[str, Any]) -> dict[str, float]:
    """The headline numbers of a ``diagnostics.json``; a check the run did not have (or stored as null) is left out.

    ``r_hat_max``: largest rank R-hat over the function-space summaries and ``lp``; ``r_hat_max_weights``: over the
    latent-site elements; ``ess_min``: smallest bulk/tail ESS there (MCMC only); ``divergences``: count;
    ``bfmi_min``: smallest BFMI over chains; ``pareto_k``: PSIS k-hat of a guide; ``diagnostic_warnings``: how
    many checks warned.

    :param diagnostics: the contents of a ``diagnostics.json``.
    :returns: the headline numbers by the names above.
    """
    out: dict[str, float] = {}
    rows = [r for r in diagnostics.get("function_space") or [] if isinstance(r, dict)]
    r_hats = [v for v in (_number(r.get("r_hat")) for r in rows) if v is not None]
    if r_hats:
        out["r_hat_max"] = max(r_hats)
    weights = diagnostics.get("weights") or {}
    weight_max = _number((weights.get("r_hat_quantiles") or {}).get("max"))
    if weight_max is not None:
        out["r_hat_max_weights"] = weight_max
    if diagnostics.get("draws") == "mcmc":
        ess = [v for r in rows for v in (_number(r.get("ess_bulk")), _number(r.get("ess_tail"))) if v is not None]
        if ess:
            out["ess_min"] = min(ess)
    count = _number((diagnostics.get("divergences") or {}).get("count"))
    if count is not None:
        out["divergences"] = count
    bfmi = [v for v in (_number(b) for b in diagnostics.get("bfmi") or []) if v is not None]
    if bfmi:
        out["bfmi_min"] = min(bfmi)
    k_hat = _number((diagnostics.get("pareto_k") or {}).get("k_hat"))
    if k_hat is not None:
        out["pareto_k"] = k_hat
    if isinstance(diagnostics.get("warnings"), list):
        out["diagnostic_warnings"] = float(len(diagnostics["warnings"]))
    return out


def _read_json(path: Path, run: Path) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ZooInputError("RUN_DIR", str(run), f"its {path.name} cannot be read as JSON ({err})") from None
    if not isinstance(obj, dict):
        raise ZooInputError("RUN_DIR", str(run), f"its {path.name} must hold a JSON object")
    return obj


def read_run(run_dir: str | Path) -> RunRecord:
    """Spec, label, metrics.json and (if present) the diagnostics.json numbers of one run directory.

    :param run_dir: the run directory.
    :returns: the run as the report sees it.
    :raises ZooInputError: when the directory does not exist, is a file, lacks ``spec.yaml`` or ``metrics.json``,
        or one of its files cannot be read.
    """
    run = Path(run_dir)
    if not run.exists():
        raise ZooInputError("RUN_DIR", str(run), "no such directory")
    if not run.is_dir():
        raise ZooInputError("RUN_DIR", str(run), "is a file, not a run directory")
    lacking = [name for name in (SPEC_FILE, METRICS_FILE) if not (run / name).is_file()]
    if lacking:
        hint = " (training unfinished?)" if lacking == [METRICS_FILE] else ""
        raise ZooInputError("RUN_DIR", str(run), f"not a run directory: it lacks {' and '.join(lacking)}{hint}")
    try:
        spec = load_spec(run / SPEC_FILE)
    except ZooInputError as err:
        raise ZooInputError("RUN_DIR", str(run), f"its {SPEC_FILE} is not a valid spec: {err}") from None
    metrics = {k: v for k, v in ((k, _number(v)) for k, v in _read_json(run / METRICS_FILE, run).items())
               if v is not None}
    if not metrics:
        raise ZooInputError("RUN_DIR", str(run), f"its {METRICS_FILE} holds no metric that is a number; restore it, "
                            "or leave the run out of the report (zoo eval RUN_DIR prints its metrics afresh)")
    if (run / DIAGNOSTICS_FILE).is_file():
        metrics.update(diagnostic_metrics(_read_json(run / DIAGNOSTICS_FILE, run)))
    return RunRecord(run, spec, run_label(spec), metrics)


def read_runs(run_dirs: Sequence[str | Path]) -> list[RunRecord]:
    """:func:`read_run` on each directory, in order, each directory once.

    :param run_dirs: the run directories.
    :returns: one record per distinct directory.
    :raises ZooInputError: when no directory is given, or :func:`read_run` refuses one.
    """
    if not run_dirs:
        raise ZooInputError("RUN_DIR", [], "name at least one run directory")
    unique = list(dict.fromkeys(Path(d) for d in run_dirs))
    return [read_run(d) for d in unique]


# ------------------------------------------------------------------------------------------ table
def metric_order(names: set[str]) -> list[str]:
    """The usual metrics first, other metrics.json keys alphabetically, train_seconds, then the diagnostics.

    :param names: the metric names to order.
    :returns: ``names`` in table order.
    """
    middle = sorted(names - set(LEADING_METRICS) - set(TRAILING_METRICS) - set(DIAGNOSTIC_METRICS))
    order = [*LEADING_METRICS, *middle, *TRAILING_METRICS, *DIAGNOSTIC_METRICS]
    return [m for m in order if m in names]


def choose_metrics(records: Sequence[RunRecord], wanted: Sequence[str] | None = None) -> list[str]:
    """Every metric some run recorded (``wanted`` picks and orders them; a name no run records is refused).

    :param records: the runs.
    :param wanted: the metrics to show, in order; None or empty for every recorded one, in :func:`metric_order`.
    :returns: the metric columns.
    :raises ZooInputError: when a wanted metric is recorded by no run.
    """
    recorded = {m for r in records for m in r.metrics}
    if not wanted:
        return metric_order(recorded)
    unknown = [m for m in wanted if m not in recorded]
    if unknown:
        raise ZooInputError("--metrics", unknown[0],
                            f"no run records it; recorded: {', '.join(metric_order(recorded))}")
    return list(dict.fromkeys(wanted))


def group_value(record: RunRecord, key: str) -> str:
    """The value of the group key ``key`` for one run (see ``GROUP_HELP``).

    :param record: the run.
    :param key: ``label``, ``name``, ``parent``, a shorthand of ``GROUP_ALIASES`` or a dotted spec field.
    :returns: the value as text (a spec value that is not a string as JSON); ``—`` where this run's section has no
        such field (``data.split`` of a data set without splits).
    :raises ZooInputError: when ``key`` names no section of the spec.
    """
    if key == "label":
        return record.label
    if key == "name":
        return _TRAILING_INDEX.sub("", record.path.name) or record.path.name
    if key == "parent":
        return record.path.resolve().parent.name
    node: Any = record.spec.model_dump(mode="json")
    path = GROUP_ALIASES.get(key, key).split(".")
    for depth, part in enumerate(path):
        if not isinstance(node, dict) or part not in node:
            if depth > 0 and isinstance(node, dict):  # a field of a section this run's part does not have
                return MISSING
            raise ZooInputError("--group-by", key, f"use {GROUP_HELP}")
        node = node[part]
    return node if isinstance(node, str) else json.dumps(node)


def run_rows(records: Sequence[RunRecord], metrics: Sequence[str]) -> list[ReportRow]:
    """One row per run: its own values, no aggregation.

    :param records: the runs.
    :param metrics: the metric columns.
    :returns: the rows, in the order of ``records``.
    """
    return [ReportRow(str(r.path), r.label, 1, {m: Cell(r.metrics[m], None, 1) for m in metrics if m in r.metrics})
            for r in records]


def group_rows(records: Sequence[RunRecord], metrics: Sequence[str], key: str) -> list[ReportRow]:
    """One row per value of ``key`` (in order of first appearance): mean and standard error of each metric over
    the group's runs that recorded it.

    :param records: the runs.
    :param metrics: the metric columns.
    :param key: the group key (:func:`group_value`).
    :returns: the rows, one per group.
    :raises ZooInputError: when ``key`` names no spec field.
    """
    groups: dict[str, list[RunRecord]] = {}
    for record in records:
        groups.setdefault(group_value(record, key), []).append(record)
    if set(groups) == {MISSING}:  # no run has the field: a typo, most likely
        raise ZooInputError("--group-by", key, f"no run's spec has it; use {GROUP_HELP}")
    rows = []
    for value, members in groups.items():
        labels = list(dict.fromkeys(r.label for r in members))
        label = labels[0] if len(labels) == 1 else f"{len(labels)} different labels"
        cells = {}
        for m in metrics:
            values = [r.metrics[m] for r in members if m in r.metrics]
            if values:
                mean, se = mean_and_standard_error(values)
                cells[m] = Cell(mean, se, len(values))
        rows.append(ReportRow(value, label, len(members), cells))
    return rows


def build_report(run_dirs: Sequence[str | Path], group_by: str | None = None,
                 metrics: Sequence[str] | None = None) -> Report:
    """Read the run directories and build the rows (one per run, or one per group with ``group_by``).

    :param run_dirs: the run directories, each read once.
    :param group_by: the group key (see ``GROUP_HELP``), e.g. ``label`` or ``data.split``; None for one row per run.
    :param metrics: the metric columns, in order; None for every metric some run recorded.
    :returns: the report, with no files written.
    :raises ZooInputError: when no run directory is given, one cannot be read, a metric is recorded by no run, or
        ``group_by`` names no spec field.
    """
    records = read_runs(run_dirs)
    chosen = choose_metrics(records, metrics)
    rows = group_rows(records, chosen, group_by) if group_by else run_rows(records, chosen)
    return Report(rows, chosen, group_by)


# ------------------------------------------------------------------------------------------ rendering
def format_value(value: float) -> str:
    """Whole numbers as integers, others to four significant digits (no exponent from 1000 up).

    :param value: the number.
    :returns: its text.
    """
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def format_cell(cell: Cell | None, group_n: int | None = None) -> str:
    """``value``, or ``mean ± se`` rounded to the se's second significant digit, plus ``(n=k)`` when only ``k`` of
    the group's ``group_n`` runs recorded it; "—" when absent.

    :param cell: the entry, or None when absent.
    :param group_n: the number of runs in the entry's group; None for a row of one run.
    :returns: the entry's text.
    """
    if cell is None:
        return MISSING
    if cell.se is None or cell.n == 1:
        text = format_value(cell.mean)
    elif cell.se > 0 and math.isfinite(cell.se) and math.isfinite(cell.mean):
        decimals = min(max(0, 1 - math.floor(math.log10(cell.se))), 8)
        text = f"{cell.mean:.{decimals}f} ± {cell.se:.{decimals}f}"
    else:
        text = f"{format_value(cell.mean)} ± {format_value(cell.se)}"
    if group_n is not None and cell.n != group_n:
        text += f" (n={cell.n})"
    return text


def _header(report: Report) -> list[str]:
    if report.group_by is None:
        return ["run", "label", *report.metrics]
    return [report.group_by, *(["label"] if report.label_column else []), "n", *report.metrics]


def table_rows(report: Report) -> list[list[str]]:
    """The table as text cells: per run its key, label and metrics; per group its key, label (unless the key is
    the label), ``n`` and metrics.

    :param report: the report.
    :returns: one list of cells per row.
    """
    out = []
    for row in report.rows:
        if report.group_by is None:
            out.append([row.key, row.label, *(format_cell(row.cells.get(m)) for m in report.metrics)])
        else:
            label = [row.label] if report.label_column else []
            out.append([row.key, *label, str(row.n), *(format_cell(row.cells.get(m), row.n) for m in report.metrics)])
    return out


def to_markdown(report: Report) -> str:
    """A Markdown document: what the numbers are, the table, and the plot if written.

    :param report: the report (its ``files["plot"]``, if any, is linked).
    :returns: the document, starting with :data:`REPORT_MARK`.
    """
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    header = _header(report)
    if report.group_by is None:
        what = f"{len(report.rows)} run(s), one row each."
    else:
        what = (f"{sum(r.n for r in report.rows)} run(s) grouped by `{report.group_by}`: mean ± standard error "
                "(population std / sqrt(n)) over each group's n runs (a group of one shows its value); (n=k) marks a "
                "metric only k of them recorded.")
    lines = [REPORT_MARK, "# zoo report", "", f"{what} {MISSING} = not recorded by the run(s).", "",
             line(header), line(["---"] * len(header)), *(line(r) for r in table_rows(report)), ""]
    if "plot" in report.files:
        lines += [f"![metrics]({report.files['plot'].name})", ""]
    return "\n".join(lines)


def to_csv(report: Report) -> str:
    """Full-precision CSV: per run ``run, label, <metric>...``; per group ``<key>, label, n, <metric>_mean,
    <metric>_se, <metric>_n...``. Absent values are empty.

    :param report: the report.
    :returns: the CSV text.
    """
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if report.group_by is None:
        writer.writerow(["run", "label", *report.metrics])
        for row in report.rows:
            writer.writerow([row.key, row.label, *(repr(row.cells[m].mean) if m in row.cells else ""
                                                   for m in report.metrics)])
    else:
        label = ["label"] if report.label_column else []
        writer.writerow([report.group_by, *label, "n", *(f"{m}_{s}" for m in report.metrics
                                                         for s in ("mean", "se", "n"))])
        for row in report.rows:
            cells = []
            for m in report.metrics:
                c = row.cells.get(m)
                cells += [repr(c.mean), repr(c.se), str(c.n)] if c is not None else ["", "", ""]
            writer.writerow([row.key, *([row.label] if label else []), row.n, *cells])
    return buffer.getvalue()


def plot_labels(report: Report) -> list[str]:
    """Y-axis labels: run directory names (whole paths where names repeat) or group values, shortened to 3 lines.

    :param report: the report.
    :returns: one label per row.
    """
    keys = [row.key for row in report.rows]
    if report.group_by is None:
        names = [Path(k).name for k in keys]
        keys = names if len(set(names)) == len(names) else keys
    return [textwrap.shorten(k, 3 * _PLOT_LABEL_CHARS, placeholder=" …") if " " in k else k for k in keys]


def plot_report(report: Report, path: str | Path) -> Path:
    """One panel per metric, the runs or groups as points on a shared axis (error bars: ± one standard error).

    :param report: the report.
    :param path: the image file to write.
    :returns: the path written.
    """
    n = len(report.metrics)
    ncols = min(n, 4)
    nrows = math.ceil(n / ncols)
    labels = [textwrap.fill(label, _PLOT_LABEL_CHARS) for label in plot_labels(report)]
    lines = sum(label.count("\n") + 1 for label in labels)
    height = max(2.2, 0.2 * lines + 0.1 * len(labels) + 1.0)
    fig, axes = new_figure(nrows, ncols, (3.2 * ncols + 3.0, height * nrows), sharey=True)
    fig.subplots_adjust(wspace=0.08, hspace=0.35 + 0.6 / height, top=1 - 0.3 / (height * nrows))
    positions = list(range(len(report.rows)))
    for i, ax in enumerate(axes.flat):
        if i >= n:
            ax.set_visible(False)
            continue
        metric = report.metrics[i]
        present = [(y, row.cells[metric]) for y, row in zip(positions, report.rows, strict=True)
                   if metric in row.cells]
        ys = [y for y, _ in present]
        xs = [c.mean for _, c in present]
        errors = [c.se or 0.0 for _, c in present]
        ax.errorbar(xs, ys, xerr=errors if report.group_by else None, fmt="o", capsize=3, color="tab:blue")
        ax.set_title(metric, fontsize="medium")
        ax.xaxis.set_major_locator(MaxNLocator(4))
        ax.grid(True, axis="x", alpha=0.3)
    first = axes.flat[0]  # the y axis is shared: ticks, labels and limits once
    first.set_yticks(positions)
    first.set_ylim(len(report.rows) - 0.5, -0.5)
    for ax in axes[:, 0]:
        ax.set_yticklabels(labels, fontsize="small")
    how = f"mean ± s.e. by {report.group_by}" if report.group_by else "one point per run"
    fig.suptitle(f"zoo report ({how})", y=1.0, va="bottom")  # above the panel titles; the saved bbox grows to fit
    return save_figure(fig, path)


def rich_tables(report: Report, width: int = 120, title: str = "zoo report") -> list[Table]:
    """The report for the console: the run (or group) with its label underneath in the first column, the metric
    columns split over as many tables as it takes to fit ``width`` characters.

    :param report: the report.
    :param width: the console's width in characters.
    :param title: the tables' title (numbered when there are several).
    :returns: the tables, to print one after another.
    """
    grouped = report.group_by is not None
    keys = [(row.key, row.label if report.label_column else None) for row in report.rows]
    cells = [[format_cell(row.cells.get(m), row.n if grouped else None) for m in report.metrics]
             for row in report.rows]
    key_width = min(_CONSOLE_KEY_CHARS, max(20, width // 3), max(len(text) for key in keys for text in key if text))
    widths = [max(len(m), *(len(c[j]) for c in cells)) + 3 for j, m in enumerate(report.metrics)]
    base = key_width + 4 + (6 if grouped else 0)
    chunks: list[list[int]] = [[]]
    used = base
    for j, w in enumerate(widths):
        if chunks[-1] and used + w > width:
            chunks.append([])
            used = base
        chunks[-1].append(j)
        used += w
    tables = []
    for part, columns in enumerate(chunks, start=1):
        suffix = f" ({part}/{len(chunks)})" if len(chunks) > 1 else ""
        table = Table(title=escape(title + suffix), title_justify="left")
        table.add_column(escape(report.group_by or "run"), max_width=key_width, overflow="fold")
        if grouped:
            table.add_column("n", justify="right")
        for j in columns:
            table.add_column(escape(report.metrics[j]), justify="right", no_wrap=True)
        for row, (key, label), values in zip(report.rows, keys, cells, strict=True):
            first = escape(key) + (f"\n[dim]{escape(label)}[/dim]" if label else "")
            table.add_row(first, *([str(row.n)] if grouped else []), *(escape(values[j]) for j in columns))
        tables.append(table)
    return tables


def report_outputs(out: str | Path, suffixes: Sequence[str] = (".csv", ".png")) -> Path:
    """Check that ``zoo report --out`` may write ``out`` (Markdown) and its ``suffixes`` beside it; ``out`` as a Path.

    Refused: a name not ending in .md; a folder that is a run or a sweep directory (the report would mix with, or
    replace, what ``zoo train``/``zoo diagnose``/``zoo sweep`` wrote there); and any of the files that already
    exists while ``out`` is not an earlier report (its first line is :data:`REPORT_MARK`): the user's own data.

    :param out: the Markdown file asked for.
    :param suffixes: the suffixes of the files written beside it.
    :returns: ``out`` as a Path.
    :raises ZooInputError: when ``out`` is refused, saying why.
    """
    out = Path(out)
    if out.suffix.lower() != ".md":
        raise ZooInputError("--out", str(out), "give a Markdown file name ending in .md (the .csv and .png of the "
                            "same name are written beside it)")
    folder = out.parent
    if any((folder / name).is_file() for name in (SPEC_FILE, MARKER_FILE, SWEEP_MARKER)):
        kind = "sweep" if (folder / SWEEP_MARKER).is_file() else "run"
        raise ZooInputError("--out", str(out), f"{folder} is a {kind} directory; write the report outside it (e.g. "
                            f"--out {folder.parent / (folder.name + '_report.md')})")
    ours = carries_mark(out, REPORT_MARK)
    for path in (out, *(out.with_suffix(s) for s in suffixes)):
        if path.exists() and not ours:
            raise ZooInputError("--out", str(out), f"{path} exists and was not written by zoo report; choose another "
                                "--out name (a report writes its .md, .csv and .png and overwrites only its own)")
    return out


def write_report(run_dirs: Sequence[str | Path], out: str | Path, group_by: str | None = None,
                 metrics: Sequence[str] | None = None) -> Report:
    """Build the report of ``run_dirs`` and write ``out`` (Markdown) with a CSV and a PNG of the same stem beside it
    (:func:`report_outputs` says where it may).

    :param run_dirs: the run directories, each read once.
    :param out: the Markdown file to write, ending in ``.md``.
    :param group_by: the group key (see ``GROUP_HELP``); None for one row per run.
    :param metrics: the metric columns, in order; None for every metric some run recorded.
    :returns: the report, its ``files`` naming the Markdown, CSV and plot written.
    :raises ZooInputError: when ``out`` is refused, or :func:`build_report` refuses its arguments.
    """
    out = report_outputs(out)
    report = build_report(run_dirs, group_by, metrics)
    report.files["csv"] = write_text(out.with_suffix(".csv"), to_csv(report))
    report.files["plot"] = plot_report(report, out.with_suffix(".png"))
    report.files["markdown"] = write_text(out, to_markdown(report))
    return report
