"""One way to compile a step: trace it into the tensor operations it performs, then let ``torch.compile`` fuse them.

The SVI step (Pyro's handlers, the guide's draws, every ELBO term) and the MCMC potential with its gradient are
both plain Python over tensors. ``make_fx`` runs such a function once on real inputs and records only the
tensor operations, so the Python around them (Pyro's messengers, dict lookups, distribution objects) costs
nothing afterwards; tensors the function reads but does not take as inputs (parameters, data, prior
constants) are recorded by reference, so in-place optimiser updates stay visible. The recorded graph is
specialised to the input shapes, hence one trace per shape.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from zoo.errors import ZooWarning

# compiled graphs per TracedCompile (input shapes and static settings): an SVI run needs one or two (a last short
# minibatch); cyclical SGHMC six (those two, each with the gradient alone, an exploration move and a noisy move)
MAX_GRAPHS = 8


class TracedCompile:
    """``fn(*inputs)`` traced by ``make_fx`` and compiled once per input shapes, dtypes and devices.

    ``rewrite`` may edit each traced graph in place before it is compiled (e.g. :func:`exp_tanh`). Calling
    returns the compiled result, or ``None`` once tracing or compiling has failed (a model branching in Python
    on a tensor's value, no C++ compiler): that is said once as a warning and the caller runs ``fn`` eagerly
    from then on. Recompiling is bounded: past :data:`MAX_GRAPHS` input shapes, a call with a new shape returns
    ``None`` (that call runs eagerly; said once), so a run whose shapes keep changing does not compile at every step.

    With ``cuda_graphs``, a graph whose inputs are on a GPU is also captured as a CUDA graph (Inductor's
    ``triton.cudagraphs``, what ``mode="reduce-overhead"`` sets): a call replays its kernels with one launch, where a
    small net's eager step is bound by launching many small kernels from Python. A captured graph may not draw
    random numbers, so its draws are lifted out first (:func:`lift_random_draws`): each call makes them eagerly, in
    the traced order (the numbers an eager step draws), and passes them in as inputs; a graph whose draws depend on
    computed values is compiled without capture, said once. A replay writes its outputs into the same memory as the
    last one, so they are copied before they are returned (the HMC sampler keeps the last accepted point's gradient
    across calls).

    ``fn`` is traced with gradients on, so a reverse pass it computes (``torch.autograd.grad``, ``torch.func.grad``)
    is part of the graph, and the graph runs under ``no_grad``: no autograd graph is built around it. With
    ``differentiable`` the outputs are differentiated afterwards instead: the graph runs with gradients on and
    AOTAutograd compiles its reverse pass as a second graph. Tracing runs ``fn`` once for real; its random draws are
    undone, and so are its writes to the ``untouched`` tensors (a BatchNorm's running statistics), so the first
    compiled call computes what an eager call in its place would.
    """

    def __init__(self, fn: Callable[..., Any], what: str,
                 rewrite: Callable[[torch.fx.GraphModule], None] | None = None, cuda_graphs: bool = False,
                 differentiable: bool = False, untouched: Callable[[], list[torch.Tensor]] | None = None) -> None:
        self.fn, self.what, self.rewrite, self.cuda_graphs = fn, what, rewrite, cuda_graphs
        self.differentiable, self.untouched = differentiable, untouched
        self.active = True
        self._graphs: dict[tuple, tuple[Callable[..., Any], list[Callable[[], torch.Tensor]], bool]] = {}
        self._said_bound = False

    def __call__(self, *inputs: torch.Tensor, static: dict[str, Any] | None = None) -> Any | None:
        """``fn(*inputs, **static)``; ``static`` values (hashable, not tensors) are part of the graph, as shapes are."""
        if not self.active:
            return None
        static = static or {}
        key = (tuple((tuple(t.shape), t.dtype, t.device) for t in inputs), tuple(sorted(static.items())))
        if key not in self._graphs and len(self._graphs) >= MAX_GRAPHS:
            if not self._said_bound:
                warnings.warn(f"{self.what}: {MAX_GRAPHS} input shapes compiled already; calls with other shapes "
                              "run eagerly", ZooWarning, stacklevel=3)
                self._said_bound = True
            return None
        try:
            if key not in self._graphs:
                self._graphs[key] = self._compile(inputs, static)
            compiled, draws, captured = self._graphs[key]
            with torch.enable_grad() if self.differentiable else torch.no_grad():
                out = compiled(*inputs, *(draw() for draw in draws))
            if captured:  # the next replay would overwrite these outputs
                out = torch.utils._pytree.tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, out)
            return out
        except Exception as exc:  # the maths is the same eagerly, only slower
            warnings.warn(f"compiling {self.what} failed ({type(exc).__name__}: {exc}); running it eagerly",
                          stacklevel=3)
            self.active = False
            return None

    def _compile(self, inputs: tuple[torch.Tensor, ...], static: dict[str, Any]
                 ) -> tuple[Callable[..., Any], list[Callable[[], torch.Tensor]], bool]:
        """The compiled graph for these inputs, the eager draws it takes after them, and whether it is captured."""
        on_gpu = torch.cuda.is_available()
        gpus = sorted({t.device.index or 0 for t in inputs if t.device.type == "cuda"}) if on_gpu else []
        untouched = self.untouched() if self.untouched is not None else []
        kept = [t.detach().clone() for t in untouched]
        with torch.random.fork_rng(devices=gpus), torch.enable_grad():
            graph = make_fx(lambda *args: self.fn(*args, **static))(*inputs)  # a bound method's self is no input
        with torch.no_grad():
            for t, value in zip(untouched, kept, strict=True):
                t.copy_(value)
        if self.rewrite is not None:
            self.rewrite(graph)
        captured, draws = self.cuda_graphs and any(t.device.type == "cuda" for t in inputs), []
        if captured:
            lifted = lift_random_draws(graph)
            if lifted is None:
                warnings.warn(f"{self.what}: a random draw depends on computed values, so the compiled graph is not "
                              "captured as a CUDA graph", ZooWarning, stacklevel=4)
                captured = False
            else:
                draws = lifted
        # random draws left in a graph stay eager ops: Inductor's own generator made a mean-field step slower than
        # eager on CPU (784-400-400-10: 52 ms compiled against 29 ms eager), and different from eager's draws
        return torch.compile(graph, dynamic=False, options=compile_options(captured)), draws, captured


EMPTY_TENSORS = ("empty", "empty_like", "new_empty", "empty_strided")  # aten ops whose values are never read


def lift_random_draws(graph: torch.fx.GraphModule) -> list[Callable[[], torch.Tensor]] | None:
    """Turn every random draw of a traced graph into a new input, in place; None (graph unchanged) where one cannot be.

    A draw can be lifted when it reads no computed value: a draw of a given shape (``randn``), one shaped like a
    tensor (``randn_like``: only its shape, strides, dtype and device are read) or one filling a fresh empty tensor
    (``normal_``, ``cauchy_``, dropout's ``bernoulli_``). A draw whose distribution depends on computed values
    (``bernoulli`` of a probability tensor) cannot.

    :param graph: a graph traced by ``make_fx`` (its nodes carry their outputs' metadata).
    :returns: one function per lifted draw, in the graph's order, each drawing that input eagerly; the graph then
        takes those draws as inputs after its own.
    """
    g = graph.graph
    random_nodes = [n for n in g.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                    and torch.Tag.nondeterministic_seeded in n.target.tags]
    plans = []
    for node in random_nodes:
        tensor_args = [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, torch.fx.Node)]
        name = node.target._schema.name.split("::")[-1]
        if name.endswith("_"):  # an in-place draw: it must fill a fresh empty tensor, and read nothing else
            fresh = node.args[0]
            if (len(tensor_args) != 1 or not isinstance(fresh, torch.fx.Node) or len(fresh.users) != 1
                    or getattr(fresh.target, "_schema", None) is None
                    or fresh.target._schema.name.split("::")[-1] not in EMPTY_TENSORS):
                return None
        elif tensor_args and not (name.endswith("_like") and len(tensor_args) == 1 and tensor_args[0] is node.args[0]):
            return None
        plans.append(node)
    draws = []
    last_input = [n for n in g.nodes if n.op == "placeholder"][-1]
    for i, node in enumerate(plans):
        draws.append(functools.partial(_redraw, node.target, _shaped(node.args), _shaped(node.kwargs)))
        with g.inserting_after(last_input):
            last_input = g.placeholder(f"random_draw_{i}")
        fresh = node.args[0] if node.target._schema.name.endswith("_") else None
        node.replace_all_uses_with(last_input)
        g.erase_node(node)
        if fresh is not None and not fresh.users:
            g.erase_node(fresh)
    graph.recompile()
    return draws


def _shaped(value: Any) -> Any:
    """``value`` (a node's arguments) with every traced node replaced by its output's metadata (:class:`_Like`)."""
    return torch.fx.node.map_arg(value, lambda node: _Like(node.meta["val"]))


class _Like:
    """A traced tensor's metadata: all that a random draw shaped like it, or filling it, reads."""

    def __init__(self, value: torch.Tensor) -> None:
        self.shape, self.strides = tuple(value.shape), tuple(value.stride())
        self.dtype, self.device = value.dtype, value.device

    def empty(self) -> torch.Tensor:
        """A fresh empty tensor of this metadata."""
        return torch.empty_strided(self.shape, self.strides, dtype=self.dtype, device=self.device)


def _redraw(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> torch.Tensor:
    """One lifted draw, made eagerly: ``op`` on fresh empty tensors of the traced metadata."""
    args, kwargs = torch.fx.node.map_aggregate((args, kwargs), lambda a: a.empty() if isinstance(a, _Like) else a)
    return op(*args, **kwargs)


def compile_options(cuda_graphs: bool) -> dict[str, bool]:
    """Inductor's options for a traced graph: random draws as eager ops, and with ``cuda_graphs`` its kernels
    captured as a CUDA graph.

    :param cuda_graphs: whether to capture the compiled graph as a CUDA graph (its inputs must be on a GPU).
    :returns: the ``options`` for ``torch.compile``.
    """
    return {"fallback_random": True, **({"triton.cudagraphs": True} if cuda_graphs else {})}


def exp_tanh(graph: torch.fx.GraphModule) -> None:
    """Rewrite every ``tanh(x)`` in a traced graph as ``1 - 2 / (exp(2x) + 1)``, in place.

    Inductor's CPU tanh is the 1-ULP vector tanh, which costs about three exps here (3.6 ms against 0.95 ms
    on a [256, 100, 50] tensor, one thread); the rewritten form is exact up to rounding (absolute error
    ~1e-7 in float32) and saturates correctly at both ends. The reverse pass reads tanh's output, so it
    follows. Only compiled graphs use this; the model itself is unchanged.
    """
    aten, g = torch.ops.aten, graph.graph
    for node in list(g.nodes):
        if node.op != "call_function" or node.target is not aten.tanh.default:
            continue
        with g.inserting_before(node):
            grown = g.call_function(aten.add.Tensor, (g.call_function(aten.exp.default, (
                g.call_function(aten.mul.Tensor, (node.args[0], 2.0)),)), 1.0))
            ratio = g.call_function(aten.mul.Tensor, (g.call_function(aten.reciprocal.default, (grown,)), 2.0))
            value = g.call_function(aten.rsub.Scalar, (ratio, 1.0))
        node.replace_all_uses_with(value)
        g.erase_node(node)
    graph.recompile()
