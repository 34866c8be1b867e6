"""The ``zoo`` command: train, eval, prune, diagnose, compare, sweep, report and list.

Bad input (and an OS error: a path that cannot be read or written) exits 2 with a one-paragraph message and no
traceback; ``zoo diagnose --strict`` exits 3 when a check warns, and so does ``zoo train`` of an MCMC run whose draws
fail a convergence check (the run directory is complete). Ctrl-C exits 130 and SIGTERM 143, after the step in
progress is checkpointed.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from zoo.errors import ZooInputError, ZooWarning
from zoo.exits import exit_code, rank, say
from zoo.interrupts import Interrupted, signal_of, sigterm_interrupts
from zoo.tasks import task_of

console = Console()
STRICT_EXIT = 3  # zoo diagnose --strict, or zoo train of MCMC draws: a convergence check failed (the value of
# zoo.diagnostics.NOT_CONVERGED_EXIT, written out so that `zoo --help` does not import the diagnostics)


def _metrics_table(title: str, rows: list[dict[str, float]], first: str | None = None) -> Table:
    table = Table(title=title)
    keys = list(rows[0]) if rows else []
    for key in keys:
        table.add_column(key, justify="right" if key != first else "left")
    for row in rows:
        table.add_row(*(f"{v:.4f}" if isinstance(v, float) else str(v) for v in row.values()))
    return table


def _metric_list(title: str, metrics: dict[str, float]) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in metrics.items():
        table.add_row(key, f"{value:.4f}")
    return table


def cmd_train(args: argparse.Namespace) -> int:
    """Train a spec into a run directory and print its metrics; a run of chains (MCMC) ends with its convergence
    verdict."""
    from zoo.pipeline import describe, train
    from zoo.spec import load_spec

    overrides = list(args.set or [])
    if args.data_dir:
        overrides.append(f"data.dir={args.data_dir}")
    spec = load_spec(args.spec, overrides)
    from zoo.sweep import refuse_run_in_sweep

    refuse_run_in_sweep(args.out)  # a run and a sweep never share a directory
    if args.add_draws is not None or args.until_converged or args.budget_minutes is not None:
        return _add_draws(args, spec)
    if args.nproc != 1:
        return _launch(args, spec)
    try:
        summary = train(spec, args.out, resume=args.resume, progress=not args.no_progress,
                        echo=lambda line: console.print(line, soft_wrap=True, markup=False))
    except KeyboardInterrupt as err:
        raise Interrupted(signal_of(err), _what_was_kept(args)) from None
    if rank():  # under torchrun: rank 0 evaluates, reports and diagnoses
        return 0
    console.print(_metric_list(f"{describe(spec)} on {spec.data.name}", summary.metrics))
    console.print(f"run directory: {summary.run_dir}", soft_wrap=True, markup=False)
    if summary.plot is not None:
        console.print(f"plot: {summary.plot}", soft_wrap=True, markup=False)
    if summary.chains:
        return _convergence_verdict(summary.run_dir, args.strict)
    return 0


def _add_draws(args: argparse.Namespace, spec) -> int:
    """``zoo train SPEC --out RUN --add-draws N [--until-converged [--budget-minutes M]]``: the rounds of
    :func:`zoo.diagnostics.grow_until_converged`, printed as a ``zoo train`` prints (each round's metrics, each
    verdict's checks and line). With ``--until-converged`` a run not sampled yet gets its first round (warm-up and
    the spec's draws) first, inside the budget, as :func:`zoo.reference` does: a reference in one command."""
    import time

    from zoo import registry
    from zoo.diagnostics import check_growth, grow_until_converged
    from zoo.inference.draws import SAMPLES_FILE
    from zoo.pipeline import describe, train
    from zoo.runs import SPEC_FILE

    check_growth(args.add_draws, args.until_converged, args.budget_minutes)  # refused first, then --nproc
    if args.nproc != 1:
        raise ZooInputError("--nproc", args.nproc, "rounds of draws run in one process; to grow a run over N "
                            "processes, resume it with --set inference.num_samples=<total per chain> --nproc N")
    out, started = Path(args.out), time.monotonic()
    first_round = args.until_converged and not (out / SAMPLES_FILE).is_file()
    if first_round and spec.inference.method not in registry.method_of(spec).adds_draws:
        raise ZooInputError("inference.method", spec.inference.method, "only the many-chain HMC adds draws until "
                            "it converges: use member hmc, or train without --add-draws")

    def show_round(summary, total: int) -> None:
        console.print(_metric_list(f"{describe(spec)} on {spec.data.name}, {total} draws per chain", summary.metrics))

    try:
        if first_round:  # a spec.yaml without draws is a first round cut short: resumed
            show_round(train(spec, out, resume=(out / SPEC_FILE).is_file(), progress=not args.no_progress,
                             echo=lambda line: console.print(line, soft_wrap=True, markup=False)),
                       spec.inference.num_samples)
        grown = grow_until_converged(args.out, args.add_draws, spec=spec, until_converged=args.until_converged,
                                     budget_minutes=args.budget_minutes, started=started, strict=args.strict,
                                     progress=not args.no_progress,
                                     echo=lambda line: console.print(line, soft_wrap=True, markup=False),
                                     on_round=show_round, on_verdict=_print_verdict)
    except KeyboardInterrupt as err:
        raise Interrupted(signal_of(err), _what_was_kept(args)) from None
    return grown.exit_code


def _launch(args: argparse.Namespace, spec) -> int:
    """``zoo train --nproc N``: the same command in N processes under ``torchrun`` (input checked here first)."""
    from zoo import registry
    from zoo.distributed import check_launch, launch

    check_launch(args.nproc, spec.device, spec.inference, registry.SHARED_WORK)
    registry.method_of(spec).check_processes(spec.inference, args.nproc)
    return launch(args.nproc, without_nproc(args.argv))


def without_nproc(argv: list[str]) -> list[str]:
    """``argv`` less its ``--nproc N`` / ``--nproc=N`` (what each launched process runs)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            out.append(arg)
    return out


def _what_was_kept(args: argparse.Namespace) -> str:
    """After an interrupted ``zoo train``: whether a checkpoint exists, and the command that resumes it."""
    from zoo.pipeline import holds_a_fit

    out = Path(args.out)
    if out.is_dir() and holds_a_fit(out):
        again = " ".join(["zoo train", args.spec, "--out", args.out, *(f"--set {s}" for s in args.set or []),
                          *(["--data-dir", args.data_dir] if args.data_dir else []), "--resume"])
        return f"the run is checkpointed in {out}; continue it with: {again}"
    return "no checkpoint had been written yet, so there is nothing to resume: run the same command again"


def _diagnose_and_print(run_dir: str | Path, num_samples: int | None = None) -> dict:
    """Run ``zoo diagnose``'s checks on a run directory, write its files and print its tables."""
    from zoo.diagnostics import diagnose, diagnose_report

    result = diagnose(run_dir, num_samples=num_samples)
    for renderable in diagnose_report(result):
        console.print(renderable)
    console.print(f"written: {', '.join(result['files'].values())}", soft_wrap=True, markup=False)
    return result


def _convergence_verdict(run_dir: Path, strict: bool = False) -> int:
    """Diagnose a run's chains (as ``zoo diagnose``), print the checks and one verdict line; 3 if a check failed
    for an exact sampler's draws (for SG-MCMC only with ``strict``: its verdict is a warning)."""
    from zoo.diagnostics import convergence_verdict

    found = convergence_verdict(run_dir, strict)
    _print_verdict(found)
    return found.exit_code


def _print_verdict(found) -> None:
    """A :class:`zoo.diagnostics.ConvergenceVerdict` as ``zoo diagnose`` prints its checks, then its line: red when
    it fails the run, yellow for a warning, green when it passes."""
    from zoo.diagnostics import diagnose_report

    for renderable in diagnose_report(found.result):
        console.print(renderable)
    console.print(f"written: {', '.join(found.result['files'].values())}", soft_wrap=True, markup=False)
    style = "bold red" if found.fails else ("bold yellow" if found.result["warnings"] else "bold green")
    console.print(found.line, style=style, soft_wrap=True, markup=False)


def cmd_eval(args: argparse.Namespace) -> None:
    """Re-evaluate a trained run on its test set; with ``--shift`` / ``--temperature-scale``, the shift and OOD
    report (written into the run directory as shift_<suite>[_ts].json / .csv / .png)."""
    from zoo.evaluate import evaluate
    from zoo.pipeline import load_run

    if args.shift is not None or args.temperature_scale:
        return _shift_eval(args)
    spec, data, posterior = load_run(args.run_dir)
    samples = spec.inference.predictive_samples if args.samples is None else args.samples
    console.print(_metric_list(f"{args.run_dir} ({samples} draws)", evaluate(posterior, data, samples, spec.seed)))


def _shift_eval(args: argparse.Namespace) -> None:
    """``zoo eval RUN --shift SUITE [--temperature-scale]``: print and write the shift and OOD report."""
    import csv
    import io

    from zoo import plots
    from zoo.pipeline import describe, load_run
    from zoo.runs import write_json, write_text
    from zoo.shift import check_suite, shift_report, suite_label

    check_suite(args.shift)
    spec, data, posterior = load_run(args.run_dir)
    samples = spec.inference.predictive_samples if args.samples is None else args.samples
    report = shift_report(posterior, data, args.shift, samples, spec.seed, args.temperature_scale)
    run_dir = Path(args.run_dir)
    stem = f"shift_{suite_label(args.shift)}" + ("_ts" if args.temperature_scale else "")
    reliability = report.pop("reliability")
    written = [write_json(run_dir / f"{stem}.json", report)]
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=list(report["rows"][0]))
    writer.writeheader()
    writer.writerows(report["rows"])
    written.append(write_text(run_dir / f"{stem}.csv", table.getvalue()))
    label = "severity" if args.shift != "rotation" else "angle"
    title = f"{args.run_dir}" + (f" (T = {report['temperature']:.3g})" if report["temperature"] else "")
    if args.shift is not None:
        written.append(plots.shift_curves({describe(spec): report["by_severity"]}, run_dir / f"{stem}.png",
                                          title=title, xlabel=f"{label} (0 = clean)"))
        written.append(plots.reliability_by_severity({k: v[0] for k, v in reliability.items()},
                                                     {k: v[1] for k, v in reliability.items()},
                                                     run_dir / f"reliability_{stem}.png", title=title,
                                                     level_name=label))
    shown = [{label: f"{level:g}", **values} for level, values in report["by_severity"].items()]
    heading = f"{title}: per {label}, means over corruption types ({samples} draws)"
    console.print(_metrics_table(heading, shown, first=label))
    console.print(_metric_list("summary", report["summary"]))
    ood_rows = [{"OOD set": name, "score": score, **values}
                for name, scores in report["ood"].items() for score, values in scores.items()]
    if ood_rows:
        console.print(_metrics_table("OOD detection (the clean test set against each OOD set)", ood_rows,
                                     first="OOD set"))
    console.print(f"written: {', '.join(str(p) for p in written)}", soft_wrap=True, markup=False)


