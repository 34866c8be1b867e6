"""Residual nets for images: the CIFAR ResNet-(6n+2) with BatchNorm and the pre-activation Wide ResNet."""

from __future__ import annotations

from collections import OrderedDict
from typing import Literal

import torch
from pydantic import Field, PositiveInt
from torch import nn

from zoo.errors import ZooInputError
from zoo.nets.base import ACTIVATIONS, Activation, ImageNetSection, activation_refusals, image_shape


def _conv3x3(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """The CIFAR ResNet block (He et al. 2016): conv-BN-act-conv-BN plus a shortcut, then the activation.

    Where the shape changes the shortcut is a 1x1 convolution with BatchNorm (option B), so every parameter is an
    ordinary Conv2d / BatchNorm2d parameter that each family can treat.
    """

    def __init__(self, c_in: int, c_out: int, stride: int, act: type[nn.Module]) -> None:
        super().__init__()
        self.conv1, self.bn1, self.act1 = _conv3x3(c_in, c_out, stride), nn.BatchNorm2d(c_out), act()
        self.conv2, self.bn2, self.act2 = _conv3x3(c_out, c_out), nn.BatchNorm2d(c_out), act()
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act1(self.bn1(self.conv1(x)))
        return self.act2(self.bn2(self.conv2(out)) + self.shortcut(x))


class WideBlock(nn.Module):
    """The pre-activation Wide ResNet block (Zagoruyko & Komodakis 2016): BN-act-conv-BN-act-conv plus a shortcut
    (a 1x1 convolution of the pre-activated input where the shape changes)."""

    def __init__(self, c_in: int, c_out: int, stride: int, act: type[nn.Module]) -> None:
        super().__init__()
        self.bn1, self.act1, self.conv1 = nn.BatchNorm2d(c_in), act(), _conv3x3(c_in, c_out, stride)
        self.bn2, self.act2, self.conv2 = nn.BatchNorm2d(c_out), act(), _conv3x3(c_out, c_out)
        self.projection = (nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)
                           if stride != 1 or c_in != c_out else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = self.act1(self.bn1(x))
        out = self.conv2(self.act2(self.bn2(self.conv1(pre))))
        return out + (self.projection(pre) if self.projection is not None else x)


def _residual_net(name: str, in_dim: int, out_dim: int, depth: int, widen: int, activation: str,
                  in_channels: int, block: type[nn.Module], offset: int) -> nn.Sequential:
    """stem conv 3x3 (16) - three stages of n blocks (16k, 32k, 64k channels; stride 2 into stages 2 and 3) -
    global average pool - ``out``; ``depth = 6n + offset``. Pre-activation nets end with BN and the activation."""
    if (depth - offset) % 6 or depth <= offset:
        raise ZooInputError("net.depth", depth, f"{name} has 6n + {offset} layers: use e.g. "
                            f"{', '.join(str(6 * n + offset) for n in (1, 3, 4))}")
    shape, act = image_shape(in_dim, in_channels, name), ACTIVATIONS[activation]
    blocks_per_stage = (depth - offset) // 6
    layers: OrderedDict[str, nn.Module] = OrderedDict(image=nn.Unflatten(-1, shape), stem=_conv3x3(shape[0], 16))
    if block is BasicBlock:
        layers.update(stem_bn=nn.BatchNorm2d(16), stem_act=act())
    c_in = 16
    for stage, width in enumerate((16 * widen, 32 * widen, 64 * widen)):
        layers[f"stage{stage}"] = nn.Sequential(*(
            block(c_in if i == 0 else width, width, 2 if (stage > 0 and i == 0) else 1, act)
            for i in range(blocks_per_stage)))
        c_in = width
    if block is WideBlock:
        layers.update(final_bn=nn.BatchNorm2d(c_in), final_act=act())
    layers.update(pool=nn.AdaptiveAvgPool2d(1), flatten=nn.Flatten(), out=nn.Linear(c_in, out_dim))
    return nn.Sequential(layers)


def build_resnet(in_dim: int, out_dim: int, depth: int | None = None, widen: int = 1, activation: str = "relu",
                 in_channels: int = 1) -> nn.Sequential:
    """CIFAR ResNet-(6n+2) with BatchNorm (He et al. 2016; ResNet-20 by default), ``widen`` times the channels."""
    return _residual_net("resnet", in_dim, out_dim, depth or 20, widen, activation, in_channels, BasicBlock, 2)


def build_wrn(in_dim: int, out_dim: int, depth: int | None = None, widen: int = 1, activation: str = "relu",
              in_channels: int = 1) -> nn.Sequential:
    """Wide ResNet WRN-depth-widen (Zagoruyko & Komodakis 2016; the rank-1 paper's WRN-28-10 family), no dropout."""
    return _residual_net("wrn", in_dim, out_dim, depth or 28, widen, activation, in_channels, WideBlock, 4)



class ResNetSpec(ImageNetSection):
    """CIFAR ResNet-(6n+2) with BatchNorm (He et al. 2016; ResNet-20 by default), widen times the channels."""

    name: Literal["resnet"] = Field(description="resnet")
    depth: PositiveInt | None = Field(None, description="6n + 2 layers (default 20)")
    widen: PositiveInt = Field(1, description="channel multiplier k")
    activation: Activation

    def refusals(self) -> list[ZooInputError]:
        return activation_refusals(self.activation)

    def build(self, in_dim: int, out_dim: int) -> nn.Module:
        return build_resnet(in_dim, out_dim, self.depth, self.widen, self.activation, self.in_channels)


class WRNSpec(ImageNetSection):
    """Wide ResNet WRN-depth-widen (Zagoruyko & Komodakis 2016; the rank-1 paper's WRN-28-10 family), no dropout."""

    name: Literal["wrn"] = Field(description="wrn")
    depth: PositiveInt | None = Field(None, description="6n + 4 layers (default 28)")
    widen: PositiveInt = Field(1, description="channel multiplier k (WRN-28-10 is depth 28, widen 10)")
    activation: Activation

    def refusals(self) -> list[ZooInputError]:
        return activation_refusals(self.activation)

    def build(self, in_dim: int, out_dim: int) -> nn.Module:
        return build_wrn(in_dim, out_dim, self.depth, self.widen, self.activation, self.in_channels)
