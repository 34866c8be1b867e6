"""What every loader shares: the Dataset it returns (standardised tensors plus what is needed to report in original
units), the :class:`Loader` it registers as, and the helpers several loaders use (test share, held-out classes,
the validation carve)."""

from __future__ import annotations

import dataclasses
import hashlib
from abc import abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field

from zoo.errors import ZooInputError
from zoo.parts import Strict

Task = Literal["regression", "classification"]
# Whether a task's targets are class labels (the others are real values, standardised with the training statistics):
# all the data layer knows of tasks; everything else a task does is its object in zoo.tasks
LABELLED: dict[str, bool] = {"regression": False, "classification": True}


def rows_digest(*tensors: torch.Tensor) -> str:
    """A SHA-256 over the shapes and values of ``tensors`` (floats as float64, integers as int64), on the host.

    :param tensors: the tensors, in order.
    :returns: the hex digest.
    """
    digest = hashlib.sha256()
    for t in tensors:
        t = t.detach().cpu()
        t = t.double() if t.is_floating_point() else t.long()
        digest.update(str(tuple(t.shape)).encode())
        digest.update(t.contiguous().numpy().tobytes())
    return digest.hexdigest()


@dataclass
class Dataset:
    """Train/test tensors, standardised with training statistics.

    Inputs are float32 ``[N, D]``. Regression targets are float32 ``[N]`` in standardised units
    (``y_mean``/``y_std`` map them back); classification targets are int64 ``[N]`` in ``0..n_classes-1``.
    ``x_ood`` holds out-of-distribution input sets (standardised like ``x_train``) by name.

    :param name: the data set's name, as reports show it.
    :param task: ``regression`` or ``classification``.
    :param x_train: training inputs ``[N, D]``, standardised.
    :param y_train: training targets ``[N]``: standardised values, or class labels.
    :param x_test: test inputs ``[M, D]``, standardised like ``x_train``.
    :param y_test: test targets ``[M]``, like ``y_train``.
    :param n_classes: classes of a classification set; None for regression.
    :param y_mean: the training targets' mean in original units (regression).
    :param y_std: the training targets' standard deviation in original units (regression).
    :param x_ood: out-of-distribution input sets ``{name: [K, D]}``, standardised like ``x_train``.
    :param class_names: a name for each class, where the set has them.
    :param x_mean: the training inputs' per-column mean ``[D]`` in original units.
    :param x_std: the training inputs' per-column standard deviation ``[D]`` (1 for a constant column).
    :param training_rows_on_host: the training rows stay in host memory (too large for the GPU); set by :meth:`to`.
    :param image_shape: image sets: ``(C, H, W)`` of a row, channel-major; None for a table.
    :param pixel_max: image sets: the raw value of a full-intensity pixel (the rows' range is ``0..pixel_max``).
    :param x_calibration: rows held out of training for post-hoc calibration (standardised); None without.
    :param y_calibration: their targets, like ``y_train``.
    :param train_loader: where the training rows are streamed from, batch by batch (a ``DataLoader`` of ``(x, y)``
        batches); ``x_train``, ``y_train`` then hold a few example rows only, and nothing holds all the rows.
    :param streamed_rows: the streamed training rows' count (what the likelihood is scaled to).
    :param streamed_batches: the loader's batches per pass.
    :param dtype: the floating dtype the model computes in (the rows' own; streamed rows are cast to it per batch).
    :param fingerprint: a run's stand-in rows: the digests of the rows they stand in for (:meth:`digests`).
    """

    name: str
    task: Task
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    n_classes: int | None = None
    y_mean: float = 0.0
    y_std: float = 1.0
    x_ood: dict[str, torch.Tensor] = field(default_factory=dict)
    class_names: list[str] | None = None
    x_mean: torch.Tensor | None = None
    x_std: torch.Tensor | None = None
    training_rows_on_host: bool = False  # set by to(): the training rows stay in host memory (too large for the GPU)
    dtype: torch.dtype = torch.float32  # set by to(): the run's floating-point type (inputs may be integers: tokens)
    image_shape: tuple[int, int, int] | None = None  # image sets: (C, H, W) of a row, channel-major; None: a table
    pixel_max: float = 255.0  # image sets: the raw value of a full-intensity pixel (the rows' range is 0..pixel_max)
    x_calibration: torch.Tensor | None = None  # rows held out of training for post-hoc calibration (standardised)
    y_calibration: torch.Tensor | None = None
    train_loader: Any = None  # streamed training rows (a DataLoader of (x, y) batches); x_train holds examples then
    streamed_rows: int | None = None
    streamed_batches: int | None = None
    fingerprint: dict[str, str] | None = None  # a stand-in's: the digests of the rows it stands in for (digests())

    @property
    def in_dim(self) -> int:
        """Number of input features."""
        return int(self.x_train.shape[1])

    @property
    def out_dim(self) -> int:
        """Width of the net's output layer: classes for classification, 1 for regression."""
        return int(self.n_classes) if LABELLED[self.task] else 1

    def digests(self) -> dict[str, str]:
        """Digests of the rows, to tell whether two fits saw the same data: ``train`` (the training rows; their
        count for rows streamed from a loader) and ``test`` (the evaluation rows), each a SHA-256 over the rows'
        values (floats as float64, so a float32 copy of the same rows digests alike). A run's stand-in of data given
        in Python (:func:`zoo.data.given.stand_in`) gives those of the rows it stands in for.

        :returns: ``{"train": hex, "test": hex}``.
        """
        if self.fingerprint is not None:
            return dict(self.fingerprint)
        train = f"streamed {self.n_train} rows" if self.streamed else rows_digest(self.x_train, self.y_train)
        return {"train": train, "test": rows_digest(self.x_test, self.y_test)}

    def training_bytes(self, dtype: torch.dtype) -> int:
        """The training rows' size in memory once their floating-point tensors are ``dtype``.

        :param dtype: the floating-point type the inputs (and regression targets) would have.
        :returns: bytes of ``x_train`` and ``y_train``.
        """
        return sum(t.numel() * (dtype.itemsize if t.is_floating_point() else t.element_size())
                   for t in (self.x_train, self.y_train))

    @property
    def n_train(self) -> int:
        """Number of training examples (the full-data size that minibatch likelihoods are scaled to)."""
        return self.streamed_rows if self.streamed else int(self.x_train.shape[0])

    @property
    def streamed(self) -> bool:
        """Whether the training rows come from a loader, batch by batch (none held in memory)."""
        return self.train_loader is not None

    def epoch_batches(self, seed: int, skip: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One pass over the streamed training rows, as the loader gives them (on the host), repeatable exactly: a
        shuffling loader's order is drawn from ``seed`` (its sampler's generator is set to it), and every draw the
        loader makes from torch's global generator (its workers' seeds, an augmentation run in this process) comes
        from a stream of its own seeded by ``seed``, so loading neither moves the model's random state nor depends
        on it, and a pass resumed part-way gives the batches the whole pass would have given. A loader over a
        ``TensorDataset`` with the default collation is read a batch at a time (:func:`tensor_batches`).

        :param seed: seeds this pass's order and the loader's own random stream.
        :param skip: batches of the pass to leave out at its start (a run resumed within an epoch).
        :returns: the ``(x, y)`` batches.
        """
        sampler = getattr(self.train_loader, "sampler", None)
        if isinstance(sampler, torch.utils.data.RandomSampler):
            sampler.generator = torch.Generator().manual_seed(seed)
        loader_state = torch.Generator().manual_seed(seed + 1).get_state()

        def on_loader_stream(fetch: Callable[[], Any]) -> Any:
            nonlocal loader_state
            model_state = torch.get_rng_state()
            torch.set_rng_state(loader_state)
            try:
                return fetch()
            finally:
                loader_state = torch.get_rng_state()
                torch.set_rng_state(model_state)

        batches = on_loader_stream(lambda: iter(tensor_batches(self.train_loader) or self.train_loader))
        for _ in range(skip):
            on_loader_stream(lambda: next(batches))
        while True:
            try:
                x, y = on_loader_stream(lambda: next(batches))
            except StopIteration:
                return
            yield x, y.reshape(-1) if y.dim() == 2 and y.shape[1] == 1 else y

    def train_chunks(self, size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Every training row once, in chunks of at most ``size`` rows on the device (from the loader, in its own
        order, where the rows are streamed).

        :param size: rows per chunk.
        :returns: the ``(x, y)`` chunks.
        """
        if not self.streamed:
            yield from zip(self.x_train.split(size), self.y_train.split(size), strict=True)
            return
        for x, y in self.epoch_batches(0):
            for xc, yc in zip(x.split(size), y.split(size), strict=True):
                yield (xc.to(self.device, self.dtype if xc.is_floating_point() else xc.dtype),
                       yc.to(self.device, self.dtype if yc.is_floating_point() else yc.dtype))

    def materialised(self) -> Dataset:
        """The data set with every streamed training row read into memory (for a method that needs every row at each
        step); itself where nothing is streamed.

        :returns: the data set.
        """
        if not self.streamed:
            return self
        rows = list(self.train_chunks(4096))
        return dataclasses.replace(self, x_train=torch.cat([r[0] for r in rows]),
                                   y_train=torch.cat([r[1] for r in rows]), train_loader=None, streamed_rows=None,
                                   streamed_batches=None)

    @property
    def device(self) -> torch.device:
        """Where the model computes: the test rows' device (the training rows may stay in host memory, see
        :meth:`to`)."""
        return self.x_test.device

    def to(self, device: torch.device | str, dtype: torch.dtype = torch.float32,
           training_rows_on_host: bool = False) -> Dataset:
        """Move every tensor to ``device``; inputs (and regression targets) become ``dtype``. With
        ``training_rows_on_host`` the training rows stay in host memory (pinned when CUDA is present), for a data
        set too large for the device: SVI then moves each minibatch to the device as it steps.

        :param device: where the tensors go.
        :param dtype: the floating-point type of inputs, regression targets and calibration rows (labels keep
            theirs).
        :param training_rows_on_host: keep the training rows in host memory.
        :returns: a new data set; this one is unchanged.
        """

        def move(t: torch.Tensor, where: torch.device | str = device) -> torch.Tensor:
            return t.to(device=where, dtype=dtype if t.is_floating_point() else t.dtype)

        def host(t: torch.Tensor) -> torch.Tensor:
            t = move(t, "cpu")
            return t.pin_memory() if torch.cuda.is_available() else t

        train = host if training_rows_on_host else move
        return dataclasses.replace(
            self, x_train=train(self.x_train), y_train=train(self.y_train), x_test=move(self.x_test),
            y_test=move(self.y_test), x_ood={k: move(v) for k, v in self.x_ood.items()},
            training_rows_on_host=training_rows_on_host, dtype=dtype,
            x_calibration=None if self.x_calibration is None else move(self.x_calibration),
            y_calibration=None if self.y_calibration is None else move(self.y_calibration),
        )

    def inputs_in_original_units(self, x: torch.Tensor) -> torch.Tensor:
        """Undo the input standardisation (for plots against the raw input axis); inputs the zoo did not
        standardise (data given in Python) are returned as they are.

        :param x: standardised inputs ``[B, D]``.
        :returns: the inputs in original units ``[B, D]``.
        """
        if self.x_mean is None or self.x_std is None:
            return x
        return x * self.x_std.to(x) + self.x_mean.to(x)


