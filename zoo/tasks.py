"""Regression and classification, each one object: everything the zoo does differently for the two tasks.

A :class:`~zoo.data.base.Dataset` names its task (``data.task``) and :func:`task_of` gives the object. Test-set
evaluation, the run's plot, the ArviZ groups (function-space summaries, replicated and observed targets, the
log-likelihood's units), predictive comparison, pruning tables and sweeps ask it instead of branching on the name.
A third kind of task (say, count data) is one more subclass here and one entry in :data:`TASKS`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from zoo import metrics, plots
from zoo.data.base import LABELLED, Dataset
from zoo.errors import ZooInputError
from zoo.likelihoods import PredictiveDraws
from zoo.posterior import Posterior

PRIMARY_OOD = "heldout_classes"
Y_SAMPLES = 2000  # regression: predictive samples of y per test input for coverage and W1 (several per weight draw)


class Task(ABC):
    """What differs between tasks. ``metrics`` are the headline test metrics, each with the direction that is
    better (the first is what a sweep optimises by default); ``fidelity`` are the two figures that compare a run's
    predictive with a reference's."""

    name: ClassVar[str]
    labelled: ClassVar[bool]  # its targets are class labels (else real values, standardised)
    likelihood: ClassVar[str]  # the likelihood ``likelihood.name: auto`` picks
    metrics: ClassVar[dict[str, str]]
    fidelity: ClassVar[tuple[str, str]]

    @abstractmethod
    def evaluate(self, posterior: Posterior, data: Dataset, num_samples: int) -> dict[str, float]:
        """The flat test metrics of ``metrics.json`` from ``num_samples`` posterior draws."""

    @abstractmethod
    def plot(self, posterior: Posterior, data: Dataset, run_dir: Path, num_samples: int) -> Path | None:
        """The run's picture, or None where the task has none for this data."""

    @abstractmethod
    def targets(self, data: Dataset, y: torch.Tensor) -> np.ndarray:
        """Targets as the user gave them (original units; class labels as they are)."""

    def log_likelihood_shift(self, data: Dataset) -> float:
        """What turns a log-likelihood of standardised targets into one of the original targets."""
        return 0.0

    @abstractmethod
    def mixture(self, pred: PredictiveDraws, num_draws: int) -> tuple[torch.Tensor, ...]:
        """Each draw's predictive as a uniform mixture of its rows ``[S, K, B, ...]`` (K = 1, or a rank-1 BNN's
        members)."""

    @abstractmethod
    def summarise(self, pred: PredictiveDraws, num_draws: int, data: Dataset
                  ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The function-space summary ``f [S, B]`` of each draw at B test inputs (what R-hat and ESS are judged on)
        and any per-input coordinate it needs to be read."""

    @abstractmethod
    def replicate(self, pred: PredictiveDraws, num_draws: int, data: Dataset, generator: torch.Generator
                  ) -> np.ndarray:
        """One target per draw and input from the draw's predictive ``[S, B]`` (as :meth:`targets` gives them)."""

    @abstractmethod
    def comparison_draws(self, pred: PredictiveDraws, data: Dataset, seed: int) -> np.ndarray:
        """What :meth:`compare` reads of a run's predictive at the test inputs."""

    @abstractmethod
    def compare(self, run: np.ndarray, reference: np.ndarray) -> tuple[dict[str, float], np.ndarray]:
        """The two :attr:`fidelity` figures of a run against a reference (from :meth:`comparison_draws`), and the
        second per test input."""


class Regression(Task):
    """Gaussian predictive per draw (``loc``, ``scale`` in standardised units); metrics in the original units."""

    name = "regression"
    labelled = False
    likelihood = "gaussian"
    metrics = {"test_ll": "maximize", "rmse": "minimize"}
    fidelity = ("coverage_95", "w1")

    def evaluate(self, posterior: Posterior, data: Dataset, num_samples: int) -> dict[str, float]:
        pred = posterior.predict(data.x_test, num_samples)  # a closed form where the posterior has one (Laplace GLM)
        return metrics.regression_metrics(pred.loc, pred.scale, data.y_test, data.y_mean, data.y_std)

    def plot(self, posterior: Posterior, data: Dataset, run_dir: Path, num_samples: int) -> Path | None:
        if data.in_dim != 1:
            return None
        lo = min(data.x_train.min(), data.x_test.min()).item()
        hi = max(data.x_train.max(), data.x_test.max()).item()
        pad = 0.25 * (hi - lo)
        grid = torch.linspace(lo - pad, hi + pad, 400, device=data.x_train.device, dtype=data.x_train.dtype)[:, None]
        pred = posterior.predict(grid, num_samples)

        def raw_x(x: torch.Tensor) -> torch.Tensor:
            return data.inputs_in_original_units(x)[:, 0].cpu()

        def raw_y(y: torch.Tensor) -> torch.Tensor:
            return (y * data.y_std + data.y_mean).cpu()

        return plots.uncertainty_band(raw_x(data.x_train), raw_y(data.y_train), raw_x(grid), raw_y(pred.loc),
                                      (pred.scale * data.y_std).cpu(), Path(run_dir) / "uncertainty.png",
                                      title=f"{data.name}: posterior predictive")

    def targets(self, data: Dataset, y: torch.Tensor) -> np.ndarray:
        return y.detach().cpu().to(torch.float64).numpy() * data.y_std + data.y_mean

    def log_likelihood_shift(self, data: Dataset) -> float:
        return -math.log(data.y_std)

    def mixture(self, pred: PredictiveDraws, num_draws: int) -> tuple[torch.Tensor, ...]:
        scale = pred.scale.expand_as(pred.loc)
        return pred.loc.unflatten(0, (num_draws, -1)), scale.unflatten(0, (num_draws, -1))

    def summarise(self, pred: PredictiveDraws, num_draws: int, data: Dataset
                  ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        loc, _ = self.mixture(pred, num_draws)  # the draw's predictive mean (its members' average for rank-1)
        return loc.mean(1).detach().cpu().numpy().astype(np.float64) * data.y_std + data.y_mean, {}

    def replicate(self, pred: PredictiveDraws, num_draws: int, data: Dataset, generator: torch.Generator
                  ) -> np.ndarray:
        loc, scale = (t.detach().cpu().double() for t in self.mixture(pred, num_draws))
        member = torch.randint(loc.shape[1], (num_draws, 1, loc.shape[2]), generator=generator)
        loc, scale = loc.gather(1, member)[:, 0], scale.gather(1, member)[:, 0]
        eps = torch.randn(loc.shape, generator=generator, dtype=torch.float64)
        return ((loc + scale * eps) * data.y_std + data.y_mean).cpu().numpy()

    def comparison_draws(self, pred: PredictiveDraws, data: Dataset, seed: int) -> np.ndarray:
        """Samples of y ``[R, B]`` in original units, several per weight draw."""
        loc, scale = pred.loc.detach().cpu().double(), pred.scale.detach().cpu().double()
        per_draw = max(1, math.ceil(Y_SAMPLES / loc.shape[0]))
        eps = torch.randn((per_draw, *loc.shape), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        return ((loc + scale * eps) * data.y_std + data.y_mean).reshape(-1, loc.shape[-1]).cpu().numpy()

    def compare(self, run: np.ndarray, reference: np.ndarray) -> tuple[dict[str, float], np.ndarray]:
        """``coverage_95`` (the reference's predictive mass inside the run's central 95% interval; 0.95 is ideal)
        and ``w1`` (Wasserstein-1 between the predictive marginals of y, original units)."""
        w1 = metrics.wasserstein(run, reference)
        return {"coverage_95": float(metrics.coverage(run, reference).mean()), "w1": float(w1.mean())}, w1


class Classification(Task):
    """Class log-probabilities per draw ``[S, B, C]``; OOD detection by entropy and mutual information."""

    name = "classification"
    labelled = True
    likelihood = "categorical"
    metrics = {"nll": "minimize", "accuracy": "maximize", "ece": "minimize", "brier": "minimize"}
    fidelity = ("agreement", "tv")

    def evaluate(self, posterior: Posterior, data: Dataset, num_samples: int) -> dict[str, float]:
        """accuracy, nll, ece, brier and, per OOD set, ``ood_auroc_{entropy,mi}_<set>``; the unsuffixed
        ``ood_auroc_entropy``/``ood_auroc_mi`` are those of the held-out classes when present, else the first set.
        The MI AUROCs are left out for a point estimate (every draw the same: MI is 0 everywhere)."""
        draws = posterior.scoring_draws(num_samples)  # shared by the test and the OOD inputs
        pred = posterior.predict(data.x_test, num_samples, draws=draws)
        out = metrics.classification_metrics(pred.log_probs, data.y_test)
        for name, x_ood in data.x_ood.items():
            auroc = metrics.ood_auroc(pred.log_probs, posterior.predict(x_ood, num_samples, draws=draws).log_probs)
            out.update({f"ood_auroc_{score}_{name}": value for score, value in auroc.items()})
        if data.x_ood:
            primary = PRIMARY_OOD if PRIMARY_OOD in data.x_ood else next(iter(data.x_ood))
            for score in ("entropy", "mi"):
                if f"ood_auroc_{score}_{primary}" in out:
                    out[f"ood_auroc_{score}"] = out[f"ood_auroc_{score}_{primary}"]
        return out

    def plot(self, posterior: Posterior, data: Dataset, run_dir: Path, num_samples: int) -> Path | None:
        pred = posterior.predict(data.x_test, num_samples)
        return plots.reliability_diagram(pred.log_probs.cpu(), data.y_test.cpu(), Path(run_dir) / "reliability.png",
                                         title=data.name)

    def targets(self, data: Dataset, y: torch.Tensor) -> np.ndarray:
        return y.detach().cpu().numpy()

    def mixture(self, pred: PredictiveDraws, num_draws: int) -> tuple[torch.Tensor, ...]:
        return (pred.log_probs.unflatten(0, (num_draws, -1)),)

    def _mixed(self, pred: PredictiveDraws, num_draws: int) -> torch.Tensor:
        """Each draw's class log-probabilities ``[S, B, C]``, its members mixed."""
        (members,) = self.mixture(pred, num_draws)
        return members.logsumexp(1) - math.log(members.shape[1])

    def summarise(self, pred: PredictiveDraws, num_draws: int, data: Dataset
                  ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Each draw's log-probability of the class the mean predictive picks (fixed per input)."""
        log_probs = self._mixed(pred, num_draws)
        predicted = log_probs.exp().mean(0).argmax(-1)
        f = log_probs.gather(-1, predicted[None, :, None].expand(num_draws, -1, 1))[..., 0]
        return f.detach().cpu().numpy(), {"predicted_class": predicted.detach().cpu().numpy()}

    def replicate(self, pred: PredictiveDraws, num_draws: int, data: Dataset, generator: torch.Generator
                  ) -> np.ndarray:
        log_probs = self._mixed(pred, num_draws).detach().cpu().double()
        u = torch.rand(log_probs.shape, generator=generator, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
        return (log_probs - (-u.log()).log()).argmax(-1).cpu().numpy()  # Gumbel-max: one class per draw

    def comparison_draws(self, pred: PredictiveDraws, data: Dataset, seed: int) -> np.ndarray:
        """The mean predictive class probabilities ``[B, C]``."""
        return pred.log_probs.detach().cpu().double().exp().mean(0).numpy()

    def compare(self, run: np.ndarray, reference: np.ndarray) -> tuple[dict[str, float], np.ndarray]:
        """``agreement`` (the argmax of the mean predictive matches the reference's) and ``tv`` (mean total
        variation between the mean predictive class distributions)."""
        tv = 0.5 * np.abs(run - reference).sum(-1)
        return {"agreement": float((run.argmax(-1) == reference.argmax(-1)).mean()), "tv": float(tv.mean())}, tv


TASKS: dict[str, Task] = {task.name: task for task in (Regression(), Classification())}
assert all(LABELLED[name] == task.labelled for name, task in TASKS.items()) and set(LABELLED) == set(TASKS)


def task_of(data: Dataset | str) -> Task:
    """The task object of a data set (or of a task's name)."""
    name = data if isinstance(data, str) else data.task
    if name not in TASKS:
        raise ZooInputError("data.task", name, f"use one of {', '.join(TASKS)}")
    return TASKS[name]
