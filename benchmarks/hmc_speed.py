"""HMC speed: the zoo's samplers against NumPyro's NUTS, BlackJAX's ChEES-HMC and MAMS and nutpie's NUTS on a BNN,
by function ESS/s.

Models (``--model``; every side samples exactly the chosen density on the same standardised float32 tensors):

- ``toy`` (the default): a 1-50-1 tanh net, Normal(0, 1) prior on every weight and bias, Gaussian likelihood with a
  fixed sigma = 0.1 on the zoo's ``toy_gap`` data (100 training points in two clusters with a gap; data seed 0).
  sigma is taken in ORIGINAL target units, as the spec's ``likelihood.noise`` is: 0.1 is the noise the toy targets
  were drawn with (and what ``configs/mean_field_toy.yaml`` uses); on the standardised targets the samplers see
  it is 0.1 / y_std (about 0.13).
- ``uci:bostonHousing``: the model of ``configs/hmc_uci.yaml`` on UCI bostonHousing split 0 (455 training rows,
  13 features; folder from ``--data-dir``, else ``$ZOO_DATA_DIR``, else ``../shared/data/uci`` beside the repo, as
  ``benchmarks/uci.py`` finds it): a 13-50-1 ReLU net, Normal(0, 1) prior on every weight and bias, Gaussian
  likelihood whose sigma is a latent site ``noise_scale`` (a scalar) under a LogNormal(-1, 1) prior in
  standardised target units (``likelihood.noise: learned``, as ``zoo.likelihoods.Gaussian`` samples it). Every
  side samples it in the same unconstrained coordinate, log sigma, with the same log-Jacobian term.
- ``uci:<folder>`` (e.g. ``uci:energy``, ``uci:concrete``): the same model on that folder's split 0.

A model is its zoo spec sections (``BenchModel``); the NumPyro model (and with it BlackJAX's density) is written
from the spec the zoo side builds (``numpyro_model_of``), so ``--zoo-set`` overrides of the prior scale, the noise
or its prior reach every side, and a model the JAX sides cannot write is refused.

Zoo side: the model built as a run builds it (``zoo.spec.load_spec`` -> ``zoo.pipeline.prepare``), sampled by
``zoo.inference.mcmc.fit_mcmc`` for each ``--zoo-methods`` candidate: ``hmc:C`` is the zoo's many-chain HMC (C
chains in lockstep, its default adaptation: function-space ChEES trajectory), ``mams:C`` the same sampler with
``inference.kernel: mams`` (isokinetic dynamics, Metropolis-adjusted, the same adaptation), ``hmc_mclachlan:C`` and
``mams_mclachlan:C`` those two with ``inference.integrator: mclachlan``, ``nuts:C`` Pyro's NUTS chain after chain
(very slow, off by default). Time: ``result.seconds``, the wall time of warm-up + sampling; the rest of the
``fit_mcmc`` call (start-up: initial points, the check against the traced model, and with ``inference.compile=true``
tracing and compiling the potential) is reported as the zoo's compile time, and the whole call as
``seconds_compile_inclusive``.
NumPyro side: the same model written in NumPyro, ``NUTS`` with default settings, one run per
``--numpyro-methods`` candidate (``vectorized:C``, ``sequential:C``, ``parallel:C``; ``parallel`` runs one chain
per host device, of which this script asks XLA for 2 at import time). Time: the wall time of ``mcmc.run``
(initialisation, warm-up and sampling, results blocked on), measured once; the part of it JAX spent tracing,
lowering and compiling (``jax.monitoring`` compile events during the run) is reported as compile time, and
ESS/s is given without it (the headline) and with it. One run, not a second run of the same MCMC: NumPyro
re-compiles its sampling loop on every ``run`` (checked with jax 0.10 / numpyro 0.22), so a rerun would not be
compile-free either.
BlackJAX side: the same NumPyro model's potential (``numpyro.infer.util.initialize_model``, so the same sites,
shapes and float32 data), log density = minus it, one run per ``--blackjax-methods`` candidate ``chees:C`` or
``chees_diag:C`` (the same with BlackJAX's opt-in diagonal mass matrix, estimated from the ensemble over the last
half of warm-up, and its trajectory-length floor at pi/2 sqrt(largest eigenvalue of the whitened covariance)): C
chains started from C independent prior draws, ``blackjax.chees_adaptation`` for ``--warmup`` steps (Adam with
learning rate 0.025 on the log trajectory length, initial step size 0.01, as BlackJAX documents ChEES), then
``--samples`` draws of ``blackjax.dynamic_hmc`` with the adapted step size, trajectory length and jitter, the C
chains vmapped inside one ``lax.scan``; warm-up and sampling are one jitted function, compiled once, on one XLA
device. Everything else is BlackJAX 1.7's default: dual averaging of the step size towards a 0.651 harmonic-mean
acceptance across chains, decay rate 0.5 of the moving averages whose final values are the sampling parameters,
trajectory jitter from a quasi-random Halton sequence shared by all chains with jitter amount 1 (steps = ceil(u *
length / step size), u in (0, 1)), at most 1,000 leapfrog steps, velocity Verlet, divergence at an energy error
above 1,000, identity mass matrix for ``chees``. Two non-tuning choices: the Halton sequence gets bits for
``--warmup`` + ``--samples`` + 1 steps (``max_sampling_steps=samples + 1``: with fewer it wraps on long runs, and
when warm-up + samples is a power of two its last draw gets u = 0, a move of zero leapfrog steps) and the
warm-up keeps no per-step record (``get_filter_adapt_info_fn()``; nothing here reads it). Time: as NumPyro's, the
wall time of initialisation (prior draws), warm-up and sampling, blocked on the results, measured once, with the
JAX compile events during it reported as compile time; divergences and leapfrog steps are the sampling phase's.
``adjusted_mclmc:C`` is BlackJAX's Metropolis-adjusted microcanonical sampler (MAMS) as its documentation runs it:
each of the C chains tuned on its own by ``adjusted_mclmc_find_L_and_step_size`` (dual averaging to 0.9 acceptance,
the target its docs use, as the function has no default; diagonal preconditioning; BlackJAX 1.7's default of an
average of 2 integration steps per proposal; its two tuning passes given ``--warmup`` iterations in equal halves),
then ``adjusted_mclmc_dynamic`` draws (isokinetic McLachlan, two gradients a step; the number of steps drawn
uniformly with that mean), the chains vmapped; its settings are the chains' medians. ``--blackjax-methods ''``
(or ``--numpyro-methods ''``) skips the side.
nutpie side (``--nutpie-methods``, off by default; ``pip install -e .[nutpie]``): the same model written in PyMC from
the zoo's spec (``pymc_model_of``: float64 copies of the same tensors), compiled by numba, sampled by nutpie's NUTS at
its defaults with ``diag`` (its diagonal mass matrix, adapted from draws and gradients) or ``low_rank``
(``low_rank_modified_mass_matrix=True``, its low-rank modified mass matrix), C chains one after another
(``cores=1``). Time: the wall time of ``nutpie.sample`` (warm-up and sampling); the numba compile is timed apart as
its compile time. Gradients: its leapfrog steps, warm-up included.
Every row also gives the gradients per draw (sampling phase) and the min ESS per 1,000 of them over all chains: what
a gradient buys, whatever it costs; and, where the sampler reports its warm-up (the zoo's many-chain HMC, BlackJAX's
ChEES, nutpie), the gradients each chain spent in warm-up and the min ESS per
1,000 gradients of the whole run, warm-up included: with the cost per gradient level, this is what sets min ESS/s.

Figure: function-space ESS. f(x), the net's output (the mean of y, standardised), at five inputs: on ``toy``
over the whole input range (outside left, left cluster, the gap's centre, right cluster, outside right: -1.5,
-0.75, 0, 0.75, 1.5 in original units), on ``uci:bostonHousing`` the first five test rows of split 0 (as the
zoo's loaded data set holds them, standardised with the training statistics; the noise is not one of the
summaries); ESS is ArviZ's rank-normalised bulk ESS over all chains of each, and a sampler's figure is the minimum
over the five, divided by its time. R-hat (rank-normalised split R-hat) max over the five and the post-warm-up
divergences are reported beside it. The best candidate of each side is the one with the highest min ESS/s; the
ratio zoo best ÷ NumPyro best is the headline (higher is better; target >= 2); zoo best ÷ BlackJAX best is
reported beside it. Each candidate runs once, one after the other, so machine noise on a shared machine moves the
absolute figures; note the chains and threads used.

    python benchmarks/hmc_speed.py [--model toy|uci:bostonHousing|uci:<folder>] [--data-dir DIR]
                                   [--warmup 200] [--samples 200] [--zoo-methods hmc:64[,nuts:2]]
                                   [--numpyro-methods vectorized:4,sequential:4,parallel:2] [--threads N]
                                   [--blackjax-methods chees:64,chees_diag:64] [--nutpie-methods diag:4,low_rank:4]
                                   [--seed 0] [--json PATH]
                                   [--zoo-set inference.KEY=VALUE ...]

Needs the optional NumPyro/JAX/BlackJAX/Optax extra (``pip install -e .[bench]``) and ArviZ.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

import zoo.inference.mcmc
import zoo.pipeline
import zoo.spec
from zoo.data.base import Dataset
from zoo.diagnostics import ESS_MIN, RHAT_MAX
from zoo.errors import ZooInputError
from zoo.likelihoods import Gaussian
from zoo.runs import write_json

try:  # the NumPyro side is optional: pip install -e .[bench]
    import numpyro
except ImportError:  # main() says what to install
    numpyro = None
else:
    # before JAX's first use, so that chain_method="parallel" has 2 host devices (a count the user set wins)
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        numpyro.set_host_device_count(2)

TARGET_RATIO = 2.0  # the target: the zoo at its default adaptation >= 2x NumPyro's best chain method
DATA_SEED = 0  # the spec seed (toy_gap's data seed), whatever --seed the samplers get
NOISE = 0.1  # toy: likelihood sigma in ORIGINAL target units (the spec's convention); see the module docstring
X_EVAL = (-1.5, -0.75, 0.0, 0.75, 1.5)  # toy, original input units: outside, left cluster, gap, right cluster, outside
TEST_ROWS = 5  # UCI: f is read at the first this many test rows of the split
JAX_ACTIVATIONS = ("tanh", "relu")  # the hidden activations the NumPyro model writes
# mams: method hmc with inference.kernel mams; a _mclachlan suffix: inference.integrator mclachlan; _lowrank and
# _dense: inference.metric low_rank and dense
ZOO_OPTIONS = {"mclachlan": {"integrator": "mclachlan"}, "lowrank": {"metric": "low_rank"},
               "dense": {"metric": "dense"}}
ZOO_METHODS = ("hmc", "mams", "nuts", "hmc_mclachlan", "mams_mclachlan", "hmc_lowrank", "mams_lowrank", "hmc_dense")
NUMPYRO_METHODS = ("vectorized", "sequential", "parallel")
BLACKJAX_METHODS = ("chees", "chees_diag", "adjusted_mclmc")
NUTPIE_METHODS = ("diag", "low_rank")  # nutpie's NUTS with its diagonal or its low-rank modified mass matrix
MCLMC_TARGET_ACCEPT = 0.9  # adjusted_mclmc_find_L_and_step_size has no default target; 0.9 as BlackJAX's docs run it
CHEES_LEARNING_RATE = 0.025  # Adam on the log trajectory length, as BlackJAX's ChEES documentation runs it
CHEES_INITIAL_STEP_SIZE = 0.01
INSTALL_HINT = "hmc_speed.py needs NumPyro and JAX (pip install -e .[bench]) and ArviZ (pip install arviz)"
BLACKJAX_HINT = "the BlackJAX side needs BlackJAX and Optax (pip install -e .[bench]); --blackjax-methods '' skips it"
NUTPIE_HINT = "the nutpie side needs nutpie and PyMC (pip install -e .[nutpie]); --nutpie-methods '' skips it"
SIDES = ("zoo", "numpyro", "blackjax", "nutpie")


# ------------------------------------------------------------------------------------------ shared pieces
def parse_candidates(text: str, methods: tuple[str, ...], option: str) -> list[tuple[str, int]]:
    """``"hmc:128,nuts:2"`` -> ``[("hmc", 128), ("nuts", 2)]``, refusing unknown methods and bad chain counts."""
    out = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        method, _, chains = item.partition(":")
        if method not in methods or not chains.isdigit() or int(chains) < 1:
            raise ValueError(f"{option}: {item!r}; write METHOD:CHAINS with METHOD one of {', '.join(methods)}")
        out.append((method, int(chains)))
    if not out:
        raise ValueError(f"{option}: give at least one METHOD:CHAINS")
    return out


def eval_inputs(data: Dataset) -> torch.Tensor:
    """The toy's five evaluation inputs ``[5, 1]``, standardised like the training inputs."""
    x = torch.tensor(X_EVAL, dtype=data.x_train.dtype, device=data.x_train.device).unsqueeze(-1)
    return (x - data.x_mean.to(x)) / data.x_std.to(x)


