"""Compiled against eager steps: the zoo's mean-field SVI step, eager and with ``inference.compile: true``, beside
the same step hand-written in PyTorch, eager and under ``torch.compile``, on four nets; and the SWAG and SG-MCMC
steps eager against compiled.

Every zoo side is exactly the step ``zoo train`` runs (built from a spec by ``zoo.pipeline.build``; ``SVIStep`` with
Adam from ``make_optimizer``; SWAG's and SGLD's update from ``zoo.inference``). The hand-written side is a
factorised Normal posterior (sigma = softplus(rho), rho = -5) over every parameter of the same net, one weight draw
per step through ``torch.func.functional_call``, the closed-form KL to N(0, 1), the categorical likelihood scaled by
N/B and the same fused Adam; compiled, its loss runs under ``torch.compile`` with the option the zoo's compiled
graphs use (``fallback_random``: the draws stay eager ops; Inductor's own generator made both sides ~2x slower on
the 784-400-400-10 MLP). Nets: the digits MLP (64-100-10, digits), a 784-400-400-10 MLP and LeNet-5 (synthetic
MNIST-shaped rows) and ResNet-20 (synthetic CIFAR-shaped rows); batch 128.

Timings alternate between the sides in rounds (every side compiled and warmed up first, its compile time
reported), so machine noise hits all alike; each ratio is the median of the per-round ratios. Goal: the zoo's
compiled step <= 1.1x the hand-written compiled step.

    python benchmarks/compiled_step.py [--nets digits,784,lenet5,resnet20] [--rounds 15] [--steps 30]
                                       [--threads 1] [--json PATH]

ResNet-20 takes ``--resnet-steps`` (default 3) steps per round: its steps cost ~1 s each on one CPU thread, and
compiling it costs minutes.

``--runs`` also times whole runs (``zoo.pipeline.train``: fit, evaluation and writing) of shipped configs eager and
with ``inference.compile: true``, with Inductor's on-disk graph cache off so that every compiled run pays its whole
compile, as a first run does: what decides the ``compile`` default.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from rich.console import Console
from rich.table import Table
from timing import batches, optimiser_step  # noqa: E402 - sibling module of this script

from zoo.data.base import Dataset, make_dataset
from zoo.data.digits import load_digits
from zoo.inference.compiled import compile_options
from zoo.inference.elbo import ELBOS
from zoo.inference.svi import AUTOCAST_DTYPES, SVIStep, make_optimizer
from zoo.nets import build_net
from zoo.pipeline import build, train
from zoo.runs import write_json
from zoo.spec import SVISpec, load_spec, net_section

BATCH = 128
INIT_RHO = -5.0
GOAL = 1.1  # the zoo's compiled step against the hand-written compiled step
ADAM = SVISpec(lr=1e-3)
SIDES = ("zoo eager", "zoo compiled", "hand eager", "hand compiled")
NETS: dict[str, dict] = {  # label: the net section and the data's shape
    "digits": {"label": "digits MLP 64-100-10", "net": {"name": "mlp", "hidden": [100]}},
    "784": {"label": "MLP 784-400-400-10", "net": {"name": "mlp", "hidden": [400, 400]}, "features": 784},
    "lenet5": {"label": "LeNet-5 (1x28x28)", "net": {"name": "lenet5"}, "features": 784},
    "resnet20": {"label": "ResNet-20 (3x32x32)", "net": {"name": "resnet", "depth": 20, "in_channels": 3},
                 "features": 3 * 32 * 32},
}


def data_for(case: dict, rows: int, device: str = "cpu") -> Dataset:
    """The digits for the digits MLP, else ``rows`` synthetic rows of the case's width (the timing does not depend
    on the values), on ``device``."""
    if "features" not in case:
        return load_digits(seed=0).to(device)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(rows, case["features"], generator=gen).numpy()
    y = torch.randint(0, 10, (rows,), generator=gen).numpy()
    return make_dataset("synthetic", "classification", x, y, x[:16], y[:16], n_classes=10).to(device)


def zoo_svi_step(case: dict, data: Dataset, compile: bool, autocast: str = "none") -> Callable[[], torch.Tensor]:
    """The zoo's mean-field SVI step on the case's net, as ``zoo train`` builds it, on the data's device
    (``autocast``: the spec's ``inference.autocast``)."""
    spec = load_spec({"data": {"name": "digits"},  # not read: the family and guide are built on `data` below
                      "net": case["net"], "device": data.device.type, "seed": 0, "model": {"family": "all_weights"},
                      "guide": {"name": "mean_field"},
                      "inference": {"batch_size": BATCH, "lr": ADAM.lr, "compile": compile, "autocast": autocast}})
    family, guide = build(spec, data)
    optimizer = make_optimizer(list(guide.parameters()) + family.point_parameters(), spec.inference)
    step = SVIStep(family.model, guide, ELBOS[spec.inference.elbo](1), optimizer, compile=compile,
                   autocast=AUTOCAST_DTYPES[autocast])
    order = batches(data.n_train, BATCH, seed=1, device=data.device)

    def run() -> torch.Tensor:
        return step(data.x_train, data.y_train, next(order))

    run.compiled = lambda: step.compiled  # main() refuses a compiled row that fell back to eager
    return run


def hand_svi_step(case: dict, data: Dataset, compile: bool) -> Callable[[], float]:
    """The same estimator hand-written over ``functional_call`` of the same net (the loss under ``torch.compile``
    when ``compile``), on the data's device."""
    net = build_net(net_section(**case["net"]), data.x_train.shape[1], 10).to(data.device)
    names = [n for n, _ in net.named_parameters()]
    locs = [p.detach().clone().requires_grad_() for p in net.parameters()]
    rhos = [torch.full_like(p, INIT_RHO, requires_grad=True) for p in locs]
    optimizer = make_optimizer(locs + rhos, ADAM)
    order = batches(data.n_train, BATCH, seed=1, device=data.device)

    def loss(xb: torch.Tensor, yb: torch.Tensor, scale: float) -> torch.Tensor:
        kl, weights = 0.0, {}
        for name, loc, rho in zip(names, locs, rhos, strict=True):
            sigma = F.softplus(rho)
            weights[name] = loc + sigma * torch.randn_like(sigma)
            kl = kl + (0.5 * (sigma**2 + loc**2 - 1.0) - torch.log(sigma)).sum()
        out = torch.func.functional_call(net, weights, (xb,))
        return kl + scale * F.cross_entropy(out, yb, reduction="sum")

    loss_fn = torch.compile(loss, dynamic=False, options=compile_options(False)) if compile else loss

    def run() -> float:
        idx = next(order)
        xb, yb = data.x_train.index_select(0, idx), data.y_train.index_select(0, idx)
        return optimiser_step(loss_fn(xb, yb, data.n_train / len(idx)), optimizer)

    run.compiled = lambda: True
    return run


CONFIGS = Path(__file__).resolve().parent.parent / "configs"
RUN_CONFIGS = ("mean_field_digits", "multiswag_digits", "sgld_digits")  # one per method with a compiled step


def run_seconds(config: str, compile: bool) -> float:
    """Wall seconds of a whole ``zoo train`` run of ``configs/<config>.yaml`` with ``inference.compile`` set."""
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = False  # every compiled run compiles from scratch, as a user's first run does
    raw = yaml.safe_load((CONFIGS / f"{config}.yaml").read_text())
    spec = load_spec({**raw, "inference": {**raw["inference"], "compile": compile}})
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        train(spec, f"{out}/run", progress=False, echo=None)
        return time.perf_counter() - start


def time_rounds(sides: dict[str, Callable[[], object]], rounds: int, steps: int,
                sync: Callable[[], None] = lambda: None) -> dict[str, list[float]]:
    """Microseconds per step of every side, the sides alternating within each of ``rounds`` rounds; ``sync`` waits
    for the device's queued work at each block's ends (``torch.cuda.synchronize`` on a GPU)."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, fn in sides.items():
            sync()
            start = time.perf_counter()
            for _ in range(steps):
                fn()
            sync()
            times[name].append((time.perf_counter() - start) / steps * 1e6)
    return times


def warm(fn: Callable[[], object], calls: int) -> float:
    """Seconds for the first ``calls`` calls: tracing and compiling every minibatch size, for a compiled side."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return time.perf_counter() - start


def key_of(side: str) -> str:
    """The JSON key of a side's median microseconds per step."""
    return side.replace(" ", "_") + "_us"


def ratio(times: dict[str, list[float]], a: str, b: str) -> float:
    """The median over rounds of side ``a``'s time over side ``b``'s."""
    return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", default=",".join(NETS), help=f"comma-separated, of: {', '.join(NETS)}")
    parser.add_argument("--rounds", type=int, default=15, help="alternating timed rounds")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per round and side")
    parser.add_argument("--resnet-steps", type=int, default=3, help="timed steps per round and side on ResNet-20")
    parser.add_argument("--rows", type=int, default=1024, help="synthetic training rows")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--runs", action="store_true", help=f"also time whole runs of {', '.join(RUN_CONFIGS)} "
                        "eager and compiled")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    nets = [n.strip() for n in args.nets.split(",") if n.strip()]
    if not nets or set(nets) - set(NETS):
        parser.error(f"--nets takes some of {', '.join(NETS)}, not {args.nets!r}")
    if min(args.rounds, args.steps, args.resnet_steps, args.rows, args.threads) < 1:
        parser.error("--rounds, --steps, --resnet-steps, --rows and --threads must be positive")
    torch.set_num_threads(args.threads)
    results = {"batch_size": BATCH, "threads": args.threads, "rounds": args.rounds, "torch": torch.__version__,
               "goal_zoo_compiled_over_hand_compiled": GOAL, "nets": {}}
    table = Table(title=f"mean-field SVI step, batch {BATCH}, {args.threads} thread(s); µs per step (median of "
                        f"rounds); ratios: medians of per-round ratios", title_justify="left")
    for col in ("net", *SIDES, "zoo compiled ÷ zoo eager", "zoo compiled ÷ hand compiled", f"≤ {GOAL}",
                "compile s (zoo / hand)"):
        table.add_column(col, justify="left" if col == "net" else "right")
    for key in nets:
        case = NETS[key]
        torch.manual_seed(0)
        data = data_for(case, args.rows)
        sides = {"zoo eager": zoo_svi_step(case, data, False), "zoo compiled": zoo_svi_step(case, data, True),
                 "hand eager": hand_svi_step(case, data, False), "hand compiled": hand_svi_step(case, data, True)}
        per_epoch = -(-data.n_train // BATCH)
        compile_s = {name: warm(fn, per_epoch + 2) for name, fn in sides.items()}  # every batch size traced
        for name, fn in sides.items():
            if name.endswith("compiled") and not fn.compiled():
                raise SystemExit(f"{case['label']}: {name} fell back to eager (see the warning above)")
        steps = args.resnet_steps if key == "resnet20" else args.steps
        times = time_rounds(sides, args.rounds, steps)
        row = {"label": case["label"], "steps_per_round": steps,
               **{key_of(name): statistics.median(t) for name, t in times.items()},
               "first_calls_s": compile_s,
               "ratio_zoo_compiled_to_eager": ratio(times, "zoo compiled", "zoo eager"),
               "ratio_zoo_compiled_to_hand_compiled": ratio(times, "zoo compiled", "hand compiled"),
               "ratio_hand_compiled_to_eager": ratio(times, "hand compiled", "hand eager"), "times_us": times}
        results["nets"][key] = row
        met = row["ratio_zoo_compiled_to_hand_compiled"] <= GOAL
        table.add_row(case["label"], *(f"{row[key_of(s)]:,.0f}" for s in SIDES),
                      f"{row['ratio_zoo_compiled_to_eager']:.2f}", f"{row['ratio_zoo_compiled_to_hand_compiled']:.2f}",
                      "yes" if met else "no",
                      f"{compile_s['zoo compiled']:.1f} / {compile_s['hand compiled']:.1f}")
        Console(width=max(Console().width, 170)).print(table)  # after every net: a long run shows its progress
        if args.json:
            write_json(args.json, results)
    if args.runs:
        runs = Table(title="whole runs (zoo train: fit, evaluation, writing), seconds; compiled with a cold "
                     "compile cache", title_justify="left")
        for col in ("config", "eager s", "compiled s", "compiled ÷ eager"):
            runs.add_column(col, justify="left" if col == "config" else "right")
        results["runs"] = {}
        for config in RUN_CONFIGS:
            eager, compiled = run_seconds(config, False), run_seconds(config, True)
            results["runs"][config] = {"eager_s": eager, "compiled_s": compiled,
                                       "ratio_compiled_to_eager": compiled / eager}
            runs.add_row(config, f"{eager:.1f}", f"{compiled:.1f}", f"{compiled / eager:.2f}")
            if args.json:
                write_json(args.json, results)
        Console().print(runs)
    return results


if __name__ == "__main__":
    main()
