"""SG-MCMC (SGLD, SGHMC) and SWAG/MultiSWAG: the minibatch potential, the samplers on the conjugate model, the SWAG
moments and draws against their definitions, exact resumes, run directories and the refusals."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.conftest import record_checkpoints
from tests.test_mcmc import NOISE, assert_matches_conjugate, closed_form, linear_spec
from zoo import runs
from zoo.errors import TrainingDiverged, ZooInputError
from zoo.inference import loop, sgmcmc, swag
from zoo.inference.draws import SAMPLES_FILE
from zoo.inference.potential import Coordinates, MinibatchPotential, initial_points
from zoo.inference.sgmcmc import (
    PRECONDITIONER_FLOOR,
    SGMCMC,
    inverse_mass,
    kept_steps,
    step_size,
    stray_chains,
)
from zoo.inference.swag import SWAG, SWAG_FILE, SWAGPosterior
from zoo.pipeline import load_run, prepare, train
from zoo.posterior import ChainPosterior
from zoo.spec import load_spec


def _largest_curvature(data) -> float:
    """The largest eigenvalue of the conjugate posterior's precision (standardised units): the stiffest direction."""
    _, cov = closed_form(data, NOISE / data.y_std)
    return float(1.0 / torch.linalg.eigvalsh(cov).min())


def test_minibatch_potentials_average_to_the_full_data_potential():
    # over minibatches that partition the rows, the N/B-weighted likelihood terms average to the full-data term
    spec = load_spec(linear_spec("sgld", batch_size=10))
    data, family, _, _ = prepare(spec)
    potential = MinibatchPotential(family, data)
    z = torch.randn(3, potential.coords.dim, dtype=torch.float64)
    full_value, full_grad = potential.value_and_grad(z, None)
    parts = [potential.value_and_grad(z, rows) for rows in torch.arange(data.n_train).split(10)]
    torch.testing.assert_close(sum(v for v, _ in parts) / len(parts), full_value)
    torch.testing.assert_close(sum(g for _, g in parts) / len(parts), full_grad)
    # and the full-data potential is the model's own negative log joint (a Gaussian linear model: no Jacobian)
    values, _ = potential.coords.unpack(z)
    torch.testing.assert_close(full_value, -potential.log_joint.exact(values))


@pytest.mark.parametrize(("method", "stiffness"), [("sgld", 0.02), ("sghmc", 0.002)])
def test_sgmcmc_recovers_the_conjugate_linear_regression_posterior(method, stiffness):
    # full batch, constant lr: the discretisation bias is O(eps * curvature), set here to `stiffness`
    probe = load_spec(linear_spec(method))
    data, _, _, _ = prepare(probe)
    lr = stiffness * data.n_train / _largest_curvature(data)
    spec = load_spec(linear_spec(method, num_chains=16, epochs=4000, batch_size=None, lr=lr, schedule="constant",
                                 burn_in_epochs=1000, thin=20))
    data, family, guide, _ = prepare(spec)
    assert_matches_conjugate(SGMCMC().fit(family, guide, data, spec.inference, spec.seed, progress=False), data)


@pytest.mark.parametrize("kind", ["rmsprop", "scale_adapted"])
@pytest.mark.parametrize("method", ["sgld", "sghmc"])
def test_preconditioned_sgmcmc_recovers_the_conjugate_posterior_with_its_metric_frozen_after_burn_in(
        method, kind, tmp_path, monkeypatch):
    probe = load_spec(linear_spec(method))
    data, _, _, _ = prepare(probe)
    curvature = _largest_curvature(data)
    # rmsprop: G is below 2 here, so the step on U is lr / N as unpreconditioned, and lr * curvature / N the bias;
    # scale_adapted: G is about N / sqrt(curvature) at stationarity (per-row gradients of sqrt(curvature) / N), so the
    # bias is lr * sqrt(curvature), set larger for SGLD (at 0.02 its 1,000 burn-in steps do not reach the posterior)
    if kind == "rmsprop":
        lr = (0.02 if method == "sgld" else 0.002) * data.n_train / curvature
    else:
        lr = (0.1 if method == "sgld" else 0.01) / math.sqrt(curvature)
    spec = load_spec(linear_spec(method, num_chains=16, epochs=4000, batch_size=None, lr=lr, schedule="constant",
                                 burn_in_epochs=1000, thin=20, preconditioner=kind, checkpoint_every=500))
    data, family, guide, _ = prepare(spec)
    saved, final = record_checkpoints(monkeypatch, loop), record_checkpoints(monkeypatch, sgmcmc)
    assert_matches_conjugate(SGMCMC().fit(family, guide, data, spec.inference, spec.seed, run_dir=tmp_path,
                                        progress=False), data)
    during = [c["inverse_mass"] for c in saved if c["step"] < 1000]
    after = [c["inverse_mass"] for c in saved if c["step"] >= 1000] + [final[-1]["inverse_mass"]]
    assert not torch.equal(during[0], after[0])  # adapted during burn-in
    assert all(torch.equal(g, after[0]) for g in after)  # then frozen
    if kind == "rmsprop":
        torch.testing.assert_close(after[0].mean(-1), torch.ones(16, dtype=torch.float64))
    assert not torch.equal(after[0], torch.ones_like(after[0]))


