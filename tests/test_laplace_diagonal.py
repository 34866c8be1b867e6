"""The diagonal Laplace (``guide.covariance: diag``) over every weight, the last layer or a subnetwork: its
curvature, output covariance and linearised draws against dense autograd, its evidence against the closed form and
laplace-torch, end-to-end fits on nets with BatchNorm and LayerNorm, and its refusals."""

from __future__ import annotations

import math

import pyro
import pytest
import torch
from torch import nn

from tests.laplace_reference import assert_agrees_with_laplace_torch, dense_jacobian, require_laplace
from tests.test_subnetwork import MOONS, TOY, _fitted, spec
from zoo.curvature import LayerFactors, ParameterLayout
from zoo.errors import ZooInputError
from zoo.evaluate import evaluate
from zoo.inference.laplace import DiagonalStatistics
from zoo.likelihoods import categorical_hessian_root
from zoo.models.subnetwork import SITE

DIAGONAL = ("guide.covariance=diag", "model.selection.strategy=all")


class _Normed(nn.Module):
    """An MLP with a LayerNorm between its layers (its scale and shift stay at the MAP)."""

    def __init__(self, inputs: int, outputs: int) -> None:
        super().__init__()
        self.inner, self.norm, self.out = nn.Linear(inputs, 8), nn.LayerNorm(8), nn.Linear(8, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.norm(self.inner(x))))


class _BatchNormCNN(nn.Module):
    """A 3x3 convolution and a BatchNorm on 4x4 one-channel images given as rows of 16, then a Linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm, self.out = nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3), nn.Linear(48, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.norm(self.conv(x.view(-1, 1, 4, 4)))).flatten(1))


def _batch_norm_cnn() -> nn.Module:
    net = _BatchNormCNN()
    with torch.no_grad():  # running statistics other than the initial ones, as after training
        net(torch.randn(32, 16))
    return net.eval()


NETS = {"layer_norm": lambda: _Normed(16, 3), "batch_norm_cnn": _batch_norm_cnn}


@pytest.mark.parametrize("kind", sorted(NETS))
def test_output_covariance_and_ggn_diagonal_equal_dense_autograd(kind):
    """J diag(v) Jᵀ and the GGN's diagonal from the layer factors equal their dense forms; the normalisation layers
    are not selectable (they stay at the MAP)."""
    torch.manual_seed(0)
    net = NETS[kind]().double()
    x = torch.randn(6, 16, dtype=torch.float64)
    layout = ParameterLayout(net)
    selectable = layout.selectable()
    assert [s.name for s in layout.slots if not s.selectable] == ["norm.weight", "norm.bias"]
    variance = torch.rand(layout.size, dtype=torch.float64) * selectable
    J = dense_jacobian(net, x)[0]  # [B, O, P]
    got = LayerFactors(net, layout, x).output_covariance(layout, variance)
    torch.testing.assert_close(got, torch.einsum("bop,bqp,p->boq", J, J, variance))
    root = categorical_hessian_root(net(x).detach())
    want_diag = torch.einsum("bpo,bod->bpd", root, J).square().sum((0, 1)) * selectable
    torch.testing.assert_close(LayerFactors(net, layout, x).diagonal_ggn(layout, root), want_diag)


def test_linearised_outputs_are_f_plus_j_delta(tmp_path):
    _, data, posterior = _fitted(MOONS, tmp_path, *DIAGONAL)
    family = posterior.family
    shifts = torch.randn(5, len(family.indices), dtype=torch.float64)
    f, J = family.linearise(data.x_test[:7])
    J = J.dense()
    torch.testing.assert_close(family.linearised_outputs(data.x_test[:7], shifts),
                               f + torch.einsum("bod,sd->sbo", J, shifts))


@pytest.mark.parametrize("base", ["toy", "moons"])
def test_posterior_variance_is_one_over_ggn_diagonal_plus_prior(base, tmp_path):
    """q = N(MAP, diag(1 / (diag G + λ))) with G the dense GGN; the closed-form predictive is the GLM's."""
    _, data, posterior = _fitted(TOY if base == "toy" else MOONS, tmp_path, *DIAGONAL)
    family = posterior.family
    assert len(family.indices) == int(family.layout.selectable().sum())  # strategy all: every weight
    f, J = family.linearise(data.x_train)
    J = J.dense()
    root = family.likelihood.output_hessian_root(f, family.likelihood.fixed_noise)
    ggn_diagonal = torch.einsum("bpo,bod->bpd", root, J).square().sum((0, 1))
    torch.testing.assert_close(posterior.guide.variance(SITE), 1 / (ggn_diagonal + family.prior_precision))
    mean, cov = posterior.glm_moments(data.x_test[:5])
    f_test, J_test = family.linearise(data.x_test[:5])
    J_test = J_test.dense()
    torch.testing.assert_close(cov, torch.einsum("bod,bqd,d->boq", J_test, J_test, posterior.guide.variance(SITE)))
    torch.testing.assert_close(mean, f_test)


