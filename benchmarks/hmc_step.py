"""The many-chain leapfrog step against its floor and against JAX's jitted loop, per step.

    python benchmarks/hmc_step.py [--model toy|uci:bostonHousing] [--data-dir DIR] [--chains 64,256]
        [--steps 50] [--rounds 7] [--threads 1] [--json PATH]

Each side runs ``--steps`` velocity-Verlet steps of all C chains from the same points and momenta (step size 1e-4,
small enough to stay on the model's stiff posterior without blowing up), in alternating rounds; the figure is the
median wall time per step (and per chain-step). The model is ``benchmarks/hmc_speed.py``'s (``--model``), the
density every side samples there.

- **zoo step**: ``ManyChainHMC.integrate`` with ``inference.compile: true`` (as ``configs/hmc_*.yaml`` run it):
  the potential's value and gradient one compiled graph, the drift and the kick eager tensor operations around it.
- **zoo step, eager potential**: the same with ``inference.compile: false`` (autograd on the model's tensors).
- **zoo gradient alone**: the compiled potential's value and gradient, called once per step: the part of a step
  no integrator change can remove (the rest is the drift, the kick and Python).
- **JAX, BlackJAX's integrator**: ``blackjax.mcmc.integrators.velocity_verlet`` on the same NumPyro model's log
  density, vmapped over the chains, ``--steps`` steps in one jitted ``lax.fori_loop`` (no Python per step).
- **exp floor**: one ``torch.exp`` over the hidden layer's C x N x H pre-activations, one thread: the one
  transcendental per activation any implementation computes (tanh as exp; on ReLU nets it does not apply and is
  left out). The matrix products are a few MFLOP and cost less.

Ratios (every one under a key containing ``ratio``): zoo step ÷ JAX, zoo step ÷ gradient alone, zoo step ÷ exp
floor, eager ÷ compiled. Below 1 the zoo is faster. Needs the ``bench`` extra (JAX, NumPyro, BlackJAX).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hmc_speed  # noqa: E402  (the models, their NumPyro/BlackJAX densities, XLA's thread limit)
from common import parse_counts  # noqa: E402

import zoo.pipeline  # noqa: E402
from zoo.errors import ZooInputError  # noqa: E402
from zoo.exits import exit_code  # noqa: E402
from zoo.inference.mcmc import ManyChainHMC  # noqa: E402
from zoo.inference.potential import Potential  # noqa: E402
from zoo.runs import write_json  # noqa: E402

STEP_SIZE = 1e-4
SIDES = ("zoo_step", "zoo_eager", "zoo_gradient", "jax_blackjax", "exp_floor")
LABELS = {"zoo_step": "zoo step (inference.compile: true)",
          "zoo_eager": "zoo step, eager potential (compile: false)",
          "zoo_gradient": "zoo gradient alone (compiled)",
          "jax_blackjax": "JAX: BlackJAX velocity_verlet in a jitted fori_loop",
          "exp_floor": "exp floor: one exp per hidden activation"}


def zoo_sides(bench: hmc_speed.BenchModel, chains: int, steps: int, data_dir: str | None,
              gen: torch.Generator) -> tuple[dict[str, Callable[[], object]], tuple, torch.Tensor, torch.Tensor]:
    """The three zoo sides for ``chains`` chains; the model's spec, family and data; the starting points and momenta."""
    spec = hmc_speed.build_spec("hmc", chains, 1, 1, ["inference.compile=true"], bench, data_dir)
    data, family, _, _ = zoo.pipeline.prepare(spec)
    compiled, eager = Potential(family, data, compile=True), Potential(family, data)
    z = 0.1 * torch.randn(chains, compiled.coords.dim, generator=gen, dtype=data.x_train.dtype)
    momentum = torch.randn(z.shape, generator=gen, dtype=z.dtype)
    samplers = {name: ManyChainHMC(potential, z, spec.inference, torch.Generator().manual_seed(0))
                for name, potential in (("zoo_step", compiled), ("zoo_eager", eager))}
    if not compiled.compiled:
        raise RuntimeError("compiling the potential failed (see the warning above): no compiled step to time")
    for sampler in samplers.values():
        sampler.step_size = STEP_SIZE

    def gradient_alone() -> None:
        for _ in range(steps):
            compiled.value_and_grad(z)

    sides: dict[str, Callable[[], object]] = {
        name: (lambda s=sampler: s.integrate(z, momentum, s.grad, steps)) for name, sampler in samplers.items()}
    return sides | {"zoo_gradient": gradient_alone}, (spec, family, data), z, momentum


def jax_side(model_parts: tuple, z: torch.Tensor, momentum: torch.Tensor, steps: int) -> Callable[[], object]:
    """``steps`` BlackJAX velocity-Verlet steps of every chain, one jitted loop, blocked on."""
    import blackjax.mcmc.integrators as integrators
    import jax
    import jax.numpy as jnp
    from blackjax.mcmc.metrics import default_metric

    spec, family, data = model_parts
    logdensity, _, _ = hmc_speed.blackjax_problem(hmc_speed.numpyro_model_of(spec, family), data, len(z),
                                                  jax.random.PRNGKey(0))
    metric = default_metric(jnp.ones(z.shape[1], dtype=jnp.float32))  # identity mass, as the zoo side's
    one_step = integrators.velocity_verlet(logdensity, metric.kinetic_energy)
    value_and_grad = jax.value_and_grad(logdensity)

    def start(position, p):
        value, grad = value_and_grad(position)
        return integrators.IntegratorState(position, p, value, grad)

    @jax.jit
    def run(positions, momenta):
        states = jax.vmap(start)(positions, momenta)
        step = jax.vmap(lambda state: one_step(state, STEP_SIZE))
        return jax.lax.fori_loop(0, steps, lambda _, states: step(states), states).position

    positions, momenta = jnp.asarray(z.numpy()), jnp.asarray(momentum.numpy())
    return lambda: jax.block_until_ready(run(positions, momenta))


