"""Deterministic architectures: plain ``nn.Module`` nets whose parameters the model families make random."""

from __future__ import annotations

from collections import OrderedDict
from itertools import pairwise

from torch import nn

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


NETS = {"mlp": build_mlp}