def cmd_prune(args: argparse.Namespace) -> None:
    """Prune the lowest signal-to-noise weights at several fractions and print the test metrics at each."""
    from zoo import plots
    from zoo.evaluate import evaluate, prune_by_snr
    from zoo.pipeline import load_run
    from zoo.runs import write_json

    try:
        fractions = [float(f) for f in args.fractions.split(",") if f.strip()]
    except ValueError:
        raise ZooInputError("--fractions", args.fractions, "give comma-separated numbers, e.g. 0.5,0.75,0.95") from None
    spec, data, posterior = load_run(args.run_dir)
    rows = []
    for fraction in [0.0, *fractions]:
        pruned = prune_by_snr(posterior, fraction)
        rows.append({"fraction": fraction, **evaluate(pruned, data, spec.inference.predictive_samples, spec.seed)})
    run_dir = Path(args.run_dir)
    write_json(run_dir / "prune.json", rows)
    keys = list(task_of(data).metrics)
    plot = plots.pruning_curve([r["fraction"] for r in rows], {k: [r[k] for r in rows] for k in keys},
                               run_dir / "pruning.png", title=f"{spec.data.name}: pruning by |mu|/sigma")
    shown = [{"fraction": r["fraction"], **{k: r[k] for k in keys}} for r in rows]
    console.print(_metrics_table("signal-to-noise pruning (test set)", shown, first="fraction"))
    console.print(f"written: {run_dir / 'prune.json'}, {plot}", soft_wrap=True, markup=False)