def first_test_rows(data: Dataset) -> torch.Tensor:
    """The first :data:`TEST_ROWS` test inputs ``[5, D]`` as the zoo's data set holds them (standardised)."""
    return data.x_test[:TEST_ROWS]


def original_units(x: torch.Tensor, data: Dataset) -> list:
    """Standardised inputs ``[E, D]`` back in original units, as nested lists (for the JSON; recovered from the
    float32 tensors, so a 0 of the data file may read 5e-07)."""
    return (x.double() * data.x_std.double() + data.x_mean.double()).tolist()


@dataclass(frozen=True)
class BenchModel:
    """A model the samplers are compared on (``--model``): the zoo spec sections that define it, and the inputs at
    which f is read for the function-space ESS. Only the spec is per model: every side's model is built from it."""

    name: str
    sections: dict  # the spec's data, net, prior and likelihood sections
    eval_inputs: Callable[[Dataset], torch.Tensor]  # [E, D], standardised like the training inputs
    eval_original: Callable[[Dataset], list]  # the same inputs in original units, for the JSON
    eval_caption: str | None = None  # how the tables name them (None: "x = " and the original values)

    @property
    def uci(self) -> bool:
        """Whether the data is a UCI folder (read from ``--data-dir``)."""
        return self.sections["data"]["name"].startswith("uci:")


