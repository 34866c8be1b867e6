"""Owns the evaluation metrics of BNN predictive distributions given as S posterior draws (classification, regression).

Conventions
-----------
* Classification: ``log_probs`` is a ``[S, B, C]`` tensor of per-draw log class probabilities (``log_softmax`` of each
  draw's logits). The predictive distribution is the mean over draws of the probabilities, computed in log space as
  ``logsumexp over S - log S``.
* Regression: ``loc`` is ``[S, B]`` and ``scale`` broadcasts to ``[S, B]`` (e.g. ``[S, 1]``); both are per-draw Gaussian
  predictive parameters in *standardised* target units. ``y`` (``[B]``) is standardised too, and ``y_mean``/``y_std``
  map back to original units, in which the metrics are reported.

Every function that returns numbers returns plain Python floats (JSON-ready); tensors are returned only where noted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from scipy.stats import wasserstein_distance
from torch import Tensor

__all__ = [
    "accuracy",
    "brier",
    "classification_metrics",
    "coverage",
    "ece",
    "expected_calibration_error",
    "expected_entropy",
    "mutual_information",
    "nll",
    "ood_auroc",
    "ood_detection",
    "draws_identical",
    "max_prob_uncertainty",
    "predictive_entropy",
    "predictive_log_probs",
    "regression_metrics",
    "reliability_bins",
]

# logsumexp over classes of a proper log-probability vector is 0; anything further off is probably raw logits.
_NORMALISATION_TOL = 1e-3


# ----------------------------------------------------------------------------------------------------------------------
# validation helpers
# ----------------------------------------------------------------------------------------------------------------------


def _check_log_probs(log_probs: Tensor, name: str = "log_probs") -> None:
    if not isinstance(log_probs, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape [S, B, C]; got {type(log_probs).__name__}")
    if log_probs.dim() != 3:
        shape = tuple(log_probs.shape)
        raise ValueError(f"{name} must have shape [S, B, C] (draws, points, classes); got shape {shape}")
    s, b, c = log_probs.shape
    if s == 0 or c == 0:
        raise ValueError(f"{name} needs at least one draw and one class; got shape {tuple(log_probs.shape)}")
    if not log_probs.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor; got dtype {log_probs.dtype}")
    if torch.isnan(log_probs).any():
        raise ValueError(f"{name} contains NaN")
    if b > 0:
        norm = torch.logsumexp(log_probs, dim=-1)
        worst = float((norm.abs()).max())
        if not worst <= _NORMALISATION_TOL:
            raise ValueError(
                f"{name} must be normalised log-probabilities (log_softmax over the last dim); "
                f"logsumexp over classes is off from 0 by up to {worst:.3g} (did you pass raw logits?)"
            )


def _check_labels(log_probs: Tensor, y: Tensor) -> None:
    _check_log_probs(log_probs)
    s, b, c = log_probs.shape
    if not isinstance(y, Tensor):
        raise ValueError(f"y must be a torch.Tensor of shape [B]; got {type(y).__name__}")
    if y.dim() != 1:
        raise ValueError(f"y must have shape [B]; got shape {tuple(y.shape)}")
    if y.shape[0] != b:
        raise ValueError(f"batch size mismatch: log_probs has B={b} points ([S, B, C] = {tuple(log_probs.shape)}) "
                         f"but y has {y.shape[0]}")
    if b == 0:
        raise ValueError("need at least one point (B=0)")
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise ValueError(f"y must hold integer class labels; got dtype {y.dtype}")
    if int(y.min()) < 0 or int(y.max()) >= c:
        raise ValueError(f"y labels must lie in [0, {c - 1}] for C={c} classes; got range "
                         f"[{int(y.min())}, {int(y.max())}]")


def _check_confidence(confidence: Tensor, correct: Tensor, n_bins: int) -> tuple[Tensor, Tensor]:
    if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive int; got {n_bins!r}")
    confidence = torch.as_tensor(confidence)
    correct = torch.as_tensor(correct)
    if confidence.dim() != 1 or correct.dim() != 1:
        raise ValueError(f"confidence and correct must both have shape [B]; got {tuple(confidence.shape)} and "
                         f"{tuple(correct.shape)}")
    if confidence.shape[0] != correct.shape[0]:
        raise ValueError(f"confidence has {confidence.shape[0]} points but correct has {correct.shape[0]}")
    if confidence.shape[0] == 0:
        raise ValueError("need at least one point (B=0)")
    if not confidence.is_floating_point():
        confidence = confidence.double()
    if torch.isnan(confidence).any():
        raise ValueError("confidence contains NaN")
    lo, hi = float(confidence.min()), float(confidence.max())
    if lo < -1e-6 or hi > 1 + 1e-6:
        raise ValueError(f"confidence must lie in [0, 1]; got range [{lo:.6g}, {hi:.6g}]")
    if correct.dtype != torch.bool:
        if correct.is_floating_point() or not bool(((correct == 0) | (correct == 1)).all()):
            raise ValueError(f"correct must be a bool tensor (or 0/1 integers); got dtype {correct.dtype}")
        correct = correct.bool()
    return confidence.clamp(0.0, 1.0), correct


def _check_regression(loc: Tensor, scale: Tensor, y: Tensor, y_std: float) -> tuple[Tensor, Tensor, Tensor]:
    if not isinstance(loc, Tensor) or loc.dim() != 2:
        shape = tuple(loc.shape) if isinstance(loc, Tensor) else type(loc).__name__
        raise ValueError(f"loc must be a tensor of shape [S, B] (draws, points); got {shape}")
    s, b = loc.shape
    if s == 0 or b == 0:
        raise ValueError(f"loc needs at least one draw and one point; got shape {(s, b)}")
    scale = torch.as_tensor(scale, dtype=loc.dtype, device=loc.device)  # a float noise: beside loc, not on the host
    try:
        bshape = torch.broadcast_shapes(loc.shape, scale.shape)
    except RuntimeError as err:
        raise ValueError(f"scale of shape {tuple(scale.shape)} does not broadcast to loc's [S, B] = {(s, b)}") from err
    if tuple(bshape) != (s, b):
        raise ValueError(f"scale of shape {tuple(scale.shape)} does not broadcast to loc's [S, B] = {(s, b)}")
    if not isinstance(y, Tensor) or y.dim() != 1:
        shape = tuple(y.shape) if isinstance(y, Tensor) else type(y).__name__
        raise ValueError(f"y must be a tensor of shape [B]; got {shape}")
    if y.shape[0] != b:
        raise ValueError(f"batch size mismatch: loc has B={b} points ([S, B] = {(s, b)}) but y has {y.shape[0]}")
    if not (y_std > 0 and math.isfinite(y_std)):
        raise ValueError(f"y_std must be a positive finite float; got {y_std!r}")
    if not bool((scale > 0).all()):
        raise ValueError("scale must be strictly positive")
    if torch.isnan(loc).any() or torch.isnan(y).any():
        raise ValueError("loc or y contains NaN")
    return loc.double(), scale.double().expand(s, b), y.double()


# ----------------------------------------------------------------------------------------------------------------------
# classification
# ----------------------------------------------------------------------------------------------------------------------


def predictive_log_probs(log_probs: Tensor) -> Tensor:
    """Log of the posterior predictive (mean over draws of the class probabilities): ``[S, B, C] -> [B, C]``.

    :param log_probs: per-draw log class probabilities ``[S, B, C]``.
    :returns: the log predictive probabilities ``[B, C]``.
    :raises ValueError: when ``log_probs`` is not ``[S, B, C]`` normalised log-probabilities.
    """
    _check_log_probs(log_probs)
    return torch.logsumexp(log_probs, dim=0) - math.log(log_probs.shape[0])


def accuracy(log_probs: Tensor, y: Tensor) -> float:
    """Fraction of points whose predictive argmax class equals the label.

    :param log_probs: per-draw log class probabilities ``[S, B, C]``.
    :param y: integer class labels ``[B]``.
    :returns: the accuracy, in ``[0, 1]``.
    :raises ValueError: when ``log_probs`` is not ``[S, B, C]`` normalised log-probabilities or ``y`` not ``B``
        labels in ``[0, C)``.
    """
    _check_labels(log_probs, y)
    pred = predictive_log_probs(log_probs).argmax(dim=-1)
    return float((pred == y).double().mean())


def nll(log_probs: Tensor, y: Tensor) -> float:
    """Mean over points of -log p(y | x) under the predictive mixture over draws (not the mean of per-draw NLLs).

    :param log_probs: per-draw log class probabilities ``[S, B, C]``.
    :param y: integer class labels ``[B]``.
    :returns: the mean negative log-likelihood (nats).
    :raises ValueError: when ``log_probs`` is not ``[S, B, C]`` normalised log-probabilities or ``y`` not ``B``
        labels in ``[0, C)``.
    """
    _check_labels(log_probs, y)
    lp = predictive_log_probs(log_probs.double())
    return float(-lp.gather(-1, y.long().unsqueeze(-1)).squeeze(-1).mean())


def brier(log_probs: Tensor, y: Tensor) -> float:
    """Mean over points of the sum over classes of (p_c - onehot_c)^2 for the predictive probabilities.

    :param log_probs: per-draw log class probabilities ``[S, B, C]``.
    :param y: integer class labels ``[B]``.
    :returns: the Brier score, in ``[0, 2]``.
    :raises ValueError: when ``log_probs`` is not ``[S, B, C]`` normalised log-probabilities or ``y`` not ``B``
        labels in ``[0, C)``.
    """
    _check_labels(log_probs, y)
    p = predictive_log_probs(log_probs.double()).exp()
    onehot = torch.nn.functional.one_hot(y.long(), num_classes=p.shape[-1]).double()
    return float(((p - onehot) ** 2).sum(dim=-1).mean())


def _bin_index(confidence: Tensor, n_bins: int) -> Tensor:
    # Bins are (k/n, (k+1)/n] for k = 0..n-1 (the first also takes 0). The upper edges are computed as float64 k/n and
    # cast to the confidence dtype, i.e. exactly as a Python literal ``k / n`` becomes a tensor, so a confidence equal
    # to an upper edge lands in that bin whatever its dtype.
    upper = (torch.arange(1, n_bins + 1, dtype=torch.float64) / n_bins).to(confidence.device, confidence.dtype)
    return torch.bucketize(confidence, upper, right=False).clamp_(max=n_bins - 1)


def reliability_bins(confidence: Tensor, correct: Tensor, n_bins: int = 15) -> dict[str, np.ndarray]:
    """Per-bin statistics of a reliability diagram over ``n_bins`` equal-width bins on (0, 1].

    :param confidence: each point's confidence ``[B]``, in ``[0, 1]``.
    :param correct: whether each point's prediction was right ``[B]`` (bool, or 0/1 integers).
    :param n_bins: how many bins.
    :returns: arrays ``[n_bins]`` by name: ``lower`` and ``upper`` bin edges, ``count``, and the mean ``accuracy``
        and ``confidence`` in each bin (NaN for empty bins).
    :raises ValueError: when the two inputs are not ``[B]`` tensors of one length ``B >= 1``, a confidence lies
        outside ``[0, 1]``, or ``n_bins`` is not a positive int.
    """
    confidence, correct = _check_confidence(confidence, correct, n_bins)
    confidence, correct = confidence.cpu(), correct.cpu()  # a few numbers per bin, returned as numpy arrays
    idx = _bin_index(confidence, n_bins)
    count = torch.bincount(idx, minlength=n_bins).double()
    hits = torch.bincount(idx, weights=correct.double(), minlength=n_bins)
    conf_sum = torch.bincount(idx, weights=confidence.double(), minlength=n_bins)
    nonempty = count > 0
    nan = torch.full_like(count, float("nan"))
    edges = np.arange(n_bins + 1, dtype=np.float64) / n_bins
    return {
        "lower": edges[:-1],
        "upper": edges[1:],
        "count": count.long().numpy(),
        "accuracy": torch.where(nonempty, hits / count.clamp(min=1), nan).numpy(),
        "confidence": torch.where(nonempty, conf_sum / count.clamp(min=1), nan).numpy(),
    }


def expected_calibration_error(confidence: Tensor, correct: Tensor, n_bins: int = 15) -> float:
    """Count-weighted mean over non-empty equal-width bins on (0, 1] of |accuracy - mean confidence|.

    :param confidence: each point's confidence ``[B]``, in ``[0, 1]``.
    :param correct: whether each point's prediction was right ``[B]`` (bool, or 0/1 integers).
    :param n_bins: how many bins.
    :returns: the expected calibration error, in ``[0, 1]``.
    :raises ValueError: on inputs that :func:`reliability_bins` refuses.
    """
    bins = reliability_bins(confidence, correct, n_bins)
    count = bins["count"]
    nonempty = count > 0
    gaps = np.abs(bins["accuracy"][nonempty] - bins["confidence"][nonempty])
    return float(np.sum(count[nonempty] * gaps) / np.sum(count))


def _confidence_and_correct(log_probs: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    top_lp, pred = predictive_log_probs(log_probs).max(dim=-1)
    return top_lp.exp(), pred == y


def ece(log_probs: Tensor, y: Tensor, n_bins: int = 15) -> float:
    """Expected calibration error of the predictive's top-class probability (:func:`expected_calibration_error`).

    :param log_probs: per-draw log class probabilities ``[S, B, C]``.
    :param y: integer class labels ``[B]``.
    :param n_bins: how many equal-width confidence bins.
    :returns: the expected calibration error, in ``[0, 1]``.
    :raises ValueError: when ``log_probs`` is not ``[S, B, C]`` normalised log-probabilities or ``y`` not ``B``
        labels in ``[0, C)``.
    """
    _check_labels(log_probs, y)
    confidence, correct = _confidence_and_correct(log_probs, y)
    return expected_calibration_error(confidence, correct, n_bins)


def _neg_plogp(log_p: Tensor) -> Tensor:
    # -p log p with the 0 * log 0 = 0 convention (log_p = -inf for impossible classes).
    return torch.where(torch.isneginf(log_p), torch.zeros_like(log_p), -log_p.exp() * log_p)


def predictive_entropy(log_probs: Tensor) -> Tensor:
    """Entropy (nats) of the predictive mean distribution: ``[S, B, C] -> [B]`` (total uncertainty).

    :param log_probs: per-draw log class probabilities ``[S, B, C]``.
    :returns: each point's predictive entropy ``[B]``.
    :raises ValueError: when ``log_probs`` is not ``[S, B, C]`` normalised log-probabilities.
    """
    return _neg_plogp(predictive_log_probs(log_probs)).sum(dim=-1)


def expected_entropy(log_probs: Tensor) -> Tensor:
    """Mean over draws of each draw's entropy (nats): ``[S, B, C] -> [B]`` (aleatoric part).

    :param log_probs: per-draw log class probabilities ``[S, B, C]``.
    :returns: each point's expected entropy ``[B]``.
    :raises ValueError: when ``log_probs`` is not ``[S, B, C]`` normalised log-probabilities.
    """
    _check_log_probs(log_probs)
    return _neg_plogp(log_probs).sum(dim=-1).mean(dim=0)


def mutual_information(log_probs: Tensor) -> Tensor:
    """Predictive entropy minus expected entropy, clamped at 0: ``[S, B, C] -> [B]`` (epistemic part, nats).

    :param log_probs: per-draw log class probabilities ``[S, B, C]``.
    :returns: each point's mutual information between its label and the weights ``[B]``.
    :raises ValueError: when ``log_probs`` is not ``[S, B, C]`` normalised log-probabilities.
    """
    return (predictive_entropy(log_probs) - expected_entropy(log_probs)).clamp(min=0.0)


def max_prob_uncertainty(log_probs: Tensor) -> Tensor:
    """One minus the predictive's top-class probability: ``[S, B, C] -> [B]`` (the max-softmax baseline score).

    :param log_probs: per-draw log class probabilities ``[S, B, C]``.
    :returns: each point's score ``[B]``, in ``[0, 1 - 1/C]``.
    :raises ValueError: when ``log_probs`` is not ``[S, B, C]`` normalised log-probabilities.
    """
    return 1.0 - predictive_log_probs(log_probs).max(dim=-1).values.exp()


def draws_identical(log_probs: Tensor) -> bool:
    """Whether every draw gives the same class probabilities (a point estimate: its mutual information is 0 by
    construction, so MI-based scores say nothing about it).

    :param log_probs: per-draw log class probabilities ``[S, B, C]``.
    :returns: True when all ``S`` draws are identical.
    :raises ValueError: when ``log_probs`` is not ``[S, B, C]`` normalised log-probabilities.
    """
    _check_log_probs(log_probs)
    return bool((log_probs == log_probs[:1]).all())


OOD_SCORES = {"max_prob": max_prob_uncertainty, "entropy": predictive_entropy, "mi": mutual_information}


def _ood_inputs(log_probs_in: Tensor, log_probs_out: Tensor) -> list[str]:
    """Check two sets of per-draw log-probabilities; the OOD scores meaningful for them (no MI for identical draws)."""
    _check_log_probs(log_probs_in, "log_probs_in")
    _check_log_probs(log_probs_out, "log_probs_out")
    c_in, c_out = log_probs_in.shape[-1], log_probs_out.shape[-1]
    if c_in != c_out:
        raise ValueError(f"class count mismatch: log_probs_in has C={c_in} but log_probs_out has C={c_out}")
    if log_probs_in.shape[1] == 0 or log_probs_out.shape[1] == 0:
        raise ValueError(f"need at least one in-distribution and one OOD point; got B={log_probs_in.shape[1]} and "
                         f"B'={log_probs_out.shape[1]}")
    point = draws_identical(log_probs_in) and draws_identical(log_probs_out)
    return [name for name in OOD_SCORES if not (point and name == "mi")]


def ood_auroc(log_probs_in: Tensor, log_probs_out: Tensor) -> dict[str, float]:
    """AUROC of separating OOD (label 1) from in-distribution (label 0) by predictive entropy (``entropy``) and MI;
    ``mi`` is left out when every draw is the same (a point estimate, whose MI is 0 everywhere).

    :param log_probs_in: per-draw log class probabilities on the in-distribution points ``[S, B, C]``.
    :param log_probs_out: the same draws' log class probabilities on the OOD points ``[S, B', C]``.
    :returns: the AUROC by score, ``{"entropy": ..., "mi": ...}``.
    :raises ValueError: when either input is not normalised log-probabilities ``[S, B, C]``, the class counts
        differ, or either set has no points.
    """
    scores = [name for name in _ood_inputs(log_probs_in, log_probs_out) if name != "max_prob"]
    from sklearn.metrics import roc_auc_score  # deferred: importing sklearn costs ~1.5 s, only this function needs it

    labels = np.concatenate([np.zeros(log_probs_in.shape[1]), np.ones(log_probs_out.shape[1])])
    out: dict[str, float] = {}
    for key in scores:
        fn = OOD_SCORES[key]
        values = torch.cat([fn(log_probs_in.double()), fn(log_probs_out.double())]).cpu().numpy()
        out[key] = float(roc_auc_score(labels, values))
    return out


def ood_detection(log_probs_in: Tensor, log_probs_out: Tensor, tpr: float = 0.95) -> dict[str, dict[str, float]]:
    """OOD detection as the field reports it, per uncertainty score (``max_prob``, ``entropy``, ``mi``; ``mi`` left
    out for identical draws): ``auroc`` (OOD as the positive class), ``aupr_in`` (average precision of finding the
    in-distribution points by low uncertainty), ``aupr_out`` (of finding the OOD points by high uncertainty) and
    ``fpr95``: the share of OOD points taken for in-distribution at the threshold that keeps ``tpr`` of the
    in-distribution points.

    :param log_probs_in: per-draw log class probabilities on the in-distribution points ``[S, B, C]``.
    :param log_probs_out: the same draws' log class probabilities on the OOD points ``[S, B', C]``.
    :param tpr: the share of in-distribution points kept at the ``fpr95`` threshold, in ``(0, 1]``.
    :returns: by score, its four figures: ``{"max_prob": {"auroc": ..., "aupr_in": ..., "aupr_out": ...,
        "fpr95": ...}, ...}``.
    :raises ValueError: when ``tpr`` lies outside ``(0, 1]``, either input is not normalised log-probabilities
        ``[S, B, C]``, the class counts differ, or either set has no points.
    """
    if not 0.0 < tpr <= 1.0:
        raise ValueError(f"tpr must lie in (0, 1]; got {tpr!r}")
    scores = _ood_inputs(log_probs_in, log_probs_out)
    from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

    is_out = np.concatenate([np.zeros(log_probs_in.shape[1]), np.ones(log_probs_out.shape[1])])
    out: dict[str, dict[str, float]] = {}
    for key in scores:
        fn = OOD_SCORES[key]
        u = torch.cat([fn(log_probs_in.double()), fn(log_probs_out.double())]).cpu().numpy()
        fpr, tpr_in, _ = roc_curve(1 - is_out, -u)  # in-distribution positive, detected by low uncertainty
        out[key] = {"auroc": float(roc_auc_score(is_out, u)),
                    "aupr_in": float(average_precision_score(1 - is_out, -u)),
                    "aupr_out": float(average_precision_score(is_out, u)),
                    "fpr95": float(fpr[np.searchsorted(tpr_in, tpr - 1e-12)])}
    return out


def classification_metrics(log_probs: Tensor, y: Tensor, n_bins: int = 15) -> dict[str, float]:
    """``accuracy``, ``nll``, ``ece`` and ``brier`` of the predictive, as plain floats.

    :param log_probs: per-draw log class probabilities ``[S, B, C]``.
    :param y: integer class labels ``[B]``.
    :param n_bins: how many equal-width confidence bins the ECE uses.
    :returns: ``{"accuracy": ..., "nll": ..., "ece": ..., "brier": ...}``.
    :raises ValueError: when ``log_probs`` is not ``[S, B, C]`` normalised log-probabilities or ``y`` not ``B``
        labels in ``[0, C)``.
    """
    return {
        "accuracy": accuracy(log_probs, y),
        "nll": nll(log_probs, y),
        "ece": ece(log_probs, y, n_bins),
        "brier": brier(log_probs, y),
    }


# ----------------------------------------------------------------------------------------------------------------------
# regression
# ----------------------------------------------------------------------------------------------------------------------


def regression_metrics(
    loc: Tensor, scale: Tensor, y: Tensor, y_mean: float = 0.0, y_std: float = 1.0
) -> dict[str, float]:
    """``rmse`` of the predictive mean and mixture ``test_ll`` per point, both in original target units.

    :param loc: per-draw Gaussian predictive means ``[S, B]``, standardised target units.
    :param scale: per-draw predictive standard deviations, broadcasting to ``[S, B]`` (e.g. ``[S, 1]``), standardised
        units, positive.
    :param y: the targets ``[B]``, standardised.
    :param y_mean: the mean that standardised the targets, original units (finite; neither metric depends on it).
    :param y_std: the standard deviation that standardised the targets: what maps both metrics to original units.
    :returns: ``{"rmse": ..., "test_ll": ...}``, ``test_ll`` the mean over points of the log predictive density.
    :raises ValueError: when the shapes do not match, ``scale`` is not positive, ``loc`` or ``y`` holds NaN, or
        ``y_mean``/``y_std`` is not finite (``y_std`` not positive).
    """
    loc, scale, y = _check_regression(loc, scale, y, float(y_std))
    if not math.isfinite(float(y_mean)):
        raise ValueError(f"y_mean must be a finite float; got {y_mean!r}")
    # Both metrics are invariant to the shift y_mean; only the scale y_std enters (rmse * y_std, ll - log y_std).
    s = loc.shape[0]
    rmse = torch.sqrt(((loc.mean(dim=0) - y) ** 2).mean()) * y_std
    log_dens = torch.distributions.Normal(loc, scale).log_prob(y.unsqueeze(0))  # [S, B], standardised units
    ll = torch.logsumexp(log_dens, dim=0) - math.log(s) - math.log(y_std)
    return {"rmse": float(rmse), "test_ll": float(ll.mean())}


def mean_and_standard_error(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error std / sqrt(n) over runs (population std, as the UCI benchmark code has it).

    :param values: one figure per run.
    :returns: ``(mean, standard_error)``.
    :raises ValueError: when ``values`` is empty.
    """
    n = len(values)
    if n == 0:
        raise ValueError("mean_and_standard_error needs at least one value")
    mean = sum(values) / n
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / n) / math.sqrt(n)


