"""The DataLoader path's SVI step against the in-memory path's, at the same batch size, side by side.

``zoo.BNN.fit`` takes the training rows either as tensors (held in memory; each step indexes a seeded minibatch)
or as a torch ``DataLoader`` (streamed: each step takes the loader's next batch, the likelihood scaled by the data
set's length). This script fits the same net, guide and rows both ways and reports the fit's own wall time per
step (``BNN.seconds``: the training loop, data reading included, set-up excluded), in rounds that alternate the
two paths so machine noise hits both alike; the ratio is the median of the per-round ratios, with their
quartiles beside it (on a shared two-core machine a single round's ratio scatters by 10-20 %: many short rounds
give a steadier median than a few long ones). Target: the DataLoader path within 1.1x of the in-memory path.

Cases: the 64-100-10 MLP on scikit-learn's digits (1,437 training rows), and a small conv net of one's own
(two conv-ReLU-pool stages and a linear head) on the same digits as 1 x 8 x 8 images; mean-field guide, SVI at the
defaults a user gets, batch 128. The loader is ``DataLoader(TensorDataset(x, y), batch_size=128, shuffle=True)``,
which the zoo reads a batch at a time (``zoo.data.base.tensor_batches``); a third row reads the MLP's rows through
a ``Dataset`` of one's own whose ``__getitem__`` gives one row (what a loader with per-item transforms pays:
128 calls and a stack per batch), with ``--workers N`` worker processes (default 0).

    python benchmarks/dataloader_speed.py [--steps 60] [--rounds 40] [--threads 1] [--workers 0] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import zoo  # noqa: E402
from zoo.data.digits import load_digits  # noqa: E402
from zoo.errors import ZooInputError  # noqa: E402
from zoo.exits import exit_code  # noqa: E402
from zoo.runs import write_json  # noqa: E402

TARGET = 1.1
BATCH = 128


class DigitConvNet(nn.Module):
    """1 x 8 x 8 images -> two conv-ReLU-pool stages -> 10 logits (a net of one's own, not the zoo's)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(16 * 2 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class Rows(torch.utils.data.Dataset):
    """A data set of one's own, read item by item (as one with per-item transforms is)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def mlp() -> nn.Module:
    """The 64-100-10 ReLU MLP."""
    return nn.Sequential(nn.Linear(64, 100), nn.ReLU(), nn.Linear(100, 10))


def cases() -> dict[str, tuple[type[nn.Module] | None, torch.Tensor, torch.Tensor, type]]:
    """Each case's net builder, its training rows (digits, standardised as the zoo's loader gives them) and the
    data set class its loader reads."""
    digits = load_digits(seed=0)
    x, y = digits.x_train.float(), digits.y_train
    tensors = torch.utils.data.TensorDataset
    return {"digits 64-100-10 MLP": (mlp, x, y, tensors),
            "digits conv net (1x8x8)": (DigitConvNet, x.view(-1, 1, 8, 8), y, tensors),
            "digits MLP, Dataset item by item": (mlp, x, y, Rows)}


def seconds_per_step(make_net, data, steps: int, device: str = "cpu") -> float:
    """The fit's own wall time per SVI step (the training loop; set-up excluded) on ``device``."""
    torch.manual_seed(0)
    bnn = zoo.BNN(make_net(), guide="mean_field", likelihood="categorical", device=device,
                  inference={"method": "svi", "batch_size": BATCH, "checkpoint_every": 10 * steps})
    bnn.fit(data, num_steps=steps, progress=False)
    return bnn.seconds / steps


def run(args: argparse.Namespace, console: Console) -> dict:
    if args.threads < 1 or args.steps < 1 or args.rounds < 1 or args.workers < 0:
        raise ZooInputError("--threads/--steps/--rounds/--workers", None, "use positive counts (workers >= 0)")
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=UserWarning)
    out: dict = {"threads": args.threads, "steps": args.steps, "rounds": args.rounds, "batch_size": BATCH,
                 "workers": args.workers, "target": TARGET, "cases": {}}
    table = Table(title=f"SVI step, DataLoader ÷ in memory (batch {BATCH}, {args.threads} thread(s), median of "
                        f"{args.rounds} alternating rounds)", title_justify="left")
    for column in ("case", "in memory µs/step", "DataLoader µs/step", "ratio", "ratio quartiles", f"≤ {TARGET}"):
        table.add_column(column, justify="left" if column == "case" else "right")
    for name, (make_net, x, y, rows) in cases().items():
        in_memory, streamed = [], []

        def loader(rows=rows, x=x, y=y):
            return torch.utils.data.DataLoader(rows(x, y), batch_size=BATCH, shuffle=True, num_workers=args.workers,
                                               persistent_workers=args.workers > 0)

        seconds_per_step(make_net, (x, y), 20)  # warm-up of both paths (allocations, first calls)
        seconds_per_step(make_net, loader(), 20)
        for _ in range(args.rounds):
            in_memory.append(seconds_per_step(make_net, (x, y), args.steps))
            streamed.append(seconds_per_step(make_net, loader(), args.steps))
        ratios = [s / m for s, m in zip(streamed, in_memory, strict=True)]
        ratio = statistics.median(ratios)
        # inclusive: quartiles among the rounds' ratios, never extrapolated beyond them (the default, exclusive, gave a
        # negative lower quartile from two rounds)
        low, _, high = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else (ratio,) * 3
        figures = {"in_memory_us_per_step": statistics.median(in_memory) * 1e6,
                   "dataloader_us_per_step": statistics.median(streamed) * 1e6,
                   "dataloader_ratio": ratio, "dataloader_ratio_quartiles": [low, high],
                   "meets_target": ratio <= TARGET}
        out["cases"][name] = figures
        table.add_row(name, f"{figures['in_memory_us_per_step']:.0f}", f"{figures['dataloader_us_per_step']:.0f}",
                      f"{ratio:.3f}", f"{low:.2f}–{high:.2f}", "yes" if figures["meets_target"] else "no")
    console.print(table)
    if args.json:
        console.print(f"written: {write_json(Path(args.json), out)}", markup=False)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks/dataloader_speed.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60, help="SVI steps per timed fit")
    p.add_argument("--rounds", type=int, default=40, help="alternating rounds (each: one fit per path)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--workers", type=int, default=0, help="the DataLoader's worker processes (default 0)")
    p.add_argument("--json", help="also write the figures to this JSON file")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return exit_code(lambda: run(args, Console(width=max(Console().width, 120))))


if __name__ == "__main__":
    sys.exit(main())
