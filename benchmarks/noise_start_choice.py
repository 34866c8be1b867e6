"""Do the validation rows know where a learned noise should start? Each start's whole fit, scored on them and on the
test rows.

A regression fit that sets its predictive σ on validation rows starts its own σ low (0.01 of the targets' standard
deviation) or at the noise prior's median (0.37), whichever run those rows score better
(:meth:`zoo.likelihoods.gaussian.Gaussian.open_start`). This measures the premise: on the defaults suite's regression
cases (``benchmarks/defaults.py``: the same rows, nets, loaders and ``fit(loader, val=...)`` call), each member is
fitted at each start given by hand (``likelihood.noise_prior.init``), each fit choosing its own lr, and scored by its
validation rows' test log-likelihood (standardised, higher is better) and by the test rows' RMSE and NLL (original
units). A row says which start the validation rows prefer and whether the test RMSE agrees.

    OMP_NUM_THREADS=1 python benchmarks/noise_start_choice.py --cases toy,uci,uci_energy,uci_boston \\
        --members map,mean_field --seeds 0-2 --data-dir ../shared/data/uci [--size small] [--json PATH]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import parse_seeds  # noqa: E402
from defaults import CASES, HELD_OUT, SMALL_EPOCHS, figures_on_test_rows, loader  # noqa: E402

import zoo  # noqa: E402
from zoo.errors import ZooInputError  # noqa: E402
from zoo.exits import exit_code  # noqa: E402
from zoo.likelihoods.gaussian import LOW_NOISE_START, NoisePrior  # noqa: E402
from zoo.members import MEMBERS  # noqa: E402
from zoo.runs import write_json  # noqa: E402

MEDIAN_START = math.exp(NoisePrior().loc)  # the noise prior's median, the other start
STARTS = {"low": LOW_NOISE_START, "median": MEDIAN_START}


def start_figures(case_name: str, seed: int, member: str, start: float, size: str, data_dir: str | None) -> dict:
    """One member fitted as the suite fits it, its σ started at ``start``: the validation rows' test LL and the test
    rows' RMSE and NLL."""
    case = {**CASES, **HELD_OUT}[case_name]
    rows = case.rows(seed, size, data_dir)
    torch.manual_seed(seed)
    bnn = zoo.BNN(case.net(rows), member=member, seed=seed,
                  likelihood={"name": "gaussian", "noise_prior": {"init": start}})
    bnn.fit(loader(rows, case, seed), val=(rows.x_val, rows.y_val), progress=False,
            epochs=SMALL_EPOCHS if size == "small" else case.epochs)
    return {"val_ll": float(bnn.metrics["test_ll"]), **figures_on_test_rows(bnn, case, rows)}


def main(argv: list[str] | None = None) -> dict:
    """Fit every (case, seed, member, start) cell and print the table; returns the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="toy,uci,uci_energy,uci_boston", help="comma-separated regression cases")
    parser.add_argument("--members", default="map,mean_field", help="comma-separated member presets")
    parser.add_argument("--seeds", default="0-2", help="seeds, e.g. 0-2 (a UCI case's split is the seed)")
    parser.add_argument("--size", choices=("full", "small"), default="full",
                        help=f"small: 200 rows and {SMALL_EPOCHS} epochs (the tests' run)")
    parser.add_argument("--data-dir", default=os.environ.get("ZOO_DATA_DIR"), help="the UCI sets' folder")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    cases, members = [c for c in args.cases.split(",") if c], [m for m in args.members.split(",") if m]
    known = {**CASES, **HELD_OUT}
    bad_cases = [c for c in cases if c not in known or known[c].task != "regression"]
    if bad_cases or not cases:
        raise ZooInputError("--cases", args.cases, "name regression cases of benchmarks/defaults.py: "
                            + ", ".join(c for c, case in known.items() if case.task == "regression"))
    if [m for m in members if m not in MEMBERS] or not members:
        raise ZooInputError("--members", args.members, f"name member presets, e.g. map (known: {', '.join(MEMBERS)})")
    torch.set_num_threads(args.threads)
    results = []
    for case in cases:
        for seed in parse_seeds(args.seeds):
            for member in members:
                by_start = {name: start_figures(case, seed, member, start, args.size, args.data_dir)
                            for name, start in STARTS.items()}
                preferred = max(by_start, key=lambda s: by_start[s]["val_ll"])
                lower_rmse = min(by_start, key=lambda s: by_start[s]["rmse"])
                results.append({"case": case, "seed": seed, "member": member, **by_start, "preferred": preferred,
                                "lower_test_rmse": lower_rmse})
    agreeing = sum(r["preferred"] == r["lower_test_rmse"] for r in results)
    table = Table(title=f"where σ starts: the validation rows' choice against the test rows "
                        f"(low {LOW_NOISE_START:g}, median {MEDIAN_START:.3f})")
    for column in ("case", "seed", "member", "val LL low / median", "rows prefer", "test RMSE low / median",
                   "test NLL low / median", "test RMSE agrees"):
        table.add_column(column)
    for r in results:
        low, median = r["low"], r["median"]
        table.add_row(r["case"], str(r["seed"]), r["member"], f"{low['val_ll']:.3f} / {median['val_ll']:.3f}",
                      r["preferred"], f"{low['rmse']:.4g} / {median['rmse']:.4g}",
                      f"{low['nll']:.3f} / {median['nll']:.3f}", "yes" if r["preferred"] == r["lower_test_rmse"]
                      else "no")
    console = Console()
    console.print(table)
    console.print(f"the rows' choice has the lower test RMSE in {agreeing} of {len(results)} cells")
    summary = {"command": " ".join(["python benchmarks/noise_start_choice.py", *(argv or sys.argv[1:])]),
               "starts": STARTS, "results": results, "agreeing": agreeing,
               "agreement_ratio": agreeing / len(results)}
    if args.json:
        write_json(Path(args.json), summary)
    return summary


if __name__ == "__main__":
    sys.exit(exit_code(main))
