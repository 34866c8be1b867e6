"""Compiled steps: the random draws lifted out of a traced graph (what a CUDA-graph capture needs), the bound on
recompiles, and the SWAG and SG-MCMC updates compiled against their eager runs."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tests.conftest import compiled_step
from tests.test_mcmc import linear_spec
from zoo.errors import ZooWarning
from zoo.inference import compiled as compiled_module
from zoo.inference.compiled import MAX_GRAPHS, TracedCompile, lift_random_draws
from zoo.inference.elbo import LazyTraceMeanField_ELBO
from zoo.inference.sgmcmc import SGMCMC
from zoo.inference.svi import SVIStep, make_optimizer
from zoo.inference.swag import SWAG
from zoo.pipeline import prepare
from zoo.spec import load_spec


def _random_nodes(graph: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in graph.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
            and torch.Tag.nondeterministic_seeded in n.target.tags]


def test_lifted_draws_are_the_ones_the_eager_function_draws():
    """Every kind of draw a step makes (a shape's, one shaped like a parameter, an in-place fill of a fresh tensor,
    dropout's mask) becomes an input, drawn eagerly in the traced order: the graph then computes what the eager
    function computes at the same seed."""
    w = torch.randn(3, 4, requires_grad=True)

    def f(x: torch.Tensor) -> torch.Tensor:
        normal = torch.empty(5, 4).normal_()
        cauchy = torch.empty(2).cauchy_()
        weight = w + torch.randn_like(w)
        dropped = torch.nn.functional.dropout(x, 0.5)
        return (x @ weight.T).sum() + normal.sum() + cauchy.sum() + dropped.sum() + torch.randn(2, 3).sum()

    x = torch.randn(2, 4)
    graph = make_fx(f)(x)
    draws = lift_random_draws(graph)
    assert len(draws) == 5 and not _random_nodes(graph)
    assert len([n for n in graph.graph.nodes if n.op == "placeholder"]) == 6
    torch.manual_seed(3)
    expected = f(x)
    torch.manual_seed(3)
    torch.testing.assert_close(graph(x, *(draw() for draw in draws)), expected, rtol=0, atol=0)


def test_a_draw_that_reads_computed_values_is_not_lifted():
    graph = make_fx(lambda x: torch.bernoulli(torch.sigmoid(x)).sum())(torch.randn(4))
    before = [n.format_node() for n in graph.graph.nodes]
    assert lift_random_draws(graph) is None
    assert [n.format_node() for n in graph.graph.nodes] == before


@pytest.mark.parametrize("overrides", [["inference.local_reparam=true"],
                                       ["model.family=rank1", "guide.name=mixture", "prior.name=cauchy",
                                        "prior.loc=1.0"]], ids=["local_reparam", "rank1_cauchy_mixture"])
def test_an_svi_steps_lifted_draws_give_the_eager_loss_and_gradients(spec_factory, overrides):
    """The SVI step's graph (what a GPU captures) with its draws made outside: the eager loss and gradients."""
    spec = spec_factory("toy", *overrides)
    data, family, guide, _ = prepare(spec)
    params = list(guide.parameters()) + family.point_parameters()
    step = SVIStep(family.model, guide, LazyTraceMeanField_ELBO(), make_optimizer(params, spec.inference),
                   spec.inference.local_reparam)
    step.validated = True
    batch = torch.arange(32)
    graph = make_fx(lambda x, y, b: step.loss(x, y, b))(data.x_train, data.y_train, batch)
    draws = lift_random_draws(graph)
    assert draws and not _random_nodes(graph)
    torch.manual_seed(5)
    eager = step.loss(data.x_train, data.y_train, batch)
    eager_grads = torch.autograd.grad(eager, params)
    torch.manual_seed(5)
    lifted = graph(data.x_train, data.y_train, batch, *(draw() for draw in draws))
    torch.testing.assert_close(lifted, eager)
    for a, b in zip(torch.autograd.grad(lifted, params), eager_grads, strict=True):
        torch.testing.assert_close(a, b)


def test_recompiling_is_bounded_and_said_once(monkeypatch):
    compiles = []
    monkeypatch.setattr(compiled_module.torch, "compile", lambda graph, **kwargs: compiles.append(1) or graph)
    traced = TracedCompile(lambda x: (x * 2,), "a test")
    for n in range(1, MAX_GRAPHS + 1):
        assert traced(torch.ones(n))[0].sum() == 2 * n
    with pytest.warns(ZooWarning, match=f"{MAX_GRAPHS} input shapes compiled already"):
        assert traced(torch.ones(MAX_GRAPHS + 1)) is None  # this call runs eagerly
    assert traced(torch.ones(MAX_GRAPHS + 2)) is None and traced.active  # said once; the compiled shapes still run
    assert traced(torch.ones(1))[0].sum() == 2 and len(compiles) == MAX_GRAPHS


@pytest.mark.slow  # torch.compile of each minibatch size: ~30 s (make test-slow)
@compiled_step
@pytest.mark.parametrize(("method", "settings"), [
    ("swag", {"epochs": 6, "pretrain_epochs": 2, "rank": 4, "lr": 0.01, "init": "prior"}),
    ("sgld", {"num_chains": 3, "epochs": 8, "burn_in_epochs": 2, "lr": 1e-3, "thin": 2, "init": "weights"}),
    ("sghmc", {"num_chains": 2, "epochs": 8, "lr": 1e-3, "cycles": 2, "init": "weights",
               "preconditioner": "rmsprop", "burn_in_epochs": 2}),
], ids=["swag", "sgld", "sghmc_rmsprop"])
def test_compiled_minibatch_updates_follow_the_eager_ones(method, settings):
    """The same run eager and compiled (batches of 16 from 40 rows: a full and a short minibatch graph; SGLD's noise
    passed in; SGHMC's preconditioner adapting in burn-in, then gradient and move in one graph): the same draws."""
    results = []
    for compile in (False, True):
        spec = load_spec(linear_spec(method, batch_size=16, compile=compile, **settings))
        data, family, guide, _ = prepare(spec)
        fit = (SWAG() if method == "swag" else SGMCMC()).fit(family, guide, data, spec.inference, 0, progress=False)
        results.append(fit)
    if method == "swag":
        eager, compiled = (r.posterior for r in results)
        for key in ("mean", "sq_mean", "deviations"):
            torch.testing.assert_close(getattr(compiled, key), getattr(eager, key), rtol=1e-9, atol=1e-9)
    else:
        for name, draws in results[0].draws.items():
            torch.testing.assert_close(results[1].draws[name], draws, rtol=1e-9, atol=1e-9)
