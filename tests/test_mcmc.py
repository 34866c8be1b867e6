"""MCMC on the families' own models: the potential, both samplers against a closed-form posterior, run dirs."""

from __future__ import annotations

import math
import shutil
import warnings
from pathlib import Path

import arviz as az
import pytest
import torch
import yaml

from tests.conftest import COMPILED_STEP_MARKS, compiled_step, record_checkpoints
from zoo import runs
from zoo.errors import ZooInputError
from zoo.inference import mcmc
from zoo.inference.compiled import exp_tanh
from zoo.inference.draws import SAMPLES_FILE
from zoo.inference.mcmc import MCMC, DualAveraging, halton
from zoo.inference.metric import Metric
from zoo.inference.potential import Coordinates, LogJoint, Potential
from zoo.pipeline import load_run, prepare, train
from zoo.posterior import SamplePosterior
from zoo.spec import load_spec

NOISE = 0.5  # original units


def linear_spec(method: str, **inference) -> dict:
    """Bayesian linear regression y = w x + b on the toy data: a conjugate model with a closed-form posterior."""
    return {"data": {"name": "toy_gap", "n_train": 40}, "net": {"hidden": []},
            "prior": {"name": "normal", "scale": 1.0}, "likelihood": {"noise": NOISE},
            "device": "cpu", "dtype": "float64", "seed": 1,
            "inference": {"method": method, **inference}}