def cmd_diagnose(args: argparse.Namespace) -> int:
    """Check a run's posterior (R-hat, ESS, divergences, BFMI or Pareto k-hat), print the tables, write the files."""
    result = _diagnose_and_print(args.run_dir, args.samples)
    return STRICT_EXIT if args.strict and result["warnings"] else 0


def cmd_compare(args: argparse.Namespace) -> None:
    """Compare runs' test predictives with a reference run's; print the table, write the plot (and JSON)."""
    from zoo.diagnostics import COMPARE_DRAWS, compare, compare_table
    from zoo.diagnostics.comparison import COMPARE_PLOT, compare_outputs
    from zoo.runs import write_json

    compare_outputs(args.out, args.json)  # before anything is drawn: a user's file is never replaced
    found = compare(args.reference, *args.runs, num_samples=COMPARE_DRAWS if args.samples is None else args.samples,
                    allow_unconverged=args.allow_unconverged, allow_other_nets=args.allow_other_nets)
    compare_outputs(args.out)
    plot = found.plot(Path(args.out) / COMPARE_PLOT)
    rows = found.rows
    rows[0]["plot"] = str(Path(args.out) / COMPARE_PLOT)
    console.print(compare_table(rows))
    written = [rows[0]["plot"]]
    plot.clear()
    if args.json:
        written.append(str(write_json(Path(args.json), rows)))
    console.print(f"written: {', '.join(written)}", soft_wrap=True, markup=False)


