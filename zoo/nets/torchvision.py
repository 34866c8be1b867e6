"""Any ``torchvision.models`` classifier by name (the optional vision extra)."""

from __future__ import annotations

import difflib
from collections import OrderedDict
from typing import ClassVar, Literal

import torch
from pydantic import Field
from torch import nn

from zoo.errors import ZooInputError
from zoo.nets.base import ImageNetSection, image_shape


class _GreyToColour(nn.Module):
    """Repeat one grey channel ``channels`` times (torchvision's classifiers take three-channel images)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.channels = channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.expand(*x.shape[:-3], self.channels, *x.shape[-2:])


def build_torchvision(in_dim: int, out_dim: int, arch: str | None = None, in_channels: int = 1) -> nn.Sequential:
    """Any ``torchvision.models`` classifier by name (``net.arch``), untrained, with ``out`` classes; optional extra."""
    try:
        import torchvision.models as tv_models
    except Exception as err:  # ImportError, or a torch/torchvision ABI mismatch raising anything else
        raise ZooInputError("net.name", "torchvision", "needs the optional torchvision extra, built for your torch "
                            "(see the vision install in docs/getting-started.md; "
                            f"{type(err).__name__}: {str(err)[:80]})") from None
    known = tv_models.list_models(module=tv_models)
    if arch not in known:
        close = difflib.get_close_matches(str(arch), known, n=5, cutoff=0.5)
        hint = f": did you mean {', '.join(close)}?" if close else ", e.g. resnet18"
        raise ZooInputError("net.arch", arch, f"name a torchvision.models classifier{hint}")
    shape = image_shape(in_dim, in_channels, "torchvision")
    layers: OrderedDict[str, nn.Module] = OrderedDict(image=nn.Unflatten(-1, shape))
    if shape[0] == 1:
        layers["colour"] = _GreyToColour(3)
    layers["body"] = tv_models.get_model(arch, weights=None, num_classes=out_dim)
    return nn.Sequential(layers)



class TorchvisionSpec(ImageNetSection):
    """Any torchvision.models classifier by name (net.arch), untrained, with out classes; optional extra."""

    optional: ClassVar[bool] = True

    name: Literal["torchvision"] = Field(description="torchvision")
    arch: str | None = Field(None, description="the torchvision.models constructor, e.g. resnet18")

    def build(self, in_dim: int, out_dim: int) -> nn.Module:
        return build_torchvision(in_dim, out_dim, self.arch, self.in_channels)
