"""Test-set evaluation of any Posterior: the flat metrics of metrics.json, the run's plot, and pruning."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyro
import torch

from zoo import metrics, plots
from zoo.data.base import Dataset
from zoo.errors import ZooInputError
from zoo.posterior import MaskedPosterior, Posterior

PRIMARY_OOD = "heldout_classes"


def evaluate(posterior: Posterior, data: Dataset, num_samples: int, seed: int = 0) -> dict[str, float]:
    """Metrics on the test set from ``num_samples`` joint draws (one set of draws for test and OOD inputs).

    Classification: accuracy, nll, ece, brier and, per OOD set, ``ood_auroc_{entropy,mi}_<set>``; the unsuffixed
    ``ood_auroc_entropy``/``ood_auroc_mi`` are those of the held-out classes when present, else the first set.
    Regression: rmse and test_ll in original units (from the closed form where the posterior has one).
    """
    if num_samples < 1:
        raise ZooInputError("--samples", num_samples, "use a positive number of posterior draws")
    pyro.set_rng_seed(seed + 1)
    if data.task == "regression":  # the posterior's own predictive: a closed form where it has one (Laplace GLM)
        pred = posterior.predict(data.x_test, num_samples)
        return metrics.regression_metrics(pred.loc, pred.scale, data.y_test, data.y_mean, data.y_std)
    draws = posterior.sample(num_samples)  # shared by the test and the OOD inputs
    pred = posterior.predict(data.x_test, draws=draws)
    out = metrics.classification_metrics(pred.log_probs, data.y_test)
    for name, x_ood in data.x_ood.items():
        auroc = metrics.ood_auroc(pred.log_probs, posterior.predict(x_ood, draws=draws).log_probs)
        out[f"ood_auroc_entropy_{name}"], out[f"ood_auroc_mi_{name}"] = auroc["entropy"], auroc["mi"]
    if data.x_ood:
        primary = PRIMARY_OOD if PRIMARY_OOD in data.x_ood else next(iter(data.x_ood))
        out["ood_auroc_entropy"] = out[f"ood_auroc_entropy_{primary}"]
        out["ood_auroc_mi"] = out[f"ood_auroc_mi_{primary}"]
    return out


class ValidationMonitor:
    """Scores a fit's current posterior on its evaluation rows ``reports`` times during the fit, evenly spaced.

    ``on_score(k, value)`` receives the k-th score (k = 1..reports) of ``metric``; it may raise to stop the fit (a
    sweep's pruner does). Scoring draws from its own seeded stream and leaves every random state as it found it, so
    a monitored fit takes exactly the steps an unmonitored one takes. Inference methods without intermediate
    posteriors (MCMC, Laplace) score once, at the end, as report ``reports``.
    """

    def __init__(self, metric: str, on_score: Callable[[int, float], None], num_samples: int, seed: int = 0,
                 reports: int = 10) -> None:
        if reports < 1:
            raise ZooInputError("reports", reports, "score a fit at least once")
        self.metric, self.on_score, self.num_samples, self.seed, self.reports = (metric, on_score, num_samples,
                                                                                 seed, reports)
        self.reported = 0

    def due(self, step: int, total_steps: int) -> bool:
        """Whether ``step`` of ``total_steps`` completes the next report's share of the fit."""
        return step * self.reports // max(total_steps, 1) > self.reported

    def __call__(self, step: int, total_steps: int, posterior: Posterior, data: Dataset) -> None:
        """Score ``posterior`` as the report that ``step`` of ``total_steps`` completes."""
        k = min(self.reports, step * self.reports // max(total_steps, 1))
        cpu_rng, py_rng, np_rng = torch.get_rng_state(), random.getstate(), np.random.get_state()
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        try:
            with torch.no_grad():
                value = evaluate(posterior, data, self.num_samples, self.seed)[self.metric]
        finally:
            torch.set_rng_state(cpu_rng)
            random.setstate(py_rng)
            np.random.set_state(np_rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)
        self.reported = k
        self.on_score(k, float(value))

    def final(self, posterior: Posterior, data: Dataset) -> None:
        """Score a finished fit (once, as the last report) unless its last report is already in."""
        if self.reported < self.reports:
            self(self.reports, self.reports, posterior, data)


def plot_predictive(posterior: Posterior, data: Dataset, run_dir: Path, num_samples: int, seed: int = 0) -> Path | None:
    """The run's picture: an uncertainty band for 1-D regression, a reliability diagram for classification.

    Seeded like :func:`evaluate`, so a reliability diagram shows the same draws as metrics.json.
    """
    pyro.set_rng_seed(seed + 1)
    if data.task == "classification":
        pred = posterior.predict(data.x_test, num_samples)
        return plots.reliability_diagram(pred.log_probs.cpu(), data.y_test.cpu(), Path(run_dir) / "reliability.png",
                                         title=data.name)
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


def prune_by_snr(posterior: Posterior, fraction: float) -> MaskedPosterior:
    """Fix the ``fraction`` of weights with the lowest signal-to-noise |mu|/sigma at zero (Blundell et al. 2015)."""
    guide = getattr(posterior, "guide", None)
    if guide is None or not hasattr(guide, "signal_to_noise") or any(s.plate for s in guide.sites.values()):
        raise ZooInputError("zoo prune", type(guide).__name__,
                            "pruning needs a mean-field guide over individual weights (|mu|/sigma); "
                            "rank-1 factors scale whole units, so they are not pruned")
    if not 0.0 <= fraction < 1.0:
        raise ZooInputError("--fractions", fraction, "each fraction must be in [0, 1)")
    snr = guide.signal_to_noise()
    flat = torch.cat([v.flatten() for v in snr.values()])
    k = int(round(fraction * flat.numel()))
    threshold = flat.kthvalue(k).values if k > 0 else flat.new_tensor(-1.0)
    return MaskedPosterior(posterior, {name: (v > threshold).to(v.dtype) for name, v in snr.items()})
