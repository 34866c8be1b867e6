"""Every Laplace structure (full, diag, kron, lowrank) over every subset (every weight, the last layer, a selected
subnetwork) on an MLP, a conv net with BatchNorm and a net with LayerNorm, post hoc from the nets' own weights: each
fits and predicts, ``predict`` and ``evaluate`` give one NLL, and KFAC over a selection of single weights is
refused."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tests.test_laplace_diagonal import NETS, evaluate_nll, predictive_nll
from zoo.errors import ZooInputError

SUBSETS = {"all": {"strategy": "all"}, "last_layer": {"strategy": "last_layer"},
           "subnetwork": {"strategy": "largest_magnitude", "size": 20}}
NET_BUILDERS = {**NETS, "mlp": lambda: nn.Sequential(nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 3))}


def _rows() -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    x = torch.randn(60, 16, generator=torch.Generator().manual_seed(0))
    y = x[:, :3].argmax(-1)
    return (x[:40], y[:40]), (x[40:], y[40:])


@pytest.mark.parametrize("subset", sorted(SUBSETS))
@pytest.mark.parametrize("covariance", ["full", "diag", "kron", "lowrank"])
@pytest.mark.parametrize("kind", sorted(NET_BUILDERS))
def test_every_structure_and_subset_fits_and_predicts(kind, covariance, subset):
    import zoo

    torch.manual_seed(0)
    train, val = _rows()
    settings = {"member": "last_layer_laplace", "guide": {"name": "laplace", "covariance": covariance},
                "family": {"family": "subnetwork", "map_from": "net", "selection": SUBSETS[subset]}}
    if covariance == "kron" and subset == "subnetwork":
        with pytest.raises(ZooInputError, match="factors whole layers"):
            zoo.BNN(NET_BUILDERS[kind](), **settings)
        return
    bnn = zoo.BNN(NET_BUILDERS[kind](), **settings).fit(train, val=val, progress=False)
    nll = predictive_nll(bnn)
    assert bnn.posterior.predict(bnn.data.x_test, num_samples=2).log_probs.shape[1:] == (20, 3)
    assert evaluate_nll(bnn) == pytest.approx(nll, rel=1e-5)
    assert bnn.metrics["nll"] == pytest.approx(nll, rel=1e-5)


@pytest.mark.parametrize(("width", "chosen"), [(8, "full"), (512, "kron")])
def test_auto_covariance_is_full_over_a_narrow_head_and_kfac_over_a_wide_one(width, chosen):
    """The last_layer_laplace preset's ``auto``: a head of 8 x 3 + 3 weights gets the full covariance, one of
    512 x 10 + 10 = 5,130 (above FULL_COVARIANCE_MAX) KFAC's, each with its own structure's evidence and a log line
    saying which."""
    import zoo
    from guides.laplace import FULL_COVARIANCE_MAX

    outputs = 3 if width == 8 else 10
    net = nn.Sequential(nn.Linear(16, width), nn.Tanh(), nn.Linear(width, outputs))
    head = width * outputs + outputs
    assert (head > FULL_COVARIANCE_MAX) == (chosen == "kron")
    x = torch.randn(60, 16, generator=torch.Generator().manual_seed(0))
    y = x[:, :outputs].argmax(-1)
    lines: list[str] = []
    untrained = copy.deepcopy(net)
    bnn = zoo.BNN(net, member="last_layer_laplace", seed=0).fit((x, y), epochs=1, progress=False, echo=lines.append)
    assert bnn.posterior.guide.covariance == chosen
    assert f"laplace: guide.covariance auto is {chosen} over {head:,} weights" in "\n".join(lines)
    evidence_at = "linearised_mode" if chosen == "full" else "map"
    same = zoo.BNN(untrained, member="last_layer_laplace", seed=0, guide={"name": "laplace", "covariance": chosen},
                   inference={"method": "laplace", "prior_structure": "layer", "link": "bridge",
                              "evidence_at": evidence_at}).fit((x, y), epochs=1, progress=False)
    torch.testing.assert_close(bnn.posterior.guide.variance("subnet"), same.posterior.guide.variance("subnet"))


@pytest.mark.parametrize("setting", [{"evidence_at": "linearised_mode"}, {"curvature": "ef"},
                                     {"prior_structure": "weight"}])
def test_auto_covariance_refuses_a_setting_one_of_its_structures_cannot_take(setting):
    import zoo

    with pytest.raises(ZooInputError, match="set guide.covariance: full or kron"):
        zoo.BNN(nn.Sequential(nn.Linear(4, 2)), member="last_layer_laplace",
                inference={"method": "laplace", "link": "bridge", **setting})
