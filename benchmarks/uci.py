"""UCI regression benchmark: train one spec on every split of each data set, RMSE and test LL as mean ± s.e.

For each data set and split the spec is trained with ``data.name=uci:<dataset>``, ``data.split=<split>`` and
``net.hidden`` from the folder's ``n_hidden.txt`` (each hidden layer gets that width; ``--set net.hidden=...``
wins). Runs go through ``zoo.pipeline.train`` into throw-away temporary directories, so nothing is left behind
but the printed table and, with ``--json``, one results file; ``--runs-dir DIR`` keeps them instead, as
``DIR/<dataset>-split<NN>``, for ``zoo report DIR/* --group-by label --out report.md``. The table sets the
figures next to the published PBP, MC-dropout and deep-ensembles results.

    python benchmarks/uci.py --spec configs/mean_field_uci.yaml --datasets bostonHousing --splits 0-19 \\
        [--data-dir DIR] [--json PATH] [--set key=value ...] [--workers N] [--threads N] [--runs-dir DIR]

Data directory: ``--data-dir``, else ``$ZOO_DATA_DIR``, else ``../shared/data/uci`` next to the repository.
Tuning: ``--tune SPACE.yaml --trials N`` first runs, per data set, a ``zoo sweep`` of SPACE on validation rows carved
from the TRAINING rows of ``--tune-splits`` (``--tune-validation`` of them, 0.2 by default; with several splits each
trial is scored by its mean over them), then the splits with the chosen settings (as the published protocols chose
theirs per data set). ``--tune-each-split`` instead sweeps every split on validation rows of its own training rows
and runs it with its own choice, as Gal & Ghahramani's grid search did: no sweep then scores a row that its split
tests on, nor any other split's rows. By hand, ``--set
data.validation_fraction=0.2`` evaluates on those validation rows instead of the test rows (the table then says
"validation").
A stopped run continues with the same command plus ``--resume`` (it needs ``--runs-dir``): finished sweeps run no
trial again (their wall time is kept), finished splits are read back and cut-off ones continue from their checkpoint.
Standard errors are std / sqrt(n) with the population std (ddof=0), as in the PBP / MC-dropout benchmark code.

A split whose fit diverges (or ends with a non-finite RMSE or test LL), and every split of a data set whose sweep
completed no trial, is a failed split: the other splits still run, the table's row says "n=18, 2 failed" and lists
each failure with its reason below the table, the JSON gives it under the data set's ``failed_splits`` (and in the
top-level ``failed`` list), and the means are over the splits that finished. Exit status: 0 when every split ran;
1 when one failed, after the table and the JSON are written (so that a script notices an incomplete benchmark
without losing the finished splits); 2 on bad input, before anything runs.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import mean_se_cell, parse_ranges  # noqa: E402 - sibling module of this script

from zoo import registry  # noqa: E402
from zoo.errors import TrainingDiverged, ZooInputError, ZooWarning  # noqa: E402
from zoo.exits import exit_code  # noqa: E402
from zoo.metrics import mean_and_standard_error  # noqa: E402

if TYPE_CHECKING:
    from zoo.spec import RunSpec

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "data" / "uci"

# Published results on the same 20 splits, one hidden layer of 50 units (100 for protein/year, not listed here):
# (mean, ±) of RMSE and test log-likelihood (per point, original units).
#   pbp:       Hernández-Lobato & Adams 2015, "Probabilistic Backpropagation for Scalable Learning of Bayesian
#              Neural Networks", ICML, Table 2 (± is the standard error).
#   dropout:   Gal & Ghahramani 2016, "Dropout as a Bayesian Approximation", ICML, Table 1 (40 epochs). The paper
#              prints the standard deviation over splits (bostonHousing 2.97 ± 0.85 / -2.46 ± 0.25); the ± here
#              is the standard error that the authors' repository (yaringal/DropoutUncertaintyExps, readme)
#              gives for the same runs, i.e. that std / sqrt(20).
#   ensembles: Lakshminarayanan, Pritzel & Blundell 2017, "Simple and Scalable Predictive Uncertainty Estimation
#              using Deep Ensembles", NeurIPS, Table 1 (5 nets, adversarial training); test LL = -NLL. The ± is as
#              printed there; it is as wide as a standard deviation over splits (bostonHousing RMSE ± 1.00), so
#              it is not directly comparable with the standard errors of the other columns.
PUBLISHED: dict[str, dict[str, dict[str, tuple[float, float]]]] = {
    "bostonHousing": {
        "pbp": {"rmse": (3.01, 0.18), "test_ll": (-2.57, 0.09)},
        "dropout": {"rmse": (2.97, 0.19), "test_ll": (-2.46, 0.06)},
        "ensembles": {"rmse": (3.28, 1.00), "test_ll": (-2.41, 0.25)},
    },
    "concrete": {
        "pbp": {"rmse": (5.67, 0.09), "test_ll": (-3.16, 0.02)},
        "dropout": {"rmse": (5.23, 0.12), "test_ll": (-3.04, 0.02)},
        "ensembles": {"rmse": (6.03, 0.58), "test_ll": (-3.06, 0.18)},
    },
    "energy": {
        "pbp": {"rmse": (1.80, 0.05), "test_ll": (-2.04, 0.02)},
        "dropout": {"rmse": (1.66, 0.04), "test_ll": (-1.99, 0.02)},
        "ensembles": {"rmse": (2.09, 0.29), "test_ll": (-1.38, 0.22)},
    },
    "kin8nm": {
        "pbp": {"rmse": (0.10, 0.00), "test_ll": (0.90, 0.01)},
        "dropout": {"rmse": (0.10, 0.00), "test_ll": (0.95, 0.01)},
        "ensembles": {"rmse": (0.09, 0.00), "test_ll": (1.20, 0.02)},
    },
    "power-plant": {
        "pbp": {"rmse": (4.12, 0.03), "test_ll": (-2.84, 0.01)},
        "dropout": {"rmse": (4.02, 0.04), "test_ll": (-2.80, 0.01)},
        "ensembles": {"rmse": (4.11, 0.17), "test_ll": (-2.79, 0.04)},
    },
    "wine-quality-red": {
        "pbp": {"rmse": (0.64, 0.01), "test_ll": (-0.97, 0.01)},
        "dropout": {"rmse": (0.62, 0.01), "test_ll": (-0.93, 0.01)},
        "ensembles": {"rmse": (0.64, 0.04), "test_ll": (-0.94, 0.12)},
    },
}
METHOD_NAMES = {"pbp": "PBP (2015)", "dropout": "MC dropout (2016)", "ensembles": "deep ensembles (2017)"}
SPREAD = {"pbp": "standard error", "dropout": "standard error (authors' repository)",
          "ensembles": "as printed in the paper (about a standard deviation over splits)"}


# ------------------------------------------------------------------------------------------------ arguments
def parse_splits(text: str) -> list[int]:
    """``0-19``, ``0,3,5``, ``3`` or a mix (``0-4,7``) as a sorted list of distinct split indices."""
    return sorted(set(parse_ranges(text, "--splits", "split", "0-19, 0,3,5 or 3")))


def parse_datasets(text: str) -> list[str]:
    """Comma-separated folder names, order kept, duplicates dropped."""
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    if not names:
        raise ZooInputError("--datasets", text, "name at least one UCI folder, e.g. bostonHousing,concrete")
    return list(dict.fromkeys(names))


def resolve_data_dir(explicit: str | None) -> Path:
    """``--data-dir``, else ``$ZOO_DATA_DIR``, else ``../shared/data/uci`` beside the repository if it exists."""
    from zoo.data.uci import ENV_VAR
    from zoo.data.uci import resolve_data_dir as resolve

    if explicit or os.environ.get(ENV_VAR):
        return resolve(explicit).resolve()
    if DEFAULT_DATA_DIR.is_dir():
        return DEFAULT_DATA_DIR.resolve()
    raise ZooInputError("--data-dir", None, f"pass --data-dir DIR, set {ENV_VAR}, or provide {DEFAULT_DATA_DIR}")


def _user_set(overrides: list[str], key: str) -> bool:
    return any(o.partition("=")[0].strip() == key for o in overrides)


# ------------------------------------------------------------------------------------------------ one split
def finished_run(spec: RunSpec, run_dir: Path) -> dict | None:
    """A kept run of ``spec`` that finished (its metrics written) as :func:`run_split`'s result, else None; a run
    dir holding another spec is refused rather than silently mixed into the table."""
    from zoo.pipeline import holds_another_spec
    from zoo.runs import METRICS_FILE, SPEC_FILE

    if not (run_dir / SPEC_FILE).is_file():
        return None
    if holds_another_spec(run_dir, spec):  # the data may live elsewhere now
        raise ZooInputError("--resume", str(run_dir), "holds a run of another spec (other --set, --tune choices or "
                            "config): resume with the same command, or pick a new --runs-dir")
    if not (run_dir / METRICS_FILE).is_file():
        return None
    metrics = json.loads((run_dir / METRICS_FILE).read_text())
    return {"rmse": float(metrics["rmse"]), "test_ll": float(metrics["test_ll"]),
            "seconds": float(metrics["train_seconds"]), "train_seconds": float(metrics["train_seconds"]),
            "converged": mcmc_verdict(spec, run_dir), "reused": True}


def mcmc_verdict(spec: RunSpec, run_dir: Path) -> bool | None:
    """Whether an MCMC run's draws pass ``zoo diagnose --strict`` (as ``zoo train`` ends one); None for the other
    methods."""
    if not registry.method_of(spec).exact:
        return None
    from zoo.diagnostics import diagnose

    return not diagnose(run_dir, plots=False)["warnings"]


def run_split(spec_path: str, overrides: list[str], threads: int | None = None,
              run_dir: str | None = None, resume: bool = False) -> dict[str, float]:
    """Train the spec with ``overrides`` into ``run_dir`` (default: a temporary directory); its rmse, test_ll and
    timings. With ``resume``, a finished run kept in ``run_dir`` is read back (its wall time is then its training
    time) and one that was cut off continues from its checkpoint.

    ``threads`` caps torch's intra-op threads (a 50-unit net gains nothing from more, and loses a lot when the
    cores are shared); the previous setting is restored afterwards.
    """
    import torch

    from zoo.pipeline import train
    from zoo.runs import SPEC_FILE
    from zoo.spec import load_spec

    spec = load_spec(spec_path, overrides)
    if run_dir is not None and resume:
        finished = finished_run(spec, Path(run_dir))
        if finished is not None:
            return finished
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="zoo-uci-") as tmp:  # where the run goes unless it is kept
            summary = train(spec, run_dir or Path(tmp) / "run", progress=False, echo=None,
                            resume=resume and run_dir is not None and Path(run_dir, SPEC_FILE).is_file())
            converged = mcmc_verdict(spec, summary.run_dir)  # before the temporary directory goes
    finally:
        torch.set_num_threads(before)
    return {"rmse": float(summary.metrics["rmse"]), "test_ll": float(summary.metrics["test_ll"]),
            "seconds": time.perf_counter() - started, "train_seconds": float(summary.metrics["train_seconds"]),
            "converged": converged}


def parse_set_for(pairs: list[str], datasets: list[str]) -> dict[str, list[str]]:
    """``DATASET:KEY=VALUE`` strings as ``{dataset: [KEY=VALUE, ...]}`` for every data set of the run."""
    out: dict[str, list[str]] = {d: [] for d in datasets}
    for pair in pairs:
        dataset, sep, override = pair.partition(":")
        if not sep or "=" not in override:
            raise ZooInputError("--set-for", pair, "write DATASET:KEY=VALUE, e.g. kin8nm:model.map.num_steps=4000")
        if dataset not in out:
            raise ZooInputError("--set-for", pair, f"{dataset} is not one of --datasets: {', '.join(datasets)}")
        out[dataset].append(override)
    return out


def split_run_dir(runs_dir: str | None, dataset: str, split: int) -> str | None:
    """Where ``--runs-dir`` keeps one split's run (``<dataset>-split<NN>``, so ``zoo report --group-by name``
    groups a data set's splits); None without ``--runs-dir``."""
    return None if runs_dir is None else str(Path(runs_dir) / f"{dataset}-split{split:02d}")


