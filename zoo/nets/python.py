"""Your own net in a spec: a Python callable (a class or a function) named by its import path and called with
``kwargs`` (Hydra's ``_target_`` convention), so that ``zoo train``, ``zoo sweep`` and ``--nproc`` run on it."""

from __future__ import annotations

import inspect
from typing import Any, ClassVar, Literal

from pydantic import Field
from torch import nn

from zoo.errors import ZooInputError
from zoo.nets.base import NetSection
from zoo.parts import describe_failure, import_target


class PythonNetSpec(NetSection):
    """Your own net, built by a Python callable named by import path (module.path:attribute) with kwargs."""

    optional: ClassVar[bool] = True  # never suggested in another net's place
    flat_rows: ClassVar[bool] = False  # it reads whatever rows the user's data have
    convolutional: ClassVar[bool | None] = None  # the built module tells (checked when a run is built)

    name: Literal["python"] = Field(description="python")
    target: str = Field(description="module.path:attribute of a class or function that returns an nn.Module, e.g. "
                        "mypkg.models:make_net; it is passed in_dim and out_dim too where it takes them")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the call")

    def build(self, in_dim: int, out_dim: int) -> nn.Module:
        make = import_target(self.target, "net.target")
        if not callable(make):
            raise ZooInputError("net.target", self.target, "names something that cannot be called: give a class "
                                "or a function that returns an nn.Module")
        kwargs = dict(self.kwargs)
        try:
            accepted = inspect.signature(make).parameters
        except (TypeError, ValueError):
            accepted = {}
        for key, value in (("in_dim", in_dim), ("out_dim", out_dim)):
            if key in accepted and key not in kwargs:
                kwargs[key] = value
        try:
            net = make(**kwargs)
        except TypeError as err:
            raise ZooInputError("net.kwargs", self.kwargs, f"{self.target} refused them: {err}") from None
        except ZooInputError:
            raise
        except Exception as err:  # noqa: BLE001 - the user's code: named with its exception, not a traceback
            raise ZooInputError("net.target", self.target, f"building the net raised {describe_failure(err)}; fix "
                                f"{self.target} (or net.kwargs: {self.kwargs})") from None
        if not isinstance(net, nn.Module):
            raise ZooInputError("net.target", self.target, f"returned a {type(net).__name__}, not an nn.Module")
        return net
