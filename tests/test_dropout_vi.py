"""Dropout as variational inference beyond MC dropout: Gaussian dropout's mask moments, concrete dropout's relaxed
mask, the entropy its ELBO carries, a learned rate that trains, saves and reloads, and a rate chosen on the
calibration rows."""

from __future__ import annotations

import math

import pyro
import pytest
import torch

import zoo.inference.svi as svi
from guides.base import SettingChoice
from guides.dropout import DEFAULT_DROPOUT_RATE, DROPOUT_RATE_CANDIDATES, DROPOUT_RATES_BELOW, DropoutGuide
from tests.conftest import choice_in_log, crash_in_the_second_candidate, different_entries
from tests.test_baselines import tiny_mean_field
from zoo.errors import ZooInputError
from zoo.inference.elbo import LazyTraceMeanField_ELBO
from zoo.pipeline import load_run, train
from zoo.runs import CHECKPOINT_FILE, load_torch
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


# ------------------------------------------------------------------ a null rate, chosen on the calibration rows
def chosen_rate_spec(*overrides: str):
    base = {"data": {"name": "toy_gap", "n_train": 60, "calibration_fraction": 0.25}, "net": {"hidden": [16]},
            "guide": {"name": "dropout"}, "device": "cpu", "seed": 0,
            "inference": {"num_steps": 30, "batch_size": 16, "lr": 0.01, "predictive_samples": 8,
                          "checkpoint_every": 10}}
    return load_spec(base, list(overrides))


@pytest.mark.parametrize("mask", ["bernoulli", "concrete"])
def test_a_null_rate_is_chosen_on_the_calibration_rows_and_the_kept_run_is_the_run_given_that_rate(tmp_path, mask):
    """Each candidate rate's whole run is scored on the calibration rows; the fit keeps the best as it ended (the run
    given that rate by hand, step for step), its checkpoint carries the rate, and the run reloads with it. Concrete
    dropout's rate is where its learned rates start."""
    lines = []
    chosen = train(chosen_rate_spec(f"guide.dropout={mask}"), tmp_path / "chosen", progress=False,
                   echo=lines.append)
    rate, scores, _ = choice_in_log(lines, "guide.dropout_rate")
    assert_reached_below_only_from_the_lowest(scores, lines)
    assert rate == min(scores, key=scores.get)
    saved = load_torch(chosen.run_dir / CHECKPOINT_FILE)
    assert saved["guide"]["_extra_state"] == {"dropout_rate": rate} and len(saved["losses"]) == 30
    _, _, posterior = load_run(chosen.run_dir)  # its spec's rate is null: the state restores the choice
    assert posterior.guide.dropout_rate == rate
    if mask == "bernoulli":
        assert posterior.guide.rates() == dict.fromkeys(posterior.guide.dropped, rate)
    by_hand = train(chosen_rate_spec(f"guide.dropout={mask}", f"guide.dropout_rate={rate}"),
                    tmp_path / "by_hand", progress=False, echo=None)
    hand = load_torch(by_hand.run_dir / CHECKPOINT_FILE)
    assert different_entries(hand["guide"], saved["guide"]) == [] and hand["losses"] == saved["losses"]


def assert_reached_below_only_from_the_lowest(scores: dict[float, float], lines: list[str]) -> None:
    """The rates run are the grid and the first k rates below it, each run only while the lowest run before it
    scored best among the runs before it; the log says why each ran."""
    below = [r for r in DROPOUT_RATES_BELOW if r in scores]
    assert sorted(scores) == sorted(DROPOUT_RATE_CANDIDATES + tuple(below))
    assert below == list(DROPOUT_RATES_BELOW[:len(below)])
    for i, lowest in enumerate([min(DROPOUT_RATE_CANDIDATES), *below]):
        run_so_far = {r: v for r, v in scores.items() if r >= lowest}
        if i < len(below):  # it scored best, so the next rate ran
            assert min(run_so_far, key=run_so_far.get) == lowest
        elif i < len(DROPOUT_RATES_BELOW):  # the ladder stopped: it did not
            assert min(run_so_far, key=run_so_far.get) != lowest
    assert sum("the edge of the values run, scored best" in x for x in lines) == len(below)