def cmd_sweep(args: argparse.Namespace) -> None:
    """Search a space of spec settings on validation rows (Optuna); print the best trials, write best.yaml."""
    from zoo.sweep import parse_repeat, sweep

    overrides = list(args.set or [])
    if args.data_dir:
        overrides.append(f"data.dir={args.data_dir}")
    result = sweep(args.spec, args.space, args.trials, args.out, overrides, workers=args.workers,
                   threads=args.threads, storage=args.storage, study_name=args.study, metric=args.metric,
                   repeat=parse_repeat(args.repeat) if args.repeat else None, progress=not args.no_progress,
                   echo=lambda line: console.print(line, soft_wrap=True, markup=False))
    _print_trials(result, limit=10)
    written = [str(path) for path in result.files.values()]
    console.print(f"written: {', '.join(written)}", soft_wrap=True, markup=False)
    if result.best is None:
        raise ZooInputError("--trials", args.trials, "no trial completed (see the notes above); widen the space or "
                            "run more trials")


def _print_table(title: str, header: list[str], rows: list[list[str]], left: tuple[str, ...]) -> None:
    """A console table of text cells, the ``left`` columns left-aligned and the rest right-aligned."""
    table = Table(title=title, title_justify="left")
    for name in header:
        table.add_column(escape(name), justify="left" if name in left else "right")
    for row in rows:
        table.add_row(*(escape(cell) for cell in row))
    console.print(table)