TOY = BenchModel("toy", {"data": {"name": "toy_gap"},
                         "net": {"hidden": [50], "activation": "tanh"},
                         "prior": {"name": "normal", "scale": 1.0},
                         "likelihood": {"name": "gaussian", "noise": NOISE}},
                 eval_inputs, lambda data: list(X_EVAL))
BOSTON = BenchModel("uci:bostonHousing", {"data": {"name": "uci:bostonHousing", "split": 0},  # configs/hmc_uci.yaml
                                          "net": {"hidden": [50], "activation": "relu"},
                                          "prior": {"name": "normal", "loc": 0.0, "scale": 1.0},
                                          "likelihood": {"name": "gaussian", "noise": "learned"}},
                    first_test_rows, lambda data: original_units(first_test_rows(data), data),
                    f"the first {TEST_ROWS} test rows")
MODELS = {model.name: model for model in (TOY, BOSTON)}


def bench_model(name: str) -> BenchModel:
    """``--model``: the toy, or configs/hmc_uci.yaml's model on split 0 of any UCI folder (``uci:<folder>``)."""
    if name in MODELS:
        return MODELS[name]
    if name.startswith("uci:") and len(name) > 4:
        return BenchModel(name, {**BOSTON.sections, "data": {"name": name, "split": 0}}, BOSTON.eval_inputs,
                          BOSTON.eval_original, BOSTON.eval_caption)
    raise ValueError(f"--model: {name!r}; use toy or uci:<folder>, e.g. uci:bostonHousing or uci:energy")


def build_spec(method: str, chains: int, warmup: int, samples: int, overrides: list[str],
               bench: BenchModel = TOY, data_dir: str | None = None) -> zoo.spec.RunSpec:
    """The run spec of ``bench`` (UCI data read from ``data_dir``) with a zoo sampler; ``overrides``
    (``--zoo-set``) are applied last."""
    sections = copy.deepcopy(bench.sections)
    if bench.uci and data_dir is not None:
        sections["data"]["dir"] = data_dir
    return zoo.spec.load_spec({
        **sections,
        "inference": zoo_sampler(method) | {"num_chains": chains, "warmup_steps": warmup, "num_samples": samples},
        "device": "cpu",
        "seed": DATA_SEED,
    }, overrides)


def zoo_sampler(method: str) -> dict:
    """A zoo candidate's name as its inference settings: ``hmc`` (ChEES-HMC), ``mams``, ``nuts``, and the first two
    with ``_mclachlan`` (the two-stage integrator), ``_lowrank`` or ``_dense`` (the metric)."""
    name, *options = method.split("_")
    settings = {"method": "hmc", "kernel": "mams"} if name == "mams" else {"method": name}
    for option in options:
        settings |= ZOO_OPTIONS[option]
    return settings


def resolve_data_dir(explicit: str | None) -> str:
    """The UCI folder as ``benchmarks/uci.py`` finds it: ``--data-dir``, else ``$ZOO_DATA_DIR``, else
    ``../shared/data/uci`` beside the repository (ZooInputError when none exists)."""
    from uci import resolve_data_dir as resolve  # sibling module of this script

    return str(resolve(explicit))


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def diagnostics(f: np.ndarray) -> dict:
    """Bulk ESS and R-hat of f(x) draws ``[chains, samples, E]`` (ArviZ, rank-normalised, over all chains)."""
    import arviz as az

    dataset = az.convert_to_dataset({"f": np.asarray(f, dtype=np.float64)})
    ess = np.asarray(az.ess(dataset, method="bulk")["f"], dtype=np.float64)
    rhat = np.asarray(az.rhat(dataset, method="rank")["f"], dtype=np.float64)
    min_ess = float(np.min(ess)) if np.isfinite(ess).all() else float("nan")
    max_rhat = float(np.max(rhat)) if np.isfinite(rhat).all() else float("nan")
    return {"ess_bulk": [_finite(v) for v in ess], "min_ess": _finite(min_ess), "rhat": [_finite(v) for v in rhat],
            "rhat_max": _finite(max_rhat)}


def per_second(ess: float | None, seconds: float) -> float | None:
    """ESS per second, or None when the ESS is undefined (e.g. chains that never moved)."""
    return None if ess is None or seconds <= 0 else ess / seconds


# ------------------------------------------------------------------------------------------ zoo side
def run_zoo(method: str, chains: int, args: argparse.Namespace, bench: BenchModel) -> dict:
    """One zoo candidate: build the run's model, sample it with ``fit_mcmc``, and diagnose f at the five inputs."""
    spec = build_spec(method, chains, args.warmup, args.samples, args.zoo_set, bench, args.data_dir)
    data, family, guide, _ = zoo.pipeline.prepare(spec)
    started = time.perf_counter()
    result = zoo.inference.mcmc.MCMC().fit(family, guide, data, spec.inference, args.seed, progress=False)
    total = time.perf_counter() - started
    chains, samples = next(iter(result.draws.values())).shape[:2]
    with torch.no_grad():
        f = family.forward_draws({k: v.flatten(0, 1) for k, v in result.draws.items()},
                                 bench.eval_inputs(data))[..., 0]
    row = {"side": "zoo", "method": method, "chains": int(chains), "warmup": spec.inference.warmup_steps,
           "samples": int(samples), "seconds": result.seconds,
           "seconds_compile_inclusive": total, "compile_seconds": total - result.seconds,
           "divergences": int(result.stats["diverging"].sum()),
           "settings": {k: float(v) for k, v in result.settings.items()},
           **diagnostics(f.reshape(chains, samples, -1).double().cpu().numpy())}
    steps = result.stats.get("n_steps")
    row["leapfrog_steps_per_draw"] = float(steps.float().mean()) if steps is not None else None
    if "tree_depth" in result.stats:
        row["mean_tree_depth"] = float(result.stats["tree_depth"].float().mean())
    row["min_ess_per_s"] = per_second(row["min_ess"], row["seconds"])
    row["min_ess_per_s_compile_inclusive"] = per_second(row["min_ess"], total)
    per_step = zoo.inference.mcmc.gradients_per_step(spec.inference.integrator)
    add_gradient_figures(row, per_step * row["leapfrog_steps_per_draw"] if steps is not None else None,
                         result.settings.get("warmup_gradients"))
    return row


def add_gradient_figures(row: dict, gradients_per_draw: float | None, warmup_gradients: float | None = None) -> None:
    """What a gradient buys: ``gradients_per_draw`` (of the sampling phase, per chain) and min ESS per 1,000 of the
    sampling phase's gradients over all chains (the cost of a gradient aside); with ``warmup_gradients`` (per chain,
    the whole warm-up), also min ESS per 1,000 of all gradients, warm-up included: what the run's time buys."""
    row["gradients_per_draw"] = gradients_per_draw
    spent = gradients_per_draw * row["chains"] * row["samples"] if gradients_per_draw else None
    found = spent and row.get("min_ess") is not None
    row["min_ess_per_1k_gradients"] = 1000 * row["min_ess"] / spent if found else None
    row["warmup_gradients_per_chain"] = warmup_gradients
    row["min_ess_per_1k_gradients_with_warmup"] = (1000 * row["min_ess"] / (spent + warmup_gradients * row["chains"])
                                                   if found and warmup_gradients is not None else None)


