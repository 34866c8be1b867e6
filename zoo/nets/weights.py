"""Trained weights for a net: a ``state_dict`` in Python, a ``.pt``/``.pth`` file of one, a ``.safetensors`` file, or a
zoo run directory (its point estimate), put into the net before a family makes it Bayesian, so that a family starts
from them (mean-field and rank-1 at the trained weights; subnetwork Laplace, SWAG and MC dropout post hoc)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zoo.errors import ZooInputError

POINT_ESTIMATE = "point_estimate.pt"  # what a zoo run keeps of its fit (zoo.runs.POINT_ESTIMATE_FILE)
SHOWN = 5  # keys listed per kind of mismatch


def read_weights(source: Any, field: str = "net.weights") -> dict[str, torch.Tensor]:
    """The tensors a source of trained weights holds, by name.

    :param source: a ``state_dict`` (or any mapping of names to tensors), an ``nn.Module`` (its ``state_dict``), the
        path of a ``.safetensors`` file, of a ``.pt``/``.pth`` file holding a state dict (or a dict with one under
        ``state_dict``), or of a zoo run directory (its ``point_estimate.pt``).
    :param field: the setting that gave it, for messages.
    :returns: the tensors by name.
    :raises ZooInputError: a missing file, or one that holds no state dict.
    """
    if isinstance(source, nn.Module):
        return dict(source.state_dict())
    if isinstance(source, Mapping):
        return dict(source)
    path = Path(source)
    if path.is_dir():
        path = path / POINT_ESTIMATE
    if not path.is_file():
        raise ZooInputError(field, str(source), "no such file: give a .pt/.pth state dict, a .safetensors file or a "
                            "zoo run directory")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch raises several kinds for a file it cannot read
        raise ZooInputError(field, str(source), f"is not a torch state dict ({type(err).__name__}: "
                            f"{str(err).splitlines()[0][:120]}); save one with torch.save(net.state_dict(), path)") \
            from None
    if isinstance(loaded, Mapping) and isinstance(loaded.get("state_dict"), Mapping):
        loaded = loaded["state_dict"]
    if not isinstance(loaded, Mapping) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        raise ZooInputError(field, str(source), "holds no state dict (a mapping of names to tensors): save one "
                            "with torch.save(net.state_dict(), path)")
    return dict(loaded)


def load_weights(net: nn.Module, source: Any, field: str = "net.weights") -> None:
    """Put trained weights into ``net``, refused where they do not fit it.

    A zoo run's point estimate also holds its likelihood's latents (a learned noise scale): names that are not the
    net's are ignored there, and only there.

    :param net: the net, changed in place.
    :param source: the weights (see :func:`read_weights`).
    :param field: the setting that gave them, for messages.
    :raises ZooInputError: listing the net's keys the weights lack, the keys the net does not have, and the shapes
        that differ.
    """
    weights = read_weights(source, field)
    mine = net.state_dict()
    from_run = not isinstance(source, Mapping | nn.Module) and Path(source).is_dir()
    unexpected = [] if from_run else sorted(set(weights) - set(mine))
    missing = sorted(k for k in mine if k not in weights
                     and not (from_run and k not in dict(net.named_parameters())))  # a run keeps no buffers
    shapes = [f"{k} ({tuple(weights[k].shape)} given, {tuple(mine[k].shape)} in the net)"
              for k in mine if k in weights and weights[k].shape != mine[k].shape]
    if missing or unexpected or shapes:
        problems = [f"{what}: {', '.join(keys[:SHOWN])}{f' and {len(keys) - SHOWN} more' if len(keys) > SHOWN else ''}"
                    for what, keys in (("missing keys", missing), ("unexpected keys", unexpected),
                                       ("shapes differ", shapes)) if keys]
        raise ZooInputError(field, str(source) if not isinstance(source, Mapping) else "a state dict",
                            f"does not fit the net ({type(net).__name__}): {'; '.join(problems)}")
    with torch.no_grad():
        for name, value in mine.items():
            if name in weights:
                value.copy_(weights[name].to(value))
