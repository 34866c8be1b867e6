"""Grow the UCI HMC references until each passes ``zoo diagnose --strict``, in resumable chunks, and state progress.

A reference is ``configs/hmc_uci.yaml`` (or ``--spec``) on one UCI data set and split, kept as
``RUNS/<dataset>-split<NN>`` (``--runs-dir``, default ``runs/hmc_uci``). The script works through the references in
the order asked, skips those that pass already, and grows each by the command a user would type::

    zoo train SPEC --out RUN --set data.name=uci:D --set data.split=S --data-dir DIR \\
        --add-draws N --until-converged --budget-minutes M

which samples a run's first round (the spec's 2,500 draws per chain) if it has none, finishes a round that was cut
short, then adds rounds of N draws while the verdict fails (:func:`zoo.diagnostics.grow_until_converged` behind
``zoo train``). When ``--budget-minutes`` is spent, the running command gets SIGTERM, which checkpoints it and ends
it; the same ``uci_references.py`` command continues every reference where it stopped, on this machine or on
another one that has the run directories (the data directory may differ there). Ctrl-C does the same.

A reference another process is sampling (its run directory's lock names the pid) is left to it. ``--status`` runs
nothing: it prints the progress table (and ``--json`` writes it). Per reference: its state (not started; sampling,
with the iterations done of those asked and the pid sampling it now; finished and failing; converged), the draws per
chain, the verdict's R-hat (max), ESS (min) and divergences, the sampling hours so far and, for a finished run that
fails, an estimate of the draws per chain it needs (R-hat - 1 and 1 / ESS taken to shrink in proportion to the
draws). "est. hours left" prices that estimate, or for a run being sampled the draws it asks for, at the run's own
seconds per iteration so far. The estimate is a guide, not a promise: a chain stuck in another mode breaks the
proportionality.

    python benchmarks/uci_references.py --status [--json PATH]
    OMP_NUM_THREADS=1 python benchmarks/uci_references.py --budget-minutes 240 \\
        [--datasets bostonHousing,concrete,wine-quality-red,energy] [--splits 0-2] [--add-draws 2500] \\
        [--set-for energy:inference.max_leapfrog_steps=29188]

Each command's output goes to ``RUNS/logs/<dataset>-split<NN>.log`` (appended). Exit status: 0 when every
reference asked for passes; 3 when some do not yet (the budget ran out); 2 on bad input (or when a ``zoo train``
refused its input, whose log then says why); 130 / 143 after Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from uci import parse_datasets, parse_set_for, parse_splits, resolve_data_dir, split_run_dir  # noqa: E402

from zoo.diagnostics import (  # noqa: E402
    DIAGNOSTICS_FILE,
    NOT_CONVERGED_EXIT,
    check_value,
    draws_would_help,
    estimated_draws,
)
from zoo.errors import ZooInputError  # noqa: E402
from zoo.interrupts import signal_of, sigterm_interrupts  # noqa: E402
from zoo.runs import SPEC_FILE, write_text  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SPEC = REPO_ROOT / "configs" / "hmc_uci.yaml"
DEFAULT_DATASETS = "bostonHousing,concrete,wine-quality-red,energy"
STOP_GRACE_SECONDS = 600  # how long a stopped command may take to write its checkpoint before it is killed


@dataclass
class Progress:
    """Where one reference stands (one row of the table)."""

    reference: str
    run_dir: str
    state: str  # "not started", "sampling", "not converged", "stuck" (what fails is not what draws fix), "converged"
    writer_pid: str | None = None  # the live process sampling it now, if any (its run directory's lock)
    iterations_done: int | None = None
    iterations_asked: int | None = None
    draws_per_chain: int | None = None
    num_chains: int | None = None
    r_hat_max: float | None = None
    ess_min: float | None = None
    divergences: int | None = None
    sampling_hours: float | None = None
    estimated_draws_per_chain: int | None = None
    estimated_hours_left: float | None = None


def _verdict(run: Path, draws: int) -> dict:
    """The run's diagnostics.json when it counts the run's draws (zoo train writes it with each verdict), else a
    fresh diagnosis (minutes for a long run), which writes it."""
    from zoo.diagnostics import diagnose

    stored = run / DIAGNOSTICS_FILE
    if stored.is_file():
        result = json.loads(stored.read_text())
        if result.get("num_draws") == draws:
            return result
    return diagnose(run, plots=False)


def progress(reference: str, run: Path) -> Progress:
    """Read one reference's state from its run directory (its spec, checkpoint and verdict); runs nothing."""
    from zoo.inference.draws import SAMPLES_FILE
    from zoo.runs import load_checkpoint, writer_of
    from zoo.spec import load_spec

    row = Progress(reference, str(run), "not started", writer_of(run) if run.is_dir() else None)
    if not (run / SPEC_FILE).is_file() or not (run / SAMPLES_FILE).is_file():
        if row.writer_pid is not None:
            row.state = "sampling"  # a live run before its first checkpoint (the first iterations of its warm-up)
        return row
    spec = load_spec(run / SPEC_FILE)
    saved = load_checkpoint(run / SAMPLES_FILE)
    inference = spec.inference
    draws = saved.get("draws") or {}
    stored = next(iter(draws.values())).shape[1] if draws else 0
    # a round that asks more draws rewrites spec.yaml first and the draws at its first checkpoint: until then the
    # finished draws are all it holds, and it is being sampled (its verdict is the next one, not a fresh diagnosis)
    done = bool(saved.get("done", False)) and stored >= inference.num_samples
    row.iterations_asked = inference.warmup_steps + inference.num_samples
    # a run cut short keeps its sampler's state (the many-chain HMC's counts its iterations); a finished one, its draws
    row.iterations_done = (row.iterations_asked if done else inference.warmup_steps + stored if saved.get("done")
                           else int(saved.get("sampler", {}).get("iteration", 0)))
    row.num_chains = inference.num_chains
    row.draws_per_chain = max(0, row.iterations_done - inference.warmup_steps)
    seconds = float(saved.get("seconds", 0.0))
    row.sampling_hours = seconds / 3600
    per_iteration = seconds / max(row.iterations_done, 1)
    if not done:
        row.state = "sampling"
        row.estimated_hours_left = (row.iterations_asked - row.iterations_done) * per_iteration / 3600
        return row
    result = _verdict(run, row.draws_per_chain)
    row.r_hat_max = check_value(result, "R-hat")
    row.ess_min = check_value(result, "bulk/tail ESS")
    divergences = check_value(result, "divergences")
    row.divergences = None if divergences is None else int(divergences)
    row.state = "not converged" if result["warnings"] else "converged"
    if row.state == "not converged" and not draws_would_help(result):
        row.state = "stuck"  # R-hat and ESS pass; divergences or BFMI fail, which more draws do not fix
    elif row.state == "not converged" and row.r_hat_max is not None and row.ess_min is not None:
        row.estimated_draws_per_chain = estimated_draws(row.draws_per_chain, row.r_hat_max, row.ess_min)
        row.estimated_hours_left = (row.estimated_draws_per_chain - row.draws_per_chain) * per_iteration / 3600
    return row