def test_the_rate_reaches_below_the_grid_one_rate_at_a_time_while_the_lowest_scores_best(tmp_path, monkeypatch):
    """Made to favour low rates, the choice runs each rate below the grid and keeps the lowest; made to favour
    high ones, it runs the grid alone."""
    real = svi.calibration_score
    for name, sign in (("low", 1.0), ("high", -1.0)):
        def by_rate(posterior, *args, sign=sign):
            return sign * posterior.guide.dropout_rate, real(posterior, *args)[1]

        monkeypatch.setattr(svi, "calibration_score", by_rate)
        lines: list[str] = []
        fitted = train(chosen_rate_spec(), tmp_path / name, progress=False, echo=lines.append)
        rate, scores, _ = choice_in_log(lines, "guide.dropout_rate")
        expected = DROPOUT_RATE_CANDIDATES + (DROPOUT_RATES_BELOW if sign > 0 else ())
        assert sorted(scores) == sorted(expected) and rate == (min(expected) if sign > 0 else max(expected))
        assert_reached_below_only_from_the_lowest(scores, lines)
        assert load_run(fitted.run_dir)[2].guide.dropout_rate == rate


def test_a_ladder_interrupted_below_the_grid_resumes_there_and_ends_as_the_uninterrupted_fit(tmp_path, monkeypatch):
    """Made to favour low rates, a crash in the run at 0.002 (the fifth, after the grid's four; step 25, its
    checkpoint at 20): the resumed fit scores the grid's finished runs again without a step, reaches 0.002 from its
    checkpoint and 0.001 after it, and keeps what the whole fit kept."""
    real = svi.calibration_score
    monkeypatch.setattr(svi, "calibration_score",
                        lambda posterior, *args: (posterior.guide.dropout_rate, real(posterior, *args)[1]))
    whole = train(chosen_rate_spec(), tmp_path / "whole", progress=False, echo=None)
    out = tmp_path / "crashed"
    seen = crash_in_the_second_candidate(monkeypatch, 25, nth=len(DROPOUT_RATE_CANDIDATES) + 1)
    with pytest.raises(RuntimeError, match="simulated"):
        train(chosen_rate_spec(), out, progress=False, echo=None)
    assert (out / svi.LR_CHOICE_DIR / "dropout_rate0.002" / CHECKPOINT_FILE).exists()
    seen.clear()
    lines: list[str] = []
    train(chosen_rate_spec(), out, resume=True, progress=False, echo=lines.append)
    rate, scores, _ = choice_in_log(lines, "guide.dropout_rate")
    assert rate == min(DROPOUT_RATES_BELOW) and sorted(scores) == sorted(DROPOUT_RATE_CANDIDATES + DROPOUT_RATES_BELOW)
    # 0.002's last 10 steps, 0.001's 30, the noise's other start's and the prior's two other scales'; the grid's none
    assert len(seen) == 10 + 30 + 30 + 2 * 30
    a, b = load_torch(out / CHECKPOINT_FILE), load_torch(whole.run_dir / CHECKPOINT_FILE)
    assert different_entries(a["guide"], b["guide"]) == [] and a["losses"] == b["losses"]


