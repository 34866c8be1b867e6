"""The Kronecker-factored (KFAC) Laplace (``guide.covariance: kron``) over every weight or the last layer: its factors
against the exact GGN and curvlinops, its Gaussian's draws, density and output covariance against dense algebra,
its evidence and predictive against laplace-torch, end-to-end fits on nets with BatchNorm and LayerNorm, and its
refusals."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from guides.laplace import KroneckerNormal
from tests.laplace_reference import (
    assert_agrees_with_laplace_torch,
    dense_jacobian,
    relative_difference,
    require_laplace,
)
from tests.test_laplace_diagonal import NETS
from tests.test_subnetwork import MOONS, TOY, _fitted, _PositionMLP, spec
from zoo.curvature import KroneckerBlock, LayerFactors, ParameterLayout
from zoo.errors import ZooInputError
from zoo.evaluate import evaluate
from zoo.likelihoods import categorical_hessian_root
from zoo.models.subnetwork import SITE

KRON = ("guide.covariance=kron", "model.selection.strategy=all")


def _random_blocks(layout: ParameterLayout, generator: torch.Generator) -> list[KroneckerBlock]:
    """A Kronecker-factored Gaussian of random orthogonal bases and scales over every selectable tensor."""
    blocks = []
    for slot in (s for s in layout.slots if s.selectable):
        rows, cols = slot.shape[0], slot.numel // slot.shape[0]
        basis = [torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64))[0] for n in (rows, cols)]
        blocks.append(KroneckerBlock(*basis, torch.rand(rows, cols, generator=generator, dtype=torch.float64) + 0.1))
    return blocks


def _dense(block: KroneckerBlock) -> torch.Tensor:
    """The block's covariance written out: (Q_G ⊗ Q_A) diag(scale²) (Q_G ⊗ Q_A)ᵀ over the row-major tensor."""
    basis = torch.kron(block.rows, block.cols)
    return basis @ torch.diag(block.scale.flatten().square()) @ basis.T


@pytest.mark.parametrize("kind", [*sorted(NETS), "positions"])
def test_output_covariance_equals_dense_autograd(kind):
    """J Σ Jᵀ from the layer factors in each block's eigenbases equals the dense Jacobian times the dense
    block-diagonal Σ, on a BatchNorm conv net, a LayerNorm net and a Linear layer over positions."""
    torch.manual_seed(0)
    net = (_PositionMLP() if kind == "positions" else NETS[kind]()).double()
    x = torch.randn(5, 16, dtype=torch.float64)
    layout = ParameterLayout(net)
    slots = [s for s in layout.slots if s.selectable]
    blocks = _random_blocks(layout, torch.Generator().manual_seed(1))
    J = dense_jacobian(net, x)[0][:, :, layout.selectable()]
    covariance = torch.block_diag(*[_dense(b) for b in blocks])
    got = LayerFactors(net, layout, x).kronecker_output_covariance(slots, blocks)
    torch.testing.assert_close(got, J @ covariance @ J.transpose(1, 2))


def test_one_row_through_linear_layers_gives_the_exact_ggn_blocks():
    """With one row and no weight sharing KFAC is exact: G ⊗ A is the GGN's block of each weight and bias."""
    torch.manual_seed(0)
    net = NETS["layer_norm"]().double()
    x = torch.randn(1, 16, dtype=torch.float64)
    layout = ParameterLayout(net)
    slots = [s for s in layout.slots if s.selectable]
    factors = LayerFactors(net, layout, x)
    root = categorical_hessian_root(factors.f)
    J = dense_jacobian(net, x)[0]
    for slot, (rows, cols, count) in zip(slots, factors.kronecker_factors(slots, root), strict=True):
        columns = J[:, :, slot.offset:slot.offset + slot.numel]
        exact = torch.einsum("bpo,bod->bpd", root, columns).flatten(0, 1)
        torch.testing.assert_close(torch.kron(rows, cols / count), exact.T @ exact)