# ------------------------------------------------------------------------------------------------ two predictives
def coverage(run_y: np.ndarray, reference_y: np.ndarray, level: float = 0.95) -> np.ndarray:
    """Per test input, the reference's predictive mass inside the run's central ``level`` interval.

    :param run_y: samples of y from the run's predictive ``[R, B]``.
    :param reference_y: samples of y from the reference's predictive ``[R', B]``.
    :param level: the probability of the run's central interval (its ends are empirical quantiles of ``run_y``).
    :returns: the share of the reference's samples inside the interval, per test input ``[B]``.
    """
    lo, hi = np.quantile(run_y, [(1 - level) / 2, (1 + level) / 2], axis=0)
    return ((reference_y >= lo) & (reference_y <= hi)).mean(axis=0)


def wasserstein(run_y: np.ndarray, reference_y: np.ndarray) -> np.ndarray:
    """Per test input, the Wasserstein-1 distance between two sets of predictive samples of y.

    :param run_y: samples of y from the run's predictive ``[R, B]``.
    :param reference_y: samples of y from the reference's predictive ``[R', B]``.
    :returns: the distance per test input ``[B]``, in the samples' units.
    """
    return np.array([wasserstein_distance(run_y[:, i], reference_y[:, i]) for i in range(run_y.shape[1])])
