"""How far fits' predictive distributions on the test inputs are from a reference's (an exact sampler's draws:
HMC/NUTS): coverage of the reference's predictive of y and the 1-Wasserstein distance to it (regression), agreement
and total variation (classification), next to each fit's own test metrics and fit time. :func:`compare` takes fitted
:class:`zoo.BNN` objects or run directories alike and returns a :class:`Comparison` (a pandas table, a plot, HTML in
a notebook, markdown); ``zoo compare`` prints and plots the same.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyro
from matplotlib.figure import Figure
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.table import Table

from zoo import registry
from zoo.bnn import BNN, Rows
from zoo.data.base import Dataset
from zoo.diagnostics.checks import fmt, jsonable, method_label
from zoo.errors import ZooInputError
from zoo.evaluate import check_draws_fit
from zoo.inference_data import as_numpy
from zoo.likelihoods import PredictiveDraws
from zoo.nets import ModuleNetSpec
from zoo.plots import new_figure, save_figure
from zoo.posterior import Posterior
from zoo.runs import METRICS_FILE, SPEC_FILE, refuse_to_replace
from zoo.tasks import TASKS, Classification, task_of

COMPARE_PLOT = "compare.png"
COMPARE_MARK = "written by zoo compare"  # in compare.png's zoo text chunk: what lets a rerun replace it
ROW_KEYS = ("run", "label", "reference", "reference_check")  # what every row of zoo compare's JSON holds
COMPARE_DRAWS = 200
METRIC_KEYS = ("accuracy", "nll", "ece", "rmse", "test_ll", "train_seconds")
PRIOR_SCALE_FIELD = "inference.prior_scale_factor"
PRIOR_KEY = "prior_scale_factor"  # a row's column where a fit's priors are not the reference's
Fit = BNN | str | Path  # a fitted BNN, or the run directory of one


@dataclass
class RunPredictive:
    """One fit's predictive on the compared test inputs: what its task compares
    (:meth:`zoo.tasks.Task.comparison_draws`:
    y samples ``[R, B]`` in original units for regression, the mean class probabilities ``[B, C]`` for
    classification).

    :param run_dir: the fit's run directory (None: a fit kept in memory).
    :param label: the fit's name in tables and plots.
    :param data: the fit's data set, with the compared rows as its test rows.
    :param metrics: the fit's test metrics (``accuracy``, ``nll``, ``ece``, ``rmse``, ``test_ll``, where recorded)
        and its fit time (``train_seconds``).
    :param posterior: the fit's posterior.
    :param pred: the per-draw predictive distributions at the test inputs.
    :param draws: what the task compares, as above.
    :param digests: the digests of the rows it was fitted on and compared on (:meth:`zoo.data.base.Dataset.digests`).
    :param net: what the fit's net is (its class or spec section, and its parameters' shapes).
    :param prior_scale_factor: the factor its weights' priors were widened by (:func:`prior_widening`).
    """

    run_dir: Path | None
    label: str
    data: Dataset
    metrics: dict[str, float]
    posterior: Posterior | None = None
    pred: PredictiveDraws | None = None  # the draws the comparison is made of, for further figures
    draws: np.ndarray | None = None
    digests: dict[str, str] = field(default_factory=dict)
    net: str = ""
    prior_scale_factor: float = 1.0


def prior_widening(bnn: BNN) -> float:
    """The factor a fit widened its weights' priors by for its posterior (``inference.prior_scale_factor``, given or
    chosen on its validation rows; 1: the spec's priors). A Laplace member's MAP phase (``model.map``) is not its
    posterior's prior, so it does not count.

    :param bnn: the fitted BNN.
    :returns: the factor.
    """
    chosen = bnn.chosen.get(PRIOR_SCALE_FIELD)
    given = getattr(bnn.spec.inference, "prior_scale_factor", None)
    return float(chosen if chosen is not None else given if given is not None else 1.0)


def net_identity(bnn: BNN) -> str:
    """What a fit's net is, for telling nets apart: a module's class and its parameters' names and shapes, or a named
    net's spec section.

    :param bnn: the fit.
    :returns: the description.
    """
    section = bnn.spec.net
    if isinstance(section, ModuleNetSpec) and section.module is not None:
        shapes = ", ".join(f"{name} {tuple(p.shape)}" for name, p in section.module.named_parameters())
        return f"{section.target} ({shapes})"
    return json.dumps(section.model_dump(mode="json", exclude={"weights"}), sort_keys=True)


def fit_predictive(bnn: BNN, label: str, num_samples: int = COMPARE_DRAWS, test: Rows | Dataset | None = None,
                   metrics: dict[str, float] | None = None) -> RunPredictive:
    """The predictive of a fitted BNN at its test inputs (or at ``test``), seeded by its seed (the same fit gives the
    same draws, in memory or read back from its run directory).

    :param bnn: the fitted BNN.
    :param label: its name in tables and plots.
    :param num_samples: posterior draws.
    :param test: the rows to compare on (None: the fit's own test rows, its ``val``).
    :param metrics: the test metrics it recorded (None: ``bnn.metrics``); with ``test``, only their fit time is kept
        and the rest are scored on ``test``.
    :returns: the fit's predictive, metrics and identity.
    :raises ZooInputError: ``num_samples`` below 1 or more than fit in memory; a fit without test rows.
    """
    if num_samples < 1:
        raise ZooInputError("--samples", num_samples, "use a positive number of posterior draws")
    spec, posterior = bnn.spec, bnn.posterior
    data = bnn.data if test is None else bnn.test_set(test)
    digests = bnn.data_digests if test is None else data.digests()
    if not len(data.y_test):
        raise ZooInputError("test", label, "has no test rows to compare on: fit it with val=(x, y), or pass "
                            "test=(x, y) to compare every fit on those rows (a run of data given in Python keeps no "
                            "rows, so its run directory needs test=)")
    metrics = bnn.metrics if metrics is None else metrics
    if test is not None:  # scored on the compared rows; the fit time is the fit's own
        metrics = {**bnn.evaluate(test), **{k: v for k, v in metrics.items() if k == "train_seconds"}}
    check_draws_fit(posterior, data, num_samples)
    pyro.set_rng_seed(spec.seed + 1)
    pred = posterior.predict(data.x_test, num_samples, draws=posterior.scoring_draws(num_samples))
    return RunPredictive(bnn.run_dir, label, data, {k: metrics[k] for k in METRIC_KEYS if k in metrics}, posterior,
                         pred, task_of(data).comparison_draws(pred, data, spec.seed + 2), digests, net_identity(bnn),
                         prior_widening(bnn))


def run_label(run: Path, spec) -> str:
    """How a fit with a run directory is named: the directory's name and the method (``mf (svi/mean_field)``).

    :param run: the run directory.
    :param spec: its spec.
    :returns: the label.
    """
    return f"{run.name} ({method_label(spec)})"


def run_predictive(run_dir: str | Path, num_samples: int = COMPARE_DRAWS, test: Rows | None = None
                   ) -> RunPredictive:
    """The predictive of a run directory's fit at its test inputs (or at ``test``), with its stored metrics.

    :param run_dir: the run directory.
    :param num_samples: posterior draws.
    :param test: the rows to compare on (None: the run's own test rows).
    :returns: the run's predictive and stored metrics.
    :raises ZooInputError: when ``num_samples`` is below 1 or would not fit in memory, or ``run_dir`` holds no run
        that can be loaded.
    """
    if num_samples < 1:
        raise ZooInputError("--samples", num_samples, "use a positive number of posterior draws")
    run = Path(run_dir)
    bnn = BNN.load(run)
    return fit_predictive(bnn, run_label(run, bnn.spec), num_samples, test, _stored_metrics(run))


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
    """Whether a fit can serve as a reference: an exact sampler's draws (NUTS/HMC) that pass ``zoo diagnose
    --strict``. ``problems`` says why not, one reason per line; empty when it can.

    :param run_dir: the run directory (None: a fit kept in memory).
    :param method: how the fit was made (its method label).
    :param problems: why it cannot serve, one reason each; empty when it can.
    """

    run_dir: Path | None
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


def standing_of(bnn: BNN, test: Rows | None = None) -> ReferenceStanding:
    """Check that a fit is a reference a comparison may trust: an exact sampler's draws (not SVI, SWAG, SG-MCMC or
    Laplace, whose own error is what a comparison measures) that pass every ``zoo diagnose --strict`` check
    (function-space R-hat, bulk/tail ESS, divergences, BFMI: ``bnn.diagnose()``). Writes nothing.

    :param bnn: the fitted BNN.
    :param test: rows to take its function-space summaries at (None: its own test rows).
    :returns: its standing, with the failed checks (or the reason it is no exact sampler) as ``problems``.
    """
    spec = bnn.spec
    label = method_label(spec)
    if not registry.method_of(spec).exact:
        exact = registry.METHODS.names_where(lambda m: m.exact)
        return ReferenceStanding(bnn.run_dir, label, [f"{label} is not an exact sampler; a reference must be draws "
                                                      f"of {' or '.join(exact)}"])
    return ReferenceStanding(bnn.run_dir, label, bnn.diagnose(test=test).warnings)


def reference_standing(run_dir: str | Path) -> ReferenceStanding:
    """:func:`standing_of` the fit a run directory holds.

    :param run_dir: the run directory.
    :returns: its standing.
    :raises ZooInputError: when ``run_dir`` holds no run that can be loaded.
    """
    return standing_of(BNN.load(run_dir))


def _refuse_untrusted(standing: ReferenceStanding, name: str, field_name: str = "reference") -> None:
    raise ZooInputError(field_name, name, "", message=(
        f"{field_name} {name} cannot be trusted as a reference: {'; '.join(standing.problems)}. Train an exact "
        "sampler (nuts or hmc) with more warm-up, draws or chains until zoo diagnose --strict passes (zoo.reference "
        "grows one until it does), or pass --allow-unconverged (Python: allow_unconverged=True) to compare anyway, "
        "the reference marked as failing"))


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
        _refuse_untrusted(standing, str(run_dir), field)
    return standing


def _same_fit_of_the_same_data(reference: RunPredictive, run: RunPredictive, same_net: bool = True) -> None:
    """Refuse ``run`` where it was fitted on other rows, compared on other rows or (``same_net``) made of another
    net than the reference, naming which."""
    a, b = reference.data, run.data
    differ = []
    if a.task != b.task:
        differ.append(f"its task is {b.task}, the reference's {a.task}")
    for rows, what in (("train", "training rows"), ("test", "test rows")):
        mine, theirs = run.digests.get(rows), reference.digests.get(rows)
        if mine and theirs and mine != theirs:
            counts = (f"{b.n_train} vs {a.n_train}" if rows == "train" else f"{len(b.y_test)} vs {len(a.y_test)}")
            differ.append(f"its {what} differ from the reference's ({counts} rows, or other values)")
    if a.x_test.shape[1:] != b.x_test.shape[1:] or len(a.y_test) != len(b.y_test):
        differ.append(f"its test inputs are {tuple(b.x_test.shape)}, the reference's {tuple(a.x_test.shape)}")
    other_net = same_net and reference.net and run.net and reference.net != run.net
    if other_net:
        differ.append(f"its net is {run.net}, the reference's {reference.net}")
    if differ:
        raise ZooInputError("fit" if run.run_dir is None else "RUN", run.label,
                            f"cannot be compared with the reference {reference.label}: "
                            f"{'; '.join(dict.fromkeys(differ))}. Compare fits of the same net on the same data (the "
                            "same rows, split and seed), or pass test=(x, y) to compare every fit on those rows"
                            + ("; to compare another net on purpose, pass allow_other_nets=True (zoo compare "
                               "--allow-other-nets)" if other_net else ""))

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


def compare_predictives(reference: RunPredictive, runs: Sequence[RunPredictive], same_net: bool = True
                        ) -> tuple[list[dict[str, Any]], list[np.ndarray]]:
    """The rows of :func:`compare` on predictives already drawn (:func:`fit_predictive`), without the reference's
    check.

    :param reference: the reference's predictive.
    :param runs: the predictives to compare with it.
    :param same_net: refuse a fit of another net than the reference's.
    :returns: one row per fit, the reference first (``reference_check`` not included), and per fit the task's
        figure along the test inputs ``[B]`` (W1 for regression, TV for classification).
    :raises ZooInputError: when a fit was made of another net, or on other data, than the reference.
    """
    runs = list(runs)
    for run in runs:
        _same_fit_of_the_same_data(reference, run, same_net)
    other_priors = any(run.prior_scale_factor != reference.prior_scale_factor for run in runs)
    rows, per_input = [], []
    for run, is_reference in [(reference, True)] + [(r, False) for r in runs]:
        row: dict[str, Any] = {"run": "" if run.run_dir is None else str(run.run_dir), "label": run.label,
                               "reference": is_reference}
        figures, along_inputs = task_of(reference.data).compare(run.draws, reference.draws)
        row.update(figures)
        per_input.append(along_inputs)
        row.update(run.metrics)
        if other_priors:  # another prior is another posterior: the figures measure that too
            row[PRIOR_KEY] = run.prior_scale_factor
        rows.append(jsonable(row))
    return rows, per_input


def _labelled(fits: Sequence[Fit], named: dict[str, Fit]) -> list[tuple[Fit, str | None]]:
    """The fits with the labels given to them (keyword names; None: their own), refusing what is not a fit."""
    everything = [(f, None) for f in fits] + [(f, name) for name, f in named.items()]
    for fit, _ in everything:
        if isinstance(fit, list | tuple):
            raise TypeError("compare(reference, *fits): give the fits one by one, compare(ref, a, b), or unpack a "
                            "list, compare(ref, *fits)")
        if not isinstance(fit, BNN | str | Path):
            raise TypeError(f"compare: a fit is a zoo.BNN or the run directory of one (a str or Path), got "
                            f"{type(fit).__name__}")
    for fit, _ in everything:
        if not isinstance(fit, BNN) and not (Path(fit) / SPEC_FILE).is_file():  # before the reference's checks
            raise ZooInputError("RUN", str(fit), "not a run directory (it has no spec.yaml)")
    return everything


def compare(reference: Fit, *fits: Fit, test: Rows | None = None, num_samples: int = COMPARE_DRAWS,
            allow_unconverged: bool = False, allow_other_nets: bool = False, **named: Fit) -> Comparison:
    """How far each fit's test predictive is from the reference's: fitted :class:`zoo.BNN` objects or run
    directories, alike (``zoo compare`` on the command line).

    The reference must be an exact sampler's draws that pass ``zoo diagnose --strict`` (:func:`standing_of`; what
    :func:`zoo.reference` grows); any other is refused, unless ``allow_unconverged``, when every row carries
    ``reference_check: "FAILS: ..."``. Every fit must be of the same net as the reference, fitted on the same
    training rows and compared on the same test rows (its ``val``, or ``test`` for all); what differs is named.

    Classification: ``agreement`` (argmax of the mean predictive matches the reference's) and ``tv`` (mean total
    variation between mean predictive class distributions). Regression: ``coverage_95`` (reference predictive mass
    inside the fit's central 95% interval, averaged over test inputs; 0.95 is ideal) and ``w1`` (mean
    Wasserstein-1 distance between predictive marginals of y, original units). Each row also has the fit's test
    metrics and its fit time (``train_seconds``).

    :param reference: the reference: a fitted BNN or its run directory.
    :param fits: the fits to compare with it, each a fitted BNN or its run directory (named by their run
        directory, else their member or method).
    :param test: rows ``(x, y)`` to compare every fit on, as :meth:`zoo.BNN.evaluate` takes them (None: the fits'
        own test rows, which must be the same).
    :param num_samples: posterior draws per fit, seeded by each fit's seed.
    :param allow_unconverged: compare against a reference that cannot be trusted instead of refusing it.
    :param allow_other_nets: compare fits of another net than the reference's (the difference in nets is then part
        of what the figures measure) instead of refusing them.
    :param named: more fits, each named by its keyword (``mean_field=bnn``).
    :returns: the :class:`Comparison`.
    :raises TypeError: a fit that is neither a BNN nor a path, or a list of them not unpacked.
    :raises ZooInputError: a path that is not a run, an unfitted BNN, ``num_samples`` below 1, a reference that
        cannot be trusted (without ``allow_unconverged``), or a fit of another net or other data than the
        reference's.
    """
    everything = _labelled([reference, *fits], named)
    if num_samples < 1:
        raise ZooInputError("--samples", num_samples, "use a positive number of posterior draws")
    loaded = [(f if isinstance(f, BNN) else BNN.load(f), f, name) for f, name in everything]
    ref_bnn, ref_source, _ = loaded[0]
    standing = standing_of(ref_bnn, test)
    if not standing.trusted and not allow_unconverged:
        if isinstance(ref_source, BNN):
            _refuse_untrusted(standing, ref_bnn.label)
        _refuse_untrusted(standing, str(ref_source), "REFERENCE_RUN")  # a run directory: zoo compare's argument
    predictives, taken = [], {}
    for bnn, source, name in loaded:
        label = name or (run_label(bnn.run_dir, bnn.spec) if bnn.run_dir is not None else bnn.label)
        taken[label] = taken.get(label, 0) + 1
        label = label if taken[label] == 1 else f"{label} #{taken[label]}"
        stored = None if isinstance(source, BNN) else _stored_metrics(Path(source))
        predictives.append(fit_predictive(bnn, label, num_samples, test, stored))
    rows, per_input = compare_predictives(predictives[0], predictives[1:], same_net=not allow_other_nets)
    rows = [{**row, "reference_check": standing.column()} for row in rows]
    return Comparison(rows, standing, predictives[0], predictives[1:], per_input)


@dataclass
class Comparison:
    """What :func:`compare` found: one row per fit, the reference first.

    In a notebook it shows as its table (HTML, captioned in red when the reference fails its checks); ``rich.print``
    shows it as ``zoo compare`` prints it.

    :param rows: one dict per fit (what ``zoo compare --json`` writes): ``run``, ``label``, ``reference``, the
        task's figures, the test metrics, ``train_seconds`` and ``reference_check``.
    :param standing: the reference's standing.
    :param reference: the reference's predictive.
    :param fits: the compared fits' predictives.
    :param per_input: per fit, the reference first, the task's figure along the test inputs.
    """

    rows: list[dict[str, Any]]
    standing: ReferenceStanding
    reference: RunPredictive
    fits: list[RunPredictive]
    per_input: list[np.ndarray]

    @property
    def table(self) -> pd.DataFrame:
        """The rows as a DataFrame indexed by label: the task's figures against the reference (``w1`` and
        ``coverage_95``, or ``agreement`` and ``tv``), the test metrics and ``train_seconds``; the reference's
        standing in ``.attrs["reference_check"]``."""
        keys = _columns(self.rows)
        frame = pd.DataFrame([{k: row.get(k) for k in keys} for row in self.rows],
                             index=pd.Index([r["label"] for r in self.rows], name="fit"), columns=keys, dtype=float)
        frame.insert(0, "reference", [bool(r["reference"]) for r in self.rows])
        frame.attrs["reference_check"] = self.standing.column()
        return frame

    def caption(self) -> str:
        """One line on the reference: what it is and whether it passed its checks.

        :returns: the line.
        """
        return (f"against {self.rows[0]['label']} (test inputs): reference {self.standing.column()}"
                + (f"; {other}" if (other := other_priors_note(self.rows)) else ""))

    def to_markdown(self) -> str:
        """The table as markdown (a results page's), with the caption line under it.

        :returns: the markdown.
        """
        return f"{self.table.to_markdown(floatfmt='.4g')}\n\n{self.caption()}\n"

    def plot(self, path: str | Path | None = None) -> Figure:
        """Regression: each fit's predictive mean ± 2 sd against the reference's band over a 1-D input, and W1 along
        the inputs (W1 per test input otherwise); classification: agreement and total variation per fit.

        :param path: also write the figure there (a PNG that ``zoo compare`` may replace); None: only return it.
        :returns: the figure.
        """
        fig = compare_figure(self.reference, self.fits, self.rows, self.per_input)
        if path is not None:
            save_figure(fig, Path(path), COMPARE_MARK, close=False)
        return fig

    def _repr_html_(self) -> str:
        color = "#b00" if not self.standing.trusted else "inherit"
        return (f'<p style="color:{color}">{html.escape(self.caption())}</p>'
                + self.table.to_html(float_format=lambda v: f"{v:.4g}"))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield compare_table(self.rows)


def _columns(rows: list[dict[str, Any]]) -> list[str]:
    """The task's figures, then the metrics any row holds, then the priors' factor where a fit's is not the
    reference's."""
    keys = list(next(t.fidelity for t in TASKS.values() if t.fidelity[0] in rows[0]))
    return keys + [k for k in (*METRIC_KEYS, PRIOR_KEY) if any(k in r for r in rows)]


def other_priors_note(rows: list[dict[str, Any]]) -> str:
    """A line naming the fits whose priors are not the reference's (a factor chosen on their validation rows, say),
    and what to change to compare the reference's posterior; empty where every prior is the reference's.

    :param rows: :func:`compare`'s rows, the reference first.
    :returns: the line.
    """
    if PRIOR_KEY not in rows[0]:
        return ""
    theirs = rows[0][PRIOR_KEY]
    others = ", ".join(f"{r['label']} ×{r[PRIOR_KEY]:g}" for r in rows[1:] if r[PRIOR_KEY] != theirs)
    return (f"priors widened unlike the reference's (×{theirs:g}): {others}; these fits approximate another posterior "
            f"(fit them with {PRIOR_SCALE_FIELD}: {theirs:g} to approximate the reference's)")


def compare_figure(reference: RunPredictive, runs: list[RunPredictive], rows: list[dict[str, Any]],
                   per_input: list[np.ndarray]) -> Figure:
    """Regression: predictive mean +- 2 sd of each fit over a 1-D input (else W1 per test input); classification:
    agreement and total variation per fit.

    :param reference: the reference's predictive.
    :param runs: the compared fits' predictives.
    :param rows: :func:`compare_predictives`' rows (the reference first).
    :param per_input: per fit, the reference first, the task's figure along the test inputs ``[B]`` (W1 for
        regression).
    :returns: the figure.
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
        return fig
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
    return fig




def compare_table(rows: list[dict[str, Any]]) -> Table:
    """A rich table of :func:`compare` rows (the reference first).

    :param rows: :func:`compare`'s rows.
    :returns: the table, captioned in red when the reference fails its checks.
    """
    keys = _columns(rows)
    check = rows[0].get("reference_check", "")
    failing = check.startswith("FAILS")
    notes = [f"REFERENCE {check}: every figure carries its error"] if failing else []
    notes += [other] if (other := other_priors_note(rows)) else []
    caption = escape("\n".join(notes)) if notes else None
    table = Table(title=escape(f"against {rows[0]['label']} (test inputs)"), title_justify="left",
                  caption=caption, caption_style="bold red", caption_justify="left")
    table.add_column("run")
    for key in keys:
        table.add_column(key, justify="right")
    for row in rows:
        table.add_row(escape(row["label"] + (" (reference)" if row["reference"] else "")),
                      *(fmt(row.get(k), 4) for k in keys))
    return table
