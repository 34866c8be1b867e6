"""zoo.reference, zoo.compare and BNN.diagnose on a net and data given in Python: a converged reference in one call
(resumed exactly after an interrupt), the comparison of fitted BNNs (the same table as of their run directories),
and the refusals of each."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import zoo
from zoo import posterior_checks
from zoo.diagnostics import budget_minutes
from zoo.diagnostics.comparison import compare_table, prior_widening
from zoo.errors import NotFitted, ZooInputError
from zoo.inference import mcmc
from zoo.inference.draws import SAMPLES_FILE
from zoo.runs import load_checkpoint

NOISE = 0.3
TINY_HMC = {"num_chains": 32, "warmup_steps": 150, "num_samples": 5, "checkpoint_every": 20, "predictive_samples": 50}


def rows(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """y = 0.5 x - 0.2 + N(0, 0.3^2) on x ~ U(-2, 2): a linear model's posterior is Gaussian, so HMC converges fast."""
    gen = torch.Generator().manual_seed(seed)
    x = 4 * torch.rand(n, 1, generator=gen, dtype=torch.float64) - 2
    return x, 0.5 * x[:, 0] - 0.2 + NOISE * torch.randn(n, generator=gen, dtype=torch.float64)


TRAIN, VAL = rows(40, 0), rows(20, 1)
PARTS = {"prior": {"name": "normal", "scale": 1.0}, "likelihood": {"name": "gaussian", "noise": NOISE},
         "device": "cpu", "dtype": "float64"}


@pytest.fixture(autouse=True)
def no_plots(monkeypatch):
    """The diagnostic plots are not what is tested here: seconds each for 32 chains."""
    for plot in ("plot_trace", "plot_energy", "plot_pair"):
        monkeypatch.setattr(posterior_checks, plot, lambda *args, **kwargs: None)


def linear_reference(out, budget="10min", **kwargs) -> zoo.BNN:
    torch.manual_seed(0)
    return zoo.reference(nn.Linear(1, 1).double(), TRAIN, val=VAL, out=out, budget=budget, inference=TINY_HMC,
                         add_draws=100, progress=False, echo=None, **PARTS, **kwargs)


@pytest.fixture(scope="module")
def reference_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        for plot in ("plot_trace", "plot_energy", "plot_pair"):
            patch.setattr(posterior_checks, plot, lambda *args, **kwargs: None)
        out = tmp_path_factory.mktemp("reference") / "ref"
        ref = linear_reference(out)
    return out, ref


def draws_of(run) -> dict[str, torch.Tensor]:
    return load_checkpoint(run / SAMPLES_FILE)["draws"]


def test_a_reference_grows_until_its_verdict_passes(reference_dir):
    out, ref = reference_dir
    found = ref.diagnose()
    assert found.passed and ref.verdict.startswith("converged: function-space R-hat max") and ref.chains
    assert ref.spec.inference.method == "hmc" and ref.spec.inference.num_samples in (105, 205, 305, 405)
    assert next(iter(draws_of(out).values())).shape[:2] == (32, ref.spec.inference.num_samples)
    assert (out / "diagnostics.json").is_file() and (out / "posterior.nc").is_file()  # each verdict's files
    # the same call again: converged already, nothing sampled
    again = linear_reference(out)
    assert again.spec.inference.num_samples == ref.spec.inference.num_samples
    for name, value in ref.posterior.draws.items():
        assert torch.equal(value, again.posterior.draws[name]), name


@pytest.mark.parametrize("stop_at", [100, 230], ids=["in-warm-up", "in-a-round"])
def test_an_interrupted_reference_resumed_gives_the_draws_of_one_uninterrupted_call(reference_dir, tmp_path,
                                                                                   monkeypatch, stop_at):
    straight, _ = reference_dir
    real_step, stopped = mcmc.ManyChainHMC.step, []

    def step(self, warmup):
        if self.iteration == stop_at and not stopped:
            stopped.append(self.iteration)
            raise KeyboardInterrupt
        return real_step(self, warmup)

    monkeypatch.setattr(mcmc.ManyChainHMC, "step", step)
    with pytest.raises(KeyboardInterrupt):
        linear_reference(tmp_path / "ref")
    assert stopped == [stop_at] and (tmp_path / "ref" / SAMPLES_FILE).is_file()
    resumed = linear_reference(tmp_path / "ref")
    assert resumed.diagnose().passed
    expected, got = draws_of(straight), draws_of(tmp_path / "ref")
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name