# ------------------------------------------------------------------------------------------ NumPyro side
class CompileClock:
    """Seconds JAX spends tracing, lowering and compiling, summed from its ``jax.monitoring`` duration events."""

    EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
              "/jax/core/compile/backend_compile_duration")

    def __init__(self) -> None:
        import jax.monitoring

        self.seconds = 0.0
        self.events = 0
        jax.monitoring.register_event_duration_secs_listener(self._record)

    def _record(self, event: str, duration: float, **_: object) -> None:
        if event in self.EVENTS:
            self.seconds += duration
            self.events += 1


_COMPILE_CLOCK: CompileClock | None = None


def compile_clock() -> CompileClock:
    """The one listener of this process (JAX keeps listeners for good, so register once)."""
    global _COMPILE_CLOCK
    if _COMPILE_CLOCK is None:
        _COMPILE_CLOCK = CompileClock()
    return _COMPILE_CLOCK


def numpyro_model(hidden: int, prior_scale: float, noise: float | None, activation: str = "tanh",
                  noise_prior: tuple[float, float] = (-1.0, 1.0)) -> Callable:
    """The benchmark's BNN in NumPyro, with the zoo's site names and shapes (torch ``nn.Linear`` layout).

    One hidden layer of ``hidden`` ``activation`` units (the input width is x's), Normal(0, prior_scale) on every
    weight and bias, and a Gaussian likelihood whose sigma (standardised units) is ``noise``, or with ``noise=None``
    the latent scalar ``noise_scale`` under LogNormal(*noise_prior), as ``zoo.likelihoods.Gaussian`` samples it.
    """
    import jax
    import jax.numpy as jnp
    import numpyro.distributions as dist

    act = {"tanh": jnp.tanh, "relu": jax.nn.relu}[activation]

    def model(x, y=None):
        def weight(name: str, shape: tuple[int, ...]):
            return numpyro.sample(name, dist.Normal(0.0, prior_scale).expand(shape).to_event(len(shape)))

        w1, b1 = weight("hidden0.weight", (hidden, x.shape[-1])), weight("hidden0.bias", (hidden,))
        w2, b2 = weight("out.weight", (1, hidden)), weight("out.bias", (1,))
        sigma = noise if noise is not None else numpyro.sample(Gaussian.noise_site, dist.LogNormal(*noise_prior))
        f = (act(x @ w1.T + b1) @ w2.T + b2)[..., 0]
        numpyro.sample("obs", dist.Normal(f, sigma), obs=y)

    return model


def refuse_unwritable(spec: zoo.spec.RunSpec, family) -> None:
    """ValueError for a zoo model the peer sides (NumPyro, BlackJAX, nutpie) do not write."""
    prior, likelihood = spec.prior.default, family.likelihood
    if (prior.name != "normal" or prior.loc != 0.0 or spec.prior.sites or len(spec.net.hidden) != 1
            or spec.net.activation not in JAX_ACTIVATIONS or spec.net.name != "mlp"
            or not isinstance(likelihood, Gaussian)):
        raise ValueError("the NumPyro, BlackJAX and nutpie sides write a one-hidden-layer tanh or ReLU MLP with a "
                         "Normal(0, s) prior and a Gaussian likelihood of fixed or learned noise; keep --zoo-set "
                         "to such a model")


def numpyro_model_of(spec: zoo.spec.RunSpec, family) -> Callable:
    """The NumPyro model of the zoo model built from ``spec`` (its sections after ``--zoo-set``), standardised
    noise and noise prior read off the built ``family``; ValueError for a model the JAX sides do not write."""
    refuse_unwritable(spec, family)
    prior, likelihood = spec.prior.default, family.likelihood
    return numpyro_model(spec.net.hidden[0], prior.scale, likelihood.fixed_noise, spec.net.activation,
                         (likelihood.prior_loc, likelihood.prior_scale))


def numpy_forward(draws: dict[str, np.ndarray], x: np.ndarray, activation: str = "tanh") -> np.ndarray:
    """f(x) under draws ``{site: [chains, samples, *shape]}`` of the one-hidden-layer net: ``[chains, samples, B]``."""
    w1, b1 = draws["hidden0.weight"].astype(np.float64), draws["hidden0.bias"].astype(np.float64)
    w2, b2 = draws["out.weight"].astype(np.float64), draws["out.bias"].astype(np.float64)
    act = {"tanh": np.tanh, "relu": lambda a: np.maximum(a, 0.0)}[activation]
    hidden = act(np.einsum("bi,csji->csbj", x, w1) + b1[:, :, None, :])
    return np.einsum("csbj,csoj->csbo", hidden, w2)[..., 0] + b2  # b2 [chains, samples, 1] broadcasts over B


@dataclass(frozen=True)
class Problem:
    """The benchmark's model as the JAX sides sample it: the zoo's data set, the NumPyro model written from the
    zoo's spec, and the inputs at which f is read (standardised, float64) with the net's activation."""

    data: Dataset
    model: Callable
    x_eval: np.ndarray
    activation: str


def run_numpyro(method: str, chains: int, args: argparse.Namespace, problem: Problem) -> dict:
    """One NumPyro candidate: default NUTS, timed whole (blocked on), with JAX's compile time measured inside."""
    import jax
    from numpyro.infer import MCMC, NUTS

    clock = compile_clock()
    data = problem.data
    x, y = data.x_train.detach().cpu().numpy(), data.y_train.detach().cpu().numpy()  # float32, standardised
    mcmc = MCMC(NUTS(problem.model), num_warmup=args.warmup, num_samples=args.samples, num_chains=chains,
                chain_method=method, progress_bar=False)
    compile_before = clock.seconds
    started = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(args.seed), x, y, extra_fields=("diverging", "num_steps"))
    draws = jax.block_until_ready(mcmc.get_samples(group_by_chain=True))
    extra = jax.block_until_ready(mcmc.get_extra_fields(group_by_chain=True))
    wall = time.perf_counter() - started
    return jax_row("numpyro", method, args, problem, draws, wall, min(clock.seconds - compile_before, wall),
                   extra["diverging"], extra["num_steps"])


def jax_row(side: str, method: str, args: argparse.Namespace, problem: Problem, draws: dict, wall: float,
            compile_seconds: float, divergent, n_steps, gradients_per_step: int = 1,
            warmup_gradients: float | None = None, **extra) -> dict:
    """One JAX-side candidate's row (:func:`peer_row`), with the XLA host devices it ran on."""
    import jax

    return peer_row(side, method, args, problem, draws, wall, compile_seconds, divergent, n_steps,
                    gradients_per_step, warmup_gradients, host_devices=jax.local_device_count(), **extra)