def test_factors_equal_curvlinops_kfac_on_a_conv_net():
    """The expand-KFAC factors of a conv net (weights shared over positions) equal curvlinops' (type-2 Fisher, sum
    reduction): G as summed, A as Σ h hᵀ over rows and positions divided by their count."""
    require_laplace()  # curvlinops comes with laplace-torch
    from curvlinops import KFACLinearOperator

    torch.manual_seed(0)
    net = nn.Sequential(nn.Unflatten(1, (1, 4, 4)), nn.Conv2d(1, 3, 3, padding=1), nn.Tanh(), nn.Flatten(),
                        nn.Linear(48, 3)).double()
    x, y = torch.randn(7, 16, dtype=torch.float64), torch.arange(7) % 3
    layout = ParameterLayout(net)
    slots = [s for s in layout.slots if s.selectable]
    factors = LayerFactors(net, layout, x)
    ours = factors.kronecker_factors(slots, categorical_hessian_root(factors.f))
    peer = KFACLinearOperator(net, nn.CrossEntropyLoss(reduction="sum"), list(net.parameters()), [(x, y)],
                              fisher_type="type-2", check_deterministic=False)
    peer.compute_kronecker_factors()
    for module in ("1", "4"):
        weight = next(k for k, s in enumerate(slots) if s.name == f"{module}.weight")
        rows, cols, count = ours[weight]
        torch.testing.assert_close(rows, peer._gradient_covariances[module])
        torch.testing.assert_close(cols / count, peer._input_covariances[module])
        torch.testing.assert_close(ours[weight + 1][0], peer._gradient_covariances[module])  # the bias's G
        assert ours[weight + 1][1] / ours[weight + 1][2] == 1  # and its A


def test_kronecker_normal_is_the_dense_gaussian():
    """Its density is the dense N(loc, Σ)'s, its variances Σ's diagonal, and its draws have covariance Σ."""
    generator = torch.Generator().manual_seed(0)
    layout = ParameterLayout(nn.Sequential(nn.Linear(3, 2), nn.Tanh(), nn.Linear(2, 2)))
    blocks = _random_blocks(layout, generator)
    covariance = torch.block_diag(*[_dense(b) for b in blocks])
    loc = torch.randn(len(covariance), generator=generator, dtype=torch.float64)
    ours = KroneckerNormal(loc, blocks)
    dense = torch.distributions.MultivariateNormal(loc, covariance)
    value = torch.randn(4, len(loc), generator=generator, dtype=torch.float64)
    torch.testing.assert_close(ours.log_prob(value), dense.log_prob(value))
    torch.testing.assert_close(ours.variance, covariance.diagonal())
    torch.manual_seed(0)
    draws = ours.rsample(torch.Size([40_000]))
    assert draws.shape == (40_000, len(loc))
    assert relative_difference(draws.T.cov(), covariance) < 0.03
    assert relative_difference(draws.mean(0), loc) < 0.03


@pytest.mark.parametrize("subset", ["all", "last_layer"])
@pytest.mark.parametrize("base", ["toy", "moons"])
def test_agrees_with_laplace_torch_kron(base, subset, tmp_path):
    """The same log evidence and GLM predictive (probit for classification) as laplace-torch's Kronecker-factored
    Laplace over the same weights, fitted on one batch at the same prior precision, to 1e-6 relative."""
    require_laplace()
    _, data, posterior = _fitted(TOY if base == "toy" else MOONS, tmp_path, "guide.covariance=kron",
                                 f"model.selection.strategy={subset}")
    assert_agrees_with_laplace_torch(posterior, data, tmp_path / "run", subset, "kron")


def test_tuning_maximises_the_evidence_and_sets_the_posterior(tmp_path):
    """With the prior precisions (one per layer) and the noise tuned, log Z falls when any of them moves, and the
    guide holds (G/σ² ⊗ A + δ)⁻¹ at the tuned values."""
    from zoo.inference.laplace import KroneckerStatistics

    _, data, posterior = _fitted(TOY, tmp_path, *KRON, "inference.tune=true", "likelihood.noise=learned")
    family, guide = posterior.family, posterior.guide
    centre, noise = guide.point_estimate()[SITE], guide.point_estimate()["noise_scale"]
    slots = family.whole_tensors()
    f, sums = family.kronecker_factors(data.x_train, 1.0)
    eig = [(torch.linalg.eigh(g), torch.linalg.eigh(a / c)) for g, a, c in sums]
    sizes = [s.numel for s in slots]
    stats = KroneckerStatistics(output_eigenvalues=[g.eigenvalues for g, _ in eig],
                                output_bases=[g.eigenvectors for g, _ in eig],
                                input_eigenvalues=[a.eigenvalues for _, a in eig],
                                input_bases=[a.eigenvectors for _, a in eig],
                                starts=[sum(sizes[:k]) for k in range(len(sizes))], log_likelihood=None,
                                sum_squares=(data.y_train - f[:, 0]).square().sum(), n=data.n_train)
    precision = family.prior_precision
    best = float(stats.evidence(precision, centre, noise))
    layers = {s.module_name for s in slots}
    for layer in layers:
        moved = precision.clone()
        for s in (s for s in slots if s.module_name == layer):
            start = sum(sizes[:slots.index(s)])
            moved[start:start + s.numel] *= 1.3
        assert float(stats.evidence(moved, centre, noise)) < best
    for factor in (0.9, 1.1):
        assert float(stats.evidence(precision, centre, noise * factor)) < best
    dense = torch.block_diag(*[torch.linalg.inv(torch.kron(g, a / c) / noise**2 + precision[sum(sizes[:k])]
                                                * torch.eye(g.shape[0] * a.shape[0], dtype=g.dtype))
                               for k, (g, a, c) in enumerate(sums)])
    torch.testing.assert_close(guide.variance(SITE), dense.diagonal())