def test_a_budget_spent_says_how_far_the_reference_is_and_how_long_the_rest_would_take(tmp_path):
    lines = []
    ref = zoo.reference(nn.Linear(1, 1).double(), TRAIN, val=VAL, out=tmp_path / "ref", budget="1s",
                        inference={**TINY_HMC, "num_chains": 4, "warmup_steps": 10, "num_samples": 5},
                        progress=False, echo=lines.append, **PARTS)
    found = ref.diagnose()
    assert not found.passed and ref.verdict.startswith("NOT CONVERGED")
    spent = [line for line in lines if "budget is spent" in line]
    drawn = re.match(r"the 1-second budget is spent: (\d+) draws per chain so far", spent[0]) if spent else None
    assert len(spent) == 1 and drawn and int(drawn[1]) % 5 == 0  # whole rounds of 5 draws: how many fit in 1 s varies
    assert "draws per chain may pass" in spent[0] and spent[0] in found.result["advice"] and spent[0] in ref.verdict


@pytest.mark.parametrize("budget, fragment", [
    (0, "give a positive time"), (-5, "give a positive time"), ("soon", "give a positive time"),
    ("10 parsecs", "give a positive time"), (math.nan, "give a positive time"), (True, "minutes as a number"),
    ([10], "minutes as a number"),
])
def test_a_budget_that_is_not_a_positive_time_is_refused(budget, fragment, tmp_path):
    with pytest.raises(ZooInputError, match=fragment) as err:
        zoo.reference(nn.Linear(1, 1), TRAIN, out=tmp_path / "ref", budget=budget)
    assert err.value.field == "budget" and not (tmp_path / "ref").exists()


@pytest.mark.parametrize("budget, minutes", [(30, 30.0), (2.5, 2.5), ("90s", 1.5), ("20min", 20.0), ("1.5h", 90.0),
                                             ("2 hours", 120.0), ("45", 45.0)])
def test_a_budget_reads_minutes_or_a_time_with_its_unit(budget, minutes):
    assert budget_minutes(budget) == pytest.approx(minutes)


def test_a_reference_refuses_a_sampler_that_cannot_add_draws(tmp_path):
    with pytest.raises(ZooInputError, match="only the many-chain HMC does") as err:
        zoo.reference(nn.Linear(1, 1), TRAIN, out=tmp_path / "ref", inference={"method": "nuts"})
    assert err.value.field == "inference.method" and not (tmp_path / "ref").exists()


def test_resuming_a_reference_on_other_rows_is_refused_naming_them(reference_dir, tmp_path):
    import shutil

    out, _ = reference_dir
    shutil.copytree(out, tmp_path / "ref")
    with pytest.raises(ZooInputError, match="are not the training rows this run was fitted on") as err:
        zoo.reference(nn.Linear(1, 1).double(), rows(40, 7), val=VAL, out=tmp_path / "ref", inference=TINY_HMC,
                      progress=False, echo=None, **PARTS)
    assert err.value.field == "data"


# ---------------------------------------------------------------------------------------------- compare
@pytest.fixture(scope="module")
def members(tmp_path_factory):
    """Members fitted on the reference's rows, each also kept in a run directory: mean-field under the reference's
    prior and, ``wide``, at its defaults, which choose a prior's scale on the rows; a subnetwork Laplace."""
    folder = tmp_path_factory.mktemp("members")
    fitted = {}
    for name, settings in [("mean_field", {"inference": {"method": "svi", "num_steps": 300,
                                                          "prior_scale_factor": 1.0}}),
                           ("wide", {"inference": {"method": "svi", "num_steps": 300}}),
                           ("laplace", {"member": "subnetwork_laplace"})]:
        torch.manual_seed(0)
        bnn = zoo.BNN(nn.Linear(1, 1).double(), **PARTS, **settings)
        fitted[name] = bnn.fit(TRAIN, val=VAL, out=folder / name, progress=False)
    return fitted


def test_compare_on_bnns_and_on_their_run_directories_gives_the_same_table(reference_dir, members):
    out, ref = reference_dir
    in_memory = zoo.compare(ref, members["mean_field"], members["laplace"], num_samples=100)
    on_disk = zoo.compare(out, members["mean_field"].run_dir, members["laplace"].run_dir, test=VAL, num_samples=100)
    pd.testing.assert_frame_equal(in_memory.table, on_disk.table)
    table = in_memory.table
    assert list(table.index) == ["ref (hmc)", "mean_field (svi/mean_field)", "laplace (laplace)"]
    assert list(table.columns) == ["reference", "coverage_95", "w1", "rmse", "test_ll", "train_seconds"]
    assert table["reference"].tolist() == [True, False, False] and table.loc["ref (hmc)", "w1"] == 0.0
    assert (table["w1"].iloc[1:] > 0).all() and table.attrs["reference_check"] == "passes --strict"
    assert table.loc["laplace (laplace)", "rmse"] == pytest.approx(members["laplace"].metrics["rmse"])


