"""The ELBO: agreement with Pyro's estimators, KL bookkeeping, minibatch scaling, KL weight, MAP, local reparam."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from pyro import poutine
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO

from guides.delta import DeltaGuide
from guides.mean_field import MeanFieldNormalGuide
from zoo.inference.elbo import ANALYTIC, ELBOS, MONTE_CARLO, LazyTraceMeanField_ELBO
from zoo.inference.local_reparam import LocalReparameterization
from zoo.likelihoods import Categorical, Gaussian
from zoo.models.all_weights import AllWeightsBNN
from zoo.nets import build_mlp
from zoo.priors import prior_distribution
from zoo.spec import CauchyPrior, NormalPrior, PriorSpec, ScaleMixturePrior

NORMAL = NormalPrior(loc=0.1, scale=0.8)
CAUCHY = CauchyPrior(name="cauchy", scale=0.5)
MIXTURE = ScaleMixturePrior(name="scale_mixture", pi=0.4, sigma1=1.0, sigma2=0.1)


def make_family(prior, hidden=(5,), in_dim=3, out_dim=1, noise=None, activation="tanh", seed=0):
    """A tiny BNN: ``prior`` is one config for every site or a ``{site: config}`` dict."""
    torch.manual_seed(seed)
    net = build_mlp(in_dim, out_dim, list(hidden), activation)
    names = [n for n, _ in net.named_parameters()]
    priors = prior if isinstance(prior, dict) else {n: prior for n in names}
    likelihood = Categorical() if out_dim > 1 else Gaussian(noise, prior_loc=-0.5, prior_scale=0.7)
    return AllWeightsBNN(net, priors, likelihood)


def make_data(n=24, in_dim=3, classes=None, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, in_dim, generator=g)
    y = torch.randint(classes, (n,), generator=g) if classes else torch.randn(n, generator=g)
    return x, y


def spread_guide(family, init_rho=-1.5, seed=2):
    """A mean-field guide with random means and non-trivial scales (so every term depends on the draw)."""
    guide = MeanFieldNormalGuide(family.latent_sites(), init_rho=init_rho)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in guide.loc.values():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
        for p in guide.rho.values():
            p.add_(0.5 * torch.rand(p.shape, generator=g))
    return guide


def loss_and_grads(elbo, family, guide, *args, seed=7):
    guide.zero_grad(set_to_none=True)
    pyro.set_rng_seed(seed)
    loss = elbo.differentiable_loss(family.model, guide, *args)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in guide.named_parameters()}


def assert_same_loss_and_grads(a, b):
    (la, ga), (lb, gb) = a, b
    assert torch.allclose(la, lb, rtol=1e-6, atol=1e-5), (la, lb)
    assert ga.keys() == gb.keys()
    for name in ga:
        assert torch.allclose(ga[name], gb[name], rtol=1e-5, atol=1e-6), name


# --------------------------------------------------------------------------- (a) agreement with Pyro
@pytest.mark.parametrize("prior", [NORMAL, CAUCHY, MIXTURE], ids=["normal", "cauchy", "scale_mixture"])
@pytest.mark.parametrize("batch", [None, torch.tensor([3, 0, 17, 9, 11])], ids=["full", "minibatch"])
def test_lazy_elbo_matches_pyro_trace_mean_field(prior, batch):
    family = make_family(prior)
    x, y = make_data()
    guide = spread_guide(family)
    ours = loss_and_grads(LazyTraceMeanField_ELBO(), family, guide, x, y, batch)
    pyros = loss_and_grads(TraceMeanField_ELBO(), family, guide, x, y, batch)
    assert_same_loss_and_grads(ours, pyros)
    assert all(torch.count_nonzero(g) > 0 for g in ours[1].values())


def test_lazy_elbo_matches_pyro_for_classification_and_particles():
    family = make_family(MIXTURE, out_dim=4)
    x, y = make_data(classes=4)
    guide = spread_guide(family)
    batch = torch.arange(0, 24, 3)
    ours = loss_and_grads(LazyTraceMeanField_ELBO(num_particles=3), family, guide, x, y, batch)
    pyros = loss_and_grads(TraceMeanField_ELBO(num_particles=3), family, guide, x, y, batch)
    assert_same_loss_and_grads(ours, pyros)


@pytest.mark.parametrize("prior", [NORMAL, MIXTURE], ids=["normal", "scale_mixture"])
def test_trace_elbo_option_matches_pyro_trace_elbo(prior):
    family = make_family(prior)
    x, y = make_data()
    guide = spread_guide(family)
    elbo = ELBOS["trace"](1)
    ours = loss_and_grads(elbo, family, guide, x, y, None)
    pyros = loss_and_grads(Trace_ELBO(), family, guide, x, y, None)
    assert_same_loss_and_grads(ours, pyros)
    assert set(elbo.kl_methods.values()) == {MONTE_CARLO}


def test_analytic_and_monte_carlo_kl_agree_in_expectation():
    family = make_family(NORMAL)
    x, y = make_data()
    guide = spread_guide(family)
    analytic, mc = ELBOS["trace_mean_field"](1), ELBOS["trace"](1)
    pyro.set_rng_seed(0)
    exact = analytic.loss(family.model, guide, x, y)
    pyro.set_rng_seed(0)
    same_draw = mc.loss(family.model, guide, x, y)
    assert exact != pytest.approx(same_draw, rel=1e-6)  # the MC estimator really is a different estimate
    # log-likelihood terms are identical under the same seed; only the KL estimate differs, unbiasedly
    pyro.set_rng_seed(1)
    estimates = []
    for _ in range(400):
        mc.loss(family.model, guide, x, y)
        estimates.append(sum(float(t) for n, t in mc.last_terms.items() if n != "obs"))
    analytic.loss(family.model, guide, x, y)
    kl_exact = sum(float(t) for n, t in analytic.last_terms.items() if n != "obs")
    est = torch.tensor(estimates, dtype=torch.float64)
    assert abs(float(est.mean()) - kl_exact) < 4 * float(est.std()) / math.sqrt(len(est))


# --------------------------------------------------------------------------- (b) KL methods per site
def test_kl_methods_normal_prior_all_analytic_including_learned_noise():
    family = make_family(NORMAL)
    elbo = LazyTraceMeanField_ELBO()
    elbo.loss(family.model, spread_guide(family), *make_data())
    assert elbo.kl_methods == {"hidden0.weight": ANALYTIC, "hidden0.bias": ANALYTIC, "out.weight": ANALYTIC,
                               "out.bias": ANALYTIC, "noise_scale": ANALYTIC}


def test_kl_methods_mixed_priors():
    spec = PriorSpec.model_validate({"name": "scale_mixture", "sites": {"*.bias": {"name": "normal"},
                                                                        "out.weight": {"name": "cauchy"}}})
    from zoo.priors import assign_priors

    torch.manual_seed(0)
    names = [n for n, _ in build_mlp(3, 1, [5]).named_parameters()]
    family = make_family(assign_priors(spec, names), noise=0.3)
    elbo = LazyTraceMeanField_ELBO()
    elbo.loss(family.model, spread_guide(family), *make_data())
    assert elbo.kl_methods == {"hidden0.weight": MONTE_CARLO, "hidden0.bias": ANALYTIC,
                               "out.weight": MONTE_CARLO, "out.bias": ANALYTIC}
    assert set(elbo.last_terms) == {*elbo.kl_methods, "obs"}


def test_monte_carlo_kl_term_is_log_q_minus_log_p_at_the_guide_draw():
    family = make_family(CAUCHY, noise=0.5)
    guide = spread_guide(family)
    x, y = make_data()
    elbo = LazyTraceMeanField_ELBO()
    pyro.set_rng_seed(3)
    elbo.loss(family.model, guide, x, y)
    pyro.set_rng_seed(3)
    trace = poutine.trace(guide).get_trace()
    for name in family.weight_names:
        w = trace.nodes[name]["value"]
        p = prior_distribution(CAUCHY, w.shape)
        expected = guide.distribution(name).log_prob(w) - p.log_prob(w)
        assert torch.allclose(elbo.last_terms[name], expected, rtol=1e-5, atol=1e-4), name


def test_learned_noise_kl_is_the_lognormal_closed_form():
    family = make_family(NORMAL)
    guide = spread_guide(family)
    elbo = LazyTraceMeanField_ELBO()
    elbo.loss(family.model, guide, *make_data())
    m_q, s_q = guide.unconstrained_loc("noise_scale"), guide.scale("noise_scale")
    m_p, s_p = -0.5, 0.7  # make_family's noise prior: LogNormal(-0.5, 0.7)
    expected = torch.log(s_p / s_q) + (s_q**2 + (m_q - m_p) ** 2) / (2 * s_p**2) - 0.5
    assert elbo.kl_methods["noise_scale"] == ANALYTIC
    assert torch.allclose(elbo.last_terms["noise_scale"], expected.detach(), rtol=1e-5)


# --------------------------------------------------------------------------- (c) minibatch scaling
def _delta_setup(out_dim=1, noise=0.7):
    family = make_family(MIXTURE, out_dim=out_dim, noise=noise)
    guide = DeltaGuide(family.latent_sites())
    with torch.no_grad():
        for p in guide.loc.values():
            p.add_(0.2)
    return family, guide


def _rowwise_loglik(family, guide, x, y, noise=0.7):
    w = guide.point_estimate()
    out = family.forward({n: w[n] for n in family.weight_names}, x)
    if out.shape[-1] > 1:
        return dist.Categorical(logits=out).log_prob(y)
    return dist.Normal(out[:, 0], noise).log_prob(y)


@pytest.mark.parametrize("out_dim", [1, 3], ids=["gaussian", "categorical"])
def test_minibatch_loglik_is_scaled_to_the_full_data(out_dim):
    family, guide = _delta_setup(out_dim)
    n = 30
    x, y = make_data(n=n, classes=3 if out_dim > 1 else None)
    rows = _rowwise_loglik(family, guide, x, y)
    elbo = LazyTraceMeanField_ELBO()
    batch = torch.tensor([4, 25, 7, 0, 13, 29])
    elbo.loss(family.model, guide, x, y, batch)
    expected = n / len(batch) * rows[batch].sum()
    assert torch.allclose(elbo.last_terms["obs"], expected.detach(), rtol=1e-5)
    assert not torch.allclose(elbo.last_terms["obs"], rows[batch].sum().detach(), rtol=1e-3)
    elbo.loss(family.model, guide, x, y, None)
    assert torch.allclose(elbo.last_terms["obs"], rows.sum().detach(), rtol=1e-5)
    # the KL terms are not scaled by the minibatch
    elbo.loss(family.model, guide, x, y, batch)
    kl_batch = {k: v for k, v in elbo.last_terms.items() if k != "obs"}
    elbo.loss(family.model, guide, x, y, None)
    for name, term in kl_batch.items():
        assert torch.allclose(term, elbo.last_terms[name]), name


# --------------------------------------------------------------------------- (d) the KL weight
@pytest.mark.parametrize("weight", [0.0, 0.25, 1.0])
def test_kl_weight_scales_only_the_kl(weight):
    family = make_family(MIXTURE)
    guide = spread_guide(family)
    x, y = make_data()
    batch = torch.tensor([1, 2, 5, 8])
    reference = LazyTraceMeanField_ELBO()
    pyro.set_rng_seed(11)
    reference.loss(family.model, guide, x, y, batch)
    elbo = LazyTraceMeanField_ELBO()
    elbo.kl_weight = weight
    pyro.set_rng_seed(11)
    loss = elbo.differentiable_loss(family.model, guide, x, y, batch)
    terms = elbo.last_terms
    for name in reference.last_terms:  # same draws, same terms
        assert torch.allclose(terms[name], reference.last_terms[name]), name
    kl = sum(t for n, t in terms.items() if n != "obs")
    assert torch.allclose(loss, -terms["obs"] + weight * kl, rtol=1e-6)
    if weight == 0.0:
        assert torch.allclose(loss, -terms["obs"])


# --------------------------------------------------------------------------- (e) MAP with a Delta guide
@pytest.mark.parametrize("prior", [NORMAL, MIXTURE, CAUCHY], ids=["normal", "scale_mixture", "cauchy"])
def test_delta_guide_elbo_is_the_map_objective(prior):
    family = make_family(prior)  # learned noise: a constrained latent under LogNormal(-0.5, 0.7)
    guide = DeltaGuide(family.latent_sites())
    with torch.no_grad():
        guide.unconstrained_loc("noise_scale").fill_(math.log(0.6))
        guide.unconstrained_loc("out.bias").add_(0.4)
    x, y = make_data()
    w = guide.point_estimate()
    assert math.isclose(float(w["noise_scale"]), 0.6, rel_tol=1e-6)
    out = family.forward({n: w[n] for n in family.weight_names}, x)
    log_lik = dist.Normal(out[:, 0], w["noise_scale"]).log_prob(y).sum()
    log_prior = sum(prior_distribution(prior, w[n].shape).log_prob(w[n]) for n in family.weight_names)
    log_prior = log_prior + dist.LogNormal(-0.5, 0.7).log_prob(w["noise_scale"])
    expected = -(log_lik + log_prior)
    loss = LazyTraceMeanField_ELBO().loss(family.model, guide, x, y)
    assert math.isclose(loss, float(expected), rel_tol=1e-5)
    # deterministic: no randomness left in the objective
    assert loss == LazyTraceMeanField_ELBO().loss(family.model, guide, x, y)


# --------------------------------------------------------------------------- (f) local reparameterisation
N_ROWS, IN_DIM, NOISE = 64, 3, 0.5
BATCH = torch.arange(5, 21)  # 16 of 64 rows


def _linear_setup():
    """One Linear layer (no hidden layer), Gaussian likelihood with fixed noise, N(0, 1) prior, wide guide."""
    family = make_family(NormalPrior(), hidden=(), in_dim=IN_DIM, noise=NOISE, seed=0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N_ROWS, IN_DIM, generator=g) + 1.0  # positive-ish inputs: shared weight noise correlates rows
    y = torch.randn(N_ROWS, generator=g)
    guide = MeanFieldNormalGuide(family.latent_sites(), init_rho=-1.0)
    return family, guide, x, y


def _closed_form_neg_elbo(guide, x, y, batch):
    m_w, m_b = guide.loc["out/weight"][0], guide.loc["out/bias"]
    s_w, s_b = guide.scale("out.weight")[0], guide.scale("out.bias")
    xb, yb = x[batch], y[batch]
    mu = xb @ m_w + m_b
    v = (xb**2) @ (s_w**2) + s_b**2
    exp_loglik = (dist.Normal(mu, NOISE).log_prob(yb) - v / (2 * NOISE**2)).sum() * (len(x) / len(batch))
    kl = sum(0.5 * (s**2 + m**2 - 1 - torch.log(s**2)).sum() for m, s in ((m_w, s_w), (m_b, s_b)))
    return -(exp_loglik - kl)


def _draw_losses(family, guide, x, y, local, n_draws, grads=False):
    elbo = LazyTraceMeanField_ELBO()
    losses, grad_w = [], []
    for _ in range(n_draws):
        ctx = LocalReparameterization() if local else poutine.messenger.Messenger()
        with ctx:
            loss = elbo.differentiable_loss(family.model, guide, x, y, BATCH)
        if grads:
            guide.zero_grad(set_to_none=True)
            loss.backward()
            grad_w.append(guide.loc["out/weight"].grad.detach().flatten().clone())
        losses.append(float(loss.detach()))
    return torch.tensor(losses, dtype=torch.float64), (torch.stack(grad_w) if grads else None)


def test_local_reparam_keeps_the_expected_elbo_and_its_gradient():
    family, guide, x, y = _linear_setup()
    closed = _closed_form_neg_elbo(guide, x, y, BATCH)
    closed_grad = torch.autograd.grad(closed, guide.loc["out/weight"])[0].flatten()
    closed = float(closed.detach())
    pyro.set_rng_seed(0)
    plain, plain_g = _draw_losses(family, guide, x, y, local=False, n_draws=1000, grads=True)
    pyro.set_rng_seed(0)
    local, local_g = _draw_losses(family, guide, x, y, local=True, n_draws=1000, grads=True)
    for losses in (plain, local):
        se = float(losses.std()) / math.sqrt(len(losses))
        assert abs(float(losses.mean()) - closed) < 4 * se, (float(losses.mean()), closed, se)
    for g in (plain_g, local_g):
        se = g.std(0) / math.sqrt(len(g))
        assert torch.all((g.mean(0) - closed_grad).abs() < 4 * se), (g.mean(0), closed_grad, se)
    # lower variance: each row gets its own pre-activation noise instead of sharing one weight draw
    assert torch.all(local_g.var(0) < 0.5 * plain_g.var(0)), (local_g.var(0), plain_g.var(0))
    assert float(local.var()) < float(plain.var())


def test_local_reparam_changes_the_computation_for_the_same_weight_sample():
    family, guide, x, _ = _linear_setup()
    pyro.set_rng_seed(0)
    with torch.no_grad(), LocalReparameterization():
        trace = poutine.trace(guide).get_trace()
        weights = {n: trace.nodes[n]["value"] for n in family.weight_names}
        first, second = family.forward(weights, x), family.forward(weights, x)
    plain = family.forward(weights, x)
    assert torch.allclose(plain, x @ weights["out.weight"].T + weights["out.bias"], atol=1e-5)
    assert not torch.allclose(first, plain, atol=1e-3)
    assert not torch.allclose(first, second, atol=1e-3)  # fresh noise per call and per row


def test_local_reparam_preactivations_follow_the_guide_marginal():
    family, guide, x, _ = _linear_setup()
    x = x[:6]
    pyro.set_rng_seed(0)
    outs = []
    with torch.no_grad():
        for _ in range(3000):
            with LocalReparameterization():
                trace = poutine.trace(guide).get_trace()
                outs.append(family.forward({n: trace.nodes[n]["value"] for n in family.weight_names}, x)[:, 0])
        outs = torch.stack(outs).double()
        m_w, m_b = guide.loc["out/weight"][0], guide.loc["out/bias"]
        s_w, s_b = guide.scale("out.weight")[0], guide.scale("out.bias")
        mean, var = x @ m_w + m_b, (x**2) @ (s_w**2) + s_b**2
    se = (var / len(outs)).sqrt()
    assert torch.all((outs.mean(0) - mean).abs() < 4 * se)
    assert torch.allclose(outs.var(0), var.double(), rtol=0.1)


def test_local_reparam_ignores_replayed_model_sites():
    """Pyro's replay hands the guide's ``infer`` dict to the model's site: the prior must not then be taken for q."""
    family, guide, x, y = _linear_setup()
    with torch.no_grad():  # a guide far from the N(0, 1) prior makes any mix-up obvious
        guide.loc["out/bias"].fill_(5.0)
    pyro.set_rng_seed(0)
    with torch.no_grad(), LocalReparameterization():
        guide_trace = poutine.trace(guide).get_trace()
        model_trace = poutine.trace(poutine.replay(family.model, trace=guide_trace)).get_trace(x, y)
    loc = model_trace.nodes["obs"]["fn"].loc
    m_w, m_b = guide.loc["out/weight"][0], guide.loc["out/bias"]
    s_w, s_b = guide.scale("out.weight")[0], guide.scale("out.bias")
    z = (loc - (x @ m_w + m_b)) / ((x**2) @ (s_w**2) + s_b**2).sqrt()
    assert float(z.detach().abs().max()) < 5.0
    assert float(loc.mean()) > 3.0


