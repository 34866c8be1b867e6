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
    with pytest.raises(ZooInputError, match=r"give epochs \d+ or more, or lower inference.rank to \d+ or less"):
        zoo.BNN(net(), member="swag", device="cpu").fit((X, Y), epochs=2, pretrain_epochs=1, rank=20, progress=False)


@pytest.mark.parametrize("member", ["swag", "multiswag"])
def test_a_short_budget_lowers_swags_default_rank_and_says_so(member):
    """The rank a user did not set is scaled to a short budget's iterates (before, the fit's own settings made every
    default look set, and ``fit(epochs=3)`` was refused)."""
    said = []
    bnn = zoo.BNN(net(), member=member, device="cpu").fit((X, Y), epochs=3, progress=False, echo=said.append)
    assert any("default rank 20 lowered to the 3 iterates" in line for line in said)
    assert bnn.posterior.deviations.shape[1] == 3
