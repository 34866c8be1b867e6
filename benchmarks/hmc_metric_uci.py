"""The many-chain HMC's metrics side by side on UCI references: which converges a reference on the fewest gradients.

    OMP_NUM_THREADS=1 python benchmarks/hmc_metric_uci.py [--datasets bostonHousing,energy] [--splits 0]
        [--metrics diagonal,low_rank] [--samples N] [--spec configs/hmc_uci.yaml] [--runs-dir runs/hmc_metric]
        [--data-dir DIR] [--threads 1] [--set KEY=VALUE ...] [--json PATH]

For each data set, split and ``inference.metric``, one ``zoo train`` of the reference's spec (``configs/hmc_uci.yaml``
at its defaults unless ``--set`` says otherwise; ``--samples`` sets ``inference.num_samples``, warm-up as the spec),
kept as ``RUNS/<dataset>-split<NN>-<metric>``. A finished run is read, not rerun (refused if it holds another number
of draws than ``--samples`` asks), and one cut short (Ctrl-C, SIGTERM) resumes from its checkpoint: the same command
continues the comparison. The runs go one after another, each
pinned to ``--threads`` torch threads; their seconds are only comparable with each other when nothing else ran beside
them, so the figures to compare are per gradient.

Per run: the verdict's function-space R-hat (max) and bulk/tail ESS (min) with the divergences; the smallest
E-BFMI over chains; gradients per chain in warm-up and in sampling (the leapfrog steps each draw took); min ESS per
1,000 sampling gradients of one chain (ESS / (sampling gradients per chain x chains) x 1,000); the adapted step, the
mean leapfrog steps per draw and the steps ChEES asked for before ``max_leapfrog_steps`` cut them; the adapted
metric's modified directions; seconds; test RMSE and log-likelihood. ``*_ratio_to_diagonal`` is a metric's min ESS
per gradient and its step over the diagonal's on the same split. A run whose R-hat is far above 1.01 has an ESS that
measures how stuck its chains are, not how fast they mix: read the R-hat first.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from uci import parse_datasets, parse_splits, resolve_data_dir  # noqa: E402
from uci_references import DEFAULT_SPEC, run_until, train_command  # noqa: E402

from zoo.errors import ZooInputError  # noqa: E402
from zoo.exits import exit_code  # noqa: E402
from zoo.interrupts import sigterm_interrupts  # noqa: E402
from zoo.runs import write_json  # noqa: E402

METRICS = ("diagonal", "low_rank", "dense")


def run_dir(runs_dir: str, dataset: str, split: int, metric: str) -> Path:
    """Where one comparison run lives."""
    return Path(runs_dir) / f"{dataset}-split{split:02d}-{metric}"


def finished(run: Path) -> bool:
    """Whether ``run`` holds a finished sampling run with its verdict."""
    from zoo.diagnostics import DIAGNOSTICS_FILE
    from zoo.inference.draws import SAMPLES_FILE
    from zoo.runs import load_checkpoint

    return (run / DIAGNOSTICS_FILE).is_file() and (run / SAMPLES_FILE).is_file() \
        and bool(load_checkpoint(run / SAMPLES_FILE).get("done", False))


def measure(run: Path) -> dict:
    """One finished run's figures (module docstring), read from its run directory."""
    from zoo.diagnostics import DIAGNOSTICS_FILE, check_value
    from zoo.inference.draws import SAMPLES_FILE
    from zoo.inference.mcmc import gradients_per_step
    from zoo.runs import SPEC_FILE, load_checkpoint
    from zoo.spec import load_spec

    spec = load_spec(run / SPEC_FILE).inference
    saved = load_checkpoint(run / SAMPLES_FILE)
    verdict = json.loads((run / DIAGNOSTICS_FILE).read_text())
    metrics = json.loads((run / "metrics.json").read_text())
    per_step = gradients_per_step(spec.integrator)
    n_steps = saved["stats"]["n_steps"][0]  # [draws]: every chain takes the same number of steps a draw
    sampling_gradients = float(n_steps.sum()) * per_step
    settings = saved["settings"]
    ess, chains = check_value(verdict, "bulk/tail ESS"), spec.num_chains
    step = settings["step_size"]
    chees = settings.get("chees_trajectory_length")
    bfmi = verdict.get("bfmi") or []
    return {
        "metric": spec.metric, "draws_per_chain": int(n_steps.numel()), "chains": chains,
        "r_hat_max": check_value(verdict, "R-hat"), "ess_min": ess,
        "divergences": int(check_value(verdict, "divergences") or 0),
        "bfmi_min": min(bfmi) if bfmi else None,
        "warmup_gradients_per_chain": int(settings["warmup_gradients"]),
        "sampling_gradients_per_chain": int(sampling_gradients),
        "ess_min_per_1000_gradients": None if ess is None else 1000 * ess / (sampling_gradients * chains),
        "step_size": step, "steps_per_draw": float(n_steps.mean()) * per_step,
        "chees_steps_wanted": None if chees is None else chees / step,
        "metric_directions": int(saved["sampler"]["metric"]["basis"].shape[1]) if "metric" in saved["sampler"] else 0,
        "seconds": float(saved["seconds"]), "rmse": metrics.get("rmse"), "test_ll": metrics.get("test_ll"),
        "converged": not verdict.get("warnings"),
    }