def _print_trials(result, limit: int | None = None) -> None:
    """A sweep's trials, best first, as a console table (the first ``limit``), and its settings at an edge."""
    from zoo.sweep import trials_table

    header, rows = trials_table(result)
    shown = rows if limit is None else rows[:limit]
    title = (f"sweep {result.out}: {len(rows)} trial(s), validation {result.metric} "
             f"({'higher' if result.direction == 'maximize' else 'lower'} is better)"
             + (f"; the best {len(shown)}" if len(shown) < len(rows) else ""))
    _print_table(title, header, shown, left=("state", "note"))
    for line in result.edges.values():
        console.print(f"note: {line}", soft_wrap=True, markup=False)


def _print_sweeps(results) -> None:
    """Several sweeps, one row each, and how many chose a setting at an edge of its range."""
    from zoo.sweep import sweeps_table

    header, rows = sweeps_table(results)
    edged = sum(bool(r.edges) for r in results)
    _print_table(f"{len(results)} sweeps; {edged} chose a setting at an edge of its range", header, rows,
                 left=("sweep", "best", "settings", "at edge"))


def cmd_report(args: argparse.Namespace) -> None:
    """Gather many runs' metrics (and diagnostics) into one table; write it as Markdown, CSV and a plot. A sweep's
    directory gives its trials instead, several sweeps' directories one row per sweep."""
    from zoo.report import report_outputs, rich_tables, write_report
    from zoo.sweep import is_sweep_directory, write_sweeps_report, write_trials_report

    report_outputs(args.out)  # before anything is read: where the report may go
    sweeps = [d for d in args.run_dirs if is_sweep_directory(d)]
    if sweeps:
        if len(sweeps) < len(args.run_dirs):
            raise ZooInputError("RUN_DIR", sweeps[0], "sweep directories are reported among themselves (their trials, "
                                "or one row per sweep); give only sweeps, or the run directories of a trials/ folder")
        if len(sweeps) == 1:
            result, files = write_trials_report(sweeps[0], args.out)
            _print_trials(result)
        else:
            results, files = write_sweeps_report(sweeps, args.out)
            _print_sweeps(results)
        console.print(f"written: {', '.join(str(f) for f in files.values())}", soft_wrap=True, markup=False)
        return

    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else None
    report = write_report(args.run_dirs, args.out, group_by=args.group_by, metrics=metrics)
    title = f"zoo report: {len(report.rows)} row(s)" + (f" by {args.group_by}, mean ± s.e." if args.group_by else "")
    for table in rich_tables(report, console.width, title):
        console.print(table)
    console.print(f"written: {', '.join(str(report.files[k]) for k in ('markdown', 'csv', 'plot'))}",
                  soft_wrap=True, markup=False)


def _shipped_config_table() -> dict[str, str]:
    """Each shipped config's name and the first sentence of its header comment."""
    from zoo.registry import summary_of
    from zoo.spec import shipped_configs

    table = {}
    for name, entry in shipped_configs().items():
        header = []
        for line in entry.read_text(encoding="utf-8").splitlines():
            if not line.startswith("#") or not line.strip("# "):
                break
            header.append(line.lstrip("#").strip())
        table[name] = summary_of("\n".join(header))
    return table