def test_evidence_is_the_closed_form_and_tuning_maximises_it(tmp_path):
    _, data, posterior = _fitted(TOY, tmp_path, *DIAGONAL, "inference.tune=true", "likelihood.noise=learned",
                                 "inference.prior_structure=scalar")
    family = posterior.family
    noise = posterior.guide.point_estimate()["noise_scale"]
    centre = posterior.guide.point_estimate()[SITE]
    f, J = family.linearise(data.x_train)
    J = J.dense()
    d = J[:, 0].square().sum(0)
    residual = (data.y_train - f[:, 0]).square().sum()
    stats = DiagonalStatistics(diagonal=d, log_likelihood=None, sum_squares=residual, n=data.n_train)

    def by_hand(lam: torch.Tensor, sigma: torch.Tensor) -> float:
        n = data.n_train
        return float(-0.5 * n * torch.log(2 * math.pi * sigma**2) - 0.5 * residual / sigma**2
                     - 0.5 * lam * centre.square().sum() + 0.5 * len(centre) * torch.log(lam)
                     - 0.5 * torch.log(d / sigma**2 + lam).sum())

    lam = family.prior_precision[0]
    assert float(stats.evidence(family.prior_precision, centre, noise)) == pytest.approx(by_hand(lam, noise), rel=1e-12)
    best = by_hand(lam, noise)
    for factor in (0.8, 1.25):
        assert by_hand(lam * factor, noise) < best
        assert by_hand(lam, noise * factor) < best
    # the posterior is the tuned one: variance 1 / (d / σ² + λ)
    torch.testing.assert_close(posterior.guide.variance(SITE), 1 / (d / noise**2 + lam))


@pytest.mark.parametrize("subset", ["all", "last_layer"])
@pytest.mark.parametrize("base", ["toy", "moons"])
def test_agrees_with_laplace_torch_diagonal(base, subset, tmp_path):
    """The same log evidence and GLM predictive (probit for classification) as laplace-torch's diagonal Laplace
    over the same weights, at the same prior precision, to 1e-6 relative."""
    require_laplace()
    _, data, posterior = _fitted(TOY if base == "toy" else MOONS, tmp_path, "guide.covariance=diag",
                                 f"model.selection.strategy={subset}")
    assert_agrees_with_laplace_torch(posterior, data, tmp_path / "run", subset, "diag")


@pytest.mark.parametrize("kind", sorted(NETS))
def test_fits_and_predicts_on_nets_with_normalisation_layers(kind, tmp_path):
    """The diagonal member over every weight of a BatchNorm conv net and a LayerNorm net, post hoc from the net's
    own weights: it fits, predict and evaluate give one NLL, and the run reloads to the same posterior."""
    import zoo

    torch.manual_seed(0)
    net = NETS[kind]()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(60, 16, generator=gen)
    y = (x[:, :3].argmax(-1))
    bnn = zoo.BNN(net, member="diagonal_laplace", family={"map_from": "net"})
    bnn.fit((x[:40], y[:40]), val=(x[40:], y[40:]), out=tmp_path / "run", progress=False)
    assert evaluate_nll(bnn) == pytest.approx(predictive_nll(bnn), rel=1e-5)
    assert len(bnn.posterior.family.indices) == int(bnn.posterior.family.layout.selectable().sum())
    again = zoo.BNN.load(tmp_path / "run")
    torch.testing.assert_close(again.posterior.guide.variance(SITE), bnn.posterior.guide.variance(SITE))
    assert again.posterior.link == bnn.posterior.link  # the link the fit chose on the val rows


