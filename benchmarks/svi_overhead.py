"""SVI step overhead: the zoo's mean-field step against the same maths hand-written in PyTorch, side by side.

Both sides: a factorised Normal posterior (sigma = softplus(rho)) over every weight and bias, Normal(0, 1)
prior with its closed-form KL, reparameterised weight samples, categorical likelihood scaled by N/B,
the same fused Adam, the same minibatch order. The zoo side is exactly the step training runs
(`zoo.inference.svi.SVIStep` on `AllWeightsBNN` + `MeanFieldNormalGuide`). Timings alternate between the two
in rounds so machine noise hits both alike; the ratio is zoo / hand-written (lower is better), reported as
the median of the per-round ratios and as the ratio of the best (least disturbed) round of each.

A second table times Pyro's AutoNormal (``guide.name: auto``, the zoo's adapter) against the zoo's own mean-field
guide with local reparameterisation (``inference.local_reparam: true``), each the step ``zoo train`` runs, on the
same model: what choosing Pyro's autoguide over the zoo's guide costs per step.

    python benchmarks/svi_overhead.py [--rounds 7] [--steps 100] [--warmup 20] [--threads N] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table
from timing import add_timing_arguments, batches, benchmark_cases, optimiser_step, time_side_by_side  # noqa: E402 - sibling module of this script

from guides.auto import AutoGuide
from guides.mean_field import MeanFieldNormalGuide
from zoo.inference.elbo import LazyTraceMeanField_ELBO
from zoo.inference.svi import SVIStep, make_optimizer
from zoo.likelihoods import Categorical
from zoo.models.all_weights import AllWeightsBNN
from zoo.nets import build_mlp
from zoo.priors import assign_priors
from zoo.runs import write_json
from zoo.spec import AutoGuideSpec, PriorSpec, SVISpec

BATCH = 128
INIT_RHO = -5.0


def zoo_step(sizes: list[int], x: torch.Tensor, y: torch.Tensor, spec: SVISpec, guide_name: str = "mean_field",
             local_reparam: bool = False, autocast: torch.dtype | None = None):
    """The zoo's SVI step for a mean-field MLP of layer widths ``sizes``, with the zoo's mean-field guide or Pyro's
    AutoNormal (``guide_name="auto"``), on the device ``x`` is on (``autocast``: the step's lower precision, as
    ``inference.autocast`` sets it)."""
    net = build_mlp(sizes[0], sizes[-1], sizes[1:-1], "relu").to(x.device)
    names = [n for n, _ in net.named_parameters()]
    family = AllWeightsBNN(net, assign_priors(PriorSpec(), names), Categorical())
    family.to(x.device, torch.float32)
    if guide_name == "auto":
        guide = AutoGuide(family.latent_sites(), AutoGuideSpec(name="auto", auto="normal", init_rho=INIT_RHO))
        guide.bind(family.model, x[:2], y[:2])
    else:
        guide = MeanFieldNormalGuide(family.latent_sites(), init_rho=INIT_RHO)
    guide.to(device=x.device)
    step = SVIStep(family.model, guide, LazyTraceMeanField_ELBO(), make_optimizer(list(guide.parameters()), spec),
                   local_reparam=local_reparam, autocast=autocast)
    order = batches(len(x), BATCH, seed=1, device=x.device)
    return lambda: step(x, y, next(order))


def hand_step(sizes: list[int], x: torch.Tensor, y: torch.Tensor, spec: SVISpec):
    """The same model and estimator written directly in PyTorch, on the device ``x`` is on."""
    net = build_mlp(sizes[0], sizes[-1], sizes[1:-1], "relu").to(x.device)
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    locs = [p.detach().clone().requires_grad_() for m in linears for p in (m.weight, m.bias)]
    rhos = [torch.full_like(p, INIT_RHO, requires_grad=True) for p in locs]
    optimizer = make_optimizer(locs + rhos, spec)
    order = batches(len(x), BATCH, seed=1, device=x.device)
    n = len(x)

    def step() -> float:
        idx = next(order)
        xb, yb = x.index_select(0, idx), y.index_select(0, idx)
        kl, h, weights = 0.0, xb, []
        for loc, rho in zip(locs, rhos, strict=True):
            sigma = F.softplus(rho)
            weights.append(loc + sigma * torch.randn_like(sigma))
            kl = kl + (0.5 * (sigma**2 + loc**2 - 1.0) - torch.log(sigma)).sum()
        for i in range(0, len(weights), 2):
            h = F.linear(h, weights[i], weights[i + 1])
            if i + 2 < len(weights):
                h = F.relu(h)
        return optimiser_step(kl + n / len(idx) * F.cross_entropy(h, yb, reduction="sum"), optimizer)

    return step


def main(argv: list[str] | None = None) -> dict:
    """Run both cases and print the table; returns the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_timing_arguments(parser, rounds=7, steps=100, warmup=20)
    args = parser.parse_args(argv)
    spec = SVISpec(lr=1e-3)
    cases = benchmark_cases(args)
    results = {"batch_size": BATCH, "rounds": args.rounds, "steps_per_round": args.steps,
               "threads": torch.get_num_threads(), "cases": {}}
    table = Table(title=f"mean-field SVI step, batch {BATCH} ({torch.get_num_threads()} threads)")
    for col in ("case", "zoo µs/step", "hand µs/step", "ratio (median of rounds)", "ratio (best zoo / best hand)"):
        table.add_column(col, justify="left" if col == "case" else "right")
    for name, (sizes, x, y) in cases.items():
        zoo_us, hand_us = time_side_by_side(zoo_step(sizes, x, y, spec), hand_step(sizes, x, y, spec),
                                            args.rounds, args.steps, args.warmup)
        ratios = [z / h for z, h in zip(zoo_us, hand_us, strict=True)]
        row = {"zoo_us_per_step": statistics.median(zoo_us), "hand_us_per_step": statistics.median(hand_us),
               "ratio_median": statistics.median(ratios), "ratio_of_best": min(zoo_us) / min(hand_us),
               "ratios": ratios}
        results["cases"][name] = row
        table.add_row(name, f"{row['zoo_us_per_step']:.0f}", f"{row['hand_us_per_step']:.0f}",
                      f"{row['ratio_median']:.2f}", f"{row['ratio_of_best']:.2f}")
    Console().print(table)
    auto_table = Table(title=f"Pyro's AutoNormal against the zoo's mean-field guide with local reparameterisation, "
                       f"batch {BATCH}")
    for col in ("case", "AutoNormal µs/step", "zoo local reparam µs/step", "ratio (median of rounds)"):
        auto_table.add_column(col, justify="left" if col == "case" else "right")
    for name, (sizes, x, y) in cases.items():
        auto_us, zoo_us = time_side_by_side(zoo_step(sizes, x, y, spec, "auto"),
                                            zoo_step(sizes, x, y, spec, local_reparam=True),
                                            args.rounds, args.steps, args.warmup)
        ratios = [a / z for a, z in zip(auto_us, zoo_us, strict=True)]
        row = results["cases"][name]
        row.update(autonormal_us_per_step=statistics.median(auto_us),
                   local_reparam_us_per_step=statistics.median(zoo_us),
                   ratio_autonormal_to_local_reparam=statistics.median(ratios))
        auto_table.add_row(name, f"{row['autonormal_us_per_step']:.0f}", f"{row['local_reparam_us_per_step']:.0f}",
                           f"{row['ratio_autonormal_to_local_reparam']:.2f}")
    Console().print(auto_table)
    if args.json:
        write_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
