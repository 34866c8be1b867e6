"""Digits benchmark: train a spec with several seeds; accuracy, NLL, ECE, Brier and OOD AUROC as mean ± s.e.

The seed changes the train/test split, the initialisation and the minibatch order. OOD sets are those of the
spec's data section (held-out classes via ``data.ood_classes``; 8x8 photo patches always).

    python benchmarks/digits.py --spec configs/mean_field_digits.yaml [--seeds 0-4] [--set k=v ...] [--json PATH] \\
        [--runs-dir DIR]

``--runs-dir DIR`` keeps each seed's run as ``DIR/<spec stem>-seed<N>`` (default: throw-away temporary
directories), for ``zoo report DIR/* --group-by label --out report.md``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import mean_se_cell, parse_seeds  # noqa: E402 - sibling module of this script

from zoo.exits import exit_code  # noqa: E402
from zoo.metrics import mean_and_standard_error  # noqa: E402
from zoo.pipeline import train  # noqa: E402
from zoo.runs import write_json  # noqa: E402
from zoo.spec import load_spec  # noqa: E402

COLUMNS = ["accuracy", "nll", "ece", "brier", "ood_auroc_entropy", "ood_auroc_mi",
           "ood_auroc_entropy_image_patches", "ood_auroc_mi_image_patches", "train_seconds"]


def main(argv: list[str] | None = None) -> dict:
    """Train every seed, print the table, optionally write the JSON; returns the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--seeds", default="0-4")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json")
    parser.add_argument("--runs-dir", metavar="DIR", help="keep each run as DIR/<spec stem>-seed<N> (for zoo report)")
    args = parser.parse_args(argv)
    runs = []
    for seed in tqdm(parse_seeds(args.seeds), desc="seeds"):
        spec = load_spec(args.spec, [*args.set, f"seed={seed}"])
        with tempfile.TemporaryDirectory() as tmp:  # where the run goes unless it is kept
            out = Path(args.runs_dir) / f"{Path(args.spec).stem}-seed{seed}" if args.runs_dir else tmp
            runs.append(train(spec, out, progress=False, echo=None).metrics)
    columns = [c for c in COLUMNS if all(c in r for r in runs)]
    figures = {"spec": args.spec, "overrides": args.set, "seeds": parse_seeds(args.seeds), "runs": runs,
               **{f"{c}_mean": mean_and_standard_error([r[c] for r in runs])[0] for c in columns},
               **{f"{c}_se": mean_and_standard_error([r[c] for r in runs])[1] for c in columns}}
    table = Table(title=f"{args.spec} on digits, {len(runs)} seeds (mean ± s.e.)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for c in columns:
        table.add_row(c, mean_se_cell(figures[c + '_mean'], figures[c + '_se'], 4))
    Console().print(table)
    if args.json:
        write_json(args.json, figures)
    return figures


if __name__ == "__main__":
    sys.exit(exit_code(main))
