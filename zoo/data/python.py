"""Your own data in a spec: a Python callable named by its import path (Hydra's ``_target_`` convention) that returns
the training rows and, optionally, the test rows, so that ``zoo train`` and ``zoo sweep`` run on them."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from zoo.data.base import DataSection, Dataset
from zoo.data.given import dataset_from
from zoo.errors import ZooInputError
from zoo.parts import describe_failure, import_target


class PythonData(DataSection):
    """Your own data, from a Python callable named by import path (module.path:attribute) called with kwargs."""

    catalogue = {"python": "your own data: a Python callable (data.target) returning (train, test), each (x, y) "
                           "tensors, a torch Dataset or a DataLoader"}

    name: Literal["python"] = Field(description="python")
    target: str = Field(description="module.path:attribute of a callable returning (train, test), or train alone; "
                        "each (x, y) tensors or arrays, a torch Dataset of (x, y) items or a DataLoader")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the call")
    task: Literal["regression", "classification"] | None = Field(
        None, description="regression or classification (None: integer targets are classes)")

    def load(self, seed: int) -> Dataset:
        make = import_target(self.target, "data.target")
        if not callable(make):
            raise ZooInputError("data.target", self.target, "names something that cannot be called")
        try:
            out = make(**self.kwargs)
        except ZooInputError:
            raise
        except Exception as err:  # noqa: BLE001 - the user's code: named with its exception, not a traceback
            raise ZooInputError("data.target", self.target, f"the call {self.target}(**data.kwargs) raised "
                                f"{describe_failure(err)}; fix it there (or data.kwargs: {self.kwargs})") from None
        if out is None:
            raise ZooInputError("data.target", self.target, "returned None; return (train, test), "
                                "{'train': ..., 'test': ...} or the training rows alone")
        train, test = split_returned(out)
        return dataset_from(train, test, task=self.task, name=self.target.rpartition(":")[2])


def split_returned(out: Any) -> tuple[Any, Any]:
    """(train, test) from what a data callable returned: a dict ``{"train": ..., "test": ...}``, a pair
    ``(train, test)``, or the training rows alone (a pair of arrays ``(x, y)`` is the training rows).

    :param out: the callable's return value.
    :returns: the training rows and the test rows (None where it gave none).
    """
    if isinstance(out, dict):
        if "train" not in out:
            raise ZooInputError("data.target", sorted(out), "a dict of data needs 'train' (and may have 'test')")
        unread = sorted(str(k) for k in out if k not in ("train", "test"))
        if unread:
            raise ZooInputError("data.target", sorted(str(k) for k in out), f"a dict of data has 'train' and "
                                f"'test' only; {', '.join(map(repr, unread))} would not be read: merge those rows "
                                "into train or test, or leave them out")
        return out["train"], out.get("test")
    if isinstance(out, tuple | list) and len(out) == 2 and not isinstance(out[0], torch.Tensor | np.ndarray):
        return out[0], out[1]
    if isinstance(out, tuple | list) and len(out) != 2:
        raise ZooInputError("data.target", f"{type(out).__name__} of {len(out)} items", "return (train, test), "
                            "{'train': ..., 'test': ...} or the training rows alone ((x, y), a torch Dataset or a "
                            "DataLoader); a third set (e.g. validation rows) is not read: merge it into train or "
                            "leave it out")
    return out, None
