"""One budget for every member: ``fit(data, epochs=E)`` is read by the method that trains (Laplace's MAP phase
included), SG-MCMC's burn-in and thinning follow it, and a budget that is no whole number, below one or absurd is
refused naming the field before anything is written (issue 51)."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.errors import ZooInputError
from zoo.sections import MAX_EPOCHS, MAX_STEPS

X = torch.randn(60, 3, generator=torch.Generator().manual_seed(0))
Y = (X[:, 0] > 0).long()


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def test_laplace_reads_the_budget_as_its_map_phases_and_keeps_the_spec_it_was_built_with():
    bnn = zoo.BNN(net(), member="subnetwork_laplace", device="cpu")
    built = bnn.spec.model.map.epochs
    bnn.fit((X, Y), epochs=2, progress=False)
    assert bnn.spec.model.map.epochs == 2 and "epochs" not in bnn.spec.inference.model_fields
    assert zoo.BNN(net(), member="subnetwork_laplace", device="cpu").spec.model.map.epochs == built


@pytest.mark.parametrize("member", ["sgld", "cyclical_sghmc"])
def test_sgmcmc_members_keep_draws_from_a_short_budget(member):
    bnn = zoo.BNN(net(), member=member, device="cpu").fit((X, Y), epochs=2, batch_size=10, progress=False)
    draws = next(iter(bnn.posterior.chains.values()))
    assert draws.shape[1] >= 1


@pytest.mark.parametrize("setting, value, says", [
    ("epochs", 0, "greater than 0"),
    ("epochs", -3, "greater than 0"),
    ("epochs", 2.5, "fractional part"),
    ("epochs", 1e9, f"give at most {MAX_EPOCHS:,}"),
    ("num_steps", -1, "greater than or equal to 0"),
    ("num_steps", 10 * MAX_STEPS, f"give at most {MAX_STEPS:,}"),
])
@pytest.mark.parametrize("member", ["mean_field", "sgld", "swag", "subnetwork_laplace"])
def test_a_bad_budget_is_refused_naming_its_field_before_anything_is_written(tmp_path, member, setting, value, says):
    if setting == "num_steps" and member in ("sgld", "swag"):
        pytest.skip("SG-MCMC and SWAG take their budget in epochs")
    with pytest.raises(ZooInputError, match=says) as refused:
        zoo.BNN(net(), member=member, device="cpu").fit((X, Y), out=tmp_path / "run", progress=False,
                                                        **{setting: value})
    assert setting in refused.value.field or setting in str(refused.value)
    assert not (tmp_path / "run").exists()


def test_a_swag_budget_too_short_for_its_rank_names_the_epochs_that_reach_it():
    with pytest.raises(ZooInputError, match=r"collect for \d+ epochs or more .*, or lower inference.rank to \d+ or"):
        zoo.BNN(net(), member="swag", device="cpu").fit((X, Y), epochs=2, pretrain_epochs=1, rank=20, progress=False)


@pytest.mark.parametrize("member", ["swag", "multiswag"])
def test_a_short_budget_lowers_swags_default_rank_and_says_so(member):
    """The rank a user did not set is scaled to a short budget's iterates (before, the fit's own settings made every
    default look set, and ``fit(epochs=3)`` was refused)."""
    said = []
    bnn = zoo.BNN(net(), member=member, device="cpu").fit((X, Y), epochs=3, progress=False, echo=said.append)
    assert any("swag" in line and "(1 + 2) epochs" in line for line in said)  # the budget: a quarter collects
    assert any("default rank 20 lowered to the 2 iterates" in line for line in said)
    assert bnn.posterior.deviations.shape[1] == 2


@pytest.mark.parametrize("epochs, pretrain, collecting", [(40, 30, 10), (30, 23, 7), (3, 1, 2), (2, 0, 2), (1, 0, 1)])
def test_swag_spends_a_fit_budget_on_pretraining_then_the_last_quarter_collecting(epochs, pretrain, collecting):
    from zoo.inference.swag import SWAG

    assert SWAG().spend_budget({"epochs": epochs}, {}) == {"epochs": collecting, "pretrain_epochs": pretrain}
    # a pretraining the user or the spec set is kept: the budget is the collecting epochs, as a spec reads them
    assert SWAG().spend_budget({"epochs": epochs}, {"pretrain_epochs": 5}) == {"epochs": epochs}
    assert SWAG().spend_budget({"epochs": 0}, {}) == {"epochs": 0}  # refused by the spec, naming epochs


@pytest.mark.parametrize("collect_steps, per_epoch, rank, every", [
    (800, 8, 20, 8),  # 100 collecting epochs: once per epoch, as in SWAG
    (160, 8, 20, 8),  # 20 epochs reach the rank once per epoch
    (40, 8, 20, 2),  # 5 epochs: every second step collects the 20
    (10, 8, 20, 1),  # fewer steps than the rank: every step
])
def test_swag_collects_more_often_than_once_per_epoch_only_to_reach_its_rank(collect_steps, per_epoch, rank, every):
    from zoo.inference.swag import default_collect_every

    assert default_collect_every(collect_steps, per_epoch, rank) == every
