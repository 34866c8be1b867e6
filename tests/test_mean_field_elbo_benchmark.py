"""benchmarks/mean_field_elbo.py: the ELBO's parts in closed form where they have one, a small run, bad options."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import zoo
from tests.conftest import load_benchmark
from zoo.errors import ZooInputError

elbo = load_benchmark("mean_field_elbo")
START_RHO = -12.0  # the guide's sigma at its start: softplus(-12) = 6e-6, so its draws sit on the net's weights


def weights_kl_at_start(net: nn.Module) -> float:
    """KL(N(w, s^2) || N(0, 1)) summed over the net's weights, s the guide's starting sigma, written out by hand."""
    sigma = F.softplus(torch.tensor(START_RHO, dtype=torch.float64))
    weights = torch.cat([p.detach().double().flatten() for p in net.parameters()])
    return float((0.5 * (sigma**2 + weights**2 - 1) - sigma.log()).sum())


def test_a_guide_at_its_start_has_the_closed_form_kl_and_the_nets_own_nll():
    torch.manual_seed(0)
    x, y = torch.randn(64, 3), torch.randint(0, 2, (64,))
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    bnn = zoo.BNN(net, member="mean_field", likelihood="categorical", guide={"init_rho": START_RHO}, seed=0)
    bnn.fit((x, y), num_steps=0, progress=False)  # the guide as it starts: the net's weights
    got = elbo.objective(bnn, x, y, draws=20)
    assert got["kl"] == pytest.approx(weights_kl_at_start(net), rel=1e-5)
    with torch.no_grad():
        nll = float(F.cross_entropy(net(x), y, reduction="sum"))
    assert got["expected_nll"] == pytest.approx(nll, rel=1e-4)  # draws within 6e-6 of the means
    assert got["neg_elbo"] == pytest.approx(got["kl"] + got["expected_nll"])
    assert got["median_sigma"] == pytest.approx(float(F.softplus(torch.tensor(START_RHO))), rel=1e-5)


def test_small_run_writes_every_cell(tmp_path):
    out = tmp_path / "elbo.json"
    report = elbo.main(["--size", "small", "--seeds", "0", "--epochs", "1,2", "--init-rho=-5,-8", "--draws", "10",
                        "--json", str(out)])
    cells = report["rows"]
    assert [(c["init_rho"], c["epochs"]) for c in cells] == [(-5.0, 1), (-5.0, 2), (-8.0, 1), (-8.0, 2)]
    for c in cells:
        assert c["neg_elbo"] == pytest.approx(c["kl"] + c["expected_nll"]) and c["kl"] > 0
        assert 0 <= c["test_accuracy"] <= 1 and c["test_nll"] > 0
    assert json.loads(out.read_text())["rows"] == cells


@pytest.mark.parametrize("argv, field", [(["--case", "cifar"], "--case"), (["--init-rho=a,b"], "--init-rho"),
                                         (["--draws", "0"], "--draws"), (["--epochs", "3-1"], "--epochs")])
def test_bad_options_name_the_option(argv, field):
    with pytest.raises(ZooInputError, match=field):
        elbo.main(argv)


def test_regression_counts_the_learned_noise_in_the_kl():
    torch.manual_seed(0)
    x, y = torch.randn(64, 3), torch.randn(64)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    bnn = zoo.BNN(net, member="mean_field", likelihood={"name": "gaussian", "noise": "learned"},
                  guide={"init_rho": START_RHO}, seed=0)
    bnn.fit((x, y), num_steps=0, progress=False)
    got = elbo.objective(bnn, x, y, draws=5)
    # the noise's own site: a LogNormal of sigma 6e-6 against its prior costs about log(prior scale / 6e-6) nats
    assert got["kl"] - weights_kl_at_start(net) > 5