def exp_floor(bench: hmc_speed.BenchModel, data, chains: int, steps: int) -> Callable[[], object] | None:
    """``steps`` exps over a [C, N, H] tensor (H: the first hidden layer's width) for tanh nets; else None."""
    net = bench.sections["net"]
    if net["activation"] != "tanh":
        return None
    hidden = net["hidden"][0]
    pre = torch.randn(chains, data.n_train, hidden, dtype=data.x_train.dtype)
    out = torch.empty_like(pre)

    def run() -> None:
        for _ in range(steps):
            torch.exp(pre, out=out)

    return run


def time_sides(sides: dict[str, Callable[[], object]], rounds: int, steps: int) -> dict[str, float]:
    """Median microseconds per step of each side, in alternating rounds after two untimed calls of each."""
    for fn in sides.values():
        fn()
        fn()
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, fn in sides.items():
            started = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - started) / steps * 1e6)
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv: list[str] | None = None) -> dict:
    """Time every side at each chain count, print the table; returns the figures (also written with --json)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(hmc_speed.MODELS), default=hmc_speed.TOY.name)
    parser.add_argument("--data-dir", help="UCI models: the folder holding bostonHousing/")
    parser.add_argument("--chains", default="64,256", help="chain counts, comma-separated")
    parser.add_argument("--steps", type=int, default=50, help="leapfrog steps per timed round")
    parser.add_argument("--rounds", type=int, default=7, help="alternating timed rounds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: XLA also gets one compute thread)")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    chain_counts = parse_counts(args.chains, "--chains", "64,256")
    if args.steps < 1 or args.rounds < 1:
        raise ZooInputError("--steps/--rounds", f"{args.steps}/{args.rounds}", "both must be at least 1")
    try:  # the JAX side: the bench extra
        import blackjax  # noqa: F401
    except ImportError:
        sys.exit("hmc_step.py's JAX side needs JAX, NumPyro and BlackJAX: pip install -e .[bench]")
    bench = hmc_speed.MODELS[args.model]
    data_dir = hmc_speed.resolve_data_dir(args.data_dir) if bench.uci else None
    torch.set_num_threads(args.threads)
    if args.threads == 1:
        hmc_speed.limit_xla_threads()
    rows = []
    for chains in chain_counts:
        sides, model_parts, z, momentum = zoo_sides(bench, chains, args.steps, data_dir,
                                                    torch.Generator().manual_seed(0))
        sides["jax_blackjax"] = jax_side(model_parts, z, momentum, args.steps)
        floor = exp_floor(bench, model_parts[2], chains, args.steps)
        if floor is not None:
            sides["exp_floor"] = floor
        us = time_sides(sides, args.rounds, args.steps)
        row = {"chains": chains, **{f"{name}_us_per_step": value for name, value in us.items()},
               **{f"{name}_us_per_chain_step": value / chains for name, value in us.items()}}
        step = us["zoo_step"]
        row |= {"ratio_zoo_step_to_jax": step / us["jax_blackjax"],
                "ratio_zoo_step_to_gradient_alone": step / us["zoo_gradient"],
                "ratio_eager_to_compiled_step": us["zoo_eager"] / step}
        if "exp_floor" in us:
            row["ratio_zoo_step_to_exp_floor"] = step / us["exp_floor"]
        rows.append(row)
    data = model_parts[2]
    results = {"model": bench.name, "n_train": data.n_train, "dim": int(z.shape[1]), "step_size": STEP_SIZE,
               "steps_per_round": args.steps, "rounds": args.rounds, "torch_threads": args.threads,
               "torch": torch.__version__, "rows": rows}
    print_table(results)
    if args.json:
        write_json(Path(args.json), results)
    return results


def print_table(results: dict) -> None:
    """The sides' µs per step (per chain-step) by chain count, then the ratios."""
    table = Table(title=f"one leapfrog step of all chains, {results['model']} ({results['n_train']} rows, "
                  f"D = {results['dim']}), {results['torch_threads']} thread(s); median µs per step (per chain-step)")
    table.add_column("side")
    for row in results["rows"]:
        table.add_column(f"{row['chains']} chains", justify="right")
    for side in SIDES:
        cells = [f"{row[f'{side}_us_per_step']:,.0f} ({row[f'{side}_us_per_chain_step']:.2f})"
                 if f"{side}_us_per_step" in row else "–" for row in results["rows"]]
        table.add_row(LABELS[side], *cells)
    for key, label in (("ratio_zoo_step_to_jax", "zoo step ÷ JAX"),
                       ("ratio_zoo_step_to_gradient_alone", "zoo step ÷ gradient alone"),
                       ("ratio_zoo_step_to_exp_floor", "zoo step ÷ exp floor"),
                       ("ratio_eager_to_compiled_step", "eager ÷ compiled step")):
        table.add_row(label, *[f"{row[key]:.2f}" if key in row else "–" for row in results["rows"]])
    Console(width=160).print(table)


if __name__ == "__main__":
    sys.exit(exit_code(main))
