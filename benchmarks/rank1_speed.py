"""Rank-1 SVI step cost: the zoo's K-member rank-1 BNN step against a deterministic net on the K×B tiled batch.

Rank-1 side: exactly the step training runs (`zoo.inference.svi.SVIStep` on `Rank1BNN` + `MixtureGuide`, K
members, Normal(1, 1) factor prior with its closed-form KL, `average` member likelihood): one minibatch of B
rows runs through all K members at once, i.e. K·B rows per matmul. Deterministic side: a plain PyTorch net of
the same shape on the same B rows tiled K times (forward, cross-entropy, backward), with the same fused Adam
(`zoo.inference.svi.make_optimizer`). The ratio rank-1 ÷ deterministic (lower is better; target ≤ 1.5) is
what the Bayesian treatment of the factors costs over training one deterministic net on the same rows;
timings alternate between the two in rounds so machine noise hits both alike, and the ratio is reported as
the median of the per-round ratios and as best ÷ best.

Two modes, like against like: ``eager`` (the Pyro step as written; the plain net as written) and ``compiled``
(the zoo step with ``inference.compile: true``, i.e. the ELBO traced and compiled; the plain net's loss under
``torch.compile``). The compiled mode also reports rank-1 compiled ÷ deterministic eager. Before timing, each
compiled side runs one epoch so that every minibatch size (the short last one too) is compiled.

Parameter counts: rank-1 = shared W + K per-member biases + the guide's parameters of the factors (a loc and
a rho per factor element); the bound is deterministic (W + b) + K·Σ_layers(fan-in + fan-out) + K·Σ biases.
The mixture guide's per-factor scale doubles the factor parameters, so its total exceeds the bound by
K·Σ(fan-in + fan-out) − Σ biases; the factor means alone (BatchEnsemble's count) stay inside it.

    python benchmarks/rank1_speed.py [--members 4] [--batch 128] [--rounds 30] [--steps 30] [--threads N]
                                     [--modes eager,compiled] [--json PATH]
"""

from __future__ import annotations

import argparse
import math
import statistics
from itertools import pairwise

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table
from timing import add_timing_arguments, batches, benchmark_cases, optimiser_step, time_side_by_side  # noqa: E402 - sibling module of this script

from guides.base import param_key
from guides.mixture import MixtureGuide
from zoo.inference.elbo import LazyTraceMeanField_ELBO
from zoo.inference.svi import SVIStep, make_optimizer
from zoo.likelihoods import Categorical
from zoo.models.rank1 import Rank1BNN
from zoo.nets import build_mlp
from zoo.priors import assign_priors
from zoo.runs import write_json
from zoo.spec import NormalPrior, PriorSpec, SVISpec

TARGET_RATIO = 1.5


def rank1_parts(sizes: list[int], members: int) -> tuple[Rank1BNN, MixtureGuide]:
    """The rank-1 family (MLP of layer widths ``sizes``) and its mixture guide, as a run would build them."""
    net = build_mlp(sizes[0], sizes[-1], sizes[1:-1], "relu")
    priors = assign_priors(PriorSpec(default=NormalPrior(loc=1.0, scale=1.0)), Rank1BNN.prior_sites(net))
    family = Rank1BNN(net, priors, Categorical(), members=members, member_likelihood="average")
    return family, MixtureGuide(family.latent_sites())


def rank1_step(sizes: list[int], x: torch.Tensor, y: torch.Tensor, spec: SVISpec, members: int, batch: int,
               compile: bool = False):
    """The zoo's rank-1 SVI step: guide parameters and point parameters (W, member biases) in one Adam."""
    family, guide = rank1_parts(sizes, members)
    optimizer = make_optimizer(list(guide.parameters()) + family.point_parameters(), spec)
    step = SVIStep(family.model, guide, LazyTraceMeanField_ELBO(), optimizer, compile=compile)
    order = batches(len(x), batch, seed=1)

    def run() -> torch.Tensor:  # the step reads its loss on the host, as the baselines' steps do
        return step(x, y, next(order))

    run.svi_step = step  # main() checks that a compiled mode really ran compiled
    return run


