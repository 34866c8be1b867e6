"""Deterministic architectures: plain ``nn.Module`` nets whose parameters the model families make random. Each is
one module holding its builder and its ``net`` section, registered here once.

:data:`NETS` is the registry: the spec's ``net`` section takes any registered net (``net.name``), ``zoo list``
lists them. Adding a net is its module (a :class:`~zoo.nets.base.NetSection` whose ``build`` returns the module) and
one entry below.
"""

from __future__ import annotations

import math
import textwrap
from typing import Any

import torch
from torch import nn

from zoo.errors import ZooInputError
from zoo.nets.base import (
    ACTIVATIONS,
    NORM_LAYERS,
    NORMALISATION_LAYERS,
    NetSection,
    ParameterSwap,
    batch_dependent,
    check_materialised,
    check_patterns,
    evaluation_mode,
    forward_stacked,
    has_batch_norm,
    has_convolutions,
    image_shape,
    input_image_shape,
    module_matches,
    parametric_modules,
    prediction_mode,
    reinitialise,
    run_batched,
)
from zoo.nets.cnn import CNNSpec, build_cnn
from zoo.nets.lenet5 import LeNet5Spec, build_lenet5
from zoo.nets.mlp import MLPSpec, build_mlp
from zoo.nets.module import NET_FILE, ModuleNetSpec
from zoo.nets.python import PythonNetSpec
from zoo.nets.resnet import ResNetSpec, WRNSpec, build_resnet, build_wrn
from zoo.nets.torchvision import TorchvisionSpec, build_torchvision
from zoo.nets.weights import load_weights, read_weights
from zoo.parts import Catalogue
from zoo.runs import check_size_fits

__all__ = ["ACTIVATIONS", "NETS", "NET_FILE", "NORMALISATION_LAYERS", "NORM_LAYERS", "check_patterns",
           "module_matches", "parametric_modules", "ModuleNetSpec", "NetConfig", "NetSection",
           "ParameterSwap", "PythonNetSpec",
           "batch_dependent", "build_cnn", "build_lenet5", "build_mlp", "build_net", "build_resnet",
           "build_torchvision", "build_wrn", "evaluation_mode", "forward_stacked", "has_batch_norm",
           "has_convolutions", "image_shape", "input_image_shape", "load_weights", "net_section", "prediction_mode",
           "read_weights", "reinitialise", "check_materialised", "run_batched"]

NETS = Catalogue("net", MLPSpec, CNNSpec, LeNet5Spec, ResNetSpec, WRNSpec, TorchvisionSpec, PythonNetSpec,
                 ModuleNetSpec)
NetConfig = NETS.union()


def net_section(**fields: Any) -> NetSection:
    """The section of the net ``fields["name"]`` names (``mlp`` where none), validated as the spec validates it.

    :param fields: the net section's fields, e.g. ``name="resnet", depth=8``.
    :returns: the section.
    """
    return NETS.validate(fields, default="mlp")


def _runs_on(spec: NetSection, in_dim: int) -> bool:
    """Whether the net builds and runs on rows of ``in_dim`` inputs (a dry run on one blank row)."""
    try:
        net = spec.build(in_dim, 2)
        with torch.no_grad(), evaluation_mode(net):
            net(torch.zeros(1, in_dim))
    except (ZooInputError, RuntimeError):
        return False
    return True


def _alike(spec: NetSection, section: type[NetSection]) -> NetSection:
    """Another registered net with the settings it shares with ``spec`` (activation, input channels)."""
    shared = {k: v for k, v in spec.model_dump().items() if k in section.model_fields and k != "name"}
    return section.model_validate({"name": next(n for n, s in NETS.items() if s is section), **shared})


