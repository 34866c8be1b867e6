"""The Dataset every loader returns: standardised tensors plus what is needed to report in original units."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from zoo.errors import ZooInputError

Task = Literal["regression", "classification"]


@dataclass
class Dataset:
    """Train/test tensors, standardised with training statistics.

    Inputs are float32 ``[N, D]``. Regression targets are float32 ``[N]`` in standardised units
    (``y_mean``/``y_std`` map them back); classification targets are int64 ``[N]`` in ``0..n_classes-1``.
    ``x_ood`` holds out-of-distribution input sets (standardised like ``x_train``) by name.
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

    @property
    def in_dim(self) -> int:
        """Number of input features."""
        return int(self.x_train.shape[1])

    @property
    def out_dim(self) -> int:
        """Width of the net's output layer: classes for classification, 1 for regression."""
        return int(self.n_classes) if self.task == "classification" else 1

    @property
    def n_train(self) -> int:
        """Number of training examples (the full-data size that minibatch likelihoods are scaled to)."""
        return int(self.x_train.shape[0])

    def to(self, device: torch.device | str, dtype: torch.dtype = torch.float32) -> Dataset:
        """Move every tensor to ``device``; inputs (and regression targets) become ``dtype``."""

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)

        return dataclasses.replace(
            self, x_train=move(self.x_train), y_train=move(self.y_train), x_test=move(self.x_test),
            y_test=move(self.y_test), x_ood={k: move(v) for k, v in self.x_ood.items()},
        )

    def inputs_in_original_units(self, x: torch.Tensor) -> torch.Tensor:
        """Undo the input standardisation (for plots against the raw input axis)."""
        return x * self.x_std.to(x) + self.x_mean.to(x)


def check_finite(array: np.ndarray, what: str) -> None:
    """Refuse arrays with NaN or inf, naming the first offending row."""
    bad = ~np.isfinite(array)
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        raise ZooInputError(what, f"{int(bad.sum())} NaN/inf values (first at row {row})",
                            "clean or drop those rows before training")


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
) -> Dataset:
    """Validate raw arrays and standardise them with training statistics into a :class:`Dataset`."""
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
    mean, std = x_train.mean(0), x_train.std(0)
    std = np.where(std < 1e-8, 1.0, std)  # constant features (e.g. digits' blank border pixels) stay put

    def standardise(x: np.ndarray) -> torch.Tensor:
        return torch.as_tensor((x - mean) / std, dtype=torch.float32)

    x_stats = (torch.as_tensor(mean, dtype=torch.float32), torch.as_tensor(std, dtype=torch.float32))
    ood = {k: standardise(np.asarray(v, dtype=np.float64)) for k, v in (x_ood or {}).items()}
    if task == "regression":
        y_train = np.asarray(y_train, dtype=np.float64).reshape(-1)
        y_test = np.asarray(y_test, dtype=np.float64).reshape(-1)
        check_finite(y_train, f"{name} training targets")
        check_finite(y_test, f"{name} test targets")
        y_mean, y_std = float(y_train.mean()), float(y_train.std())
        y_std = y_std if y_std > 1e-12 else 1.0
        return Dataset(
            name, task, standardise(x_train), torch.as_tensor((y_train - y_mean) / y_std, dtype=torch.float32),
            standardise(x_test), torch.as_tensor((y_test - y_mean) / y_std, dtype=torch.float32),
            None, y_mean, y_std, ood, None, x_stats[0], x_stats[1],
        )
    if task != "classification":
        raise ZooInputError("data.task", task, "use 'regression' or 'classification'")
    y_train_t = torch.as_tensor(np.asarray(y_train), dtype=torch.int64).reshape(-1)
    y_test_t = torch.as_tensor(np.asarray(y_test), dtype=torch.int64).reshape(-1)
    n_classes = n_classes or int(max(y_train_t.max(), y_test_t.max())) + 1
    if y_train_t.min() < 0 or max(y_train_t.max(), y_test_t.max()) >= n_classes:
        raise ZooInputError(f"{name} labels", f"range {int(y_train_t.min())}..{int(y_train_t.max())}",
                            f"labels must be integers in 0..{n_classes - 1}")
    return Dataset(name, task, standardise(x_train), y_train_t, standardise(x_test), y_test_t,
                   n_classes, 0.0, 1.0, ood, class_names, x_stats[0], x_stats[1])


VALIDATION_STREAM = 7919  # mixed into the seed so the carve does not reuse any loader's own random stream


def carve_validation(data: Dataset, fraction: float, seed: int) -> Dataset:
    """Hold out a seeded ``fraction`` of the TRAINING rows as the evaluation set, for honest tuning.

    The returned Dataset's ``x_test``/``y_test`` are those validation rows; the real test split is dropped, so
    nothing tuned on it sees a test label. Inputs and targets are mapped back to raw units and standardised
    again with the statistics of the remaining training rows only (no statistic of the validation rows leaks
    into training). OOD sets are kept, re-standardised the same way. ``fraction == 0`` returns ``data`` as is.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0.0 <= float(fraction) < 1.0:
        raise ZooInputError("data.validation_fraction", fraction, "use a number in [0, 1); 0 means no validation")
    if fraction == 0:
        return data
    n = data.n_train
    n_val = max(1, int(round(float(fraction) * n)))
    if n - n_val < 2:
        raise ZooInputError("data.validation_fraction", fraction,
                            f"only {n} training rows: {n_val} for validation would leave fewer than 2 to train on")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), VALIDATION_STREAM]))
    perm = rng.permutation(n)
    val, keep = np.sort(perm[:n_val]), np.sort(perm[n_val:])

    def raw_x(x: torch.Tensor) -> np.ndarray:
        x = x.detach().cpu().to(torch.float64)
        if data.x_std is not None and data.x_mean is not None:
            x = x * data.x_std.detach().cpu().to(torch.float64) + data.x_mean.detach().cpu().to(torch.float64)
        return x.numpy()

    x = raw_x(data.x_train)
    if data.task == "regression":
        y = data.y_train.detach().cpu().to(torch.float64).numpy() * data.y_std + data.y_mean
    else:
        y = data.y_train.detach().cpu().numpy()
    ood = {k: raw_x(v) for k, v in data.x_ood.items()}
    return make_dataset(f"{data.name} (validation)", data.task, x[keep], y[keep], x[val], y[val], x_ood=ood,
                        n_classes=data.n_classes, class_names=data.class_names)
