"""Owns the matplotlib figures of the zoo (reliability diagram, 1-D uncertainty bands, pruning curves), saved to files.

Figures are drawn on the non-interactive Agg canvas (``matplotlib.figure.Figure`` + ``FigureCanvasAgg``), never through
pyplot's global figure registry, so importing this module does not change the caller's backend and no figure is left
open. Files are written atomically, as every run file (:func:`zoo.runs.write_atomically`).
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import Tensor

from zoo.metrics import ece, expected_calibration_error, predictive_log_probs, reliability_bins
from zoo.runs import PNG_MARK_KEY, write_atomically

__all__ = ["pruning_curve", "reliability_by_severity", "reliability_diagram", "shift_curves", "uncertainty_band"]

ArrayLike = Tensor | np.ndarray | Sequence[float]

_MAX_DRAWS_SHOWN = 5


def _np(x: ArrayLike) -> np.ndarray:
    if isinstance(x, Tensor):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


class ShownFigure(Figure):
    """A matplotlib figure that a notebook shows when it is a cell's value (as a PNG), with no pyplot involved."""

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
        return buffer.getvalue()


def new_figure(nrows: int, ncols: int, figsize: tuple[float, float], **subplot_kw) -> tuple[Figure, np.ndarray]:
    """A figure on the Agg canvas (no pyplot, no global figure registry) and its ``[nrows, ncols]`` axes; a notebook
    shows it when it is a cell's value (:class:`ShownFigure`)."""
    fig = ShownFigure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, squeeze=False, **subplot_kw)


def save_figure(fig: Figure, path: str | os.PathLike, mark: str | None = None, close: bool = True) -> Path:
    """Save ``fig`` to ``path`` atomically (:func:`zoo.runs.write_atomically`); return the path. A PNG gets ``mark``
    in its ``zoo`` text chunk: what lets the command that wrote it replace it (:func:`zoo.runs.carries_mark`).
    ``close`` clears the figure afterwards (False: it is returned to a notebook and shown)."""
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    metadata = {PNG_MARK_KEY: mark} if mark is not None and fmt == "png" else None
    try:
        return write_atomically(Path(path), lambda tmp: fig.savefig(tmp, format=fmt, dpi=120, bbox_inches="tight",
                                                                    metadata=metadata))
    finally:
        if close:
            fig.clear()


def _reliability_bars(ax, bins: dict[str, np.ndarray]) -> None:
    """Accuracy per confidence bin, its gap to the bin's mean confidence, and the diagonal, on (0, 1)^2."""
    width = bins["upper"][0] - bins["lower"][0]
    centres = (bins["lower"] + bins["upper"]) / 2
    nonempty = bins["count"] > 0
    acc = np.where(nonempty, bins["accuracy"], 0.0)
    conf = np.where(nonempty, bins["confidence"], 0.0)
    ax.bar(centres, acc, width=width, edgecolor="black", color="tab:blue", label="accuracy")
    ax.bar(centres[nonempty], np.abs(conf - acc)[nonempty], bottom=np.minimum(acc, conf)[nonempty], width=width,
           color="tab:red", alpha=0.3, edgecolor="tab:red", hatch="//", label="gap to mean confidence")
    ax.plot([0, 1], [0, 1], "k--", linewidth=1, label="perfect calibration")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)