def test_the_scale_adapted_metric_follows_the_potential_in_every_exploration_phase_and_is_frozen_while_sampling(
        tmp_path, monkeypatch):
    # cyclical, 4 cycles of 100 steps (full batch: one step an epoch): exploration at steps 0-49 of each, draws after.
    # After the first sampling phase, G is also bounded by the average of the noisy steps' squared gradients: an
    # exploration phase's gradients vanish as SGD converges, and a G taken from them alone diverged at the first
    # noisy steps after it (the toy, full batch)
    spec = load_spec(linear_spec("sghmc", num_chains=2, epochs=400, batch_size=None, lr=0.01, cycles=4,
                                 exploration=0.5, burn_in_epochs=0, thin=5, preconditioner="scale_adapted",
                                 checkpoint_every=10))
    data, family, guide, _ = prepare(spec)
    saved = record_checkpoints(monkeypatch, loop)
    SGMCMC().fit(family, guide, data, spec.inference, 0, run_dir=tmp_path, progress=False)
    by_step = {c["step"]: c["inverse_mass"] for c in saved if not c["done"]}
    frozen = []
    for start in range(0, 400, 100):
        sampling = [by_step[t] for t in range(start + 50, start + 100, 10)]
        assert all(torch.equal(g, sampling[0]) for g in sampling)  # frozen while draws are kept
        assert not torch.equal(by_step[start + 10], by_step[start + 40])  # adapting while it explores
        frozen.append(sampling[0])
        if start:  # bounded by the noisy steps' average so far
            state = next(c for c in saved if c["step"] == start + 40)
            bound = inverse_mass(state["noisy_square"], state["noisy_steps"], 0.99, "scale_adapted")
            assert state["noisy_steps"] == 50 * (start // 100)  # the sampling halves of the cycles before
            assert (state["inverse_mass"] <= bound * (1 + 1e-12)).all()
    assert all(not torch.equal(a, b) for a, b in zip(frozen, frozen[1:], strict=False))  # re-estimated every cycle


def test_the_scale_adapted_metric_scales_with_the_potential_and_rmsprop_keeps_its_mean():
    # a potential c times larger has c times larger gradients: scale_adapted's G shrinks by c, so a step of lr stays
    # a step of lr; rmsprop's G is the same (mean 1), so a step on U grows c times
    square = torch.tensor([[1.0, 4.0, 16.0]], dtype=torch.float64)
    for c in (10.0, 1e3):
        torch.testing.assert_close(inverse_mass(square * c**2, 1, 0.9, "scale_adapted"),
                                   inverse_mass(square, 1, 0.9, "scale_adapted") / c)
        torch.testing.assert_close(inverse_mass(square * c**2, 1, 0.9), inverse_mass(square, 1, 0.9))
    roots = (square / (1 - 0.9)).sqrt()
    torch.testing.assert_close(inverse_mass(square, 1, 0.9, "scale_adapted"),
                               1 / (roots + PRECONDITIONER_FLOOR["scale_adapted"] * roots.mean(-1, keepdim=True)))


def test_the_inverse_mass_is_one_over_the_root_mean_square_gradient_rescaled_to_mean_one():
    square = torch.tensor([[1.0, 4.0, 16.0], [9.0, 9.0, 9.0]], dtype=torch.float64) * (1 - 0.9)  # one step of 0.9
    got = inverse_mass(square, steps=1, decay=0.9)
    roots = torch.tensor([[1.0, 2.0, 4.0], [3.0, 3.0, 3.0]], dtype=torch.float64)
    want = 1 / (roots + PRECONDITIONER_FLOOR["rmsprop"] * roots.mean(-1, keepdim=True))
    torch.testing.assert_close(got, want / want.mean(-1, keepdim=True))
    torch.testing.assert_close(got[1], torch.ones(3, dtype=torch.float64))  # equal gradients: no preconditioning
    assert got[0, 0] > got[0, 1] > got[0, 2]  # the stiffer (larger-gradient) coordinate takes the smaller step


def test_a_preconditioner_without_burn_in_is_refused():
    with pytest.raises(Exception, match="the rmsprop preconditioner is estimated during burn-in"):
        load_spec(linear_spec("sghmc", preconditioner="rmsprop", burn_in_epochs=0))
    with pytest.raises(Exception, match="the scale_adapted preconditioner is estimated during burn-in"):
        load_spec(linear_spec("sgld", preconditioner="scale_adapted", burn_in_epochs=0))  # polynomial: no exploration
    # a cyclical schedule's exploration phases estimate it
    load_spec(linear_spec("sghmc", preconditioner="scale_adapted", burn_in_epochs=0))


def test_cyclical_schedule_explores_then_samples_in_every_cycle():
    spec = load_spec(linear_spec("sghmc", lr=0.5, cycles=4, exploration=0.5, burn_in_epochs=0, thin=1))
    total = 400
    lrs, sampling = zip(*(step_size(spec.inference, t, total) for t in range(total)), strict=True)
    assert lrs[0] == pytest.approx(0.5) and lrs[99] == pytest.approx(0.0, abs=1e-3) and lrs[100] == pytest.approx(0.5)
    assert all(a >= b for a, b in zip(lrs[:100], lrs[1:100], strict=False))  # a cosine down within a cycle
    assert sampling[:50] == (False,) * 50 and sampling[50:100] == (True,) * 50
    assert kept_steps(spec.inference, total, per_epoch=1) == [t for t in range(total) if t % 100 >= 50]


def test_cyclical_sghmc_with_the_scale_adapted_metric_resumes_exactly(tmp_path, monkeypatch):
    # the checkpoint at step 140 falls in the second cycle's exploration, where G is capped by the noisy average
    spec = load_spec(linear_spec("sghmc", num_chains=2, epochs=300, batch_size=10, lr=0.01, cycles=3,
                                 burn_in_epochs=0, thin=7, checkpoint_every=35, preconditioner="scale_adapted"))
    data, family, guide, _ = prepare(spec)
    saved = record_checkpoints(monkeypatch, loop)
    full = SGMCMC().fit(family, guide, data, spec.inference, 0, run_dir=tmp_path, progress=False)
    at = next(s for s in saved if not s["done"] and s["step"] == 140 * 4)
    runs.save_torch(tmp_path / SAMPLES_FILE, at)  # as if the run had stopped there
    resumed = SGMCMC().fit(family, guide, data, spec.inference, 0, run_dir=tmp_path, resume=True, progress=False)
    for name, value in full.draws.items():
        assert torch.equal(resumed.draws[name], value)


@pytest.mark.parametrize("preconditioner", ["none", "rmsprop", "scale_adapted"])
def test_sgld_resumes_exactly_from_a_checkpoint(tmp_path, monkeypatch, preconditioner):
    # burn-in (the preconditioner's estimation; without one, the exploring Adam steps) runs to step 100, past the
    # checkpoint at step 80
    spec = load_spec(linear_spec("sgld", num_chains=3, epochs=30, batch_size=10, lr=0.01, burn_in_epochs=25, thin=7,
                                 checkpoint_every=40, preconditioner=preconditioner))
    data, family, guide, _ = prepare(spec)
    saved = record_checkpoints(monkeypatch, loop)
    full = SGMCMC().fit(family, guide, data, spec.inference, 0, run_dir=tmp_path, progress=False)
    at_80 = next(s for s in saved if not s["done"] and s["step"] == 80)
    runs.save_torch(tmp_path / SAMPLES_FILE, at_80)  # as if the run had stopped after step 80
    resumed = SGMCMC().fit(family, guide, data, spec.inference, 0, run_dir=tmp_path, resume=True, progress=False)
    for name, value in full.draws.items():
        assert torch.equal(resumed.draws[name], value)


def test_a_diverging_step_size_stops_with_the_step_and_the_last_good_draw(tmp_path):
    # one chain: nothing to stray from, so it is the non-finite check that stops it
    spec = load_spec(linear_spec("sgld", num_chains=1, epochs=400, batch_size=None, lr=1.0, schedule="constant",
                                 burn_in_epochs=0, thin=1))
    data, family, guide, _ = prepare(spec)
    spec.inference.lr = 20 * data.n_train / _largest_curvature(data)  # 10x past SGLD's stability limit (2)
    with pytest.raises(TrainingDiverged, match=r"sgld diverged at step \d+ .*the last good draw is the draw of step "
                       r"\d+, kept in .*samples.pt.*Lower inference.lr"):
        SGMCMC().fit(family, guide, data, spec.inference, 0, run_dir=tmp_path, progress=False)
    kept = runs.load_torch(tmp_path / SAMPLES_FILE)
    assert not kept["done"] and kept["draws"] and all(torch.isfinite(d[0]).all() for d in kept["draws"])


def test_stray_chains_are_those_more_than_five_nats_per_row_above_the_best():
    energy = torch.tensor([100.0, 100.0 + 5 * 40 - 1, 100.0 + 5 * 40 + 1, 250.0])
    assert stray_chains(energy, rows=40) == [2]
    assert stray_chains(energy, rows=40, temperature=0.5) == []  # U holds the likelihood / T: the bar is 5 N / T
    assert stray_chains(torch.tensor([1e9]), rows=40) == []       # one chain: nothing to compare with


@pytest.mark.parametrize("method", ["sgld", "sghmc"])
def test_a_chain_that_strays_from_the_others_stops_the_run_naming_it(method, tmp_path, monkeypatch):
    """A chain far from the others (here started 1,000 posterior sd away at a step size too small to come back)
    stops the run at its third kept draw, naming it, and leaves an unfinished checkpoint; the same run without it
    passes."""
    spec = load_spec(linear_spec(method, num_chains=3, epochs=20, batch_size=10, lr=1e-6, schedule="constant",
                                 burn_in_epochs=1, thin=2))
    data, family, guide, _ = prepare(spec)
    SGMCMC().fit(family, guide, data, spec.inference, 0, progress=False)  # no stray: draws as usual
    real = sgmcmc.initial_points

    def one_far(*args, **kwargs):
        z = real(*args, **kwargs)
        z[1] += 1000.0 * closed_form(data, NOISE / data.y_std)[1].diagonal().sqrt()
        return z

    monkeypatch.setattr(sgmcmc, "initial_points", one_far)
    with pytest.raises(TrainingDiverged, match=rf"{method} chain\(s\) 1 strayed from the others by step \d+ .*more "
                       r"than 5 per training row \(40 rows\).*Lower inference.lr"):
        SGMCMC().fit(family, guide, data, spec.inference, 0, run_dir=tmp_path, progress=False)
    assert not runs.load_torch(tmp_path / SAMPLES_FILE)["done"]


@pytest.mark.parametrize(("spiked_steps", "stops"), [(2, False), (3, True)])
def test_only_a_run_of_stray_draws_stops_the_run(spiked_steps, stops, monkeypatch):
    """One chain's potential is lifted 1e6 nats for 2 or 3 kept draws in a row: a spike (minibatch noise, an SGLD
    jump) is tolerated, a run of STRAY_DRAWS = 3 is not."""
    spec = load_spec(linear_spec("sgld", num_chains=3, epochs=10, batch_size=10, lr=1e-3, schedule="constant",
                                 burn_in_epochs=1, thin=1))
    data, family, guide, _ = prepare(spec)
    real, calls = MinibatchPotential.update, []

    def lifted(self, z, rows, move, *state, **settings):  # every step's update (value_and_grad's too)
        energy, *rest = real(self, z, rows, move, *state, **settings)
        calls.append(None)
        if 10 <= len(calls) - 1 < 10 + spiked_steps:  # steps 10.. (all kept: burn-in is steps 0-3, thin 1)
            energy = energy + torch.tensor([0.0, 1e6, 0.0], dtype=energy.dtype)
        return energy, *rest

    monkeypatch.setattr(MinibatchPotential, "update", lifted)
    if stops:
        with pytest.raises(TrainingDiverged, match=r"chain\(s\) 1 strayed from the others by step 12 .*at 3 kept "
                           r"draws in a row"):
            SGMCMC().fit(family, guide, data, spec.inference, 0, progress=False)
    else:
        result = SGMCMC().fit(family, guide, data, spec.inference, 0, progress=False)
        assert result.draws["out.weight"].shape[:2] == (3, 36)


def test_an_sgld_run_directory_round_trips_and_is_diagnosed_like_mcmc(tmp_path):
    spec = load_spec(linear_spec("sgld", num_chains=2, epochs=60, batch_size=10, lr=0.01, burn_in_epochs=10,
                                 thin=5, predictive_samples=40))
    summary = train(spec, tmp_path / "run", progress=False, echo=None)
    assert summary.chains and math.isfinite(summary.metrics["test_ll"])
    _, _, posterior = load_run(summary.run_dir)
    assert isinstance(posterior, ChainPosterior)
    assert posterior.chains["out.weight"].shape == (2, 40, 1, 1)  # 50 sampling epochs x 4 steps / 5
    from zoo.diagnostics import diagnose

    report = diagnose(summary.run_dir, plots=False)
    assert report["draws"] == "mcmc" and "function_space" in report


@pytest.mark.parametrize("strict", [False, True])
def test_sgmcmc_verdict_is_a_warning_with_per_chain_figures_unless_strict(tmp_path, capsys, strict):
    """SG-MCMC chains are no exact sampler's: the exact-sampler checks they miss (2 chains x 40 draws: ESS far
    below 400) end zoo train with a warning and exit 0, or exit 3 under --strict; the per-chain table is printed."""
    import yaml

    from zoo.cli import STRICT_EXIT, main

    spec = tmp_path / "sgld.yaml"
    spec.write_text(yaml.safe_dump(linear_spec("sgld", num_chains=2, epochs=60, batch_size=10, lr=0.01,
                                               burn_in_epochs=10, thin=5, predictive_samples=40)))
    code = main(["train", str(spec), "--out", str(tmp_path / "run"), "--no-progress", *(["--strict"] * strict)])
    out = " ".join(capsys.readouterr().out.split())
    assert code == (STRICT_EXIT if strict else 0)
    assert "warning: function-space R-hat max" in out and "without a Metropolis correction" in out
    assert "NOT CONVERGED" not in out and "per chain (f_test shift" in out
    saved = json.loads((tmp_path / "run" / "diagnostics.json").read_text())
    assert saved["exact_sampler"] is False and [c["chain"] for c in saved["per_chain"]] == [0, 1]
    assert all(c["f_test_max_shift_sd"] >= 0 and c["lp_ess_bulk"] > 0 for c in saved["per_chain"])


# ------------------------------------------------------------------------------------------------ SWAG
def test_swag_moments_follow_their_definitions():
    torch.manual_seed(0)
    iterates = torch.randn(7, 2, 5, dtype=torch.float64)  # 7 collections of K=2 models' 5 coordinates
    moments = {"mean": torch.zeros(2, 5, dtype=torch.float64), "sq_mean": torch.zeros(2, 5, dtype=torch.float64),
               "deviations": torch.zeros(2, 3, 5, dtype=torch.float64)}
    for i, z in enumerate(iterates):
        swag._collect(moments, z, i, rank=3)
    torch.testing.assert_close(moments["mean"], iterates.mean(0))
    torch.testing.assert_close(moments["sq_mean"], (iterates**2).mean(0))
    # the last rank=3 deviations, each from the running mean just after its iterate was added
    running = [iterates[: i + 1].mean(0) for i in range(7)]
    for i in (4, 5, 6):
        torch.testing.assert_close(moments["deviations"][:, i % 3], iterates[i] - running[i])


def test_swag_draws_have_the_swag_covariance():
    # Cov = diag(sq_mean - mean^2) / 2 + D^T D / (2 (R - 1)) for one model, in the unconstrained coordinates
    spec = load_spec(linear_spec("swag", rank=3))
    _, family, _, _ = prepare(spec)
    mean = torch.tensor([[0.3, -1.0]], dtype=torch.float64)
    variance = torch.tensor([[0.5, 0.2]], dtype=torch.float64)
    deviations = torch.tensor([[[1.0, 0.5], [-0.4, 0.2], [0.1, -0.3]]], dtype=torch.float64)
    posterior = SWAGPosterior(family, {"mean": mean, "sq_mean": variance + mean**2, "deviations": deviations})
    draws = posterior.sample(200_000, generator=torch.Generator().manual_seed(0))
    flat = torch.stack([draws["out.weight"].reshape(-1), draws["out.bias"].reshape(-1)], dim=1)
    want = torch.diag(variance[0]) / 2 + deviations[0].T @ deviations[0] / (2 * 2)
    torch.testing.assert_close(flat.mean(0), mean[0], atol=0.01, rtol=0.0)
    torch.testing.assert_close(torch.cov(flat.T), want, atol=0.01, rtol=0.0)


def test_multiswag_fits_k_models_that_resume_exactly(tmp_path, monkeypatch):
    spec = load_spec(linear_spec("swag", num_models=3, epochs=10, pretrain_epochs=5, batch_size=10, lr=0.01,
                                 pretrain_lr=0.02, rank=4, checkpoint_every=20))
    data, family, guide, _ = prepare(spec)
    saved = record_checkpoints(monkeypatch, loop)
    full = SWAG().fit(family, guide, data, spec.inference, 0, run_dir=tmp_path, progress=False)
    assert full.posterior.mean.shape == (3, 2) and full.posterior.deviations.shape == (3, 4, 2)
    assert not torch.allclose(full.posterior.mean[0], full.posterior.mean[1])  # independent starts
    at_40 = next(s for s in saved if not s["done"] and s["step"] == 40)
    runs.save_torch(tmp_path / SWAG_FILE, at_40)
    resumed = SWAG().fit(family, guide, data, spec.inference, 0, run_dir=tmp_path, resume=True, progress=False)
    for key in ("mean", "sq_mean", "deviations"):
        assert torch.equal(getattr(resumed.posterior, key), getattr(full.posterior, key))


def test_swag_pretrains_by_adam_when_asked_then_collects_by_sgd_and_resumes_exactly(tmp_path, monkeypatch):
    """pretrain_by: adam climbs to the mode by Adam (the zoo's MAP fit) at a third of the collecting lr, then collects
    by SGD from rest; Adam's moments are checkpointed, so a run stopped mid-pretraining resumes exactly. (Left null,
    pretrain_by is chosen with the lr, tests/test_lr_choice.py, or is SGD's.)"""
    assert load_spec(linear_spec("swag")).inference.pretrain_by is None
    moves, steps = [], set()
    adam, sgd = swag.adam_move, swag.sgd_move
    monkeypatch.setattr(swag, "adam_move", lambda *a: moves.append("adam") or steps.add(a[-1]) or adam(*a))
    monkeypatch.setattr(swag, "sgd_move", lambda *a, **k: moves.append("sgd") or sgd(*a, **k))
    spec = load_spec(linear_spec("swag", num_models=2, epochs=10, pretrain_epochs=5, batch_size=10, lr=0.01,
                                 rank=4, checkpoint_every=7, pretrain_by="adam"))
    data, family, guide, _ = prepare(spec)
    per_epoch = math.ceil(data.n_train / 10)
    saved = record_checkpoints(monkeypatch, loop)
    full = SWAG().fit(family, guide, data, spec.inference, 0, run_dir=tmp_path, progress=False)
    assert moves == ["adam"] * 5 * per_epoch + ["sgd"] * 10 * per_epoch
    assert len(steps) == 1 and steps.pop() == pytest.approx(0.01 / 3)  # a third of the collecting lr
    mid = next(s for s in saved if not s["done"] and 0 < s["step"] < 5 * per_epoch)
    assert mid["square"].abs().sum() > 0  # Adam's second moments travel with the checkpoint
    runs.save_torch(tmp_path / SWAG_FILE, mid)
    resumed = SWAG().fit(family, guide, data, spec.inference, 0, run_dir=tmp_path, resume=True, progress=False)
    for key in ("mean", "sq_mean", "deviations"):
        assert torch.equal(getattr(resumed.posterior, key), getattr(full.posterior, key))


def test_swag_near_the_conjugate_mode_centres_on_the_posterior_mean(tmp_path):
    spec = load_spec(linear_spec("swag", epochs=100, pretrain_epochs=100, batch_size=10, lr=0.005,
                                 pretrain_lr=0.02, rank=10, predictive_samples=50))
    summary = train(spec, tmp_path / "run", progress=False, echo=None)
    spec, data, posterior = load_run(summary.run_dir)
    assert isinstance(posterior, SWAGPosterior)
    mean, cov = closed_form(data, NOISE / data.y_std)
    assert ((posterior.mean[0] - mean).abs() / cov.diagonal().sqrt()).max() < 0.5


def test_swag_refuses_fewer_iterates_than_its_rank_and_a_temperature():
    spec = load_spec(linear_spec("swag", epochs=5, rank=20, batch_size=None))
    data, family, guide, _ = prepare(spec)
    with pytest.raises(ZooInputError, match="collects only 5 iterates .* fewer than its rank") as err:
        SWAG().fit(family, guide, data, spec.inference, 0, progress=False)
    assert err.value.field == "inference.rank"
    lines = []  # the default rank (not set) is lowered to the iterates of a short budget, and says so
    spec = load_spec(linear_spec("swag", epochs=5, batch_size=None))
    data, family, guide, _ = prepare(spec)
    result = SWAG().fit(family, guide, data, spec.inference, 0, progress=False, log=lines.append)
    assert result.posterior.deviations.shape[1] == 5
    assert any("default rank 20 lowered to the 5 iterates" in line for line in lines)
    spec = load_spec(linear_spec("swag", epochs=1, batch_size=None))  # one iterate: no covariance at all
    data, family, guide, _ = prepare(spec)
    with pytest.raises(ZooInputError, match="collects only 1 iterates .* lower inference.rank to 2"):
        SWAG().fit(family, guide, data, spec.inference, 0, progress=False)
    with pytest.raises(ZooInputError, match="inference.temperature.*leave temperature at 1"):
        load_spec(linear_spec("swag", temperature=0.5))


@pytest.mark.parametrize("settings, field, says", [
    ({"epochs": 10, "burn_in_epochs": 10}, "inference.burn_in_epochs", "leaves no draw"),  # a burn-in given
    ({"epochs": 1, "thin": 1000}, "inference.epochs", "leave no draw to keep.*run more epochs"),  # the default's
])
def test_sgmcmc_refuses_a_run_that_keeps_no_draw_naming_what_to_change(settings, field, says):
    spec = load_spec(linear_spec("sgld", batch_size=None, **settings))
    data, family, guide, _ = prepare(spec)
    with pytest.raises(ZooInputError, match=says) as err:
        SGMCMC().fit(family, guide, data, spec.inference, 0, progress=False)
    assert err.value.field == field


@pytest.mark.parametrize("epochs", [1, 3, 30, 200])
def test_sgmcmc_burns_in_a_quarter_of_any_budget_by_default(epochs):
    """burn_in_epochs left out is a quarter of the run's epochs (50 of the default 200, the old fixed value), three
    quarters where the burn-in explores (SGLD's climb by Adam), so any number of epochs keeps draws; a burn-in given
    keeps its value."""
    spec = load_spec(linear_spec("sghmc", epochs=epochs, thin=1)).inference
    assert spec.burn_in_epochs is None and sgmcmc.burn_in_steps(spec, 100) == int(epochs * 100 * sgmcmc.BURN_IN_SHARE)
    assert sgmcmc.kept_steps(spec, epochs * 100, 100)[0] >= 25 * epochs  # none before the burn-in's end
    exploring = load_spec(linear_spec("sgld", epochs=epochs, thin=1)).inference
    assert exploring.explore_burn_in and sgmcmc.burn_in_steps(exploring, 100) == 75 * epochs
    assert len(sgmcmc.kept_steps(exploring, epochs * 100, 100)) == 25 * epochs
    assert sgmcmc.burn_in_steps(load_spec(linear_spec("sghmc", burn_in_epochs=2.0)).inference, 4) == 8


def test_sgld_explores_its_burn_in_by_adam_without_noise_then_decays_its_lr_over_the_sampling_steps(monkeypatch):
    """SGLD's default burn-in steps are Adam steps down U that draw no noise (no draw is kept from them); the
    polynomial decay starts when they end, at the full lr. explore_burn_in: false (sghmc's where no choice of the lr
    opens it) keeps every step a step of the sampler."""
    spec = load_spec(linear_spec("sgld", epochs=40, batch_size=None, thin=1))
    assert spec.inference.explore_burn_in and load_spec(linear_spec("sghmc")).inference.explore_burn_in is None
    assert not load_spec(linear_spec("sgld", preconditioner="rmsprop")).inference.explore_burn_in
    with pytest.raises(ZooInputError, match="explore_burn_in.*preconditioner: none"):
        load_spec(linear_spec("sgld", preconditioner="rmsprop", explore_burn_in=True))
    for settings in ({"explore_burn_in": False}, {"preconditioner": "rmsprop"}):  # a climb step with no climb
        with pytest.raises(ZooInputError, match="explore_lr: got 0.003 for a burn-in that does not climb"):
            load_spec(linear_spec("sgld", explore_lr=0.003, **settings))
    assert load_spec(linear_spec("sghmc", explore_lr=0.003)).inference.explore_lr == 0.003  # the climbing candidate's
    burn = sgmcmc.burn_in_steps(spec.inference, 1)
    lrs = [step_size(spec.inference, t, 40, burn)[0] for t in range(40)]
    assert burn == 30 and lrs[:burn + 1] == [sgmcmc.DEFAULT_SGMCMC_LR] * (burn + 1)  # three quarters explore
    assert all(a > b for a, b in zip(lrs[burn:], lrs[burn + 1:], strict=False))
    moves = []
    langevin, adam = sgmcmc.langevin_move, sgmcmc.adam_move

    def recording_langevin(*args, method, momentum):
        moves.append(("langevin", len(args) == 8))  # the eighth argument is a sampling step's noise
        return langevin(*args, method=method, momentum=momentum)

    def recording_adam(*args):
        moves.append(("adam", False))
        return adam(*args)

    monkeypatch.setattr(sgmcmc, "langevin_move", recording_langevin)
    monkeypatch.setattr(sgmcmc, "adam_move", recording_adam)
    for explore, first, burn in ((True, ("adam", False), 30), (False, ("langevin", True), 10)):
        moves.clear()
        run = load_spec(linear_spec("sgld", epochs=40, batch_size=None, thin=1, explore_burn_in=explore))
        data, family, guide, _ = prepare(run)
        result = SGMCMC().fit(family, guide, data, run.inference, 0, progress=False)
        assert moves == [first] * burn + [("langevin", True)] * (40 - burn)
        assert next(iter(result.draws.values())).shape[1] == 40 - burn


def test_sghmc_after_an_exploring_burn_in_starts_its_momenta_from_rest(monkeypatch):
    """explore_burn_in: true on sghmc climbs by Adam, whose moment averages share the momenta's slot; the first
    sampler step starts from rest (it inherited Adam's gradient average and diverged at every lr)."""
    run = load_spec(linear_spec("sghmc", epochs=40, batch_size=None, thin=1, explore_burn_in=True))
    burn = sgmcmc.burn_in_steps(run.inference, 1)
    velocities, langevin = [], sgmcmc.langevin_move

    def recording(z, energy, grad, velocity, *args, **kwargs):
        velocities.append(velocity.clone())
        return langevin(z, energy, grad, velocity, *args, **kwargs)

    monkeypatch.setattr(sgmcmc, "langevin_move", recording)
    data, family, guide, _ = prepare(run)
    SGMCMC().fit(family, guide, data, run.inference, 0, progress=False)
    assert burn == 30 and len(velocities) == 40 - burn
    assert not velocities[0].any() and velocities[1].any()


def test_adam_move_is_torchs_adam():
    """The exploring burn-in's step is Adam's, to the last bit of arithmetic that matters."""
    z = torch.randn(3, 5, dtype=torch.float64)
    param = torch.nn.Parameter(z.clone())
    opt = torch.optim.Adam([param], lr=sgmcmc.EXPLORE_LR, betas=sgmcmc.ADAM_BETAS, eps=1e-8)
    first, second = torch.zeros_like(z), torch.zeros_like(z)
    for step in range(4):
        grad = torch.sin(z * (step + 1))
        param.grad = grad.clone()
        opt.step()
        z, first, second = sgmcmc.adam_move(z, grad, first, second, step)
        torch.testing.assert_close(z, param.detach())


def test_net_initialisation_redraws_the_net_for_every_chain_and_puts_it_back():
    spec = load_spec({"data": {"name": "toy_gap", "n_train": 20}, "net": {"hidden": [8]}, "likelihood": {"noise": 0.1},
                      "inference": {"method": "sgld"}})
    data, family, _, _ = prepare(spec)
    before = {k: v.clone() for k, v in family.net.state_dict().items()}
    z = initial_points(family, Coordinates(family), 3, data, lambda _: None, fresh="net")
    assert z.shape == (3, 8 + 8 + 8 + 1) and not torch.allclose(z[0], z[1])
    assert all(torch.equal(v, before[k]) for k, v in family.net.state_dict().items())
    bound = 1.0  # nn.Linear(1, 8) draws its weights from U(-1/sqrt(fan_in), 1/sqrt(fan_in)) = U(-1, 1)
    assert z[:, :8].abs().max() <= bound


def test_multiswag_scores_draws_with_its_gaussian_mixture_density():
    # two models, rank 2, a positive noise site: log q(w) = log mean_k N(z; m_k, S_k) - log|dw/dz|
    spec = load_spec({**linear_spec("swag", rank=2), "likelihood": {"noise": "learned"}})
    _, family, _, _ = prepare(spec)
    torch.manual_seed(0)
    mean, deviations = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 2, 3, dtype=torch.float64)
    variance = torch.rand(2, 3, dtype=torch.float64) + 0.1
    posterior = SWAGPosterior(family, {"mean": mean, "sq_mean": variance + mean**2, "deviations": deviations})
    draws = posterior.sample(6)
    z = posterior.coords.pack(draws)
    _, log_det = posterior.coords.unpack(z)
    covariances = torch.diag_embed(variance / 2) + deviations.transpose(-1, -2) @ deviations / 2
    by_hand = torch.stack([torch.distributions.MultivariateNormal(mean[k], covariances[k]).log_prob(z)
                           for k in range(2)]).logsumexp(0) - math.log(2) - log_det
    torch.testing.assert_close(posterior.log_density(draws), by_hand)
