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

from zoo.data.base import Dataset
from zoo.diagnostics.checks import fmt, jsonable, method_label
from zoo.diagnostics.inference_data import as_numpy
from zoo.errors import ZooInputError
from zoo.likelihoods import PredictiveDraws
from zoo.pipeline import load_run
from zoo.plots import new_figure, save_figure
from zoo.posterior import Posterior
from zoo.runs import METRICS_FILE
from zoo.tasks import TASKS, Classification, task_of

COMPARE_PLOT = "compare.png"
COMPARE_DRAWS = 200
METRIC_KEYS = ("accuracy", "nll", "ece", "rmse", "test_ll")


@dataclass
class RunPredictive:
    """One run's predictive on its test inputs: what its task compares (:meth:`zoo.tasks.Task.comparison_draws`:
    y samples ``[R, B]`` in original units for regression, the mean class probabilities ``[B, C]`` for
    classification)."""

    run_dir: Path
    label: str
    data: Dataset
    metrics: dict[str, float]
    posterior: Posterior | None = None
    pred: PredictiveDraws | None = None  # the draws the comparison is made of, for further figures
    draws: np.ndarray | None = None


def run_predictive(run_dir: str | Path, num_samples: int = COMPARE_DRAWS) -> RunPredictive:
    """The predictive of a run at its test inputs, seeded by the run's seed (the same run gives the same draws)."""
    if num_samples < 1:
        raise ZooInputError("--samples", num_samples, "use a positive number of posterior draws")
    run = Path(run_dir)
    spec, data, posterior = load_run(run)
    pyro.set_rng_seed(spec.seed + 1)
    pred = posterior.predict(data.x_test, draws=posterior.sample(num_samples))
    metrics_path = run / METRICS_FILE
    stored = json.loads(metrics_path.read_text()) if metrics_path.exists() else {}
    metrics = {k: stored[k] for k in METRIC_KEYS if k in stored}
    return RunPredictive(run, f"{run.name} ({method_label(spec)})", data, metrics, posterior, pred,
                         task_of(data).comparison_draws(pred, data, spec.seed + 2))


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
            out_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """Rows comparing runs' test-set predictives with a reference run's (the first row is the reference itself).

    Classification: ``agreement`` (argmax of the mean predictive matches the reference's) and ``tv`` (mean total
    variation between mean predictive class distributions). Regression: ``coverage_95`` (reference predictive mass
    inside the run's central 95% interval, averaged over test inputs; 0.95 is ideal) and ``w1`` (mean Wasserstein-1
    distance between predictive marginals of y, original units). Each row also has the run's stored test metrics.
    With ``out_dir``, a plot is written to ``out_dir/compare.png`` (``rows[0]["plot"]``).
    """
    cache: dict[Path, RunPredictive] = {}

    def get(path: str | Path) -> RunPredictive:
        key = Path(path).resolve()
        if key not in cache:
            cache[key] = run_predictive(path, num_samples)
        return cache[key]

    return compare_predictives(get(reference_dir), [get(p) for p in run_dirs], out_dir)


def compare_predictives(reference: RunPredictive, runs: Sequence[RunPredictive],
                        out_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """:func:`compare` on predictives already drawn (by :func:`run_predictive`)."""
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
        rows[0]["plot"] = str(plot_compare(reference, runs, rows, per_input, Path(out_dir) / COMPARE_PLOT))
    return rows


def plot_compare(reference: RunPredictive, runs: list[RunPredictive], rows: list[dict[str, Any]],
                 per_input: list[np.ndarray], path: Path) -> Path:
    """Regression: predictive mean +- 2 sd of each run over a 1-D input (else W1 per test input); classification:
    agreement and total variation per run."""
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
        return save_figure(fig, path)
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
    return save_figure(fig, path)


def compare_table(rows: list[dict[str, Any]]) -> Table:
    """A rich table of :func:`compare` rows (the reference first)."""
    keys = list(next(t.fidelity for t in TASKS.values() if t.fidelity[0] in rows[0]))
    keys += [k for k in METRIC_KEYS if any(k in r for r in rows)]
    table = Table(title=escape(f"against {rows[0]['label']} (test inputs)"), title_justify="left")
    table.add_column("run")
    for key in keys:
        table.add_column(key, justify="right")
    for row in rows:
        table.add_row(escape(row["label"] + (" (reference)" if row["reference"] else "")),
                      *(fmt(row.get(k), 4) for k in keys))
    return table
