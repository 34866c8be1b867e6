"""Deterministic architectures: plain ``nn.Module`` nets whose parameters the model families make random."""

from __future__ import annotations

import inspect
import math
from collections import OrderedDict
from itertools import pairwise

import torch
from torch import nn

from zoo.errors import ZooInputError
from zoo.spec import NetSpec

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "gelu": nn.GELU,
    "elu": nn.ELU,
    "silu": nn.SiLU,
    "sigmoid": nn.Sigmoid,
}


def build_mlp(in_dim: int, out_dim: int, hidden: list[int], activation: str = "relu") -> nn.Sequential:
    """A multilayer perceptron with layers named ``hidden0, hidden1, ..., out`` (the sites' name prefixes)."""
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    widths = [in_dim, *hidden]
    for i, (fan_in, fan_out) in enumerate(pairwise(widths)):
        layers[f"hidden{i}"] = nn.Linear(fan_in, fan_out)
        layers[f"act{i}"] = ACTIVATIONS[activation]()
    layers["out"] = nn.Linear(widths[-1], out_dim)
    return nn.Sequential(layers)


class ParameterSwap:
    """Run a net with its parameters replaced by given tensors (e.g. sampled weights), keeping autograd through them.

    ``torch.func.functional_call`` does the same for any module but re-walks the module tree on every call; a
    training step calls this once per ELBO evaluation, so the (module, attribute) slots are resolved once here.
    """

    def __init__(self, net: nn.Module) -> None:
        self.net = net
        modules = dict(net.named_modules())
        self.slots = {}
        for name, _ in net.named_parameters():
            owner, _, attr = name.rpartition(".")
            self.slots[name] = (modules[owner], attr)

    def __call__(self, weights: dict[str, torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
        """``net(*inputs)`` with parameter ``name`` replaced by ``weights[name]`` for every name given."""
        saved = []
        try:
            for name, value in weights.items():
                module, attr = self.slots[name]
                saved.append((module, attr, module._parameters[attr]))
                module._parameters[attr] = value
            return self.net(*inputs)
        finally:
            for module, attr, original in saved:
                module._parameters[attr] = original


def build_cnn(in_dim: int, out_dim: int, hidden: list[int], activation: str = "relu",
              channels: list[int] | None = None) -> nn.Sequential:
    """A small CNN for square one-channel images given as flat rows of ``side * side`` pixels (e.g. digits 8x8).

    3x3 convolutions (``conv0, conv1, ...``; every one after the first with stride 2), then dense layers
    ``hidden0, ...`` and ``out``. Shapes are taken from the last dims, so any leading batch dims pass through.
    """
    side = math.isqrt(in_dim)
    if side * side != in_dim:
        raise ZooInputError("net.name", "cnn", f"needs square one-channel images; {in_dim} inputs are not a square")
    layers: OrderedDict[str, nn.Module] = OrderedDict(image=nn.Unflatten(-1, (1, side, side)))
    widths = [1, *(channels or [16, 32])]
    for i, (c_in, c_out) in enumerate(pairwise(widths)):
        stride = 1 if i == 0 else 2
        layers[f"conv{i}"] = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1)
        layers[f"conv_act{i}"] = ACTIVATIONS[activation]()
        side = (side - 1) // stride + 1
    layers["flatten"] = nn.Flatten(start_dim=-3)
    dense = [widths[-1] * side * side, *hidden]
    for i, (fan_in, fan_out) in enumerate(pairwise(dense)):
        layers[f"hidden{i}"] = nn.Linear(fan_in, fan_out)
        layers[f"act{i}"] = ACTIVATIONS[activation]()
    layers["out"] = nn.Linear(dense[-1], out_dim)
    return nn.Sequential(layers)


NETS = {"mlp": build_mlp, "cnn": build_cnn}


def build_net(spec: NetSpec, in_dim: int, out_dim: int) -> nn.Module:
    """The spec's net for the data's widths; each builder receives the spec fields its signature names."""
    builder = NETS[spec.name]
    accepted = inspect.signature(builder).parameters
    return builder(in_dim, out_dim, **{k: v for k, v in spec.model_dump().items() if k in accepted})
