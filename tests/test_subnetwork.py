"""Subnetwork linearised Laplace: per-layer Jacobians and GGNs against dense autograd, the evidence against closed
forms, the GLM predictive against laplace-torch and a dense reference, selections, the Pyro pair, bad input."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pyro
import pytest
import torch
from pyro import poutine
from torch import nn

from tests.conftest import assert_input_error
from tests.laplace_reference import dense_glm, dense_jacobian, laplace_torch_glm, relative_difference, require_laplace
from zoo.curvature import DenseJacobian, LayerFactors, ParameterLayout, ggn
from zoo.errors import ZooInputError
from zoo.evaluate import evaluate
from zoo.inference.laplace import GaussianStatistics, linearised_mode, prior_groups
from zoo.likelihoods import Categorical, Gaussian, categorical_hessian_root
from zoo.models.subnetwork import SITE, subnet_size
from zoo.nets import build_cnn, build_mlp
from zoo.pipeline import load_run, prepare, train
from zoo.spec import load_spec

UCI_DIR = Path(os.environ.get("ZOO_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data" / "uci"))

TOY = {
    "data": {"name": "toy_gap"},
    "net": {"hidden": [10], "activation": "tanh"},
    "prior": {"name": "normal", "scale": 1.0},
    "likelihood": {"name": "gaussian", "noise": 0.1},
    "model": {"family": "subnetwork", "selection": {"strategy": "random", "size": 12},
              "map": {"num_steps": 300, "batch_size": None, "lr": 0.02}},
    "inference": {"method": "laplace", "tune": False},
    "device": "cpu",
    "dtype": "float64",
}
MOONS = {
    **TOY,
    "data": {"name": "two_moons", "n_train": 60},
    "likelihood": {"name": "categorical"},
    "net": {"hidden": [6], "activation": "tanh"},
}


def spec(base: dict, *overrides: str):
    return load_spec(base, list(overrides))


class _PositionMLP(torch.nn.Module):
    """A Linear layer applied at every position of a sequence (as in a transformer's feed-forward block), then a
    mean over positions: its weight's Jacobian sums over positions, as a 1x1 convolution's."""

    def __init__(self) -> None:
        super().__init__()
        self.inner, self.out = torch.nn.Linear(4, 5), torch.nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.inner(x.unflatten(-1, (4, 4)))).mean(-2))


NETS = {
    "mlp": lambda: build_mlp(3, 4, [5, 6], "tanh"),
    "cnn": lambda: build_cnn(16, 3, [5], "relu", channels=[2, 3]),
    "positions": _PositionMLP,
}


@pytest.mark.parametrize("kind", sorted(NETS))
def test_jacobian_from_layer_factors_equals_dense_autograd(kind):
    torch.manual_seed(0)
    net = NETS[kind]().double()
    x = torch.randn(7, 3 if kind == "mlp" else 16, dtype=torch.float64)
    layout = ParameterLayout(net)
    indices = torch.randperm(layout.size)[:40].sort().values
    factors = LayerFactors(net, layout, x)
    dense = dense_jacobian(net, x)[0]
    torch.testing.assert_close(factors.f, net(x).detach())
    torch.testing.assert_close(factors.jacobian(layout, indices), dense[:, :, indices], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("task", ["regression", "classification"])
@pytest.mark.parametrize("kind", sorted(NETS))
def test_diagonal_and_subnet_ggn_equal_dense(kind, task):
    torch.manual_seed(1)
    net = NETS[kind]().double()
    x = torch.randn(9, 3 if kind == "mlp" else 16, dtype=torch.float64)
    layout = ParameterLayout(net)
    factors = LayerFactors(net, layout, x)
    root = (Gaussian(0.3) if task == "regression" else Categorical()).output_hessian_root(factors.f, 0.3)
    dense = dense_jacobian(net, x)[0]
    if task == "regression":
        hessian = torch.eye(dense.shape[1], dtype=torch.float64) / 0.09
        full = torch.einsum("bop,boq,bqr->pr", dense, hessian.expand(9, -1, -1), dense)
    else:
        p = factors.f.softmax(-1)
        hessian = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)
        full = torch.einsum("bop,boq,bqr->pr", dense, hessian, dense)
    torch.testing.assert_close(factors.diagonal_ggn(layout, root), full.diagonal(), rtol=1e-9, atol=1e-12)
    indices = torch.tensor([0, 3, layout.size - 1, layout.size // 2])
    torch.testing.assert_close(ggn(factors.jacobian(layout, indices), root), full[indices][:, indices])


class _Gain(nn.Module):
    """A layer of the user's own: a learned per-channel gain (a parameter named neither weight nor bias)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.linspace(0.5, 1.5, channels))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h * self.gain[:, None]


class _AnyLayerNet(nn.Module):
    """Layers without Jacobian factors: an Embedding (of ids binned from x), a grouped ConvTranspose1d, a
    circularly padded Conv1d, a GroupNorm (at the MAP) and a layer of the user's own, then a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(9, 4)
        self.up = nn.ConvTranspose1d(4, 6, 3, stride=2, groups=2)
        self.norm = nn.GroupNorm(2, 6)
        self.gain = _Gain(6)
        self.down = nn.Conv1d(6, 3, 3, padding=1, padding_mode="circular")
        self.out = nn.Linear(3 + 4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = ((x[:, :6] * 3).floor().clamp(-4, 4) + 4).long()
        h = self.gain(self.norm(torch.tanh(self.up(self.embed(ids).transpose(1, 2)))))
        return self.out(torch.cat([torch.tanh(self.down(h)).mean(-1), x[:, 6:10]], -1))


@pytest.mark.parametrize("task", ["regression", "classification"])
def test_layers_without_factors_get_jacobians_and_ggn_diagonals_equal_to_dense_autograd(task, monkeypatch):
    # per-example vector-Jacobian products, in chunks of rows (a chunk of two rows forced here)
    import zoo.curvature

    monkeypatch.setattr(zoo.curvature, "PER_EXAMPLE_FLOATS", 2 * 4 * 9 * 4)
    torch.manual_seed(3)
    net = _AnyLayerNet().double()
    x = torch.randn(7, 16, dtype=torch.float64)
    layout = ParameterLayout(net)
    mask = layout.selectable()
    norm = next(slot for slot in layout.slots if slot.module_name == "norm")
    assert not mask[norm.offset:norm.offset + norm.numel].any() and int(mask.sum()) == layout.size - 12
    factors = LayerFactors(net, layout, x)
    assert set(factors.calls) == {"embed", "up", "gain", "down"}
    dense = dense_jacobian(net, x)[0]
    indices = mask.nonzero().squeeze(-1)
    torch.testing.assert_close(factors.jacobian(layout, indices), dense[:, :, indices], rtol=1e-10, atol=1e-12)
    root = (Gaussian(0.3) if task == "regression" else Categorical()).output_hessian_root(factors.f, 0.3)
    rj = torch.einsum("bpo,bod->bpd", root, dense)
    expected = rj.square().sum((0, 1)) * mask
    torch.testing.assert_close(factors.diagonal_ggn(layout, root), expected, rtol=1e-9, atol=1e-12)


def test_a_selectable_layer_that_returns_no_tensor_is_refused_by_name():
    class Pair(nn.Module):  # a layer with weights whose output is a pair (as nn.MultiheadAttention's)
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(2, 3))

        def forward(self, x: torch.Tensor):
            return x @ self.w.T, x

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pair, self.scale = Pair(), nn.Parameter(torch.ones(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.pair(x)[0] * self.scale

    net = Net()
    with pytest.raises(ZooInputError, match=r"'pair' \(Pair\) returns a tuple.*model.exclude: \[pair\]"):
        LayerFactors(net, ParameterLayout(net), torch.randn(4, 3))
    LayerFactors(net, ParameterLayout(net, lambda name, _: name != "pair"), torch.randn(4, 3))


@pytest.mark.parametrize("columns", [7, 301])
def test_the_blocked_gram_is_the_gram(columns):
    from zoo.curvature import symmetric_gram

    a = torch.randn(50, columns, dtype=torch.float64, generator=torch.Generator().manual_seed(columns))
    torch.testing.assert_close(symmetric_gram(a), a.T @ a, rtol=1e-12, atol=1e-12)


def test_linear_gaussian_evidence_is_the_exact_marginal_likelihood():
    # y = J theta + noise, theta ~ N(0, diag(1/lam)): log Z = log N(y; 0, J diag(1/lam) J^T + s^2 I)
    torch.manual_seed(2)
    J = torch.randn(20, 4, dtype=torch.float64)
    y = torch.randn(20, dtype=torch.float64)
    lam = torch.tensor([0.5, 2.0, 1.0, 3.0], dtype=torch.float64)
    noise = torch.tensor(0.7, dtype=torch.float64)
    stats = GaussianStatistics(J.T @ J, J.T @ y, y @ y, 20)
    theta, log_z = stats.mode_and_evidence(lam, noise)
    cov = J @ torch.diag(1 / lam) @ J.T + noise**2 * torch.eye(20, dtype=torch.float64)
    exact = torch.distributions.MultivariateNormal(torch.zeros(20, dtype=torch.float64), cov).log_prob(y)
    torch.testing.assert_close(log_z, exact)
    torch.testing.assert_close(theta, torch.linalg.solve(J.T @ J / noise**2 + torch.diag(lam), J.T @ y / noise**2))


def test_categorical_linearised_mode_is_stationary():
    torch.manual_seed(3)
    f = torch.randn(30, 3, dtype=torch.float64)
    J = DenseJacobian(torch.randn(30, 3, 5, dtype=torch.float64))
    y = torch.randint(3, (30,))
    centre = torch.randn(5, dtype=torch.float64)
    lam = torch.full((5,), 0.8, dtype=torch.float64)
    theta = linearised_mode(f, J, y, centre, lam).requires_grad_(True)
    logits = f + J @ (theta - centre)
    objective = -torch.nn.functional.cross_entropy(logits, y, reduction="sum") - 0.5 * (lam * theta**2).sum()
    (grad,) = torch.autograd.grad(objective, theta)
    assert grad.abs().max() < 1e-8
    # from another prior's mode, preconditioned for that prior: the same θ*
    other = linearised_mode(f, J, y, centre, lam * 5)
    stale = torch.linalg.cholesky(J.ggn(categorical_hessian_root(f)) + torch.diag(lam * 5))
    warm = linearised_mode(f, J, y, centre, lam, start=other, preconditioner=stale)
    torch.testing.assert_close(warm, theta.detach(), rtol=0, atol=1e-9)


def test_occam_derivatives_are_autograd_s_and_newton_finds_the_optimum():
    from zoo.inference.laplace import maximise_occam, occam_derivatives

    torch.manual_seed(4)
    root = torch.randn(40, 6, dtype=torch.float64)
    curvature = root.T @ root
    theta = torch.randn(6, dtype=torch.float64)
    group_index = torch.tensor([0, 0, 1, 1, 1, 2])

    def occam(log_precision):
        precision = log_precision.exp()[group_index]
        return (-0.5 * (precision * theta**2).sum() + 0.5 * precision.log().sum()
                - 0.5 * torch.logdet(curvature + torch.diag(precision)))

    start = torch.tensor([0.3, -1.0, 2.0], dtype=torch.float64)
    value, gradient, hessian = occam_derivatives(start, group_index, theta, curvature)
    torch.testing.assert_close(value, occam(start))
    torch.testing.assert_close(gradient, torch.autograd.functional.jacobian(occam, start))
    torch.testing.assert_close(hessian, torch.autograd.functional.hessian(occam, start))
    found = start.clone()
    maximise_occam(found, group_index, theta, curvature, iterations=50)
    assert occam(found) > occam(start)
    assert occam_derivatives(found, group_index, theta, curvature)[1].abs().max() < 1e-8


def test_one_precision_takes_the_eigenvalues_and_agrees_with_the_cholesky_path():
    """For one precision over every weight the Occam factor and its derivatives come from G's eigenvalues; they equal
    the general path's (a Cholesky factorisation and an inverse per value), and so does Newton's optimum."""
    from zoo.inference.laplace import _occam, _occam_of, maximise_occam, occam_derivatives

    torch.manual_seed(6)
    root = torch.randn(40, 7, dtype=torch.float64)
    curvature, theta = root.T @ root, torch.randn(7, dtype=torch.float64)
    one_group = torch.zeros(7, dtype=torch.long)
    eigenvalues = torch.linalg.eigvalsh(curvature)
    for log_precision in (torch.tensor([-2.0]), torch.tensor([0.7]), torch.tensor([4.0])):
        log_precision = log_precision.double()
        for got, want in zip(_occam_of(one_group, theta, curvature, 1)(log_precision),
                             occam_derivatives(log_precision, one_group, theta, curvature), strict=True):
            torch.testing.assert_close(got, want)
        precision = log_precision.exp().expand(7)
        torch.testing.assert_close(_occam(precision, theta, curvature, eigenvalues),
                                   _occam(precision, theta, curvature))
    by_eigenvalues, by_cholesky = torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
    maximise_occam(by_eigenvalues, one_group, theta, curvature, iterations=50, eigenvalues=eigenvalues)
    maximise_occam(by_cholesky, torch.zeros(7, dtype=torch.long), theta, curvature, iterations=50)
    torch.testing.assert_close(by_eigenvalues, by_cholesky)


@pytest.mark.parametrize("groups", [1, 2])
def test_the_linearised_mode_evidence_is_maximised(groups):
    """The rounds at the linearised mode (minorise-maximise) never lose evidence and end at a maximum of log Z(Λ) =
    max_θ [log p(y | f_lin(θ)) - ½ θᵀΛθ] + ½ log|Λ| - ½ log|G + Λ| (G at the MAP): moving any group's precision
    by 5% either way loses evidence."""
    import zoo.inference.laplace as laplace

    torch.manual_seed(7)
    f = torch.randn(60, 3, dtype=torch.float64)
    y = torch.randint(3, (60,))
    J = DenseJacobian(torch.randn(60, 3, 6, dtype=torch.float64))
    centre = torch.randn(6, dtype=torch.float64)
    group_index = torch.tensor([0, 0, 0, 1, 1, 1]) if groups == 2 else torch.zeros(6, dtype=torch.long)
    curvature = J.ggn(categorical_hessian_root(f))
    log_precision = torch.zeros(groups, dtype=torch.float64)
    log_z = laplace.tune_classification(f, J, y, centre, group_index, log_precision, 50, at_map=False)

    def evidence(log_values: torch.Tensor) -> float:
        return float(laplace.categorical_evidence(f, J, y, centre, log_values.exp()[group_index], False, curvature)[0])

    torch.testing.assert_close(float(log_z), evidence(log_precision))
    at_map_best = torch.zeros(groups, dtype=torch.float64)
    laplace.tune_classification(f, J, y, centre, group_index, at_map_best, 50, at_map=True)
    assert float(log_z) >= evidence(at_map_best)  # the rounds start there and never lose evidence
    for g in range(groups):
        for shift in (-0.05, 0.05):
            moved = log_precision.clone()
            moved[g] += shift
            assert evidence(moved) < float(log_z)


def test_evidence_rounds_stop_on_the_evidence_and_keep_the_best(monkeypatch):
    """Where the data do not need the weights, log Z flattens out as the precision grows: the rounds stop when one
    gains less than EVIDENCE_TOLERANCE, and the precisions returned are those of the best log Z."""
    import zoo.inference.laplace as laplace

    torch.manual_seed(5)
    f = 3 * torch.randn(50, 3, dtype=torch.float64)
    y = f.argmax(-1)  # the MAP's logits already fit every row: the subnet's weights are not needed
    J = DenseJacobian(0.1 * torch.randn(50, 3, 4, dtype=torch.float64))
    centre = 0.5 * torch.randn(4, dtype=torch.float64)
    group_index = torch.zeros(4, dtype=torch.long)
    seen = []
    evidence = laplace.categorical_evidence

    def recorded(*args, **kwargs):
        found = evidence(*args, **kwargs)
        seen.append(found[0])
        return found

    monkeypatch.setattr(laplace, "categorical_evidence", recorded)
    log_precision = torch.zeros(1, dtype=torch.float64)
    log_z = laplace.tune_classification(f, J, y, centre, group_index, log_precision, 50, at_map=False)
    gains = [float(b - a) for a, b in zip(seen, seen[1:], strict=False)]
    assert len(seen) >= 3  # rounds were run, and stopped before the cap
    assert len(seen) <= laplace.OUTER_ROUNDS + 1 and gains[-1] < laplace.EVIDENCE_TOLERANCE
    assert all(g >= laplace.EVIDENCE_TOLERANCE for g in gains[:-1])
    assert float(log_z) == max(float(v) for v in seen)
    curvature = J.ggn(categorical_hessian_root(f))
    again = laplace.categorical_evidence(f, J, y, centre, log_precision.exp()[group_index], False, curvature)[0]
    torch.testing.assert_close(again, log_z)  # the precisions kept are the best's


def test_prior_groups():
    names = ["hidden0.weight", "hidden0.weight", "hidden0.bias", "out.weight"]
    assert prior_groups(names, "scalar")[0].tolist() == [0, 0, 0, 0]
    index, labels = prior_groups(names, "layer")
    assert index.tolist() == [0, 0, 0, 1] and labels == ["hidden0", "out"]
    assert prior_groups(names, "parameter")[0].tolist() == [0, 0, 1, 2]


# ------------------------------------------------------------------------------------------ peer agreement
def _fitted(base: dict, tmp_path: Path, *overrides: str):
    summary = train(spec(base, *overrides), tmp_path / "run", progress=False, echo=None)
    return load_run(summary.run_dir)


def _peer_check(run_spec, data, posterior, reference) -> None:
    family = posterior.family
    task = "regression" if data.task == "regression" else "classification"
    noise = float(family.likelihood.fixed_noise) if task == "regression" else 1.0
    mean, cov = posterior.glm_moments(data.x_test)
    ref = reference(family.net, family.indices.cpu(), data.x_train, data.y_train, data.x_test, task,
                    family.prior_precision.cpu(), noise)
    assert relative_difference(mean, ref.mean) <= 1e-4
    assert relative_difference(cov, ref.var) <= 1e-4
    if task == "classification":
        probs = posterior.predict(data.x_test, num_samples=1).log_probs[0].exp()
        assert relative_difference(probs, ref.probs) <= 1e-4


def _laplace_torch(*args):
    require_laplace()
    return laplace_torch_glm(*args)


@pytest.mark.parametrize("reference", [dense_glm, _laplace_torch], ids=["dense", "laplace_torch"])
@pytest.mark.parametrize("base", ["toy", "moons"])
def test_glm_predictive_agrees_with_peer(base, reference, tmp_path):
    run_spec, data, posterior = _fitted(TOY if base == "toy" else MOONS, tmp_path)
    _peer_check(run_spec, data, posterior, reference)


@pytest.mark.skipif(not (UCI_DIR / "bostonHousing").is_dir(), reason=f"UCI data not found in {UCI_DIR} (the "
                    "shared benchmark data of CI; set ZOO_DATA_DIR to a folder holding bostonHousing)")
@pytest.mark.parametrize("reference", [dense_glm, _laplace_torch], ids=["dense", "laplace_torch"])
def test_glm_predictive_agrees_with_peer_on_a_uci_split(reference, tmp_path):
    base = {**TOY, "data": {"name": "uci:bostonHousing", "split": 0, "dir": str(UCI_DIR)},
            "net": {"hidden": [50], "activation": "relu"}, "likelihood": {"name": "gaussian", "noise": 3.0},
            "model": {**TOY["model"], "selection": {"strategy": "largest_variance", "size": 0.05}}}
    run_spec, data, posterior = _fitted(base, tmp_path)
    _peer_check(run_spec, data, posterior, reference)


# ------------------------------------------------------------------------------------------ the fit
def test_evidence_tuning_maximises_the_evidence(tmp_path):
    run_spec, data, posterior = _fitted(TOY, tmp_path, "inference.tune=true", "likelihood.noise=learned",
                                        "inference.prior_structure=scalar")
    family = posterior.family
    lam = family.prior_precision[0]
    noise = posterior.guide.point_estimate()["noise_scale"]
    f, J = family.linearise(data.x_train)
    J = J.dense()
    centre = posterior.guide.point_estimate()[SITE]
    pseudo = data.y_train - f[:, 0] + J[:, 0] @ centre
    stats = GaussianStatistics(J[:, 0].T @ J[:, 0], J[:, 0].T @ pseudo, pseudo @ pseudo, len(pseudo))

    def evidence(lam_value, noise_value):
        return float(stats.mode_and_evidence(torch.full_like(centre, lam_value), noise_value)[1])

    best = evidence(lam, noise)
    for factor in (0.8, 1.25):
        assert evidence(lam * factor, noise) < best
        assert evidence(lam, noise * factor) < best
    assert (tmp_path / "run" / "subnetwork.pt").exists() and (tmp_path / "run" / "map" / "point_estimate.pt").exists()


def test_posterior_covariance_is_the_inverse_ggn_plus_prior(tmp_path):
    _, data, posterior = _fitted(TOY, tmp_path)
    family = posterior.family
    _, J = family.linearise(data.x_train)
    J = J.dense()
    precision = J[:, 0].T @ J[:, 0] / family.likelihood.fixed_noise**2 + torch.diag(family.prior_precision)
    scale_tril = posterior.guide.scale_tril[SITE]
    torch.testing.assert_close(scale_tril @ scale_tril.T, torch.linalg.inv(precision))
    # the closed-form regression predictive adds the noise to the linearised variance
    pred = posterior.predict(data.x_test[:5], num_samples=1)
    mean, cov = posterior.glm_moments(data.x_test[:5])
    torch.testing.assert_close(pred.scale[0] ** 2, cov[:, 0, 0] + family.likelihood.fixed_noise**2)
    # Monte Carlo over the linearised net converges to the same moments
    pyro.set_rng_seed(0)
    draws = posterior.sample(4000)
    mc = posterior.predict(data.x_test[:5], draws=draws)
    assert torch.allclose(mc.loc.var(0), cov[:, 0, 0], rtol=0.1)


def test_model_log_density_is_prior_plus_likelihood(tmp_path):
    _, data, posterior = _fitted(TOY, tmp_path)
    family = posterior.family
    subnet = torch.randn(len(family.indices), dtype=torch.float64)
    trace = poutine.trace(poutine.condition(family.model, {SITE: subnet})).get_trace(data.x_train, data.y_train)
    flat = nn.utils.parameters_to_vector(family.net.parameters()).detach().clone()
    flat[family.indices] = subnet
    net = build_mlp(1, 1, [10], "tanh").double()
    nn.utils.vector_to_parameters(flat, net.parameters())
    by_hand = (torch.distributions.Normal(0, family.prior_precision.rsqrt()).log_prob(subnet).sum()
               + torch.distributions.Normal(net(data.x_train)[:, 0], family.likelihood.fixed_noise)
               .log_prob(data.y_train).sum())
    torch.testing.assert_close(trace.log_prob_sum(), by_hand)
    torch.testing.assert_close(family.log_likelihood({SITE: subnet[None]}, data.x_train, data.y_train).sum(),
                               trace.nodes["obs"]["fn"].log_prob(data.y_train).sum())


def test_reload_gives_the_same_predictions(tmp_path):
    summary = train(spec(TOY, "inference.tune=true"), tmp_path / "run", progress=False, echo=None)
    run_spec, data, posterior = load_run(summary.run_dir)
    again = evaluate(posterior, data, run_spec.inference.predictive_samples, seed=run_spec.seed)
    stored = {k: v for k, v in summary.metrics.items() if k != "train_seconds"}  # computed before anything was saved
    assert again == pytest.approx(stored, rel=1e-6)
    assert posterior.family.prior_precision.ne(1.0).all()  # the tuned precision came back, not the spec's


def test_same_model_by_nuts_and_by_full_rank_svi(tmp_path):
    nuts = train(spec(TOY, "inference:={method: nuts, num_chains: 1, warmup_steps: 30, num_samples: 20, "
                      "max_tree_depth: 4, predictive_samples: 20}"), tmp_path / "nuts", progress=False, echo=None)
    svi = train(spec(TOY, "inference:={method: svi, num_steps: 50, batch_size: null, lr: 0.01}",
                     "guide.name=full_rank"), tmp_path / "svi", progress=False, echo=None)
    for summary in (nuts, svi):
        assert math.isfinite(summary.metrics["test_ll"])
    _, _, posterior = load_run(svi.run_dir)
    assert posterior.sample(3)[SITE].shape == (3, 12)
    guide = posterior.guide  # its sd per weight (what SNR pruning reads) is the full covariance's marginal sd
    covariance = guide.distribution(SITE).covariance_matrix
    torch.testing.assert_close(guide.scale(SITE), covariance.diagonal().sqrt())


def test_selections_pick_what_they_say(tmp_path):
    modules = ["model.selection.modules=[hidden0]"]
    for strategy, extra in [("largest_magnitude", []), ("last_layer", []), ("modules", modules),
                            ("largest_variance", [])]:
        data, family, _, _ = prepare(spec(TOY, f"model.selection.strategy={strategy}", *extra))
        flat = nn.utils.parameters_to_vector(family.net.parameters()).detach()
        if strategy == "largest_magnitude":
            assert set(family.indices.tolist()) == set(flat.abs().topk(12).indices.tolist())
        elif strategy == "last_layer":
            assert set(family.parameter_names()) == {"out.weight", "out.bias"} and len(family.indices) == 11
        elif strategy == "modules":
            assert set(family.parameter_names()) == {"hidden0.weight", "hidden0.bias"} and len(family.indices) == 20
        else:
            jac = dense_jacobian(family.net, data.x_train)[0]  # [B, 1, P]: diag GGN = sum_b J^2 / noise^2
            diag = (jac**2).sum((0, 1)) / (0.1 / data.y_std) ** 2
            assert set(family.indices.tolist()) == set((1 / (diag + 1.0)).topk(12).indices.tolist())
    a = prepare(spec(TOY))[1].indices
    b = prepare(spec(TOY))[1].indices
    assert torch.equal(a, b) and len(a) == 12  # seeded
    assert subnet_size(0.05, 151) == 8 and subnet_size(3, 151) == 3
    assert subnet_size(1.0, 151) == 151 and subnet_size(1, 151) == 1


@pytest.mark.parametrize(("overrides", "message"), [
    (["model.selection.size=500"], "only 31 weights"),
    (["model.selection.size=0"], "at least 1"),
    (["model.selection.size=2.5"], "give a count as a whole number"),
    (["model.selection.strategy=modules", "model.selection.modules=[nope]"], "hidden0, out"),
    (["model.selection.modules=[out]"], "only the 'modules' strategy"),
    (["prior.name=cauchy"], "zero-mean Normal prior"),
    (["prior.scale=0"], "greater than 0"),
    (["guide.name=mean_field"], "laplace guide"),
    (["model:={family: all_weights}"], "use model.family: subnetwork"),
])
def test_bad_input_exits_2_with_a_hint(overrides, message, tmp_path, capsys):
    assert message in assert_input_error(TOY, overrides, [], tmp_path, capsys)


def test_classification_guide_rejects_a_precision_of_zero(tmp_path):
    _, _, posterior = _fitted(MOONS, tmp_path)
    with pytest.raises(ValueError, match="positive"):
        posterior.family.set_hyperparameters({"prior_precision": torch.zeros(12, dtype=torch.float64)})
    with pytest.raises(ZooInputError):
        prepare(spec(MOONS, "model.selection.size=1000"))


def test_regression_metrics_use_the_closed_form_glm_predictive(tmp_path):
    from zoo import metrics
    from zoo.evaluate import evaluate

    _, data, posterior = _fitted(TOY, tmp_path)
    pred = posterior.predict(data.x_test, num_samples=1)
    exact = metrics.regression_metrics(pred.loc, pred.scale, data.y_test, data.y_mean, data.y_std)
    assert evaluate(posterior, data, num_samples=5) == exact  # not a 5-draw mixture
    posterior.predictive = "nn"  # the net at draws: a 5-draw mixture, not the closed form
    assert evaluate(posterior, data, num_samples=5) != exact


@pytest.mark.parametrize("link", ["probit", "bridge"])
def test_every_classification_score_uses_the_link_the_spec_names(link, tmp_path):
    from zoo import metrics
    from zoo.bnn import BNN

    _, data, posterior = _fitted(MOONS, tmp_path, f"inference.link={link}")
    assert posterior.scoring_draws(50) is None  # a closed form: no draws to share
    pred = posterior.predict(data.x_test, num_samples=1)
    exact = metrics.classification_metrics(pred.log_probs, data.y_test)
    scores = evaluate(posterior, data, num_samples=50)
    assert {k: scores[k] for k in exact} == exact  # not 50 Monte Carlo draws of the linearised logits
    assert "ood_auroc_mi_far" not in scores  # one closed-form predictive has no spread between draws
    assert (tmp_path / "run" / "metrics.json").exists()
    bnn = BNN.load(tmp_path / "run")
    assert bnn.metrics["nll"] == pytest.approx(exact["nll"], rel=1e-6)  # metrics.json: the same predictive
    probs = bnn.predict(data.x_test * data.x_std + data.x_mean).probs
    nll = -probs.double().gather(-1, data.y_test.long()[:, None]).log().mean()
    assert float(nll) == pytest.approx(exact["nll"], rel=1e-6)  # predict and evaluate: one NLL
    posterior.link = "mc"  # Monte Carlo over the linearised logits: 5 draws of them, not the closed form
    scores = evaluate(posterior, data, num_samples=5)
    assert {k: scores[k] for k in exact} != exact


def test_mc_draws_the_logits_from_their_gaussian_as_weight_draws_would(tmp_path):
    """``link: mc`` without weight draws samples the linearised logits from N(f, J Σ Jᵀ): the same predictive as
    linearising at weight draws. With 4,000 draws each, the two class probabilities agree to Monte Carlo error
    (their logits' means and covariances are the GLM's moments; a wrong root or a dropped correlation fails)."""
    _, data, posterior = _fitted(MOONS, tmp_path, "inference.link=mc", "inference.tune=true")
    x = data.x_test[:40]
    torch.manual_seed(0)
    by_logits = posterior.predict(x, num_samples=4000).log_probs
    by_weights = posterior.predict(x, draws=posterior.sample(4000)).log_probs
    assert by_logits.shape == by_weights.shape == (4000, 40, 2)
    p_logits, p_weights = by_logits.exp(), by_weights.exp()
    error = (p_logits.var(0) / 4000 + p_weights.var(0) / 4000).sqrt()
    assert bool(((p_logits.mean(0) - p_weights.mean(0)).abs() <= 5 * error + 1e-6).all())
    assert float(p_logits.var(0).mean()) == pytest.approx(float(p_weights.var(0).mean()), rel=0.15)
    mean, covariance = posterior.glm_moments(x)
    logits = by_logits[:, :, 1] - by_logits[:, :, 0]  # log-odds: linear in the logits, so Gaussian
    torch.testing.assert_close(logits.mean(0), mean[:, 1] - mean[:, 0], atol=0.2, rtol=0.05)
    odds_variance = covariance[:, 0, 0] + covariance[:, 1, 1] - 2 * covariance[:, 0, 1]
    torch.testing.assert_close(logits.var(0), odds_variance, atol=1e-3, rtol=0.15)


def test_a_classification_fit_with_calibration_rows_predicts_by_the_likeliest_link_there(tmp_path):
    """With calibration rows a classification Laplace chooses its link (probit, bridge or draws of the logits) by
    their NLL, each in its log line: the closed forms' NLLs are those recomputed here from the GLM's moments, the
    draws' within Monte Carlo error of 4,000 draws, and the chosen link has the least; the run reloads with it;
    ``link_by: fixed`` keeps the spec's link; ``link_by: calibration`` without the rows is refused."""
    import re

    from zoo.inference.laplace import LINKS, link_log_probs

    # the MAP at the spec's prior: its calibration rows choose a link other than the spec's
    _, data, posterior = _fitted(MOONS, tmp_path / "a", "data.calibration_fraction=0.3", "inference.tune=true",
                                 "inference.link=bridge", "model.map.prior_scale_factor=1")
    assert posterior.link != "bridge"  # the reloaded run predicts by the link chosen, not the spec's
    log = (tmp_path / "a" / "run" / "train.log").read_text()
    y = data.y_calibration.long()[:, None]
    line = re.search(rf"laplace: link (\w+), the likeliest on {len(y)} calibration rows \(NLL (.*)\)", log)
    logged = {link: float(value) for link, value in (part.split() for part in line.group(2).split(", "))}
    assert set(logged) == set(LINKS) and line.group(1) == min(logged, key=logged.get) == posterior.link
    mean, covariance = posterior.glm_moments(data.x_calibration)
    for link in LINKS:
        log_probs = link_log_probs(link, mean.double(), covariance.double(), 4000, torch.Generator().manual_seed(1))
        each = -(log_probs.logsumexp(0) - math.log(len(log_probs))).gather(1, y)
        assert logged[link] == pytest.approx(float(each.mean()), abs=5e-5 if link != "mc" else 0.01), link
    assert logged["bridge"] != pytest.approx(logged["probit"], abs=1e-3)  # the choice has a difference to make
    _, _, fixed = _fitted(MOONS, tmp_path / "b", "data.calibration_fraction=0.3", "inference.tune=true",
                          "inference.link=probit", "inference.link_by=fixed")
    assert fixed.link == "probit"
    with pytest.raises(ZooInputError, match="inference.link_by: chooses a classification GLM's link on rows held out"):
        _fitted(MOONS, tmp_path / "c", "inference.link_by=calibration")


DIGITS_HEAD = {**MOONS, "data": {"name": "digits", "calibration_fraction": 0.3},
               "net": {"hidden": [16], "activation": "tanh"},
               "model": {**MOONS["model"], "selection": {"strategy": "last_layer"}},
               "inference": {"method": "laplace", "tune": True}}


def _widened_evidence(monkeypatch, factor: float = 1e3) -> None:
    """The evidence's tuned prior precisions divided by ``factor``: a posterior wider than the rows support."""
    from zoo.inference import laplace

    tune = laplace.tune_classification

    def widened(*args, **kwargs):
        log_z = tune(*args, **kwargs)
        args[5].sub_(math.log(factor))  # the log precisions, tuned in place
        return log_z

    monkeypatch.setattr(laplace, "tune_classification", widened)


def test_the_rows_reject_a_posterior_only_beyond_1_645_standard_errors_of_the_map():
    """The rows reject the likeliest link's predictive when its mean NLL exceeds the MAP net's by more than 1.645
    standard errors of the paired per-row differences (one-sided, 5 %): a mean excess of 0.1 over rows whose
    differences spread by 1 is rejected on 400 rows (standard error 0.05: 2 of them) and kept on 100 (0.1: 1 of
    them); a NaN link never wins."""
    from zoo.inference.laplace import LINKS, _likeliest

    spread = torch.tensor([1.0, -1.0]).repeat(200).double()
    for rows, rejected in ((400, True), (100, False)):
        excess = 0.1 + spread[:rows] * math.sqrt((rows - 1) / rows)  # the rows' standard deviation exactly 1
        map_nll = torch.full((rows,), 0.5, dtype=torch.float64)
        nll = {link: map_nll + excess + k for k, link in enumerate(LINKS)}
        assert _likeliest(nll, map_nll) == (LINKS[0], rejected), rows
    nll[LINKS[0]] = torch.full((100,), math.inf, dtype=torch.float64)
    assert _likeliest(nll, map_nll)[0] == LINKS[1]


def test_calibration_rows_that_reject_the_evidence_prior_choose_its_scale(tmp_path, monkeypatch):
    """Where the calibration rows score the MAP net alone likelier than every link, beyond noise, the fit scales the
    evidence's prior precisions by the factor of 1 and 10^0.5 to 10^4 whose likeliest link scores best there: the
    factors a step either side score worse, the chosen prior is the evidence's times it, it is kept in
    ``bnn.chosen`` (a resumed fit's too), and given back (``inference.precision_scale``) it fits the same posterior
    with nothing left to choose but the link. The evidence's own prior on this net is not rejected, and keeps its
    spread."""
    from zoo.bnn import BNN
    from zoo.inference.laplace import LINKS, PRECISION_SCALES, _likeliest, _row_nlls, link_log_probs

    def run(name: str, *overrides: str) -> BNN:
        return BNN.load(train(spec(DIGITS_HEAD, *overrides), tmp_path / name, progress=False, echo=None).run_dir)

    def scored(bnn: BNN) -> tuple[float, bool]:
        """The likeliest link's NLL on the calibration rows, and whether they reject it against the MAP."""
        y = bnn.data.y_calibration.long()
        mean, covariance = bnn.posterior.glm_moments(bnn.data.x_calibration)
        generator = torch.Generator().manual_seed(bnn.spec.seed)
        nll = {link: _row_nlls(link_log_probs(link, mean.double(), covariance.double(), 200, generator), y)
               for link in LINKS}
        best, rejected = _likeliest(nll, _row_nlls(torch.log_softmax(mean.double(), -1)[None], y))
        return float(nll[best].mean()), rejected

    evidence = run("evidence")
    assert "calibration rows score the MAP net alone" not in (tmp_path / "evidence" / "train.log").read_text()
    assert "inference.precision_scale" not in evidence.chosen and not scored(evidence)[1]

    _widened_evidence(monkeypatch)
    wide, guarded = run("wide", "inference.precision_scale=1"), run("guarded")
    assert "calibration rows score the MAP net alone likelier" in (tmp_path / "guarded" / "train.log").read_text()
    factor = guarded.chosen["inference.precision_scale"]
    assert factor in PRECISION_SCALES and guarded.chosen["inference.link"] == guarded.posterior.link
    assert "inference.precision_scale" not in wide.chosen and scored(wide)[1]  # given, not chosen
    torch.testing.assert_close(guarded.posterior.family.prior_precision,
                               wide.posterior.family.prior_precision * factor)
    where = PRECISION_SCALES.index(factor)
    for other in PRECISION_SCALES[max(where - 1, 0):where] + PRECISION_SCALES[where + 1:where + 2]:
        assert scored(run(f"x{other:g}", f"inference.precision_scale={other!r}"))[0] >= scored(guarded)[0], other
    (tmp_path / "guarded" / "chosen.json").unlink()  # a finished fit resumed reads its choice from its checkpoint
    resumed = train(spec(DIGITS_HEAD), tmp_path / "guarded", resume=True, progress=False, echo=None).run_dir
    assert BNN.load(resumed).chosen == guarded.chosen

    handed_back = run("again", f"inference.precision_scale={factor!r}")
    assert handed_back.chosen == {k: v for k, v in guarded.chosen.items() if k != "inference.precision_scale"}
    torch.testing.assert_close(handed_back.posterior.guide.state_dict(), guarded.posterior.guide.state_dict(),
                               rtol=0, atol=0)


def test_a_factor_on_the_prior_precision_is_chosen_only_over_the_evidence(tmp_path, monkeypatch):
    """The factor is chosen only over an evidence-tuned prior: a prior the spec fixes (``tune: false``) or a
    precision the calibration rows' grid chose keeps its value, however the rows score it against the MAP."""
    from zoo.bnn import BNN

    _widened_evidence(monkeypatch)
    for name, overrides in {"fixed": ("inference.tune=false", "prior.scale=100"),
                            "grid": ("inference.tune_by=calibration", "inference.prior_structure=scalar")}.items():
        run = train(spec(DIGITS_HEAD, *overrides), tmp_path / name, progress=False, echo=None).run_dir
        assert "calibration rows score the MAP net alone" not in (run / "train.log").read_text(), name
        assert "inference.precision_scale" not in BNN.load(run).chosen, name


def test_laplace_bridge_inverts_the_dirichlet_laplace_approximation():
    """A Dirichlet(α) in the softmax basis has the Laplace approximation μ_k = log α_k - mean(log α),
    Σ_kk = (1 - 2/K)/α_k + Σ_l (1/α_l)/K²; the bridge maps (μ, diag Σ) back to that Dirichlet, whose mean it
    returns."""
    from zoo.inference.laplace import laplace_bridge

    alpha = torch.rand(7, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 5 + 0.2
    classes = alpha.shape[-1]
    mean = alpha.log() - alpha.log().mean(-1, keepdim=True)
    variance = (1 - 2 / classes) / alpha + (1 / alpha).sum(-1, keepdim=True) / classes**2
    expected = alpha / alpha.sum(-1, keepdim=True)
    torch.testing.assert_close(laplace_bridge(mean + 3.0, variance).exp(), expected)  # shifted logits: the same
    assert torch.allclose(laplace_bridge(torch.zeros(2, 3), torch.ones(2, 3)).exp(), torch.full((2, 3), 1 / 3))
    # two classes (1 - 2/K = 0), and a confident net's logits spread past float32's exp range: finite, and as in
    # float64
    for logits, spread in ((mean[:, :2], variance[:, :2]), (torch.tensor([[150.0, -60.0, 0.0]]),
                                                            torch.tensor([[1e-3, 2.0, 0.5]]))):
        single = laplace_bridge(logits.float(), spread.float())
        assert torch.isfinite(single).all()
        torch.testing.assert_close(single.double(), laplace_bridge(logits.double(), spread.double()))


def test_precision_to_scale_tril_is_the_cholesky_factor_of_the_inverse():
    from zoo.inference.laplace import precision_to_scale_tril

    torch.manual_seed(4)
    a = torch.randn(6, 6, dtype=torch.float64)
    precision = a @ a.T + torch.eye(6, dtype=torch.float64)
    factor = precision_to_scale_tril(precision)
    torch.testing.assert_close(factor, torch.linalg.cholesky(torch.linalg.inv(precision)))


def test_a_singular_laplace_fit_stops_with_a_diagnosis(tmp_path, monkeypatch):
    from zoo.errors import TrainingDiverged
    from zoo.inference import laplace

    def singular(precision):
        raise torch.linalg.LinAlgError("linalg.cholesky: The factorization could not be completed")

    monkeypatch.setattr(laplace, "precision_to_scale_tril", singular)
    with pytest.raises(TrainingDiverged, match="model.map.num_steps"):
        train(spec(TOY), tmp_path / "run", progress=False, echo=None)


def test_post_hoc_laplace_of_a_net_with_a_learned_noise_starts_it_at_the_residuals(tmp_path):
    """A trained net's own weights hold no learned noise (``map_from: net`` once raised KeyError 'noise_scale'): it
    starts at its maximum-likelihood value at those weights, the residuals' root mean square, and the evidence tunes
    it from there."""
    import zoo

    torch.manual_seed(0)
    x = torch.randn(64, 3)
    y = x[:, 0] + 0.3 * torch.randn(64)
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    with torch.no_grad():
        residual_rms = float((net(x)[:, 0] - y).square().mean().sqrt())
    bnn = zoo.BNN(net, member="subnetwork_laplace", family={"family": "subnetwork", "map_from": "net"},
                  likelihood={"name": "gaussian", "noise": "learned"})
    bnn.fit((x, y), val=(x, y), progress=False)
    site = bnn.family.likelihood.noise_site
    assert float(bnn.family.map_values[site]) == pytest.approx(residual_rms, rel=1e-5)
    assert math.isfinite(bnn.metrics["test_ll"])


def test_a_fraction_is_capped_at_the_covariance_memory_holds_and_a_count_is_refused(tmp_path, monkeypatch):
    """The guide's dense k x k matrices bound a sized selection too: with room for 20 weights (of the toy's 31), a
    fraction is capped at 20 with a log line naming the matrices, and a count of 21 is refused before the MAP fit."""
    import zoo.models.subnetwork as subnetwork

    monkeypatch.setattr(subnetwork, "most_covariance_dim", lambda element_size, copies: 20)
    lines = []
    summary = train(spec(TOY, "model.selection.size=1.0"), tmp_path / "fraction", progress=False, echo=lines.append)
    assert len(load_run(summary.run_dir)[2].family.indices) == 20
    assert any("model.selection.size 1.0 is 31 of 31 weights" in line and "dense k x k matrices" in line
               and "capped at 20" in line for line in lines)
    with pytest.raises(ZooInputError, match="model.selection.size: got 21; 21 weights are more than this run can hold"):
        train(spec(TOY, "model.selection.size=21"), tmp_path / "count", progress=False, echo=None)
    assert not (tmp_path / "count" / "map").exists()


def test_the_stored_jacobian_is_bounded_by_what_it_holds(tmp_path, monkeypatch):
    """The classification Laplace keeps every row's Jacobian: over a selection of single weights it is dense, so at
    most MAX_STORED_JACOBIAN // (60 rows x 2 outputs) = 8 weights here. A count above that is refused before the
    MAP fit, naming the most; a fraction (a share of the net, as the preset's 10 %) is capped there with a log line
    and fitted; a last layer kept as its factors holds 60 x (2 x 2 + 6) + 60 x (2 x 2 + 1) = 900 and fits under the
    same bound. The fit's own check stays behind them (1,440 numbers for 12 weights)."""
    import zoo.inference.laplace as laplace

    monkeypatch.setattr(laplace, "MAX_STORED_JACOBIAN", 1_000)
    with pytest.raises(ZooInputError, match=r"model.selection.size: got 12; 12 weights are more than this run can "
                       r"hold \(a classification Laplace keeps the Jacobian of every row, 60 rows x 2 outputs.*give "
                       r"model.selection.size: 8 or fewer"):
        _fitted(MOONS, tmp_path / "selection")
    assert not (tmp_path / "selection" / "run" / "map").exists()  # refused before the MAP fit
    lines = []
    summary = train(spec(MOONS, "model.selection.size=0.5"), tmp_path / "fraction" / "run", progress=False,
                    echo=lines.append)
    assert len(load_run(summary.run_dir)[2].family.indices) == 8
    assert any("model.selection.size 0.5 is 16 of 32 weights, more than this run can hold" in line
               and "capped at 8 (25%)" in line for line in lines)
    _fitted(MOONS, tmp_path / "last_layer", "model.selection.strategy=last_layer")
    monkeypatch.setattr(laplace.Laplace, "most_weights", lambda *args: None)  # without the bound: the fit's check
    with pytest.raises(ZooInputError, match="1,440 numbers here"):
        _fitted(MOONS, tmp_path / "unbounded")
