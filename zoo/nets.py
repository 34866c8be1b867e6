"""Deterministic architectures: plain ``nn.Module`` nets whose parameters the model families make random."""

from __future__ import annotations

import contextlib
import difflib
import inspect
import math
import textwrap
from collections import OrderedDict
from collections.abc import Iterator
from itertools import pairwise

import torch
from torch import nn

from zoo.errors import ZooInputError
from zoo.sections import NetSpec

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


def image_shape(in_dim: int, in_channels: int, net: str) -> tuple[int, int, int]:
    """(C, H, W) of flat rows of ``in_dim`` pixels holding square ``in_channels``-channel images."""
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


NETS = {"mlp": build_mlp, "cnn": build_cnn, "lenet5": build_lenet5, "resnet": build_resnet, "wrn": build_wrn,
        "torchvision": build_torchvision}
NORMALISATION_LAYERS = (nn.modules.batchnorm._BatchNorm,)


def has_batch_norm(net: nn.Module) -> bool:
    """Whether the net normalises by batch statistics (its outputs then depend on the other rows in training mode)."""
    return any(isinstance(m, NORMALISATION_LAYERS) for m in net.modules())


def has_convolutions(net: nn.Module) -> bool:
    """Whether the net has convolution layers (the deep ensemble then runs its members one after another)."""
    return any(isinstance(m, nn.modules.conv._ConvNd) for m in net.modules())


def input_image_shape(net: nn.Module) -> tuple[int, int, int] | None:
    """(C, H, W) of the images an image net reads its flat rows as (its first module unflattens them); None for
    a net of plain feature rows."""
    first = next(iter(net.children()), None)
    if isinstance(first, nn.Unflatten) and len(first.unflattened_size) == 3:
        return tuple(int(d) for d in first.unflattened_size)
    return None


def batch_dependent(net: nn.Module) -> bool:
    """Whether the net's output for a row depends on the other rows of its batch: BatchNorm in training mode."""
    return any(isinstance(m, NORMALISATION_LAYERS) and m.training for m in net.modules())


@contextlib.contextmanager
def evaluation_mode(net: nn.Module) -> Iterator[nn.Module]:
    """Run ``net`` in eval mode within (BatchNorm reads its running statistics), then restore its mode.

    Families fit in training mode (batch statistics, running statistics updated) and predict, linearise and
    score in evaluation mode, where every example's output depends on that example alone.
    """
    was_training = net.training
    net.eval()
    try:
        yield net
    finally:
        net.train(was_training)


def prediction_mode(net: nn.Module, batch_norm: bool) -> contextlib.AbstractContextManager:
    """:func:`evaluation_mode` for a net with BatchNorm (``batch_norm``, known once per family), else a no-op, so
    the samplers' compiled potentials of plain nets never toggle module modes."""
    return evaluation_mode(net) if batch_norm else contextlib.nullcontext(net)


def check_net_settings(spec: NetSpec) -> None:
    """Refuse a field the spec sets to a non-default value that the named net does not take (e.g. ``depth`` on an
    MLP), so that a setting never silently does nothing."""
    if spec.name not in NETS:
        return  # the name itself is refused with the choices elsewhere
    accepted = inspect.signature(NETS[spec.name]).parameters
    given = spec.model_dump(exclude_unset=True)
    defaults = {k: f.get_default(call_default_factory=True) for k, f in NetSpec.model_fields.items()}
    ignored = sorted(k for k in given if k not in accepted and k != "name" and given[k] != defaults[k])
    if ignored:
        raise ZooInputError(f"net.{ignored[0]}", given[ignored[0]], f"net {spec.name!r} does not take it; it takes "
                            f"{', '.join(k for k in accepted if k not in ('in_dim', 'out_dim'))}")


def _construct(spec: NetSpec, in_dim: int, out_dim: int) -> nn.Module:
    """The named net for these widths; each builder receives the spec fields its signature names."""
    accepted = inspect.signature(NETS[spec.name]).parameters
    return NETS[spec.name](in_dim, out_dim, **{k: v for k, v in spec.model_dump().items() if k in accepted})


def _runs_on(spec: NetSpec, in_dim: int) -> bool:
    """Whether the named net builds and runs on rows of ``in_dim`` inputs (a dry run on one blank row)."""
    try:
        net = _construct(spec, in_dim, 2)
        with torch.no_grad(), evaluation_mode(net):
            net(torch.zeros(1, in_dim))
    except (ZooInputError, RuntimeError):
        return False
    return True


def _misfit(spec: NetSpec, in_dim: int, shape: tuple[int, ...] | None, data_name: str, err: Exception) -> str:
    """What to change when the net cannot run on the data's rows: the zoo's nets that can, and the smallest square
    images the net can read (its other settings kept)."""
    what = f"{'x'.join(map(str, shape))} images" if shape is not None else f"rows of {in_dim} inputs"
    fitting = [name for name in NETS if name not in (spec.name, "torchvision")
               and _runs_on(NetSpec(name=name, activation=spec.activation, in_channels=spec.in_channels), in_dim)]
    channels = shape[0] if shape is not None else spec.in_channels
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


def build_net(spec: NetSpec, in_dim: int, out_dim: int, image_shape: tuple[int, int, int] | None = None,
              data_name: str = "the data") -> nn.Module:
    """The spec's net for the data's widths, refused where it does not fit the data: an image net reading rows
    as other images than the data's ``image_shape`` (C, H, W), or a net that fails on one blank row (e.g. LeNet-5's
    5x5 convolutions on 8x8 digits)."""
    check_net_settings(spec)

    def misfit(err: RuntimeError, reads: tuple[int, ...] | None) -> ZooInputError:
        why = _misfit(spec, in_dim, image_shape or reads, data_name, err)
        return ZooInputError("net.name", spec.name, why, message=f"net.name: {why}")

    try:  # a builder may run its layers once to size the dense ones
        net = _construct(spec, in_dim, out_dim)
    except RuntimeError as err:
        raise misfit(err, None) from None
    reads = input_image_shape(net)
    if image_shape is not None and reads is not None and tuple(reads) != tuple(image_shape):
        raise ZooInputError("net.in_channels", spec.in_channels, f"net {spec.name!r} would read each row of "
                            f"{data_name} as {'x'.join(map(str, reads))} images, but they are "
                            f"{'x'.join(map(str, image_shape))}: set net.in_channels: {image_shape[0]}")
    try:
        with torch.no_grad(), evaluation_mode(net):
            net(torch.zeros(1, in_dim))
    except RuntimeError as err:
        raise misfit(err, reads) from None
    return net