def _fmt(value, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def progress_table(rows: list[Progress], title: str) -> Table:
    """The printed table: one row per reference."""
    table = Table(title=title, title_justify="left")
    for name in ("reference", "state", "iterations", "draws/chain", "R-hat", "min ESS", "div.", "hours",
                 "est. draws/chain", "est. hours left"):
        table.add_column(name, justify="left" if name in ("reference", "state") else "right", no_wrap=True)
    for r in rows:
        iterations = "-" if r.iterations_done is None else f"{r.iterations_done:,} of {r.iterations_asked:,}"
        state = r.state if r.writer_pid is None else f"{r.state} (pid {r.writer_pid})"
        table.add_row(r.reference, state, iterations, _fmt(r.draws_per_chain, ","), _fmt(r.r_hat_max, ".3f"),
                      _fmt(r.ess_min, ",.0f"), _fmt(r.divergences), _fmt(r.sampling_hours, ".2f"),
                      _fmt(r.estimated_draws_per_chain, ","), _fmt(r.estimated_hours_left, ".1f"))
    return table


# ------------------------------------------------------------------------------------------------ growing
def train_command(spec: str, run: Path, dataset: str, split: int, data_dir: str, overrides: list[str],
                  add_draws: int | None, minutes_left: float = 0.0) -> list[str]:
    """The ``zoo train`` command that takes a reference, in any state, towards its passing verdict; with
    ``add_draws`` None, one run at the spec's draws and no rounds (``--resume`` of one cut short before its draws:
    what benchmarks/hmc_metric_uci.py runs).

    The grow step is :func:`zoo.diagnostics.grow_until_converged`, run by the ``zoo train --add-draws`` child
    rather than called in this process, on purpose: the wall budget stops a round in the middle (SIGTERM, which
    checkpoints it, and a kill if the checkpoint hangs), which only a separate process allows; ``--threads`` pins
    OMP/MKL threads, which must be set before torch loads; each reference's log gets all the run prints, warnings
    included; the run directory's lock names the process sampling it (``--status`` elsewhere shows it); and the log
    records a command a user can type to continue by hand."""
    command = [sys.executable, "-m", "zoo.cli", "train", spec, "--out", str(run),
               "--set", f"data.name=uci:{dataset}", "--set", f"data.split={split}", "--data-dir", data_dir,
               *(x for o in overrides for x in ("--set", o)), "--no-progress"]
    if add_draws is None:
        return command + (["--resume"] if (run / SPEC_FILE).is_file() else [])
    return command + ["--add-draws", str(add_draws), "--until-converged",  # a first round too, when it has none
                      "--budget-minutes", f"{max(minutes_left, 0.01):.2f}"]


def run_until(command: list[str], log: Path, deadline: float, threads: int, console: Console) -> int | None:
    """Run one command, its output appended to ``log``; at ``deadline`` (time.monotonic) it gets SIGTERM, which
    checkpoints it. Its exit code, or None when the deadline stopped it."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)}
    log.parent.mkdir(parents=True, exist_ok=True)
    console.print(f"$ zoo {' '.join(command[3:])}    (log: {log})", soft_wrap=True, markup=False, style="dim")
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        job = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            return job.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            console.print("the budget is spent: stopping the command at a checkpoint", markup=False)
            _stop(job)
            return None
        except KeyboardInterrupt as err:
            # Ctrl-C reaches the command too (one process group): let it checkpoint and end by itself. A SIGTERM
            # sent to this script alone is passed on.
            _stop(job, signal_of(err) == signal.SIGINT)
            raise


def _stop(job: subprocess.Popen, signalled_already: bool = False) -> None:
    """End a ``zoo train`` at its next checkpoint (SIGTERM, unless it got the signal itself); killed only if it has
    not ended after :data:`STOP_GRACE_SECONDS`."""
    if not signalled_already:
        job.send_signal(signal.SIGTERM)
    try:
        job.wait(timeout=STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        job.kill()
        job.wait()


def grow(args: argparse.Namespace, references: list[tuple[str, int, Path]], per_dataset: dict[str, list[str]],
         console: Console) -> int | None:
    """Take each reference to a passing verdict while the budget lasts (``per_dataset``: each data set's extra
    overrides); None when every one passes, else the exit code that stopped the work (3: the budget ran out; 2: a
    command refused its input)."""
    deadline = time.monotonic() + 60 * args.budget_minutes
    data_dir = str(resolve_data_dir(args.data_dir)) if args.data_dir is None else args.data_dir
    for dataset, split, run in references:
        while True:
            row = progress(f"{dataset}/{split}", run)
            if row.state == "converged":
                break
            if row.state == "stuck":
                console.print(f"{run}: R-hat and ESS pass, and what fails (its diagnostics.json's warnings) is not "
                              "what more draws fix; going on with the next reference", soft_wrap=True, markup=False)
                break
            if row.writer_pid is not None:  # another process grows it (e.g. an earlier command still running)
                console.print(f"{run}: being sampled by pid {row.writer_pid}; going on with the next reference",
                              soft_wrap=True, markup=False)
                break
            if time.monotonic() >= deadline:
                return NOT_CONVERGED_EXIT
            command = train_command(args.spec, run, dataset, split, data_dir, [*args.set, *per_dataset[dataset]],
                                    args.add_draws, (deadline - time.monotonic()) / 60)
            code = run_until(command, Path(args.runs_dir) / "logs" / f"{run.name}.log", deadline, args.threads,
                             console)
            if code is None:
                return NOT_CONVERGED_EXIT
            if code not in (0, NOT_CONVERGED_EXIT):
                console.print(f"{run}: zoo train exited {code}; its log says why", markup=False, style="bold red")
                return code
    return None


# ------------------------------------------------------------------------------------------------ main
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks/uci_references.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", default=str(DEFAULT_SPEC), help="the reference's spec (default configs/hmc_uci.yaml)")
    p.add_argument("--datasets", default=DEFAULT_DATASETS, help="comma-separated UCI folders, worked on in order")
    p.add_argument("--splits", default="0-2", help="0-2, 0,3,5 or 3 (default 0-2)")
    p.add_argument("--runs-dir", default="runs/hmc_uci", help="where the references live (default runs/hmc_uci)")
    p.add_argument("--data-dir", help="folder holding the UCI folders (default $ZOO_DATA_DIR, then ../shared/data/uci)")
    p.add_argument("--status", action="store_true", help="run nothing: print (and with --json write) the progress")
    p.add_argument("--budget-minutes", type=float, help="wall minutes to grow references for (required unless "
                   "--status)")
    p.add_argument("--add-draws", type=int, default=2500, help="draws per chain each round adds (default 2500)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each zoo train (default 1)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec field")
    p.add_argument("--set-for", action="append", default=[], metavar="DATASET:KEY=VALUE",
                   help="override a spec field for one data set, e.g. energy:inference.max_leapfrog_steps=29188")
    p.add_argument("--json", help="write the progress table to this JSON file (atomically)")
    return p


def check_arguments(args: argparse.Namespace) -> None:
    """Bad input exits 2 before anything runs."""
    if not Path(args.spec).is_file():
        raise ZooInputError("--spec", args.spec, "no such file; the default is configs/hmc_uci.yaml")
    if not args.status and (args.budget_minutes is None or args.budget_minutes <= 0):
        raise ZooInputError("--budget-minutes", args.budget_minutes, "give the positive wall minutes to grow the "
                            "references for, or --status to only report their progress")
    if args.add_draws < 1:
        raise ZooInputError("--add-draws", args.add_draws, "give the draws per chain a round adds (1 or more)")
    if args.threads < 1:
        raise ZooInputError("--threads", args.threads, "give 1 or more")


def main(argv: list[str] | None = None) -> int:
    from zoo.exits import exit_code

    console = Console(width=max(Console().width, 170))  # the table's ten columns, unwrapped in a log too
    args = build_parser().parse_args(argv)

    def work() -> int:
        check_arguments(args)
        references = [(d, s, Path(split_run_dir(args.runs_dir, d, s)))
                      for d in parse_datasets(args.datasets) for s in parse_splits(args.splits)]
        per_dataset = parse_set_for(args.set_for, list(dict.fromkeys(d for d, _, _ in references)))
        stopped = None if args.status else grow(args, references, per_dataset, console)
        rows = [progress(f"{d}/{s}", run) for d, s, run in references]
        console.print(progress_table(rows, f"UCI references ({Path(args.spec).name}) in {args.runs_dir}"))
        if args.json:
            write_text(Path(args.json), json.dumps({"spec": args.spec, "runs_dir": args.runs_dir,
                                                    "references": [asdict(r) for r in rows]}, indent=2) + "\n")
        if stopped is not None:
            return stopped
        return 0 if all(r.state == "converged" for r in rows) else NOT_CONVERGED_EXIT

    with sigterm_interrupts():  # SIGTERM, as Ctrl-C, stops the running command at a checkpoint first
        return exit_code(work)


if __name__ == "__main__":
    sys.exit(main())
