"""Where a learned Gaussian noise starts: the inference method's start where ``likelihood.noise_prior.init`` leaves
it open (SVI and Laplace's MAP phase low where calibration rows set the predictive's noise afterwards, else and for
the SGD-stepped methods the prior's median), the spec's value where set; where the method's start is taken, the fit
also runs the prior's median and keeps the start the calibration rows score better."""

import math

import pytest
import torch

import zoo
from guides.auto import AutoGuideSpec
from tests.conftest import choice_in_log, different_entries
from zoo import registry
from zoo.data import load_dataset
from zoo.errors import ZooInputError
from zoo.likelihoods.gaussian import LOW_NOISE_START
from zoo.pipeline import build, build_likelihood, train
from zoo.runs import CHECKPOINT_FILE, load_torch
from zoo.sections import LR_CANDIDATES
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


# ------------------------------------------------------------------ the start chosen on the calibration rows
def open_start(tree: dict):
    spec = load_spec(tree)
    family, _ = build(spec, load_dataset(spec.data, spec.seed))
    return family.likelihood.open_start()


def test_the_method_s_start_is_weighed_against_the_median_only_where_it_took_the_open_start():
    assert open_start({**HELD_OUT, "member": "mean_field"}) == (
        "likelihood.noise_prior.init", "noise_scale", pytest.approx(LOW_NOISE_START),
        (pytest.approx(LOW_NOISE_START), pytest.approx(MEDIAN)))
    assert open_start({**TOY, "member": "mean_field"}) is None  # no rows to choose on: the median, unchosen
    assert open_start({**HELD_OUT, "member": "swag"}) is None  # SWAG keeps the median
    assert open_start({**HELD_OUT, "member": "mean_field",
                       "likelihood": {"noise_prior": {"init": LOW_NOISE_START}}}) is None  # the spec's start


def chosen_start_spec(*overrides: str):
    base = {**HELD_OUT, "member": "mean_field", "device": "cpu", "seed": 0,
            "inference": {"num_steps": 30, "batch_size": 16, "lr": 0.01, "predictive_samples": 8,
                          "checkpoint_every": 10}}
    return load_spec(base, list(overrides))


def test_the_start_is_chosen_on_the_calibration_rows_and_the_kept_run_is_the_run_given_that_start(tmp_path):
    """Both starts' whole runs are scored on the calibration rows; the fit keeps the better as it ended, which is the
    run given that start by hand step for step, and its checkpoint records the choice."""
    lines = []
    chosen = train(chosen_start_spec(), tmp_path / "chosen", progress=False, echo=lines.append)
    start, scores, _ = choice_in_log(lines, "likelihood.noise_prior.init")
    assert sorted(scores) == pytest.approx([LOW_NOISE_START, MEDIAN], rel=1e-5)
    assert start == min(scores, key=scores.get)
    saved = load_torch(chosen.run_dir / CHECKPOINT_FILE)
    kept = saved["chosen_settings"]["likelihood.noise_prior.init"]
    assert kept == pytest.approx(start, rel=1e-5) and len(saved["losses"]) == 30
    by_hand = train(chosen_start_spec(f"likelihood.noise_prior.init={kept!r}"), tmp_path / "by_hand",
                    progress=False, echo=None)
    hand = load_torch(by_hand.run_dir / CHECKPOINT_FILE)
    assert different_entries(hand["guide"], saved["guide"]) == [] and hand["losses"] == saved["losses"]


@pytest.mark.parametrize("auto", ["normal", "low_rank_mvn"])
def test_an_autoguide_moves_a_site_s_location_in_place(auto):
    """The choice moves the noise's location between runs of one optimiser, so the autoguide's parameters stay the
    same objects; its other sites keep their locations."""
    spec = load_spec({**HELD_OUT, "member": "auto_normal", "guide": {"name": "auto", "auto": auto}})
    _, guide = build(spec, load_dataset(spec.data, spec.seed))
    before = {n: p for n, p in guide.named_parameters()}
    weights = {n: v for n, v in guide.point_estimate().items() if n != "noise_scale"}
    assert guide.locates("noise_scale")
    assert guide.init_from({"noise_scale": torch.tensor(0.25)}) == ["noise_scale"]
    assert dict(guide.named_parameters()) == before
    moved = guide.point_estimate()
    assert float(moved["noise_scale"]) == pytest.approx(0.25)
    assert all(torch.equal(moved[n], v) for n, v in weights.items())


