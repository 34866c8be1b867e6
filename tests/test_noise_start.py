"""Where a learned Gaussian noise starts: the inference method's start where ``likelihood.noise_prior.init`` leaves
it open (SVI and Laplace's MAP phase low where calibration rows set the predictive's noise afterwards, else and for
the SGD-stepped methods the prior's median), the spec's value where set."""

import math

import pytest
import torch

from zoo import registry
from zoo.data import load_dataset
from zoo.errors import ZooInputError
from zoo.likelihoods.gaussian import LOW_NOISE_START
from zoo.pipeline import build, build_likelihood
from zoo.spec import load_spec

TOY = {"data": {"name": "toy_gap", "n_train": 40}, "net": {"hidden": [4]}}
HELD_OUT = {"data": {"name": "toy_gap", "n_train": 40, "calibration_fraction": 0.25}, "net": {"hidden": [4]}}
MEDIAN = math.exp(-1.0)  # the noise prior's, LogNormal(-1, 1)


def noise_start(tree: dict) -> float:
    """The starting value of the noise site of the family the spec builds."""
    spec = load_spec(tree)
    family, _ = build(spec, load_dataset(spec.data, spec.seed))
    return float(family.latent_sites()["noise_scale"].init)


@pytest.mark.parametrize("member, with_rows, without_rows", [
    ("mean_field", LOW_NOISE_START, MEDIAN),
    ("map", LOW_NOISE_START, MEDIAN),
    ("swag", MEDIAN, MEDIAN),
    ("sgld", MEDIAN, MEDIAN),
])
def test_the_method_chooses_where_an_open_noise_starts(member, with_rows, without_rows):
    assert noise_start({**HELD_OUT, "member": member}) == pytest.approx(with_rows)
    assert noise_start({**TOY, "member": member}) == pytest.approx(without_rows)


@pytest.mark.parametrize("inference, rows, expected", [
    ({}, True, LOW_NOISE_START),
    ({}, False, None),
    ({"noise_by": "evidence"}, True, None),
    ({"predictive": "nn"}, True, None),
])
def test_laplace_starts_its_map_phase_low_where_the_rows_set_the_noise(inference, rows, expected):
    """(The subnetwork family fits its MAP while it is built, so the method's answer is read here.)"""
    spec = load_spec({**TOY, "member": "kfac_laplace", "inference": inference})
    likelihood = build_likelihood(spec.likelihood, load_dataset(spec.data, spec.seed))
    assert registry.method_of(spec).noise_start(spec.inference, rows, likelihood) == expected


def test_a_fit_that_keeps_its_own_noise_starts_at_the_median():
    """noise_by: fit predicts with the fit's σ, so the fit starts it where the prior does, rows or not."""
    tree = {**HELD_OUT, "member": "mean_field", "inference": {"noise_by": "fit"}}
    assert noise_start(tree) == pytest.approx(MEDIAN)


def test_the_spec_s_start_wins_and_the_prior_is_untouched():
    tree = {**HELD_OUT, "member": "mean_field", "likelihood": {"noise_prior": {"init": 0.2, "loc": -2.0}}}
    spec = load_spec(tree)
    family, _ = build(spec, load_dataset(spec.data, spec.seed))
    assert float(family.latent_sites()["noise_scale"].init) == pytest.approx(0.2)
    prior = family.likelihood._noise_prior(torch.zeros(()))
    assert float(prior.loc) == -2.0 and float(prior.scale) == 1.0


def test_a_start_that_is_no_scale_is_refused():
    with pytest.raises(ZooInputError, match="noise_prior.init"):
        load_spec({**TOY, "likelihood": {"noise_prior": {"init": 0.0}}})


def test_the_guide_starts_at_the_low_noise():
    """Mean-field's guide for the noise starts its location at log(LOW_NOISE_START): the start reaches the fit."""
    spec = load_spec({**HELD_OUT, "member": "mean_field"})
    _, guide = build(spec, load_dataset(spec.data, spec.seed))
    loc = guide.unconstrained_loc("noise_scale").detach()
    assert float(loc) == pytest.approx(math.log(LOW_NOISE_START), abs=1e-5)
