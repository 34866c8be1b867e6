"""How far runs' predictive distributions on the test inputs are from a reference run's (usually HMC/NUTS):
coverage of the reference's predictive of y and the 1-Wasserstein distance to it (regression), agreement and total
variation (classification), next to each run's own test metrics; ``zoo compare`` prints and plots them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyro
import torch
from rich.markup import escape
from rich.table import Table

from zoo import registry
from zoo.data.base import Dataset
from zoo.diagnostics.checks import diagnosis, fmt, jsonable, method_label
from zoo.errors import ZooInputError
from zoo.evaluate import check_draws_fit
from zoo.inference_data import as_numpy
from zoo.likelihoods import PredictiveDraws
from zoo.pipeline import load_run
from zoo.plots import new_figure, save_figure
from zoo.posterior import Posterior
from zoo.runs import METRICS_FILE, SPEC_FILE, refuse_to_replace
from zoo.tasks import TASKS, Classification, task_of

COMPARE_PLOT = "compare.png"
COMPARE_MARK = "written by zoo compare"  # in compare.png's zoo text chunk: what lets a rerun replace it
ROW_KEYS = ("run", "label", "reference", "reference_check")  # what every row of zoo compare's JSON holds
COMPARE_DRAWS = 200
METRIC_KEYS = ("accuracy", "nll", "ece", "rmse", "test_ll")


@dataclass
class RunPredictive:
    """One run's predictive on its test inputs: what its task compares (:meth:`zoo.tasks.Task.comparison_draws`:
    y samples ``[R, B]`` in original units for regression, the mean class probabilities ``[B, C]`` for
    classification).

    :param run_dir: the run directory.
    :param label: the run's name in tables and plots: its directory's name and method.
    :param data: the run's data set.
    :param metrics: the run's stored test metrics (``accuracy``, ``nll``, ``ece``, ``rmse``, ``test_ll``, where
        recorded).
    :param posterior: the run's posterior.
    :param pred: the per-draw predictive distributions at the test inputs.
    :param draws: what the task compares, as above.
    """

    run_dir: Path
    label: str
    data: Dataset
    metrics: dict[str, float]
    posterior: Posterior | None = None
    pred: PredictiveDraws | None = None  # the draws the comparison is made of, for further figures
    draws: np.ndarray | None = None


def run_predictive(run_dir: str | Path, num_samples: int = COMPARE_DRAWS) -> RunPredictive:
    """The predictive of a run at its test inputs, seeded by the run's seed (the same run gives the same draws).

    :param run_dir: the run directory.
    :param num_samples: posterior draws.
    :returns: the run's predictive and stored metrics.
    :raises ZooInputError: when ``num_samples`` is below 1 or would not fit in memory, or ``run_dir`` holds no run
        that can be loaded.
    """
    if num_samples < 1:
        raise ZooInputError("--samples", num_samples, "use a positive number of posterior draws")
    run = Path(run_dir)
    spec, data, posterior = load_run(run)
    check_draws_fit(posterior, data, num_samples)
    pyro.set_rng_seed(spec.seed + 1)
    pred = posterior.predict(data.x_test, draws=posterior.sample(num_samples))
    metrics = _stored_metrics(run)
    return RunPredictive(run, f"{run.name} ({method_label(spec)})", data, metrics, posterior, pred,
                         task_of(data).comparison_draws(pred, data, spec.seed + 2))


def _stored_metrics(run: Path) -> dict[str, float]:
    """The test metrics a run recorded in its metrics.json ({} where it has none), refused where it is unreadable."""
    path = run / METRICS_FILE
    if not path.exists():
        return {}
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ZooInputError("RUN", str(run), f"its {METRICS_FILE} cannot be read as JSON ({err}): it is truncated or "
                            f"was edited; restore it, or move it aside to compare without the stored metrics") from None
    if not isinstance(stored, dict):
        raise ZooInputError("RUN", str(run), f"its {METRICS_FILE} must hold a JSON object of metrics, not "
                            f"{type(stored).__name__}; restore it, or move it aside")
    return {k: stored[k] for k in METRIC_KEYS if k in stored}


@dataclass
class ReferenceStanding:
    """Whether a run can serve as a reference: an exact sampler's draws (NUTS/HMC) that pass ``zoo diagnose
    --strict``. ``problems`` says why not, one reason per line; empty when it can.

    :param run_dir: the run directory.
    :param method: how the run was fitted (its method label).
    :param problems: why it cannot serve, one reason each; empty when it can.
    """

    run_dir: Path
    method: str
    problems: list[str]

    @property
    def trusted(self) -> bool:
        return not self.problems

    def column(self) -> str:
        """The reference's standing as a table cell.

        :returns: ``passes --strict``, or ``FAILS:`` and the problems.
        """
        return "passes --strict" if self.trusted else "FAILS: " + "; ".join(self.problems)


def reference_standing(run_dir: str | Path) -> ReferenceStanding:
    """Check that ``run_dir`` is a reference a comparison may trust: an exact sampler's draws (not SVI, SWAG,
    SG-MCMC or Laplace, whose own error is what a comparison measures) that pass every ``zoo diagnose --strict``
    check (function-space R-hat, bulk/tail ESS, divergences, BFMI). Writes nothing into the run.

    :param run_dir: the run directory.
    :returns: its standing, with the failed checks (or the reason it is no exact sampler) as ``problems``.
    :raises ZooInputError: when ``run_dir`` holds no run that can be loaded.
    """
    run = Path(run_dir)
    spec, _, _ = load_run(run)
    method = registry.method_of(spec)
    label = method_label(spec)
    if not method.exact:
        exact = registry.METHODS.names_where(lambda m: m.exact)
        return ReferenceStanding(run, label, [f"{label} is not an exact sampler; a reference must be draws of "
                                              f"{' or '.join(exact)}"])
    result, _ = diagnosis(run)
    return ReferenceStanding(run, label, list(result["warnings"]))


def trusted_reference(run_dir: str | Path, allow_unconverged: bool = False, field: str = "REFERENCE_RUN"
                      ) -> ReferenceStanding:
    """:func:`reference_standing`, refused (exit 2) unless trusted or ``allow_unconverged`` is given.

    :param run_dir: the reference's run directory.
    :param allow_unconverged: return the standing of an untrusted reference instead of refusing it.
    :param field: the argument that named the reference, named in the refusal.
    :returns: the reference's standing.
    :raises ZooInputError: when the reference cannot be trusted and ``allow_unconverged`` is False.
    """
    standing = reference_standing(run_dir)
    if not standing.trusted and not allow_unconverged:
        raise ZooInputError(field, str(run_dir), "", message=(
            f"{field} {run_dir} cannot be trusted as a reference: {'; '.join(standing.problems)}. Train an exact "
            "sampler (nuts or hmc) with more warm-up, draws or chains until zoo diagnose --strict passes, or pass "
            "--allow-unconverged (Python: allow_unconverged=True) to compare anyway, the reference marked as "
            "failing"))
    return standing


def _same_data(reference: RunPredictive, run: RunPredictive) -> None:
    a, b = reference.data, run.data
    same = (a.task == b.task and a.x_test.shape == b.x_test.shape and a.y_test.shape == b.y_test.shape
            and torch.allclose(a.x_test.cpu().float(), b.x_test.cpu().float())
            and torch.allclose(a.y_test.cpu().double(), b.y_test.cpu().double()))
    if not same:
        raise ZooInputError("RUN", str(run.run_dir), f"was trained on different data from the reference "
                            f"{reference.run_dir} ({b.name}, {len(b.y_test)} test points vs {a.name}, "
                            f"{len(a.y_test)}); compare runs of the same data set, split and seed")


def compare(reference_dir: str | Path, run_dirs: Sequence[str | Path], num_samples: int = COMPARE_DRAWS,
            out_dir: str | Path | None = None, allow_unconverged: bool = False) -> list[dict[str, Any]]:
    """Rows comparing runs' test-set predictives with a reference run's (the first row is the reference itself).

    The reference must be an exact sampler's draws that pass ``zoo diagnose --strict``
    (:func:`reference_standing`); any other is refused, unless ``allow_unconverged``, when every row carries
    ``reference_check: "FAILS: ..."``.

    Classification: ``agreement`` (argmax of the mean predictive matches the reference's) and ``tv`` (mean total
    variation between mean predictive class distributions). Regression: ``coverage_95`` (reference predictive mass
    inside the run's central 95% interval, averaged over test inputs; 0.95 is ideal) and ``w1`` (mean Wasserstein-1
    distance between predictive marginals of y, original units). Each row also has the run's stored test metrics.
    With ``out_dir``, a plot is written to ``out_dir/compare.png`` (``rows[0]["plot"]``).

    :param reference_dir: the reference's run directory.
    :param run_dirs: the run directories to compare with it, a list (not a single path).
    :param num_samples: posterior draws per run, seeded by each run's seed.
    :param out_dir: where to write ``compare.png``; None for no plot.
    :param allow_unconverged: compare against a reference that cannot be trusted instead of refusing it.
    :returns: one row per run, the reference first, each with ``run``, ``label``, ``reference``, the task's
        figures, the stored metrics and ``reference_check``.
    :raises TypeError: when ``run_dirs`` is a single path, or a run directory is not a str or Path.
    :raises ZooInputError: when a directory is not a run, ``num_samples`` is below 1, the reference cannot be
        trusted (without ``allow_unconverged``), or a run was trained on other data than the reference.
    """
    if isinstance(run_dirs, str | Path):
        raise TypeError(f"compare(reference_dir, run_dirs): run_dirs is a list of run directories, got the single "
                        f"path {str(run_dirs)!r}; call compare({str(reference_dir)!r}, [{str(run_dirs)!r}])")
    for path in [reference_dir, *run_dirs]:
        if not isinstance(path, str | Path):
            raise TypeError(f"compare: a run directory is a str or Path, got {type(path).__name__}")
        if not (Path(path) / SPEC_FILE).is_file():  # before the reference's checks, which take a while
            raise ZooInputError("RUN", str(path), "not a run directory (it has no spec.yaml)")
    if num_samples < 1:
        raise ZooInputError("--samples", num_samples, "use a positive number of posterior draws")
    compare_outputs(out_dir)
    standing = trusted_reference(reference_dir, allow_unconverged)
    cache: dict[Path, RunPredictive] = {}

    def get(path: str | Path) -> RunPredictive:
        key = Path(path).resolve()
        if key not in cache:
            cache[key] = run_predictive(path, num_samples)
        return cache[key]

    rows = compare_predictives(get(reference_dir), [get(p) for p in run_dirs], out_dir)
    return [{**row, "reference_check": standing.column()} for row in rows]


def compare_outputs(out_dir: str | Path | None, json_path: str | Path | None = None) -> None:
    """Check, before anything is drawn, that ``zoo compare`` may write ``out_dir/compare.png`` and ``json_path``:
    each must be new, or a file an earlier ``zoo compare`` wrote (the plot carries :data:`COMPARE_MARK`,
    :func:`zoo.runs.carries_mark`; the JSON is a list of its rows); a user's file of that name is never replaced.

    :param out_dir: the plot's folder (None: no plot).
    :param json_path: the JSON file of the rows (None: none).
    :raises ZooInputError: naming the file that would be replaced, or a path that is a directory, and the fix.
    """
    if out_dir is not None:
        out = Path(out_dir)
        if out.exists() and not out.is_dir():
            raise ZooInputError("--out", str(out), "is a file; --out is the folder compare.png is written to")
        refuse_to_replace(out / COMPARE_PLOT, COMPARE_MARK, "--out", "zoo compare", "choose another --out folder "
                          "(zoo compare writes compare.png there and replaces only its own), or move the file")
    if json_path is not None:
        path = Path(json_path)
        if path.is_dir() or not path.exists() or not _compare_rows_file(path):
            refuse_to_replace(path, "", "--json", "zoo compare", "give a new file name for --json (zoo compare "
                              "replaces only a rows file it wrote)")


def _compare_rows_file(path: Path) -> bool:
    """Whether ``path`` holds what ``zoo compare --json`` writes: a list of rows, each with :data:`ROW_KEYS`."""
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(rows, list) and bool(rows) and all(isinstance(r, dict) and set(ROW_KEYS) <= set(r)
                                                          for r in rows)


def compare_predictives(reference: RunPredictive, runs: Sequence[RunPredictive],
                        out_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """:func:`compare` on predictives already drawn (by :func:`run_predictive`), without the reference's check.

    :param reference: the reference's predictive.
    :param runs: the predictives to compare with it.
    :param out_dir: where to write ``compare.png``; None for no plot.
    :returns: one row per run, the reference first (``reference_check`` not included).
    :raises ZooInputError: when a run was trained on other data than the reference.
    """
    runs = list(runs)
    for run in runs:
        _same_data(reference, run)
    rows, per_input = [], []
    for run, is_reference in [(reference, True)] + [(r, False) for r in runs]:
        row: dict[str, Any] = {"run": str(run.run_dir), "label": run.label, "reference": is_reference}
        figures, along_inputs = task_of(reference.data).compare(run.draws, reference.draws)
        row.update(figures)
        per_input.append(along_inputs)
        row.update(run.metrics)
        rows.append(jsonable(row))
    if out_dir is not None:
        compare_outputs(out_dir)
        rows[0]["plot"] = str(plot_compare(reference, runs, rows, per_input, Path(out_dir) / COMPARE_PLOT))
    return rows


def plot_compare(reference: RunPredictive, runs: list[RunPredictive], rows: list[dict[str, Any]],
                 per_input: list[np.ndarray], path: Path) -> Path:
    """Regression: predictive mean +- 2 sd of each run over a 1-D input (else W1 per test input); classification:
    agreement and total variation per run.

    :param reference: the reference's predictive.
    :param runs: the compared runs' predictives.
    :param rows: :func:`compare_predictives`' rows (the reference first).
    :param per_input: per run, the reference first, the task's figure along the test inputs ``[B]`` (W1 for
        regression).
    :param path: the image file to write.
    :returns: the path written.
    """
    data = reference.data
    labels = [r["label"] for r in rows]
    if isinstance(task_of(data), Classification):
        fig, axes = new_figure(1, 1, (max(5.0, 1.6 * len(rows)), 4))
        ax, pos, width = axes[0, 0], np.arange(len(rows)), 0.38
        ax.bar(pos - width / 2, [r["agreement"] for r in rows], width, label="agreement")
        ax.bar(pos + width / 2, [r["tv"] for r in rows], width, label="mean total variation")
        ax.set_xticks(pos, labels, rotation=20, ha="right")
        ax.set_ylim(0, 1.05)
        ax.legend()
        ax.set_title(f"{data.name}: test predictive vs {labels[0]}")
        return save_figure(fig, path, COMPARE_MARK)
    everyone = [reference, *runs]
    if data.in_dim == 1:
        x = as_numpy(data.inputs_in_original_units(data.x_test)[:, 0].double())
        order = np.argsort(x)
        fig, axes = new_figure(2, 1, (8, 7))
        ax = axes[0, 0]
        for i, (run, label) in enumerate(zip(everyone, labels, strict=True)):
            mean, sd = run.draws.mean(0)[order], run.draws.std(0)[order]
            color = "black" if i == 0 else f"C{i - 1}"
            if i == 0:
                ax.fill_between(x[order], mean - 2 * sd, mean + 2 * sd, color="0.8", label=f"{label} ±2 sd")
            else:
                ax.plot(x[order], mean - 2 * sd, color=color, ls="--", lw=1)
                ax.plot(x[order], mean + 2 * sd, color=color, ls="--", lw=1)
            ax.plot(x[order], mean, color=color, lw=1.5, label=label)
        x_train = as_numpy(data.inputs_in_original_units(data.x_train)[:, 0].double())
        ax.plot(x_train, as_numpy(data.y_train.double()) * data.y_std + data.y_mean, ".", color="0.4", ms=3,
                label="training data")
        ax.set_ylabel("y (predictive mean ± 2 sd)")
        ax.legend(fontsize="small")
        ax.set_title(f"{data.name}: test predictive vs {labels[0]}")
        ax = axes[1, 0]
        for i, (w1, label) in enumerate(zip(per_input[1:], labels[1:], strict=True)):
            ax.plot(x[order], w1[order], color=f"C{i}", label=label)
        ax.set_xlabel("x")
    else:
        fig, axes = new_figure(1, 1, (8, 4))
        ax = axes[0, 0]
        order = np.argsort(reference.draws.std(0))
        for i, (w1, label) in enumerate(zip(per_input[1:], labels[1:], strict=True)):
            ax.plot(np.arange(len(order)), w1[order], ".", color=f"C{i}", label=label)
        ax.set_xlabel("test input (sorted by the reference's predictive sd)")
        ax.set_title(f"{data.name}: W1 to {labels[0]} per test input")
    ax.set_ylabel("Wasserstein-1 to the reference")
    if len(runs):
        ax.legend(fontsize="small")
    return save_figure(fig, path, COMPARE_MARK)


def compare_table(rows: list[dict[str, Any]]) -> Table:
    """A rich table of :func:`compare` rows (the reference first).

    :param rows: :func:`compare`'s rows.
    :returns: the table, captioned in red when the reference fails its checks.
    """
    keys = list(next(t.fidelity for t in TASKS.values() if t.fidelity[0] in rows[0]))
    keys += [k for k in METRIC_KEYS if any(k in r for r in rows)]
    check = rows[0].get("reference_check", "")
    failing = check.startswith("FAILS")
    caption = f"REFERENCE {escape(check)}: every figure carries its error" if failing else None
    table = Table(title=escape(f"against {rows[0]['label']} (test inputs)"), title_justify="left",
                  caption=caption, caption_style="bold red", caption_justify="left")
    table.add_column("run")
    for key in keys:
        table.add_column(key, justify="right")
    for row in rows:
        table.add_row(escape(row["label"] + (" (reference)" if row["reference"] else "")),
                      *(fmt(row.get(k), 4) for k in keys))
    return table