def split_overrides(base: list[str], dataset: str, split: int, data_dir: Path, n_hidden: int | None,
                    depth: int) -> list[str]:
    """The user's ``--set`` list plus the data set, split, data directory and (unless set) the protocol width."""
    out = list(base)
    if n_hidden is not None and not _user_set(base, "net.hidden"):
        out.append(f"net.hidden={[n_hidden] * depth}")
    return [*out, f"data.name=uci:{dataset}", f"data.split={split}", f"data.dir={data_dir}"]


# ------------------------------------------------------------------------------------------------ summary
def summarise(dataset: str, splits: list[int], results: dict[int, dict], n_hidden: int | None) -> dict:
    """Per-dataset JSON block: means, standard errors, per-split lists, timings and the published figures, over the
    splits that finished; ``failed_splits`` gives each failed split's reason (a result ``{"failed": reason}``)."""
    failed = {str(s): results[s]["failed"] for s in splits if "failed" in results[s]}
    splits = [s for s in splits if "failed" not in results[s]]
    rmse = [results[s]["rmse"] for s in splits]
    ll = [results[s]["test_ll"] for s in splits]
    seconds = [results[s]["seconds"] for s in splits]
    (rmse_mean, rmse_se), (ll_mean, ll_se) = ((mean_and_standard_error(rmse), mean_and_standard_error(ll)) if splits
                                              else ((None, None), (None, None)))
    published = {m: {"rmse": list(v["rmse"]), "test_ll": list(v["test_ll"]), "spread": SPREAD[m]}
                 for m, v in PUBLISHED.get(dataset, {}).items()}
    return {
        "n_splits": len(splits), "splits": splits, "n_hidden": n_hidden,
        "failed_splits": failed,
        "rmse_mean": rmse_mean, "rmse_se": rmse_se, "test_ll_mean": ll_mean, "test_ll_se": ll_se,
        "rmse": rmse, "test_ll": ll, "seconds": seconds,
        "train_seconds": [results[s]["train_seconds"] for s in splits],
        "seconds_mean": sum(seconds) / len(seconds) if seconds else None, "seconds_total": sum(seconds),
        # --resume: splits read back from an earlier process (their seconds are their training time)
        "reused_splits": sum(bool(results[s].get("reused")) for s in splits),
        "published": published,
        # MCMC: how many splits' draws pass zoo diagnose --strict (None for the other methods)
        "converged_splits": (None if not splits or any(results[s].get("converged") is None for s in splits)
                             else sum(bool(results[s]["converged"]) for s in splits)),
    }


