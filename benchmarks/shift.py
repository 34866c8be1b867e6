"""Shift and OOD benchmark (the seed papers' protocol): train each member on the 5,000 real MNIST digits of
``mnist5k`` for several seeds, then score it on the clean test images, on the generated corruption suite (14
corruptions x 5 severities: cNLL, cAcc, cECE, cBrier), on rotated test images (15-180 degrees) and on far-OOD
digits (scikit-learn's, enlarged to MNIST's frame: AUROC, AUPR-in/out and FPR95 by max-probability,
entropy and MI).

    python benchmarks/shift.py --spec configs/map_digits.yaml --spec configs/mc_dropout_digits.yaml \\
        [--set 'net:={name: lenet5}'] [--set-for STEM:k=v ...] [--seeds 0-2] [--temperature-scale map_digits] \\
        --runs-dir runs/shift [--reports DIR] [--threads 1] [--predictive-samples N] [--json PATH] \\
        [--plot PATH]

Every member gets ``data.name=mnist5k``, ``data.ood_classes=[]`` and ``data.calibration_fraction=0.1`` (the
same 3,600 training rows for all; the other 400 are the calibration rows that temperature scaling is fitted
on), then ``--set`` and its ``--set-for``. ``--temperature-scale STEM`` adds a row "STEM + TS": the same runs'
predictive after temperature scaling. Resumable: a run directory that holds a finished run is evaluated, not
retrained, and one with a checkpoint resumes; each run's report is kept in it as ``shift_benchmark_draws<N>.json``
(N: the posterior draws per prediction, each spec's own unless ``--predictive-samples`` sets one for all).
``--reports DIR`` also keeps each run's report with its fit time and spec as ``DIR/<stem>_seed<k>_draws<N>.json``:
small files that can be committed and copied, from which a rerun on another machine rebuilds the tables without
the run directories (a kept report made by another spec is refused, not overwritten). A run that training stops
(:class:`~zoo.errors.TrainingDiverged`: a NaN objective, a sampler chain that strayed) does not stop the benchmark:
its diagnosis is printed, kept (a rerun does not train it again) and written under ``stopped`` in the JSON, and
the member's row averages the seeds that finished, naming how many.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import mean_se_cell, parse_seeds  # noqa: E402 - sibling modules of this script
from rotated_mnist import add_member_options, member_overrides  # noqa: E402

from zoo.errors import TrainingDiverged, ZooInputError  # noqa: E402
from zoo.exits import exit_code  # noqa: E402

SUITES = ("corruptions", "rotation")
SUMMARY = ("clean_accuracy", "clean_nll", "clean_ece", "c_accuracy", "c_nll", "c_ece", "c_brier")
OOD_SET = "digits_upscaled"


def evaluate_member(run_dir: Path, temperature_scale: bool, draws: int | None = None) -> dict:
    """Both suites' reports of one trained run, from ``draws`` posterior draws (None: the spec's
    ``inference.predictive_samples``); kept in the run directory per draw count, so a rerun reads them back."""
    from zoo.pipeline import load_run
    from zoo.runs import write_json
    from zoo.shift import shift_report

    spec, data, posterior = load_run(run_dir)
    draws = spec.inference.predictive_samples if draws is None else draws
    cache = run_dir / f"shift_benchmark{'_ts' if temperature_scale else ''}_draws{draws}.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    out = {}
    for suite in SUITES:
        report = shift_report(posterior, data, suite, draws, spec.seed, temperature_scale)
        report.pop("reliability")
        out[suite] = report
    write_json(cache, out)
    return json.loads(cache.read_text())  # as a rerun reads it (levels as strings), so seeds combine alike


def _flat(tree: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _as_read_now(identity: dict) -> dict:
    """A kept report's spec as this version of the zoo reads it: settings added since it was written take their
    defaults (as a run directory's spec.yaml does on a resume); one the zoo no longer reads is kept as it was, and
    so differs."""
    from zoo.spec import load_spec, run_identity

    try:
        return json.loads(json.dumps(run_identity(load_spec(identity)), default=str))
    except ZooInputError:
        return identity


def kept_report(path: Path, identity: dict) -> dict | None:
    """The report kept at ``path`` by ``--reports`` (None when there is none), refused when another spec made it.

    :param path: ``DIR/<stem>_seed<k>_draws<N>.json``.
    :param identity: the asked run's :func:`zoo.spec.run_identity`, as JSON reads it back.
    :returns: the kept record: ``identity``, ``train_seconds``, ``report`` and, once asked for, ``scaled``.
    :raises ZooInputError: when the kept record's spec differs from the asked one (naming the keys).
    """
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    kept, asked = _flat(_as_read_now(record["identity"])), _flat(identity)
    differ = sorted(k for k in kept.keys() | asked.keys() if kept.get(k) != asked.get(k))
    if differ:
        raise ZooInputError("--reports", str(path), f"this report was made by another spec (it differs at "
                            f"{', '.join(differ[:6])}); remove the file or give another --reports directory")
    return record


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error over seeds (0 for one seed)."""
    a = np.asarray(values, dtype=np.float64)
    return float(a.mean()), float(a.std(ddof=1) / np.sqrt(len(a))) if len(a) > 1 else 0.0


def member_figures(reports: list[dict]) -> dict:
    """Mean and standard error over seeds of the summary, per-level and OOD figures of one member."""
    out = {}
    for key in SUMMARY:
        out[key] = mean_se([r["corruptions"]["summary"][key] for r in reports])
    out["rotated_nll"] = mean_se([r["rotation"]["summary"]["c_nll"] for r in reports])
    out["rotated_accuracy"] = mean_se([r["rotation"]["summary"]["c_accuracy"] for r in reports])
    ood = [r["corruptions"]["ood"].get(OOD_SET, {}) for r in reports]
    for score in ("max_prob", "entropy", "mi"):
        if all(score in o for o in ood):
            for metric in ("auroc", "aupr_in", "aupr_out", "fpr95"):
                out[f"ood_{score}_{metric}"] = mean_se([o[score][metric] for o in ood])
    out["by_severity"] = {level: {k: float(np.mean([r["corruptions"]["by_severity"][level][k] for r in reports]))
                                  for k in ("accuracy", "nll", "ece")}
                          for level in reports[0]["corruptions"]["by_severity"]}
    return out


def _cell(pair: tuple[float, float] | None) -> str:
    return "—" if pair is None else mean_se_cell(*pair, 3)


def tables(results: dict[str, dict]) -> list[Table]:
    shift = Table(title="mnist5k under shift (mean ± s.e. over seeds)", title_justify="left")
    for column in ("member", "clean acc", "clean NLL", "clean ECE", "cAcc", "cNLL", "cECE", "rotated NLL",
                   "fit s"):
        shift.add_column(column, justify="left" if column == "member" else "right")
    ood = Table(title=f"far OOD ({OOD_SET}): AUROC / FPR95 by score", title_justify="left")
    for column in ("member", "max-prob AUROC", "entropy AUROC", "MI AUROC", "entropy FPR95"):
        ood.add_column(column, justify="left" if column == "member" else "right")
    for name, f in results.items():
        kept, asked = len(f["seeds"]), f["seeds_total"]
        member = name if kept == asked else f"{name} ({kept} of {asked} seeds)"
        shift.add_row(member, *(_cell(f[k]) for k in ("clean_accuracy", "clean_nll", "clean_ece", "c_accuracy",
                                                     "c_nll", "c_ece", "rotated_nll")), f"{f['fit_seconds']:.0f}")
        ood.add_row(member, *(_cell(f.get(k)) for k in ("ood_max_prob_auroc", "ood_entropy_auroc", "ood_mi_auroc",
                                                       "ood_entropy_fpr95")))
    return [shift, ood]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks/shift.py", description=__doc__.split("\n\n")[0])
    add_member_options(p)
    p.add_argument("--seeds", default="0-2", help="seeds, e.g. 0-2 (default) or 0,3")
    p.add_argument("--temperature-scale", action="append", default=[], metavar="STEM",
                   help="also report member STEM after temperature scaling on its calibration rows")
    p.add_argument("--runs-dir", required=True, metavar="DIR", help="the runs, DIR/<stem>_seed<k> (resumable)")
    p.add_argument("--reports", metavar="DIR", help="also keep each run's report, fit time and spec in DIR (small "
                   "files a rerun elsewhere rebuilds the tables from, without the runs)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--predictive-samples", type=int, metavar="N",
                   help="posterior draws per prediction in the evaluation (default: each spec's own)")
    p.add_argument("--json", help="write the figures to this JSON file")
    p.add_argument("--plot", help="write accuracy, NLL and ECE against the severity to this PNG file")
    return p


def run(args: argparse.Namespace, console: Console) -> dict:
    import torch

    from zoo.pipeline import holds_a_fit, holds_another_spec, train
    from zoo.runs import write_json
    from zoo.spec import load_spec, run_identity

    if args.threads < 1:
        raise ZooInputError("--threads", args.threads, "use 1 or more")
    if args.predictive_samples is not None and args.predictive_samples < 1:
        raise ZooInputError("--predictive-samples", args.predictive_samples, "use 1 or more draws")
    seeds = parse_seeds(args.seeds)
    stems = [Path(p).stem for p in args.spec]
    if len(set(stems)) != len(stems):
        raise ZooInputError("--spec", args.spec, "two specs share a file stem; rename one")
    for stem in args.temperature_scale:
        if stem not in stems:
            raise ZooInputError("--temperature-scale", stem, f"name one of the specs' stems: {', '.join(stems)}")
    torch.set_num_threads(args.threads)
    results: dict[str, dict] = {}
    stopped: dict[str, dict[int, str]] = {}
    for path, stem in zip(args.spec, stems, strict=True):
        overrides = member_overrides(path, ["data.calibration_fraction=0.1", *args.set], args.set_for)
        reports, scaled, fit_seconds, finished = [], [], [], []
        for seed in seeds:
            spec = load_spec(path, [*overrides, f"seed={seed}"])
            run_dir = Path(args.runs_dir) / f"{stem}_seed{seed}"
            draws = spec.inference.predictive_samples if args.predictive_samples is None else args.predictive_samples
            identity = json.loads(json.dumps(run_identity(spec), default=str))
            kept_at = Path(args.reports) / f"{stem}_seed{seed}_draws{draws}.json" if args.reports else None
            record = kept_report(kept_at, identity) if kept_at else None
            wants_scaled = stem in args.temperature_scale
            started = time.perf_counter()
            needs_run = record is None or (wants_scaled and "scaled" not in record and "stopped" not in record)
            if needs_run:
                if holds_another_spec(run_dir, spec):
                    raise ZooInputError("--runs-dir", str(run_dir), "holds a run of another spec (another --set, "
                                        "--set-for or config): give the same command, or pick a new --runs-dir")
                try:
                    if not (run_dir / "metrics.json").is_file():
                        train(spec, run_dir, resume=run_dir.is_dir() and holds_a_fit(run_dir), progress=True,
                              echo=None)
                except TrainingDiverged as stop:
                    record = {"identity": identity, "draws": draws, "stopped": str(stop)}
                    if kept_at:
                        write_json(kept_at, record)
            if record is not None and "stopped" in record:
                stopped.setdefault(stem, {})[seed] = record["stopped"]
                console.print(f"{stem} seed {seed}: training stopped: {record['stopped']}", markup=False)
                continue
            if needs_run:
                record = {"identity": identity, "draws": draws,
                          "train_seconds": json.loads((run_dir / "metrics.json").read_text())["train_seconds"],
                          "report": evaluate_member(run_dir, False, draws)}
                if wants_scaled:
                    record["scaled"] = evaluate_member(run_dir, True, draws)
                if kept_at:
                    write_json(kept_at, record)
            fit_seconds.append(record["train_seconds"])
            finished.append(seed)
            reports.append(record["report"])
            if wants_scaled:
                scaled.append(record["scaled"])
            console.print(f"{stem} seed {seed}: cNLL {reports[-1]['corruptions']['summary']['c_nll']:.3f} "
                          f"({time.perf_counter() - started:.0f} s)", markup=False)
        if not reports:
            continue
        seeds_run = {"seeds": finished, "seeds_total": len(seeds), "fit_seconds": float(np.mean(fit_seconds))}
        results[stem] = {**member_figures(reports), **seeds_run}
        if scaled:
            results[f"{stem} + TS"] = {**member_figures(scaled), **seeds_run,
                                       "temperature": mean_se([r["corruptions"]["temperature"] for r in scaled])}
    for table in tables(results):
        console.print(table)
    for stem, by_seed in stopped.items():
        console.print(f"not in the tables: {stem} seed(s) {', '.join(map(str, by_seed))} (training stopped; "
                      f"the diagnosis is above and in the JSON under 'stopped')", markup=False)
    out = {"seeds": seeds, "threads": args.threads, "predictive_samples": args.predictive_samples,
           "overrides": args.set, "overrides_per_spec": args.set_for,
           "members": results, "stopped": stopped}
    written = []
    if args.json:
        written.append(str(write_json(Path(args.json), out)))
    if args.plot:
        from zoo.plots import shift_curves

        curves = {m: {float(k): v for k, v in f["by_severity"].items()} for m, f in results.items()}
        written.append(str(shift_curves(curves, Path(args.plot), title="mnist5k: generated corruptions")))
    if written:
        console.print(f"written: {', '.join(written)}", markup=False)
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return exit_code(lambda: run(args, Console(width=max(Console().width, 150))))


if __name__ == "__main__":
    sys.exit(main())
