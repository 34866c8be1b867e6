"""Rank-1 BNNs: the vectorised member forward, the member likelihoods, the factor KL under the mixture and
BatchEnsemble guides, the guides' initialisation, point parameters, posterior draws, end-to-end runs and the
input errors of the rank-1 family."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn

import zoo.models.rank1 as rank1
from guides.base import SettingChoice
from guides.mixture import DEFAULT_INIT_SCALE, INIT_SCALE_CANDIDATES, BatchEnsembleGuide, MixtureGuide
from tests.conftest import assert_input_error, choice_in_log, different_entries
from zoo.cli import main
from zoo.errors import ZooInputError
from zoo.inference.elbo import ANALYTIC, MONTE_CARLO, LazyTraceMeanField_ELBO
from zoo.likelihoods import Categorical, Gaussian
from zoo.models.rank1 import Rank1BNN
from zoo.nets import build_mlp
from zoo.pipeline import load_run, prepare, train
from zoo.posterior import GuidePosterior
from zoo.priors import assign_priors
from zoo.priors.gsm import GaussianScaleMixturePrior
from zoo.runs import CHECKPOINT_FILE, METRICS_FILE, load_torch
from zoo.spec import NormalPrior, PriorSpec, load_spec

MemberHandler = rank1.MemberLayers

REGRESSION_KEYS = {"rmse", "test_ll", "train_seconds"}
CLASSIFICATION_KEYS = {"accuracy", "nll", "ece", "brier", "ood_auroc_entropy", "ood_auroc_mi", "train_seconds"}

TOY_RANK1 = {
    "data": {"name": "toy_gap", "n_train": 40},
    "net": {"hidden": [8], "activation": "tanh"},
    "model": {"family": "rank1", "members": 3, "member_likelihood": "mixture"},
    "guide": {"name": "mixture", "init_scale": 0.05},
    "prior": {"name": "normal", "loc": 1.0, "scale": 0.5},
    "inference": {"num_steps": 30, "batch_size": 16, "lr": 0.01, "checkpoint_every": 100, "predictive_samples": 4},
    "device": "cpu",
    "seed": 0,
}
DIGITS_RANK1 = {
    "data": {"name": "digits", "ood_classes": [8, 9]},
    "net": {"hidden": [16]},
    "model": {"family": "rank1", "members": 2},
    "guide": {"name": "batch_ensemble"},
    "prior": {"name": "normal", "loc": 1.0, "scale": 1.0},
    "inference": {"num_steps": 40, "batch_size": 64, "lr": 0.01, "predictive_samples": 2},
    "device": "cpu",
    "seed": 0,
}


def tiny_family(likelihood=None, members: int = 3, sizes=(3, 5, 4), scale: float = 0.5,
                member_likelihood: str = "average", activation: str = "tanh") -> Rank1BNN:
    """A 2-layer rank-1 MLP under a Normal(1, scale) prior on every factor."""
    net = build_mlp(sizes[0], sizes[-1], list(sizes[1:-1]), activation)
    priors = assign_priors(PriorSpec(default=NormalPrior(loc=1.0, scale=scale)), Rank1BNN.prior_sites(net))
    return Rank1BNN(net, priors, likelihood or Categorical(), members=members, member_likelihood=member_likelihood)


def linears(family: Rank1BNN) -> list[tuple[str, nn.Linear]]:
    return [(n, m) for n, m in family.net.named_modules() if isinstance(m, nn.Linear)]


def loop_forward(family: Rank1BNN, factors: dict[str, torch.Tensor], biases: list[torch.Tensor],
                 x: torch.Tensor, act=torch.tanh) -> torch.Tensor:
    """Member by member, layer by layer: h <- φ(((h ∘ s_k) Wᵀ) ∘ r_k + b_k), no activation after the last layer."""
    layers = linears(family)
    outs = []
    for k in range(factors[f"{layers[0][0]}.r"].shape[0]):
        h = x
        for i, ((name, m), b) in enumerate(zip(layers, biases, strict=True)):
            h = (h * factors[f"{name}.s"][k]) @ m.weight.T * factors[f"{name}.r"][k] + b[k]
            if i + 1 < len(layers):
                h = act(h)
        outs.append(h)
    return torch.stack(outs)


def random_factors(family: Rank1BNN, members: int) -> dict[str, torch.Tensor]:
    out = {}
    for name, m in linears(family):
        out[f"{name}.r"] = 1.0 + 0.5 * torch.randn(members, m.out_features)
        out[f"{name}.s"] = 1.0 + 0.5 * torch.randn(members, m.in_features)
    return out


def set_factors(guide, factors: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, value in factors.items():
            guide.unconstrained_loc(name).copy_(value)


def set_biases(family: Rank1BNN, biases: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for p, b in zip(family.member_bias.values(), biases, strict=True):
            p.copy_(b)


# ------------------------------------------------------------------------------------------- the forward
def test_vectorised_forward_equals_a_loop_over_members():
    torch.manual_seed(0)
    family = tiny_family(members=4, sizes=(3, 6, 2))
    factors = random_factors(family, 4)
    biases = [torch.randn(4, m.out_features) for _, m in linears(family)]
    x = torch.randn(7, 3)
    out = family.forward_members(factors, biases, x)
    assert out.shape == (4, 7, 2)
    expected = loop_forward(family, factors, biases, x)
    assert torch.allclose(out, expected, atol=1e-6)
    # every member differs from the others (the factors are used, not broadcast from member 0)
    assert not torch.allclose(out[0], out[1], atol=1e-3)


def test_member_handler_leaves_linear_alone_outside_and_for_other_weights():
    torch.manual_seed(0)
    original = F.linear
    layer, other = nn.Linear(3, 2), nn.Linear(3, 2)
    r, s, b = torch.randn(2, 2), torch.randn(2, 3), torch.randn(2, 2)
    x = torch.randn(2, 5, 3)  # 2 members x 5 rows; the net sees them member-major as 10 rows
    with MemberHandler({id(layer.weight): (layer.weight, r, s, b)}, members=2):
        assert F.linear is not original
        inside_other = F.linear(x.flatten(0, 1), other.weight, other.bias)
        inside_registered = F.linear(x.flatten(0, 1), layer.weight, layer.bias)
    assert F.linear is original
    # an unregistered weight is an ordinary linear layer, bias included
    assert torch.equal(inside_other, original(x.flatten(0, 1), other.weight, other.bias))
    # outside the context the registered weight is an ordinary linear layer again
    assert torch.equal(layer(x), original(x, layer.weight, layer.bias))
    expected = (x * s[:, None]) @ layer.weight.T * r[:, None] + b[:, None]
    assert torch.allclose(inside_registered, expected.flatten(0, 1), atol=1e-6)
    # a tensor that merely reuses a registered id is not taken for the registered weight
    impostor = {id(layer.weight): (other.weight, r, s, b)}
    with MemberHandler(impostor, members=2):
        assert torch.equal(F.linear(x, layer.weight, layer.bias), original(x, layer.weight, layer.bias))
    assert F.linear is original


def test_member_handler_restores_the_functions_after_an_exception():
    linear, conv2d = F.linear, F.conv2d
    with pytest.raises(RuntimeError, match="boom"), MemberHandler({}, members=1):
        raise RuntimeError("boom")
    assert F.linear is linear and F.conv2d is conv2d


# ------------------------------------------------------------------------------------------- likelihoods
def member_log_probs(family, factors, biases, x, y, noise=None) -> torch.Tensor:
    """log p(y_b | x_b, w_k) as [K, B], computed by hand."""
    out = loop_forward(family, factors, biases, x)
    if noise is None:
        return torch.log_softmax(out, dim=-1).gather(-1, y.expand(out.shape[0], -1)[..., None])[..., 0]
    loc = out[..., 0]
    return -0.5 * ((y - loc) / noise) ** 2 - math.log(noise) - 0.5 * math.log(2 * math.pi)


@pytest.mark.parametrize("task", ["categorical", "gaussian"])
@pytest.mark.parametrize("objective", ["mixture", "average"])
def test_member_likelihood_matches_a_hand_computation(task, objective):
    torch.manual_seed(1)
    k, n = 3, 11
    if task == "categorical":
        family = tiny_family(Categorical(), members=k, sizes=(3, 5, 4), member_likelihood=objective)
        x, y = torch.randn(n, 3), torch.randint(0, 4, (n,))
    else:
        family = tiny_family(Gaussian(None), members=k, sizes=(3, 5, 1), member_likelihood=objective)
        x, y = torch.randn(n, 3), torch.randn(n)
    guide = BatchEnsembleGuide(family.latent_sites())
    factors = random_factors(family, k)
    biases = [torch.randn(k, m.out_features) for _, m in linears(family)]
    set_factors(guide, factors)
    set_biases(family, biases)
    noise = None
    if task == "gaussian":
        noise = 0.6
        with torch.no_grad():
            guide.unconstrained_loc("noise_scale").fill_(math.log(noise))  # positive site: loc is log sigma
    elbo = LazyTraceMeanField_ELBO()
    elbo.differentiable_loss(family.model, guide, x, y, None)  # full batch: the data plate's scale is 1
    log_p = member_log_probs(family, factors, biases, x, y, noise)  # [K, B]
    if objective == "mixture":
        expected = (torch.logsumexp(log_p, dim=0) - math.log(k)).sum()
    else:
        expected = log_p.mean(dim=0).sum()
    assert torch.allclose(elbo.last_terms["obs"], expected, rtol=1e-5, atol=1e-4)
    # the two objectives differ (Jensen): the mixture's log-mean is above the mean of logs
    other = log_p.mean(dim=0).sum() if objective == "mixture" else (torch.logsumexp(log_p, 0) - math.log(k)).sum()
    assert (expected - other).abs() > 1e-3


def test_minibatch_obs_term_is_scaled_to_the_data_set():
    torch.manual_seed(2)
    family = tiny_family(Categorical(), members=2)
    guide = BatchEnsembleGuide(family.latent_sites())
    x, y = torch.randn(12, 3), torch.randint(0, 4, (12,))
    batch = torch.tensor([0, 5, 7])
    elbo = LazyTraceMeanField_ELBO()
    elbo.differentiable_loss(family.model, guide, x, y, batch)
    sub = elbo.last_terms["obs"]
    elbo.differentiable_loss(family.model, guide, x[batch], y[batch], None)
    assert torch.allclose(sub, 12 / 3 * elbo.last_terms["obs"], rtol=1e-5)


# --------------------------------------------------------------------------------------------------- KL
def normal_kl(loc: torch.Tensor, scale: torch.Tensor, prior_loc: float, prior_scale: float) -> torch.Tensor:
    return math.log(prior_scale) - scale.log() + (scale**2 + (loc - prior_loc) ** 2) / (2 * prior_scale**2) - 0.5


def test_mixture_kl_is_the_average_of_the_component_kls():
    torch.manual_seed(3)
    k, sigma = 4, 0.3
    family = tiny_family(Categorical(), members=k, scale=sigma)
    guide = MixtureGuide(family.latent_sites(), init_scale=0.1)
    with torch.no_grad():  # components that differ in loc and scale
        for p in guide.parameters():
            p.add_(0.3 * torch.randn_like(p))
    x, y = torch.randn(6, 3), torch.randint(0, 4, (6,))
    elbo = LazyTraceMeanField_ELBO()
    loss = elbo.differentiable_loss(family.model, guide, x, y, None)
    factor_sites = [n for n, s in family.latent_sites().items() if s.plate is not None]
    assert factor_sites == family.factor_names
    total = 0.0
    for name in factor_sites:
        loc, scale = guide.unconstrained_loc(name), guide.scale(name)
        assert loc.shape[0] == k
        per_component = normal_kl(loc, scale, 1.0, sigma).sum(-1)  # [K]
        assert torch.allclose(elbo.last_terms[name], per_component.mean(), rtol=1e-5), name
        assert not torch.allclose(per_component[0], per_component[1])  # the average is over distinct terms
        total = total + per_component.mean()
        assert elbo.kl_methods[name] == ANALYTIC
    assert torch.allclose(loss, total - elbo.last_terms["obs"], rtol=1e-5)


def test_cauchy_components_use_a_monte_carlo_kl():
    torch.manual_seed(4)
    family = tiny_family(Categorical(), members=2)
    guide = MixtureGuide(family.latent_sites(), component="cauchy")
    assert isinstance(guide.distribution("hidden0.r").base_dist, torch.distributions.Cauchy)
    elbo = LazyTraceMeanField_ELBO()
    loss = elbo.differentiable_loss(family.model, guide, torch.randn(5, 3), torch.randint(0, 4, (5,)), None)
    assert torch.isfinite(loss)
    assert {elbo.kl_methods[n] for n in family.factor_names} == {MONTE_CARLO}


def test_batch_ensemble_factors_contribute_no_kl():
    torch.manual_seed(5)
    family = tiny_family(Categorical(), members=3)
    guide = BatchEnsembleGuide(family.latent_sites())
    elbo = LazyTraceMeanField_ELBO()
    loss = elbo.differentiable_loss(family.model, guide, torch.randn(8, 3), torch.randint(0, 4, (8,)), None)
    for name in family.factor_names:
        assert float(elbo.last_terms[name]) == 0.0, name
    assert "obs" in elbo.last_terms and elbo.last_terms["obs"].item() < 0
    assert torch.allclose(loss, -elbo.last_terms["obs"])


# --------------------------------------------------------------------------------------------- guide init
def factor_locs(guide, family) -> torch.Tensor:
    return torch.cat([guide.unconstrained_loc(n).detach().flatten() for n in family.factor_names])


@pytest.mark.parametrize("guide_cls", [MixtureGuide, BatchEnsembleGuide])
def test_factor_means_start_at_random_signs(guide_cls):
    family = tiny_family(Gaussian(None), members=4, sizes=(10, 20, 1))
    sites = family.latent_sites()
    all_minus = factor_locs(guide_cls(sites, init_sign_prob=0.0), family)
    assert torch.equal(all_minus, -torch.ones_like(all_minus))
    all_plus = factor_locs(guide_cls(sites, init_sign_prob=1.0), family)
    assert torch.equal(all_plus, torch.ones_like(all_plus))
    torch.manual_seed(0)
    half = factor_locs(guide_cls(sites, init_sign_prob=0.5), family)
    torch.manual_seed(0)
    assert torch.equal(half, factor_locs(guide_cls(sites, init_sign_prob=0.5), family))  # seeded
    assert set(half.tolist()) == {-1.0, 1.0}
    assert 0.35 < (half > 0).float().mean() < 0.65
    torch.manual_seed(0)
    mostly = factor_locs(guide_cls(sites, init_sign_prob=0.9), family)
    assert 0.8 < (mostly > 0).float().mean() < 0.98


@pytest.mark.parametrize("guide_cls", [MixtureGuide, BatchEnsembleGuide])
def test_gsm_members_start_init_z_prior_deviations_apart(guide_cls):
    """Under the hierarchical GSM prior a factor is 1 + tau z: the guide starts each member's z at +-init_z by the
    same random signs (so factors at 1 +- tau init_z, not all at 1); init_z 0 starts them all at 1."""
    net = build_mlp(3, 2, [5], "tanh")
    priors = assign_priors(PriorSpec(default=GaussianScaleMixturePrior(name="gsm", scale=0.3)),
                           Rank1BNN.prior_sites(net))
    family = Rank1BNN(net, priors, Categorical(), members=4)
    sites = family.latent_sites()
    z_sites = [n for n in sites if n.endswith(rank1.RAW)]
    assert z_sites and all(sites[n].standardised for n in z_sites)
    torch.manual_seed(0)
    guide = guide_cls(sites, init_sign_prob=0.5, init_z=1.5)
    z = torch.cat([guide.unconstrained_loc(n).detach().flatten() for n in z_sites])
    assert set(z.tolist()) == {-1.5, 1.5}
    values = {n: guide.unconstrained_loc(n).detach() for n in z_sites}
    values |= {n: torch.full(sites[n].shape, 0.3) for n in sites if n.endswith(rank1.SCALE)}
    factors = torch.cat([f.flatten() for f in family.factors(values).values()])
    torch.testing.assert_close(factors.abs().sub(1).abs(), torch.full_like(factors, 0.45))  # 1 +- 0.3 * 1.5
    all_plus = guide_cls(sites, init_sign_prob=1.0, init_z=1.0)
    assert all(torch.equal(all_plus.unconstrained_loc(n), torch.ones(sites[n].shape)) for n in z_sites)
    at_centre = guide_cls(sites, init_z=0.0)
    assert all(not at_centre.unconstrained_loc(n).any() for n in z_sites)


@pytest.mark.parametrize(("value", "why"), [(-1, "greater than or equal to 0"), (50, "less than or equal to 5")])
def test_an_init_z_outside_the_prior_is_refused_naming_the_field(value, why):
    with pytest.raises(ZooInputError) as err:
        load_spec(Path(__file__).resolve().parents[1] / "configs" / "rank1_gsm_digits.yaml", [f"guide.init_z={value}"])
    assert f"guide.init_z: got {value}" in str(err.value) and why in str(err.value)


def test_mixture_init_scale_and_mean_field_noise_site():
    family = tiny_family(Gaussian(None, prior_loc=-1.5), members=3, sizes=(2, 4, 1))
    guide = MixtureGuide(family.latent_sites(), init_scale=0.2, init_rho=-4.0)
    for name in family.factor_names:
        assert torch.allclose(guide.scale(name), torch.full_like(guide.scale(name), 0.2)), name
    # the learned noise is outside the members plate: one mean-field LogNormal, not signed, init_rho as given
    assert family.latent_sites()["noise_scale"].plate is None
    assert guide.unconstrained_loc("noise_scale").shape == ()
    assert guide.unconstrained_loc("noise_scale").item() == pytest.approx(-1.5)
    assert guide.scale("noise_scale").item() == pytest.approx(F.softplus(torch.tensor(-4.0)).item())
    assert isinstance(guide.distribution("noise_scale"), torch.distributions.LogNormal)
    elbo = LazyTraceMeanField_ELBO()
    elbo.differentiable_loss(family.model, guide, torch.randn(5, 2), torch.randn(5), None)
    assert elbo.kl_methods["noise_scale"] == ANALYTIC


def test_a_null_init_scale_holds_the_default_until_a_taken_one_restarts_only_the_factors_spread():
    family = tiny_family(Gaussian(None, prior_loc=-1.5), members=3, sizes=(2, 4, 1))
    guide = MixtureGuide(family.latent_sites(), init_scale=None, init_rho=-4.0)
    assert guide.open_setting() == SettingChoice("guide.init_scale", DEFAULT_INIT_SCALE, INIT_SCALE_CANDIDATES)
    means = {n: guide.unconstrained_loc(n).clone() for n in family.latent_sites()}
    guide.take_setting(1e-4)
    assert guide.open_setting()[1] == 1e-4
    for name in family.factor_names:
        assert torch.allclose(guide.scale(name), torch.full_like(guide.scale(name), 1e-4), rtol=1e-4), name
    assert guide.scale("noise_scale").item() == pytest.approx(F.softplus(torch.tensor(-4.0)).item())  # not a factor
    assert all(torch.equal(guide.unconstrained_loc(n), m) for n, m in means.items())  # the random signs kept
    assert MixtureGuide(family.latent_sites(), init_scale=0.2).open_setting() is None


def chosen_scale_spec(*overrides: str):
    tree = {**TOY_RANK1, "data": {**TOY_RANK1["data"], "calibration_fraction": 0.25},
            "guide": {"name": "mixture"}, "likelihood": {"name": "gaussian", "noise": 0.3}}
    return load_spec(tree, list(overrides))


def test_a_null_init_scale_is_chosen_on_the_calibration_rows_and_the_kept_run_is_the_run_given_that_scale(tmp_path):
    """Each candidate spread's whole run is scored on the calibration rows and the best kept as it ended: the run
    given that spread by hand, step for step; the fit names it in its choices, and without the rows it starts at
    the default."""
    lines: list[str] = []
    chosen = train(chosen_scale_spec(), tmp_path / "chosen", progress=False, echo=lines.append)
    scale, scores, _ = choice_in_log(lines, "guide.init_scale")
    assert sorted(scores) == sorted(INIT_SCALE_CANDIDATES) and scale == min(scores, key=scores.get)
    saved = load_torch(chosen.run_dir / CHECKPOINT_FILE)
    assert saved["chosen_settings"]["guide.init_scale"] == scale
    by_hand = train(chosen_scale_spec(f"guide.init_scale={scale}"), tmp_path / "by_hand", progress=False, echo=None)
    hand = load_torch(by_hand.run_dir / CHECKPOINT_FILE)
    assert different_entries(hand["guide"], saved["guide"]) == [] and hand["losses"] == saved["losses"]
    loaded = load_run(chosen.run_dir)[2].guide  # its spec's scale is null: the fitted spreads load, none restarts
    assert loaded.scale_open and different_entries(loaded.state_dict(), saved["guide"]) == []
    lines.clear()
    train(chosen_scale_spec("data.calibration_fraction=0"), tmp_path / "no_rows", progress=False, echo=lines.append)
    assert not any("init_scale" in x for x in lines)


# ---------------------------------------------------------------------------------------- point params
def test_point_parameters_are_shared_weights_and_member_biases():
    family = tiny_family(Categorical(), members=5, sizes=(3, 6, 7, 4))
    params = family.point_parameters()
    layers = linears(family)
    assert len(params) == 2 * len(layers)
    for p, (_, m) in zip(params[:len(layers)], layers, strict=True):
        assert p is m.weight
    for b, (_, m) in zip(params[len(layers):], layers, strict=True):
        assert isinstance(b, nn.Parameter) and b.shape == (5, m.out_features)
        assert torch.equal(b, m.bias.detach().expand(5, -1))  # each member starts from the net's own bias


# ------------------------------------------------------------------------------------------ end to end
def run(tree: dict, out, *overrides: str):
    return train(load_spec(tree, list(overrides)), out, progress=False, echo=None)


def metrics_without_time(run_dir) -> dict:
    metrics = json.loads((run_dir / METRICS_FILE).read_text())
    metrics.pop("train_seconds")
    return metrics


@pytest.fixture(scope="module")
def toy_rank1_run(tmp_path_factory):
    return run(TOY_RANK1, tmp_path_factory.mktemp("rank1") / "toy")


@pytest.fixture(scope="module")
def digits_rank1_run(tmp_path_factory):
    return run(DIGITS_RANK1, tmp_path_factory.mktemp("rank1") / "digits")


def test_svi_trains_the_point_parameters(toy_rank1_run):
    _, family, _, _ = prepare(load_spec(TOY_RANK1))  # seeded: the same initial values the run started from
    initial = [p.detach().clone() for p in family.point_parameters()]
    trained = load_torch(toy_rank1_run.run_dir / CHECKPOINT_FILE)["point_parameters"]
    assert [t.shape for t in trained] == [p.shape for p in initial]
    for before, after in zip(initial, trained, strict=True):
        assert not torch.allclose(before, after), before.shape


def test_rank1_mixture_toy_run(toy_rank1_run, tmp_path):
    out = toy_rank1_run.run_dir
    metrics = json.loads((out / METRICS_FILE).read_text())
    assert set(metrics) == REGRESSION_KEYS
    assert all(math.isfinite(v) for v in metrics.values())
    state = load_torch(out / CHECKPOINT_FILE)
    assert state["step"] == 30 and state["done"] is True
    assert state["kl_methods"] == {**{n: ANALYTIC for n in ("hidden0.r", "hidden0.s", "out.r", "out.s")},
                                   "noise_scale": ANALYTIC}
    again = run(TOY_RANK1, tmp_path / "again")
    assert metrics_without_time(again.run_dir) == metrics_without_time(out)
    other = load_torch(again.run_dir / CHECKPOINT_FILE)
    assert other["losses"] == state["losses"]
    for name, value in state["guide"].items():
        assert torch.equal(value, other["guide"][name]), name
    for a, b in zip(state["point_parameters"], other["point_parameters"], strict=True):
        assert torch.equal(a, b)


def test_rank1_batch_ensemble_digits_run(digits_rank1_run):
    out = digits_rank1_run.run_dir
    metrics = json.loads((out / METRICS_FILE).read_text())
    assert CLASSIFICATION_KEYS <= set(metrics)
    assert {"ood_auroc_entropy_heldout_classes", "ood_auroc_entropy_image_patches"} <= set(metrics)
    assert all(math.isfinite(v) for v in metrics.values())
    assert metrics["accuracy"] > 0.5  # 8 classes: chance is 0.125
    guide = load_torch(out / CHECKPOINT_FILE)["guide"]
    assert not any(key.startswith("rho.") for key in guide)  # Diracs: locations only


@pytest.mark.parametrize("which", [
    "digits_rank1_run",
    "toy_rank1_run",
])
def test_prune_refuses_a_rank1_run(which, request, capsys):
    run_dir = request.getfixturevalue(which).run_dir
    code = main(["prune", str(run_dir)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and "Traceback" not in err
    assert not (run_dir / "prune.json").exists()


# ---------------------------------------------------------------------------------------------- draws
def test_posterior_draws_and_predictions_per_member():
    torch.manual_seed(6)
    k, s, n = 3, 4, 9
    family = tiny_family(Gaussian(None), members=k, sizes=(2, 5, 1))
    guide = MixtureGuide(family.latent_sites(), init_scale=0.3)
    with torch.no_grad():
        guide.rho["noise_scale"].fill_(0.0)  # the noise draws vary
    set_biases(family, [torch.randn(k, m.out_features) for _, m in linears(family)])  # members differ in b_k too
    posterior = GuidePosterior(family, guide)
    draws = posterior.sample(s)
    sites = family.latent_sites()
    assert set(draws) == set(sites)
    for name, site in sites.items():
        assert draws[name].shape == (s, *site.shape), name
    assert draws["hidden0.r"].shape == (s, k, 5) and draws["hidden0.s"].shape == (s, k, 2)
    assert draws["noise_scale"].shape == (s,) and len(set(draws["noise_scale"].tolist())) == s
    x = torch.randn(n, 2)
    pred = posterior.predict(x, draws=draws)
    assert pred.loc.shape == (s * k, n) and pred.scale.shape == (s * k, n)
    biases = list(family.member_bias.values())
    for i in range(s):
        factors = {name: draws[name][i] for name in family.factor_names}
        expected = loop_forward(family, factors, biases, x)[..., 0]  # [K, B]
        for j in range(k):
            assert torch.allclose(pred.loc[i * k + j], expected[j], atol=1e-5), (i, j)
            # the noise draw s is repeated for each of its K members
            assert torch.equal(pred.scale[i * k + j], draws["noise_scale"][i].expand(n)), (i, j)


def test_classification_predictions_are_s_times_k_draws():
    torch.manual_seed(7)
    family = tiny_family(Categorical(), members=2)
    posterior = GuidePosterior(family, MixtureGuide(family.latent_sites()))
    pred = posterior.predict(torch.randn(6, 3), num_samples=5)
    assert pred.log_probs.shape == (10, 6, 4)
    assert torch.allclose(pred.log_probs.exp().sum(-1), torch.ones(10, 6), atol=1e-5)


# --------------------------------------------------------------------------------------------- bad input
def without(tree: dict, section: str) -> dict:
    return {k: v for k, v in tree.items() if k != section}


BAD_INPUT = {
    "members_zero": (TOY_RANK1, ["model.members=0"], [r"model\.members"]),
    "negative_prior_scale": (TOY_RANK1, ["prior.scale=-0.5"], [r"prior\.\S*scale", "greater than 0"]),
    "mixture_on_mean_field": (without(TOY_RANK1, "model"), ["prior.loc=0.0"],
                              [r"guide\.name", "mixture", "mean_field"]),
    "init_scale_zero": (TOY_RANK1, ["guide.init_scale=0"], [r"guide\.init_scale"]),
    "init_scale_negative": (TOY_RANK1, ["guide.init_scale=-0.1"], [r"guide\.init_scale"]),
    "init_sign_prob_above_one": (TOY_RANK1, ["guide.init_sign_prob=1.5"], [r"guide\.init_sign_prob"]),
    "default_prior_on_rank1": (without(TOY_RANK1, "prior"), [], [r"prior", r"prior\.loc: 1\.0"]),
    "prior_not_centred_at_one": (TOY_RANK1, ["prior.loc=0.5"], [r"prior", r"prior\.loc"]),
    "members_on_mean_field": (TOY_RANK1, ["model.family=all_weights", "guide.name=mean_field", "prior.loc=0.0"],
                              [r"model\.members", "rank1"]),
    "members_default_value_on_mean_field": (TOY_RANK1, ["model.family=all_weights", "guide.name=mean_field",
                                                        "prior.loc=0.0", "model.members=4",
                                                        "model.member_likelihood=average"], [r"model\.members"]),
}


@pytest.mark.parametrize("case", [
    *BAD_INPUT,
])
def test_bad_rank1_input_exits_2_naming_the_field(case, tmp_path, capsys):
    tree, overrides, patterns = BAD_INPUT[case]
    assert_input_error(tree, overrides, patterns, tmp_path, capsys)


def test_the_valid_base_spec_of_the_bad_input_cases_trains(tmp_path, capsys):
    # the cases above fail for their one change, not for something in the base spec
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(TOY_RANK1))
    code = main(["train", str(spec), "--out", str(tmp_path / "run"), "--no-progress", "--set",
                 "inference.num_steps=2"])
    assert code == 0, capsys.readouterr()


@pytest.mark.parametrize("groups", [1, 2])
def test_member_conv2d_equals_scaling_input_and_output_channels(groups):
    # member k convolves its rows with W * r_k s_k^T; that is the convolution of (x * s_k) scaled by r_k, plus b_k,
    # also for a grouped convolution (s_k indexed by the input channels each output channel reads)
    torch.manual_seed(0)
    members, rows = 3, 2
    weight = torch.randn(4, 6 // groups, 3, 3)
    r, s, b = torch.randn(members, 4), torch.randn(members, 6), torch.randn(members, 4)
    x = torch.randn(members * rows, 6, 5, 5)
    with MemberHandler({id(weight): (weight, r, s, b)}, members):
        together = F.conv2d(x, weight, None, 1, 1, 1, groups)
    for k in range(members):
        rows_k = x[k * rows:(k + 1) * rows] * s[k].view(1, -1, 1, 1)
        expected = F.conv2d(rows_k, weight, None, 1, 1, 1, groups) * r[k].view(1, -1, 1, 1) + b[k].view(1, -1, 1, 1)
        assert torch.allclose(together[k * rows:(k + 1) * rows], expected, atol=1e-5)


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("groups", [1, 2])
def test_member_transposed_convolution_equals_scaling_input_and_output_channels(dims, groups):
    # a transposed convolution is linear in its input channels and its output channels as well: member k's weights
    # W * r_k s_k^T (W is [in, out / groups, ...]) give the transposed convolution of (x * s_k), scaled by r_k, + b_k
    torch.manual_seed(0)
    members, rows, spatial = 2, 3, [1] * dims
    weight = torch.randn(4, 6 // groups, *[2] * dims)
    r, s, b = torch.randn(members, 6), torch.randn(members, 4), torch.randn(members, 6)
    x = torch.randn(members * rows, 4, *[3] * dims)
    with MemberHandler({id(weight): (weight, r, s, b)}, members):
        together = getattr(F, f"conv_transpose{dims}d")(x, weight, None, 2, 0, 1, groups)  # looked up when called
    conv = getattr(F, f"conv_transpose{dims}d")
    for k in range(members):
        rows_k = x[k * rows:(k + 1) * rows] * s[k].view(1, -1, *spatial)
        expected = conv(rows_k, weight, None, 2, 0, 1, groups) * r[k].view(1, -1, *spatial) + b[k].view(1, -1, *spatial)
        assert torch.allclose(together[k * rows:(k + 1) * rows], expected, atol=1e-5)


def test_member_embedding_scales_each_looked_up_row_by_its_input_and_output_factors():
    # an Embedding is a Linear layer on one-hot rows: member k's table is E * s_k r_k^T (row i scaled by s_k[i])
    torch.manual_seed(0)
    members, table = 3, torch.randn(10, 4)
    r, s = torch.randn(members, 4), torch.randn(members, 10)
    ids = torch.randint(0, 10, (members * 2, 5))
    with MemberHandler({id(table): (table, r, s, None)}, members):
        together = F.embedding(ids, table, padding_idx=0)
    assert F.embedding is not None and together.shape == (members * 2, 5, 4)
    for k in range(members):
        member_table = table * s[k][:, None] * r[k]
        assert torch.allclose(together[k * 2:(k + 1) * 2], F.embedding(ids[k * 2:(k + 1) * 2], member_table))


class SignalNet(nn.Module):
    """Token ids -> Embedding -> a grouped ConvTranspose1d -> a Conv1d -> the mean over positions -> a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.up = nn.ConvTranspose1d(4, 6, 3, stride=2, groups=2)
        self.down = nn.Conv1d(6, 5, 3, bias=False)
        self.out = nn.Linear(5, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.up(self.embed(ids).transpose(1, 2)))
        return self.out(torch.tanh(self.down(h)).mean(-1))


