"""Trained weights for a net: a ``state_dict`` in Python, a ``.pt``/``.pth`` file of one, a ``.safetensors`` file, or a
zoo run directory (its point estimate), put into the net before a family makes it Bayesian, so that a family starts
from them (mean-field and rank-1 at the trained weights; subnetwork Laplace, SWAG and MC dropout post hoc)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zoo.errors import ZooInputError

POINT_ESTIMATE = "point_estimate.pt"  # what a zoo run keeps of its fit (zoo.runs.POINT_ESTIMATE_FILE)
SHOWN = 5  # keys listed per kind of mismatch
SOURCES = ("a state dict (a mapping of names to tensors), an nn.Module, or the path (str or pathlib.Path) of a "
           ".pt/.pth state dict, a .safetensors file or a zoo run directory")
SAVE = "torch.save(net.state_dict(), path)"

# Where trained weights come from: a state dict, a module, or the path of a weights file or a zoo run directory
WeightsSource = Mapping[str, torch.Tensor] | nn.Module | str | os.PathLike


def read_weights(source: WeightsSource, field: str = "net.weights") -> dict[str, torch.Tensor]:
    """The tensors a source of trained weights holds, by name.

    :param source: a ``state_dict`` (or any mapping of names to tensors), an ``nn.Module`` (its ``state_dict``), the
        path of a ``.safetensors`` file, of a ``.pt``/``.pth`` file holding a state dict (or a dict with one under
        ``state_dict``), or of a zoo run directory (its ``point_estimate.pt``).
    :param field: the setting that gave it, for messages.
    :returns: the tensors by name.
    :raises ZooInputError: a source of another type, a missing, empty, truncated or unreadable file, a directory
        that is not a run, or a file that holds no state dict.
    """
    if isinstance(source, nn.Module):
        return dict(source.state_dict())
    if isinstance(source, Mapping):
        return _state_dict(source, field, "a state dict")
    if not isinstance(source, str | os.PathLike):
        raise ZooInputError(field, type(source).__name__, f"give trained weights as {SOURCES}")
    path = Path(source)
    if path.is_dir():
        if not (path / POINT_ESTIMATE).is_file():
            raise ZooInputError(field, str(source), f"is a directory without {POINT_ESTIMATE}, so not a finished "
                                "zoo run: give the directory zoo train wrote, or a .pt/.pth/.safetensors file")
        path = path / POINT_ESTIMATE
    if not path.is_file():
        raise ZooInputError(field, str(source), f"no such file: give {SOURCES}")
    if path.stat().st_size == 0:
        raise ZooInputError(field, str(source), f"is empty (0 bytes): save the weights again, e.g. {SAVE}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as err:  # noqa: BLE001 - SafetensorError, or an OSError of a file cut short
            raise ZooInputError(field, str(source), f"is not a readable .safetensors file ({_reason(err)}): it is "
                                "truncated or not written by safetensors; save one with "
                                "safetensors.torch.save_file(net.state_dict(), path)") from None
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head != b"PK\x03\x04" and head[:1] != b"\x80":  # torch.save writes a zip archive (a pickle before 1.6)
        raise ZooInputError(field, str(source), f"is not a file torch.save writes (it starts as neither a zip archive "
                            f"nor a pickle: e.g. text); save the weights with {SAVE}")
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch raises several kinds for a file it cannot read
        if "Weights only load failed" in str(err):
            raise ZooInputError(field, str(source), "holds Python objects besides tensors (e.g. a whole nn.Module), "
                                f"which are not unpickled (it could run code); save the state dict instead: {SAVE}") \
                from None
        raise ZooInputError(field, str(source), f"cannot be read as a torch file ({_reason(err)}): it is truncated "
                            f"or not written by torch.save; save one with {SAVE}") from None
    if isinstance(loaded, Mapping) and isinstance(loaded.get("state_dict"), Mapping):
        loaded = loaded["state_dict"]
    return _state_dict(loaded, field, str(source))


def _reason(err: Exception) -> str:
    """An exception's type and the first line of its message (its type alone where it has none)."""
    lines = str(err).strip().splitlines()
    first = lines[0].split(". ")[0].rstrip(".")[:120] if lines else ""
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def _state_dict(loaded: Any, field: str, given: str) -> dict[str, torch.Tensor]:
    """``loaded`` as a state dict (names to tensors), refused naming what it holds where it is not one."""
    if isinstance(loaded, Mapping):
        bad = next(((k, v) for k, v in loaded.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)),
                   None)
        if bad is None:
            return dict(loaded)
        holds = f"a mapping whose entry {bad[0]!r} is of type {type(bad[1]).__name__}"
    else:
        holds = f"a {type(loaded).__name__}"
    raise ZooInputError(field, given, f"holds {holds}, not a state dict (a mapping of parameter names to tensors): "
                        f"save one with {SAVE}")


def load_weights(net: nn.Module, source: WeightsSource, field: str = "net.weights") -> None:
    """Put trained weights into ``net``, refused where they do not fit it.

    A zoo run's point estimate also holds its likelihood's latents (a learned noise scale): names that are not the
    net's are ignored there, and only there.

    :param net: the net, changed in place.
    :param source: the weights (see :func:`read_weights`).
    :param field: the setting that gave them, for messages.
    :raises ZooInputError: listing the net's keys the weights lack, the keys the net does not have, and the shapes
        that differ.
    """
    weights = read_weights(source, field)  # names to tensors, every value checked
    mine = net.state_dict()
    given = str(source) if not isinstance(source, Mapping) else "a state dict"
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
        raise ZooInputError(field, given, f"does not fit the net ({type(net).__name__}): {'; '.join(problems)}")
    for name, value in weights.items():
        if name not in mine:
            continue
        if value.is_complex() and not mine[name].is_complex():
            raise ZooInputError(field, given, f"{name} is {value.dtype} and the net's is {mine[name].dtype}: copying "
                                "it would drop the imaginary parts; give real weights")
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise ZooInputError(field, given, f"{name} holds NaN/inf values: a fit cannot start from them; give the "
                                "weights of a trained net whose values are finite (a checkpoint before it diverged)")
    with torch.no_grad():
        for name, value in mine.items():
            if name in weights:
                value.copy_(weights[name].to(value))
