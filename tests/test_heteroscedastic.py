"""The heteroscedastic Gaussian likelihood: the net outputs a mean and sigma(x) for every input, in every family."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from zoo.errors import ZooInputError
from zoo.likelihoods import HeteroscedasticGaussian, observation
from zoo.pipeline import load_run, prepare, train
from zoo.spec import load_spec


def test_log_likelihood_and_predictive_follow_the_closed_form():
    likelihood = HeteroscedasticGaussian(min_noise=0.01)
    out = torch.tensor([[0.5, -1.0], [2.0, 3.0]])
    y = torch.tensor([1.0, 1.5])
    sigma = torch.log1p(torch.exp(out[:, 1])) + 0.01
    expected = -0.5 * math.log(2 * math.pi) - sigma.log() - (y - out[:, 0]) ** 2 / (2 * sigma**2)
    torch.testing.assert_close(observation(likelihood, out, {}).log_prob(y), expected)
    draws = likelihood.predictive(out.expand(3, 2, 2), {})  # S = 3 draws of B = 2 inputs
    assert draws.loc.shape == draws.scale.shape == (3, 2)
    torch.testing.assert_close(draws.scale[0], sigma)
    assert likelihood.net_outputs(1) == 2 and likelihood.latent_sites() == {}


def test_sigma_never_falls_below_the_floor():
    likelihood = HeteroscedasticGaussian(min_noise=1e-3)
    out = torch.tensor([[0.0, -200.0]])
    assert float(likelihood.scale(out)) == pytest.approx(1e-3)
    assert torch.isfinite(observation(likelihood, out, {}).log_prob(torch.tensor([5.0]))).all()


@pytest.fixture(scope="module")
def noisy_table(tmp_path_factory) -> str:
    """y = x + noise whose sd grows from 0.05 (x = 0) to 1.05 (|x| = 2): a csv in the file: format."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, size=400)
    y = x + rng.normal(size=400) * (0.05 + 0.5 * np.abs(x))
    path = tmp_path_factory.mktemp("hetero") / "hetero.csv"
    path.write_text("x,y\n" + "\n".join(f"{a:.6f},{b:.6f}" for a, b in zip(x, y, strict=True)) + "\n")
    return str(path)


def spec_tree(table: str, **sections) -> dict:
    tree = {"data": {"name": f"file:{table}", "target": "y", "task": "regression"},
            "net": {"hidden": [16], "activation": "tanh"},
            "likelihood": {"noise": "heteroscedastic"},
            "inference": {"num_steps": 30, "batch_size": 64, "lr": 0.01, "predictive_samples": 8},
            "device": "cpu", "seed": 0}
    for key, value in sections.items():  # another inference method replaces the SVI settings
        tree[key] = value if "method" in value else {**tree.get(key, {}), **value}
    return tree


MEMBERS = {
    "mean_field": {},
    "map": {"guide": {"name": "delta"}},
    "mc_dropout": {"guide": {"name": "dropout", "dropout_rate": 0.1}},
    "deep_ensemble": {"model": {"family": "deep_ensemble", "members": 3}, "guide": {"name": "delta"}},
    "rank1": {"model": {"family": "rank1", "members": 2}, "guide": {"name": "mixture"},
              "prior": {"name": "normal", "loc": 1.0, "scale": 0.5}},
    "hmc": {"inference": {"method": "hmc", "num_chains": 2, "warmup_steps": 6, "num_samples": 4,
                          "predictive_samples": 8}},
}


@pytest.mark.parametrize("member", list(MEMBERS))
def test_every_family_trains_with_a_two_output_net_and_predicts_an_input_dependent_sigma(noisy_table, tmp_path,
                                                                                      member):
    spec = load_spec(spec_tree(noisy_table, **MEMBERS[member]))
    summary = train(spec, tmp_path / "run", progress=False, echo=None)
    assert math.isfinite(summary.metrics["test_ll"]) and math.isfinite(summary.metrics["rmse"])
    _, data, posterior = load_run(summary.run_dir)
    assert not posterior.family.likelihood.latent_sites()
    prediction = posterior.predict(data.x_test, 4)
    assert prediction.loc.shape == prediction.scale.shape == (prediction.loc.shape[0], len(data.x_test))
    assert float(prediction.scale.std()) > 0  # sigma depends on the input


def test_a_map_net_learns_where_the_noise_is(noisy_table, tmp_path):
    tree = spec_tree(noisy_table, guide={"name": "delta"},
                     inference={"num_steps": 1500, "batch_size": None, "lr": 0.01})
    summary = train(load_spec(tree), tmp_path / "run", progress=False, echo=None)
    _, data, posterior = load_run(summary.run_dir)
    x = data.inputs_in_original_units(data.x_test)[:, 0]
    sigma = posterior.predict(data.x_test, 1).scale[0] * data.y_std  # original units
    quiet, loud = sigma[x.abs() < 0.4].mean(), sigma[x.abs() > 1.6].mean()
    assert float(quiet) < 0.3 and float(loud) > 0.6  # true sd: 0.05-0.25 and 0.85-1.05


def test_the_net_has_two_outputs_per_target(noisy_table):
    _, family, _, _ = prepare(load_spec(spec_tree(noisy_table)))
    assert family.net.out.out_features == 2


def test_the_subnetwork_laplace_refuses_it(noisy_table):
    tree = spec_tree(noisy_table, model={"family": "subnetwork"}, inference={"method": "laplace"})
    with pytest.raises(ZooInputError, match="likelihood.noise: .*heteroscedastic net has two outputs"):
        load_spec(tree)