def check_finite(array: np.ndarray, what: str) -> None:
    """Refuse arrays with NaN or inf, naming the first offending row.

    :param array: the values.
    :param what: what they are, for the message (e.g. ``"iris training inputs"``).
    :raises ZooInputError: when any value is NaN or infinite.
    """
    bad = ~np.isfinite(array)
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        raise ZooInputError(what, f"{int(bad.sum())} NaN/inf values (first at row {row})",
                            "clean or drop those rows before training")


# Data are standardised in float64, but the Dataset keeps inputs, targets and their statistics in float32, and
# predictions go back to original units as z * std + mean in float32 (largest 3.4e38). A column whose training
# mean or standard deviation exceeds FLOAT32_MAX / 1e6 (~3.4e32) is refused: that keeps 6 orders of magnitude of
# headroom for predictions (and test rows) far outside the training range.
FLOAT32_MAX = float(np.finfo(np.float32).max)
STAT_LIMIT = FLOAT32_MAX / 1e6


def _rescale_hint(magnitude: float) -> str:
    if not np.isfinite(magnitude):
        return "rescale or drop it"
    return f"rescale it (e.g. divide it by 1e{int(np.floor(np.log10(magnitude)))}) or drop it"


def training_stats(values: np.ndarray, labels: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per-column mean and standard deviation of training ``values`` ([N, D] or [N]) in float64, refusing a
    column (named by ``labels``) whose statistics overflow or do not fit float32 with headroom (``STAT_LIMIT``).

    :param values: training values ``[N, D]`` or ``[N]``.
    :param labels: a name for each column, for the message.
    :returns: the mean and the standard deviation, ``[D]`` each (scalars for ``[N]``).
    :raises ZooInputError: a column whose statistics are not finite or exceed ``STAT_LIMIT``.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        mean, std = values.mean(0), values.std(0)
    ok = np.isfinite(mean) & np.isfinite(std) & (np.abs(mean) <= STAT_LIMIT) & (std <= STAT_LIMIT)
    if not np.all(ok):
        j = int(np.argmin(np.atleast_1d(ok)))
        column = values[:, j] if values.ndim == 2 else values
        magnitude = float(np.abs(column).max())
        m, s = float(np.atleast_1d(mean)[j]), float(np.atleast_1d(std)[j])
        state = "overflow float64" if not (np.isfinite(m) and np.isfinite(s)) else f"exceed {STAT_LIMIT:.2g}"
        raise ZooInputError(labels[j], f"values up to {magnitude:.3g} in magnitude",
                            f"their training mean/standard deviation ({m:.3g}/{s:.3g}) {state}, and the zoo keeps "
                            f"data, statistics and predictions in float32 (largest {FLOAT32_MAX:.2g}, kept "
                            f"1e6 below it): {_rescale_hint(magnitude)}")
    return mean, std


def _standardised(values: np.ndarray, mean: np.ndarray | float, std: np.ndarray | float, labels: list[str],
                  split: str) -> torch.Tensor:
    """(values - mean) / std as float32, refusing a value whose standardised form is not finite in float32
    (``labels`` name the columns, ``split`` the rows, e.g. 'test')."""
    with np.errstate(over="ignore", invalid="ignore"):
        z64 = (values - mean) / std
        z = z64.astype(np.float32)
    bad = ~np.isfinite(z)
    if bad.any():
        v2, z2 = values.reshape(len(values), -1), z64.reshape(len(values), -1)
        row, j = (int(i) for i in np.argwhere(bad.reshape(len(values), -1))[0])
        m, s = (float(np.broadcast_to(a, v2.shape[1:])[j]) for a in (mean, std))
        raw, big = float(v2[row, j]), float(z2[row, j])
        raise ZooInputError(labels[j], f"{raw:.3g} in {split} row {row + 1}",
                            f"standardised with the training mean {m:.3g} and standard deviation {s:.3g} it is "
                            f"{big:.3g}, beyond float32's range ({FLOAT32_MAX:.2g}): {_rescale_hint(abs(raw))}")
    return torch.as_tensor(z, dtype=torch.float32)


def _integer_labels(y: np.ndarray, what: str) -> np.ndarray:
    """Class labels as int64, refusing non-integer numbers (which a cast would silently truncate)."""
    y = np.asarray(y)
    if y.dtype.kind == "f":
        frac = ~np.isfinite(y) | (y != np.round(y))
        if frac.any():
            row = int(np.argmax(frac))
            raise ZooInputError(what, f"{y[row]!r} in row {row + 1}", "class labels must be whole numbers "
                                "0..C-1; a continuous target is a regression task")
    elif y.dtype.kind not in "biu":
        raise ZooInputError(what, f"dtype {y.dtype}", "class labels must be whole numbers 0..C-1")
    return y.astype(np.int64).reshape(-1)


def make_dataset(
    name: str,
    task: Task,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    x_ood: dict[str, np.ndarray] | None = None,
    n_classes: int | None = None,
    class_names: list[str] | None = None,
    feature_names: list[str] | None = None,
    target_name: str | None = None,
    image_shape: tuple[int, int, int] | None = None,
    pixel_max: float = 255.0,
) -> Dataset:
    """Validate raw arrays and standardise them with training statistics into a :class:`Dataset`.

    ``feature_names``/``target_name`` (e.g. a table's columns) name the offender in errors; a column whose
    statistics or standardised values do not fit float32 is refused (see ``STAT_LIMIT``). Image sets give
    ``image_shape`` (C, H, W) and ``pixel_max``, which image shifts (:mod:`zoo.data.corruptions`) need.

    :param name: the data set's name.
    :param task: ``regression`` or ``classification``.
    :param x_train: training inputs ``[N, D]`` in original units.
    :param y_train: training targets ``[N]``: real values, or whole-number class labels.
    :param x_test: test inputs ``[M, D]``.
    :param y_test: test targets ``[M]``.
    :param x_ood: out-of-distribution input sets ``{name: [K, D]}``.
    :param n_classes: classes of a classification set (default: the largest label plus 1).
    :param class_names: a name for each class.
    :param feature_names: a name for each input column, for messages.
    :param target_name: the target column's name, for messages.
    :param image_shape: image sets: ``(C, H, W)`` of a row.
    :param pixel_max: image sets: the raw value of a full-intensity pixel.
    :returns: the standardised data set.
    :raises ZooInputError: inputs that are not 2-D, non-finite values, train and test columns or targets that do
        not match, fewer than 2 training rows or no test row, an unknown ``task``, labels that are not whole
        numbers in ``0..n_classes-1``, or values that do not fit float32 once standardised.
    :raises ValueError: an ``image_shape`` or ``feature_names`` that does not fit the rows.
    """
    if image_shape is not None and int(np.prod(image_shape)) != np.shape(x_train)[-1]:
        raise ValueError(f"image_shape {image_shape} holds {int(np.prod(image_shape))} values, not the "
                         f"{np.shape(x_train)[-1]} of a row")
    x_train = np.asarray(x_train, dtype=np.float64)
    x_test = np.asarray(x_test, dtype=np.float64)
    for arr, what in ((x_train, f"{name} training inputs"), (x_test, f"{name} test inputs")):
        if arr.ndim != 2:
            raise ZooInputError(what, f"shape {arr.shape}", "inputs must be a 2-D table [examples, features]")
        check_finite(arr, what)
    if x_train.shape[1] != x_test.shape[1]:
        raise ZooInputError(f"{name} inputs", f"{x_train.shape[1]} vs {x_test.shape[1]} features",
                            "train and test must have the same columns")
    if len(x_train) != len(y_train) or len(x_test) != len(y_test):
        raise ZooInputError(f"{name} targets", f"{len(y_train)}/{len(y_test)} targets for "
                            f"{len(x_train)}/{len(x_test)} inputs", "one target per input row")
    if len(x_train) < 2 or len(x_test) < 1:
        raise ZooInputError(f"{name} split", f"{len(x_train)} train / {len(x_test)} test rows",
                            "need at least 2 training rows and 1 test row")
    if feature_names is not None and len(feature_names) != x_train.shape[1]:
        raise ValueError(f"{len(feature_names)} feature names for {x_train.shape[1]} features")
    columns = [f"column {c!r}" for c in feature_names] if feature_names is not None else [
        f"{name} input feature {j}" for j in range(x_train.shape[1])]
    mean, std = training_stats(x_train, columns)
    std = np.where(std < 1e-8, 1.0, std)  # constant features (e.g. digits' blank border pixels) stay put

    def standardise(x: np.ndarray, split: str) -> torch.Tensor:
        return _standardised(x, mean, std, columns, split)

    x_stats = (torch.as_tensor(mean, dtype=torch.float32), torch.as_tensor(std, dtype=torch.float32))
    ood = {}
    for k, v in (x_ood or {}).items():
        v = np.asarray(v, dtype=np.float64)
        check_finite(v, f"{name} OOD inputs {k!r}")
        ood[k] = standardise(v, f"OOD set {k!r}")
    x_train_t, x_test_t = standardise(x_train, "training"), standardise(x_test, "test")
    if task not in LABELLED:
        raise ZooInputError("data.task", task, f"use one of: {', '.join(LABELLED)}")
    if not LABELLED[task]:
        y_train = np.asarray(y_train, dtype=np.float64).reshape(-1)
        y_test = np.asarray(y_test, dtype=np.float64).reshape(-1)
        check_finite(y_train, f"{name} training targets")
        check_finite(y_test, f"{name} test targets")
        target = f"column {target_name!r}" if target_name is not None else f"{name} targets"
        y_mean_a, y_std_a = training_stats(y_train, [target])
        y_mean, y_std = float(y_mean_a), float(y_std_a)
        y_std = y_std if y_std > 1e-12 else 1.0
        return Dataset(
            name, task, x_train_t, _standardised(y_train, y_mean, y_std, [target], "training"),
            x_test_t, _standardised(y_test, y_mean, y_std, [target], "test"),
            None, y_mean, y_std, ood, None, x_stats[0], x_stats[1],
        )
    y_train_t = torch.as_tensor(_integer_labels(y_train, f"{name} training labels"))
    y_test_t = torch.as_tensor(_integer_labels(y_test, f"{name} test labels"))
    n_classes = n_classes or int(max(y_train_t.max(), y_test_t.max())) + 1
    if y_train_t.min() < 0 or max(y_train_t.max(), y_test_t.max()) >= n_classes:
        raise ZooInputError(f"{name} labels", f"range {int(y_train_t.min())}..{int(y_train_t.max())}",
                            f"labels must be integers in 0..{n_classes - 1}")
    return Dataset(name, task, x_train_t, y_train_t, x_test_t, y_test_t,
                   n_classes, 0.0, 1.0, ood, class_names, x_stats[0], x_stats[1],
                   image_shape=tuple(image_shape) if image_shape is not None else None, pixel_max=float(pixel_max))


VALIDATION_STREAM = 7919  # mixed into the seed so the carve does not reuse any loader's own random stream


def _split_training_rows(data: Dataset, fraction: float, seed: int, stream: int, field: str,
                         what: str) -> tuple[np.ndarray, np.ndarray]:
    """Seeded indices (kept, held out) of the training rows, holding out ``fraction`` of them."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0.0 <= float(fraction) < 1.0:
        raise ZooInputError(field, fraction, f"use a number in [0, 1); 0 means no {what}")
    n = data.n_train
    n_held = max(1, int(round(float(fraction) * n)))
    if n - n_held < 2:
        raise ZooInputError(field, fraction,
                            f"only {n} training rows: {n_held} for {what} would leave fewer than 2 to train on")
    perm = np.random.default_rng(np.random.SeedSequence([int(seed), stream])).permutation(n)
    return np.sort(perm[n_held:]), np.sort(perm[:n_held])


def _raw_inputs(data: Dataset, x: torch.Tensor) -> np.ndarray:
    """Standardised inputs mapped back to raw units (float64, host)."""
    x = x.detach().cpu().to(torch.float64)
    if data.x_std is not None and data.x_mean is not None:
        x = x * data.x_std.detach().cpu().to(torch.float64) + data.x_mean.detach().cpu().to(torch.float64)
    return x.numpy()


def _raw_targets(data: Dataset, y: torch.Tensor) -> np.ndarray:
    """Targets in raw units (regression) or as class labels, on the host."""
    if LABELLED[data.task]:
        return y.detach().cpu().numpy()
    return y.detach().cpu().to(torch.float64).numpy() * data.y_std + data.y_mean


def carve_validation(data: Dataset, fraction: float, seed: int) -> Dataset:
    """Hold out a seeded ``fraction`` of the TRAINING rows as the evaluation set, for honest tuning.

    The returned Dataset's ``x_test``/``y_test`` are those validation rows; the real test split is dropped, so
    nothing tuned on it sees a test label. Inputs and targets are mapped back to raw units and standardised
    again with the statistics of the remaining training rows only (no statistic of the validation rows leaks
    into training). OOD sets are kept, re-standardised the same way. ``fraction == 0`` returns ``data`` as is.

    :param data: the loaded data set.
    :param fraction: the share of training rows to hold out, in [0, 1).
    :param seed: seeds which rows are held out.
    :returns: the data set whose test rows are the validation rows.
    :raises ZooInputError: a ``fraction`` outside [0, 1), or one that leaves fewer than 2 training rows.
    """
    if fraction == 0 and not isinstance(fraction, bool):
        return data
    keep, val = _split_training_rows(data, fraction, seed, VALIDATION_STREAM, "data.validation_fraction",
                                     "validation")
    x, y = _raw_inputs(data, data.x_train), _raw_targets(data, data.y_train)
    ood = {k: _raw_inputs(data, v) for k, v in data.x_ood.items()}
    return make_dataset(f"{data.name} (validation)", data.task, x[keep], y[keep], x[val], y[val], x_ood=ood,
                        n_classes=data.n_classes, class_names=data.class_names, image_shape=data.image_shape,
                        pixel_max=data.pixel_max)


CALIBRATION_STREAM = 7927  # the calibration rows' own seed stream, apart from the validation carve's


def hold_out_calibration(data: Dataset, fraction: float, seed: int) -> Dataset:
    """Hold a seeded ``fraction`` of the training rows out of training as calibration rows (``x_calibration``,
    ``y_calibration``), for post-hoc calibration such as temperature scaling. The test split and OOD sets stay;
    every set is standardised again with the statistics of the rows that remain for training.

    :param data: the loaded data set.
    :param fraction: the share of training rows to hold out, in [0, 1) (at least one row is held out).
    :param seed: seeds which rows are held out.
    :returns: a new data set with ``x_calibration`` and ``y_calibration`` set.
    :raises ZooInputError: a ``fraction`` outside [0, 1), or one that leaves fewer than 2 training rows.
    """
    keep, held = _split_training_rows(data, fraction, seed, CALIBRATION_STREAM, "data.calibration_fraction",
                                      "calibration rows")
    x, y = _raw_inputs(data, data.x_train), _raw_targets(data, data.y_train)
    ood = {k: _raw_inputs(data, v) for k, v in data.x_ood.items()}
    out = make_dataset(data.name, data.task, x[keep], y[keep], _raw_inputs(data, data.x_test),
                       _raw_targets(data, data.y_test), x_ood=ood, n_classes=data.n_classes,
                       class_names=data.class_names, image_shape=data.image_shape, pixel_max=data.pixel_max)
    x_cal = (torch.as_tensor(x[held]) - out.x_mean.double()) / out.x_std.double()
    out.x_calibration = x_cal.to(torch.float32)
    out.y_calibration = (torch.as_tensor(y[held]) if LABELLED[data.task]
                         else torch.as_tensor((y[held] - out.y_mean) / out.y_std, dtype=torch.float32))
    return out


# ------------------------------------------------------------------------------------------------ the section
OOD_CLASSES_DOC = "classes held out of training as an OOD set"
TEST_FRACTION_DOC = "seeded test share where no split is given"


class DataSection(Strict):
    """The spec's ``data`` section for one data set, or for a family of them named by a prefix (``uci:<folder>``,
    ``file:<path>``): the settings every data set shares (the validation and calibration carves) and its own.

    A data set is one module holding its loader and its section, registered once in :data:`zoo.data.DATA_SETS`.
    """

    catalogue: ClassVar[dict[str, str]]  # the names it serves as ``zoo list`` shows them, each with its line
    prefix: ClassVar[str | None] = None  # a prefix ending in ':' for a family of names (uci:, file:); else None

    name: str = Field(description="the data set (zoo list shows them)")
    validation_fraction: float = Field(
        0.0, ge=0.0, lt=1.0,
        description="tuning mode: > 0 carves this seeded share of the TRAINING rows out as the evaluation set "
        "(reported as 'test'); the real test split is never read and statistics come from the remaining rows",
    )
    calibration_fraction: float = Field(
        0.0, ge=0.0, lt=1.0,
        description="> 0 holds this seeded share of the training rows out of training as calibration rows, "
        "for post-hoc calibration (zoo eval --temperature-scale); the test split is unchanged")

    @classmethod
    def served_names(cls) -> tuple[str, ...]:
        """The ``data.name`` values it serves: its prefix, or its catalogue's names.

        :returns: the names (a prefix ends in ``:``).
        """
        return (cls.prefix,) if cls.prefix is not None else tuple(cls.catalogue)

    def brings_calibration_rows(self) -> bool | None:
        """Whether the data set will hold calibration rows (those of ``calibration_fraction``); None where that is
        not known before it is loaded.

        :returns: True, False or None.
        """
        return self.calibration_fraction > 0

    @abstractmethod
    def load(self, seed: int) -> Dataset:
        """The data set, standardised with its training statistics (before the validation and calibration carves).

        :param seed: seeds any random split.
        :returns: the data set.
        :raises ZooInputError: missing or malformed files, impossible settings.
        """


class HeldOutTestData(DataSection):
    """A classification set whose test rows are a seeded share of its rows, with classes that may be held out of
    training as an OOD set."""

    test_fraction: float = Field(0.2, gt=0.0, lt=1.0, description=TEST_FRACTION_DOC)
    ood_classes: list[int] = Field(default_factory=list, description=OOD_CLASSES_DOC)


def given(spec: DataSection, *fields: str) -> dict[str, Any]:
    """The section's fields that are set (not None), so that a loader's own defaults apply to the rest.

    :param spec: a data section.
    :param fields: its field names.
    :returns: the set ones by name.
    """
    return {f: getattr(spec, f) for f in fields if getattr(spec, f) is not None}


# ------------------------------------------------------------------------------------------------ shared helpers
def check_test_fraction(test_fraction: float) -> float:
    """Refuse a test share outside (0, 1).

    :param test_fraction: the share of rows to test on.
    :returns: it, as a float.
    :raises ZooInputError: when it is not a number strictly between 0 and 1.
    """
    if not (isinstance(test_fraction, int | float) and 0.0 < float(test_fraction) < 1.0):
        raise ZooInputError("data.test_fraction", test_fraction, "use a number strictly between 0 and 1")
    return float(test_fraction)


def check_ood_classes(ood_classes: Sequence[int], n_classes: int) -> list[int]:
    """Validate classes to hold out: each in 0..n_classes-1, and at least 2 classes left for training.

    :param ood_classes: the class ids to hold out.
    :param n_classes: the classes of the data set.
    :returns: the distinct class ids, sorted.
    :raises ZooInputError: a class that is not an integer in range, or fewer than 2 classes left.
    """
    held = []
    for c in ood_classes:
        if isinstance(c, bool) or not isinstance(c, int | np.integer) or not 0 <= int(c) < n_classes:
            raise ZooInputError("data.ood_classes", list(ood_classes),
                                f"each class must be an integer in 0..{n_classes - 1}")
        if int(c) not in held:
            held.append(int(c))
    if n_classes - len(held) < 2:
        raise ZooInputError("data.ood_classes", list(ood_classes),
                            f"hold out at most {n_classes - 2} of the {n_classes} classes (at least 2 must remain)")
    return sorted(held)


def split_holding_out(
    x: np.ndarray, y: np.ndarray, seed: int, test_fraction: float, ood_classes: Sequence[int], n_classes: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, list[int]]:
    """Seeded stratified split, then :func:`hold_out_classes`.

    :param x: inputs ``[N, D]``.
    :param y: class labels ``[N]``.
    :param seed: seeds the split.
    :param test_fraction: the share of rows to test on, in (0, 1).
    :param ood_classes: the class ids to hold out of training.
    :param n_classes: the classes of the data set.
    :returns: ``x_train, y_train, x_test, y_test, x_heldout (or None), kept``, as :func:`hold_out_classes`.
    :raises ZooInputError: a bad ``test_fraction`` or ``ood_classes``.
    """
    from sklearn.model_selection import train_test_split

    check_ood_classes(ood_classes, n_classes)
    test_fraction = check_test_fraction(test_fraction)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_fraction, random_state=seed, stratify=y)
    return hold_out_classes(x_tr, y_tr, x_te, y_te, ood_classes, n_classes)


def hold_out_classes(
    x_tr: np.ndarray, y_tr: np.ndarray, x_te: np.ndarray, y_te: np.ndarray, ood_classes: Sequence[int],
    n_classes: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, list[int]]:
    """Held-out classes leave a given train/test split; their test rows become the OOD set.

    Returns ``x_train, y_train, x_test, y_test, x_heldout (or None), kept`` with labels relabelled to
    ``0..len(kept)-1`` in the order of ``kept`` (the original class ids that remain).

    :param x_tr: training inputs.
    :param y_tr: training labels.
    :param x_te: test inputs.
    :param y_te: test labels.
    :param ood_classes: the class ids to hold out.
    :param n_classes: the classes of the data set.
    :returns: ``x_train, y_train, x_test, y_test, x_heldout (or None), kept``.
    :raises ZooInputError: a bad ``ood_classes`` (:func:`check_ood_classes`).
    """
    held = check_ood_classes(ood_classes, n_classes)
    kept = [c for c in range(n_classes) if c not in held]
    relabel = np.full(n_classes, -1, dtype=np.int64)
    relabel[kept] = np.arange(len(kept))
    in_tr, in_te = ~np.isin(y_tr, held), ~np.isin(y_te, held)
    x_heldout = x_te[~in_te] if held else None
    return x_tr[in_tr], relabel[y_tr[in_tr]], x_te[in_te], relabel[y_te[in_te]], x_heldout, kept


def tensor_batches(loader: Any) -> Iterator[tuple[torch.Tensor, ...]] | None:
    """The batches a ``DataLoader`` over a ``TensorDataset`` with the default collation gives, each indexed from the
    tensors at once by the loader's own batch sampler (in its order), instead of row by row and stacked: the same
    batches at a fraction of the cost. None for any other loader (its own transforms, collation or items).

    :param loader: a ``DataLoader`` (or any iterable of batches).
    :returns: the batches, or None.
    """
    if not isinstance(loader, torch.utils.data.DataLoader) or not isinstance(loader.dataset,
                                                                              torch.utils.data.TensorDataset):
        return None
    if loader.batch_sampler is None or loader.collate_fn is not torch.utils.data.default_collate:
        return None
    tensors = loader.dataset.tensors
    order = _sampler_order(loader.batch_sampler)
    if order is None:  # a sampler of its own: its lists of indices, each converted once
        return (tuple(t[index] for t in tensors) for index in map(torch.as_tensor, loader.batch_sampler))
    return (tuple(t[index] for t in tensors) for index in order)


def _sampler_order(batch_sampler: Any) -> Iterator[torch.Tensor] | None:
    """The index batches of torch's own ``BatchSampler`` over a ``SequentialSampler``, or over a ``RandomSampler``
    without replacement whose generator is set, as tensors: the order that sampler draws (one ``randperm`` of the
    rows from its generator, when the pass starts) split into batches, without a Python list per batch. None for any
    other sampler (its own lists are used).
    """
    data = torch.utils.data
    if type(batch_sampler) is not data.BatchSampler:
        return None
    sampler = batch_sampler.sampler
    if type(sampler) is data.SequentialSampler:
        generator = None
    elif (type(sampler) is data.RandomSampler and not sampler.replacement and sampler.generator is not None
          and sampler.num_samples == len(sampler.data_source)):
        generator = sampler.generator
    else:
        return None
    n = len(sampler.data_source)

    def batches() -> Iterator[torch.Tensor]:
        order = torch.arange(n) if generator is None else torch.randperm(n, generator=generator)
        for index in order.split(batch_sampler.batch_size):
            if len(index) == batch_sampler.batch_size or not batch_sampler.drop_last:
                yield index

    return batches()
