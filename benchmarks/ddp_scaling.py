"""Scaling out: SVI steps/s and HMC chain-iterations/s of ``zoo train --nproc N`` against one process.

Each workload is trained as a user would (``zoo train SPEC --out DIR [--nproc N]``), one torch thread per process
(``OMP_NUM_THREADS=1``), one configuration after another, never two at once. Figures:

* ``fit s``: the fit's own wall time as the run records it (``train_seconds`` in metrics.json: SVI's steps with their
  all-reduces, or HMC's warm-up and sampling with compiling), measured inside the processes;
* ``rate``: SVI optimisation steps, or HMC chain-iterations (chains x (warm-up + draws)), per second of ``fit s``;
* ``command s``: the whole command, start-up of the processes, data loading, evaluation and writing included;
* ``speed-up ratio``: rate with N processes / rate with one, measured in the same invocation;
* the run's headline test metric, to show the runs agree (N processes take the one-process steps, see
  ``tests/test_distributed.py``).

    python benchmarks/ddp_scaling.py [--nproc 1,2] [--svi-spec configs/mean_field_digits.yaml] [--svi-set k=v ...]
        [--hmc-spec configs/hmc_toy.yaml] [--hmc-set k=v ...] [--only svi|hmc] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import parse_counts  # noqa: E402 - sibling module of this script

from zoo.exits import exit_code  # noqa: E402
from zoo.runs import METRICS_FILE, write_json  # noqa: E402
from zoo.spec import MCMCSpec, load_spec  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
HMC_SET = ["inference.warmup_steps=150", "inference.num_samples=100"]  # the toy reference, shortened


def run_once(spec_path: str, overrides: list[str], nproc: int) -> dict:
    """Train ``spec_path`` in ``nproc`` processes (one thread each); the fit's and the command's seconds, metrics."""
    command = [sys.executable, "-m", "zoo.cli", "train", spec_path, "--no-progress"]
    for override in overrides:
        command += ["--set", override]
    if nproc > 1:
        command += ["--nproc", str(nproc)]
    with tempfile.TemporaryDirectory(prefix="zoo-ddp-") as tmp:
        started = time.perf_counter()
        done = subprocess.run([*command, "--out", f"{tmp}/run"], cwd=REPO, capture_output=True, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
        seconds = time.perf_counter() - started
        if done.returncode not in (0, 3):  # 3: MCMC draws that fail a convergence check still time the sampler
            raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
        metrics = json.loads(Path(f"{tmp}/run/{METRICS_FILE}").read_text())
    return {"command_seconds": round(seconds, 2), "metrics": metrics}


def workload_rate(spec_path: str, overrides: list[str]) -> tuple[str, float]:
    """What one unit of the rate is, and how many units the run performs."""
    spec = load_spec(spec_path, overrides)
    if isinstance(spec.inference, MCMCSpec):
        inference = spec.inference
        return "chain-iterations/s", inference.num_chains * (inference.warmup_steps + inference.num_samples)
    from zoo.data import load_dataset
    from zoo.inference.svi import total_steps

    return "steps/s", total_steps(spec.inference, load_dataset(spec.data, spec.seed).n_train)


def main(argv: list[str] | None = None) -> dict:
    """Time every workload at every process count; print the table, optionally write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", default="1,2", help="process counts, comma-separated (the first is the baseline)")
    parser.add_argument("--svi-spec", default="configs/mean_field_digits.yaml")
    parser.add_argument("--svi-set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--hmc-spec", default="configs/hmc_toy.yaml")
    parser.add_argument("--hmc-set", action="append", default=None, metavar="KEY=VALUE",
                        help=f"default: {' '.join(HMC_SET)}")
    parser.add_argument("--only", choices=["svi", "hmc"], help="time one workload only")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    counts = parse_counts(args.nproc, "--nproc", "1,2,4")
    workloads = [("svi", args.svi_spec, args.svi_set), ("hmc", args.hmc_spec, HMC_SET if args.hmc_set is None
                                                           else args.hmc_set)]
    rows = []
    for kind, spec_path, overrides in workloads:
        if args.only not in (None, kind):
            continue
        unit, work = workload_rate(spec_path, overrides)
        baseline = None
        for nproc in counts:
            run = run_once(spec_path, overrides, nproc)
            fit = run["metrics"]["train_seconds"]
            rate = work / fit
            baseline = baseline or rate
            metric = "accuracy" if "accuracy" in run["metrics"] else "test_ll"
            rows.append({"workload": kind, "spec": spec_path, "overrides": overrides, "processes": nproc,
                         "fit_seconds": fit, "unit": unit, "rate": rate, "command_seconds": run["command_seconds"],
                         "speedup_ratio": rate / baseline, "metric": metric, "metric_value": run["metrics"][metric]})
    table = Table(title="zoo train --nproc N against one process (one torch thread per process)")
    for column in ("workload", "processes", "fit s", "rate", "command s", "speed-up ratio", "test metric"):
        table.add_column(column, justify="left" if column == "workload" else "right")
    for r in rows:
        table.add_row(f"{r['workload']} {Path(r['spec']).stem}", str(r["processes"]), f"{r['fit_seconds']:.1f}",
                      f"{r['rate']:.1f} {r['unit']}", f"{r['command_seconds']:.1f}", f"{r['speedup_ratio']:.2f}",
                      f"{r['metric']} {r['metric_value']:.4f}")
    Console(width=140).print(table)
    figures = {"cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
               "threads_per_process": 1, "rows": rows}
    if args.json:
        write_json(Path(args.json), figures)
    return figures


if __name__ == "__main__":
    sys.exit(exit_code(main))
