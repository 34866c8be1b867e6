"""Deterministic architectures: plain ``nn.Module`` nets whose parameters the model families make random."""

from __future__ import annotations

from collections import OrderedDict
from itertools import pairwise

import torch
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


NETS = {"mlp": build_mlp}
