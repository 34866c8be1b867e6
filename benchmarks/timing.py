"""What the speed benchmarks share: their common options, their two cases, and side-by-side timing."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from zoo.data.digits import load_digits

Case = tuple[list[int], torch.Tensor, torch.Tensor]


def batches(n: int, batch_size: int, seed: int, device: torch.device | str = "cpu"):
    """Endless minibatch index tensors on ``device``: a fresh permutation per epoch (the same order for both
    sides, drawn on the host)."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        yield from torch.randperm(n, generator=gen).to(device).split(batch_size)


def optimiser_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> float:
    """Backward and one step on ``loss`` (what a baseline's training step ends with); returns the loss."""
    value = float(loss.detach())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return value


def add_timing_arguments(parser: argparse.ArgumentParser, rounds: int, steps: int, warmup: int) -> None:
    """--rounds, --steps, --warmup, --synthetic-rows, --threads and --json."""
    parser.add_argument("--rounds", type=int, default=rounds, help="alternating timed rounds")
    parser.add_argument("--steps", type=int, default=steps, help="timed steps per round and side")
    parser.add_argument("--warmup", type=int, default=warmup, help="untimed steps of each side before timing")
    parser.add_argument("--synthetic-rows", type=int, default=10_000, help="rows of the 784-input synthetic set")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--json", help="also write the figures to this JSON file")


def benchmark_cases(args: argparse.Namespace) -> dict[str, Case]:
    """Set the threads and seed, then the two cases: a 64-100-10 MLP on digits, 784-400-400-10 on synthetic data."""
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    digits = load_digits(seed=0)
    synthetic_x = torch.randn(args.synthetic_rows, 784)
    synthetic_y = torch.randint(0, 10, (args.synthetic_rows,))
    return {
        "digits 64-100-10": ([64, 100, 10], digits.x_train, digits.y_train),
        "784-400-400-10": ([784, 400, 400, 10], synthetic_x, synthetic_y),
    }


def time_side_by_side(a: Callable[[], object], b: Callable[[], object], rounds: int, steps: int,
                      warmup: int = 20, sync: Callable[[], None] = lambda: None) -> tuple[list[float], list[float]]:
    """Microseconds per call of ``a`` and ``b``, alternating in ``rounds`` blocks of ``steps`` calls each; ``sync``
    waits for the device's queued work (``torch.cuda.synchronize`` on a GPU) before a block's clock starts and stops.
    """
    for _ in range(warmup):
        a()
        b()
    ta, tb = [], []
    for _ in range(rounds):
        for fn, out in ((a, ta), (b, tb)):
            sync()
            start = time.perf_counter()
            for _ in range(steps):
                fn()
            sync()
            out.append((time.perf_counter() - start) / steps * 1e6)
    return ta, tb