def test_the_rate_is_chosen_at_the_chosen_lr_with_the_lr_runs_best_among_its_candidates(tmp_path):
    """With the lr left to choose too: the lr first, at the default rate, then the rate at that lr; the lr's kept
    run is the default rate's candidate, so no run is repeated."""
    lines = []
    train(chosen_rate_spec("inference.lr=null"), tmp_path / "both", progress=False, echo=lines.append)
    lr_line = next(x for x in lines if x.startswith("svi: starting lr "))
    lr = float(lr_line.split("starting lr ")[1].split(",")[0])
    rate_runs = [x for x in lines if x.startswith("svi: guide.dropout_rate ") and ": -test LL" in x]
    assert len(rate_runs) == len(DROPOUT_RATE_CANDIDATES) - 1  # the default rate's run was the lr's kept one
    assert all(f" at lr {lr:g}:" in x for x in rate_runs)
    assert f"{DEFAULT_DROPOUT_RATE:g}: " in next(x for x in lines if x.startswith("svi: guide.dropout_rate ")
                                                  and "chosen on" in x)


def test_an_interrupted_rate_choice_resumes_its_candidates_and_ends_as_the_uninterrupted_fit(tmp_path, monkeypatch):
    """A crash in the second candidate rate's run (step 25; its checkpoint at 20): the resumed fit takes no step of
    the finished first candidate, 10 of the second and 30 of each of the other two, of the noise's other start and
    of the prior's two other scales (the choices after the rate's), and keeps what the whole fit kept."""
    whole = train(chosen_rate_spec(), tmp_path / "whole", progress=False, echo=None)
    out, seen = tmp_path / "crashed", crash_in_the_second_candidate(monkeypatch, 25)
    with pytest.raises(RuntimeError, match="simulated"):
        train(chosen_rate_spec(), out, progress=False, echo=None)
    assert (out / svi.LR_CHOICE_DIR / "dropout_rate0.005" / CHECKPOINT_FILE).exists()
    seen.clear()
    train(chosen_rate_spec(), out, resume=True, progress=False, echo=None)
    assert len(seen) == 10 + 30 + 30 + 30 + 2 * 30
    a, b = load_torch(out / CHECKPOINT_FILE), load_torch(whole.run_dir / CHECKPOINT_FILE)
    assert different_entries(a["guide"], b["guide"]) == [] and a["losses"] == b["losses"]


def test_a_rate_is_not_chosen_without_calibration_rows_and_concrete_restarts_its_learned_rates_at_a_taken_one(
        tmp_path):
    lines = []
    summary = train(chosen_rate_spec("data.calibration_fraction=0"), tmp_path / "no_rows", progress=False,
                    echo=lines.append)
    assert not any("dropout_rate" in x for x in lines)
    _, _, posterior = load_run(summary.run_dir)
    assert set(posterior.guide.rates().values()) == {DEFAULT_DROPOUT_RATE}
    concrete = DropoutGuide(tiny_mean_field().latent_sites(), dropout_rate=None, mask="concrete")
    assert concrete.open_setting() == SettingChoice("guide.dropout_rate", DEFAULT_DROPOUT_RATE, DROPOUT_RATE_CANDIDATES,
                                                    DROPOUT_RATES_BELOW)
    assert all(r == pytest.approx(DEFAULT_DROPOUT_RATE) for r in concrete.rates().values())
    concrete.take_setting(0.01)
    assert all(r == pytest.approx(0.01) for r in concrete.rates().values())
    assert DropoutGuide(tiny_mean_field().latent_sites(), dropout_rate=0.1, mask="concrete").open_setting() is None


def test_a_state_saved_before_the_rate_was_in_it_keeps_the_sections_rate():
    guide = DropoutGuide(tiny_mean_field().latent_sites(), dropout_rate=0.2)
    old = {k: v for k, v in guide.state_dict().items() if k != "_extra_state"}
    guide.take_setting(0.05)
    guide.load_state_dict(old)
    assert guide.dropout_rate == 0.05
    fresh = DropoutGuide(tiny_mean_field().latent_sites(), dropout_rate=0.3)
    fresh.load_state_dict(guide.state_dict())
    assert fresh.dropout_rate == 0.05
    inside = torch.nn.ModuleDict({"guide": fresh})  # loaded as part of another module: the same
    inside.load_state_dict({f"guide.{k}": v for k, v in old.items()})
    assert fresh.dropout_rate == 0.05