def results_table(summary: dict[str, dict], evaluated_on: str, spec_name: str) -> Table:
    """One block of rows per data set: this spec, then the published methods."""
    what = "VALIDATION rows carved from training" if evaluated_on == "validation" else "test splits"
    table = Table(title=f"UCI regression, {spec_name} ({what}); mean ± s.e. over splits", title_justify="left")
    table.add_column("dataset", style="bold")
    table.add_column("method")
    table.add_column("RMSE", justify="right")
    table.add_column("test LL", justify="right")
    table.add_column("s/split", justify="right")
    mcmc = any(block.get("converged_splits") is not None for block in summary.values())
    if mcmc:
        table.add_column("passes --strict", justify="right")
    for i, (dataset, block) in enumerate(summary.items()):
        if i:
            table.add_section()
        failed = len(block.get("failed_splits") or {})
        what = f"this spec (n={block['n_splits']}" + (f", {failed} failed" if failed else "") + ")"
        if "tuned" in block:
            each = " per split" if block["tuned"].get("each_split") else ""
            what += f", tuned{each} ({block['tuned']['trials']} trials, {block['tuned']['sweep_seconds']:.0f} s)"
        strict = ([f"{block['converged_splits']}/{block['n_splits']}" if block["converged_splits"] is not None
                   else "-"] if mcmc else [])
        if block["n_splits"]:
            table.add_row(dataset, what, mean_se_cell(block["rmse_mean"], block["rmse_se"], 2),
                          mean_se_cell(block["test_ll_mean"], block["test_ll_se"], 2), f"{block['seconds_mean']:.1f}",
                          *strict)
        else:
            table.add_row(dataset, what, "failed", "failed", "", *strict)
        blank = [""] if mcmc else []
        for method, figs in PUBLISHED.get(dataset, {}).items():
            table.add_row("", METHOD_NAMES[method], mean_se_cell(*figs["rmse"], 2),
                          mean_se_cell(*figs["test_ll"], 2), "", *blank)
        if dataset not in PUBLISHED:
            table.add_row("", "published", "-", "-", "", *blank)
    table.caption = "published ± are standard errors, except deep ensembles' (as printed, about a std over splits)"
    return table