def reliability_diagram(
    log_probs: Tensor, y: Tensor, path: str | os.PathLike, n_bins: int = 15, title: str = ""
) -> Path:
    """Accuracy per confidence bin against the diagonal, bin counts underneath, ECE in the title; saved to ``path``."""
    ece_value = ece(log_probs, y, n_bins)  # also validates shapes and labels
    top_lp, pred = predictive_log_probs(log_probs).max(dim=-1)
    bins = reliability_bins(top_lp.exp(), pred == y, n_bins)

    fig, axes = new_figure(2, 1, (5, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax, ax_hist = axes[0, 0], axes[1, 0]
    width = 1.0 / n_bins
    centres = (bins["lower"] + bins["upper"]) / 2
    _reliability_bars(ax, bins)
    ax.set_ylabel("accuracy")
    ax.legend(loc="upper left", fontsize="small")
    heading = f"{title} (ECE = {ece_value:.3f})" if title else f"ECE = {ece_value:.3f}"
    ax.set_title(heading)

    ax_hist.bar(centres, bins["count"], width=width, edgecolor="black", color="tab:gray")
    ax_hist.set_xlim(0, 1)
    ax_hist.set_xlabel("confidence (top-class predictive probability)")
    ax_hist.set_ylabel("count")
    return save_figure(fig, path)


def uncertainty_band(
    x_train: ArrayLike,
    y_train: ArrayLike,
    x_grid: ArrayLike,
    loc: ArrayLike,
    scale: ArrayLike,
    path: str | os.PathLike,
    title: str = "",
) -> Path:
    """1-D regression plot: data, predictive mean, ±2 std total and epistemic bands, a few draws; saved to ``path``."""
    xt, yt, xg, loc_np = _np(x_train).ravel(), _np(y_train).ravel(), _np(x_grid).ravel(), _np(loc)
    if xt.shape != yt.shape:
        raise ValueError(f"x_train and y_train must have the same length; got {xt.shape[0]} and {yt.shape[0]}")
    if loc_np.ndim != 2 or loc_np.shape[1] != xg.shape[0] or loc_np.shape[0] == 0:
        raise ValueError(f"loc must have shape [S, G] with G = len(x_grid) = {xg.shape[0]}; got {loc_np.shape}")
    try:
        scale_np = np.broadcast_to(_np(scale), loc_np.shape)
    except ValueError as err:
        raise ValueError(f"scale of shape {np.shape(_np(scale))} does not broadcast to loc's {loc_np.shape}") from err

    order = np.argsort(xg, kind="stable")
    xg, loc_np, scale_np = xg[order], loc_np[:, order], scale_np[:, order]
    mean = loc_np.mean(axis=0)
    epistemic_var = loc_np.var(axis=0)  # population variance over draws
    total_std = np.sqrt((scale_np**2).mean(axis=0) + epistemic_var)  # variance of the Gaussian mixture
    epistemic_std = np.sqrt(epistemic_var)

    fig, axes = new_figure(1, 1, (7, 4))
    ax = axes[0, 0]
    ax.fill_between(xg, mean - 2 * total_std, mean + 2 * total_std, color="tab:blue", alpha=0.2,
                    linewidth=0, label="±2 std (total)")
    ax.fill_between(xg, mean - 2 * epistemic_std, mean + 2 * epistemic_std, color="tab:blue", alpha=0.4,
                    linewidth=0, label="±2 std (epistemic)")
    n_show = min(_MAX_DRAWS_SHOWN, loc_np.shape[0])
    for i in range(n_show):
        label = "posterior draws" if i == 0 else None
        ax.plot(xg, loc_np[i], color="tab:orange", linewidth=0.6, alpha=0.7, label=label)
    ax.plot(xg, mean, color="tab:blue", linewidth=1.8, label="predictive mean")
    ax.scatter(xt, yt, s=10, color="black", zorder=3, label="training data")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    if title:
        ax.set_title(title)
    ax.legend(loc="best", fontsize="small")
    return save_figure(fig, path)


def pruning_curve(
    fractions: ArrayLike, metric_values: Mapping[str, Sequence[float]], path: str | os.PathLike, title: str = ""
) -> Path:
    """Each metric against the fraction of weights pruned, one panel per metric; saved to ``path``."""
    frac = _np(fractions).ravel()
    if not metric_values:
        raise ValueError("metric_values is empty; pass at least one metric name -> list of values")
    for name, values in metric_values.items():
        if len(values) != frac.shape[0]:
            raise ValueError(f"metric {name!r} has {len(values)} values but there are {frac.shape[0]} fractions")

    n = len(metric_values)
    fig, axes = new_figure(1, n, (4 * n, 3.5))
    for ax, (name, values) in zip(axes[0], metric_values.items(), strict=True):
        ax.plot(frac, _np(values), marker="o")
        ax.set_xlabel("fraction pruned")
        ax.set_ylabel(name)
        ax.set_title(name)
        ax.grid(True, alpha=0.3)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)


SHIFT_METRICS = (("accuracy", "accuracy"), ("nll", "NLL"), ("ece", "ECE"))


def shift_curves(curves: Mapping[str, Mapping[float, Mapping[str, float]]], path: str | os.PathLike,
                 title: str = "", xlabel: str = "severity (0 = clean)") -> Path:
    """Accuracy, NLL and ECE against the shift's severity (or angle), one line per member: ``curves[member][level]``
    holds that level's metrics (means over the corruption types)."""
    fig, axes = new_figure(1, len(SHIFT_METRICS), (4.2 * len(SHIFT_METRICS), 3.6))
    styles = _distinct_styles(len(curves))
    for ax, (key, label) in zip(axes[0], SHIFT_METRICS, strict=True):
        for (member, levels), style in zip(curves.items(), styles, strict=True):
            xs = sorted(levels)
            ax.plot(xs, [levels[x][key] for x in xs], markersize=3, label=member, **style)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    # beside the panels, not over one: a dozen members' legend would hide a panel's lines
    fig.subplots_adjust(wspace=0.3)
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="center left", fontsize="small", frameon=False,
               bbox_to_anchor=(axes[0, -1].get_position().x1 + 0.01, 0.5))
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)


def _distinct_styles(n: int) -> list[dict]:
    """``n`` line styles no two alike: up to 10 colours of ``tab10`` with a solid line, then ``tab20``'s 20 colours
    with solid, dashed and dotted lines and changing markers (a repeated colour alone would make two lines one)."""
    from matplotlib import colormaps

    if n <= 10:
        return [{"color": colormaps["tab10"](i), "marker": "o"} for i in range(n)]
    lines, markers = ("-", "--", ":"), ("o", "s", "^", "D")
    return [{"color": colormaps["tab20"](i % 20), "linestyle": lines[(i // 20) % 3], "marker": markers[i % 4]}
            for i in range(n)]


def reliability_by_severity(confidence: Mapping[float, ArrayLike], correct: Mapping[float, ArrayLike],
                            path: str | os.PathLike, n_bins: int = 15, title: str = "",
                            level_name: str = "severity") -> Path:
    """One reliability diagram per severity (clean first), each pooling every corruption type at that severity."""
    levels = sorted(confidence)
    fig, axes = new_figure(1, len(levels), (3.0 * len(levels), 3.2), sharey=True)
    for ax, level in zip(axes[0], levels, strict=True):
        conf, hits = torch.as_tensor(_np(confidence[level])), torch.as_tensor(np.asarray(correct[level]), dtype=bool)
        _reliability_bars(ax, reliability_bins(conf, hits, n_bins))
        ece_value = expected_calibration_error(conf, hits, n_bins)
        ax.set_title(f"{'clean' if level == 0 else f'{level_name} {level:g}'}\nECE {ece_value:.3f}", fontsize="small")
        ax.set_xlabel("confidence")
    axes[0, 0].set_ylabel("accuracy")
    if title:
        fig.suptitle(title, y=1.08)
    return save_figure(fig, path)
