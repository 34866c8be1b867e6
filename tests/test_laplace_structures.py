"""Every Laplace structure (full, diag, kron, lowrank) over every subset (every weight, the last layer, a selected
subnetwork) on an MLP, a conv net with BatchNorm and a net with LayerNorm, post hoc from the nets' own weights: each
fits and predicts, ``predict`` and ``evaluate`` give one NLL, and KFAC over a selection of single weights is
refused."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.test_laplace_diagonal import NETS
from zoo.errors import ZooInputError
from zoo.evaluate import evaluate

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
    log_probs = bnn.posterior.predict(bnn.data.x_test).log_probs[0]
    assert log_probs.shape == (20, 3) and bool(log_probs.isfinite().all())
    nll = float(-log_probs.gather(1, bnn.data.y_test.long()[:, None]).mean())
    assert evaluate(bnn.posterior, bnn.data, num_samples=1)["nll"] == pytest.approx(nll, rel=1e-5)
    assert bnn.metrics["nll"] == pytest.approx(nll, rel=1e-5)
