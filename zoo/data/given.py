"""Data given in Python: tensors or arrays ``(x, y)``, a map-style torch ``Dataset`` or a ``DataLoader``, turned into
the zoo's :class:`~zoo.data.base.Dataset` as the user gave them (no standardisation: the user's net reads its own
inputs), checked for what would otherwise fail deep inside a fit."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, PrivateAttr
from torch.utils.data import IterableDataset

from zoo.data.base import LABELLED, DataSection, Dataset, tensor_batches
from zoo.errors import ZooInputError

# What the Python API takes as rows, for its signatures (each function's docstring says what it accepts in full):
ArrayLike = torch.Tensor | np.ndarray | list  # a tensor, a numpy array, or nested lists of numbers
Rows = tuple[ArrayLike, ArrayLike] | torch.utils.data.Dataset | Iterable[tuple[Any, Any]]  # (x, y); a Dataset; a
# DataLoader (any iterable of (x, y) batches)

GIVEN_FILE = "data.pt"  # what a run of data given in Python keeps of it: task, classes, two example training rows
EXAMPLE_ROWS = 2


def _tensor(value: Any, what: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.is_meta:
            raise ZooInputError(what, "a tensor on the meta device", "it has a shape but no values: give the rows "
                                "themselves (e.g. on cpu)")
        return value.detach()
    if hasattr(value, "to_numpy") and not isinstance(value, np.ndarray):  # a pandas DataFrame or Series
        raise ZooInputError(what, type(value).__name__, "give a torch.Tensor or a numpy array: pass "
                            "frame.to_numpy(dtype='float32') (and series.to_numpy() for targets)")
    if isinstance(value, np.ndarray):
        try:
            return torch.from_numpy(value)
        except TypeError:
            raise ZooInputError(what, f"a numpy array of {value.dtype}", "give numbers: encode strings or objects "
                                "as integer labels or floats first (e.g. sklearn's LabelEncoder)") from None
    raise ZooInputError(what, type(value).__name__, "give a torch.Tensor or a numpy array")


def _rows(source: Any, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` of every row of ``source``: a pair of tensors/arrays, a map-style ``Dataset`` of ``(x, y)`` items,
    or an iterable of ``(x, y)`` batches (a ``DataLoader``)."""
    from torch.utils.data import DataLoader
    from torch.utils.data import Dataset as TorchDataset

    if isinstance(source, tuple | list) and len(source) == 2 and not isinstance(source[0], tuple | list):
        return _tensor(source[0], f"{what} inputs"), _tensor(source[1], f"{what} targets")
    if isinstance(source, tuple) and source and all(isinstance(v, torch.Tensor | np.ndarray) for v in source):
        raise ZooInputError(what, f"a tuple of {len(source)} arrays", "give (inputs, targets): two arrays, or a "
                            "DataLoader of (inputs, targets) batches")
    if isinstance(source, TorchDataset) and not isinstance(source, torch.utils.data.IterableDataset):
        source = DataLoader(source, batch_size=256, shuffle=False)
    if not isinstance(source, Iterable):
        raise ZooInputError(what, type(source).__name__, "give (x, y) tensors, a torch Dataset of (x, y) items or a "
                            "DataLoader of (x, y) batches")
    xs, ys = [], []
    for k, batch in enumerate(source):
        if not isinstance(batch, tuple | list) or len(batch) != 2:
            raise ZooInputError(what, f"batch {k}: {type(batch).__name__}", "each item or batch must be a pair "
                                "(inputs, targets)")
        xs.append(_tensor(batch[0], f"{what} inputs"))
        ys.append(_tensor(batch[1], f"{what} targets"))
    if not xs:
        raise ZooInputError(what, "no rows", "give at least one row")
    try:
        return torch.cat(xs), torch.cat(ys)
    except RuntimeError as err:
        raise ZooInputError(what, "batches of different shapes", f"every batch's inputs (and targets) must have the "
                            f"same shape after the row dimension: {err}") from None


