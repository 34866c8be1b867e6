"""A Laplace prior the validation rows reject, scaled there: what it does to the predictive away from the data.

A Laplace classifier fitted with validation rows scales the evidence's prior precisions where those rows reject its
predictive against the MAP net (``inference.precision_scale``, chosen). A narrower posterior can cost the spread that
flags inputs unlike the training rows, so this fits the defaults suite's Laplace members (``benchmarks/defaults.py``:
the same rows, net, loader and ``fit(loader, val=...)`` call) twice, at the defaults and with the evidence's prior
(``precision_scale: 1``), and scores both on the test rows (NLL, accuracy) and on two shifted copies of them:
``permuted``, every row's features in one fixed random order (the same values, the structure gone), and, for a
square image given as rows, ``rotated``, each image turned by 90 degrees. Out-of-distribution detection is the AUROC
of telling a shifted row from a test row by the predictive's entropy.

    OMP_NUM_THREADS=1 python benchmarks/laplace_prior_scale.py --cases digits,mnist5k_mlp,mnist1d_cnn --seeds 0-2 \\
        [--members last_layer_laplace,...] [--cells F] [--json F]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from functools import partial
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cells_file, parse_seeds, resumed_or_fitted  # noqa: E402
from defaults import ALL_CASES, SMALL_EPOCHS, Rows, fitted_member  # noqa: E402

from zoo.errors import ZooInputError  # noqa: E402
from zoo.exits import exit_code  # noqa: E402
from zoo.metrics import ood_auroc  # noqa: E402
from zoo.runs import write_json  # noqa: E402

LAPLACE_MEMBERS = ("subnetwork_laplace", "last_layer_laplace", "diagonal_laplace", "kfac_laplace")
PRIORS = {"default": {}, "evidence": {"precision_scale": 1.0}}  # the rows' factor where they reject; the evidence's
DRAWS = 200  # predictive draws (the link mc's; the closed forms take none)
TOKEN_CASES = ("sequence",)  # classification cases whose inputs are token ids: no shift of them is meaningful here


def shifted_inputs(x: torch.Tensor, seed: int = 0) -> dict[str, torch.Tensor]:
    """The test inputs shifted: ``permuted``, each row's features in one random order (seeded), and ``rotated``,
    each row turned by 90 degrees where it is a square image of at least 8 x 8 given as a row."""
    flat = x.reshape(len(x), -1)
    order = torch.randperm(flat.shape[1], generator=torch.Generator().manual_seed(seed))
    out = {"permuted": flat[:, order].reshape(x.shape)}
    side = math.isqrt(flat.shape[1])
    if side >= 8 and side * side == flat.shape[1]:
        out["rotated"] = flat.reshape(-1, side, side).rot90(1, (1, 2)).reshape(x.shape)
    return out


def scored_fit(size: str, name: str, rows: Rows, seed: int, member: str, prior: str, epochs: int) -> dict:
    """One cell: ``member`` fitted on case ``name``'s ``rows`` under ``prior`` (:data:`PRIORS`), with its test NLL
    and accuracy, the factor it chose (None: none), and the entropy AUROC of each shift against the test rows."""
    case = ALL_CASES[name]
    torch.manual_seed(seed)
    bnn = fitted_member(case, rows, case.net(rows), seed, member, {"epochs": epochs, **PRIORS[prior]})
    test = bnn.evaluate((rows.x_test, rows.y_test))
    inside = bnn.predict(rows.x_test, num_samples=DRAWS).draws.log_probs
    auroc = {shift: ood_auroc(inside, bnn.predict(x, num_samples=DRAWS).draws.log_probs)["entropy"]
             for shift, x in shifted_inputs(rows.x_test).items()}
    return {"size": size, "case": name, "seed": seed, "member": member, "prior": prior, "nll": test["nll"],
            "accuracy": test["accuracy"], "precision_scale": bnn.chosen.get("inference.precision_scale"),
            "auroc": auroc}


def main(argv: list[str] | None = None) -> dict:
    """Fit every (case, seed, member, prior) cell not yet in ``--cells``, print the tables; returns the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="digits,mnist5k_mlp,mnist1d_cnn",
                        help="classification cases of benchmarks/defaults.py whose inputs are numbers")
    parser.add_argument("--members", default=",".join(LAPLACE_MEMBERS), help="Laplace presets")
    parser.add_argument("--seeds", default="0-2", help="seeds, e.g. 0-2")
    parser.add_argument("--size", choices=("full", "small"), default="full",
                        help="small: the defaults suite's 200 rows per case and 2 epochs (the tests' run)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--cells", default=None, help="a JSON-lines file of finished cells: read, and appended to")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    members = [m for m in args.members.split(",") if m]
    numeric = [n for n, c in ALL_CASES.items() if c.task == "classification" and n not in TOKEN_CASES]
    for name in cases:
        if name not in numeric:
            raise ZooInputError("--cases", name, "use classification cases of benchmarks/defaults.py whose inputs "
                                f"are numbers (not token ids): {', '.join(numeric)}")
    for name in members:
        if name not in LAPLACE_MEMBERS:
            raise ZooInputError("--members", name, f"use Laplace presets: {', '.join(LAPLACE_MEMBERS)}")
    seeds = parse_seeds(args.seeds)
    torch.set_num_threads(args.threads)
    cells_path, done = cells_file(args.cells, lambda c: (c["size"], c["case"], c["seed"], c["member"], c["prior"]))
    report: dict = {"size": args.size, "threads": torch.get_num_threads(), "cases": {}, "ratios": {}}
    for name in cases:
        case = ALL_CASES[name]
        epochs = SMALL_EPOCHS if args.size == "small" else case.epochs
        fitted: dict[tuple[str, str], list[dict]] = {}
        for seed in seeds:
            rows = case.rows(seed, args.size, None)
            for member in members:
                for prior in PRIORS:
                    cell, new = resumed_or_fitted(done, cells_path, (args.size, name, seed, member, prior),
                                                  partial(scored_fit, args.size, name, rows, seed, member, prior,
                                                          epochs))
                    if new:
                        shown = ", ".join(f"{k} {v:.4f}" for k, v in cell["auroc"].items())
                        print(f"{name}, seed {seed}, {member}, {prior}: NLL {cell['nll']:.4f}, entropy AUROC "
                              f"{shown}, factor {cell['precision_scale']}", flush=True)
                    fitted.setdefault((member, prior), []).append(cell)
        shifts = list(fitted[members[0], "default"][0]["auroc"])
        out = {}
        for (member, prior), cells in fitted.items():
            out.setdefault(member, {})[prior] = {
                "nll": statistics.fmean(c["nll"] for c in cells),
                "accuracy": statistics.fmean(c["accuracy"] for c in cells),
                "rejected": sum(c["precision_scale"] is not None for c in cells),
                "auroc": {s: statistics.fmean(c["auroc"][s] for c in cells) for s in shifts}}
        for member, by in out.items():
            report["ratios"][f"{name}/{member}/nll_ratio_default_to_evidence"] = \
                by["default"]["nll"] / by["evidence"]["nll"]
        report["cases"][name] = {"members": out, "shifts": shifts}
        table = Table(title=f"{name}: the evidence's prior -> the defaults (the rows' factor where they reject it), "
                      f"means over seeds {args.seeds}; {torch.get_num_threads()} thread(s)")
        for column in ("member", "fits rejected", "test NLL", *(f"AUROC {s}" for s in shifts)):
            table.add_column(column, justify="left" if column == "member" else "right")
        for member, by in out.items():
            evidence, default = by["evidence"], by["default"]
            table.add_row(member, f"{default['rejected']} of {len(seeds)}",
                          f"{evidence['nll']:.3f} -> {default['nll']:.3f}",
                          *(f"{evidence['auroc'][s]:.3f} -> {default['auroc'][s]:.3f}" for s in shifts))
        Console(width=max(Console().width, 120)).print(table)
    if args.json:
        write_json(Path(args.json), report)
    return report


if __name__ == "__main__":
    sys.exit(exit_code(main))