def test_an_iaf_guide_has_no_location_to_move():
    spec = load_spec({**HELD_OUT, "member": "auto_normal", "guide": {"name": "auto", "auto": "iaf"}})
    _, guide = build(spec, load_dataset(spec.data, spec.seed))
    assert isinstance(spec.guide, AutoGuideSpec) and not guide.locates("noise_scale")
    assert guide.init_from({"noise_scale": torch.tensor(0.25)}) == []


def test_a_laplace_member_s_map_phase_is_the_map_member_s_fit():
    """Where the calibration rows set the predictive's σ, the MAP phase scores its candidate runs (lr, noise start)
    at that σ, as the MAP member does, not at the σ each run learned (which always ranks the low start last): the
    two choose alike and fit the same net."""
    torch.manual_seed(0)
    x = torch.randn(120, 3)
    y = 2 * x[:, :1] + torch.sin(x[:, 1:2]) + 0.1 * torch.randn(120, 1)
    fitted, logs = {}, {}
    for member in ("map", "kfac_laplace"):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        logs[member] = []
        bnn = zoo.BNN(net, member=member, likelihood="gaussian", seed=0)
        bnn.fit((x[:80], y[:80]), val=(x[80:], y[80:]), epochs=2, progress=False, echo=logs[member].append)
        family = bnn.posterior.family
        fitted[member] = family.map_values if member != "map" else bnn.posterior.guide.point_estimate()
    assert different_entries(fitted["map"], fitted["kfac_laplace"]) == []
    for setting in ("starting lr", "likelihood.noise_prior.init"):
        assert choice_in_log(logs["map"], setting)[:2] == choice_in_log(logs["kfac_laplace"], setting)[:2]


def test_the_start_is_chosen_jointly_with_the_lr_and_the_kept_run_is_the_run_given_both(tmp_path):
    """With the lr chosen too, the other start runs at every starting lr: the kept run is the best of them all on the
    calibration rows, and it is the run given that lr and start by hand, step for step."""
    lines = []
    chosen = train(chosen_start_spec("inference.lr=null"), tmp_path / "chosen", progress=False, echo=lines.append)
    start, scores, _ = choice_in_log(lines, "likelihood.noise_prior.init")
    lr_kept, lr_scores, _ = choice_in_log(lines, "starting lr")
    assert sorted(lr_scores) == pytest.approx(LR_CANDIDATES)
    medians = {lr: score for (value, lr), score in scores.items() if value == pytest.approx(MEDIAN, rel=1e-5)}
    assert sorted(medians) == pytest.approx(LR_CANDIDATES)
    runs = {(LOW_NOISE_START, lr_kept): lr_scores[lr_kept], **{(MEDIAN, lr): v for lr, v in medians.items()}}
    best = min(runs, key=runs.get)  # the low start's best lr against the median's at each (exact: the log rounds)
    saved = load_torch(chosen.run_dir / CHECKPOINT_FILE)
    assert (start, saved["chosen_lr"]) == (pytest.approx(best[0], rel=1e-5), pytest.approx(best[1]))
    by_hand = train(chosen_start_spec(f"inference.lr={saved['chosen_lr']!r}", "inference.lr_hold=0.75",
                                      "inference.lr_decay_to=0.1", f"likelihood.noise_prior.init={best[0]!r}"),
                    tmp_path / "by_hand", progress=False, echo=None)
    hand = load_torch(by_hand.run_dir / CHECKPOINT_FILE)
    assert different_entries(hand["guide"], saved["guide"]) == [] and hand["losses"] == saved["losses"]