# ------------------------------------------------------------------------------------------------ main
def build_parser() -> argparse.ArgumentParser:
    """Command-line arguments of the benchmark."""
    p = argparse.ArgumentParser(prog="benchmarks/uci.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", required=True, help="YAML spec to train (data.name/split/dir are set per run)")
    p.add_argument("--datasets", default="bostonHousing", help="comma-separated UCI folders")
    p.add_argument("--splits", default="0-19", help="0-19, 0,3,5 or 3")
    p.add_argument("--data-dir", help="folder holding the UCI folders (default $ZOO_DATA_DIR, then ../shared/data/uci)")
    p.add_argument("--json", help="write the figures to this JSON file (atomically)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec field")
    p.add_argument("--set-for", action="append", default=[], metavar="DATASET:KEY=VALUE",
                   help="override a spec field for one data set only (after --set), e.g. a longer MAP fit chosen "
                   "on that data set's validation rows: --set-for kin8nm:model.map.num_steps=4000")
    p.add_argument("--workers", type=int, default=1, help="parallel training processes (default 1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per training process (default 1)")
    p.add_argument("--runs-dir", metavar="DIR", help="keep each run as DIR/<dataset>-split<NN> (for zoo report) "
                   "instead of a temporary directory (and each data set's sweep as DIR/sweeps/<dataset>)")
    p.add_argument("--resume", action="store_true", help="continue a stopped run of the same command: finished "
                   "sweeps and splits kept in --runs-dir are read back, cut-off ones continue")
    p.add_argument("--tune", metavar="SPACE", help="per data set, first sweep this space (zoo sweep) on validation "
                   "rows of the training rows, then run the splits with the best settings")
    p.add_argument("--trials", type=int, default=30, help="finished trials per data set's sweep (default 30)")
    p.add_argument("--tune-splits", help="the splits whose training rows the sweep carves its validation rows "
                   "from; several (0-2) score each trial by the mean over them (default 0)")
    p.add_argument("--tune-each-split", action="store_true", help="one sweep per split, on validation rows of that "
                   "split's own training rows; each split runs with its own choice (Gal & Ghahramani 2016's "
                   "protocol: --trials fits per split instead of per data set)")
    p.add_argument("--tune-validation", type=float, default=0.2, help="share of those training rows scored by the "
                   "sweep (default 0.2)")
    return p