@pytest.mark.parametrize("kind", sorted(NETS))
def test_fits_and_predicts_on_nets_with_normalisation_layers(kind, tmp_path):
    """The KFAC member over every weight of a BatchNorm conv net and a LayerNorm net, post hoc from the net's own
    weights: it fits, predict and evaluate give one NLL under each link, the net itself predicts at draws, and the
    run reloads to the same posterior."""
    import zoo

    torch.manual_seed(0)
    net = NETS[kind]()
    x = torch.randn(60, 16, generator=torch.Generator().manual_seed(0))
    y = x[:, :3].argmax(-1)
    bnn = zoo.BNN(net, member="kfac_laplace", family={"map_from": "net"})
    bnn.fit((x[:40], y[:40]), val=(x[40:], y[40:]), out=tmp_path / "run", progress=False)
    posterior = bnn.posterior
    for link in ("bridge", "probit", "mc"):
        posterior.link = link
        torch.manual_seed(1)
        scores = evaluate(posterior, bnn.data, num_samples=50)
        torch.manual_seed(1)
        log_probs = posterior.predict(bnn.data.x_test, num_samples=50).log_probs.logsumexp(0) - (
            0 if link != "mc" else torch.log(torch.tensor(50.0)))
        nll = float(-log_probs.gather(1, bnn.data.y_test.long()[:, None]).mean())
        assert scores["nll"] == pytest.approx(nll, rel=1e-5), link
    posterior.predictive = "nn"
    draws = posterior.predict(bnn.data.x_test, num_samples=3)
    assert draws.log_probs.shape == (3, len(bnn.data.x_test), 3) and bool(draws.log_probs.isfinite().all())
    again = zoo.BNN.load(tmp_path / "run")
    torch.testing.assert_close(again.posterior.guide.variance(SITE), bnn.posterior.guide.variance(SITE))
    torch.testing.assert_close(again.posterior.glm_moments(bnn.data.x_test)[1], bnn.posterior.glm_moments(
        bnn.data.x_test)[1])


def test_refuses_a_selection_of_single_weights_and_the_linearised_mode():
    with pytest.raises(ZooInputError, match="factors whole layers"):
        spec(MOONS, "guide.covariance=kron")  # the tests' base selects 12 weights at random
    with pytest.raises(ZooInputError, match="evidence at the MAP only"):
        spec(MOONS, *KRON, "inference.evidence_at=linearised_mode")
    assert spec(MOONS, *KRON).guide.label == "laplace:kron"


class _Embedded(nn.Module):
    """An Embedding (which KFAC does not factor) under a Linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.out = nn.Embedding(5, 4), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(x[:, 0].long().clamp(0, 4)))


def test_kfac_over_every_weight_keeps_the_layers_it_cannot_factor_at_the_map():
    """kfac_laplace (every weight) on a net with an Embedding: the Embedding stays at its MAP, as with
    ``model.exclude: [embed]``, and the log names it; a selection that names the Embedding under KFAC is refused,
    naming the fix."""
    import zoo

    x = torch.randint(0, 5, (30, 1)).float()
    y = (x[:, 0] > 2).long()
    lines: list[str] = []
    bnn = zoo.BNN(_Embedded(), member="kfac_laplace", family={"map_from": "net"}).fit((x, y), progress=False,
                                                                                     echo=lines.append)
    assert "subnetwork: KFAC factors Linear and Conv2d layers; embed (Embedding) stay at the MAP" in lines
    assert len(bnn.posterior.family.indices) == 10  # the output layer only
    assert bool(bnn.predict(x[:4]).probs.isfinite().all())
    named = {"map_from": "net", "selection": {"strategy": "modules", "modules": ["embed", "out"]}}
    with pytest.raises(ZooInputError, match="'embed' \\(Embedding\\).*model.exclude: \\[embed\\]"):
        zoo.BNN(_Embedded(), member="kfac_laplace", family=named).fit((x, y), progress=False)
