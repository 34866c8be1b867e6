"""Rotated MNIST (the distribution-shift benchmark of Daxberger et al. 2021, after Ovadia et al. 2019): train each
spec once on the 5,000 real MNIST digits of ``mnist5k`` (4,000 training rows, all 10 classes), then evaluate it on
the 1,000 test images rotated by each angle; accuracy, NLL and ECE per angle, a table per metric and one plot.

    python benchmarks/rotated_mnist.py --spec configs/map_digits.yaml --spec configs/mean_field_digits.yaml \\
        [--angles 0-180:15] [--set k=v ...] [--set-for STEM:k=v ...] [--seed 0] [--threads 1] \\
        [--json PATH] [--plot PATH] [--runs-dir DIR]

Every spec gets ``data.name=mnist5k`` and ``data.ood_classes=[]`` (then ``--set``, then its ``--set-for``, keyed by
the spec file's stem). A run is trained once; each angle re-reads the test images rotated and evaluates the same
posterior with the spec's ``predictive_samples`` draws, seeded alike for every angle.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from zoo.errors import ZooInputError
from zoo.exits import exit_code

METRICS = ("accuracy", "nll", "ece")
LABELS = {"accuracy": "accuracy", "nll": "NLL", "ece": "ECE"}


def parse_angles(text: str) -> list[float]:
    """``0-180:15`` (a range with a step), ``0,45,90`` or a mix, as a sorted list of distinct angles."""
    out: set[float] = set()
    for part in (p.strip() for p in str(text).split(",") if p.strip()):
        m = re.fullmatch(r"(-?\d+(?:\.\d+)?)(?:-(-?\d+(?:\.\d+)?):(\d+(?:\.\d+)?))?", part)
        if not m:
            raise ZooInputError("--angles", text, "write angles as 0-180:15 (from-to:step) or 0,45,90")
        lo = float(m.group(1))
        if m.group(2) is None:
            out.add(lo)
            continue
        hi, step = float(m.group(2)), float(m.group(3))
        if step <= 0 or hi < lo:
            raise ZooInputError("--angles", text, f"{part}: use from <= to and a positive step")
        n = int((hi - lo) / step + 1e-9)
        out.update(lo + i * step for i in range(n + 1))
    if not out:
        raise ZooInputError("--angles", text, "give at least one angle")
    return sorted(out)


def member_overrides(spec_path: str, common: list[str], per_spec: list[str]) -> list[str]:
    """The overrides of one spec: mnist5k with every class, then ``--set``, then its ``--set-for STEM:...``."""
    stem = Path(spec_path).stem
    mine = []
    for item in per_spec:
        key, sep, override = item.partition(":")
        if not sep or "=" not in override:
            raise ZooInputError("--set-for", item, "write STEM:KEY=VALUE, e.g. subnet_laplace_digits:"
                                "model.selection.size=1000")
        if key == stem:
            mine.append(override)
    return ["data.name=mnist5k", "data.ood_classes=[]", *common, *mine]


def add_member_options(p: argparse.ArgumentParser) -> None:
    """The options naming the members and their overrides (read by :func:`member_overrides`)."""
    p.add_argument("--spec", action="append", required=True, help="a member's YAML spec (repeat for several)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for every spec")
    p.add_argument("--set-for", action="append", default=[], metavar="STEM:KEY=VALUE",
                   help="override for the spec whose file stem is STEM")


def evaluate_run(run_dir: Path, angles: list[float]) -> dict[float, dict[str, float]]:
    """One trained run's metrics on the test images rotated by each angle."""
    from zoo.data import load_dataset
    from zoo.evaluate import evaluate
    from zoo.pipeline import load_run
    from zoo.spec import load_spec

    spec, data, posterior = load_run(run_dir)
    out = {}
    for angle in angles:
        turned = load_spec(spec, f"data.rotation={angle}")
        rotated = load_dataset(turned.data, spec.seed).to(data.device, data.dtype)
        metrics = evaluate(posterior, rotated, spec.inference.predictive_samples, spec.seed)
        out[angle] = {k: float(metrics[k]) for k in METRICS}
    return out


