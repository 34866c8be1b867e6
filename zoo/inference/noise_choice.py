"""A regression fit's predictive noise set on its calibration rows, once the fit ends.

An approximate posterior's learned Gaussian noise σ answers the fit's objective, not its predictive. The ELBO's
expected log-likelihood sets σ² near the residuals' mean square under each draw, so σ takes up the draws' spread about
the data, and the predictive mixture then adds that spread a second time: on UCI energy a rank-1 fit learned σ = 1.58
where its draws' mean misses by 0.77 (docs/results/defaults.md). A MAP's or SWAG's σ, learned beside the mean, still
lags it when a short fit ends.

With rows held out of training (``fit(val=...)`` or ``data.calibration_fraction``) and ``inference.noise_by`` unset or
``calibration``, the predictive's σ is set to the one σ under which the predictive mixture (each draw's mean, that
σ) is likeliest on those rows: a bounded search of log σ, as a Laplace fit's ``noise_by: calibration`` does for its
GLM predictive. Only the predictive reads it (:attr:`~zoo.likelihoods.base.Likelihood.predictive_noise`): the draws
of σ (ArviZ, diagnostics, the training log-likelihood) stay the fit's. A run keeps it in ``predictive_noise.json``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyro
import torch

from zoo.errors import ZooInputError
from zoo.metrics import regression_metrics
from zoo.runs import write_json
from zoo.sections import SetsNoise

if TYPE_CHECKING:
    from zoo.data.base import Dataset
    from zoo.likelihoods.base import Likelihood
    from zoo.posterior import Posterior

PREDICTIVE_NOISE_FILE = "predictive_noise.json"
LOG_NOISE_SEARCH = 8.0  # the search spans log σ from the largest residual's down by this (a factor of e⁸ = 2,981)


def chooses_noise(spec: Any, has_calibration_rows: bool, likelihood: Likelihood) -> bool:
    """Whether a fit sets its predictive noise on its calibration rows: ``noise_by: calibration``, or, where unset, a
    learned Gaussian noise and calibration rows to set it on. A method without the setting (MCMC, Laplace) never does.

    :param spec: the ``inference`` section.
    :param has_calibration_rows: whether the fit has rows held out of training.
    :param likelihood: the fit's likelihood.
    :returns: whether it sets the noise.
    :raises ZooInputError: ``noise_by: calibration`` without calibration rows or a learned Gaussian noise.
    """
    if not isinstance(spec, SetsNoise):
        return False
    if spec.noise_by == "calibration" and not (has_calibration_rows and likelihood.learns_noise):
        raise ZooInputError("inference.noise_by", "calibration", "needs rows held out of training and a learned "
                            "Gaussian noise (likelihood gaussian, noise: learned): pass val= to fit or set "
                            "data.calibration_fraction (e.g. 0.1), or use noise_by: fit")
    if spec.noise_by is None:
        return has_calibration_rows and likelihood.learns_noise
    return spec.noise_by == "calibration"


def likeliest_noise(loc: torch.Tensor, y: torch.Tensor) -> float:
    """The one σ under which the mixture of N(loc_s, σ²) over draws s is likeliest at targets ``y``: a bounded Brent
    search of log σ (to 0.001), below the largest residual |y - loc_s| over rows and draws, where the likelihood
    only falls as σ grows (every draw's term does), and down by :data:`LOG_NOISE_SEARCH`. The window is the data's,
    not the fit's σ: a fit that started σ low may end it far below the rows' errors.

    :param loc: each draw's predictive mean ``[S, B]``, standardised units.
    :param y: the targets ``[B]``, standardised.
    :returns: σ, standardised units.
    """
    from scipy.optimize import minimize_scalar

    loc, y = loc.double(), y.double()

    def minus_ll(log_noise: float) -> float:
        return -regression_metrics(loc, loc.new_tensor(math.exp(log_noise)), y)["test_ll"]

    found = minimize_scalar(minus_ll, bounds=log_noise_window(y - loc), method="bounded", options={"xatol": 1e-3})
    return math.exp(found.x)


def log_noise_window(residuals: torch.Tensor) -> tuple[float, float]:
    """Where a search for the σ likeliest on calibration rows looks, in log σ: from the largest residual, above which
    a Gaussian term's likelihood only falls as its variance grows, down by :data:`LOG_NOISE_SEARCH`.

    :param residuals: y minus each draw's (or the GLM's) mean, any shape, standardised units.
    :returns: ``(low, high)``.
    """
    top = math.log(max(float(residuals.abs().max()), 1e-12))
    return top - LOG_NOISE_SEARCH, top


def set_noise_on_calibration_rows(posterior: Posterior, likelihood: Likelihood, data: Dataset, num_samples: int,
                                  seed: int) -> str:
    """Set ``likelihood``'s :attr:`~zoo.likelihoods.base.Likelihood.predictive_noise` to the σ likeliest on
    ``data``'s calibration rows under ``posterior``'s predictive (``num_samples`` draws, seeded by ``seed``).

    :param posterior: the fitted posterior (its family predicts with ``likelihood``).
    :param likelihood: the fit's likelihood, a learned Gaussian noise.
    :param data: the fit's data set, with calibration rows.
    :param num_samples: posterior draws.
    :param seed: seeds the draws (Pyro's generators are set to ``seed + 1``, as the test metrics' are).
    :returns: the log line that says what was set, in the targets' units.
    """
    likelihood.predictive_noise = None  # the fit's own noise, for the draws the search starts from
    pyro.set_rng_seed(seed + 1)
    draws = posterior.predict(data.x_calibration, num_samples)
    y = data.y_calibration.to(draws.loc)
    fitted = float(draws.scale.mean())
    chosen = likeliest_noise(draws.loc, y)
    before = regression_metrics(draws.loc, draws.scale, y, y_std=data.y_std)["test_ll"]
    after = regression_metrics(draws.loc, draws.loc.new_tensor(chosen), y, y_std=data.y_std)["test_ll"]
    likelihood.predictive_noise = chosen
    return (f"noise {fitted * data.y_std:.4g} (the fit's, mean over {draws.loc.shape[0]} draws) -> "
            f"{chosen * data.y_std:.4g} in the targets' units, the likeliest on {len(y):,} calibration rows (their "
            f"test LL {before:.4g} -> {after:.4g}); inference.noise_by: fit keeps the fit's")


def save_predictive_noise(run_dir: Path, likelihood: Likelihood) -> None:
    """Keep a predictive noise set on calibration rows in ``run_dir`` (nothing where none was set).

    :param run_dir: the run directory.
    :param likelihood: the fit's likelihood.
    """
    if likelihood.predictive_noise is not None:
        write_json(run_dir / PREDICTIVE_NOISE_FILE, {"noise": likelihood.predictive_noise,
                                                      "units": "standardised targets"})


def load_predictive_noise(run_dir: Path, likelihood: Likelihood) -> None:
    """Give ``likelihood`` the predictive noise a run set on its calibration rows, where it set one.

    :param run_dir: the run directory.
    :param likelihood: the likelihood built from the run's spec.
    """
    path = Path(run_dir) / PREDICTIVE_NOISE_FILE
    likelihood.predictive_noise = float(json.loads(path.read_text())["noise"]) if path.exists() else None
