"""A point estimate's prior scale factor (``inference.prior_scale_factor``): every prior widened about its centre by
one factor, given or, left null, chosen on the calibration rows by a whole run at each of
:data:`~zoo.sections.PRIOR_SCALE_FACTORS`; the kept run is the run given that factor by hand, its checkpoint carries
the factor and a reloaded run holds it. Dropout VI's draws are point values too, so its prior is a weight decay and
its factor is chosen after its rate. A Gaussian guide over the weights (mean-field, Bayes by Backprop's, the Gaussian
autoguides) fits its spread against the same priors, and chooses their factor after its start; a flow keeps the
spec's priors. SWAG's
SGD and SG-MCMC's chains meet the prior as a weight decay too: their factor is chosen after their lr, each factor
climbing on its own."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import choice_in_log, different_entries
from zoo.errors import ZooInputError
from zoo.inference import lr_choice
from zoo.inference.draws import SAMPLES_FILE
from zoo.inference.swag import SWAG, SWAG_FILE
from zoo.models.base import PRIOR_SCALE_FACTOR
from zoo.pipeline import load_run, prepare, train
from zoo.priors import NormalPrior, ScaleMixturePrior
from zoo.priors.gsm import GaussianScaleMixturePrior
from zoo.runs import CHECKPOINT_FILE, load_torch, recorded_choices
from zoo.sections import PRIOR_SCALE_FACTORS
from zoo.spec import load_spec

FACTOR = "inference.prior_scale_factor"


def map_spec(*overrides: str):
    base = {"data": {"name": "toy_gap", "n_train": 60, "calibration_fraction": 0.25}, "net": {"hidden": [16]},
            "guide": {"name": "delta"}, "likelihood": {"name": "gaussian", "noise": 0.3}, "device": "cpu",
            "seed": 0, "inference": {"num_steps": 30, "batch_size": 16, "lr": 0.01, "predictive_samples": 4,
                                     "checkpoint_every": 10}}
    return load_spec(base, list(overrides))


def test_a_widened_prior_multiplies_its_spread_about_its_centre():
    normal = NormalPrior(name="normal", loc=1.0, scale=0.5)
    assert normal.widened(3.0) == NormalPrior(name="normal", loc=1.0, scale=1.5)
    assert normal.widened(1.0) == normal
    mixture = ScaleMixturePrior(name="scale_mixture", pi=0.25, sigma1=1.0, sigma2=0.01).widened(10.0)
    assert (mixture.pi, mixture.sigma1, mixture.sigma2) == (0.25, 10.0, pytest.approx(0.1))
    gsm = GaussianScaleMixturePrior(name="gsm", loc=1.0, scale=0.1, log_scale_sd=0.5).widened(2.0)
    assert (gsm.loc, gsm.scale, gsm.log_scale_sd) == (1.0, 0.2, 0.5)  # tau's scale; the spread of log tau stays


def test_a_null_factor_is_chosen_on_the_calibration_rows_and_the_kept_run_is_the_run_given_that_factor(tmp_path):
    lines: list[str] = []
    chosen = train(map_spec(), tmp_path / "chosen", progress=False, echo=lines.append)
    factor, scores, _ = choice_in_log(lines, FACTOR)
    assert sorted(scores) == sorted(PRIOR_SCALE_FACTORS) and factor == min(scores, key=scores.get)
    saved = load_torch(chosen.run_dir / CHECKPOINT_FILE)
    assert saved.get("hyperparameters", {}) == ({} if factor == 1.0 else {PRIOR_SCALE_FACTOR: torch.tensor(
        factor, dtype=torch.float64)})
    assert recorded_choices(chosen.run_dir)[FACTOR] == factor
    _, _, posterior = load_run(chosen.run_dir)  # its spec's factor is null: the checkpoint restores the choice
    assert posterior.family.prior_scale_factor == factor
    by_hand = train(map_spec(f"{FACTOR}={factor}"), tmp_path / "by_hand", progress=False, echo=None)
    hand = load_torch(by_hand.run_dir / CHECKPOINT_FILE)
    assert different_entries(hand["guide"], saved["guide"]) == [] and hand["losses"] == saved["losses"]


def test_each_factor_runs_under_its_widened_prior_and_the_rows_keep_the_best(tmp_path, monkeypatch):
    """The calibration rows rank the runs: made to favour the widest prior, the fit keeps it; a widened run's prior
    is the spec's Normal at the factor times its scale."""
    import zoo.inference.svi as svi

    seen: list[float] = []
    real = svi.calibration_score

    def favour_wide(posterior, *args):
        scale = float(posterior.family.priors()["hidden0.weight"].base_dist.scale.reshape(-1)[0])
        seen.append(scale)
        return -scale, real(posterior, *args)[1]

    monkeypatch.setattr(svi, "calibration_score", favour_wide)
    fitted = train(map_spec(), tmp_path / "wide", progress=False, echo=None)
    assert seen == pytest.approx(list(PRIOR_SCALE_FACTORS))  # the spec's N(0, 1), then 3 and 10
    assert recorded_choices(fitted.run_dir)[FACTOR] == max(PRIOR_SCALE_FACTORS)