def tune(args: argparse.Namespace, name: str, splits: list[int], overrides: list[str], console: Console) -> dict:
    """One sweep (``zoo sweep``) on validation rows of ``splits``' training rows, kept as ``sweeps/<name>``: the
    chosen settings as ``--set`` strings, and what the sweep cost."""
    import yaml

    from zoo.sweep import sweep

    where = Path(args.runs_dir) / "sweeps" / name if args.runs_dir else None
    with tempfile.TemporaryDirectory(prefix="zoo-uci-sweep-") as tmp, warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", ZooWarning)  # printed after it, each once, marked with the data set
        result = sweep(args.spec, args.tune, args.trials, where or Path(tmp) / "sweep",
                       [*overrides, f"data.split={splits[0]}", f"data.validation_fraction={args.tune_validation}"],
                       workers=args.workers, threads=args.threads, progress=True, echo=None,
                       repeat=("data.split", splits) if len(splits) > 1 else None)
    counts = result.counts
    outcome = (f"{len(result.trials)} trials ({counts['complete']} complete, {counts['pruned']} pruned, "
               f"{counts['failed']} failed)")
    kept = "" if where else " (the sweep's directory was temporary: --runs-dir DIR keeps it as DIR/sweeps/)"
    for warning in said:
        if issubclass(warning.category, ZooWarning):
            console.print(f"{name}: warning: {warning.message}" + (kept if "zoo report" in str(warning.message)
                                                                   else ""), soft_wrap=True, markup=False)
        else:
            warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
    if result.best is None:
        raise TrainingDiverged(f"{name}: no trial of the sweep completed: {outcome}; each failure's reason is in "
                               f"its trials table{kept}; move the space in {args.tune} away from the failing "
                               "settings")
    chosen = dict(result.best.params)
    console.print(f"{name}: sweep of {outcome} in {result.wall_seconds:.0f} s; validation {result.metric} "
                  f"{result.best.value:.3f} with " + ", ".join(f"{k}={_short(v)}" for k, v in chosen.items()),
                  soft_wrap=True, markup=False)
    for line in result.edges.values():
        console.print(f"{name}: note: {line}", soft_wrap=True, markup=False)
    return {"params": chosen, "validation": result.best.value, "metric": result.metric,
            "sweep_seconds": result.wall_seconds, "trials": len(result.trials), "complete": counts["complete"],
            "pruned": counts["pruned"], "failed": counts["failed"], "caveats": list(result.caveats),
            "splits": splits, "validation_fraction": args.tune_validation,
            "sweep_dir": str(where) if where else None, "at_edge": sorted(result.edges),
            "overrides": [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
                          for k, v in chosen.items()]}


