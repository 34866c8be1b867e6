"""A step of its own for the rank-1 factors: the defaults suite's rank-1 members with the factors' lr scaled.

Rank-1 BNNs train a shared point-estimated W and distributions over the rank-1 factors; Dusenberry et al. (2020)
give the factors a learning rate of their own (a multiple of the shared one). The zoo steps every trained tensor at
one lr, the one chosen on the validation rows. This what-if fits the suite's rank-1 members (``benchmarks/
defaults.py``: the same rows, net, loader and ``fit(loader, val=...)`` call) with the guide's tensors, which are the
factors' (and a GSM factor's scales), at ``M`` times the lr the schedule sets, W and the per-member biases at it.
It patches the SVI fit's optimiser into two parameter groups (the zoo has no such setting), so ``M = 1`` is the
defaults themselves and reproduces the suite's cells; the bar is the suite's (the plain net's accuracy less a
point, or 1.05 times its RMSE, and its NLL).

    OMP_NUM_THREADS=1 python benchmarks/rank1_factor_step.py --cases twoclass,digits --seeds 0-2 \\
        --multipliers 1,3,10 [--members rank1_normal,...] [--data-dir ../shared/data/uci] [--cells F] [--json F]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cells_file, parse_seeds, resumed_or_fitted  # noqa: E402
from defaults import ALL_CASES, SMALL_EPOCHS, meets_bar, member_fit, plain_net  # noqa: E402

from zoo.errors import ZooInputError  # noqa: E402
from zoo.exits import exit_code  # noqa: E402
from zoo.inference import svi  # noqa: E402
from zoo.runs import write_json  # noqa: E402

RANK1_MEMBERS = ("rank1_normal", "rank1_cauchy", "rank1_gsm", "batch_ensemble")


class ScaledAdam(torch.optim.Adam):
    """Adam whose parameter groups step at their ``lr_scale`` times the lr the SVI schedule sets on them."""

    def step(self, closure=None):  # noqa: ANN001, ANN201 -- torch's signature
        lrs = [group["lr"] for group in self.param_groups]
        for group in self.param_groups:
            group["lr"] = group["lr"] * group["lr_scale"]
        try:
            return super().step(closure)
        finally:
            for group, lr in zip(self.param_groups, lrs, strict=True):
                group["lr"] = lr


def factor_groups(named: dict[str, torch.nn.Parameter], multiplier: float) -> list[dict]:
    """The SVI fit's trained tensors (``SVIRun.named``) as two groups: the guide's (``guide.*``: the factors) at
    ``multiplier`` times the lr, the family's point parameters (``family.*``: W, the per-member biases) at it."""
    guide = [p for name, p in named.items() if name.startswith("guide.")]
    point = [p for name, p in named.items() if not name.startswith("guide.")]
    return [{"params": guide, "lr_scale": multiplier}, {"params": point, "lr_scale": 1.0}]


@contextlib.contextmanager
def factor_step(multiplier: float) -> Iterator[None]:
    """Every SVI fit inside steps the guide's tensors at ``multiplier`` times the lr (:func:`factor_groups`)."""
    built = svi.SVIRun.__init__

    def patched(run: svi.SVIRun, fit) -> None:  # noqa: ANN001 -- a FitContext
        built(run, fit)
        params = list(run.named.values())
        run.optimizer = ScaledAdam(factor_groups(run.named, multiplier), lr=svi.starting_lr(fit.spec),
                                   fused=all(p.dtype in (torch.float32, torch.float64) for p in params))

    svi.SVIRun.__init__ = patched
    try:
        yield
    finally:
        svi.SVIRun.__init__ = built


def stepped_cell(size: str, name: str, rows, seed: int, member: str, multiplier: float, epochs: int) -> dict:
    """One cell: ``member`` fitted as the defaults suite fits it on case ``name``'s ``rows``, its factors at
    ``multiplier`` times the lr, and its accuracy (or RMSE) and NLL."""
    case = ALL_CASES[name]
    figure = "accuracy" if case.task == "classification" else "rmse"
    with factor_step(multiplier):
        cell = member_fit(case, rows, seed, member, epochs, size=size)
    return {"size": size, "case": name, "seed": seed, "member": member, "multiplier": multiplier,
            figure: cell[figure], "nll": cell["nll"]}


def _mean(cells: list[dict], key: str) -> float:
    return statistics.fmean(c[key] for c in cells)


