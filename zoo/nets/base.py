"""What every net shares: the spec's :class:`NetSection` that names an architecture, its activations, and the helpers
the families use on any plain ``nn.Module`` (parameter swaps, BatchNorm's evaluation mode, image shapes)."""

from __future__ import annotations

import contextlib
import fnmatch
import math
import weakref
from abc import abstractmethod
from collections.abc import Callable, Iterator
from typing import Annotated, ClassVar

import torch
from pydantic import AfterValidator, Field
from torch import nn
from torch.func import functional_call, vmap

from zoo.errors import ZooInputError
from zoo.parts import Strict

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "gelu": nn.GELU,
    "elu": nn.ELU,
    "silu": nn.SiLU,
    "sigmoid": nn.Sigmoid,
}


def activation_refusals(name: str) -> list[ZooInputError]:
    """An unknown activation, refused with the known ones (checked with the rest of the spec, so that every problem
    of a spec is listed at once).

    :param name: the activation named.
    :returns: the problem, or nothing.
    """
    if name in ACTIVATIONS:
        return []
    allowed = f"use one of: {', '.join(sorted(ACTIVATIONS))}"
    return [ZooInputError("net.activation", name, allowed, message=f"unknown net.activation {name!r}; {allowed}")]


Activation = Annotated[str, Field("relu", description=f"{' | '.join(ACTIVATIONS)}")]


def _positive_widths(widths: list[int]) -> list[int]:
    if any(w < 1 for w in widths):
        raise ValueError(f"widths must be positive integers, got {widths}")
    return widths


Widths = Annotated[list[int], AfterValidator(_positive_widths)]
InChannels = Annotated[int, Field(1, gt=0, description="channels of the input images; a row holds in_channels * "
                                  "side * side pixels, channel-major (C, H, W)")]


class NetSection(Strict):
    """The spec's ``net`` section for one architecture (``name: Literal[...]``); widths come from the data."""

    # it convolves (what a family's compiled step may care about); None where only the built module can tell
    convolutional: ClassVar[bool | None] = True
    optional: ClassVar[bool] = False  # it needs an optional extra, so it is never suggested in its place
    flat_rows: ClassVar[bool] = True  # it reads flat rows of in_dim features (the zoo's nets; a user's may not)

    weights: str | None = Field(None, description=(
        "trained weights to start from: a .pt/.pth state dict, a .safetensors file or a zoo run directory (its "
        "point estimate); a state dict that does not fit the net is refused, listing the keys and shapes that "
        "differ"))

    @property
    def image_channels(self) -> int:
        """Channels of the images it reads its rows as (1 for a net of one-channel images or of plain rows)."""
        return 1

    def refusals(self) -> list[ZooInputError]:
        """Problems of its settings that the spec lists with every other problem (an unknown activation).

        :returns: the problems; empty when there are none.
        """
        return []

    @abstractmethod
    def build(self, in_dim: int, out_dim: int) -> nn.Module:
        """The net for rows of ``in_dim`` inputs and ``out_dim`` outputs.

        :param in_dim: inputs per row (pixels, channel-major, for an image net).
        :param out_dim: outputs per row.
        :returns: the untrained net.
        :raises ZooInputError: settings the data cannot meet (e.g. rows that are not square images).
        """