def with_ratios(rows: list[dict]) -> list[dict]:
    """Each row's min ESS per gradient and step over the diagonal metric's on the same data set and split."""
    base = {(r["dataset"], r["split"]): r for r in rows if r["metric"] == "diagonal"}
    for row in rows:
        diagonal = base.get((row["dataset"], row["split"]))
        if diagonal is None or row is diagonal:
            continue
        if row["ess_min_per_1000_gradients"] and diagonal["ess_min_per_1000_gradients"]:
            row["ess_per_gradient_ratio_to_diagonal"] = (row["ess_min_per_1000_gradients"]
                                                         / diagonal["ess_min_per_1000_gradients"])
        row["step_size_ratio_to_diagonal"] = row["step_size"] / diagonal["step_size"]
    return rows


def _fmt(value, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[dict], title: str) -> Table:
    """The comparison as a rich table."""
    out = Table(title=title)
    for name in ("data set / split", "metric", "R-hat", "min ESS", "div.", "min BFMI", "ESS / 1k grad",
                 "vs diagonal", "step", "steps / draw", "ChEES wanted", "directions", "warm-up grads", "seconds",
                 "RMSE", "test LL"):
        out.add_column(name, justify="left" if name in ("data set / split", "metric") else "right")
    for r in rows:
        out.add_row(f"{r['dataset']} / {r['split']}", r["metric"], _fmt(r["r_hat_max"], ".3f"),
                    _fmt(r["ess_min"], ".0f"), str(r["divergences"]), _fmt(r["bfmi_min"], ".2f"),
                    _fmt(r["ess_min_per_1000_gradients"], ".3g"), _fmt(r.get("ess_per_gradient_ratio_to_diagonal"),
                                                                      ".2f"),
                    _fmt(r["step_size"]), _fmt(r["steps_per_draw"], ".0f"), _fmt(r["chees_steps_wanted"], ",.0f"),
                    str(r["metric_directions"]), f"{r['warmup_gradients_per_chain']:,}", _fmt(r["seconds"], ".0f"),
                    _fmt(r["rmse"], ".3f"), _fmt(r["test_ll"], ".3f"))
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", default=str(DEFAULT_SPEC), help="the reference's spec (default configs/hmc_uci.yaml)")
    p.add_argument("--datasets", default="bostonHousing,energy", help="comma-separated UCI folders")
    p.add_argument("--splits", default="0", help="0-2, 0,3,5 or 3 (default 0)")
    p.add_argument("--metrics", default="diagonal,low_rank", help=f"comma-separated, of {', '.join(METRICS)}")
    p.add_argument("--samples", type=int, help="inference.num_samples of every run (default: the spec's)")
    p.add_argument("--runs-dir", default="runs/hmc_metric", help="where the runs live (default runs/hmc_metric)")
    p.add_argument("--data-dir", help="folder holding the UCI folders (default $ZOO_DATA_DIR, then ../shared/data/uci)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each zoo train (default 1)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec field")
    p.add_argument("--json", help="also write the figures to this JSON file")
    return p


def main(argv: list[str] | None = None) -> int:
    console = Console(width=max(Console().width, 200))
    args = build_parser().parse_args(argv)

    def work() -> int:
        metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
        unknown = [m for m in metrics if m not in METRICS]
        if unknown or not metrics:
            raise ZooInputError("--metrics", args.metrics, f"name metrics among {', '.join(METRICS)}")
        if args.samples is not None and args.samples < 1:
            raise ZooInputError("--samples", args.samples, "draws per chain must be a positive integer")
        data_dir = str(resolve_data_dir(args.data_dir))
        rows = []
        for dataset in parse_datasets(args.datasets):
            for split in parse_splits(args.splits):
                for metric in metrics:
                    run = run_dir(args.runs_dir, dataset, split, metric)
                    if not finished(run):
                        overrides = [*args.set, f"inference.metric={metric}"] + (
                            [f"inference.num_samples={args.samples}"] if args.samples else [])
                        # a first run, or --resume of one cut short (the reference script's first command)
                        command = train_command(args.spec, run, dataset, split, data_dir, overrides, None)
                        code = run_until(command, run.parent / "logs" / f"{run.name}.log", time.monotonic() + 1e9,
                                         args.threads, console)
                        if not finished(run):
                            raise ZooInputError("--runs-dir", str(run), f"zoo train ended with exit code {code} "
                                                f"before its verdict; its log is {run.parent / 'logs'}")
                    row = measure(run)
                    if args.samples is not None and row["draws_per_chain"] != args.samples:
                        raise ZooInputError("--samples", args.samples, f"{run} holds a finished run of "
                                            f"{row['draws_per_chain']} draws per chain; use another --runs-dir, or "
                                            "the same --samples to read it")
                    rows.append({"dataset": dataset, "split": split, "run_dir": str(run)} | row)
        rows = with_ratios(rows)
        console.print(table(rows, f"HMC metrics on UCI ({Path(args.spec).name}; runs in {args.runs_dir})"))
        if args.json:
            write_json(Path(args.json), {"command": "python benchmarks/hmc_metric_uci.py " + " ".join(argv or
                                                                                                sys.argv[1:]),
                                         "spec": args.spec, "threads": args.threads, "rows": rows})
        return 0

    with sigterm_interrupts():
        return exit_code(work)


if __name__ == "__main__":
    sys.exit(main())