def _misfit(spec: NetSection, in_dim: int, shape: tuple[int, ...] | None, data_name: str, err: Exception) -> str:
    """What to change when the net cannot run on the data's rows: the zoo's nets that can, and the smallest square
    images the net can read (its other settings kept)."""
    what = f"{'x'.join(map(str, shape))} images" if shape is not None else f"rows of {in_dim} inputs"
    fitting = [name for name, section in NETS.items()
               if name != spec.name and not section.optional and section.flat_rows
               and _runs_on(_alike(spec, section), in_dim)]
    channels = shape[0] if shape is not None else spec.image_channels
    larger = ""
    low, high = math.isqrt(in_dim // channels), 256  # the net fails at low; bisect for the smallest side it reads
    if low < high and _runs_on(spec, channels * high * high):
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if _runs_on(spec, channels * middle * middle) else (middle, high)
        larger = f" or a data set of images at least {channels}x{high}x{high}"
    detail = textwrap.shorten(str(err).splitlines()[0] if str(err) else "", 90, placeholder=" ...")
    return (f"net {spec.name!r} cannot read the {what} of {data_name} ({type(err).__name__}: {detail}); use a net "
            f"that fits them (net.name: {', '.join(fitting)}){larger}")


NET_COPIES = 4  # a net's weights at once in a fit: the net, a guide's two parameters per weight, a gradient


def _count_weights(spec: NetSection, in_dim: int, out_dim: int) -> int | None:
    """The weights of the spec's net, counted on the meta device (nothing allocated); None where it cannot be."""
    try:
        with torch.device("meta"):
            return sum(p.numel() for p in spec.build(in_dim, out_dim).parameters())
    except Exception:  # noqa: BLE001 - a builder that cannot run on meta tensors: the build itself says what fails
        return None


def check_net_fits(spec: NetSection, in_dim: int, out_dim: int) -> None:
    """Refuse, before it is built, a named net whose weights (:data:`NET_COPIES` copies of float32) would not fit in
    memory, naming its widths (``net.hidden``) and the widths that fit.

    :param spec: the spec's net section.
    :param in_dim: inputs per row.
    :param out_dim: outputs per row.
    :raises ZooInputError: naming ``net.hidden`` (or ``net``), the estimate and the fix.
    """
    weights = _count_weights(spec, in_dim, out_dim)
    if weights is None:
        return
    hidden = getattr(spec, "hidden", None)
    field, value = ("net.hidden", hidden) if isinstance(hidden, list) else ("net", spec.name)

    def fix(allowed: float) -> str:
        most = int(allowed // (NET_COPIES * 4))
        if not isinstance(hidden, list) or not hidden:
            return f"use a smaller net (at most about {most:,} weights)"
        scale = 1.0
        while scale > 1e-6:  # shrink every width until the net fits
            scale *= 0.9
            narrower = [max(1, int(w * scale)) for w in hidden]
            count = _count_weights(spec.model_copy(update={"hidden": narrower}), in_dim, out_dim)
            if count is not None and count <= most:
                return f"use narrower layers, e.g. net.hidden: {narrower} (at most about {most:,} weights)"
        return f"use narrower layers (at most about {most:,} weights)"

    check_size_fits(field, value, weights * NET_COPIES * 4, fix, f"a net of {weights:,} weights")


def build_net(spec: NetSection, in_dim: int, out_dim: int, image_shape: tuple[int, int, int] | None = None,
              data_name: str = "the data") -> nn.Module:
    """The spec's net for the data's widths, refused where it does not fit the data: an image net reading rows
    as other images than the data's ``image_shape`` (C, H, W), or a net that fails on one blank row (e.g. LeNet-5's
    5x5 convolutions on 8x8 digits).

    :param spec: the spec's net section.
    :param in_dim: inputs per row.
    :param out_dim: outputs per row.
    :param image_shape: (C, H, W) of the data's rows, where they are images.
    :param data_name: the data set, for messages.
    :returns: the untrained net.
    :raises ZooInputError: a net that does not fit the data, with the nets that do.
    """

    def misfit(err: RuntimeError, reads: tuple[int, ...] | None) -> ZooInputError:
        why = _misfit(spec, in_dim, image_shape or reads, data_name, err)
        return ZooInputError("net.name", spec.name, why, message=f"net.name: {why}")

    if not spec.flat_rows:  # a user's own net: the pipeline's dry run on real rows checks it
        net = spec.build(in_dim, out_dim)
        named = isinstance(spec, PythonNetSpec)  # built by the spec's factory, named by its target
        check_materialised(net, "net.target" if named else "net", spec.target if named else type(net).__name__)
        if spec.weights is not None:
            load_weights(net, spec.weights)
        return net
    check_net_fits(spec, in_dim, out_dim)
    try:  # a builder may run its layers once to size the dense ones
        net = spec.build(in_dim, out_dim)
    except RuntimeError as err:
        raise misfit(err, None) from None
    reads = input_image_shape(net)
    if image_shape is not None and reads is not None and tuple(reads) != tuple(image_shape):
        raise ZooInputError("net.in_channels", reads[0], f"net {spec.name!r} would read each row of "
                            f"{data_name} as {'x'.join(map(str, reads))} images, but they are "
                            f"{'x'.join(map(str, image_shape))}: set net.in_channels: {image_shape[0]}")
    try:
        with torch.no_grad(), evaluation_mode(net):
            net(torch.zeros(1, in_dim))
    except RuntimeError as err:
        raise misfit(err, reads) from None
    if spec.weights is not None:
        load_weights(net, spec.weights)
    return net