def test_a_dropout_nets_prior_is_its_weight_decay_too_and_its_factor_is_chosen_after_its_rate(tmp_path):
    lines: list[str] = []
    fitted = train(map_spec("guide.name=dropout"), tmp_path / "dropout", progress=False, echo=lines.append)
    factor, scores, _ = choice_in_log(lines, FACTOR)
    rate, _, _ = choice_in_log(lines, "guide.dropout_rate")
    assert sorted(scores) == sorted(PRIOR_SCALE_FACTORS) and factor == min(scores, key=scores.get)
    assert recorded_choices(fitted.run_dir) == {"guide.dropout_rate": rate, FACTOR: factor}
    assert [x for x in lines if "chosen on" in x][-1].startswith(f"svi: {FACTOR} ")


@pytest.mark.parametrize("guide", [["guide.name=mean_field"], ["guide.name=mean_field", "prior.name=scale_mixture"],
                                   ["guide.name=auto", "guide.auto=normal"]], ids=["mean_field", "bbb", "auto_normal"])
def test_a_gaussian_guide_chooses_the_factor_after_its_start_and_keeps_the_run_given_both_by_hand(tmp_path, guide):
    """Mean-field's spread is fitted against the prior, which N(0, 1) can make too narrow for the net: its factor is
    chosen after the guide's start, on the rows, and the kept run is the run given the start and the factor by
    hand."""
    lines: list[str] = []
    chosen = train(map_spec(*guide), tmp_path / "chosen", progress=False, echo=lines.append)
    factor, scores, _ = choice_in_log(lines, FACTOR)
    rho, _, _ = choice_in_log(lines, "guide.init_rho")
    assert sorted(scores) == sorted(PRIOR_SCALE_FACTORS) and factor == min(scores, key=scores.get)
    assert recorded_choices(chosen.run_dir) == {"guide.init_rho": rho, FACTOR: factor}
    saved = load_torch(chosen.run_dir / CHECKPOINT_FILE)
    _, _, posterior = load_run(chosen.run_dir)
    assert posterior.family.prior_scale_factor == factor
    by_hand = train(map_spec(*guide, f"guide.init_rho={rho}", f"{FACTOR}={factor}"), tmp_path / "by_hand",
                    progress=False, echo=None)
    hand = load_torch(by_hand.run_dir / CHECKPOINT_FILE)
    assert different_entries(hand["guide"], saved["guide"]) == [] and hand["losses"] == saved["losses"]


def test_no_factor_is_chosen_for_a_flow_or_without_calibration_rows(tmp_path):
    for overrides, name in ((["guide.name=auto", "guide.auto=iaf"], "iaf"),
                            (["data.calibration_fraction=0"], "no_rows"), ([f"{FACTOR}=2.0"], "given")):
        lines: list[str] = []
        fitted = train(map_spec(*overrides), tmp_path / name, progress=False, echo=lines.append)
        assert not any(FACTOR in x for x in lines) and FACTOR not in recorded_choices(fitted.run_dir)
    _, _, posterior = load_run(tmp_path / "given")
    assert posterior.family.prior_scale_factor == 2.0
    assert float(posterior.family.priors()["hidden0.weight"].base_dist.scale.reshape(-1)[0]) == 2.0


def test_a_factor_for_a_family_without_weight_priors_to_widen_is_refused(tmp_path):
    spec = map_spec("model.family=rank1", "guide.name=mixture", "prior.loc=1.0", f"{FACTOR}=3.0")
    with pytest.raises(ZooInputError, match="inference.prior_scale_factor: got 3"):
        train(spec, tmp_path / "rank1", progress=False, echo=None)