def per_split_summary(each: dict[int, dict]) -> dict:
    """One data set's ``--tune-each-split`` sweeps as one JSON block: totals, and every split's own choice."""
    return {"each_split": True, "per_split": {str(split): block for split, block in each.items()},
            "trials": sum(b["trials"] for b in each.values()), "pruned": sum(b["pruned"] for b in each.values()),
            "complete": sum(b["complete"] for b in each.values()), "failed": sum(b["failed"] for b in each.values()),
            "caveats": [f"split {split}: {line}" for split, b in each.items() for line in b["caveats"]],
            "sweep_seconds": sum(b["sweep_seconds"] for b in each.values()), "splits": sorted(each),
            "validation_fraction": next(iter(each.values()))["validation_fraction"],
            "at_edge": sorted({key for b in each.values() for key in b["at_edge"]})}


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def run(args: argparse.Namespace, console: Console) -> dict:
    """Train every (dataset, split), print the table, write the JSON; returns the JSON object."""
    from zoo.data.uci import n_splits, uci_protocol
    from zoo.runs import write_json
    from zoo.spec import load_spec

    if args.workers < 1:
        raise ZooInputError("--workers", args.workers, "use 1 or more")
    if args.threads < 1:
        raise ZooInputError("--threads", args.threads, "use 1 or more")
    datasets, splits = parse_datasets(args.datasets), parse_splits(args.splits)
    data_dir = resolve_data_dir(args.data_dir)
    base_spec = load_spec(args.spec, args.set)  # fail early on a bad spec or --set
    per_dataset = parse_set_for(args.set_for, datasets)
    depth = len(base_spec.net.hidden)
    jobs: list[tuple[str, int, list[str], str | None]] = []  # data set, split, overrides, where the run is kept
    protocol: dict[str, int | None] = {}
    tuned: dict[str, dict] = {}
    if args.tune:
        from zoo.spec import spec_tree
        from zoo.sweep import check_space, load_space

        if base_spec.data.validation_fraction > 0:
            raise ZooInputError("data.validation_fraction", base_spec.data.validation_fraction, "--tune scores "
                                "its sweeps on validation rows and then runs the test splits: leave it at 0")
        if args.trials < 1:
            raise ZooInputError("--trials", args.trials, "run at least one trial per sweep")
        check_space(load_space(args.tune), spec_tree(args.spec, args.set))  # fail early on a bad space
    if args.tune_each_split and not args.tune:
        raise ZooInputError("--tune-each-split", True, "sweeps a space: give it with --tune SPACE.yaml")
    if args.tune_each_split and args.tune_splits is not None:
        raise ZooInputError("--tune-splits", args.tune_splits, "with --tune-each-split every split is tuned on its "
                            "own training rows; leave --tune-splits out")
    tune_splits = parse_splits(args.tune_splits or "0")
    for dataset in datasets:
        count = n_splits(dataset, str(data_dir))
        bad = [s for s in splits if s >= count]
        if bad:
            raise ZooInputError("--splits", args.splits, f"{dataset} has {count} splits (0..{count - 1}); "
                                f"no split {bad[0]}")
        if args.tune and not args.tune_each_split and max(tune_splits) >= count:
            raise ZooInputError("--tune-splits", args.tune_splits, f"{dataset} has {count} splits (0..{count - 1})")
        protocol[dataset] = uci_protocol(dataset, str(data_dir)).get("n_hidden")
    if args.resume and not args.runs_dir:
        raise ZooInputError("--resume", True, "continues the runs kept in --runs-dir: give the same --runs-dir")
    if args.runs_dir and not args.resume:
        kept = [p for p in Path(args.runs_dir).glob("*") if p.is_dir() and any(p.iterdir())]
        if kept:
            raise ZooInputError("--runs-dir", args.runs_dir, f"{kept[0]} already holds files; pick a new --runs-dir, "
                                "or pass --resume to continue a stopped run of the same command")
    def overrides_of(dataset: str, split: int, chosen: list[str]) -> list[str]:
        """Every --set for one run: the command's, the data set's, a sweep's choice, then the split's own."""
        return split_overrides([*args.set, *per_dataset[dataset], *chosen], dataset, split, data_dir,
                               protocol[dataset], depth)

    results: dict[str, dict[int, dict]] = {d: {} for d in datasets}  # a split's figures, or {"failed": reason}
    started = time.perf_counter()  # the wall time counts the sweeps
    for dataset in datasets:
        chosen: dict[int, list[str]] = {split: [] for split in splits}
        if args.tune and args.tune_each_split:
            each = {}
            for split in splits:
                try:
                    each[split] = tune(args, f"{dataset}-split{split:02d}", [split],
                                       overrides_of(dataset, split, []), console)
                except TrainingDiverged as err:  # this split has no settings to run with: a failed split
                    results[dataset][split] = {"failed": str(err)}
            if each:
                tuned[dataset] = per_split_summary(each)
            chosen = {split: block["overrides"] for split, block in each.items()}
        elif args.tune:
            try:
                tuned[dataset] = tune(args, dataset, tune_splits, overrides_of(dataset, tune_splits[0], []), console)
            except TrainingDiverged as err:  # no settings for any split of this data set
                results[dataset] = {split: {"failed": str(err)} for split in splits}
            else:
                per_dataset[dataset] = per_dataset[dataset] + tuned[dataset]["overrides"]  # in the JSON too
        for split in splits:
            if split not in results[dataset]:
                jobs.append((dataset, split, overrides_of(dataset, split, chosen[split]),
                             split_run_dir(args.runs_dir, dataset, split)))
    for _, _, overrides, _ in jobs:  # the per-split, per-data-set and tuned overrides validate too
        load_spec(args.spec, overrides)

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=Console(stderr=True), transient=True)
    with progress:
        task = progress.add_task("UCI splits", total=len(jobs))
        if args.workers == 1:
            for dataset, split, overrides, keep in jobs:
                progress.update(task, description=f"{dataset} split {split}")
                results[dataset][split] = _outcome(lambda o=overrides, k=keep: run_split(args.spec, o, args.threads,
                                                                                         k, args.resume))
                progress.advance(task)
        else:
            context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods()
                                                  else "spawn")
            with ProcessPoolExecutor(args.workers, mp_context=context) as pool:
                futures = {pool.submit(run_split, args.spec, o, args.threads, k, args.resume): (d, s)
                           for d, s, o, k in jobs}
                for future in as_completed(futures):
                    dataset, split = futures[future]
                    results[dataset][split] = _outcome(future.result)
                    progress.update(task, description=f"{dataset} split {split} done")
                    progress.advance(task)
    wall = time.perf_counter() - started

    summary = {d: summarise(d, splits, results[d], protocol[d]) for d in datasets}
    for dataset, chosen in tuned.items():
        summary[dataset]["tuned"] = chosen
    evaluated_on = "validation" if base_spec.data.validation_fraction > 0 else "test"
    console.print(results_table(summary, evaluated_on, Path(args.spec).name))
    failed = [{"dataset": d, "split": int(split), "reason": reason}
              for d in datasets for split, reason in summary[d]["failed_splits"].items()]
    for f in failed:
        console.print(f"failed: {f['dataset']} split {f['split']}: {f['reason']}", soft_wrap=True, markup=False)
    tuning = sum(t["sweep_seconds"] for t in tuned.values())
    n_sweeps = sum(len(t.get("per_split", [None])) for t in tuned.values())
    reused = sum(block["reused_splits"] for block in summary.values())
    console.print(f"{len(jobs)} runs" + (f" ({reused} read back from an earlier process)" if reused else "")
                  + (f", {len(failed)} failed split(s)" if failed else "")
                  + (f" and {n_sweeps} sweeps ({tuning:.0f} s)" if tuned else "")
                  + f" in {wall:.1f} s wall{' (this process)' if args.resume else ''} ({args.workers} worker(s) x "
                  f"{args.threads} thread(s)); "
                  f"evaluated on {evaluated_on} rows")
    if args.runs_dir:
        console.print(f"runs kept in {args.runs_dir}; table: zoo report {args.runs_dir}/* --group-by label "
                      "--out report.md", soft_wrap=True, markup=False)
    out = {
        "spec": str(args.spec), "overrides": list(args.set), "overrides_per_dataset": per_dataset,
        "data_dir": str(data_dir), "evaluated_on": evaluated_on,
        "validation_fraction": base_spec.data.validation_fraction, "workers": args.workers,
        "threads": args.threads,
        "wall_seconds": wall, "resumed": bool(args.resume), "datasets": summary, "tune_space": args.tune,
        "tune_trials": args.trials if args.tune else None, "tune_seconds": tuning if tuned else None,
        "tune_each_split": bool(args.tune_each_split),
        "se_definition": "population std over splits / sqrt(n)",
        "failed": failed,
    }
    if args.json:
        write_json(Path(args.json), out)
        console.print(f"written: {args.json}")
    if failed:  # after everything is written: the exit status says the benchmark is incomplete
        ran = sum(len(block["splits"]) for block in summary.values())
        raise TrainingDiverged(f"{len(failed)} of {ran + len(failed)} split(s) failed (listed after the table, each "
                               "with its reason); " + (f"the table{f' and {args.json}' if args.json else ''} hold the "
                                                       f"figures of the {ran} that finished" if ran else
                                                       "no split finished"))
    return out


def _outcome(call) -> dict:
    """A split's figures from ``call()``, or ``{"failed": reason}`` when its fit diverged or its RMSE or test LL is
    not finite (the other splits go on)."""
    try:
        result = call()
    except TrainingDiverged as err:
        return {"failed": f"TrainingDiverged: {err}"}
    bad = [k for k in ("rmse", "test_ll") if not math.isfinite(result[k])]
    return {"failed": f"{' and '.join(bad)} not finite"} if bad else result


def main(argv: list[str] | None = None) -> int:
    """Entry point: 0 when every split ran, 1 when one failed (after the table and the JSON are written), 2 on bad
    input."""
    args = build_parser().parse_args(argv)
    return exit_code(lambda: run(args, Console()))


if __name__ == "__main__":
    sys.exit(main())
