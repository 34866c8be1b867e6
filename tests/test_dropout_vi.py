"""Dropout as variational inference beyond MC dropout: Gaussian dropout's mask moments, concrete dropout's relaxed
mask, the entropy its ELBO carries, and a learned rate that trains, saves and reloads."""

from __future__ import annotations

import math

import pyro
import pytest
import torch

from guides.dropout import DropoutGuide
from tests.test_baselines import tiny_mean_field
from zoo.errors import ZooInputError
from zoo.inference.elbo import LazyTraceMeanField_ELBO
from zoo.pipeline import load_run, train
from zoo.spec import load_spec


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_gaussian_dropout_masks_match_the_bernoulli_masks_mean_and_variance(p):
    guide = DropoutGuide(tiny_mean_field(sizes=(3, 20_000, 4, 1)).latent_sites(), dropout_rate=p, mask="gaussian")
    torch.manual_seed(0)
    masks = guide.unit_mask("hidden1.weight").reshape(-1)  # 20,000 input units
    assert float(masks.mean()) == pytest.approx(1.0, abs=0.02)
    assert float(masks.var()) == pytest.approx(p / (1 - p), rel=0.03)  # Bernoulli z / (1 - p): p / (1 - p)


def test_concrete_masks_drop_at_rate_p_and_keep_the_mean():
    p = 0.2
    guide = DropoutGuide(tiny_mean_field(sizes=(3, 50_000, 4, 1)).latent_sites(), dropout_rate=p, mask="concrete")
    torch.manual_seed(0)
    masks = guide.unit_mask("hidden1.weight").reshape(-1).detach()
    kept = masks * (1 - p)  # 1 - z, z the relaxed drop indicator
    assert float((kept < 0.5).float().mean()) == pytest.approx(p, abs=0.01)
    assert float(masks.mean()) == pytest.approx(1.0, abs=0.02)
    assert float(((kept > 0.05) & (kept < 0.95)).float().mean()) < 0.1  # temperature 0.1: nearly hard


def test_a_concrete_draw_carries_minus_k_times_the_mask_entropy():
    p = 0.3
    family = tiny_mean_field(sizes=(3, 8, 6, 1))
    guide = DropoutGuide(family.latent_sites(), dropout_rate=p, mask="concrete")
    q = guide.distribution("out.weight")  # [1, 6]: K = 6 input units
    entropy = -(p * math.log(p) + (1 - p) * math.log(1 - p))
    assert float(q.log_prob(q.sample()).detach()) == pytest.approx(-6 * entropy, rel=1e-5)
    # and the ELBO passes a gradient to every learned rate (through the masks and that entropy)
    x, y = torch.randn(10, 3), torch.randn(10)
    elbo = LazyTraceMeanField_ELBO()
    loss = elbo.differentiable_loss(family.model, guide, x, y, None)
    loss.backward()
    assert all(guide.rate_logit[k].grad is not None and guide.rate_logit[k].grad != 0 for k in guide.rate_logit)


def test_concrete_dropout_learns_its_rates_and_a_run_reloads_them(tmp_path):
    spec = load_spec({"data": {"name": "toy_gap", "n_train": 40}, "net": {"hidden": [20, 20]},
                      "guide": {"name": "dropout", "dropout": "concrete", "dropout_rate": 0.1},
                      "likelihood": {"noise": 0.1}, "device": "cpu", "seed": 0,
                      "inference": {"num_steps": 300, "batch_size": None, "lr": 0.02, "predictive_samples": 20}})
    summary = train(spec, tmp_path / "run", progress=False, echo=None)
    _, _, posterior = load_run(summary.run_dir)
    rates = posterior.guide.rates()
    assert set(rates) == {"hidden1.weight", "out.weight"}
    assert all(r != pytest.approx(0.1, abs=1e-3) for r in rates.values())  # trained away from the initial rate
    assert math.isfinite(summary.metrics["test_ll"])


def test_an_unknown_dropout_mask_is_refused():
    with pytest.raises(ZooInputError, match="use bernoulli"):
        DropoutGuide(tiny_mean_field().latent_sites(), mask="alpha")
    with pytest.raises(ZooInputError, match="guide.dropout"):
        load_spec({"data": {"name": "toy_gap"}, "guide": {"name": "dropout", "dropout": "alpha"}})
    pyro.clear_param_store()