def peer_row(side: str, method: str, args: argparse.Namespace, problem: Problem, draws: dict, wall: float,
             compile_seconds: float, divergent, n_steps, gradients_per_step: int = 1,
             warmup_gradients: float | None = None, **extra) -> dict:
    """One peer candidate's row: times, divergences and leapfrog steps of the sampling phase, and the ESS and R-hat
    of f(x) under its draws ``{site: [chains, samples, *shape]}``; ESS/s without and with compile time."""
    f = numpy_forward({k: np.asarray(v) for k, v in draws.items()}, problem.x_eval, problem.activation)
    row = {"side": side, "method": method, "chains": int(f.shape[0]), "warmup": args.warmup,
           "samples": int(f.shape[1]), "seconds": wall - compile_seconds, "seconds_compile_inclusive": wall,
           "compile_seconds": compile_seconds, "divergences": int(np.asarray(divergent).sum()),
           "leapfrog_steps_per_draw": float(np.asarray(n_steps).mean()), **extra, **diagnostics(f)}
    row["min_ess_per_s"] = per_second(row["min_ess"], row["seconds"])
    row["min_ess_per_s_compile_inclusive"] = per_second(row["min_ess"], wall)
    add_gradient_figures(row, gradients_per_step * row["leapfrog_steps_per_draw"], warmup_gradients)
    return row


# ------------------------------------------------------------------------------------------ BlackJAX side
def blackjax_problem(model: Callable, data, chains: int, rng_key) -> tuple[Callable, object, Callable]:
    """The NumPyro model as BlackJAX sees it: ``(logdensity, positions, site_values)``, on flat vectors.

    ``initialize_model`` on one key per chain gives the model's potential on the standardised float32 training
    data and one independent prior draw per chain (``init_to_sample``). BlackJAX gets each chain's unconstrained
    sites raveled into one vector (``jax.flatten_util.ravel_pytree`` order; a learned noise as log sigma):
    ``logdensity(z [D])`` is minus the potential (with its log-Jacobian), ``positions`` is ``[chains, D]``, and
    ``site_values(z)`` gives back ``{site: value}`` (constrained). Flat because BlackJAX 1.7's ChEES criterion
    assumes every position leaf is ``[chains, dim]`` (its weighted ensemble mean reduces the last axis only), which
    the sites' ``[chains, 50, D_in]``, ``[chains, 1, 50]`` and a scalar noise's ``[chains]`` are not.
    """
    import jax
    from jax.flatten_util import ravel_pytree
    from numpyro.infer import init_to_sample
    from numpyro.infer.util import initialize_model

    x, y = data.x_train.detach().cpu().numpy(), data.y_train.detach().cpu().numpy()  # float32, standardised
    info = initialize_model(jax.random.split(rng_key, chains), model, init_strategy=init_to_sample,
                            model_args=(x, y))
    starts = info.param_info.z  # {site: [chains, *shape]}
    _, unravel = ravel_pytree(jax.tree.map(lambda v: v[0], starts))
    positions = jax.vmap(lambda sites: ravel_pytree(sites)[0])(starts)
    potential, postprocess = info.potential_fn, info.postprocess_fn
    return (lambda z: -potential(unravel(z))), positions, (lambda z: postprocess(unravel(z)))


def chees_sampler(logdensity: Callable, chains: int, warmup: int, samples: int, diagonal: bool) -> Callable:
    """``run(key, positions)``, jitted: ChEES warm-up, then ``samples`` dynamic-HMC draws of all chains in one scan.

    Returns ``(draws [samples, chains, D], divergent [samples, chains], integration steps [samples, chains],
    step size, trajectory length, warm-up integration steps per chain)``, the step size and length the adapted
    values the draws used (the warm-up keeps only its integration steps, nothing else).
    """
    import blackjax
    import jax
    import optax
    from blackjax.adaptation.base import get_filter_adapt_info_fn

    adaptation = blackjax.chees_adaptation(logdensity, num_chains=chains,
                                           adaptation_info_fn=get_filter_adapt_info_fn(
                                               info_keys={"num_integration_steps"}),
                                           mass_matrix_estimation="diagonal" if diagonal else None)

    def run(rng_key, positions):
        warmup_key, sample_key = jax.random.split(rng_key)
        (states, parameters), info = adaptation.run(warmup_key, positions, step_size=CHEES_INITIAL_STEP_SIZE,
                                                 optim=optax.adam(CHEES_LEARNING_RATE), num_steps=warmup,
                                                 max_sampling_steps=samples + 1)
        step = jax.vmap(blackjax.dynamic_hmc(logdensity, **parameters).step)

        def draw(states, key):
            states, info = step(jax.random.split(key, chains), states)
            return states, (states.position, info.is_divergent, info.num_integration_steps)

        _, (draws, divergent, n_steps) = jax.lax.scan(draw, states, jax.random.split(sample_key, samples))
        step_size = parameters["step_size"]
        warmup_steps = info.info.num_integration_steps.sum(0).mean()  # [warmup, chains] -> per chain
        return (draws, divergent, n_steps, step_size, parameters["integration_steps_params"][0] * step_size,
                warmup_steps)

    return jax.jit(run)


def adjusted_mclmc_sampler(logdensity: Callable, chains: int, warmup: int, samples: int) -> Callable:
    """``run(key, positions)``, jitted: BlackJAX's adjusted MCLMC (MAMS), each chain tuned on its own by
    ``adjusted_mclmc_find_L_and_step_size`` for ``warmup`` iterations (its two dual-averaging passes, equal halves,
    diagonal preconditioning, its default average of 2 integration steps per proposal), then ``samples`` draws of
    ``adjusted_mclmc_dynamic`` (isokinetic McLachlan integrator, steps drawn uniformly with that mean); the chains
    are vmapped. Returns what :func:`chees_sampler` returns, the step size and length of every chain (each chain
    tunes its own), and no warm-up count (the tuner's passes do not report their integration steps)."""
    import blackjax
    import jax
    import jax.numpy as jnp
    from blackjax.mcmc.adjusted_mclmc import rescale

    def steps_of(key, average):  # the number of integration steps of one proposal, mean ``average``
        return jnp.ceil(jax.random.uniform(key) * rescale(average)).astype(jnp.int32)

    kernel = blackjax.mcmc.adjusted_mclmc_dynamic.build_kernel(integration_steps_fn=steps_of)
    half = warmup / (2 * samples)  # the two passes' fractions of num_steps = samples: warmup iterations in all

    def one_chain(key, position):
        init_key, tune_key, sample_key = jax.random.split(key, 3)
        state = blackjax.mcmc.adjusted_mclmc_dynamic.init(position, logdensity, init_key)
        state, params, _ = blackjax.adjusted_mclmc_find_L_and_step_size(
            mclmc_kernel=kernel, logdensity_fn=logdensity, num_steps=samples, state=state, rng_key=tune_key,
            target=MCLMC_TARGET_ACCEPT, frac_tune1=half, frac_tune2=half)
        average = params.L / params.step_size

        def draw(state, key):
            state, info = kernel(key, state, logdensity, params.step_size,
                                 inverse_mass_matrix=params.inverse_mass_matrix,
                                 integration_steps_params=(average,))
            return state, (state.position, info.is_divergent, info.num_integration_steps)

        _, (draws, divergent, n_steps) = jax.lax.scan(draw, state, jax.random.split(sample_key, samples))
        return draws, divergent, n_steps, params.step_size, params.L

    def run(rng_key, positions):
        draws, divergent, n_steps, step_size, length = jax.vmap(one_chain)(jax.random.split(rng_key, chains),
                                                                           positions)
        # [chains, samples, ...] -> [samples, chains, ...] as chees_sampler returns them
        return jnp.swapaxes(draws, 0, 1), divergent.T, n_steps.T, step_size, length, None

    return jax.jit(run)