class ParameterSwap:
    """Run a net with its parameters replaced by given tensors (e.g. sampled weights), keeping autograd through them.

    ``torch.func.functional_call`` does the same for any module but re-walks the module tree on every call; a
    training step calls this once per ELBO evaluation, so the (module, attribute) slots are resolved once here.

    A parameter shared by several modules (tied weights: ``head.weight = embed.weight``) is swapped in every module
    that holds it, as ``functional_call`` does.

    :param net: the net whose parameters are swapped (by their ``named_parameters`` names) on each call.
    """

    def __init__(self, net: nn.Module) -> None:
        self.net = net
        modules = dict(net.named_modules(remove_duplicate=False))
        first = {id(p): name for name, p in net.named_parameters()}  # a tied parameter: named once, held twice
        self.slots: dict[str, list[tuple[nn.Module, str]]] = {name: [] for name in first.values()}
        for name, param in net.named_parameters(remove_duplicate=False):
            owner, _, attr = name.rpartition(".")
            if (modules[owner], attr) not in self.slots[first[id(param)]]:
                self.slots[first[id(param)]].append((modules[owner], attr))

    def __call__(self, weights: dict[str, torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
        """``net(*inputs)`` with parameter ``name`` replaced by ``weights[name]`` for every name given."""
        saved = []
        try:
            for name, value in weights.items():
                for module, attr in self.slots[name]:
                    saved.append((module, attr, module._parameters[attr]))
                    module._parameters[attr] = value
            return self.net(*inputs)
        finally:
            for module, attr, original in saved:
                module._parameters[attr] = original


def image_shape(in_dim: int, in_channels: int, net: str) -> tuple[int, int, int]:
    """(C, H, W) of flat rows of ``in_dim`` pixels holding square ``in_channels``-channel images.

    :param in_dim: inputs per row.
    :param in_channels: channels per image.
    :param net: the net's name, for the message.
    :returns: ``(in_channels, side, side)``.
    :raises ZooInputError: when ``in_dim`` is not ``in_channels * side * side`` for a whole ``side``.
    """
    side = math.isqrt(in_dim // in_channels) if in_dim % in_channels == 0 else 0
    if side < 1 or in_channels * side * side != in_dim:
        raise ZooInputError("net.in_channels", in_channels, f"net {net!r} reads each row as square images; "
                            f"{in_dim} inputs are not {in_channels} x side x side pixels")
    return in_channels, side, side


def _flat_width(body: nn.Module, shape: tuple[int, int, int]) -> int:
    """Features per example after ``body`` on images of ``shape`` (a dry run on one blank image; ``body`` holds
    no BatchNorm, whose statistics the run would move)."""
    with torch.no_grad():
        return int(body(torch.zeros(1, *shape)).flatten(1).shape[1])


NORMALISATION_LAYERS = (nn.modules.batchnorm._BatchNorm,)  # normalise by the batch's statistics
# every normalisation layer (by the batch, the row or groups of channels): families keep their scale and shift point
# estimates where they factor or select the other layers
NORM_LAYERS = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm, nn.modules.instancenorm._InstanceNorm)


def parametric_modules(net: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules that hold parameters of their own (not only their children's), by path, in the net's order.

    :param net: the net.
    :returns: ``(path, module)`` pairs.
    """
    return [(name, m) for name, m in net.named_modules() if any(True for _ in m.parameters(recurse=False))]


def module_matches(name: str, module: nn.Module, patterns: list[str]) -> bool:
    """Whether a module is named by any of ``patterns``: its path (``encoder.embed``), a glob of paths (``blocks.*``;
    ``head.*`` names ``head`` itself too, and everything under it) or its layer type (``Embedding``).

    :param name: the module's path in the net.
    :param module: the module.
    :param patterns: the paths, globs and type names.
    :returns: whether one matches.
    """
    return any(fnmatch.fnmatchcase(name, p) or type(module).__name__ == p or (p.endswith(".*") and name == p[:-2])
               for p in patterns)


def check_patterns(net: nn.Module, patterns: list[str], field: str) -> None:
    """Refuse a module pattern that names no module of the net (a typo, most likely), listing the modules.

    :param net: the net.
    :param patterns: paths, globs or type names.
    :param field: the setting that gave them.
    :raises ZooInputError: a pattern that matches nothing.
    """
    modules = parametric_modules(net)
    for pattern in patterns:
        if not any(module_matches(name, m, [pattern]) for name, m in modules):
            shown = ", ".join(f"{n} ({type(m).__name__})" for n, m in modules[:12])
            raise ZooInputError(field, pattern, f"names no module with weights of this net; its modules: {shown}"
                                + (" ..." if len(modules) > 12 else ""))


def reinitialise(net: nn.Module) -> None:
    """Draw every layer's parameters afresh by its own ``reset_parameters`` (torch's layers all have one; a module
    without one, such as a container or an activation, has nothing to draw), from torch's global random stream.

    :param net: the net, changed in place.
    """
    for module in net.modules():
        reset = getattr(module, "reset_parameters", None)  # torch's own convention for layers, not a zoo part
        if callable(reset):
            reset()


def has_batch_norm(net: nn.Module) -> bool:
    """Whether the net normalises by batch statistics (its outputs then depend on the other rows in training mode).

    :param net: the net.
    :returns: whether any of its modules is a BatchNorm layer.
    """
    return any(isinstance(m, NORMALISATION_LAYERS) for m in net.modules())


def has_convolutions(net: nn.Module) -> bool:
    """Whether the net has convolution layers (stacked parameter sets then run one after another).

    :param net: the net.
    :returns: whether any of its modules is a convolution.
    """
    return any(isinstance(m, nn.modules.conv._ConvNd) for m in net.modules())


def forward_stacked(net: nn.Module, stacked: dict[str, torch.Tensor], x: torch.Tensor,
                    loop: bool | None = None) -> torch.Tensor:
    """The net's outputs under S parameter sets at once, e.g. S posterior draws of its weights.

    An MLP runs all S as one ``torch.func.vmap`` (one batched matmul per layer). A net with convolutions runs them
    one after another: vmap turns its convolutions into one grouped convolution and its pooling into one S times
    larger batch, which cost more on the CPU than S plain passes (``benchmarks/predict_speed.py``).

    A net vmap cannot batch (a GRU or LSTM: ``aten::gru.input`` has no batching rule) runs its sets one after
    another too, with the same outputs (:func:`run_batched`).

    :param net: the net; what ``stacked`` names replaces its tensors, the rest (e.g. BatchNorm's running statistics)
        stay its own.
    :param stacked: ``{name: [S, *shape]}``, the S sets stacked along a first dimension.
    :param x: the inputs ``[B, ...]``, the same for every set.
    :param loop: run the sets one after another (None: where vmap does not serve the net).
    :returns: the outputs ``[S, B, out]``.
    """

    def one_at_a_time() -> torch.Tensor:
        count = next(iter(stacked.values())).shape[0]
        return torch.stack([functional_call(net, {n: v[s] for n, v in stacked.items()}, (x,))
                            for s in range(count)])

    if loop or (loop is None and has_convolutions(net)):
        return one_at_a_time()
    return run_batched(net, lambda: vmap(lambda one: functional_call(net, one, (x,)))(stacked), one_at_a_time)


# layers torch.func.vmap has no batching rule for (aten::gru.input, aten::lstm.input, aten::rnn_tanh.input)
UNBATCHED_LAYERS = (nn.RNNBase,)
# whether vmap batches a net: decided once per net (a step calls run_batched; it does not walk the modules each time)
_BATCHABLE: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()
# ... and what an in-place op on a tensor vmap does not batch says (``h = torch.zeros(n, k); h += layer(x)``: the
# plain forward ran in check_outputs, so a broadcast error here is vmap's)
VMAP_FAILURES = ("Batching rule not implemented", "vmap: ", "functorch", "doesn't match the broadcast shape")


def vmap_serves(net: nn.Module) -> bool:
    """Whether vmap can batch the net's parameter sets: no layer of :data:`UNBATCHED_LAYERS`, and no vmap of it
    failed before (decided once per net).

    :param net: the net.
    :returns: whether to try vmap.
    """
    if net not in _BATCHABLE:
        _BATCHABLE[net] = not any(isinstance(m, UNBATCHED_LAYERS) for m in net.modules())
    return _BATCHABLE[net]


def run_batched(net: nn.Module, batched: Callable[[], torch.Tensor],
                one_at_a_time: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``batched()`` (a vmap over the net's parameter sets) where vmap serves the net, else ``one_at_a_time()`` (the
    same sets in a loop, the same outputs); a vmap that fails for want of a batching rule marks the net, once, and
    the loop runs instead.

    :param net: the net the sets are of.
    :param batched: the vmapped computation.
    :param one_at_a_time: the looped computation.
    :returns: what the one that ran returns.
    """
    if not vmap_serves(net):
        return one_at_a_time()
    try:
        return batched()
    except RuntimeError as err:
        if not any(marker in str(err) for marker in VMAP_FAILURES):
            raise
        _BATCHABLE[net] = False
        return one_at_a_time()


def check_materialised(net: nn.Module, field: str = "net", value: object = None) -> None:
    """Refuse a net whose parameters or buffers lie on the meta device: shapes without values, which no fit can
    move to a device or read.

    :param net: the net.
    :param field: the setting that gave it, for the message.
    :param value: what the setting holds (None: the net's class name).
    :raises ZooInputError: naming the first such tensors and how to give them values.
    """
    meta = [name for name, t in (*net.named_parameters(), *net.named_buffers()) if t.is_meta]
    if meta:
        shown = ", ".join(meta[:3]) + (f" (and {len(meta) - 3} more)" if len(meta) > 3 else "")
        raise ZooInputError(field, value or type(net).__name__, f"its tensors {shown} lie on the meta device "
                            "(shapes, no values): materialise the net first, net.to_empty(device='cpu') then load "
                            "its weights (net.load_state_dict(state)) or draw them (reset_parameters()), and pass "
                            "that net")


def input_image_shape(net: nn.Module) -> tuple[int, int, int] | None:
    """(C, H, W) of the images an image net reads its flat rows as (its first module unflattens them); None for
    a net of plain feature rows.

    :param net: the net.
    :returns: ``(C, H, W)``, or None.
    """
    first = next(iter(net.children()), None)
    if isinstance(first, nn.Unflatten) and len(first.unflattened_size) == 3:
        return tuple(int(d) for d in first.unflattened_size)
    return None


def batch_dependent(net: nn.Module) -> bool:
    """Whether the net's output for a row depends on the other rows of its batch: BatchNorm in training mode.

    :param net: the net.
    :returns: whether any BatchNorm layer is in training mode.
    """
    return any(isinstance(m, NORMALISATION_LAYERS) and m.training for m in net.modules())


@contextlib.contextmanager
def evaluation_mode(net: nn.Module) -> Iterator[nn.Module]:
    """Run ``net`` in eval mode within (BatchNorm reads its running statistics), then restore its mode.

    Families fit in training mode (batch statistics, running statistics updated) and predict, linearise and
    score in evaluation mode, where every example's output depends on that example alone.

    :param net: the net.
    :returns: a context manager yielding ``net`` in eval mode; on exit, the mode it had is restored.
    """
    was_training = net.training
    net.eval()
    try:
        yield net
    finally:
        net.train(was_training)


def prediction_mode(net: nn.Module, batch_norm: bool) -> contextlib.AbstractContextManager:
    """:func:`evaluation_mode` for a net with BatchNorm (``batch_norm``, known once per family), else a no-op, so
    the samplers' compiled potentials of plain nets never toggle module modes.

    :param net: the net.
    :param batch_norm: whether it has BatchNorm (:func:`has_batch_norm`).
    :returns: a context manager yielding ``net``.
    """
    return evaluation_mode(net) if batch_norm else contextlib.nullcontext(net)




class ImageNetSection(NetSection):
    """A net that reads each row as square images of ``in_channels`` channels."""

    in_channels: InChannels

    @property
    def image_channels(self) -> int:
        return self.in_channels