def cmd_list(args: argparse.Namespace) -> None:
    """Print every registered part and the shipped configs (or one kind's table: ``zoo list members``)."""
    from zoo.registry import TABLES

    tables = {**TABLES, "configs (shipped specs: zoo train configs/NAME.yaml, or NAME, from any folder)":
              _shipped_config_table()}
    wanted = {title: table for title, table in tables.items() if args.what is None or title.startswith(args.what)}
    if not wanted:
        raise ZooInputError("zoo list", args.what, f"list one of: {', '.join(t.split()[0] for t in tables)}")
    for title, table in wanted.items():
        out = Table(title=title, show_header=False, title_justify="left")
        out.add_column("name", style="bold")
        out.add_column("what")
        for name, what in table.items():
            out.add_row(name, what)
        console.print(out)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``zoo`` command."""
    from zoo import __version__

    parser = argparse.ArgumentParser(prog="zoo", description="Bayesian neural networks in Pyro.")
    parser.add_argument("--version", action="version", version=f"pyro-bnn-zoo {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="fit a spec and write a run directory (MCMC: ends with the convergence "
                       f"verdict, exit {STRICT_EXIT} if a check of an exact sampler's draws failed)")
    p.add_argument("spec", help="YAML spec: a file, or a shipped config (zoo list configs) as configs/NAME.yaml or "
                   "NAME, from any folder")
    p.add_argument("--out", required=True, help="run directory to write")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a spec field, e.g. data.split=3 "
                   "(the value is YAML); a mapping merges into the spec's mapping at KEY, e.g. net='{hidden: [20]}' "
                   "keeps the net's other keys; KEY:=VALUE replaces it whole, e.g. net:='{name: lenet5}'")
    p.add_argument("--data-dir", help="data directory (UCI folders); default $ZOO_DATA_DIR")
    p.add_argument("--resume", action="store_true", help="continue from the run directory's checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--strict", action="store_true", help=f"exit {STRICT_EXIT} when a check of stored chains fails "
                   "also for samplers that are not exact (SG-MCMC); exact samplers (MCMC) always do")
    p.add_argument("--nproc", type=int, default=1, metavar="N", help="processes on this node (torchrun): SVI "
                   "shares each global minibatch, MCMC its chains; methods that split no work are refused, naming "
                   "those that do; one per GPU on CUDA")
    p.add_argument("--add-draws", type=int, metavar="N", help="continue the finished many-chain HMC run in --out "
                   "for N more draws per chain (its chains, settings and random stream carried on), then its verdict")
    p.add_argument("--until-converged", action="store_true", help="with --add-draws: add rounds of N draws until "
                   f"the convergence verdict passes (exit 0) or --budget-minutes is spent (exit {STRICT_EXIT}); a "
                   "run not sampled yet gets its first round (the spec's draws) first")
    p.add_argument("--budget-minutes", type=float, metavar="M", help="with --until-converged: start no new round "
                   "after M minutes (the same command adds more later)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="re-evaluate a run directory")
    p.add_argument("run_dir")
    p.add_argument("--samples", type=int, help="posterior draws (default: the spec's predictive_samples)")
    p.add_argument("--shift", metavar="SUITE", help="the shift and OOD report on SUITE: corruptions (= mnist-c = "
                   "cifar-c), rotation, or a directory of published CIFAR-10-C / MNIST-C files")
    p.add_argument("--temperature-scale", action="store_true", help="report the predictive after temperature "
                   "scaling fitted on the run's calibration rows (data.calibration_fraction)")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("prune", help="signal-to-noise pruning of a mean-field run")
    p.add_argument("run_dir")
    p.add_argument("--fractions", default="0.5,0.75,0.95,0.98", help="fractions of weights to remove")
    p.set_defaults(func=cmd_prune)

    p = sub.add_parser("diagnose", help="R-hat, ESS, divergences, BFMI / Pareto k-hat of a run; ArviZ file and plots")
    p.add_argument("run_dir")
    p.add_argument("--samples", type=int, help="draws: guide runs 200 by default; MCMC runs thin to about N "
                   "(default: every stored draw)")
    p.add_argument("--strict", action="store_true", help=f"exit {STRICT_EXIT} when any check warns")
    p.set_defaults(func=cmd_diagnose)

    p = sub.add_parser("compare", help="compare runs' test predictives with a reference run (e.g. HMC)")
    p.add_argument("reference", metavar="REFERENCE_RUN")
    p.add_argument("runs", metavar="RUN", nargs="+")
    p.add_argument("--samples", type=int, help="posterior draws per run (default 200)")
    p.add_argument("--out", default=".", help="directory for compare.png (default: the current directory)")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p.add_argument("--allow-unconverged", action="store_true", help="compare against a reference that fails zoo "
                   "diagnose --strict or is not an exact sampler's (MCMC) draws, marked FAILS in the table; "
                   "without it such a reference is refused")
    p.add_argument("--allow-other-nets", action="store_true", help="compare runs of another net than the "
                   "reference's (the difference is then part of what is measured); without it they are refused")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("sweep", help="hyperparameter search (Optuna TPE, pruning) over spec keys, scored on "
                       "validation rows; writes best.yaml")
    p.add_argument("spec", help="YAML spec; data.validation_fraction > 0 carves the validation rows")
    p.add_argument("--space", required=True, help="YAML file of spec keys -> {low, high, log, step} or {choices}")
    p.add_argument("--trials", type=int, required=True, metavar="N", help="finished trials to reach (a stopped "
                   "sweep continues to N)")
    p.add_argument("--out", required=True, help="sweep directory (study, trials/, best.yaml, trials.png)")
    p.add_argument("--workers", type=int, default=1, metavar="W", help="trials run side by side (default 1)")
    p.add_argument("--threads", type=int, help="torch threads per worker (default: OMP_NUM_THREADS as set, else "
                   "torch's threads up to each worker's share of the cores, else cores / workers)")
    p.add_argument("--storage", metavar="URL", help="Optuna storage: an RDB URL (e.g. postgresql://..., shared by "
                   "several machines) or a journal file path (default: OUT/study.log)")
    p.add_argument("--study", metavar="NAME", help="study name in the storage (default zoo-sweep)")
    p.add_argument("--metric", help="validation metric to optimise (default: test_ll for regression, nll for "
                   "classification)")
    p.add_argument("--repeat", metavar="KEY=V1,V2,...", help="fit every trial once per value and score the mean, "
                   "e.g. data.split=0,1,2 (three splits' validation rows) or seed=0,1,2")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a spec field")
    p.add_argument("--data-dir", help="data directory (UCI folders); default $ZOO_DATA_DIR")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("report", help="one table (Markdown, CSV, plot) of many runs' metrics and diagnostics; "
                       "of a sweep directory, its trials; of several, one row per sweep")
    p.add_argument("run_dirs", metavar="RUN_DIR", nargs="+")
    p.add_argument("--out", required=True, help="Markdown file to write; its .csv and .png go beside it")
    p.add_argument("--group-by", metavar="KEY", help="aggregate runs sharing KEY into mean ± s.e.: label, name, "
                   "parent, data, family, guide, method, prior or a spec field (default: one row per run)")
    p.add_argument("--metrics", metavar="NAMES", help="comma-separated metrics to show (default: all recorded)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("list", help="print the registered data sets, nets, priors, families, guides, inference "
                       "methods and members, and the shipped configs")
    p.add_argument("what", nargs="?", help="only this kind's table, e.g. members, priors, guides, configs")
    p.set_defaults(func=cmd_list)
    return parser


def _print_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """ZooWarnings as one ``warning:`` line on stderr (no source location); others as Python prints them."""
    if issubclass(category, ZooWarning):
        if not rank():
            say(f"warning: {message}")
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``zoo`` command (under ``torchrun``, ranks other than 0 print only their errors)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    console.quiet = bool(rank())  # under torchrun rank 0 prints the results; the others only their errors
    if rank():
        args.no_progress = True
    with warnings.catch_warnings(), sigterm_interrupts():
        warnings.showwarning = _print_warning
        warnings.simplefilter("always", ZooWarning)
        code = exit_code(lambda: args.func(args))
    from zoo.distributed import report_exit

    return report_exit(code)


if __name__ == "__main__":
    exit_with = main()
    from zoo.distributed import end_rank, launched_by_torchrun

    if launched_by_torchrun():
        end_rank(exit_with)
    sys.exit(exit_with)
