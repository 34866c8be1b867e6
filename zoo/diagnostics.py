"""Owns the checks of a fitted posterior: ArviZ InferenceData, R-hat/ESS, divergences, BFMI, PSIS k-hat, HMC vs VI.

Every run converts to one :class:`arviz.InferenceData` (:func:`to_inference_data`): the latent sites with named dims,
two function-space summaries (``f_test`` at a few test inputs, ``lp`` = the model's log joint), the posterior
predictive and the pointwise log-likelihood at the training inputs, sampler statistics and the observed targets.
MCMC runs keep their chains; draws of a guide are one chain of iid draws. :func:`diagnose` checks a run directory
and writes ``posterior.nc``, ``diagnostics.json``, ``summary.csv`` and plots into it; :func:`compare` measures how
far runs' predictive distributions on the test inputs are from a reference run's (usually HMC/NUTS).

Warnings are never hidden (a red line in the report, and the ``warnings`` list): divergences > 0, R-hat > 1.01,
BFMI < 0.3, bulk/tail ESS < 400 on the function-space summaries (MCMC), Pareto k-hat of a guide > 0.7. R-hat of
the weights themselves is reported as a note, not a warning: a BNN's posterior is symmetric under permuting hidden
units (and flipping their signs for odd activations), so chains in equivalent modes disagree in weight space
however well each has mixed; convergence is judged in function space (Izmailov et al. 2021).

``f_test`` is the predictive mean (regression) or the log-probability of the class the mean predictive picks
(classification); a rank-1 BNN's draw predicts with the uniform mixture of its members. Units: ``f_test`` of a
regression run, the posterior predictive and the observed ``y`` are in original target
units, and so is the pointwise log-likelihood (the model's own term minus log ``y_std``, as ``test_ll`` in
metrics.json), so ``az.loo`` reports an elpd comparable across runs. ``lp`` is the model's own log joint
log p(w, y | x), in the standardised units the model is written in.
"""

from __future__ import annotations

import csv
import io
import json
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import arviz as az
import numpy as np
import pyro
import pyro.distributions as dist
import torch
import xarray as xr
from pyro import poutine
from rich.console import RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from scipy.stats import wasserstein_distance

from zoo.data.base import Dataset
from zoo.errors import ZooInputError
from zoo.inference.mcmc import SAMPLES_FILE, LogJoint, load_samples
from zoo.likelihoods import PredictiveDraws
from zoo.models.base import LatentSite
from zoo.pipeline import load_run
from zoo.plots import new_figure, save_figure
from zoo.posterior import GuidePosterior, Posterior
from zoo.runs import METRICS_FILE, checkpoint_exists, write_atomically, write_json, write_text

INFERENCE_DATA_FILE = "posterior.nc"
DIAGNOSTICS_FILE = "diagnostics.json"
SUMMARY_FILE = "summary.csv"
TRACE_PLOT, ENERGY_PLOT, PAIR_PLOT, COMPARE_PLOT = "trace.png", "energy.png", "pair.png", "compare.png"

FUNCTION_SUMMARIES = ("f_test", "lp")
VI_DRAWS = 200  # iid draws of a guide when no count is given
COMPARE_DRAWS = 200
Y_SAMPLES = 2000  # predictive samples of y per test input for coverage and W1 (several per weight draw)
# Vehtari et al. (2021): rank-normalised R-hat <= 1.01 and bulk/tail ESS > 400 before trusting MCMC summaries
RHAT_MAX, ESS_MIN, BFMI_MIN, KHAT_MAX = 1.01, 400.0, 0.3, 0.7
WORST_SHOWN, PAIR_WEIGHTS = 10, 4
QUANTILES = {"min": 0.0, "5%": 0.05, "50%": 0.5, "95%": 0.95, "max": 1.0}
METRIC_KEYS = ("accuracy", "nll", "ece", "rmse", "test_ll")


# ------------------------------------------------------------------------------------------ InferenceData
def site_dims(name: str, site: LatentSite, shape: Sequence[int] | None = None) -> list[str]:
    """Named dims of a site: ``hidden0.weight`` -> ``hidden0.weight_out, hidden0.weight_in``; a plate dim is shared."""
    shape = list(site.shape if shape is None else shape)
    dims = []
    if site.plate is not None and shape:
        dims.append(site.plate[0])  # e.g. "members": one dim shared by every site in the plate
        shape = shape[1:]
    roles = {("weight", 2): ["out", "in"], ("weight", 4): ["out", "in", "kh", "kw"], ("bias", 1): ["out"]}
    kind = name.rsplit(".", 1)[-1]
    names = roles.get((kind, len(shape)), ["unit"] if len(shape) == 1 else [f"dim{i}" for i in range(len(shape))])
    return dims + [f"{name}_{role}" for role in names]


def pick_test_points(data: Dataset, count: int = 8) -> np.ndarray:
    """``count`` test-set indices spread over the test set (over the sorted input for 1-D inputs)."""
    n = len(data.x_test)
    order = torch.argsort(data.x_test[:, 0]).cpu().numpy() if data.in_dim == 1 else np.arange(n)
    picks = np.unique(np.linspace(0, n - 1, min(count, n)).round().astype(int))
    return order[picks]


def _chunked(fn: Callable[[dict, slice], torch.Tensor], draws: dict[str, torch.Tensor], size: int = 64) -> torch.Tensor:
    total = next(iter(draws.values())).shape[0]
    parts = [fn({n: v[i:i + size] for n, v in draws.items()}, slice(i, i + size)) for i in range(0, total, size)]
    return torch.cat(parts)


def log_joint(posterior: Posterior, data: Dataset, draws: dict[str, torch.Tensor]) -> torch.Tensor:
    """log p(w, y | x) of the model on the full training set at S draws ``{site: [S, ...]}``: ``[S]``."""
    joint = LogJoint(posterior.family, data.x_train, data.y_train)
    with torch.no_grad(), pyro.validation_enabled(False):
        joint.verify({n: v[:4] for n, v in draws.items()})  # the batched form, checked against the traced model
        return _chunked(lambda d, _: joint(d), draws)