def run_blackjax(method: str, chains: int, args: argparse.Namespace, problem: Problem) -> dict:
    """One BlackJAX candidate (``chees`` or ``chees_diag``): ChEES-tuned jittered HMC on the NumPyro model's density,
    timed like NumPyro's run (prior draws, warm-up and sampling, blocked on) with JAX's compile time measured inside."""
    import jax

    clock = compile_clock()
    init_key, run_key = jax.random.split(jax.random.PRNGKey(args.seed))
    compile_before = clock.seconds
    started = time.perf_counter()
    logdensity, positions, site_values = blackjax_problem(problem.model, problem.data, chains, init_key)
    run = (adjusted_mclmc_sampler(logdensity, chains, args.warmup, args.samples) if method == "adjusted_mclmc"
           else chees_sampler(logdensity, chains, args.warmup, args.samples, diagonal=method == "chees_diag"))
    draws, divergent, n_steps, step_size, length, warmup_steps = jax.block_until_ready(run(run_key, positions))
    wall = time.perf_counter() - started
    compile_seconds = min(clock.seconds - compile_before, wall)  # before the conversion below compiles its own
    values = jax.vmap(jax.vmap(site_values))(jax.numpy.swapaxes(draws, 0, 1))  # {site: [chains, samples, ...]}
    return jax_row("blackjax", method, args, problem, values, wall, compile_seconds, divergent, n_steps,
                   gradients_per_step=2 if method == "adjusted_mclmc" else 1,  # McLachlan: two gradients a step
                   warmup_gradients=None if warmup_steps is None else float(warmup_steps),
                   settings=tuned_settings(np.asarray(step_size), np.asarray(length)))


# ------------------------------------------------------------------------------------------ nutpie side
def pymc_model_of(spec: zoo.spec.RunSpec, family, data: Dataset):
    """The zoo model built from ``spec`` written in PyMC for nutpie: the same sites, shapes (torch ``nn.Linear``
    layout), priors and float64 copies of the standardised training tensors; a learned noise is the latent
    ``noise_scale`` under its LogNormal prior, which PyMC samples as log sigma with its Jacobian, as the zoo does."""
    import pymc as pm

    refuse_unwritable(spec, family)
    prior, likelihood = spec.prior.default, family.likelihood
    hidden = spec.net.hidden[0]
    x = data.x_train.detach().double().cpu().numpy()
    y = data.y_train.detach().double().cpu().numpy().reshape(-1)
    with pm.Model() as model:
        w1 = pm.Normal("hidden0.weight", 0.0, prior.scale, shape=(hidden, x.shape[1]))
        b1 = pm.Normal("hidden0.bias", 0.0, prior.scale, shape=(hidden,))
        w2 = pm.Normal("out.weight", 0.0, prior.scale, shape=(1, hidden))
        b2 = pm.Normal("out.bias", 0.0, prior.scale, shape=(1,))
        sigma = likelihood.fixed_noise if likelihood.fixed_noise is not None else pm.LogNormal(
            Gaussian.noise_site, likelihood.prior_loc, likelihood.prior_scale)
        act = pm.math.tanh if spec.net.activation == "tanh" else (lambda a: pm.math.maximum(a, 0.0))
        f = (pm.math.dot(act(pm.math.dot(x, w1.T) + b1), w2.T) + b2)[:, 0]
        pm.Normal("obs", f, sigma, observed=y)
    return model


def run_nutpie(method: str, chains: int, args: argparse.Namespace, problem: Problem, model) -> dict:
    """One nutpie candidate: its NUTS with the diagonal (``diag``) or the low-rank modified mass matrix
    (``low_rank``) at nutpie's defaults otherwise, the chains one after another (``cores=1``) on the PyMC model
    compiled by numba; the compile is timed apart. Gradients: nutpie's leapfrog steps, warm-up included."""
    import nutpie

    started = time.perf_counter()
    compiled = nutpie.compile_pymc_model(model, backend="numba")
    compile_seconds = time.perf_counter() - started
    trace = nutpie.sample(compiled, draws=args.samples, tune=args.warmup, chains=chains, cores=1, seed=args.seed,
                          low_rank_modified_mass_matrix=method == "low_rank", save_warmup=True, progress_bar=False)
    wall = time.perf_counter() - started
    posterior, stats = trace.posterior, trace.sample_stats
    draws = {name: posterior[name].values for name in ("hidden0.weight", "hidden0.bias", "out.weight", "out.bias")}
    warmup_steps = float(trace.warmup_sample_stats["n_steps"].values.sum(axis=1).mean())
    settings = {"step_size": float(np.median(stats["step_size"].values))}
    if method == "low_rank":
        settings["mass_matrix_directions"] = float(np.median(stats["num_eigenvalues"].values))
    return peer_row("nutpie", method, args, problem, draws, wall, compile_seconds, stats["diverging"].values,
                    stats["n_steps"].values, warmup_gradients=warmup_steps, settings=settings)


def tuned_settings(step_size: np.ndarray, length: np.ndarray) -> dict:
    """The adapted step size and trajectory length; where each chain tuned its own (adjusted MCLMC), their medians
    over the chains whose tuning ended finite, and how many did not."""
    if step_size.ndim == 0:
        return {"step_size": float(step_size), "trajectory_length": float(length)}
    finite = np.isfinite(step_size) & np.isfinite(length)
    return {"step_size": float(np.median(step_size[finite])) if finite.any() else float("nan"),
            "trajectory_length": float(np.median(length[finite])) if finite.any() else float("nan"),
            "chains_tuned_to_nan": int((~finite).sum())}


