"""LeNet-5 (LeCun et al. 1998)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Literal

from pydantic import Field
from torch import nn

from zoo.errors import ZooInputError
from zoo.nets.base import ACTIVATIONS, Activation, ImageNetSection, _flat_width, activation_refusals, image_shape


def build_lenet5(in_dim: int, out_dim: int, activation: str = "relu", in_channels: int = 1) -> nn.Sequential:
    """LeNet-5 (LeCun et al. 1998): conv 5x5 (6) - pool - conv 5x5 (16) - pool - dense 120 - 84 - out.

    The first convolution pads by 2, so a 28x28 image gives the classic 16 x 5 x 5 features; max pooling.
    """
    shape = image_shape(in_dim, in_channels, "lenet5")
    act = ACTIVATIONS[activation]
    features: OrderedDict[str, nn.Module] = OrderedDict(
        conv0=nn.Conv2d(shape[0], 6, 5, padding=2), conv_act0=act(), pool0=nn.MaxPool2d(2),
        conv1=nn.Conv2d(6, 16, 5), conv_act1=act(), pool1=nn.MaxPool2d(2))
    width = _flat_width(nn.Sequential(features), shape)
    return nn.Sequential(OrderedDict(
        image=nn.Unflatten(-1, shape), **features, flatten=nn.Flatten(),
        hidden0=nn.Linear(width, 120), act0=act(), hidden1=nn.Linear(120, 84), act1=act(),
        out=nn.Linear(84, out_dim)))



class LeNet5Spec(ImageNetSection):
    """LeNet-5 (LeCun et al. 1998): conv 5x5 (6) - pool - conv 5x5 (16) - pool - dense 120 - 84 - out."""

    name: Literal["lenet5"] = Field(description="lenet5")
    activation: Activation

    def refusals(self) -> list[ZooInputError]:
        return activation_refusals(self.activation)

    def build(self, in_dim: int, out_dim: int) -> nn.Module:
        return build_lenet5(in_dim, out_dim, self.activation, self.in_channels)