def test_a_fit_under_other_priors_than_the_references_is_named_with_its_factor(reference_dir, members):
    """Given validation rows, mean-field chooses its priors' scale on them; a factor other than the reference's makes
    it approximate another posterior, which the comparison names, in memory and from its run directory alike."""
    out, ref = reference_dir
    wide = members["wide"]
    factor, loaded = prior_widening(wide), zoo.load(wide.run_dir)  # the factor its posterior's priors hold
    assert factor == wide.posterior.family.prior_scale_factor == loaded.posterior.family.prior_scale_factor
    assert prior_widening(loaded) == factor
    same = zoo.compare(ref, members["mean_field"], num_samples=20)
    assert "prior_scale_factor" not in same.table.columns and "priors widened" not in same.caption()
    given = zoo.BNN(nn.Linear(1, 1).double(), **PARTS, inference={"method": "svi", "num_steps": 50,
                                                                  "prior_scale_factor": 10.0})
    given.fit(TRAIN, val=VAL, progress=False)
    for found in (zoo.compare(ref, mean_field=members["mean_field"], given=given, num_samples=20),
                  zoo.compare(out, mean_field=members["mean_field"].run_dir, given=given, test=VAL, num_samples=20)):
        assert found.table["prior_scale_factor"].tolist() == [1.0, 1.0, 10.0]
        assert "priors widened unlike the reference's (×1): given ×10" in found.caption()
        assert "inference.prior_scale_factor: 1" in found.to_markdown()
        assert "priors widened" in str(compare_table(found.rows).caption)


def test_a_comparison_shows_as_a_table_markdown_html_and_a_plot(reference_dir, members, tmp_path):
    _, ref = reference_dir
    found = zoo.compare(ref, vi=members["mean_field"], num_samples=50)
    assert list(found.table.index) == ["ref (hmc)", "vi"]
    markdown = found.to_markdown()
    assert markdown.startswith("| fit") and "| vi" in markdown and "reference passes --strict" in markdown
    page = found._repr_html_()
    assert "<table" in page and "against ref (hmc)" in page
    fig = found.plot(tmp_path / "compare.png")
    assert (tmp_path / "compare.png").is_file() and len(fig.axes) == 2  # the bands over x, and W1 along x
    np.testing.assert_allclose(found.per_input[0], 0.0)


def test_compare_names_what_differs_and_what_is_not_fitted(reference_dir, members, tmp_path):
    _, ref = reference_dir
    other_net = zoo.BNN(nn.Sequential(nn.Linear(1, 3), nn.Tanh(), nn.Linear(3, 1)).double(), **PARTS)
    other_net.fit(TRAIN, val=VAL, progress=False, num_steps=20)
    with pytest.raises(ZooInputError, match=r"its net is torch.nn.modules.container:Sequential") as err:
        zoo.compare(ref, other_net)
    assert err.value.field == "fit"
    other_rows = zoo.BNN(nn.Linear(1, 1).double(), **PARTS).fit(rows(40, 9), val=VAL, progress=False, num_steps=20)
    with pytest.raises(ZooInputError, match="its training rows differ from the reference's"):
        zoo.compare(ref, other_rows)
    with pytest.raises(ZooInputError, match="its test rows differ"):
        zoo.compare(ref, zoo.BNN(nn.Linear(1, 1).double(), **PARTS).fit(TRAIN, val=rows(20, 5), progress=False,
                                                                      num_steps=20))
    with pytest.raises(NotFitted, match=r"call \.fit\(data\) first"):
        zoo.compare(ref, zoo.BNN(nn.Linear(1, 1)))
    with pytest.raises(ZooInputError, match="cannot be trusted as a reference: svi/mean_field is not an exact"):
        zoo.compare(members["mean_field"], ref)
    assert zoo.compare(members["mean_field"], ref, allow_unconverged=True, num_samples=20).table.attrs[
        "reference_check"].startswith("FAILS")
    with pytest.raises(TypeError, match="a fit is a zoo.BNN or the run directory of one"):
        zoo.compare(ref, 3)


# ---------------------------------------------------------------------------------------------- diagnose
def test_diagnose_judges_chains_and_guides_alike_and_saves_on_request(reference_dir, members, tmp_path):
    _, ref = reference_dir
    chains = ref.diagnose()
    assert chains is ref.diagnose()  # kept: the fit does not change
    assert chains.result["draws"] == "mcmc" and set(chains.checks.index) >= {
        "R-hat, function space and lp (max)", "bulk/tail ESS, function space and lp (min)"}
    assert "lp" in chains.summary.index and "<table" in chains._repr_html_()
    guide = members["mean_field"].diagnose(num_samples=50)
    assert guide.result["draws"] == "iid" and "PSIS Pareto k-hat of q" in guide.checks.index
    files = guide.save(tmp_path / "diag", plots=False)
    assert set(files) == {"inference_data", "summary", "diagnostics"}
    assert all((tmp_path / "diag" / name).is_file() for name in ("posterior.nc", "summary.csv", "diagnostics.json"))