# ------------------------------------------------------------------------------------------ driver
def best(rows: dict[str, dict], key: str) -> str:
    """The candidate with the highest ``key`` (an undefined figure counts as the lowest)."""
    return max(rows, key=lambda name: rows[name][key] if rows[name][key] is not None else -math.inf)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def limit_xla_threads() -> bool:
    """One XLA CPU compute thread per device (the NumPyro side of ``--threads 1``), if JAX has not started yet."""
    try:
        from jax._src import xla_bridge

        if xla_bridge.backends_are_initialized():
            return False
    except (ImportError, AttributeError):
        return False
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_multi_thread_eigen" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen=false".strip()
    return True


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> dict:
    """Run every candidate of both sides, print the table; returns the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=TOY.name,
                        help="the model every side samples (module docstring): toy, the tanh net on toy_gap, or "
                        "uci:<folder>, configs/hmc_uci.yaml's ReLU net with learned noise on the folder's split 0 "
                        "(e.g. uci:bostonHousing, uci:energy)")
    parser.add_argument("--data-dir", help="UCI models: the folder holding bostonHousing/ (default: $ZOO_DATA_DIR, "
                        "else ../shared/data/uci beside the repository)")
    parser.add_argument("--warmup", type=int, default=200, help="warm-up iterations per chain")
    parser.add_argument("--samples", type=int, default=200, help="kept draws per chain")
    parser.add_argument("--zoo-methods", default="hmc:64",
                        help="zoo candidates METHOD:CHAINS, comma-separated (hmc: ChEES-HMC, mams, nuts; "
                        "hmc_mclachlan, mams_mclachlan: with the two-stage integrator); e.g. hmc:128,mams:128,nuts:2")
    parser.add_argument("--numpyro-methods", default="vectorized:4,sequential:4,parallel:2",
                        help="NumPyro NUTS candidates CHAIN_METHOD:CHAINS (vectorized, sequential, parallel); '' "
                        "skips the side")
    parser.add_argument("--blackjax-methods", default="chees:64,chees_diag:64",
                        help="BlackJAX candidates METHOD:CHAINS (chees: ChEES-tuned dynamic HMC; chees_diag: the same "
                        "with BlackJAX's diagonal mass matrix; adjusted_mclmc: BlackJAX's MAMS, each chain tuned by "
                        "adjusted_mclmc_find_L_and_step_size); '' skips the side")
    parser.add_argument("--nutpie-methods", default="",
                        help="nutpie candidates METHOD:CHAINS (diag: its NUTS with a diagonal mass matrix; low_rank: "
                        "with its low-rank modified mass matrix), run one chain after another; '' (the default) skips "
                        "the side")
    parser.add_argument("--threads", type=int, help="torch intra-op threads; 1 also makes XLA's CPU compute "
                        "single-threaded per device (default: each library's choice)")
    parser.add_argument("--seed", type=int, default=0, help="seed of both samplers (the data set stays seed 0)")
    parser.add_argument("--zoo-set", action="append", default=[], metavar="KEY=VALUE",
                        help="spec override for the zoo candidates, applied last (e.g. "
                        "inference.max_leapfrog_steps=64); likelihood/prior overrides reach the NumPyro model too")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.add_argument("--from-json", metavar="PATH", help="sample nothing: print the tables (and the ratios, "
                        "recomputed) of the figures an earlier run wrote with --json")
    args = parser.parse_args(argv)
    if args.from_json:
        results = json.loads(Path(args.from_json).read_text())
        summarise(results)
        print_tables(results)
        if args.json:
            write_json(args.json, results)
        return results
    if args.warmup < 1 or args.samples < 4:
        parser.error("--warmup must be >= 1 and --samples >= 4 (ESS needs a few draws per chain)")
    try:
        zoo_candidates = parse_candidates(args.zoo_methods, ZOO_METHODS, "--zoo-methods")
        numpyro_candidates = (parse_candidates(args.numpyro_methods, NUMPYRO_METHODS, "--numpyro-methods")
                              if args.numpyro_methods.strip() else [])
        blackjax_candidates = (parse_candidates(args.blackjax_methods, BLACKJAX_METHODS, "--blackjax-methods")
                               if args.blackjax_methods.strip() else [])
        nutpie_candidates = (parse_candidates(args.nutpie_methods, NUTPIE_METHODS, "--nutpie-methods")
                             if args.nutpie_methods.strip() else [])
        bench = bench_model(args.model)
    except ValueError as exc:
        parser.error(str(exc))
    if bench.uci:
        try:
            args.data_dir = resolve_data_dir(args.data_dir)
        except ZooInputError as exc:
            parser.error(str(exc))
    try:
        import arviz  # noqa: F401 - the ESS and R-hat
    except ImportError:
        sys.exit(INSTALL_HINT)
    if numpyro is None:
        sys.exit(INSTALL_HINT)
    import jax

    if args.threads:
        torch.set_num_threads(args.threads)
    xla_single_thread = limit_xla_threads() if args.threads == 1 else False
    versions = {"torch": torch.__version__, "numpyro": numpyro.__version__, "jax": jax.__version__}
    if blackjax_candidates:
        try:  # after limit_xla_threads: importing BlackJAX starts JAX's backends
            import blackjax
            import optax
        except ImportError:
            sys.exit(BLACKJAX_HINT)
        versions.update(blackjax=blackjax.__version__, optax=optax.__version__)
    if nutpie_candidates:
        try:
            import nutpie
            import pymc
        except ImportError:
            sys.exit(NUTPIE_HINT)
        versions.update(nutpie=nutpie.__version__, pymc=pymc.__version__)

    # the model every side samples: data, standardised noise and prior scale exactly as a zoo run has them
    reference = build_spec("hmc", 1, args.warmup, args.samples, args.zoo_set, bench, args.data_dir)
    data, family, _, _ = zoo.pipeline.prepare(reference)
    try:
        model = numpyro_model_of(reference, family)
    except ValueError as exc:
        parser.error(str(exc))
    x_eval = bench.eval_inputs(data)
    problem = Problem(data, model, x_eval.double().numpy(), reference.net.activation)

    results = {"model": model_label(reference, family, data), "data": reference.data.name, "data_seed": DATA_SEED,
               "n_train": data.n_train, **noise_facts(reference, family), "y_std": data.y_std,
               "x_eval": bench.eval_original(data), "x_eval_standardised": x_eval.squeeze(-1).tolist(),
               "warmup": args.warmup, "samples": args.samples, "seed": args.seed, "zoo_set": args.zoo_set,
               "torch_threads": torch.get_num_threads(), "xla_single_thread": xla_single_thread,
               "versions": versions, "target_ratio": TARGET_RATIO, **{side: {} for side in SIDES}}
    if bench is not TOY:  # keys the toy's figures never had (a JSON without bench_model is the toy's)
        results.update(bench_model=bench.name, split=reference.data.model_dump().get("split"),
                       x_eval_caption=bench.eval_caption, data_dir=args.data_dir if bench.uci else None)
    for method, chains in zoo_candidates:
        results["zoo"][f"{method}:{chains}"] = run_zoo(method, chains, args, bench)
    for method, chains in numpyro_candidates:
        results["numpyro"][f"{method}:{chains}"] = run_numpyro(method, chains, args, problem)
    for method, chains in blackjax_candidates:
        results["blackjax"][f"{method}:{chains}"] = run_blackjax(method, chains, args, problem)
    if nutpie_candidates:
        pymc_model = pymc_model_of(reference, family, data)
        for method, chains in nutpie_candidates:
            results["nutpie"][f"{method}:{chains}"] = run_nutpie(method, chains, args, problem, pymc_model)
    results["host_devices"] = jax.local_device_count()

    summarise(results)
    print_tables(results)
    if args.json:
        write_json(args.json, results)
    return results


def model_label(spec: zoo.spec.RunSpec, family, data: Dataset) -> str:
    """The model in words, e.g. ``1-50-1 tanh, Normal(0, 1) prior, Gaussian likelihood`` (the toy's, as before)."""
    label = (f"{data.in_dim}-{spec.net.hidden[0]}-1 {spec.net.activation}, Normal(0, {spec.prior.default.scale:g}) "
             "prior, Gaussian likelihood")
    noise = family.likelihood
    if noise.fixed_noise is None:
        label += f" with learned noise, LogNormal({noise.prior_loc:g}, {noise.prior_scale:g}) prior"
    return label


def noise_facts(spec: zoo.spec.RunSpec, family) -> dict:
    """The JSON's noise keys: a fixed sigma in original and standardised units, or (learned) None and its prior."""
    noise = family.likelihood.fixed_noise
    if noise is not None:
        return {"noise_original_units": float(spec.likelihood.noise), "noise_standardised": float(noise)}
    return {"noise_original_units": None, "noise_standardised": None, "noise": "learned",
            "noise_prior": {"name": "lognormal", "loc": family.likelihood.prior_loc,
                            "scale": family.likelihood.prior_scale, "units": "standardised"}}


def converged(row: dict) -> bool:
    """Whether a candidate's draws pass the zoo's convergence checks on f(x): R-hat <= 1.01, ESS >= 400, no
    divergences (``zoo diagnose --strict``'s thresholds): ESS of draws that fail them is not an ESS to trust."""
    return (row["rhat_max"] is not None and row["rhat_max"] <= RHAT_MAX and row["min_ess"] is not None
            and row["min_ess"] >= ESS_MIN and row["divergences"] == 0)


def best_of(rows: dict[str, dict], key: str, only_converged: bool = False) -> str | None:
    """The best candidate by ``key``, among the converged ones if asked (None when there is none)."""
    kept = {name: row for name, row in rows.items() if converged(row) or not only_converged}
    return best(kept, key) if kept else None


def summarise(results: dict) -> None:
    """Add the best candidates of each side and the ratios to ``results`` (also for figures read back from JSON).

    The headline compares the best candidates by min ESS/s; the ``_converged`` figures compare only candidates
    whose draws pass the convergence checks (:func:`converged`).
    """
    results.setdefault("nutpie", {})  # figures written before the nutpie side
    for side in SIDES:
        for row in results[side].values():
            row["converged"] = converged(row)
    for suffix, only in (("", False), ("_converged", True)):
        for side in SIDES:
            rows = results[side]
            name = best_of(rows, "min_ess_per_s", only)
            inclusive = best_of(rows, "min_ess_per_s_compile_inclusive", only)
            results[f"{side}_best{suffix}"] = name
            results[f"{side}_best{suffix}_compile_inclusive"] = inclusive
            results[f"{side}_best{suffix}_min_ess_per_s"] = rows[name]["min_ess_per_s"] if name else None
            results[f"{side}_best{suffix}_min_ess_per_s_compile_inclusive"] = (
                rows[inclusive]["min_ess_per_s_compile_inclusive"] if inclusive else None)
        for peer in SIDES[1:]:
            results[f"ratio_zoo_over_{peer}{suffix}"] = ratio(results[f"zoo_best{suffix}_min_ess_per_s"],
                                                              results[f"{peer}_best{suffix}_min_ess_per_s"])
            results[f"ratio_zoo_over_{peer}{suffix}_compile_inclusive"] = ratio(
                results[f"zoo_best{suffix}_min_ess_per_s_compile_inclusive"],
                results[f"{peer}_best{suffix}_min_ess_per_s_compile_inclusive"])
    results["ratio_within_target"] = (results["ratio_zoo_over_numpyro"] is not None
                                      and results["ratio_zoo_over_numpyro"] >= TARGET_RATIO)


def print_tables(results: dict) -> None:
    """The per-candidate table and the ratios, as the run prints them."""
    data = results["data"] + (f" split {results['split']}" if results.get("split") is not None else "")
    if results["noise_standardised"] is not None:  # a learned noise is in the model's words already
        data += (f" (sigma {results['noise_original_units']:g} original = {results['noise_standardised']:.3f} "
                 "standardised)")
    count = len(results["x_eval_standardised"])
    where = results.get("x_eval_caption") or f"x = {', '.join(f'{v:g}' for v in results['x_eval'])}"
    table = Table(title=f"function-space ESS/s: {results['model']} on {data}, {results['warmup']} "
                        f"warm-up + {results['samples']} draws per chain, bulk ESS and R-hat of f(x) at {where} "
                        f"(min / max of the {'five' if count == 5 else count}); time = warm-up + sampling, "
                        f"'+compile' adds compile time (zoo: all start-up); converged: R-hat <= {RHAT_MAX}, ESS >= "
                        f"{ESS_MIN:.0f}, no divergences (torch threads {results['torch_threads']}, "
                        f"{results['host_devices']} XLA host devices)")
    for col in ("sampler", "chains", "time s", "compile s", "min ESS", "min ESS/s", "+compile", "R-hat max",
                "divergences", "leapfrog/draw", "grad/draw", "ESS/1k grad", "warm-up grad", "ESS/1k grad+w",
                "converged"):
        table.add_column(col, justify="left" if col == "sampler" else "right", no_wrap=True)
    for side in SIDES:
        for name, row in results[side].items():
            label = f"{side} {name}" + (" (best)" if name == results[f"{side}_best"] else "")
            table.add_row(label, str(row["chains"]), f"{row['seconds']:.1f}", f"{row['compile_seconds']:.1f}",
                          _fmt(row["min_ess"], ".0f"), _fmt(row["min_ess_per_s"], ".2f"),
                          _fmt(row["min_ess_per_s_compile_inclusive"], ".2f"), _fmt(row["rhat_max"], ".3f"),
                          str(row["divergences"]), _fmt(row["leapfrog_steps_per_draw"], ".0f"),
                          _fmt(row.get("gradients_per_draw"), ".0f"), _fmt(row.get("min_ess_per_1k_gradients"), ".2f"),
                          _fmt(row.get("warmup_gradients_per_chain"), ",.0f"),
                          _fmt(row.get("min_ess_per_1k_gradients_with_warmup"), ".2f"),
                          "yes" if row["converged"] else "NO")
    summary = Table(title="zoo best ÷ NumPyro best, the headline, and ÷ BlackJAX and nutpie best (min ESS/s; higher is "
                          "better)")
    for col in ("figure", "zoo best", "peer best", "ratio", f"≥ {TARGET_RATIO}"):
        summary.add_column(col, justify="left" if col == "figure" else "right")
    peer_names = {"numpyro": "NumPyro", "blackjax": "BlackJAX", "nutpie": "nutpie"}
    for peer in SIDES[1:]:
        for suffix, among in (("", "all candidates"), ("_converged", "converged candidates only")):
            for inclusive, how in (("", "without compile"), ("_compile_inclusive", "with compile and start-up")):
                if peer == "blackjax" and inclusive:
                    continue
                zoo_name = results[f"zoo_best{suffix}{inclusive}"]
                peer_name = results[f"{peer}_best{suffix}{inclusive}"]
                if peer_name is None and not results[peer]:
                    continue  # the side was skipped
                r = results[f"ratio_zoo_over_{peer}{suffix}{inclusive}"]
                target = ("yes" if r is not None and r >= TARGET_RATIO else "no") if peer == "numpyro" else "–"
                summary.add_row(f"÷ {peer_names[peer]}: min ESS/s ({how}), {among}",
                                f"{zoo_name}: {_fmt(results[f'zoo_best{suffix}_min_ess_per_s{inclusive}'], '.2f')}",
                                f"{peer} {peer_name}: "
                                f"{_fmt(results[f'{peer}_best{suffix}_min_ess_per_s{inclusive}'], '.2f')}",
                                _fmt(r, ".3f"), target)
    console = Console(width=max(Console().width, 210))  # wide enough for every column when piped to a file
    console.print(table)
    console.print(summary)


if __name__ == "__main__":
    main()