def task_of_targets(y: torch.Tensor) -> str:
    """The task targets imply: integer (or boolean) labels are classes, floating-point values a regression.

    :param y: the targets.
    :returns: ``classification`` or ``regression``.
    """
    return "regression" if y.is_floating_point() else "classification"


def _targets(y: torch.Tensor, task: str, what: str) -> torch.Tensor:
    if y.dim() == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.dim() != 1:
        raise ZooInputError(f"{what} targets", f"shape {tuple(y.shape)}", "give one target per row: shape [N] (or "
                            "[N, 1])")
    if not LABELLED[task] and y.is_floating_point() and len(y):
        _check_target_scale(y, what)
    if LABELLED[task]:
        if y.is_floating_point() and not bool((y == y.round()).all()):
            raise ZooInputError(f"{what} targets", "non-integer values", "classification labels are the integers "
                                "0 .. classes - 1")
        return y.long()
    return y.to(torch.float32) if not y.is_floating_point() else y


TARGET_LIMIT = 1e18  # |y| above it: a Gaussian likelihood's squared error overflows float32 (above 3.4e38)


def _check_target_scale(y: torch.Tensor, what: str) -> None:
    """Refuse regression targets whose squares overflow float32 (data given in Python are not standardised): the fit
    would stop at step 0 on a non-finite ELBO and blame the learning rate."""
    finite = y[torch.isfinite(y)]
    top = float(finite.abs().max()) if len(finite) else 0.0
    if top > TARGET_LIMIT:
        raise ZooInputError(f"{what} targets", f"values up to {top:.3g}", f"a Gaussian likelihood squares the "
                            f"residuals, and above {TARGET_LIMIT:.0e} they overflow float32: rescale the targets (e.g. "
                            "y / y.abs().max(), or their logarithm) and scale the predictions back")


def _streamed(loader: Any, task: str | None, n_classes: int | None) -> dict[str, Any]:
    """One pass over a loader of training batches, keeping nothing but two example rows: the rows' count, the
    batches per pass, the task and classes, every batch checked as :func:`dataset_from` checks tensors."""
    count, batches, examples, shape, top, low = 0, 0, None, None, -1, 0
    for k, batch in enumerate(tensor_batches(loader) or loader):  # a TensorDataset's batches read at once
        if not isinstance(batch, tuple | list) or len(batch) != 2:
            raise ZooInputError("training data", f"batch {k}: {type(batch).__name__}", "each batch must be a pair "
                                "(inputs, targets)")
        x, y = _tensor(batch[0], "training data inputs"), _tensor(batch[1], "training data targets")
        task = task or task_of_targets(y)
        if task not in LABELLED:
            raise ZooInputError("task", task, f"use one of: {', '.join(LABELLED)}")
        y = _targets(y, task, f"training data batch {k}")
        if x.dim() < 2:
            raise ZooInputError(f"training data batch {k} inputs", f"shape {tuple(x.shape)}", "give rows of "
                                "features: shape [B, features] (x[:, None] for one feature per row)")
        if len(x) != len(y):
            raise ZooInputError(f"training data batch {k}", f"{len(x)} input rows, {len(y)} targets",
                                "give one target per input row")
        if shape is not None and (tuple(x.shape[1:]) != shape[0] or x.dtype != shape[1]):
            raise ZooInputError(f"training data batch {k}", f"inputs {tuple(x.shape[1:])} of {x.dtype}",
                                f"every batch's rows must be alike: the first batch's are {shape[0]} of {shape[1]}")
        shape = (tuple(x.shape[1:]), x.dtype)
        if x.is_floating_point() and not bool(torch.isfinite(x).all()):
            raise ZooInputError(f"training data batch {k}", "NaN/inf inputs", "clean or drop those rows")
        if not LABELLED[task] and not bool(torch.isfinite(y).all()):
            raise ZooInputError(f"training data batch {k}", "NaN/inf targets", "clean or drop those rows")
        if LABELLED[task] and len(y):
            top, low = max(top, int(y.max())), min(low, int(y.min()))
        if examples is None:
            examples = (x[:EXAMPLE_ROWS].clone(), y[:EXAMPLE_ROWS].clone())
        count, batches = count + len(x), batches + 1
    if examples is None or count == 0:
        raise ZooInputError("training data", "no rows", "the loader gave no batch: give at least one row")
    if LABELLED[task]:
        n_classes = n_classes or top + 1
        if low < 0 or top >= n_classes:
            raise ZooInputError("targets", f"labels {low} .. {top}", f"classification labels are 0 .. {n_classes - 1} "
                                f"({n_classes} classes)")
    return {"task": task, "n_classes": n_classes if LABELLED[task] else None, "rows": count, "batches": batches,
            "examples": examples}