def test_rank1_members_of_a_net_with_an_embedding_and_transposed_convolutions_equal_the_factored_nets():
    # member k of every factored layer is that layer with W * r_k s_k^T over its (out, in) channels and bias b_k;
    # the Embedding's input is its row index and it has no bias
    torch.manual_seed(0)
    net, members = SignalNet(), 3
    priors = assign_priors(PriorSpec(default=NormalPrior(loc=1.0)), Rank1BNN.prior_sites(net))
    family = Rank1BNN(net, priors, Categorical(), members=members)
    assert list(family.layers) == ["embed", "up", "down", "out"] and list(family.member_bias) == ["up", "down", "out"]
    factors = {n: 1 + 0.3 * torch.randn(members, v.shape[-1]) for n, v in family.latent_sites().items()}
    biases = [torch.randn_like(b) for b in family.member_bias.values()]
    ids = torch.randint(0, 10, (7, 6))
    with torch.no_grad():
        together = family.forward_members(factors, biases, ids)
        assert together.shape == (members, 7, 2)
        for k in range(members):
            member = SignalNet()
            member.load_state_dict(net.state_dict())
            bias_of = dict(zip(["up", "down", "out"], biases, strict=True))
            for name, layer in member.named_children():
                r, s = factors[f"{name}.r"][k], factors[f"{name}.s"][k]
                if name == "embed":
                    layer.weight.mul_(s[:, None] * r)
                    continue
                if name == "up":  # [in, out / groups, kernel]: output channel g * 3 + j of input channel i
                    r_read = r.view(2, 1, 3).expand(-1, 2, -1).reshape(4, 3)
                    layer.weight.mul_((s[:, None] * r_read)[..., None])
                else:
                    layer.weight.mul_((r[:, None] * s).view(*layer.weight.shape[:2], *[1] * (layer.weight.dim() - 2)))
                layer.bias = nn.Parameter(bias_of[name][k].clone())
            assert torch.allclose(together[k], member(ids), atol=1e-5), k