def test_local_reparam_gives_the_same_loss_under_pyros_elbo():
    family, guide, x, y = _linear_setup()
    losses = []
    for elbo in (LazyTraceMeanField_ELBO(), TraceMeanField_ELBO()):
        pyro.set_rng_seed(4)
        with torch.no_grad(), LocalReparameterization():
            losses.append(float(elbo.differentiable_loss(family.model, guide, x, y, BATCH)))
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)


def test_local_reparam_with_hidden_layers_and_restores_linear():
    original = F.linear
    family = make_family(NORMAL, hidden=(4, 4))
    guide = spread_guide(family)
    x, y = make_data()
    hits = []
    with LocalReparameterization() as handler:
        real = handler._sampled_linear

        def spy(inp, weight, bias=None):
            hits.append(handler._lookup(weight) is not None)
            return real(inp, weight, bias)

        F.linear = spy
        LazyTraceMeanField_ELBO().loss(family.model, guide, x, y)
        F.linear = real
    assert hits == [True, True, True]  # every layer's weight was recognised
    assert F.linear is original
    with pytest.raises(RuntimeError), LocalReparameterization():
        raise RuntimeError("boom")
    assert F.linear is original


def test_local_reparam_leaves_delta_weights_alone():
    family, guide = _delta_setup()
    x, y = make_data()
    plain = LazyTraceMeanField_ELBO().loss(family.model, guide, x, y)
    with LocalReparameterization():
        local = LazyTraceMeanField_ELBO().loss(family.model, guide, x, y)
    assert local == pytest.approx(plain, rel=1e-6)
