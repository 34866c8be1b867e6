"""Per-chain cost of the many-chain HMC's potential and gradient, all chains in one call or in chunks.

    python benchmarks/hmc_chain_chunk.py [--spec configs/mean_field_digits.yaml] [--chains 64]
        [--chunks 64,32,16,8,4,2,1] [--modes eager,compiled] [--reps 5] [--threads 1] [--json PATH]

The potential is the one ``inference.method: hmc`` samples (the spec's net, data and likelihood; an N(0, 1) prior on
every weight), evaluated at C random points. For each mode (eager autograd, or ``inference.compile``'s traced graph)
and chunk size it times one value-and-gradient of all C chains (``inference.chain_chunk``: that many per call),
after two untimed calls, and prints ms per chain. ``ratio_all_at_once_to_this`` = cost with all chains in one call
÷ cost with the chunk, measured one after another in one process: above 1, chunking pays (the activations of all
chains outgrow the CPU's caches).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import parse_counts  # noqa: E402 - sibling module of this script

from zoo.errors import ZooInputError  # noqa: E402
from zoo.exits import exit_code  # noqa: E402
from zoo.inference.potential import Potential  # noqa: E402
from zoo.pipeline import prepare  # noqa: E402
from zoo.runs import write_json  # noqa: E402
from zoo.spec import RunSpec, spec_tree  # noqa: E402

DEFAULT_SPEC = Path(__file__).resolve().parents[1] / "configs" / "mean_field_digits.yaml"


def time_call(potential: Potential, z: torch.Tensor, reps: int) -> float:
    """Seconds per value-and-gradient of all rows of ``z`` (after two untimed calls: compiling, caches)."""
    for _ in range(2):
        potential.value_and_grad(z)
    started = time.perf_counter()
    for _ in range(reps):
        potential.value_and_grad(z)
    return (time.perf_counter() - started) / reps


def main(argv: list[str] | None = None) -> dict:
    """Time every mode and chunk size; print the table; optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(DEFAULT_SPEC), help="the net and data (default: the digits MLP)")
    parser.add_argument("--chains", type=int, default=64)
    parser.add_argument("--chunks", default="64,32,16,8,4,2,1")
    parser.add_argument("--modes", default="eager,compiled")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    chunks = parse_counts(args.chunks, "--chunks", "64,16,4")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"eager", "compiled"}:
        raise ZooInputError("--modes", args.modes, "use eager, compiled or both")
    if args.chains < 1 or args.reps < 1 or args.threads < 1:
        raise ZooInputError("--chains/--reps/--threads", f"{args.chains}/{args.reps}/{args.threads}", "use 1 or more")
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=FutureWarning)
    tree = spec_tree(args.spec, [])
    tree.pop("member", None)  # the sections below replace a member preset's family, guide, prior and method
    tree["prior"] = {"name": "normal", "scale": 1.0}
    tree["model"], tree["guide"] = {"family": "all_weights"}, {"name": "delta"}
    tree["inference"] = {"method": "hmc", "num_chains": args.chains}
    data, family, _, _ = prepare(RunSpec.model_validate(tree))
    torch.manual_seed(0)
    rows = []
    for mode in modes:
        potential = Potential(family, data, compile=mode == "compiled")
        z = 0.1 * torch.randn(args.chains, potential.coords.dim, dtype=data.x_train.dtype)
        timings = {}
        for chunk in [args.chains, *[c for c in chunks if c != args.chains]]:
            potential.chain_chunk = chunk
            timings[chunk] = time_call(potential, z, args.reps)
        whole = timings[args.chains]
        for chunk, seconds in timings.items():
            rows.append({"mode": mode, "chunk": chunk, "ms_per_call": 1e3 * seconds,
                         "ms_per_chain": 1e3 * seconds / args.chains,
                         "ratio_all_at_once_to_this": whole / seconds})
    result = {"spec": args.spec, "data": data.name, "rows_of_data": data.n_train, "latent_dim": potential.coords.dim,
              "chains": args.chains, "threads": args.threads, "reps": args.reps, "timings": rows}
    table = Table(title=f"potential + gradient of {args.chains} chains, {data.name} ({data.n_train} rows, "
                        f"{potential.coords.dim:,} weights), {args.threads} thread(s)", title_justify="left")
    for column in ("mode", "chains per call", "ms per call", "ms per chain", "all at once ÷ this"):
        table.add_column(column, justify="left" if column == "mode" else "right")
    for row in rows:
        table.add_row(row["mode"], str(row["chunk"]), f"{row['ms_per_call']:.1f}", f"{row['ms_per_chain']:.2f}",
                      f"{row['ratio_all_at_once_to_this']:.2f}")
    Console().print(table)
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    sys.exit(exit_code(main))