SAMPLERS = {"swag": ({"epochs": 2, "pretrain_epochs": 2, "rank": 2}, SWAG_FILE),
            "sgld": ({"num_chains": 2, "epochs": 4, "explore_lr": 0.01}, SAMPLES_FILE)}


def sampler_spec(method: str, *overrides: str):
    settings, _ = SAMPLERS[method]
    base = {"data": {"name": "toy_gap", "n_train": 60, "calibration_fraction": 0.25}, "net": {"hidden": [8]},
            "likelihood": {"name": "gaussian", "noise": 0.3}, "device": "cpu", "seed": 0,
            "inference": {"method": method, "batch_size": 16, "lr": 0.01, "predictive_samples": 4, **settings}}
    return load_spec(base, list(overrides))


@pytest.mark.parametrize("method", SAMPLERS)
def test_swag_and_sgmcmc_choose_the_factor_after_their_lr_and_keep_the_run_given_it_by_hand(tmp_path, method):
    """Their lr given, the factor alone is chosen: a run at each factor, the best kept exactly as the run given it by
    hand, its file carrying the factor, so that the loaded and the resumed run hold it."""
    lines: list[str] = []
    chosen = train(sampler_spec(method), tmp_path / "chosen", progress=False, echo=lines.append)
    scored = [x for x in lines if "on the calibration rows" in x and "chosen" not in x]
    assert [x.split(": ")[1] for x in scored] == ["lr 0.01"] + [f"lr 0.01, prior_scale_factor {f:g}"
                                                                 for f in PRIOR_SCALE_FACTORS[1:]]
    scores = dict(zip(PRIOR_SCALE_FACTORS, (float(x.split()[-5]) for x in scored), strict=True))
    factor = recorded_choices(chosen.run_dir)[FACTOR]
    assert recorded_choices(chosen.run_dir) == {FACTOR: factor} and scores[factor] == min(scores.values())  # (4 digits)
    assert not any("climb" in x and "earlier run" in x for x in lines)  # a climb under one prior serves no other
    _, file = SAMPLERS[method]
    saved = load_torch(chosen.run_dir / file)
    assert saved.get("hyperparameters", {}) == ({} if factor == 1.0 else {PRIOR_SCALE_FACTOR: torch.tensor(
        factor, dtype=torch.float64)})
    _, _, posterior = load_run(chosen.run_dir)
    assert posterior.family.prior_scale_factor == factor
    lines.clear()  # resumed, the finished run is read back with its factor: nothing is chosen again
    train(sampler_spec(method), tmp_path / "chosen", resume=True, progress=False, echo=lines.append)
    assert not any("on the calibration rows" in x for x in lines)
    assert load_run(chosen.run_dir)[2].family.prior_scale_factor == factor
    by_hand = train(sampler_spec(method, f"{FACTOR}={factor}"), tmp_path / "by_hand", progress=False, echo=None)
    hand = load_torch(by_hand.run_dir / file)
    key = "moments" if method == "swag" else "draws"
    assert different_entries(hand[key], saved[key]) == []


def test_a_samplers_kept_factor_is_its_familys_once_the_choice_ends_and_reloads_with_it(tmp_path, monkeypatch):
    """Made to favour the narrowest prior after a wider one ran last, the kept run's factor (1) is the family's when
    the fit returns; made to favour the widest, the reloaded run's priors are the spec's times 10."""
    real = lr_choice.calibration_score
    for name, sign in (("narrow", 1.0), ("wide", -1.0)):
        def by_width(posterior, *args, sign=sign):
            return sign * posterior.family.prior_scale_factor, real(posterior, *args)[1]

        monkeypatch.setattr(lr_choice, "calibration_score", by_width)
        spec = sampler_spec("swag")
        data, family, guide, _ = prepare(spec)
        SWAG().fit(family, guide, data, spec.inference, 0, run_dir=tmp_path / name, progress=False)
        kept = min(PRIOR_SCALE_FACTORS) if sign > 0 else max(PRIOR_SCALE_FACTORS)
        assert family.prior_scale_factor == kept
        fresh = prepare(spec)[1]
        SWAG().load(fresh, guide, spec.inference, tmp_path / name, torch.device("cpu"))
        assert float(fresh.priors()["hidden0.weight"].base_dist.scale.reshape(-1)[0]) == kept
