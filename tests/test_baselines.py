"""Baselines behind the same spec and Posterior: deep ensembles (the vectorised member forward, distinct seeded
inits, the members' likelihood and MAP objective, predictions as a uniform mixture), MC dropout (whole input units
dropped at rate p, the 1/(1-p) scaling, the dropout ELBO, T-pass prediction), end-to-end runs of every baseline
config and their input errors."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pyro
import pytest
import torch
import yaml
from pyro import poutine

from guides.delta import DeltaGuide
from guides.dropout import DropoutGuide
from tests.conftest import assert_input_error
from zoo.errors import ZooInputError
from zoo.evaluate import evaluate
from zoo.inference.elbo import LazyTraceMeanField_ELBO
from zoo.likelihoods import Categorical, Gaussian
from zoo.models.all_weights import AllWeightsBNN
from zoo.models.deterministic import DeepEnsemble
from zoo.models.rank1 import Rank1BNN
from zoo.nets import build_mlp
from zoo.pipeline import load_run, prepare, train
from zoo.posterior import GuidePosterior
from zoo.priors import assign_priors
from zoo.runs import CHECKPOINT_FILE, METRICS_FILE, load_torch
from zoo.spec import DropoutGuideSpec, NormalPrior, PriorSpec, load_spec

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
REGRESSION_KEYS = {"rmse", "test_ll", "train_seconds"}
CLASSIFICATION_KEYS = {"accuracy", "nll", "ece", "brier", "ood_auroc_entropy", "ood_auroc_mi", "train_seconds"}
NORMAL_CONST = 0.5 * math.log(2 * math.pi)


def normal_log_prob(value: torch.Tensor, loc, scale: float) -> torch.Tensor:
    return -0.5 * ((value - loc) / scale) ** 2 - math.log(scale) - NORMAL_CONST


def mlp_by_hand(weights: dict[str, torch.Tensor], x: torch.Tensor, layers: int) -> torch.Tensor:
    """tanh MLP ``hidden0, ..., out`` written as explicit matmuls."""
    h = x
    for i in range(layers - 1):
        h = torch.tanh(h @ weights[f"hidden{i}.weight"].T + weights[f"hidden{i}.bias"])
    return h @ weights["out.weight"].T + weights["out.bias"]


def priors_for(family_cls, net, scale: float):
    return assign_priors(PriorSpec(default=NormalPrior(scale=scale)), family_cls.prior_sites(net))


# ------------------------------------------------------------------------------------------ deep ensemble
def tiny_ensemble(likelihood=None, members: int = 3, sizes=(3, 5, 4), scale: float = 0.7) -> DeepEnsemble:
    net = build_mlp(sizes[0], sizes[-1], list(sizes[1:-1]), "tanh")
    return DeepEnsemble(net, priors_for(DeepEnsemble, net, scale), likelihood or Categorical(), members=members)


def random_members(family: DeepEnsemble, *lead: int) -> dict[str, torch.Tensor]:
    return {n: torch.randn(*lead, *s.shape) for n, s in family.latent_sites().items() if s.plate is not None}


def test_vectorised_forward_equals_each_member_run_separately():
    torch.manual_seed(0)
    family = tiny_ensemble(members=4, sizes=(3, 6, 5, 2))
    weights = random_members(family)
    x = torch.randn(7, 3)
    out = family.forward_members(weights, x)
    assert out.shape == (4, 7, 2)
    for k in range(4):
        net = copy.deepcopy(family.net)  # member k as an ordinary nn.Module with its own state
        net.load_state_dict({n: w[k] for n, w in weights.items()})
        assert torch.allclose(out[k], net(x), atol=1e-6), k
        assert torch.allclose(out[k], mlp_by_hand({n: w[k] for n, w in weights.items()}, x, 3), atol=1e-6), k
    assert not torch.allclose(out[0], out[1], atol=1e-3)


def test_members_start_from_distinct_seeded_default_inits():
    torch.manual_seed(0)
    family = tiny_ensemble(members=5, sizes=(4, 30, 20, 1))
    sites = family.latent_sites()
    torch.manual_seed(0)
    again = tiny_ensemble(members=5, sizes=(4, 30, 20, 1)).latent_sites()
    fan_in = {"hidden0": 4, "hidden1": 30, "out": 20}
    for name, site in sites.items():
        assert site.plate == ("members", 5) and site.shape[0] == 5, name
        init = site.init
        assert torch.equal(init, again[name].init), name  # seeded: the same spec gives the same members
        for k in range(5):
            for j in range(k):
                assert not torch.allclose(init[k], init[j]), (name, k, j)
        # nn.Linear's default init: weights and biases uniform in +-1/sqrt(fan_in)
        bound = 1.0 / math.sqrt(fan_in[name.split(".")[0]])
        assert init.abs().max() <= bound, name
        if init[0].numel() >= 20:
            assert init.abs().max() > 0.7 * bound, name  # spread over the interval, not all near 0
    # the Delta guide starts every member at its own init
    guide = DeltaGuide(sites)
    for name, value in guide.point_estimate().items():
        assert torch.equal(value, sites[name].init), name


@pytest.mark.parametrize("task", ["categorical", "gaussian_fixed", "gaussian_learned"])
def test_log_likelihood_is_the_members_average_by_hand(task):
    torch.manual_seed(1)
    s, k, n = 2, 3, 9
    if task == "categorical":
        family = tiny_ensemble(Categorical(), members=k, sizes=(3, 5, 4))
        y = torch.randint(0, 4, (n,))
    else:
        family = tiny_ensemble(Gaussian(0.4 if task == "gaussian_fixed" else None), members=k, sizes=(3, 5, 1))
        y = torch.randn(n)
    x = torch.randn(n, 3)
    draws = random_members(family, s)
    noise = torch.tensor([0.3, 0.8])
    if task == "gaussian_learned":
        draws["noise_scale"] = noise
    got = family.log_likelihood(draws, x, y)
    assert got.shape == (s, n)
    for i in range(s):
        per_member = []
        for j in range(k):
            out = mlp_by_hand({name: w[i, j] for name, w in draws.items() if name != "noise_scale"}, x, 2)
            if task == "categorical":
                per_member.append(torch.log_softmax(out, -1).gather(-1, y[:, None])[:, 0])
            else:
                sigma = 0.4 if task == "gaussian_fixed" else float(noise[i])
                per_member.append(normal_log_prob(y, out[:, 0], sigma))
        expected = torch.stack(per_member).mean(0)  # each member its own likelihood, averaged
        assert torch.allclose(got[i], expected, atol=1e-5), i


def test_elbo_is_the_average_of_the_members_map_objectives():
    torch.manual_seed(2)
    k, sigma, noise, n = 3, 0.7, 0.5, 10
    family = tiny_ensemble(Gaussian(noise), members=k, sizes=(2, 6, 1), scale=sigma)
    guide = DeltaGuide(family.latent_sites())
    values = {name: torch.randn(guide.sites[name].shape) for name in guide.sites}
    with torch.no_grad():
        for name, value in values.items():
            guide.unconstrained_loc(name).copy_(value)
    x, y = torch.randn(n, 2), torch.randn(n)
    loss = LazyTraceMeanField_ELBO().differentiable_loss(family.model, guide, x, y, None)
    objectives = []
    for j in range(k):
        member = {name: v[j] for name, v in values.items()}
        log_lik = normal_log_prob(y, mlp_by_hand(member, x, 2)[:, 0], noise).sum()
        log_prior = sum(normal_log_prob(v, 0.0, sigma).sum() for v in member.values())
        objectives.append(log_lik + log_prior)
    assert torch.allclose(-loss, torch.stack(objectives).mean(), rtol=1e-5)
    # each member's gradient is that of its own MAP objective (scaled by 1/K): members do not interact
    loss.backward()
    grad = guide.unconstrained_loc("out.weight").grad
    member0 = {name: v[0].clone().requires_grad_(True) for name, v in values.items()}
    own = normal_log_prob(y, mlp_by_hand(member0, x, 2)[:, 0], noise).sum() + sum(
        normal_log_prob(v, 0.0, sigma).sum() for v in member0.values())
    own.backward()
    assert torch.allclose(grad[0], -member0["out.weight"].grad / k, atol=1e-5)


def test_predictions_are_the_members_as_draws():
    torch.manual_seed(3)
    k, s, n = 3, 2, 6
    family = tiny_ensemble(Gaussian(None), members=k, sizes=(2, 5, 1))
    guide = DeltaGuide(family.latent_sites())
    posterior = GuidePosterior(family, guide)
    draws = posterior.sample(s)
    assert draws["hidden0.weight"].shape == (s, k, 5, 2) and draws["noise_scale"].shape == (s,)
    x = torch.randn(n, 2)
    pred = posterior.predict(x, draws=draws)
    assert pred.loc.shape == (s * k, n) and pred.scale.shape == (s * k, n)
    for i in range(s):
        for j in range(k):
            member = {name: v[i, j] for name, v in draws.items() if name != "noise_scale"}
            assert torch.allclose(pred.loc[i * k + j], mlp_by_hand(member, x, 2)[:, 0], atol=1e-6), (i, j)
            assert torch.equal(pred.scale[i * k + j], draws["noise_scale"][i].expand(n))
    assert not torch.allclose(pred.loc[0], pred.loc[1], atol=1e-3)


def test_no_point_parameters_and_members_must_be_positive():
    family = tiny_ensemble()
    assert family.point_parameters() == []
    with pytest.raises(ValueError, match="at least one member"):
        tiny_ensemble(members=0)


# ---------------------------------------------------------------------------------------------- dropout
def tiny_mean_field(likelihood=None, sizes=(3, 8, 6, 1), scale: float = 1.0) -> AllWeightsBNN:
    net = build_mlp(sizes[0], sizes[-1], list(sizes[1:-1]), "tanh")
    return AllWeightsBNN(net, priors_for(AllWeightsBNN, net, scale), likelihood or Gaussian(0.5))


def test_dropout_zeroes_whole_input_units_at_rate_p_and_scales_the_rest():
    p, draws_n = 0.3, 40
    family = tiny_mean_field(sizes=(4, 300, 200, 1))
    guide = DropoutGuide(family.latent_sites(), dropout_rate=p)
    assert guide.dropped == ["hidden1.weight", "out.weight"]
    loc = {name: site.init for name, site in family.latent_sites().items()}  # where the guide starts
    pyro.set_rng_seed(0)
    draws = GuidePosterior(family, guide).sample(draws_n)
    # the first layer's weights, the biases and the noise are point values
    for name in ("hidden0.weight", "hidden0.bias", "hidden1.bias", "out.bias"):
        assert torch.equal(draws[name], loc[name].expand_as(draws[name])), name
    dropped = []
    for name in guide.dropped:
        value = draws[name]  # [T, out, in]
        zero = (value == 0).all(dim=1)  # [T, in]: a whole input unit (column) dropped
        kept = ~zero
        # every unit is either all zero or the unmasked column times exactly 1/(1-p)
        scaled = loc[name] / (1 - p)
        assert torch.allclose(value, torch.where(kept[:, None, :], scaled, torch.zeros_like(scaled)), atol=1e-7)
        assert ((value == 0) == zero[:, None, :].expand_as(value)).all(), name  # no single weights zeroed
        dropped.append(zero.float().flatten())
        assert not torch.equal(zero[0], zero[1])  # fresh masks per draw
    rate = torch.cat(dropped).mean().item()  # 40 draws x 500 units: sd ~ 0.003
    assert abs(rate - p) < 0.02, rate
    # the point estimate is the unmasked weights
    assert all(torch.equal(guide.point_estimate()[n], loc[n]) for n in loc)


def test_drop_inputs_also_drops_the_features_of_the_first_layer_and_allows_a_net_without_hidden_layers():
    p = 0.4
    family = tiny_mean_field(sizes=(200, 8, 6, 1))
    guide = DropoutGuide(family.latent_sites(), dropout_rate=p, drop_inputs=True)
    assert guide.dropped == ["hidden0.weight", "hidden1.weight", "out.weight"]
    pyro.set_rng_seed(1)
    first = GuidePosterior(family, guide).sample(30)["hidden0.weight"]  # [T, 8, 200]
    loc = family.latent_sites()["hidden0.weight"].init
    dropped = (first == 0).all(dim=1)  # [T, 200]: whole features
    assert torch.allclose(first, torch.where(dropped[:, None, :], 0.0, loc / (1 - p)), atol=1e-6)
    assert abs(dropped.float().mean().item() - p) < 0.03  # 6,000 features: sd 0.006
    linear = tiny_mean_field(sizes=(3, 1))
    assert DropoutGuide(linear.latent_sites(), drop_inputs=True).dropped == ["out.weight"]
    spec = DropoutGuideSpec(name="dropout", dropout_rate=p, drop_inputs=True)
    assert spec.build(family.latent_sites()).dropped == guide.dropped


def test_dropout_elbo_is_log_lik_plus_log_prior_at_the_masked_weights():
    torch.manual_seed(4)
    sigma, noise, n, p = 0.8, 0.5, 12, 0.5
    family = tiny_mean_field(Gaussian(noise), sizes=(3, 8, 6, 1), scale=sigma)
    guide = DropoutGuide(family.latent_sites(), dropout_rate=p)
    x, y = torch.randn(n, 3), torch.randn(n)
    pyro.set_rng_seed(11)
    loss = LazyTraceMeanField_ELBO().differentiable_loss(family.model, guide, x, y, None)
    pyro.set_rng_seed(11)  # the ELBO runs the guide first: the same seed gives the same masks
    masked = {name: site["value"].detach() for name, site in poutine.trace(guide).get_trace().nodes.items()
              if site["type"] == "sample"}
    assert masked.keys() == set(family.weight_names)
    for name in guide.dropped:
        zero = (masked[name] == 0).all(0)
        assert zero.any() and not zero.all(), name  # this seed drops some units, not all
    log_lik = normal_log_prob(y, mlp_by_hand(masked, x, 3)[:, 0], noise).sum()
    log_prior = sum(normal_log_prob(v, 0.0, sigma).sum() for v in masked.values())
    assert torch.allclose(-loss, log_lik + log_prior, rtol=1e-5)
    unmasked = {n: v.detach() for n, v in guide.point_estimate().items()}
    unmasked_objective = normal_log_prob(y, mlp_by_hand(unmasked, x, 3)[:, 0], noise).sum() + sum(
        normal_log_prob(v, 0.0, sigma).sum() for v in unmasked.values())
    assert not torch.allclose(-loss, unmasked_objective, rtol=1e-3)
    # a dropped unit's weights get no gradient this step (neither likelihood nor weight decay sees them)
    loss.backward()
    for name in guide.dropped:
        zero = (masked[name] == 0).all(0)
        grad = guide.unconstrained_loc(name).grad
        assert torch.equal(grad[:, zero], torch.zeros_like(grad[:, zero])), name
        assert (grad[:, ~zero] != 0).any(), name


def test_mc_dropout_prediction_is_the_t_pass_average():
    family = tiny_mean_field(Gaussian(None), sizes=(2, 16, 16, 1))
    guide = DropoutGuide(family.latent_sites(), dropout_rate=0.2)
    posterior = GuidePosterior(family, guide)
    pyro.set_rng_seed(5)
    draws = posterior.sample(6)
    x = torch.randn(5, 2)
    pred = posterior.predict(x, draws=draws)
    assert pred.loc.shape == (6, 5)
    for t in range(6):
        weights = {n: v[t] for n, v in draws.items() if n != "noise_scale"}
        assert torch.allclose(pred.loc[t], mlp_by_hand(weights, x, 3)[:, 0], atol=1e-6), t
    assert not torch.allclose(pred.loc[0], pred.loc[1])


def test_dropout_guide_refuses_bad_rates_and_sites_without_plain_weight_matrices():
    sites = tiny_mean_field().latent_sites()
    for rate in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ZooInputError, match=r"guide\.dropout_rate"):
            DropoutGuide(sites, dropout_rate=rate)
    net = build_mlp(3, 2, [4], "tanh")
    rank1 = Rank1BNN(net, assign_priors(PriorSpec(default=NormalPrior(loc=1.0)), Rank1BNN.prior_sites(net)),
                     Categorical(), members=2)
    with pytest.raises(ZooInputError, match="ensemble plate.*all_weights"):
        DropoutGuide(rank1.latent_sites())
    with pytest.raises(ZooInputError, match=r"net\.hidden"):
        DropoutGuide(tiny_mean_field(sizes=(3, 1)).latent_sites())


# ------------------------------------------------------------------------------------------- end to end
TOY_DATA = ["data.name=toy_gap", "data.n_train=40"]
FAST = {
    "uci": [*TOY_DATA, "inference.num_steps=30", "inference.batch_size=16"],
    "digits": ["data.test_fraction=0.2", "inference.num_steps=40", "inference.batch_size=64", "net.hidden=[16]"],
}
BASELINE_CONFIGS = {
    "map_uci": ("all_weights", "delta"),
    "map_digits": ("all_weights", "delta"),
    "deep_ensemble_uci": ("deep_ensemble", "delta"),
    "deep_ensemble_hetero_uci": ("deep_ensemble", "delta"),
    "deep_ensemble_digits": ("deep_ensemble", "delta"),
    "mc_dropout_uci": ("all_weights", "dropout"),
    "mc_dropout_digits": ("all_weights", "dropout"),
}


def fast_spec(config: str, *extra: str):
    kind = config.rsplit("_", 1)[1]
    return load_spec(CONFIGS / f"{config}.yaml", [*FAST[kind], "inference.predictive_samples=3", "device=cpu",
                                                  *extra])


@pytest.mark.parametrize("config", list(BASELINE_CONFIGS))
def test_baseline_config_documents_itself_and_trains(config, tmp_path):
    text = (CONFIGS / f"{config}.yaml").read_text()
    assert text.startswith("#") and f"zoo train configs/{config}.yaml" in text
    full = load_spec(CONFIGS / f"{config}.yaml")
    assert (full.model.family, full.guide.name) == BASELINE_CONFIGS[config]
    summary = train(fast_spec(config), tmp_path / "run", progress=False, echo=None)
    metrics = json.loads((summary.run_dir / METRICS_FILE).read_text())
    expected = REGRESSION_KEYS if config.endswith("uci") else CLASSIFICATION_KEYS
    if config == "map_digits":  # a point estimate (every draw the same): its MI is 0 everywhere, so left out
        expected = expected - {"ood_auroc_mi"}
        assert not any(key.startswith("ood_auroc_mi") for key in metrics)
    assert expected <= set(metrics)
    assert all(math.isfinite(v) for v in metrics.values())
    if config.endswith("digits"):
        assert metrics["accuracy"] > 0.3, metrics  # 8 classes: chance is 0.125


@pytest.mark.parametrize("config", ["deep_ensemble_uci", "mc_dropout_uci"])
def test_a_run_reloads_to_the_same_metrics(config, tmp_path):
    summary = train(fast_spec(config), tmp_path / "run", progress=False, echo=None)
    spec, data, posterior = load_run(summary.run_dir)
    again = evaluate(posterior, data, spec.inference.predictive_samples, seed=spec.seed)
    stored = json.loads((summary.run_dir / METRICS_FILE).read_text())
    stored.pop("train_seconds")
    assert again == pytest.approx(stored, rel=1e-6)
    if config.startswith("deep_ensemble"):  # members were trained and are still apart
        guide = load_torch(summary.run_dir / CHECKPOINT_FILE)["guide"]
        _, family, _, _ = prepare(fast_spec(config))  # seeded: the inits the run started from
        trained = guide["loc.out/weight"]
        assert not torch.allclose(trained, family.latent_sites()["out.weight"].init)
        assert not torch.allclose(trained[0], trained[1])


# --------------------------------------------------------------------------------------------- bad input
BAD_INPUT = {
    "members_zero": ("deep_ensemble_uci", ["model.members=0"], [r"model\.members", "greater than 0"]),
    "members_negative": ("deep_ensemble_uci", ["model.members=-2"], [r"model\.members"]),
    "ensemble_with_mean_field_guide": ("deep_ensemble_uci", ["guide.name=mean_field"],
                                       [r"guide\.name", "deep_ensemble", "delta"]),
    "ensemble_with_dropout_guide": ("deep_ensemble_uci", ["guide.name=dropout"], [r"guide\.name", "dropout"]),
    "dropout_rate_zero": ("mc_dropout_uci", ["guide.dropout_rate=0"], [r"guide\.dropout_rate", "greater than 0"]),
    "dropout_rate_one": ("mc_dropout_uci", ["guide.dropout_rate=1"], [r"guide\.dropout_rate", "less than 1"]),
    "dropout_rate_negative": ("mc_dropout_uci", ["guide.dropout_rate=-0.2"], [r"guide\.dropout_rate"]),
    "dropout_on_rank1": ("mc_dropout_uci", ["model.family=rank1", "prior.loc=1.0"],
                         [r"guide\.name", "dropout", "rank1"]),
    "dropout_without_hidden_layer": ("mc_dropout_uci", ["net.hidden=[]"], [r"guide\.name", r"net\.hidden"]),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_baseline_input_exits_2_naming_the_field(case, tmp_path, capsys):
    config, overrides, patterns = BAD_INPUT[case]
    tree = yaml.safe_load((CONFIGS / f"{config}.yaml").read_text())
    assert_input_error(tree, [*FAST["uci"], *overrides], patterns, tmp_path, capsys)