def deterministic_step(sizes: list[int], x: torch.Tensor, y: torch.Tensor, spec: SVISpec, members: int,
                       batch: int, compile: bool = False):
    """A deterministic net of the same shape on the minibatch tiled ``members`` times, in plain PyTorch."""
    net = build_mlp(sizes[0], sizes[-1], sizes[1:-1], "relu")
    optimizer = make_optimizer(list(net.parameters()), spec)
    order = batches(len(x), batch, seed=1)

    def loss(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(net(xb), yb)

    loss_fn = torch.compile(loss, dynamic=False) if compile else loss

    def step() -> float:
        idx = next(order)
        xb, yb = x.index_select(0, idx).repeat(members, 1), y.index_select(0, idx).repeat(members)
        return optimiser_step(loss_fn(xb, yb), optimizer)

    return step


def parameter_counts(sizes: list[int], members: int) -> dict:
    """Rank-1 parameters (W + member biases + factor guide parameters) against the deterministic-based bound."""
    family, guide = rank1_parts(sizes, members)
    factor_sites = [n for n, s in guide.sites.items() if s.plate is not None]
    weights = sum(p.numel() for p in family.point_parameters()[:len(family.layers)])
    member_biases = sum(p.numel() for p in family.member_bias.values())
    factor_means = sum(guide.loc[param_key(n)].numel() for n in factor_sites)
    factor_guide = sum(p.numel() for name, p in guide.named_parameters() if name.split(".", 1)[1] in
                       {param_key(n) for n in factor_sites})
    deterministic = sum(p.numel() for p in build_mlp(sizes[0], sizes[-1], sizes[1:-1], "relu").parameters())
    fan_sum = sum(fan_in + fan_out for fan_in, fan_out in pairwise(sizes))
    biases = sum(sizes[1:])
    bound = deterministic + members * fan_sum + members * biases
    rank1 = weights + member_biases + factor_guide
    means_only = weights + member_biases + factor_means
    return {"params_rank1": rank1, "params_rank1_shared_weights": weights, "params_rank1_member_biases": member_biases,
            "params_rank1_factor_guide": factor_guide, "params_rank1_factor_means_only": means_only,
            "params_deterministic": deterministic, "params_bound": bound, "bound_holds": rank1 <= bound,
            "bound_holds_factor_means_only": means_only <= bound}


def timed(rank1, deterministic, args: argparse.Namespace, warmup: int) -> dict:
    """Side-by-side timings of one mode: µs per step of each side and their ratios."""
    rank1_us, det_us = time_side_by_side(rank1, deterministic, args.rounds, args.steps, warmup)
    ratios = [r / d for r, d in zip(rank1_us, det_us, strict=True)]
    return {"rank1_us_per_step": statistics.median(rank1_us), "deterministic_us_per_step": statistics.median(det_us),
            "rank1_best_us_per_step": min(rank1_us), "deterministic_best_us_per_step": min(det_us),
            "ratio_median": statistics.median(ratios), "ratio_of_best": min(rank1_us) / min(det_us),
            "ratios": ratios}


def main(argv: list[str] | None = None) -> dict:
    """Run both cases in every mode and print the tables; returns the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=4, help="ensemble members K")
    parser.add_argument("--batch", type=int, default=128, help="minibatch rows B (the deterministic net sees K·B)")
    parser.add_argument("--modes", default="eager,compiled", help="comma-separated: eager, compiled")
    add_timing_arguments(parser, rounds=30, steps=30, warmup=10)
    args = parser.parse_args(argv)
    if args.members < 1 or args.batch < 1 or args.rounds < 1 or args.steps < 1:
        parser.error("--members, --batch, --rounds and --steps must be positive")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"eager", "compiled"}:
        parser.error(f"--modes takes eager and/or compiled, not {args.modes!r}")
    spec = SVISpec(lr=1e-3)
    cases = benchmark_cases(args)
    k, b = args.members, args.batch
    results = {"members": k, "batch_size": b, "rounds": args.rounds, "steps_per_round": args.steps,
               "threads": torch.get_num_threads(), "target_ratio": TARGET_RATIO, "modes": modes, "cases": {}}
    timing = Table(title=f"rank-1 SVI step (K={k}, B={b}, mixture guide) vs deterministic net on K·B = {k * b} rows "
                         f"({torch.get_num_threads()} threads); ratio = median of per-round ratios")
    for col in ("case", "mode", "rank-1 µs/step", "determ. µs/step", "ratio", "ratio (best ÷ best)",
                "rank-1 ÷ eager determ.", f"≤ {TARGET_RATIO}"):
        timing.add_column(col, justify="left" if col in ("case", "mode") else "right")
    params = Table(title=f"parameters (K={k}): rank-1 = W + K·biases + loc and rho of every factor; "
                         "bound = deterministic + K·Σ(fan-in + fan-out) + K·Σ biases")
    for col in ("case", "deterministic", "rank-1", "factor q", "bound", "rank-1 ≤ bound", "means only",
                "means ≤ bound"):
        params.add_column(col, justify="left" if col == "case" else "right")
    for name, (sizes, x, y) in cases.items():
        row = {"sizes": sizes, **parameter_counts(sizes, k)}
        epoch = math.ceil(len(x) / b) + 1  # every minibatch size seen (and compiled) before timing
        for mode in modes:
            compiled = mode == "compiled"
            rank1 = rank1_step(sizes, x, y, spec, k, b, compile=compiled)
            row[mode] = timed(rank1, deterministic_step(sizes, x, y, spec, k, b, compile=compiled), args,
                              max(args.warmup, epoch) if compiled else args.warmup)
            if compiled and not rank1.svi_step.compiled:
                raise SystemExit(f"{name}: compiling the rank-1 step failed (see the warning above), so the compiled "
                                 "row would time the eager step; run with --modes eager")
        if "eager" in modes and "compiled" in modes:
            row["compiled"]["ratio_median_vs_eager_deterministic"] = (
                row["compiled"]["rank1_us_per_step"] / row["eager"]["deterministic_us_per_step"])
        row["ratio_median_best_mode"] = min(row[m]["ratio_median"] for m in modes)
        row["median_within_target"] = row["ratio_median_best_mode"] <= TARGET_RATIO
        results["cases"][name] = row
        for mode in modes:
            t = row[mode]
            versus = t.get("ratio_median_vs_eager_deterministic")
            timing.add_row(name, mode, f"{t['rank1_us_per_step']:.0f}", f"{t['deterministic_us_per_step']:.0f}",
                           f"{t['ratio_median']:.2f}", f"{t['ratio_of_best']:.2f}",
                           "–" if versus is None else f"{versus:.2f}",
                           "yes" if t["ratio_median"] <= TARGET_RATIO else "no")
        params.add_row(name, f"{row['params_deterministic']:,}", f"{row['params_rank1']:,}",
                       f"{row['params_rank1_factor_guide']:,}", f"{row['params_bound']:,}",
                       "yes" if row["bound_holds"] else "no", f"{row['params_rank1_factor_means_only']:,}",
                       "yes" if row["bound_holds_factor_means_only"] else "no")
    console = Console(width=max(Console().width, 130))
    console.print(timing)
    console.print(params)
    if args.json:
        write_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