def test_a_conv_nets_draws_are_predicted_one_draw_per_pass_as_they_would_be_in_one(monkeypatch):
    # S draws of K members: a net with convolutions runs K member rows per pass (S passes), not S*K at once, and
    # the predictions are those of the single pass an MLP takes
    torch.manual_seed(1)
    net, members, count = SignalNet(), 3, 4
    priors = assign_priors(PriorSpec(default=NormalPrior(loc=1.0)), Rank1BNN.prior_sites(net))
    family = Rank1BNN(net, priors, Categorical(), members=members)
    posterior = GuidePosterior(family, MixtureGuide(family.latent_sites(), init_scale=0.3))
    draws, ids = posterior.sample(count), torch.randint(0, 10, (5, 6))
    passes = []
    forward = family.forward_members
    monkeypatch.setattr(family, "forward_members", lambda f, b, x: passes.append(len(b[0])) or forward(f, b, x))
    per_draw = posterior.predict(ids, draws=draws)
    assert passes == [members] * count
    passes.clear()
    monkeypatch.setattr(rank1, "has_convolutions", lambda net: False)
    together = posterior.predict(ids, draws=draws)
    assert passes == [members * count]
    assert per_draw.log_probs.shape == (count * members, 5, 2)
    assert torch.allclose(per_draw.log_probs, together.log_probs, atol=1e-6)