def pointwise_log_likelihood(posterior: Posterior, data: Dataset, draws: dict[str, torch.Tensor],
                             rows: int = 4096) -> torch.Tensor:
    """log p(y_i | x_i, w_s) on the training set ``[S, N]``; regression in original units (minus log ``y_std``)."""
    family = posterior.family

    def one(d: dict[str, torch.Tensor], _) -> torch.Tensor:
        return torch.cat([family.log_likelihood(d, xb, yb) for xb, yb in
                          zip(data.x_train.split(rows), data.y_train.split(rows), strict=True)], dim=1)

    with torch.no_grad(), pyro.validation_enabled(False):
        ll = _chunked(one, draws)
    return ll - math.log(data.y_std) if data.task == "regression" else ll


def per_draw_mixture(pred, num_draws: int) -> tuple[torch.Tensor, ...]:
    """Each draw's predictive as a uniform mixture of its rows ``[S, K, B, ...]`` (K = 1, or a rank-1 BNN's members).

    Classification: ``(log_probs [S, K, B, C],)``; regression: ``(loc, scale)``, each ``[S, K, B]``.
    """
    if pred.log_probs is not None:
        return (pred.log_probs.unflatten(0, (num_draws, -1)),)
    scale = pred.scale.expand_as(pred.loc)
    return pred.loc.unflatten(0, (num_draws, -1)), scale.unflatten(0, (num_draws, -1))


