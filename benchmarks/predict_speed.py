"""A predictive pass under S weight draws: one vmap over the draws against the draws one after another.

    python benchmarks/predict_speed.py [--shapes 32x1000,400x100] [--rounds 5] [--steps 2] [--threads 1]
        [--json PATH]

``Posterior.predict`` runs the net once per weight draw. ``zoo.nets.forward_stacked`` does it as one
``torch.func.vmap`` for an MLP and one draw after another for a net with convolutions; this script times both
ways on both kinds of net, side by side in alternating rounds, with the same random draws and inputs:
LeNet-5 on 28×28 images (mnist5k's shape) and the digits MLP 64-100-10, each at every ``DRAWSxROWS`` shape (by
default a shift evaluation's 32 draws of 1,000 test images, and an HMC reference's 400 draws of 100 rows).
``ratio_vmap_to_loop`` above 1 means the loop is faster. Both ways give the same outputs (checked to 1e-3 before
timing).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from torch.func import functional_call, vmap

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import time_side_by_side  # noqa: E402 - sibling module of this script

from zoo.errors import ZooInputError  # noqa: E402
from zoo.exits import exit_code  # noqa: E402
from zoo.nets import build_lenet5, build_mlp  # noqa: E402
from zoo.runs import write_json  # noqa: E402


def nets() -> dict[str, tuple[torch.nn.Module, int]]:
    """The nets timed, each with its input width."""
    return {"LeNet-5, 28x28 images": (build_lenet5(784, 10), 784),
            "MLP 64-100-10": (build_mlp(64, 10, [100]), 64)}


def draws_of(net: torch.nn.Module, count: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """``count`` random weight draws around the net's initial weights, stacked ``{name: [S, *shape]}``."""
    return {name: p.detach() + 0.05 * torch.randn(count, *p.shape, generator=gen)
            for name, p in net.named_parameters()}


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``32x1000,400x100`` as [(draws, rows), ...]."""
    try:
        shapes = [tuple(int(v) for v in part.split("x")) for part in text.split(",") if part.strip()]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
        raise ZooInputError("--shapes", text, "write DRAWSxROWS pairs, e.g. 32x1000,400x100")
    return shapes


def measure(args: argparse.Namespace) -> dict:
    """Microseconds per predictive pass, each way, net and shape, and their ratio."""
    if min(args.rounds, args.steps, args.threads) < 1:
        raise ZooInputError("--rounds/--steps/--threads", None, "use 1 or more for each")
    shapes = parse_shapes(args.shapes)
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    out = {"threads": args.threads, "rounds": args.rounds, "steps": args.steps, "cases": []}
    for label, (net, width) in nets().items():
        net.eval()
        for count, rows in shapes:
            stacked, x = draws_of(net, count, gen), torch.randn(rows, width, generator=gen)

            def by_vmap(net=net, stacked=stacked, x=x):
                return vmap(lambda one: functional_call(net, one, (x,)))(stacked)

            def by_loop(net=net, stacked=stacked, x=x, count=count):
                return torch.stack([functional_call(net, {n: v[s] for n, v in stacked.items()}, (x,))
                                    for s in range(count)])

            with torch.no_grad():
                gap = float((by_vmap() - by_loop()).abs().max())
                if gap > 1e-3:
                    raise AssertionError(f"{label}: vmap and the loop disagree by {gap}")
                vmapped, looped = time_side_by_side(by_vmap, by_loop, args.rounds, args.steps, warmup=1)
            vmap_us, loop_us = sorted(vmapped)[len(vmapped) // 2], sorted(looped)[len(looped) // 2]
            out["cases"].append({"net": label, "draws": count, "rows": rows, "vmap_us": vmap_us, "loop_us": loop_us,
                                 "ratio_vmap_to_loop": vmap_us / loop_us})
    return out


def table(result: dict) -> Table:
    t = Table(title=f"one predictive pass, {result['threads']} thread(s); median of {result['rounds']} alternating "
                    "rounds", title_justify="left")
    for column in ("net", "draws x rows", "vmap (ms)", "one draw after another (ms)", "vmap ÷ loop"):
        t.add_column(column, justify="left" if column == "net" else "right")
    for c in result["cases"]:
        t.add_row(c["net"], f"{c['draws']} x {c['rows']:,}", f"{c['vmap_us'] / 1e3:,.1f}",
                  f"{c['loop_us'] / 1e3:,.1f}", f"{c['ratio_vmap_to_loop']:.2f}")
    return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/predict_speed.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="32x1000,400x100", help="DRAWSxROWS pairs (default 32x1000,400x100)")
    p.add_argument("--rounds", type=int, default=5, help="alternating timed rounds (default 5)")
    p.add_argument("--steps", type=int, default=2, help="passes per round and side (default 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--json", help="also write the figures to this JSON file")
    args = p.parse_args(argv)

    def run() -> None:
        result = measure(args)
        Console(width=max(Console().width, 120)).print(table(result))
        if args.json:
            write_json(Path(args.json), result)

    return exit_code(run)


if __name__ == "__main__":
    sys.exit(main())
