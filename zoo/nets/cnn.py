"""A small CNN for square one-channel images (e.g. the 8x8 digits)."""

from __future__ import annotations

import math
from collections import OrderedDict
from itertools import pairwise
from typing import Literal

from pydantic import Field
from torch import nn

from zoo.errors import ZooInputError
from zoo.nets.base import ACTIVATIONS, Activation, NetSection, Widths, activation_refusals


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



class CNNSpec(NetSection):
    """A small CNN (3x3 convolutions, then dense layers) for square one-channel images given as flat rows."""

    name: Literal["cnn"] = Field(description="cnn")
    channels: Widths = Field(default_factory=lambda: [16, 32], description="channels of the conv layers")
    hidden: Widths = Field(default_factory=lambda: [50], description="widths of the dense layers after them")
    activation: Activation

    def refusals(self) -> list[ZooInputError]:
        return activation_refusals(self.activation)

    def build(self, in_dim: int, out_dim: int) -> nn.Module:
        return build_cnn(in_dim, out_dim, self.hidden, self.activation, self.channels)