def main(argv: list[str] | None = None) -> dict:
    """Fit every (case, seed, member, multiplier) cell not yet in ``--cells``, print the tables; returns the
    figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="twoclass,digits,sequence,toy,uci", help="cases of benchmarks/defaults.py")
    parser.add_argument("--members", default=",".join(RANK1_MEMBERS), help="rank-1 presets")
    parser.add_argument("--seeds", default="0-2", help="seeds, e.g. 0-2")
    parser.add_argument("--multipliers", default="1,3,10", help="the factors' lr multipliers (1: the defaults)")
    parser.add_argument("--size", choices=("full", "small"), default="full",
                        help="small: the defaults suite's 200 rows per case and 2 epochs (the tests' run)")
    parser.add_argument("--data-dir", default=None, help="the UCI sets' folder (UCI cases)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--cells", default=None, help="a JSON-lines file of finished cells: read, and appended to")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    members = [m for m in args.members.split(",") if m]
    for name in cases:
        if name not in ALL_CASES:
            raise ZooInputError("--cases", name, f"use cases of benchmarks/defaults.py: {', '.join(ALL_CASES)}")
    for name in members:
        if name not in RANK1_MEMBERS:
            raise ZooInputError("--members", name, f"use rank-1 presets: {', '.join(RANK1_MEMBERS)}")
    try:
        multipliers = [float(m) for m in args.multipliers.split(",") if m]
    except ValueError:
        raise ZooInputError("--multipliers", args.multipliers, "write positive numbers, e.g. 1,3,10") from None
    if not multipliers or min(multipliers) <= 0:
        raise ZooInputError("--multipliers", args.multipliers, "write positive numbers, e.g. 1,3,10")
    seeds = parse_seeds(args.seeds)
    torch.set_num_threads(args.threads)
    cells_path, done = cells_file(args.cells, lambda c: (c["size"], c["case"], c["seed"], c["member"], c["multiplier"]))
    report: dict = {"size": args.size, "threads": torch.get_num_threads(), "cases": {}, "ratios": {}}
    for name in cases:
        case = ALL_CASES[name]
        epochs = SMALL_EPOCHS if args.size == "small" else case.epochs
        figure = "accuracy" if case.task == "classification" else "rmse"
        plain, fitted = [], {}
        for seed in seeds:
            rows = case.rows(seed, args.size, args.data_dir)
            plain.append(plain_net(case, rows, seed, epochs))
            for member in members:
                for multiplier in multipliers:
                    cell, new = resumed_or_fitted(done, cells_path, (args.size, name, seed, member, multiplier),
                                                  partial(stepped_cell, args.size, name, rows, seed, member,
                                                          multiplier, epochs))
                    if new:
                        print(f"{name}, seed {seed}, {member}, factors' lr x{multiplier:g}: {figure} "
                              f"{cell[figure]:.4f}, NLL {cell['nll']:.4f}", flush=True)
                    fitted.setdefault((member, multiplier), []).append(cell)
        bar_figure, bar_nll = _mean(plain, figure), _mean(plain, "nll")
        rows_out = {}
        for (member, multiplier), cells in fitted.items():
            value, nll = _mean(cells, figure), _mean(cells, "nll")
            meets, _ = meets_bar(case, {figure: value, "nll": nll}, {figure: bar_figure, "nll": bar_nll})
            rows_out.setdefault(member, {})[f"{multiplier:g}"] = {figure: value, "nll": nll, "meets_bar": meets}
            if multiplier != 1.0 and (member, 1.0) in fitted:
                report["ratios"][f"{name}/{member}/x{multiplier:g}/nll_ratio_to_x1"] = \
                    nll / _mean(fitted[(member, 1.0)], "nll")
        report["cases"][name] = {"plain": {figure: bar_figure, "nll": bar_nll}, "members": rows_out}
        table = Table(title=f"{name}: {figure} / NLL over seeds {args.seeds}, the factors' lr x M (bar: the plain "
                      f"net's {bar_figure:.3f} / {bar_nll:.3f}; {torch.get_num_threads()} thread(s))")
        table.add_column("member")
        for multiplier in multipliers:
            table.add_column(f"x{multiplier:g}", justify="right")
        for member, by in rows_out.items():
            table.add_row(member, *(f"{r[figure]:.3f} / {r['nll']:.3f} {'✓' if r['meets_bar'] else '✗'}"
                                    for r in by.values()))
        Console(width=max(Console().width, 120)).print(table)
    if args.json:
        write_json(Path(args.json), report)
    return report


if __name__ == "__main__":
    sys.exit(exit_code(main))