def _checked(x: torch.Tensor, y: torch.Tensor, task: str, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` paired row for row, finite, with targets of the task's kind (:func:`_targets`)."""
    if x.dim() < 2:
        raise ZooInputError(f"{what} inputs", f"shape {tuple(x.shape)}", "give rows of features: shape [N, features] "
                            "(x[:, None] for one feature per row)")
    if len(x) != len(y):
        raise ZooInputError(what, f"{len(x)} input rows, {len(y)} targets", "give one target per input row")
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        row = int((~torch.isfinite(x.reshape(len(x), -1))).any(1).nonzero()[0])
        raise ZooInputError(f"{what} inputs", f"NaN/inf values (first at row {row})", "clean or drop those rows")
    y = _targets(y, task, what)
    if not LABELLED[task] and not bool(torch.isfinite(y).all()):
        raise ZooInputError(f"{what} targets", "NaN/inf values", "clean or drop those rows")
    return x, y


def as_training_rows(x: torch.Tensor, x_train: torch.Tensor, what: str) -> torch.Tensor:
    """Rows of the training rows' shape after the row dimension (the net reads nothing else), in their dtype.

    :param x: the rows ``[N, ...]``.
    :param x_train: the training rows (or the two a streamed data set keeps).
    :param what: what the rows are called in messages.
    :returns: ``x`` in the training rows' floating-point dtype (integer rows as they are).
    :raises ZooInputError: a single row without its batch dimension, rows of another shape, floating-point rows for
        a net of integer inputs.
    """
    if tuple(x.shape) == tuple(x_train.shape[1:]):
        raise ZooInputError(f"{what} inputs", f"one row of shape {tuple(x.shape)}", "give a batch of rows: x[None] "
                            "for a single row")
    if tuple(x.shape[1:]) != tuple(x_train.shape[1:]):
        raise ZooInputError(f"{what} inputs", f"rows of shape {tuple(x.shape[1:])}", f"the training rows are "
                            f"{tuple(x_train.shape[1:])}: give rows of the same shape (the net reads nothing else)")
    if x_train.is_floating_point():
        return x.to(x_train.dtype)
    if x.is_floating_point():
        raise ZooInputError(f"{what} inputs", str(x.dtype), f"the training inputs are {x_train.dtype} (e.g. token "
                            "ids): give rows of that dtype")
    return x


def predict_rows(x: ArrayLike) -> torch.Tensor:
    """The rows given to ``BNN.predict`` as a tensor: a tensor, a numpy array or nested lists of numbers.

    :param x: the rows.
    :returns: them as a tensor.
    :raises ZooInputError: a pandas frame (its ``to_numpy`` named), objects or strings, a meta tensor.
    """
    if isinstance(x, torch.Tensor | np.ndarray) or hasattr(x, "to_numpy"):
        return _tensor(x, "predict x")
    try:
        return torch.as_tensor(x)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ZooInputError("predict x", type(x).__name__, f"give a torch.Tensor or a numpy array of rows ({err})") \
            from None


def _check_labels(y: torch.Tensor, n_classes: int, what: str) -> None:
    if len(y) and (int(y.min()) < 0 or int(y.max()) >= n_classes):
        raise ZooInputError("targets", f"{what} labels {int(y.min())} .. {int(y.max())}",
                            f"classification labels are 0 .. {n_classes - 1} ({n_classes} classes)")


def _no_rows(source: Any, what: str) -> None:
    """Refuse a torch ``Dataset`` of no items before a loader is made of it (torch's own message names a sampler).
    A ``DataLoader`` of an ``IterableDataset`` without ``__len__`` has no length to ask: its one counting pass tells."""
    if not hasattr(source, "__len__") or isinstance(source, tuple | list):
        return
    try:
        empty = len(source) == 0
    except TypeError:  # DataLoader.__len__ of an IterableDataset that has none
        return
    if empty:
        raise ZooInputError(what, f"an empty {type(source).__name__}", "give at least one row")


def evaluation_rows(source: Any, fitted: Dataset, what: str = "evaluation data") -> tuple[torch.Tensor, torch.Tensor]:
    """Every row of ``source`` (a pair of tensors or arrays, a torch ``Dataset`` or a ``DataLoader``; read whole,
    never streamed), checked against the data a fit was made on: the same row shape and input dtype, targets of its
    task, labels among its classes.

    :param source: the rows.
    :param fitted: the data set the posterior was fitted on (its training rows may be two stand-in rows).
    :param what: what the rows are called in messages.
    :returns: inputs ``[N, ...]`` and targets ``[N]``.
    :raises ZooInputError: no rows, rows of another shape, non-finite values, labels outside the classes.
    """
    _no_rows(source, what)
    x, y = _checked(*_rows(source, what), fitted.task, what)
    if not len(x):
        raise ZooInputError(what, "no rows", "give at least one row")
    x = as_training_rows(x, fitted.x_train, what)
    if LABELLED[fitted.task]:
        _check_labels(y, fitted.n_classes, what)
    return x, y


def dataset_from(train: Any, test: Any = None, *, task: str | None = None, n_classes: int | None = None,
                 name: str = "given", batch_size: int = 128, test_name: str = "test data") -> Dataset:
    """The zoo's :class:`~zoo.data.base.Dataset` of data given in Python, as given (no standardisation).

    Training rows from a ``DataLoader`` (or a map-style torch ``Dataset``, which gets a shuffling loader of its own)
    are streamed: one pass counts and checks them before any fit, and fits read them batch by batch, so the whole
    training set is never in memory; the likelihood is scaled to the data set's rows, not to a batch's. Test rows are
    read whole, whatever their form.

    :param train: the training rows: ``(x, y)`` tensors or arrays, a map-style torch ``Dataset`` of ``(x, y)`` items,
        or a ``DataLoader`` of ``(x, y)`` batches.
    :param test: the test rows, in the same forms (None: none, so a fit can be scored only on rows passed later).
    :param task: ``regression`` or ``classification``; None: integer targets are classes, floating-point ones a
        regression.
    :param n_classes: the classes of a classification (None: the largest label + 1).
    :param name: what the data set is called in logs and reports.
    :param batch_size: the batch size of the loader a torch ``Dataset`` of training rows gets.
    :param test_name: what the test rows are called in messages (``fit(val=...)``: ``val``).
    :returns: the data set.
    :raises ZooInputError: no training rows, rows and targets that do not pair up, test rows of another shape than
        the training rows, targets of the wrong shape or kind, non-finite values, labels outside the classes.
    """
    from torch.utils.data import DataLoader
    from torch.utils.data import Dataset as TorchDataset

    _no_rows(train, "training data")
    if isinstance(train, TorchDataset):
        train = DataLoader(train, batch_size=batch_size, shuffle=not isinstance(train, IterableDataset))
    streamed = _streamed(train, task, n_classes) if isinstance(train, DataLoader) else None
    if streamed is not None:
        task, n_classes = streamed["task"], streamed["n_classes"]
        x_train, y_train = streamed["examples"]
    else:
        x_train, y_train = _rows(train, "training data")
        if not len(x_train):
            raise ZooInputError("training data", "no rows", "give at least one row")
        task = task or task_of_targets(y_train)
        if task not in LABELLED:
            raise ZooInputError("task", task, f"use one of: {', '.join(LABELLED)}")
        x_train, y_train = _checked(x_train, y_train, task, "training data")
    if test is not None:
        _no_rows(test, test_name)
        x_test, y_test = _checked(*_rows(test, test_name), task, test_name)
        x_test = as_training_rows(x_test, x_train, test_name)
    else:
        x_test, y_test = x_train[:0], y_train[:0]
    if LABELLED[task]:
        if streamed is None:
            n_classes = n_classes or int(torch.cat([y_train, y_test]).max()) + 1
            if n_classes < 2:
                raise ZooInputError("targets", f"{n_classes} class", "a classification needs labels of at least two "
                                    "classes; floating-point targets are a regression")
            _check_labels(y_train, n_classes, "training")
        _check_labels(y_test, n_classes, test_name)
    else:
        n_classes = None
    if streamed is None:
        return Dataset(name, task, x_train, y_train, x_test, y_test, n_classes=n_classes)
    return Dataset(name, task, x_train, y_train, x_test, y_test, n_classes=n_classes, train_loader=train,
                   streamed_rows=streamed["rows"], streamed_batches=streamed["batches"])


class GivenData(DataSection):
    """Data given in Python to zoo.BNN(...).fit: tensors, a torch Dataset or a DataLoader."""

    catalogue = {"given": "data given in Python to zoo.BNN(...).fit: (x, y) tensors, a torch Dataset or a "
                          "DataLoader"}
    offered: ClassVar[bool] = False  # the zoo writes it (a run's spec.yaml); a spec names data otherwise

    name: Literal["given"] = Field(description="given")
    task: Literal["regression", "classification"] | None = Field(
        None, description="regression or classification (integer targets are classes); set when data are given")
    n_classes: int | None = Field(None, gt=1, description="classification: the number of classes")
    _dataset: Dataset | None = PrivateAttr(None)

    @classmethod
    def of(cls, data: Dataset) -> GivenData:
        """The section of a data set given in Python, holding it.

        :param data: the data set.
        :returns: the section.
        """
        section = cls(name="given", task=data.task, n_classes=data.n_classes)
        section._dataset = data
        return section

    def brings_calibration_rows(self) -> bool | None:
        """Whether the rows given hold calibration rows (``fit(val=...)``'s).

        :returns: True or False; None before the rows are given.
        """
        return None if self._dataset is None else self._dataset.x_calibration is not None

    def load(self, seed: int) -> Dataset:
        if self._dataset is None:
            raise ZooInputError("data.name", "given", "this run's data were given in Python, not named by the spec: "
                                "load the run with zoo.load(run_dir) and score it with .evaluate(x, y)")
        return self._dataset

    def holding(self, data: Dataset) -> GivenData:
        """This section with ``data`` attached (a run's stand-in rows, read back).

        :param data: the data set.
        :returns: the section itself.
        """
        self._dataset = data
        return self


def stand_in(data: Dataset) -> dict[str, Any]:
    """What a run keeps of data given in Python (:data:`GIVEN_FILE`): enough to rebuild its model, not the data.

    :param data: the data set the run was fitted on.
    :returns: its task, classes, size, target scale, two example training rows and the digests of all its rows
        (:meth:`~zoo.data.base.Dataset.digests`: what tells a comparison, or a resumed reference, the data apart).
    """
    return {"name": data.name, "task": data.task, "n_classes": data.n_classes, "n_train": data.n_train,
            "y_mean": data.y_mean, "y_std": data.y_std, "x": data.x_train[:EXAMPLE_ROWS].cpu(),
            "y": data.y_train[:EXAMPLE_ROWS].cpu(), "digests": data.digests()}


def from_stand_in(saved: dict[str, Any]) -> Dataset:
    """The data set a run of data given in Python rebuilds its model on: its two example rows, no test rows.

    :param saved: what :func:`stand_in` kept.
    :returns: the data set.
    """
    x, y = saved["x"], saved["y"]
    return Dataset(saved["name"], saved["task"], x, y, x[:0], y[:0], n_classes=saved["n_classes"],
                   y_mean=saved["y_mean"], y_std=saved["y_std"], fingerprint=saved.get("digests"))
