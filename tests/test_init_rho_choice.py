"""Where a softplus-parameterised guide's spread starts: a null ``guide.init_rho`` (the mean-field guide's, a Gaussian
autoguide's) is chosen on the calibration rows, as MC dropout's rate is."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from guides.auto import AutoGuide
from guides.base import DEFAULT_INIT_RHO, INIT_RHO_CANDIDATES, SettingChoice
from guides.mean_field import MeanFieldNormalGuide
from tests.conftest import choice_in_log, different_entries
from tests.test_baselines import tiny_mean_field
from zoo.likelihoods import Gaussian
from zoo.pipeline import load_run, train
from zoo.runs import CHECKPOINT_FILE, load_torch
from zoo.spec import AutoGuideSpec, load_spec

GUIDES = {"mean_field": {"name": "mean_field"}, "auto_normal": {"name": "auto", "auto": "normal"},
          "auto_low_rank_mvn": {"name": "auto", "auto": "low_rank_mvn", "rank": 2}}
LEARNED_NOISE = "likelihood.noise=learned"  # its start is chosen after the guide's


def test_a_null_init_rho_holds_the_default_until_a_taken_one_restarts_every_spread_and_no_mean():
    family = tiny_mean_field(Gaussian(None, prior_loc=-1.5))
    guide = MeanFieldNormalGuide(family.latent_sites(), init_rho=None)
    assert guide.open_setting() == SettingChoice("guide.init_rho", DEFAULT_INIT_RHO, INIT_RHO_CANDIDATES)
    means = {n: guide.unconstrained_loc(n).clone() for n in family.latent_sites()}
    guide.take_setting(-8.0)
    assert guide.open_setting()[1] == -8.0 and guide.init_rho == -8.0  # what the NaN diagnosis reads
    expected = F.softplus(torch.tensor(-8.0)).item()
    for name in family.latent_sites():  # the noise site's too: the value is every site's start
        assert torch.allclose(guide.scale(name), torch.full_like(guide.scale(name), expected)), name
    assert all(torch.equal(guide.unconstrained_loc(n), m) for n, m in means.items())
    assert MeanFieldNormalGuide(family.latent_sites(), init_rho=-6.0).open_setting() is None


@pytest.mark.parametrize("auto", ["normal", "low_rank_mvn", "mvn"])
def test_a_gaussian_autoguide_takes_a_start_into_its_scales_and_keeps_its_means_and_covariance_shape(auto):
    family = tiny_mean_field(sizes=(3, 4, 1))
    guide = AutoGuide(family.latent_sites(), AutoGuideSpec(name="auto", auto=auto, rank=2, init_rho=None))
    guide.bind(family.model, torch.randn(5, 3), torch.randn(5))
    assert guide.open_setting() == SettingChoice("guide.init_rho", DEFAULT_INIT_RHO, INIT_RHO_CANDIDATES)
    before = {n: p.detach().clone() for n, p in guide.auto.named_parameters()}
    guide.take_setting(-8.0)
    changed = {n for n, p in guide.auto.named_parameters() if not torch.equal(p, before[n])}
    assert changed == {n for n in before if n.startswith("scales.") or n == "scale_unconstrained"} != set()
    at_eight = AutoGuide(family.latent_sites(), AutoGuideSpec(name="auto", auto=auto, rank=2, init_rho=-8.0))
    at_five = AutoGuide(family.latent_sites(), AutoGuideSpec(name="auto", auto=auto, rank=2, init_rho=None))
    for built in (at_eight, at_five):  # from the same random state (a low-rank factor's draw)
        torch.manual_seed(0)
        built.bind(family.model, torch.randn(5, 3), torch.randn(5))
    with torch.no_grad():  # whatever the scales hold (a run's end, say), a start taken is where Pyro starts them
        for name, parameter in at_five.auto.named_parameters():
            if name in changed:
                parameter.add_(0.5)
    at_five.take_setting(-8.0)  # now the guide built at -8
    for (name, a), b in zip(at_five.auto.named_parameters(), at_eight.auto.parameters(), strict=True):
        torch.testing.assert_close(F.softplus(a), F.softplus(b), msg=name)
    given = AutoGuideSpec(name="auto", auto=auto, init_rho=-6.0)
    assert AutoGuide(family.latent_sites(), given).open_setting() is None
    assert AutoGuide(family.latent_sites(), AutoGuideSpec(name="auto", auto="iaf")).open_setting() is None


def chosen_rho_spec(guide: dict, *overrides: str):
    base = {"data": {"name": "toy_gap", "n_train": 60, "calibration_fraction": 0.25}, "net": {"hidden": [16]},
            "guide": guide, "likelihood": {"name": "gaussian", "noise": 0.3}, "device": "cpu", "seed": 0,
            "inference": {"num_steps": 30, "batch_size": 16, "lr": 0.01, "predictive_samples": 8,
                          "checkpoint_every": 10}}
    return load_spec(base, list(overrides))


@pytest.mark.parametrize(("guide", "noise"), [*((g, []) for g in GUIDES), ("auto_normal", [LEARNED_NOISE])])
def test_a_null_init_rho_is_chosen_on_the_calibration_rows_and_the_kept_run_is_the_run_given_that_rho(tmp_path,
                                                                                                       guide, noise):
    """Each candidate start's whole run is scored on the calibration rows and the best kept as it ended: the run
    given that rho by hand, step for step (with a learned noise too, whose start is chosen after it). The checkpoint
    records the choice, a reload loads the fitted spreads (none restarts), and without the rows the guide starts at
    the default with no choice made."""
    lines: list[str] = []
    chosen = train(chosen_rho_spec(GUIDES[guide], *noise), tmp_path / "chosen", progress=False, echo=lines.append)
    rho, scores, _ = choice_in_log(lines, "guide.init_rho")
    assert sorted(scores) == sorted(INIT_RHO_CANDIDATES) and rho == min(scores, key=scores.get)
    saved = load_torch(chosen.run_dir / CHECKPOINT_FILE)
    assert saved["chosen_settings"]["guide.init_rho"] == rho and len(saved["losses"]) == 30
    by_hand = train(chosen_rho_spec(GUIDES[guide], *noise, f"guide.init_rho={rho}"), tmp_path / "by_hand",
                    progress=False, echo=None)
    hand = load_torch(by_hand.run_dir / CHECKPOINT_FILE)
    assert different_entries(hand["guide"], saved["guide"]) == [] and hand["losses"] == saved["losses"]
    loaded = load_run(chosen.run_dir)[2].guide
    assert loaded.rho_open and different_entries(loaded.state_dict(), saved["guide"]) == []
    lines.clear()
    plain = train(chosen_rho_spec(GUIDES[guide], "data.calibration_fraction=0"), tmp_path / "no_rows",
                  progress=False, echo=lines.append)
    assert not any("init_rho" in x for x in lines)
    assert "guide.init_rho" not in load_torch(plain.run_dir / CHECKPOINT_FILE)["chosen_settings"]
