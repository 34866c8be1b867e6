"""The multilayer perceptron."""

from __future__ import annotations

from collections import OrderedDict
from itertools import pairwise
from typing import ClassVar, Literal

from pydantic import Field
from torch import nn

from zoo.errors import ZooInputError
from zoo.nets.base import ACTIVATIONS, Activation, NetSection, Widths, activation_refusals


def build_mlp(in_dim: int, out_dim: int, hidden: list[int], activation: str = "relu") -> nn.Sequential:
    """A multilayer perceptron with layers named ``hidden0, hidden1, ..., out`` (the sites' name prefixes)."""
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    widths = [in_dim, *hidden]
    for i, (fan_in, fan_out) in enumerate(pairwise(widths)):
        layers[f"hidden{i}"] = nn.Linear(fan_in, fan_out)
        layers[f"act{i}"] = ACTIVATIONS[activation]()
    layers["out"] = nn.Linear(widths[-1], out_dim)
    return nn.Sequential(layers)



class MLPSpec(NetSection):
    """A multilayer perceptron with layers named hidden0, hidden1, ..., out (the sites' name prefixes)."""

    convolutional: ClassVar[bool] = False

    name: Literal["mlp"] = Field("mlp", description="mlp")
    hidden: Widths = Field(default_factory=lambda: [50], description="hidden layer widths")
    activation: Activation

    def refusals(self) -> list[ZooInputError]:
        return activation_refusals(self.activation)

    def build(self, in_dim: int, out_dim: int) -> nn.Module:
        return build_mlp(in_dim, out_dim, self.hidden, self.activation)