def replicate_y(pred, num_draws: int, data: Dataset, generator: torch.Generator) -> np.ndarray:
    """One y per draw and input from the draw's predictive ``[S, B]`` (original units, or class labels)."""
    if data.task == "regression":
        loc, scale = (t.detach().cpu().double() for t in per_draw_mixture(pred, num_draws))
        member = torch.randint(loc.shape[1], (num_draws, 1, loc.shape[2]), generator=generator)
        loc, scale = loc.gather(1, member)[:, 0], scale.gather(1, member)[:, 0]
        eps = torch.randn(loc.shape, generator=generator, dtype=torch.float64)
        return ((loc + scale * eps) * data.y_std + data.y_mean).numpy()
    (members,) = per_draw_mixture(pred, num_draws)
    log_probs = members.detach().cpu().double().logsumexp(1) - math.log(members.shape[1])
    u = torch.rand(log_probs.shape, generator=generator, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
    return (log_probs - (-u.log()).log()).argmax(-1).numpy()  # Gumbel-max: one class per draw


def _thin(chains: dict[str, torch.Tensor], num_samples: int | None) -> np.ndarray:
    """Stored draw indices kept per chain: all, or every k-th so that about ``num_samples`` remain in all."""
    n_chains, n_draws = next(iter(chains.values())).shape[:2]
    if num_samples is None or num_samples >= n_chains * n_draws:
        return np.arange(n_draws)
    stride = math.ceil(n_draws / max(1, math.ceil(num_samples / n_chains)))
    return np.arange(0, n_draws, stride)


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def to_inference_data(
    posterior: Posterior,
    data: Dataset,
    chains: dict[str, torch.Tensor] | None = None,
    num_samples: int | None = None,
    stats: dict[str, torch.Tensor] | None = None,
    seed: int = 0,
    num_test_points: int = 8,
    attrs: dict[str, Any] | None = None,
) -> az.InferenceData:
    """ArviZ InferenceData of a posterior: latent sites, ``f_test``, ``lp``, predictive, log-likelihood, stats.

    ``chains`` are MCMC draws ``{site: [chains, draws, *shape]}`` (``stats``: the sampler's ``[chains, draws]``
    statistics); ``num_samples`` thins each chain evenly (default: keep every draw). Without ``chains``,
    ``num_samples`` (default 200) iid draws of ``posterior`` form one chain. Seeded: same inputs, same draws.
    """
    if num_samples is not None and num_samples < 1:
        raise ZooInputError("--samples", num_samples, "use a positive number of posterior draws")
    pyro.set_rng_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    if chains is not None:
        keep = _thin(chains, num_samples)
        index = torch.as_tensor(keep, device=next(iter(chains.values())).device)
        draws = {n: v.index_select(1, index) for n, v in chains.items()}
        kept_stats = {k: v.index_select(1, index.to(v.device)) for k, v in (stats or {}).items()}
        kind = "mcmc"
    else:
        draws = {n: v.unsqueeze(0) for n, v in posterior.sample(num_samples or VI_DRAWS).items()}
        kept_stats, keep, kind = {}, None, "iid"
    n_chains, n_draws = next(iter(draws.values())).shape[:2]
    flat = {n: v.flatten(0, 1) for n, v in draws.items()}

    def per_chain(values: np.ndarray) -> np.ndarray:
        return values.reshape(n_chains, n_draws, *values.shape[1:])

    # function-space summaries at a few test inputs
    picks = pick_test_points(data, num_test_points)
    pick_index = torch.as_tensor(picks, device=data.x_test.device)
    total = n_chains * n_draws
    mixture = per_draw_mixture(posterior.predict(data.x_test.index_select(0, pick_index), draws=flat), total)
    extra_coords: dict[str, tuple[str, np.ndarray]] = {}
    if data.task == "regression":  # the draw's predictive mean (its members' average for a rank-1 BNN)
        f_test = _numpy(mixture[0].mean(1)).astype(np.float64) * data.y_std + data.y_mean
    else:
        log_probs = mixture[0].logsumexp(1) - math.log(mixture[0].shape[1])  # [S, B, C]
        predicted = log_probs.exp().mean(0).argmax(-1)  # the class of the mean predictive, fixed per input
        f_test = _numpy(log_probs.gather(-1, predicted[None, :, None].expand(total, -1, 1))[..., 0])
        extra_coords["predicted_class"] = ("test_point", _numpy(predicted))
    if data.in_dim == 1:
        x_raw = data.inputs_in_original_units(data.x_test.index_select(0, pick_index))[:, 0]
        extra_coords["test_x"] = ("test_point", _numpy(x_raw).astype(np.float64))
    lp = _numpy(log_joint(posterior, data, flat)).astype(np.float64)

    # training-set groups
    ll = _numpy(pointwise_log_likelihood(posterior, data, flat))
    y_rep = replicate_y(posterior.predict(data.x_train, draws=flat), total, data, generator)
    y_obs = _numpy(data.y_train)
    y_obs = y_obs.astype(np.float64) * data.y_std + data.y_mean if data.task == "regression" else y_obs

    sites = posterior.family.latent_sites()
    post = {n: _numpy(v) for n, v in draws.items()}
    dims = {n: site_dims(n, sites[n], v.shape[2:]) for n, v in post.items() if n in sites}
    post.update(f_test=per_chain(f_test), lp=per_chain(lp))
    dims.update(f_test=["test_point"], y=["train_point"])
    sample_stats = {k: _numpy(v) for k, v in kept_stats.items()}
    if "diverging" in sample_stats:
        sample_stats["diverging"] = sample_stats["diverging"].astype(bool)
    sample_stats["lp"] = per_chain(lp)
    idata = az.from_dict(
        posterior=post, posterior_predictive={"y": per_chain(y_rep)}, log_likelihood={"y": per_chain(ll)},
        sample_stats=sample_stats, observed_data={"y": y_obs}, dims=dims,
        coords={"test_point": picks, "train_point": np.arange(len(y_obs))},
    )
    idata.posterior = idata.posterior.assign_coords(extra_coords)
    idata.posterior.attrs.update({
        "draws": kind, "task": data.task, "data": data.name, "y_units": "original",
        "lp": "log p(w, y | x) of the model (standardised target units)",
        **({"thinned_stride": int(keep[1] - keep[0]) if len(keep) > 1 else 1} if keep is not None else {}),
        **(attrs or {}),
    })
    return idata


def save_inference_data(idata: az.InferenceData, run_dir: str | Path) -> Path:
    """Write ``idata`` as netCDF to ``run_dir/posterior.nc`` atomically (temp file, fsync, rename)."""
    return write_atomically(Path(run_dir) / INFERENCE_DATA_FILE, lambda tmp: idata.to_netcdf(tmp, engine="h5netcdf"))


# ------------------------------------------------------------------------------------------ PSIS of a guide
def guide_log_density(guide: torch.nn.Module,
                      draws: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list[str], list[str]]:
    """log q(w_s) of the guide at each of S draws ``[S]`` (traced, conditioned on each draw, with each site's scale
    and mask as the guide declares them), its point-mass (Delta) sites, and its sites whose terms are scaled."""
    total = next(iter(draws.values())).shape[0]
    values, point_mass, scaled = [], set(), set()
    with torch.no_grad(), pyro.validation_enabled(False):
        for s in range(total):
            conditioned = poutine.condition(guide, data={n: v[s] for n, v in draws.items()})
            trace = poutine.trace(conditioned).get_trace()
            values.append(trace.log_prob_sum())
            for name, site in trace.nodes.items():
                fn = site.get("fn")
                if site["type"] == "sample" and isinstance(getattr(fn, "base_dist", fn), dist.Delta):
                    point_mass.add(name)
                if site["type"] == "sample" and not site["is_observed"] and float(site["scale"]) != 1.0:
                    scaled.add(name)
    return torch.stack(values), sorted(point_mass), sorted(scaled)


def khat_interpretation(k: float) -> str:
    """The usual reading of a PSIS Pareto k-hat (Vehtari et al.; Yao et al. 2018 for VI)."""
    if k < 0.5:
        return "good: q covers the posterior; importance-weighted estimates are reliable"
    if k <= KHAT_MAX:
        return "ok: usable, though importance-weighted estimates converge slowly"
    if k < 1.0:
        return "bad: q misses posterior mass (too narrow or misplaced); estimates from q are unreliable"
    return "very bad: the importance weights have infinite variance; q is far from the posterior"


def pareto_k(guide: torch.nn.Module, draws: dict[str, torch.Tensor], lp: torch.Tensor) -> dict[str, Any]:
    """PSIS k-hat of a guide from S draws of it and the log joint there: log w = log p(w, y | x) - log q(w)."""
    log_q, point_mass, scaled = guide_log_density(guide, draws)
    if point_mass:
        return {"k_hat": None, "num_draws": int(len(lp)), "interpretation": "undefined: q has point-mass "
                f"(Delta) sites ({', '.join(point_mass[:3])}{', ...' if len(point_mass) > 3 else ''}), so it "
                "has no density against the posterior and importance sampling from it is impossible"}
    log_w = (lp.double().cpu() - log_q.double().cpu()).numpy()
    if not np.isfinite(log_w).all():
        return {"k_hat": math.inf, "num_draws": int(len(lp)), "interpretation": khat_interpretation(math.inf)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, k = az.psislw(log_w, reff=1.0)  # iid draws from q: relative efficiency 1
    k = float(np.asarray(k))
    out = {"k_hat": k, "num_draws": int(len(lp)), "interpretation": khat_interpretation(k)}
    if scaled:  # e.g. a rank-1 BNN's members plate: model and guide average the members' terms (scale 1/K)
        out["caveat"] = (f"the model and q scale the terms of {len(scaled)} sites ({scaled[0]}, ...), e.g. "
                         "averaging ensemble members: log w compares those scaled (tempered) densities, so k-hat "
                         "reads optimistic")
    return out


# ------------------------------------------------------------------------------------------ checks
def _quiet(fn: Callable[[], Any]) -> Any:
    """ArviZ's stats on constant draws divide by zero (R-hat nan/inf): that is reported, not warned about."""
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore")
        return fn()


def _float(value: Any) -> float:
    return float(np.asarray(value))


def _function_rows(post: xr.Dataset, with_rhat: bool) -> list[dict[str, Any]]:
    """One row per ``f_test`` element and ``lp``: mean, sd, 5%/95%, R-hat, bulk/tail ESS, MCSE of the mean."""
    ds = post[list(FUNCTION_SUMMARIES)]
    rhat = _quiet(lambda: az.rhat(ds, method="rank")) if with_rhat else None
    bulk, tail = _quiet(lambda: az.ess(ds, method="bulk")), _quiet(lambda: az.ess(ds, method="tail"))
    mcse = _quiet(lambda: az.mcse(ds, method="mean"))
    rows = []
    for name in FUNCTION_SUMMARIES:
        values = ds[name]
        points = values["test_point"].values if "test_point" in values.dims else [None]
        for point in points:
            sel = {} if point is None else {"test_point": point}
            v = values.sel(sel).values.reshape(-1)
            rows.append({
                "variable": name if point is None else f"{name}[{int(point)}]",
                "mean": float(v.mean()), "sd": float(v.std(ddof=1)) if v.size > 1 else 0.0,
                "q5": float(np.quantile(v, 0.05)), "q95": float(np.quantile(v, 0.95)),
                "r_hat": _float(rhat[name].sel(sel)) if rhat is not None else None,
                "ess_bulk": _float(bulk[name].sel(sel)), "ess_tail": _float(tail[name].sel(sel)),
                "mcse_mean": _float(mcse[name].sel(sel)),
            })
    return rows


def _stat_quantiles(values: np.ndarray) -> dict[str, float | None]:
    """min/5%/50%/95%/max of the defined values (an interpolation between two infinite R-hats stays infinite)."""
    defined = values[~np.isnan(values)]
    if not defined.size:
        return dict.fromkeys(QUANTILES)
    with np.errstate(invalid="ignore"):
        linear = np.quantile(defined, list(QUANTILES.values()))
    linear = np.where(np.isnan(linear), np.quantile(defined, list(QUANTILES.values()), method="nearest"), linear)
    return {k: float(v) for k, v in zip(QUANTILES, linear, strict=True)}


def weight_elements(post: xr.Dataset) -> list[tuple[str, tuple[int, ...]]]:
    """Every (site, index) element of the latent sites in ``post``, site after site in C order."""
    out = []
    for name in post.data_vars:
        if name not in FUNCTION_SUMMARIES:
            shape = post[name].shape[2:]
            out.extend((str(name), tuple(int(i) for i in idx)) for idx in np.ndindex(*shape))
    return out


def _weight_summary(post: xr.Dataset, with_rhat: bool) -> dict[str, Any]:
    """Quantiles of R-hat and bulk ESS over all latent-site elements, and the worst ten by R-hat (never all rows)."""
    names = [n for n in post.data_vars if n not in FUNCTION_SUMMARIES]
    ds = post[names]
    bulk = _quiet(lambda: az.ess(ds, method="bulk"))
    ess = np.concatenate([np.asarray(bulk[n].values, dtype=float).reshape(-1) for n in names])
    out: dict[str, Any] = {"n_elements": int(ess.size), "ess_bulk_quantiles": _stat_quantiles(ess)}
    if not with_rhat:
        out.update(r_hat_quantiles=None, worst=[], r_hat_undefined=None)
        return out
    rhat_ds = _quiet(lambda: az.rhat(ds, method="rank"))
    rhat = np.concatenate([np.asarray(rhat_ds[n].values, dtype=float).reshape(-1) for n in names])
    elements = weight_elements(post)
    order = np.argsort(np.where(np.isnan(rhat), -np.inf, rhat))[::-1][:WORST_SHOWN]
    out.update(
        r_hat_quantiles=_stat_quantiles(rhat),
        r_hat_undefined=int(np.isnan(rhat).sum()),  # constant in every chain (e.g. pruned): no information
        n_r_hat_over=int((rhat > RHAT_MAX).sum()),
        worst=[{"site": elements[i][0], "index": list(elements[i][1]), "r_hat": float(rhat[i]),
                "ess_bulk": float(ess[i])} for i in order if not np.isnan(rhat[i])],
    )
    return out


def sampler_checks(stats: dict[str, np.ndarray]) -> dict[str, Any]:
    """Divergences (count, fraction) and BFMI per chain from MCMC statistics ``[chains, draws]``."""
    out: dict[str, Any] = {}
    if "diverging" in stats:
        diverging = np.asarray(stats["diverging"]).astype(bool)
        out["divergences"] = {"count": int(diverging.sum()), "fraction": float(diverging.mean()),
                              "per_chain": [int(c) for c in diverging.sum(axis=1)]}
    if "energy" in stats:
        energy = np.asarray(stats["energy"], dtype=float)
        out["bfmi"] = [float(b) for b in _quiet(lambda: az.bfmi(energy))] if energy.shape[1] > 1 else []
    return out


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return f"{value:.{digits}f}"


def check(idata: az.InferenceData, pareto: dict[str, Any] | None = None,
          stats: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """Every diagnostic of ``idata`` with its warnings: R-hat/ESS, divergences, BFMI, Pareto k-hat (``pareto``).

    ``stats`` (all stored MCMC statistics, ``[chains, draws]``) replaces ``idata.sample_stats`` for counting
    divergences and BFMI when the draws in ``idata`` were thinned.
    """
    post = idata.posterior
    n_chains, n_draws = int(post.sizes["chain"]), int(post.sizes["draw"])
    mcmc = post.attrs.get("draws", "mcmc") != "iid"
    with_rhat = mcmc and n_chains >= 2
    result: dict[str, Any] = {"draws": "mcmc" if mcmc else "iid", "num_chains": n_chains, "num_draws": n_draws,
                              "function_space": _function_rows(post, with_rhat), "notes": []}
    warnings_: list[str] = []
    checks: list[dict[str, Any]] = []

    def add(name: str, value: float | None, threshold: str, ok: bool, message: str | None = None) -> None:
        checks.append({"check": name, "value": value, "threshold": threshold, "ok": bool(ok)})
        if not ok:
            warnings_.append(message or f"{name} = {_fmt(value)} (want {threshold})")

    rows = result["function_space"]
    if with_rhat:
        worst = max(rows, key=lambda r: -math.inf if math.isnan(r["r_hat"]) else r["r_hat"])
        bad = [r for r in rows if r["r_hat"] > RHAT_MAX]
        add("R-hat, function space and lp (max)", worst["r_hat"], f"<= {RHAT_MAX}", not bad,
            f"R-hat > {RHAT_MAX} on {len(bad)} of {len(rows)} function-space summaries (worst {_fmt(worst['r_hat'])} "
            f"at {worst['variable']}): the chains disagree; run longer or more chains, or the posterior is multimodal")
    elif mcmc:
        result["notes"].append("one chain: R-hat needs at least two chains")
    if mcmc:
        low = min(rows, key=lambda r: min(r["ess_bulk"], r["ess_tail"]))
        value = min(low["ess_bulk"], low["ess_tail"])
        add("bulk/tail ESS, function space and lp (min)", value, f">= {ESS_MIN:.0f}", value >= ESS_MIN,
            f"ESS {value:.1f} < {ESS_MIN:.0f} at {low['variable']}: too few effective draws for reliable "
            "summaries; draw more")
        result["weights"] = _weight_summary(post, with_rhat)
        w = result["weights"]
        if with_rhat and w["r_hat_quantiles"]["max"] is not None and w["n_r_hat_over"]:
            top = w["worst"][0]
            result["notes"].append(
                f"R-hat > {RHAT_MAX} on {w['n_r_hat_over']} of {w['n_elements']} latent-site elements (worst "
                f"{_fmt(top['r_hat'])} at {top['site']}{top['index']}): the chains sit in different weight-space "
                "modes (hidden units permuted or sign-flipped give the same function); not a failed check, since "
                "convergence is judged on the function-space summaries")
    else:
        result["weights"] = None
        result["notes"].append("iid draws from the approximation q: R-hat and ESS only measure Monte Carlo noise of "
                               "these draws, not how well q fits; the Pareto k-hat does")

    sample_stats = stats
    if sample_stats is None and "sample_stats" in idata.groups():
        sample_stats = {k: idata.sample_stats[k].values for k in ("diverging", "energy")
                        if k in idata.sample_stats}
    sampler = sampler_checks(sample_stats or {}) if mcmc else {}
    result.update(sampler)
    if "divergences" in sampler:
        d = sampler["divergences"]
        add(f"divergences (count; {100 * d['fraction']:.2f}% of draws)", float(d["count"]), "= 0", d["count"] == 0,
            f"{d['count']} divergent transitions ({100 * d['fraction']:.1f}% of draws): the sampler could not follow "
            "the posterior's curvature and the draws may be biased; raise inference.target_accept_prob or "
            "reparameterise")
    for chain, value in enumerate(sampler.get("bfmi", [])):
        add(f"BFMI chain {chain}", value, f">= {BFMI_MIN}", value >= BFMI_MIN,
            f"BFMI {value:.3f} < {BFMI_MIN} in chain {chain}: momentum resampling explores the energy poorly "
            "(heavy tails or a poorly adapted mass matrix)")

    if pareto is not None:
        result["pareto_k"] = pareto
        k = pareto["k_hat"]
        if pareto.get("caveat"):
            result["notes"].append(f"PSIS k-hat: {pareto['caveat']}")
        if k is None:
            result["notes"].append(f"PSIS k-hat {pareto['interpretation']}")
        else:
            add("PSIS Pareto k-hat of q", k, f"<= {KHAT_MAX}", k <= KHAT_MAX,
                f"Pareto k-hat {_fmt(k, 2)} > {KHAT_MAX}: {pareto['interpretation']}")
    result["checks"], result["warnings"] = checks, warnings_
    return result


def verdict(result: dict[str, Any]) -> str:
    """One line on whether MCMC draws passed every check of :func:`check` (what ``zoo train`` ends with)."""
    rows = result["function_space"]
    r_hats = [r["r_hat"] for r in rows if r["r_hat"] is not None]
    ess = min(min(r["ess_bulk"], r["ess_tail"]) for r in rows)
    divergences = result.get("divergences", {}).get("count", 0)
    figures = (f"function-space R-hat max {_fmt(max(r_hats)) if r_hats else 'n/a'} (<= {RHAT_MAX}), min bulk/tail "
               f"ESS {_fmt(ess, 0)} (>= {ESS_MIN:.0f}), {divergences} divergences")
    if not result["warnings"]:
        return f"converged: {figures}"
    return (f"NOT CONVERGED: {figures}; {len(result['warnings'])} check(s) failed (above). Do not use these draws as "
            "a reference: run more warm-up and draws (or more chains) and check again with zoo diagnose --strict")


# ------------------------------------------------------------------------------------------ plots
def plot_trace(idata: az.InferenceData, path: str | Path) -> Path:
    """Density and rank bars (MCMC; a plain trace for iid draws) of every function-space summary."""
    rows = int(idata.posterior.sizes["test_point"]) + 1
    fig, axes = new_figure(rows, 2, (10, 1.8 * rows))
    fig.subplots_adjust(hspace=0.9, wspace=0.25, top=1 - 0.4 / rows, bottom=0.3 / rows)
    kind = "rank_bars" if idata.posterior.sizes["chain"] > 1 else "trace"
    with az.rc_context({"plot.max_subplots": 2 * rows + 2}):
        _quiet(lambda: az.plot_trace(idata, var_names=list(FUNCTION_SUMMARIES), kind=kind, compact=False,
                                     axes=axes))
    return save_figure(fig, path)


def plot_energy(idata: az.InferenceData, path: str | Path) -> Path:
    """Marginal energy vs energy transition distributions (MCMC)."""
    fig, axes = new_figure(1, 1, (6, 4))
    _quiet(lambda: az.plot_energy(idata, ax=axes[0, 0]))
    return save_figure(fig, path)


def plot_pair(idata: az.InferenceData, elements: list[tuple[str, tuple[int, ...]]], path: str | Path) -> Path | None:
    """Pair plot of a few latent-site elements (divergent draws marked for MCMC); None with fewer than two."""
    if len(elements) < 2:
        return None
    post = idata.posterior
    chosen = xr.Dataset({f"{site}{list(index)}": post[site].isel(dict(zip(post[site].dims[2:], index, strict=True)),
                                                                     drop=True)
                         for site, index in elements})
    groups = {"posterior": chosen}
    divergences = "sample_stats" in idata.groups() and "diverging" in idata.sample_stats
    if divergences:
        groups["sample_stats"] = idata.sample_stats
    n = len(elements)
    fig, axes = new_figure(n - 1, n - 1, (2.6 * n, 2.6 * n))
    _quiet(lambda: az.plot_pair(az.InferenceData(**groups), kind="scatter", divergences=divergences,
                                ax=axes if n > 2 else axes[0, 0]))
    return save_figure(fig, path)


# ------------------------------------------------------------------------------------------ diagnose
def jsonable(obj: Any) -> Any:
    """Plain JSON values: numpy scalars to floats/ints, NaN and inf to None."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _csv(rows: list[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: ("" if v is None else v) for k, v in row.items()} for row in rows)
    return buffer.getvalue()


def _method(spec) -> str:
    method = spec.inference.method
    return f"{method}/{spec.guide.name}" if method == "svi" else method


def diagnose(run_dir: str | Path, num_samples: int | None = None, plots: bool = True) -> dict[str, Any]:
    """Check a run directory's posterior; write posterior.nc, diagnostics.json, summary.csv and plots into it.

    MCMC runs: R-hat, bulk/tail ESS, divergences, BFMI per chain, on every stored draw (``num_samples`` thins
    each chain; divergences and BFMI are still counted on all stored draws). Guide (VI) runs: ``num_samples``
    (default 200) iid draws of q and the PSIS Pareto k-hat of q against the model's log joint.
    """
    run = Path(run_dir)
    spec, data, posterior = load_run(run)
    attrs = {"method": _method(spec), "family": spec.model.family, "run_dir": str(run)}
    full_stats = None
    if checkpoint_exists(run / SAMPLES_FILE):
        result = load_samples(run, posterior.family, data.x_train.device)
        idata = to_inference_data(posterior, data, chains=result.draws, stats=result.stats, num_samples=num_samples,
                                  seed=spec.seed, attrs=attrs)
        full_stats = {k: _numpy(v) for k, v in result.stats.items()}
    else:
        idata = to_inference_data(posterior, data, num_samples=num_samples, seed=spec.seed, attrs=attrs)
    pareto = None
    if isinstance(posterior, GuidePosterior):
        draws = {n: torch.tensor(idata.posterior[n].values[0], device=data.x_train.device)
                 for n in posterior.family.latent_sites()}
        lp = torch.tensor(idata.posterior["lp"].values[0])
        pareto = pareto_k(posterior.guide, draws, lp)
    out = check(idata, pareto, full_stats)
    out = {"run_dir": str(run), "method": attrs["method"], "family": attrs["family"], "data": data.name, **out}

    files = {"inference_data": str(save_inference_data(idata, run))}
    files["summary"] = str(write_text(run / SUMMARY_FILE, _csv(out["function_space"])))
    if plots:
        files["trace"] = str(plot_trace(idata, run / TRACE_PLOT))
        if out["draws"] == "mcmc" and "energy" in idata.sample_stats:
            files["energy"] = str(plot_energy(idata, run / ENERGY_PLOT))
        worst = [(w["site"], tuple(w["index"])) for w in (out["weights"] or {}).get("worst", [])]
        pair = plot_pair(idata, (worst or weight_elements(idata.posterior))[:PAIR_WEIGHTS], run / PAIR_PLOT)
        if pair is not None:
            files["pair"] = str(pair)
    files["diagnostics"] = str(run / DIAGNOSTICS_FILE)
    out["files"] = files
    write_json(run / DIAGNOSTICS_FILE, jsonable(out))  # NaN/inf (e.g. R-hat of stuck chains) become null there
    return out


def diagnose_report(result: dict[str, Any]) -> list[RenderableType]:
    """Rich tables of a :func:`diagnose` result: summaries, latent-site quantiles and worst ten, checks in red."""
    out: list[RenderableType] = []
    title = f"{result.get('run_dir', '')} ({result.get('method', result['draws'])}): {result['num_chains']} " \
            f"chain(s) x {result['num_draws']} draws"
    table = Table(title=escape(f"function-space summaries: {title}"), title_justify="left")
    for key in ("variable", "mean", "sd", "r_hat", "ess_bulk", "ess_tail"):
        table.add_column(key, justify="left" if key == "variable" else "right")
    mcmc = result["draws"] == "mcmc"
    for row in result["function_space"]:
        r_hat = row["r_hat"]
        bad = (r_hat is not None and r_hat > RHAT_MAX) or (mcmc and min(row["ess_bulk"], row["ess_tail"]) < ESS_MIN)
        table.add_row(escape(row["variable"]), _fmt(row["mean"]), _fmt(row["sd"]), _fmt(r_hat),
                      _fmt(row["ess_bulk"], 1), _fmt(row["ess_tail"], 1), style="red" if bad else None)
    out.append(table)

    weights = result.get("weights")
    if weights:
        table = Table(title=f"latent sites: {weights['n_elements']:,} elements (quantiles over elements)",
                      title_justify="left")
        table.add_column("statistic")
        for key in QUANTILES:
            table.add_column(key, justify="right")
        if weights["r_hat_quantiles"] is not None:
            table.add_row("R-hat", *(_fmt(v) for v in weights["r_hat_quantiles"].values()))
        table.add_row("bulk ESS", *(_fmt(v, 1) for v in weights["ess_bulk_quantiles"].values()))
        out.append(table)
        if weights["worst"]:
            table = Table(title=f"worst {len(weights['worst'])} latent-site elements by R-hat", title_justify="left")
            for key in ("site", "index", "r_hat", "ess_bulk"):
                table.add_column(key, justify="left" if key in ("site", "index") else "right")
            for w in weights["worst"]:
                r_hat = w["r_hat"]
                table.add_row(escape(w["site"]), escape(str(w["index"])), _fmt(r_hat), _fmt(w["ess_bulk"], 1),
                              style="red" if r_hat is None or r_hat > RHAT_MAX else None)
            out.append(table)

    table = Table(title="checks", title_justify="left")
    for key in ("check", "value", "threshold", "status"):
        table.add_column(key, justify="right" if key == "value" else "left")
    for c in result["checks"]:
        table.add_row(escape(c["check"]), _fmt(c["value"]), c["threshold"], "ok" if c["ok"] else "WARNING",
                      style=None if c["ok"] else "bold red")
    if result.get("pareto_k"):
        table.add_row("Pareto k-hat reading", "", "", escape(result["pareto_k"]["interpretation"]))
    out.append(table)
    for note in result["notes"]:
        out.append(Text(f"note: {note}", style="dim"))
    for warning in result["warnings"]:
        out.append(Text(f"WARNING: {warning}", style="bold red"))
    if not result["warnings"]:
        out.append(Text("no warnings", style="green"))
    return out


# ------------------------------------------------------------------------------------------ compare
@dataclass
class RunPredictive:
    """One run's predictive on its test inputs: y samples ``[R, B]`` (regression, original units) or mean probs."""

    run_dir: Path
    label: str
    data: Dataset
    metrics: dict[str, float]
    posterior: Posterior | None = None
    pred: PredictiveDraws | None = None  # the draws the comparison is made of, for further figures
    y: np.ndarray | None = None
    probs: np.ndarray | None = None


def run_predictive(run_dir: str | Path, num_samples: int = COMPARE_DRAWS) -> RunPredictive:
    """The predictive of a run at its test inputs, seeded by the run's seed (the same run gives the same draws)."""
    if num_samples < 1:
        raise ZooInputError("--samples", num_samples, "use a positive number of posterior draws")
    run = Path(run_dir)
    spec, data, posterior = load_run(run)
    pyro.set_rng_seed(spec.seed + 1)
    pred = posterior.predict(data.x_test, draws=posterior.sample(num_samples))
    metrics_path = run / METRICS_FILE
    stored = json.loads(metrics_path.read_text()) if metrics_path.exists() else {}
    metrics = {k: stored[k] for k in METRIC_KEYS if k in stored}
    out = RunPredictive(run, f"{run.name} ({_method(spec)})", data, metrics, posterior, pred)
    if data.task == "classification":
        out.probs = _numpy(pred.log_probs.double().exp().mean(0))
        return out
    loc, scale = pred.loc.detach().cpu().double(), pred.scale.detach().cpu().double()
    per_draw = max(1, math.ceil(Y_SAMPLES / loc.shape[0]))
    eps = torch.randn((per_draw, *loc.shape), generator=torch.Generator().manual_seed(spec.seed + 2),
                      dtype=torch.float64)
    out.y = ((loc + scale * eps) * data.y_std + data.y_mean).reshape(-1, loc.shape[-1]).numpy()
    return out


def _same_data(reference: RunPredictive, run: RunPredictive) -> None:
    a, b = reference.data, run.data
    same = (a.task == b.task and a.x_test.shape == b.x_test.shape and a.y_test.shape == b.y_test.shape
            and torch.allclose(a.x_test.cpu().float(), b.x_test.cpu().float())
            and torch.allclose(a.y_test.cpu().double(), b.y_test.cpu().double()))
    if not same:
        raise ZooInputError("RUN", str(run.run_dir), f"was trained on different data from the reference "
                            f"{reference.run_dir} ({b.name}, {len(b.y_test)} test points vs {a.name}, "
                            f"{len(a.y_test)}); compare runs of the same data set, split and seed")


def coverage(run_y: np.ndarray, reference_y: np.ndarray, level: float = 0.95) -> np.ndarray:
    """Per test input, the reference's predictive mass inside the run's central ``level`` interval ``[B]``."""
    lo, hi = np.quantile(run_y, [(1 - level) / 2, (1 + level) / 2], axis=0)
    return ((reference_y >= lo) & (reference_y <= hi)).mean(axis=0)


def wasserstein(run_y: np.ndarray, reference_y: np.ndarray) -> np.ndarray:
    """Per test input, the Wasserstein-1 distance between two sets of predictive samples of y ``[B]``."""
    return np.array([wasserstein_distance(run_y[:, i], reference_y[:, i]) for i in range(run_y.shape[1])])


def compare(reference_dir: str | Path, run_dirs: Sequence[str | Path], num_samples: int = COMPARE_DRAWS,
            out_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """Rows comparing runs' test-set predictives with a reference run's (the first row is the reference itself).

    Classification: ``agreement`` (argmax of the mean predictive matches the reference's) and ``tv`` (mean total
    variation between mean predictive class distributions). Regression: ``coverage_95`` (reference predictive mass
    inside the run's central 95% interval, averaged over test inputs; 0.95 is ideal) and ``w1`` (mean Wasserstein-1
    distance between predictive marginals of y, original units). Each row also has the run's stored test metrics.
    With ``out_dir``, a plot is written to ``out_dir/compare.png`` (``rows[0]["plot"]``).
    """
    cache: dict[Path, RunPredictive] = {}

    def get(path: str | Path) -> RunPredictive:
        key = Path(path).resolve()
        if key not in cache:
            cache[key] = run_predictive(path, num_samples)
        return cache[key]

    return compare_predictives(get(reference_dir), [get(p) for p in run_dirs], out_dir)


def compare_predictives(reference: RunPredictive, runs: Sequence[RunPredictive],
                        out_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """:func:`compare` on predictives already drawn (by :func:`run_predictive`)."""
    runs = list(runs)
    for run in runs:
        _same_data(reference, run)
    rows, per_input = [], []
    for run, is_reference in [(reference, True)] + [(r, False) for r in runs]:
        row: dict[str, Any] = {"run": str(run.run_dir), "label": run.label, "reference": is_reference}
        if reference.data.task == "classification":
            agree = run.probs.argmax(-1) == reference.probs.argmax(-1)
            tv = 0.5 * np.abs(run.probs - reference.probs).sum(-1)
            row.update(agreement=float(agree.mean()), tv=float(tv.mean()))
            per_input.append(tv)
        else:
            w1 = wasserstein(run.y, reference.y)
            row.update(coverage_95=float(coverage(run.y, reference.y).mean()), w1=float(w1.mean()))
            per_input.append(w1)
        row.update(run.metrics)
        rows.append(jsonable(row))
    if out_dir is not None:
        rows[0]["plot"] = str(plot_compare(reference, runs, rows, per_input, Path(out_dir) / COMPARE_PLOT))
    return rows


def plot_compare(reference: RunPredictive, runs: list[RunPredictive], rows: list[dict[str, Any]],
                 per_input: list[np.ndarray], path: Path) -> Path:
    """Regression: predictive mean +- 2 sd of each run over a 1-D input (else W1 per test input); classification:
    agreement and total variation per run."""
    data = reference.data
    labels = [r["label"] for r in rows]
    if data.task == "classification":
        fig, axes = new_figure(1, 1, (max(5.0, 1.6 * len(rows)), 4))
        ax, pos, width = axes[0, 0], np.arange(len(rows)), 0.38
        ax.bar(pos - width / 2, [r["agreement"] for r in rows], width, label="agreement")
        ax.bar(pos + width / 2, [r["tv"] for r in rows], width, label="mean total variation")
        ax.set_xticks(pos, labels, rotation=20, ha="right")
        ax.set_ylim(0, 1.05)
        ax.legend()
        ax.set_title(f"{data.name}: test predictive vs {labels[0]}")
        return save_figure(fig, path)
    everyone = [reference, *runs]
    if data.in_dim == 1:
        x = _numpy(data.inputs_in_original_units(data.x_test)[:, 0].double())
        order = np.argsort(x)
        fig, axes = new_figure(2, 1, (8, 7))
        ax = axes[0, 0]
        for i, (run, label) in enumerate(zip(everyone, labels, strict=True)):
            mean, sd = run.y.mean(0)[order], run.y.std(0)[order]
            color = "black" if i == 0 else f"C{i - 1}"
            if i == 0:
                ax.fill_between(x[order], mean - 2 * sd, mean + 2 * sd, color="0.8", label=f"{label} ±2 sd")
            else:
                ax.plot(x[order], mean - 2 * sd, color=color, ls="--", lw=1)
                ax.plot(x[order], mean + 2 * sd, color=color, ls="--", lw=1)
            ax.plot(x[order], mean, color=color, lw=1.5, label=label)
        x_train = _numpy(data.inputs_in_original_units(data.x_train)[:, 0].double())
        ax.plot(x_train, _numpy(data.y_train.double()) * data.y_std + data.y_mean, ".", color="0.4", ms=3,
                label="training data")
        ax.set_ylabel("y (predictive mean ± 2 sd)")
        ax.legend(fontsize="small")
        ax.set_title(f"{data.name}: test predictive vs {labels[0]}")
        ax = axes[1, 0]
        for i, (w1, label) in enumerate(zip(per_input[1:], labels[1:], strict=True)):
            ax.plot(x[order], w1[order], color=f"C{i}", label=label)
        ax.set_xlabel("x")
    else:
        fig, axes = new_figure(1, 1, (8, 4))
        ax = axes[0, 0]
        order = np.argsort(reference.y.std(0))
        for i, (w1, label) in enumerate(zip(per_input[1:], labels[1:], strict=True)):
            ax.plot(np.arange(len(order)), w1[order], ".", color=f"C{i}", label=label)
        ax.set_xlabel("test input (sorted by the reference's predictive sd)")
        ax.set_title(f"{data.name}: W1 to {labels[0]} per test input")
    ax.set_ylabel("Wasserstein-1 to the reference")
    if len(runs):
        ax.legend(fontsize="small")
    return save_figure(fig, path)


def compare_table(rows: list[dict[str, Any]]) -> Table:
    """A rich table of :func:`compare` rows (the reference first)."""
    keys = ["agreement", "tv"] if "agreement" in rows[0] else ["coverage_95", "w1"]
    keys += [k for k in METRIC_KEYS if any(k in r for r in rows)]
    table = Table(title=escape(f"against {rows[0]['label']} (test inputs)"), title_justify="left")
    table.add_column("run")
    for key in keys:
        table.add_column(key, justify="right")
    for row in rows:
        table.add_row(escape(row["label"] + (" (reference)" if row["reference"] else "")),
                      *(_fmt(row.get(k), 4) for k in keys))
    return table
