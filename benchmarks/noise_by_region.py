"""Where a noise set on the validation rows helps and where it costs: the toy's test rows split by where they lie.

The defaults suite's toy (``benchmarks/defaults.py``: the same rows, net, loader and ``fit(loader, val=...)`` call)
holds its validation rows in the two training clusters, and two thirds of its test rows in the gap between them
and beyond. Each member is fitted keeping its own noise (``noise_by: fit``), and its predictive is scored on the test
rows in the clusters and on the rest twice, with one set of weight draws: with each draw's own σ, and with the one
σ likeliest on the validation rows (what ``noise_by`` sets by default, :mod:`zoo.inference.noise_choice`). Beside
them, each region's RMSE and the draws' spread (the root mean variance of the draws' means): where the spread falls
short of the errors, only a large σ keeps the NLL finite. Figures in original target units.

    OMP_NUM_THREADS=1 python benchmarks/noise_by_region.py --seeds 0-2 \\
        --members swag,batch_ensemble,rank1_normal,cyclical_sghmc [--size small] [--json PATH]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import parse_seeds  # noqa: E402
from defaults import CASES, SMALL_EPOCHS, Rows, loader  # noqa: E402

import zoo  # noqa: E402
from zoo.errors import ZooInputError  # noqa: E402
from zoo.exits import exit_code  # noqa: E402
from zoo.inference.noise_choice import likeliest_noise  # noqa: E402
from zoo.members import MEMBERS  # noqa: E402
from zoo.metrics import regression_metrics  # noqa: E402
from zoo.runs import write_json  # noqa: E402

DRAWS = 100  # weight draws per fit, the members' predictive_samples


def in_the_clusters(rows: Rows) -> torch.Tensor:
    """Which test rows lie within the span of one of the two training clusters (the toy's inputs are 1-D, the gap
    straddling 0)."""
    x, train = rows.x_test[:, 0], rows.x_train[:, 0]
    left, right = train[train < 0], train[train > 0]
    return ((x >= left.min()) & (x <= left.max())) | ((x >= right.min()) & (x <= right.max()))


def region_figures(loc: torch.Tensor, own_noise: torch.Tensor, set_noise: float, y: torch.Tensor,
                   y_unit: float) -> dict[str, float]:
    """One region's figures from each draw's means ``loc [S, B]`` and noise ``own_noise [S, B]`` (the rows' units):
    RMSE of the mean, the draws' spread, and the NLL with the draws' own σ and with ``set_noise``; original units."""
    spread = float(loc.var(0, unbiased=False).mean().sqrt()) if loc.shape[0] > 1 else 0.0
    return {"rows": int(y.numel()), "rmse": float(((loc.mean(0) - y) ** 2).mean().sqrt()) * y_unit,
            "spread": spread * y_unit,
            "nll_fit": math.log(y_unit) - regression_metrics(loc, own_noise, y)["test_ll"],
            "nll_set": math.log(y_unit) - regression_metrics(loc, loc.new_tensor(set_noise), y)["test_ll"]}


def member_regions(rows: Rows, seed: int, member: str, epochs: int) -> dict:
    """Fit ``member`` as the suite does, keeping its own noise, and score both noises on each region."""
    case = CASES["toy"]
    torch.manual_seed(seed)
    bnn = zoo.BNN(case.net(rows), member=member, likelihood={"name": "gaussian"}, seed=seed)
    bnn.fit(loader(rows, case, seed), val=(rows.x_val, rows.y_val), epochs=epochs, progress=False, noise_by="fit")
    posterior, data = bnn.posterior, bnn.data
    torch.manual_seed(seed)
    draws = posterior.sample(DRAWS)
    val = posterior.predict(data.x_calibration, draws=draws)
    noise = likeliest_noise(val.loc, data.y_calibration)
    rows_test = bnn.test_set((rows.x_test, rows.y_test))  # as the fit standardised its own rows
    test = posterior.predict(rows_test.x_test, draws=draws)
    near, y, unit = in_the_clusters(rows), rows_test.y_test.to(test.loc), rows.y_unit * data.y_std
    return {"member": member, "seed": seed, "fit_noise": float(val.scale.mean()) * unit, "set_noise": noise * unit,
            **{region: region_figures(test.loc[:, rows_in], test.scale[:, rows_in], noise, y[rows_in], unit)
               for region, rows_in in (("clusters", near), ("gap", ~near))}}


def main(argv: list[str] | None = None) -> list[dict]:
    """Fit every (seed, member) cell and print the table; returns the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", default="swag,batch_ensemble,rank1_normal,cyclical_sghmc",
                        help="comma-separated member presets")
    parser.add_argument("--seeds", default="0-2", help="seeds, e.g. 0-2")
    parser.add_argument("--size", choices=("full", "small"), default="full",
                        help=f"small: 200 rows and {SMALL_EPOCHS} epochs (the tests' run)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    members = [m for m in args.members.split(",") if m]
    unknown = [m for m in members if m not in MEMBERS]
    if unknown or not members:
        raise ZooInputError("--members", args.members, f"name member presets, e.g. swag (known: {', '.join(MEMBERS)})")
    torch.set_num_threads(args.threads)
    epochs = SMALL_EPOCHS if args.size == "small" else CASES["toy"].epochs
    results = []
    for seed in parse_seeds(args.seeds):
        rows = CASES["toy"].rows(seed, args.size, None)
        results += [member_regions(rows, seed, member, epochs) for member in members]
    table = Table(title=f"toy: the test rows by region, {epochs} epochs; σ the fit's → set on the validation rows")
    for column in ("member", "seed", "σ", "region", "rows", "RMSE", "draws' spread", "NLL, the fit's σ",
                   "NLL, σ set"):
        table.add_column(column)
    for r in results:
        for region in ("clusters", "gap"):
            f = r[region]
            table.add_row(r["member"], str(r["seed"]), f"{r['fit_noise']:.3f} → {r['set_noise']:.3f}",
                          "in the clusters" if region == "clusters" else "the gap and beyond", str(f["rows"]),
                          f"{f['rmse']:.3f}", f"{f['spread']:.3f}", f"{f['nll_fit']:.3f}", f"{f['nll_set']:.3f}")
    Console().print(table)
    if args.json:
        write_json(Path(args.json), {"command": " ".join(["python benchmarks/noise_by_region.py",
                                                          *(argv or sys.argv[1:])]), "results": results})
    return results


if __name__ == "__main__":
    sys.exit(exit_code(main))