def metric_table(metric: str, results: dict[str, dict], angles: list[float]) -> Table:
    table = Table(title=f"rotated MNIST (mnist5k test images): {LABELS[metric]} by angle", title_justify="left")
    table.add_column("member", style="bold")
    for angle in angles:
        table.add_column(f"{angle:g}°", justify="right")
    for member, block in results.items():
        table.add_row(member, *(f"{block['angles'][angle][metric]:.3f}" for angle in angles))
    return table


def plot(results: dict[str, dict], angles: list[float], path: Path) -> Path:
    """Accuracy, NLL and ECE against the angle, one line per member."""
    from zoo.plots import new_figure, save_figure

    fig, axes = new_figure(1, 3, (13.0, 3.8))
    for ax, metric in zip(axes[0], METRICS, strict=True):
        for member, block in results.items():
            ax.plot(angles, [block["angles"][a][metric] for a in angles], marker="o", ms=3, label=member)
        ax.set_xlabel("rotation of the test images (degrees)")
        ax.set_title(LABELS[metric])
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("rotated MNIST: trained on upright digits (mnist5k), tested rotated")
    return save_figure(fig, path)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks/rotated_mnist.py", description=__doc__.split("\n\n")[0])
    add_member_options(p)
    p.add_argument("--angles", default="0-180:15", help="0-180:15 or 0,45,90 (default 0-180:15)")
    p.add_argument("--seed", type=int, default=0, help="the runs' seed (default 0)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--json", help="write the figures to this JSON file")
    p.add_argument("--plot", help="write the plot to this PNG file")
    p.add_argument("--runs-dir", metavar="DIR", help="keep each run as DIR/<stem> instead of a temporary directory")
    return p


def run(args: argparse.Namespace, console: Console) -> dict:
    import torch

    from zoo.pipeline import train
    from zoo.runs import write_json
    from zoo.spec import load_spec

    if args.threads < 1:
        raise ZooInputError("--threads", args.threads, "use 1 or more")
    angles = parse_angles(args.angles)
    members = {}
    for path in args.spec:
        stem = Path(path).stem
        if stem in members:
            raise ZooInputError("--spec", path, f"two specs share the stem {stem}; rename one")
        members[stem] = load_spec(path, [*member_overrides(path, args.set, args.set_for), f"seed={args.seed}"])
    torch.set_num_threads(args.threads)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="zoo-rotated-") as tmp:
        for stem, spec in members.items():
            run_dir = Path(args.runs_dir or tmp) / stem
            started = time.perf_counter()
            summary = train(spec, run_dir, progress=True, echo=None)
            fitted = time.perf_counter() - started
            by_angle = evaluate_run(run_dir, angles)
            results[stem] = {"spec": spec.model_dump(mode="json"), "train_seconds": summary.metrics["train_seconds"],
                             "command_seconds": time.perf_counter() - started, "fit_command_seconds": fitted,
                             "angles": by_angle}
            console.print(f"{stem}: trained in {summary.metrics['train_seconds']:.1f} s; accuracy "
                          f"{by_angle[angles[0]]['accuracy']:.3f} at {angles[0]:g}° -> "
                          f"{by_angle[angles[-1]]['accuracy']:.3f} at {angles[-1]:g}°", markup=False)
    for metric in METRICS:
        console.print(metric_table(metric, results, angles))
    out = {"angles": angles, "seed": args.seed, "threads": args.threads, "overrides": args.set,
           "overrides_per_spec": args.set_for, "members": {k: {**v, "angles": {str(a): m for a, m in
                                                                               v["angles"].items()}}
                                                            for k, v in results.items()}}
    written = []
    if args.json:
        written.append(str(write_json(Path(args.json), out)))
    if args.plot:
        written.append(str(plot(results, angles, Path(args.plot))))
    if written:
        console.print(f"written: {', '.join(written)}", markup=False)
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return exit_code(lambda: run(args, Console(width=max(Console().width, 150))))  # 13 angle columns


if __name__ == "__main__":
    sys.exit(main())