def predictive_nll(bnn) -> float:
    """The test NLL of a classification fit's predictive, from ``predict`` at the fit's own draws count and seed
    (one closed form, or draws of the logits where its link is ``mc``)."""
    samples, seed = bnn.spec.inference.predictive_samples, bnn.spec.seed
    pyro.set_rng_seed(seed + 1)
    draws = bnn.posterior.predict(bnn.data.x_test, num_samples=samples).log_probs
    log_probs = draws.logsumexp(0) - math.log(len(draws))
    assert bool(log_probs.isfinite().all())
    return float(-log_probs.gather(1, bnn.data.y_test.long()[:, None]).mean())


def evaluate_nll(bnn) -> float:
    """The same NLL by :func:`zoo.evaluate.evaluate`, at the same draws count and seed."""
    return evaluate(bnn.posterior, bnn.data, bnn.spec.inference.predictive_samples, seed=bnn.spec.seed)["nll"]


def test_a_diagonal_over_a_net_too_large_for_a_full_covariance_is_not_refused(monkeypatch, tmp_path):
    """The full covariance's size check refuses the whole net (as a count) when memory is short; the diagonal needs
    none. (A fraction would be capped at what fits: tests/test_subnetwork.py.)"""
    import zoo.runs

    monkeypatch.setattr(zoo.runs, "available_memory", lambda: 40 * 2**20)  # 1,002 weights: 32 MB in full
    whole = ("net.hidden=[200]", "model.selection.strategy=largest_variance", "model.selection.size=1.0")
    with pytest.raises(ZooInputError, match="guide.covariance: diag"):
        _fitted(MOONS, tmp_path / "full", *whole[:2], "model.selection.size=1002")
    assert not (tmp_path / "full" / "run" / "map").exists()  # refused before the MAP fit
    _, _, posterior = _fitted(MOONS, tmp_path / "diag", *whole, "guide.covariance=diag")
    assert len(posterior.family.indices) == 1002


def test_refuses_the_evidence_at_the_linearised_mode():
    with pytest.raises(ZooInputError, match="evidence at the MAP only"):
        spec(MOONS, *DIAGONAL, "inference.evidence_at=linearised_mode")
    assert spec(MOONS, *DIAGONAL).guide.label == "laplace:diag"


def test_a_net_whose_outputs_are_not_finite_stops_with_a_diagnosis(tmp_path):
    import zoo
    from zoo.errors import TrainingDiverged

    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    with torch.no_grad():
        net[2].bias.fill_(float("nan"))
    x = torch.randn(30, 4, generator=torch.Generator().manual_seed(0))
    with pytest.raises(TrainingDiverged, match="not finite"):
        zoo.BNN(net, member="diagonal_laplace", family={"map_from": "net"}).fit((x, (x[:, 0] > 0).long()),
                                                                               progress=False)


def test_the_fit_time_counts_the_map_phase(tmp_path):
    """``train_seconds`` is the whole fit: the subnetwork's MAP phase and selection (as ``subnetwork.pt`` records
    them) plus the Laplace step (as its checkpoint does); a reload reports the same."""
    import zoo

    x = torch.randn(40, 4, generator=torch.Generator().manual_seed(0))
    bnn = zoo.BNN(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)), member="subnetwork_laplace")
    bnn.fit((x[:30], (x[:30, 0] > 0).long()), val=(x[30:], (x[30:, 0] > 0).long()), epochs=2, out=tmp_path / "run",
            progress=False)
    laplace_seconds = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["seconds"]
    structure_seconds = torch.load(tmp_path / "run" / "subnetwork.pt", weights_only=False)["seconds"]
    assert structure_seconds > 0 and bnn.seconds == pytest.approx(structure_seconds + laplace_seconds)
    assert bnn.metrics["train_seconds"] == round(bnn.seconds, 3)
    again = zoo.BNN.from_spec(bnn.spec).fit((x[:30], (x[:30, 0] > 0).long()), val=(x[30:], (x[30:, 0] > 0).long()),
                                            out=tmp_path / "run", resume=True, progress=False)
    assert again.seconds == pytest.approx(bnn.seconds)