def closed_form(data, noise: float, prior_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Posterior mean and covariance of (w, b) for y ~ N(w x + b, noise^2), (w, b) ~ N(0, prior_scale^2 I)."""
    design = torch.cat([data.x_train, torch.ones_like(data.x_train)], dim=1).double()
    precision = design.T @ design / noise**2 + torch.eye(2, dtype=torch.float64) / prior_scale**2
    cov = torch.linalg.inv(precision)
    return cov @ design.T @ data.y_train.double() / noise**2, cov


def sampled_moments(result) -> tuple[torch.Tensor, torch.Tensor]:
    draws = result.flat_draws()
    flat = torch.stack([draws["out.weight"].reshape(-1), draws["out.bias"].reshape(-1)], dim=1)
    return flat.mean(0), torch.cov(flat.T)


def assert_matches_conjugate(result, data, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """A sampler's draws of (w, b) against N(mean, T cov), the closed form: mean within 0.15 posterior sd, sd within
    15%. Returns the closed-form and the sampled covariance."""
    mean, cov = closed_form(data, NOISE / data.y_std)
    got_mean, got_cov = sampled_moments(result)
    sd = (temperature * cov.diagonal()).sqrt()
    # Monte Carlo error of a mean over >= 600 correlated draws is well under 0.15 posterior sd
    assert ((got_mean - mean).abs() / sd).max() < 0.15
    torch.testing.assert_close(got_cov.diagonal().sqrt(), sd, rtol=0.15, atol=0.0)
    return cov, got_cov


@pytest.mark.parametrize(("method", "settings"), [
    ("nuts", {"num_chains": 4, "warmup_steps": 100, "num_samples": 200}),
    ("hmc", {"num_chains": 32, "warmup_steps": 150, "num_samples": 100}),
    pytest.param("nuts", {"num_chains": 2, "warmup_steps": 100, "num_samples": 200, "compile": True},
                 marks=COMPILED_STEP_MARKS),
    pytest.param("hmc", {"num_chains": 32, "warmup_steps": 150, "num_samples": 100, "compile": True},
                 marks=COMPILED_STEP_MARKS),
    ("hmc", {"num_chains": 32, "warmup_steps": 150, "num_samples": 100, "kernel": "mams"}),
    ("hmc", {"num_chains": 32, "warmup_steps": 150, "num_samples": 100, "metric": "low_rank"}),
    ("hmc", {"num_chains": 32, "warmup_steps": 150, "num_samples": 100, "metric": "dense"}),
], ids=["nuts", "hmc", "nuts-compiled", "hmc-compiled", "hmc-mams", "hmc-low-rank", "hmc-dense"])
def test_samplers_recover_the_conjugate_linear_regression_posterior(method, settings):
    spec = load_spec(linear_spec(method, **settings))
    data, family, guide, _ = prepare(spec)
    result = MCMC().fit(family, guide, data, spec.inference, spec.seed, progress=False)
    cov, got_cov = assert_matches_conjugate(result, data)
    sd = cov.diagonal().sqrt()
    corr, got_corr = cov[0, 1] / sd.prod(), got_cov[0, 1] / got_cov.diagonal().sqrt().prod()
    # the true correlation is 0; across seeds NUTS's sample correlation here strays up to 0.12-0.15 (an effective
    # sample size near 100 for this statistic), with chains seeded one way or another
    assert abs(float(corr - got_corr)) < (0.15 if method == "nuts" else 0.1)
    n_chains = settings["num_chains"]
    assert result.draws["out.weight"].shape == (n_chains, settings["num_samples"], 1, 1)
    for name in ("acceptance_rate", "diverging", "step_size"):
        assert result.stats[name].shape == (n_chains, settings["num_samples"])
    # the Hamiltonian (for E-BFMI) where there is one: MAMS's unit-speed velocity has no Gaussian kinetic energy
    assert ("energy" in result.stats) is (settings.get("kernel") != "mams")
    assert int(result.stats["diverging"].sum()) == 0
    assert 0.5 < float(result.stats["acceptance_rate"].mean()) <= 1.0
    assert ("tree_depth" if method == "nuts" else "n_steps") in result.stats


def test_fast_log_joint_equals_the_traced_model_with_a_learned_noise(spec_factory):
    spec = spec_factory("toy", "likelihood.noise=learned", "prior.scale=0.7")
    data, family, _, _ = prepare(spec)
    coords = Coordinates(family)
    z = torch.randn(5, coords.dim)
    values, _ = coords.unpack(z)
    log_joint = LogJoint(family, data.x_train, data.y_train)
    assert torch.allclose(log_joint.fast(values), log_joint.exact(values), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("member_likelihood", ["average", "mixture"])
def test_fast_log_joint_equals_the_traced_model_for_rank1(spec_factory, member_likelihood):
    spec = spec_factory("toy", "model.family=rank1", "model.members=3", f"model.member_likelihood={member_likelihood}",
                        "model.weight_decay=1.0", "guide.name=mixture", "prior.loc=1.0", "prior.scale=0.3")
    data, family, _, _ = prepare(spec)
    coords = Coordinates(family)
    values, _ = coords.unpack(1.0 + 0.3 * torch.randn(4, coords.dim))
    log_joint = LogJoint(family, data.x_train, data.y_train)
    assert log_joint.constant != 0.0  # the weight-decay factor on W
    assert torch.allclose(log_joint.fast(values), log_joint.exact(values), rtol=1e-5, atol=1e-3)


def test_a_disagreeing_fast_path_falls_back_to_the_traced_model(spec_factory, monkeypatch):
    spec = spec_factory("toy")
    data, family, _, _ = prepare(spec)
    coords = Coordinates(family)
    values, _ = coords.unpack(torch.randn(3, coords.dim))
    log_joint = LogJoint(family, data.x_train, data.y_train)
    monkeypatch.setattr(family, "log_likelihood", lambda d, x, y: torch.zeros(3, len(y)))
    messages = []
    log_joint.verify(values, messages.append)
    assert log_joint.exact_only and "exact" in messages[0]
    assert torch.equal(log_joint(values), log_joint.exact(values))


def test_potential_includes_the_jacobian_of_constrained_sites(spec_factory):
    spec = spec_factory("toy", "likelihood.noise=learned")
    data, family, _, _ = prepare(spec)
    potential = Potential(family, data)
    z = torch.randn(2, potential.coords.dim)
    values, log_det = potential.coords.unpack(z)
    # the noise scale is exp(z_noise): log|dσ/dz| = z_noise
    index = potential.coords.names.index("noise_scale")
    offset = sum(potential.coords.sizes[:index])
    assert torch.allclose(log_det, z[:, offset])
    assert torch.allclose(potential(z), -(potential.log_joint(values) + log_det))
    energy, grad = potential.value_and_grad(z)
    assert grad.shape == z.shape and torch.isfinite(grad).all()
    assert torch.allclose(potential.coords.pack(values), z, atol=1e-5)


def test_chunked_potential_equals_one_call_and_reaches_fit_mcmc(spec_factory):
    spec = spec_factory("toy", "likelihood.noise=learned")
    data, family, _, _ = prepare(spec)
    whole, chunked = Potential(family, data), Potential(family, data, chain_chunk=3)
    z = torch.randn(7, whole.coords.dim)  # chunks of 3, 3 and 1
    energy, grad = whole.value_and_grad(z)
    chunk_energy, chunk_grad = chunked.value_and_grad(z)
    torch.testing.assert_close(chunk_energy, energy)
    torch.testing.assert_close(chunk_grad, grad)
    assert chunked.evaluations == 1  # one evaluation of all chains, whatever the chunks
    spec = load_spec(linear_spec("hmc", num_chains=4, warmup_steps=5, num_samples=5, chain_chunk=2))
    data, family, guide, _ = prepare(spec)
    calls = []
    original = Potential._value_and_grad
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Potential, "_value_and_grad", lambda self, z: calls.append(len(z)) or original(self, z))
        MCMC().fit(family, guide, data, spec.inference, spec.seed, progress=False)
    assert calls and set(calls) == {2}


def test_compiled_potential_matches_the_eager_one(spec_factory):
    spec = spec_factory("toy", "net.hidden=[4]", "likelihood.noise=learned")
    data, family, _, _ = prepare(spec)
    eager, compiled = Potential(family, data), Potential(family, data, compile=True)
    z = torch.randn(8, eager.coords.dim)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        energy, grad = compiled.value_and_grad(z)
    if not compiled.compiled:  # torch.compile unavailable here: it fell back to the eager potential, and said so
        assert any("torch.compile" in str(w.message) for w in caught)
    reference_energy, reference_grad = eager.value_and_grad(z)
    torch.testing.assert_close(energy, reference_energy, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(grad, reference_grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device, captured", [("cpu", False), ("cuda", True)])
def test_the_potential_is_captured_as_a_cuda_graph_only_from_gpu_inputs(device, captured, monkeypatch):
    """``TracedCompile(cuda_graphs=True)`` asks Inductor for a CUDA graph only when its inputs are on a GPU, and then
    returns copies of the outputs (a replay overwrites the last one's memory). Checked without a GPU by recording
    what ``torch.compile`` is asked for; tests/test_cuda.py runs the real capture on one."""
    from zoo.inference import compiled as compiled_module

    asked = []

    def fake_compile(graph, **kwargs):
        asked.append(kwargs["options"])
        return lambda *inputs: (inputs[0] * 2,)

    monkeypatch.setattr(compiled_module.torch, "compile", fake_compile)
    monkeypatch.setattr(compiled_module, "make_fx", lambda fn: lambda *inputs: fn)
    monkeypatch.setattr(compiled_module, "lift_random_draws", lambda graph: [])  # a graph without draws
    traced = compiled_module.TracedCompile(lambda x: (x * 2,), "a test", cuda_graphs=True)
    x = torch.ones(3)
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device(device)))
    monkeypatch.setattr(torch.Tensor, "clone", lambda self: ("copy", self))
    out = traced(x)
    assert asked == [compiled_module.compile_options(captured)]
    assert ("triton.cudagraphs" in asked[0]) == captured and asked[0]["fallback_random"]
    assert (out[0][0] == "copy") if captured else isinstance(out[0], torch.Tensor)


def test_exp_tanh_rewrites_tanh_in_value_and_gradient():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.func.grad(lambda x: (torch.tanh(3 * x) * x).sum())(x)

    x = torch.tensor([-60.0, -3.0, -0.5, -1e-4, 0.0, 1e-4, 0.5, 3.0, 60.0])
    graph = make_fx(f)(x)
    exp_tanh(graph)
    targets = {node.target for node in graph.graph.nodes}
    assert torch.ops.aten.tanh.default not in targets and torch.ops.aten.exp.default in targets
    torch.testing.assert_close(graph(x), f(x), rtol=0, atol=1e-6)  # saturates at +-1 without inf/inf
    assert torch.isfinite(graph(x)).all()


@compiled_step
def test_compiled_energy_carries_the_compiled_gradient(spec_factory):
    spec = spec_factory("toy", "net.hidden=[4]")
    data, family, _, _ = prepare(spec)
    potential = Potential(family, data, compile=True)
    z = torch.randn(1, potential.coords.dim, requires_grad=True)
    energy = potential.energy(z)  # what Pyro's NUTS differentiates
    (grad,) = torch.autograd.grad(energy.sum(), z)
    assert potential.compiled
    reference_energy, reference_grad = Potential(family, data).value_and_grad(z)
    torch.testing.assert_close(energy.detach(), reference_energy, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(grad, reference_grad, rtol=1e-4, atol=1e-4)


def test_dual_averaging_moves_the_step_size_towards_the_target():
    rejecting, accepting = DualAveraging(0.1, target=0.8), DualAveraging(0.1, target=0.8)
    for _ in range(5):
        low, high = rejecting.update(0.0), accepting.update(1.0)
    assert low < 0.1 < high and rejecting.final < accepting.final
    balanced = DualAveraging(0.1, target=0.8)
    for _ in range(50):
        balanced.update(0.8)  # on target: the step size settles near its start's bias point, 10x the start
    assert balanced.final == pytest.approx(1.0, rel=0.05)
    assert [halton(i) for i in range(1, 5)] == [0.5, 0.25, 0.75, 0.125]


def test_too_many_weights_are_refused_suggesting_svi():
    spec = load_spec(linear_spec("nuts", max_weights=1))
    data, family, guide, _ = prepare(spec)
    with pytest.raises(ZooInputError, match="svi"):
        MCMC().fit(family, guide, data, spec.inference, 0, progress=False)


def test_point_estimated_weights_need_a_fitted_run_to_start_from():
    spec = load_spec({**linear_spec("hmc"), "model": {"family": "rank1"}, "guide": {"name": "mixture"},
                      "prior": {"name": "normal", "loc": 1.0}})
    data, family, guide, _ = prepare(spec)
    with pytest.raises(ZooInputError, match="SVI first"):
        MCMC().fit(family, guide, data, spec.inference, 0, progress=False)


@pytest.mark.parametrize(("kernel", "metric", "warmup", "stop"), [
    ("chees", "diagonal", 6, 8), ("mams", "diagonal", 6, 8),
    ("chees", "low_rank", 12, 4),  # stopped inside a metric window: its draws and gradients are in the checkpoint
], ids=["chees", "mams", "low-rank-mid-window"])
def test_hmc_resumes_exactly_from_a_checkpoint(tmp_path, monkeypatch, kernel, metric, warmup, stop):
    spec = load_spec(linear_spec("hmc", num_chains=4, warmup_steps=warmup, num_samples=6, checkpoint_every=4,
                                 kernel=kernel, metric=metric))
    data, family, guide, _ = prepare(spec)
    saved = record_checkpoints(monkeypatch, mcmc)
    full = MCMC().fit(family, guide, data, spec.inference, 0, run_dir=tmp_path, progress=False)
    at_stop = next(s for s in saved if not s["done"] and s["sampler"]["iteration"] == stop)
    if metric == "low_rank":
        assert len(at_stop["sampler"]["window_grads"]) == len(at_stop["sampler"]["window"]) > 0
    runs.save_torch(tmp_path / SAMPLES_FILE, at_stop)  # as if the run had stopped there
    resumed = MCMC().fit(family, guide, data, spec.inference, 0, run_dir=tmp_path, resume=True, progress=False)
    for name, value in full.draws.items():
        assert torch.equal(resumed.draws[name], value)


def test_an_mcmc_run_directory_round_trips(tmp_path):
    spec = load_spec(linear_spec("nuts", num_chains=2, warmup_steps=20, num_samples=15, predictive_samples=30))
    summary = train(spec, tmp_path / "run", progress=False, echo=None)
    assert (summary.run_dir / SAMPLES_FILE).exists() and math.isfinite(summary.metrics["test_ll"])
    _, _, posterior = load_run(summary.run_dir)
    assert isinstance(posterior, SamplePosterior)
    assert posterior.draws["out.weight"].shape == (30, 1, 1)
    log = (summary.run_dir / "train.log").read_text()
    assert "chain 0:" in log and "chain 1:" in log


@pytest.mark.slow  # NUTS end to end: ~30 s (make test-slow)
def test_zoo_train_ends_an_mcmc_run_with_its_convergence_verdict(tmp_path, capsys):
    from zoo.cli import STRICT_EXIT, main

    converged = tmp_path / "converged.yaml"
    converged.write_text(yaml.safe_dump(linear_spec("hmc", num_chains=32, warmup_steps=150, num_samples=100)))
    assert main(["train", str(converged), "--out", str(tmp_path / "ok"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "converged: function-space R-hat max" in out and "NOT CONVERGED" not in out
    assert (tmp_path / "ok" / "diagnostics.json").is_file() and (tmp_path / "ok" / "posterior.nc").is_file()
    # four chains of ten draws cannot reach ESS 400: the run is kept, but the command says so and exits 3
    short = tmp_path / "short.yaml"
    short.write_text(yaml.safe_dump(linear_spec("hmc", num_chains=4, warmup_steps=10, num_samples=10)))
    assert main(["train", str(short), "--out", str(tmp_path / "short"), "--no-progress"]) == STRICT_EXIT
    out = capsys.readouterr().out
    assert "NOT CONVERGED" in out and "ESS" in out
    assert (tmp_path / "short" / SAMPLES_FILE).is_file() and (tmp_path / "short" / "metrics.json").is_file()


def test_slowest_quarter_period_is_that_of_the_largest_whitened_eigenvalue():
    # draws [n, chains, D] of N(0, S) with S = diag(s) R diag(s): whitened by diag(S), the covariance is R
    torch.manual_seed(0)
    corr = torch.tensor([[1.0, 0.9, 0.0], [0.9, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    scales = torch.tensor([0.1, 3.0, 1.0], dtype=torch.float64)
    cov = scales[:, None] * corr * scales[None, :]
    draws = torch.distributions.MultivariateNormal(torch.zeros(3, dtype=torch.float64), cov).sample((400, 16))
    draws = draws + 5.0 * torch.randn(1, 16, 3, dtype=torch.float64)  # chains centred apart: pooled within-chain
    got = mcmc.slowest_quarter_period(draws, Metric(scales**2))
    assert got == pytest.approx(math.pi / 2 * math.sqrt(1.9), rel=0.05)


@pytest.mark.parametrize("criterion", ["function", "weights"])
@pytest.mark.parametrize("initial_length", [0.2, 8.0])
def test_adapted_trajectory_length_does_not_depend_on_where_it_started(criterion, initial_length):
    # whitened, the conjugate posterior is near N(0, I) (correlation ~0.2): ChEES's optimum is near a quarter turn,
    # pi/2; a start far off either side (a collapsed or a looping trajectory) must not survive the warm-up
    spec = load_spec(linear_spec("hmc", num_chains=32, warmup_steps=100, num_samples=10, step_size=1e-3,
                                 trajectory_length=initial_length, trajectory_criterion=criterion))
    data, family, guide, _ = prepare(spec)
    result = MCMC().fit(family, guide, data, spec.inference, spec.seed, progress=False)
    assert 1.0 < result.settings["trajectory_length"] < 2.5, result.settings


def test_pointwise_rate_is_the_time_derivative_of_the_rows_log_likelihood(spec_factory):
    spec = spec_factory("toy", "likelihood.noise=learned")
    data, family, _, _ = prepare(spec)
    potential = Potential(family, data)
    torch.manual_seed(1)
    z, velocity = torch.randn(3, potential.coords.dim), torch.randn(3, potential.coords.dim)
    value, rate = potential.pointwise(z, velocity)
    assert value.shape == rate.shape == (3, data.n_train)
    torch.testing.assert_close(value, potential.pointwise(z))
    h = 1e-3
    finite = (potential.pointwise(z + h * velocity) - potential.pointwise(z - h * velocity)) / (2 * h)
    torch.testing.assert_close(rate, finite, rtol=2e-2, atol=2e-2)


@pytest.mark.slow
@compiled_step
def test_many_chain_hmc_at_its_defaults_converges_on_the_toy_bnn():
    # the regression the ChEES rework fixed: 64 x (200 + 200) on the 1-50-1 tanh BNN gave R-hat 1.65 before
    # (2.5-3 min on one thread, compiled; every adaptation setting at its default)
    spec = load_spec({"data": {"name": "toy_gap"}, "net": {"hidden": [50], "activation": "tanh"},
                      "likelihood": {"noise": 0.1}, "device": "cpu", "seed": 0,
                      "inference": {"method": "hmc", "num_chains": 64, "warmup_steps": 200, "num_samples": 200,
                                    "compile": True}})
    data, family, guide, _ = prepare(spec)
    result = MCMC().fit(family, guide, data, spec.inference, spec.seed, progress=False)
    x = torch.linspace(-2.0, 2.0, 5).unsqueeze(-1)
    with torch.no_grad():
        f = family.predict(result.flat_draws(), x).loc.reshape(64, 200, -1)
    dataset = az.convert_to_dataset({"f": f.double().numpy()})
    assert float(az.rhat(dataset)["f"].max()) <= 1.01
    assert float(az.ess(dataset)["f"].min()) >= 400
    assert int(result.stats["diverging"].sum()) == 0


# -- adding draws to a finished many-chain HMC run -----------------------------------------------------------------
def test_draws_added_to_a_finished_hmc_run_are_those_it_would_have_drawn_from_the_start(tmp_path):
    short = load_spec(linear_spec("hmc", num_chains=4, warmup_steps=6, num_samples=6))
    longer = load_spec(linear_spec("hmc", num_chains=4, warmup_steps=6, num_samples=12))
    data, family, guide, _ = prepare(short)
    straight = MCMC().fit(family, guide, data, longer.inference, 0, progress=False)
    first = MCMC().fit(family, guide, data, short.inference, 0, run_dir=tmp_path, progress=False)
    grown = MCMC().fit(family, guide, data, longer.inference, 0, run_dir=tmp_path, resume=True, progress=False)
    for name, value in straight.draws.items():
        assert grown.draws[name].shape == (4, 12, *value.shape[2:])
        assert torch.equal(grown.draws[name], value)
        assert torch.equal(grown.draws[name][:, :6], first.draws[name])
    for key, value in straight.stats.items():
        assert torch.equal(grown.stats[key], value)
    assert grown.seconds > first.seconds and grown.settings == straight.settings
    again = MCMC().fit(family, guide, data, longer.inference, 0, run_dir=tmp_path, resume=True, progress=False)
    assert torch.equal(again.draws["out.weight"], grown.draws["out.weight"])  # finished at 12: nothing to add


def test_draws_cannot_be_added_to_a_nuts_run(tmp_path):
    spec = load_spec(linear_spec("nuts", num_chains=1, warmup_steps=10, num_samples=5))
    data, family, guide, _ = prepare(spec)
    MCMC().fit(family, guide, data, spec.inference, 0, run_dir=tmp_path, progress=False)
    more = spec.inference.model_copy(update={"num_samples": 10})
    with pytest.raises(ZooInputError, match="only to a finished many-chain HMC run"):
        MCMC().fit(family, guide, data, more, 0, run_dir=tmp_path, resume=True, progress=False)


def test_a_resume_may_grow_num_samples_of_hmc_only_and_a_smaller_one_continues_the_run_as_grown(tmp_path):
    run = tmp_path / "run"
    train(linear_spec("hmc", num_chains=4, warmup_steps=6, num_samples=6), run, progress=False, echo=None)
    train(linear_spec("hmc", num_chains=4, warmup_steps=6, num_samples=10), run, resume=True, progress=False,
          echo=None)
    assert yaml.safe_load((run / "spec.yaml").read_text())["inference"]["num_samples"] == 10
    train(linear_spec("hmc", num_chains=4, warmup_steps=6, num_samples=6), run, resume=True, progress=False,
          echo=None)  # the first command again: the run stays at 10 draws
    assert runs.load_torch(run / SAMPLES_FILE)["draws"]["out.weight"].shape[:2] == (4, 10)
    with pytest.raises(ZooInputError, match="only inference.num_samples may grow"):
        train(linear_spec("hmc", num_chains=4, warmup_steps=8, num_samples=12), run, resume=True, progress=False,
              echo=None)


def test_a_resume_may_read_the_data_from_another_directory(tmp_path):
    """data.dir says where the data lives (a run grown on another machine reads it from there), not what it is."""
    from tests.test_uci_benchmark import write_folder

    run, here, there = tmp_path / "run", tmp_path / "here", tmp_path / "there"
    shutil.copytree(write_folder(here, "tiny").parent, there)

    def spec(data_dir: Path, num_samples: int) -> dict:
        return {**linear_spec("hmc", num_chains=4, warmup_steps=6, num_samples=num_samples),
                "data": {"name": "uci:tiny", "split": 0, "dir": str(data_dir)}}

    train(spec(here, 6), run, progress=False, echo=None)
    train(spec(there, 8), run, resume=True, progress=False, echo=None)
    saved = yaml.safe_load((run / "spec.yaml").read_text())
    assert saved["data"]["dir"] == str(there) and saved["inference"]["num_samples"] == 8
    assert runs.load_torch(run / SAMPLES_FILE)["draws"]["out.weight"].shape[:2] == (4, 8)


def test_zoo_train_add_draws_until_converged_grows_a_run_round_by_round(tmp_path, capsys, monkeypatch):
    from zoo import posterior_checks as checks
    from zoo.cli import STRICT_EXIT, main

    monkeypatch.setattr(checks, "plot_trace", lambda *args, **kwargs: None)  # 32 chains' plots: 20 s a verdict
    spec = tmp_path / "linear.yaml"
    spec.write_text(yaml.safe_dump(linear_spec("hmc", num_chains=32, warmup_steps=150, num_samples=5)))
    run = str(tmp_path / "run")
    assert main(["train", str(spec), "--out", run, "--no-progress"]) == STRICT_EXIT  # 160 draws: ESS < 400
    # a budget spent at once: the run's verdict (failing), no round, and how far it is
    assert main(["train", str(spec), "--out", run, "--add-draws", "2", "--until-converged", "--budget-minutes",
                 "1e-6", "--no-progress"]) == STRICT_EXIT
    out = capsys.readouterr().out
    assert "sampling to" not in out and "budget is spent: 5 draws per chain so far; about" in out
    assert main(["train", str(spec), "--out", run, "--add-draws", "100", "--until-converged", "--no-progress"]) == 0
    out = capsys.readouterr().out
    grown = yaml.safe_load((tmp_path / "run" / "spec.yaml").read_text())["inference"]["num_samples"]
    assert grown > 5 and (grown - 5) % 100 == 0 and f"sampling to {grown} draws per chain" in out
    assert out.rstrip().splitlines()[-1].startswith("converged")
    # a converged run grows no further: its verdict first, and no round
    assert main(["train", str(spec), "--out", run, "--add-draws", "100", "--until-converged", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"converged at {grown} draws per chain; no draws added" in out and "sampling to" not in out
    assert yaml.safe_load((tmp_path / "run" / "spec.yaml").read_text())["inference"]["num_samples"] == grown
    # the same reference in one command: its first round (the spec's 5 draws), then the same rounds, the same draws
    one = tmp_path / "one"
    assert main(["train", str(spec), "--out", str(one), "--add-draws", "100", "--until-converged",
                 "--no-progress"]) == 0
    assert yaml.safe_load((one / "spec.yaml").read_text())["inference"]["num_samples"] == grown
    assert torch.equal(runs.load_torch(one / SAMPLES_FILE)["draws"]["out.weight"],
                       runs.load_torch(tmp_path / "run" / SAMPLES_FILE)["draws"]["out.weight"])


def test_add_draws_refuses_what_it_cannot_do(tmp_path):
    from zoo.cli import main

    spec = tmp_path / "linear.yaml"
    spec.write_text(yaml.safe_dump(linear_spec("hmc", num_chains=4, warmup_steps=6, num_samples=6)))
    empty = str(tmp_path / "empty")
    assert main(["train", str(spec), "--out", empty, "--add-draws", "5", "--no-progress"]) == 2  # no run there
    assert main(["train", str(spec), "--out", empty, "--until-converged", "--no-progress"]) == 2  # no N
    assert main(["train", str(spec), "--out", empty, "--add-draws", "5", "--budget-minutes", "3",
                 "--no-progress"]) == 2  # a budget bounds --until-converged rounds only
    nuts = tmp_path / "nuts.yaml"  # only the many-chain HMC grows: refused before a first round is sampled
    nuts.write_text(yaml.safe_dump(linear_spec("nuts", num_chains=1, warmup_steps=6, num_samples=6)))
    assert main(["train", str(nuts), "--out", empty, "--add-draws", "5", "--until-converged", "--no-progress"]) == 2
    assert not Path(empty).exists()


def test_the_verdict_names_the_leapfrog_cap_when_it_cut_the_trajectory_chees_settled_on(tmp_path, capsys,
                                                                                         monkeypatch):
    from zoo import posterior_checks as checks
    from zoo.cli import STRICT_EXIT, main

    monkeypatch.setattr(checks, "plot_trace", lambda *args, **kwargs: None)
    spec = tmp_path / "capped.yaml"  # one step per draw: below the two that ChEES settles on for this posterior
    spec.write_text(yaml.safe_dump(linear_spec("hmc", num_chains=4, warmup_steps=60, num_samples=10,
                                               max_leapfrog_steps=1)))
    assert main(["train", str(spec), "--out", str(tmp_path / "run"), "--no-progress"]) == STRICT_EXIT
    verdict = capsys.readouterr().out.rstrip().splitlines()[-1]
    settings = runs.load_torch(tmp_path / "run" / SAMPLES_FILE)["settings"]
    wanted = math.ceil(settings["chees_trajectory_length"] / settings["step_size"])
    assert wanted > 1 and settings["trajectory_length"] <= settings["step_size"] * (1 + 1e-9)
    assert settings["warmup_gradients"] == 60  # what warm-up cost each chain: one step, one gradient, per draw
    assert verdict.startswith("NOT CONVERGED") and f"set inference.max_leapfrog_steps={wanted}" in verdict
    assert "metric modified along" not in verdict  # a diagonal metric has no directions to name
    # under a richer metric the verdict also says how many directions it modified, and by how much
    spec.write_text(yaml.safe_dump(linear_spec("hmc", num_chains=4, warmup_steps=60, num_samples=10,
                                               max_leapfrog_steps=1, metric="dense")))
    assert main(["train", str(spec), "--out", str(tmp_path / "dense"), "--no-progress"]) == STRICT_EXIT
    verdict = capsys.readouterr().out.rstrip().splitlines()[-1]
    settings = runs.load_torch(tmp_path / "dense" / SAMPLES_FILE)["settings"]
    directions = int(settings["metric_directions"])
    assert directions >= 1 and f"under a dense metric modified along {directions} direction" in verdict
    # uncapped, the same warm-up says nothing of the cap
    spec.write_text(yaml.safe_dump(linear_spec("hmc", num_chains=4, warmup_steps=60, num_samples=10)))
    main(["train", str(spec), "--out", str(tmp_path / "free"), "--no-progress"])
    assert "max_leapfrog_steps" not in capsys.readouterr().out


# -- MAMS: the isokinetic kernel -----------------------------------------------------------------------------------
def unit_rows(*shape: int, seed: int = 0) -> torch.Tensor:
    rows = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return rows / rows.norm(dim=-1, keepdim=True)


def test_esh_velocity_update_is_the_exact_flow_under_a_constant_score():
    velocity, score = unit_rows(5, 7), 3.0 * torch.randn(5, 7, generator=torch.Generator().manual_seed(1),
                                                          dtype=torch.float64)
    turned, change = mcmc.esh_velocity_update(velocity, score, 0.3)
    torch.testing.assert_close(turned.norm(dim=-1), torch.ones(5, dtype=torch.float64))  # unit speed kept
    # a flow: two updates of 0.1 and 0.2 are one of 0.3, their kinetic energy changes adding up
    half, first = mcmc.esh_velocity_update(velocity, score, 0.1)
    whole, second = mcmc.esh_velocity_update(half, score, 0.2)
    torch.testing.assert_close(whole, turned)
    torch.testing.assert_close(first + second, change)
    # along the score the velocity stays put and the kinetic energy falls by step |score| (the potential's own
    # change along a unit-speed move): (D - 1)(delta - log 2 + log 2) = step |score|; against it, it rises as much
    direction = score / score.norm(dim=-1, keepdim=True)
    for sign in (1.0, -1.0):
        still, moved = mcmc.esh_velocity_update(sign * direction, score, 0.3)
        torch.testing.assert_close(still, sign * direction)
        torch.testing.assert_close(moved, sign * 0.3 * score.norm(dim=-1))
    # no time, no change
    same, none = mcmc.esh_velocity_update(velocity, score, 0.0)
    torch.testing.assert_close(same, velocity)
    torch.testing.assert_close(none, torch.zeros(5, dtype=torch.float64))


def sampler_in_the_bulk(kernel: str = "mams", integrator: str = "leapfrog", step_size: float = 0.05,
                        low_rank: bool = False) -> mcmc.ManyChainHMC:
    """The many-chain sampler on the conjugate model, three chains in its posterior's bulk, under a metric near (not
    equal to) its variances. (Far out in the tails a D = 2 target's score, over D - 1 = 1, turns MAMS's velocity
    almost completely within a step: exact, but so contracting a map that its inverse amplifies rounding error by
    ~e^(step |score|).)"""
    spec = load_spec(linear_spec("hmc", num_chains=3, kernel=kernel, integrator=integrator, step_size=step_size))
    data, family, _, _ = prepare(spec)
    potential = Potential(family, data)
    mean, cov = closed_form(data, NOISE / data.y_std)
    z0 = mean + cov.diagonal().sqrt() * torch.randn(3, 2, generator=torch.Generator().manual_seed(2),
                                                    dtype=torch.float64)
    sampler = mcmc.ManyChainHMC(potential, z0, spec.inference, torch.Generator().manual_seed(0))
    sampler.metric = Metric(cov.diagonal() * torch.tensor([0.5, 2.0], dtype=torch.float64))  # whitening is exercised
    if low_rank:  # and a direction along which the metric is not the diagonal
        sampler.metric = Metric(sampler.metric.variance, torch.tensor([[0.6], [0.8]], dtype=torch.float64),
                                torch.tensor([3.0], dtype=torch.float64))
    return sampler


def energy_error(sampler: mcmc.ManyChainHMC, velocity: torch.Tensor, steps: int) -> torch.Tensor:
    """The Metropolis test's energy error of one trajectory (MAMS: potential plus kinetic change; HMC: H)."""
    z, v, energy, _, kinetic = sampler.integrate(sampler.z, velocity, sampler.grad, steps)
    if sampler.spec.kernel == "mams":
        return energy + kinetic - sampler.energy
    hamiltonian = lambda u, p: u + 0.5 * (p**2).sum(-1)  # noqa: E731 - the velocity is the whitened momentum
    return hamiltonian(energy, v) - hamiltonian(sampler.energy, velocity)


def start_velocity(sampler: mcmc.ManyChainHMC) -> torch.Tensor:
    noise = torch.randn(3, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    if sampler.spec.kernel == "mams":
        return noise / noise.norm(dim=-1, keepdim=True)
    return noise


@pytest.mark.parametrize("low_rank", [False, True], ids=["diagonal", "low-rank"])
@pytest.mark.parametrize("integrator", ["leapfrog", "mclachlan"])
@pytest.mark.parametrize("kernel", ["chees", "mams"])
def test_trajectories_are_reversible_and_their_energy_error_shrinks_as_the_step_squared(kernel, integrator, low_rank):
    sampler = sampler_in_the_bulk(kernel, integrator, low_rank=low_rank)
    velocity = start_velocity(sampler)
    z, v, _, grad, kinetic = sampler.integrate(sampler.z, velocity, sampler.grad, 20)
    back, v_back, _, _, kinetic_back = sampler.integrate(z, -v, grad, 20)
    torch.testing.assert_close(back, sampler.z)  # flip the velocity and the trajectory retraces itself ...
    torch.testing.assert_close(-v_back, velocity)
    torch.testing.assert_close(torch.as_tensor(kinetic_back), -torch.as_tensor(kinetic))  # ... undoing its change
    time = 0.8 * sampler.time_scale  # a fixed integration time, at two step sizes
    sampler.step_size = time / 20
    coarse = energy_error(sampler, velocity, 20).abs()
    sampler.step_size = time / 40
    fine = energy_error(sampler, velocity, 40).abs()
    assert bool((coarse > 1e-9).all())  # a real error to compare
    torch.testing.assert_close(coarse / fine, torch.full_like(coarse, 4.0), rtol=0.2, atol=0.0)  # second order


@pytest.mark.parametrize("kernel", ["chees", "mams"])
def test_mclachlan_has_a_smaller_energy_error_than_leapfrog_per_gradient(kernel):
    errors = {}
    for integrator, steps in (("leapfrog", 40), ("mclachlan", 20)):  # 40 gradients each, the same time
        sampler = sampler_in_the_bulk(kernel, integrator)
        sampler.step_size = 0.8 * sampler.time_scale / steps
        errors[integrator] = energy_error(sampler, start_velocity(sampler), steps).abs()
    assert bool((errors["mclachlan"] < errors["leapfrog"] / 2).all()), errors


def test_mams_starts_from_hmc_scaled_settings_and_aims_at_its_own_acceptance():
    sampler = sampler_in_the_bulk("mams", step_size=0.05)
    assert sampler.step_size == pytest.approx(0.05 * math.sqrt(2))  # unit speed: sqrt(D) times HMC's time
    assert sampler.spec.target_accept_prob == mcmc.MAMS_TARGET_ACCEPT == 0.9
    assert load_spec(linear_spec("hmc", kernel="mams", target_accept_prob=0.7)).inference.target_accept_prob == 0.7
    assert load_spec(linear_spec("hmc")).inference.target_accept_prob == 0.8
    with pytest.raises(ZooInputError, match="kernel 'mams' is an option of the many-chain method 'hmc'"):
        load_spec(linear_spec("nuts", kernel="mams"))
    with pytest.raises(ZooInputError, match="integrator 'mclachlan' is an option of the many-chain method 'hmc'"):
        load_spec(linear_spec("nuts", integrator="mclachlan"))
    assert load_spec(linear_spec("nuts", kernel="chees")).inference.kernel == "chees"  # a default is no error



class Funnel:
    """The potential of Neal's funnel in 2-D: v ~ N(0, 3^2), x | v ~ N(0, e^v). Far down its neck (v = -16) the
    x-gradient is ~1e7, so a step the chains in the bulk accept diverges on every trajectory there."""

    def __init__(self) -> None:
        self.evaluations = 0

    def value_and_grad(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.evaluations += 1
        v, x = z[..., 0], z[..., 1]
        value = v**2 / 18 + 0.5 * x**2 * torch.exp(-v) + 0.5 * v
        return value, torch.stack([v / 9 - 0.5 * x**2 * torch.exp(-v) + 0.5, x * torch.exp(-v)], -1)


def funnel_sampler(z0: torch.Tensor, warmup_steps: int, lines: list[str]) -> mcmc.ManyChainHMC:
    spec = load_spec(linear_spec("hmc", num_chains=len(z0), warmup_steps=warmup_steps, num_samples=10,
                                 trajectory_criterion="weights"))
    return mcmc.ManyChainHMC(Funnel(), z0, spec.inference, torch.Generator().manual_seed(0), log=lines.append)


def test_a_chain_stuck_at_its_start_restarts_at_a_moving_chain_after_the_initial_buffer():
    z0 = 0.5 * torch.randn(8, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    z0[5] = torch.tensor([-16.0, 3.0], dtype=torch.float64)  # potential ~4e7: the concrete run's stuck chain
    lines: list[str] = []
    sampler = funnel_sampler(z0, warmup_steps=100, lines=lines)
    buffer = math.floor(mcmc.METRIC_BUFFER * 100)
    for _ in range(buffer - 1):
        sampler.step(warmup=True)
    assert torch.equal(sampler.z[5], z0[5]) and int(sampler.moves[5]) == 0  # stuck: every proposal rejected
    assert (sampler.moves[torch.arange(8) != 5] > 0).all()
    counts = sampler.state_dict()["moves"]  # the count is checkpointed with the chains while the buffer lasts
    assert counts.shape == (8,) and int(counts[5]) == 0
    sampler.step(warmup=True)  # the buffer's last iteration
    assert any(torch.equal(sampler.z[5], sampler.z[c]) for c in range(8) if c != 5)
    assert float(sampler.energy[5]) < 100 and torch.isfinite(sampler.grad[5]).all()
    assert len(lines) == 1 and "chain(s) 5 accepted no proposal in the first 15 iterations" in lines[0], lines
    assert sampler.moves is None  # counted in the buffer only
    positions = []
    for _ in range(30):  # and from there it moves as the others do
        sampler.step(warmup=True)
        positions.append(sampler.z[5].clone())
    assert len({tuple(z.tolist()) for z in positions}) > 10


def test_chains_still_far_above_the_lowest_at_the_end_of_warm_up_are_named_before_sampling():
    """A chain whose potential ends warm-up more than 10 x D above the lowest chain's (kin8nm from prior draws) is named
    in a log line with the fix; healthy chains, whose potentials differ by a few nats, get no line."""
    z0 = 0.5 * torch.randn(8, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    lines: list[str] = []
    sampler = funnel_sampler(z0, warmup_steps=20, lines=lines)
    for _ in range(20):
        sampler.step(warmup=True)
    assert sampler.iteration == 20 and lines == []  # the end of warm-up passed: nothing to say
    dim = sampler.z.shape[-1]
    sampler.energy = sampler.energy.clone()
    lowest = int(sampler.energy.argmin())
    far, near = [c for c in range(8) if c != lowest][:2]
    sampler.energy[far] = sampler.energy[lowest] + 30 * dim
    sampler.energy[near] = sampler.energy[lowest] + 5 * dim
    sampler._warn_far_chains()
    assert len(lines) == 1 and lines[0].startswith(f"warm-up ended with chain(s) {far} at potential"), lines
    assert f"above chain {lowest}'s" in lines[0] and "inference.init" in lines[0]


def test_no_chain_is_restarted_when_all_move_or_the_buffer_is_too_short_to_tell():
    z0 = 0.5 * torch.randn(8, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    lines: list[str] = []
    sampler = funnel_sampler(z0, warmup_steps=100, lines=lines)
    for _ in range(20):
        sampler.step(warmup=True)
    assert lines == []
    z0[5] = torch.tensor([-16.0, 3.0], dtype=torch.float64)
    short = funnel_sampler(z0, warmup_steps=40, lines=lines)  # a 6-iteration buffer
    for _ in range(10):
        short.step(warmup=True)
    assert lines == [] and torch.equal(short.z[5], z0[5])
