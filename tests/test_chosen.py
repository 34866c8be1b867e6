"""BNN.chosen: what a fit chose on its calibration rows, by the spec field each choice set, the same whether the fit
is kept in memory, saved, written as it runs, loaded or resumed; and the record is the run kept: the choices given
by hand fit the same posterior and leave nothing to choose."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pyro
import pytest
import torch
from torch import nn

import zoo
from zoo.errors import NotFitted
from zoo.inference.svi import SVI
from zoo.runs import CHOSEN_FILE

X = torch.randn(120, 3, generator=torch.Generator().manual_seed(0))
CLASSES = (X[:90], (X[:90, 0] + X[:90, 1] > 0).long())
CLASS_VAL = (X[90:], (X[90:, 0] + X[90:, 1] > 0).long())
TARGETS = (X[:90], X[:90].sum(1) + 0.1 * X[:90, 2] ** 2)
TARGET_VAL = (X[90:], X[90:].sum(1) + 0.1 * X[90:, 2] ** 2)

# member -> (task, the spec fields its choices set at its defaults); a budget of 4 epochs keeps each fit small
CHOICES = {
    "map": ("classification", {"inference.lr", "inference.prior_scale_factor"}),
    "mc_dropout": ("classification", {"inference.lr", "guide.dropout_rate", "inference.prior_scale_factor"}),
    "mean_field": ("regression", {"inference.lr", "guide.init_rho", "likelihood.noise_prior.init",
                                  "inference.prior_scale_factor"}),
    "swag": ("classification", {"inference.lr", "inference.pretrain_by", "inference.prior_scale_factor"}),
    "sgld": ("classification", {"inference.lr", "inference.explore_lr", "inference.prior_scale_factor"}),
    "diagonal_laplace": ("classification", {"model.map.lr", "model.map.prior_scale_factor", "inference.link"}),
    "kfac_laplace": ("regression", {"model.map.lr", "likelihood.noise_prior.init", "model.map.prior_scale_factor"}),
}


def _net(task: str) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2 if task == "classification" else 1))


def _fit(member: str, out=None, resume: bool = False, val: bool = True, **settings) -> zoo.BNN:
    task = CHOICES[member][0]
    rows, val_rows = (CLASSES, CLASS_VAL) if task == "classification" else (TARGETS, TARGET_VAL)
    return zoo.BNN(_net(task), member=member, device="cpu").fit(
        rows, val=val_rows if val else None, out=out, resume=resume, progress=False, epochs=4, **settings)


def _draws(bnn: zoo.BNN) -> torch.Tensor:
    pyro.set_rng_seed(3)
    draws = bnn.predict(X[:8]).draws
    return draws.log_probs if draws.log_probs is not None else draws.loc


@pytest.mark.parametrize("member", CHOICES)
def test_a_fit_names_what_its_rows_chose_and_every_way_of_keeping_it_gives_it_back(member, tmp_path):
    in_memory = _fit(member)
    chosen = in_memory.chosen
    assert set(chosen) == CHOICES[member][1]
    in_memory.save(tmp_path / "saved")
    written = _fit(member, out=tmp_path / "written")
    assert written.chosen == chosen  # the same seed makes the same choices
    assert json.loads((tmp_path / "written" / CHOSEN_FILE).read_text()) == chosen
    for run in ("saved", "written"):
        assert zoo.load(tmp_path / run).chosen == chosen
    assert _fit(member, out=tmp_path / "written", resume=True).chosen == chosen  # a finished fit, loaded


@pytest.mark.parametrize("member", ["map", "swag", "sgld"])
def test_the_choices_given_by_hand_fit_the_same_posterior_and_leave_nothing_to_choose(member):
    chosen = _fit(member)
    by_hand = _fit(member, **{field.removeprefix("inference."): value for field, value in chosen.chosen.items()})
    assert by_hand.chosen == {}
    assert torch.equal(_draws(by_hand), _draws(chosen))


def test_without_calibration_rows_nothing_is_chosen_and_before_a_fit_there_is_no_record():
    with pytest.raises(NotFitted, match="not fitted"):
        zoo.BNN(_net("classification"), member="map").chosen  # noqa: B018
    assert _fit("map", val=False).chosen == {}


def test_a_method_whose_fit_records_no_choice_gives_an_empty_record(monkeypatch):
    """A method of a user's own returns ``.posterior`` and ``.seconds`` only (docs/extending.md)."""
    fitter = SVI.fitter
    monkeypatch.setattr(SVI, "fitter", staticmethod(
        lambda fit: SimpleNamespace(posterior=(done := fitter(fit)).posterior, seconds=done.seconds)))
    assert _fit("map").chosen == {}


def test_a_run_whose_record_is_missing_or_damaged_loads_with_an_empty_one(tmp_path):
    """A run from before the record, or one whose chosen.json was damaged, still loads: the fit does not need it."""
    _fit("map", out=tmp_path / "run")
    (tmp_path / "run" / CHOSEN_FILE).write_text("{not json")
    assert zoo.load(tmp_path / "run").chosen == {}
    (tmp_path / "run" / CHOSEN_FILE).unlink()
    assert zoo.load(tmp_path / "run").chosen == {}
