"""The checks of a fitted posterior (``zoo diagnose``, and the verdict that ends ``zoo train`` of MCMC draws):
R-hat and bulk/tail ESS in function space, divergences and BFMI (MCMC), PSIS Pareto k-hat of a guide (VI), the
files and plots they write, and their console report. It sits below :mod:`zoo.bnn`, so that ``BNN.diagnose()``
reaches it; :mod:`zoo.diagnostics` applies it to run directories.

Warnings are never hidden (a red line in the report, and the ``warnings`` list): divergences > 0, R-hat > 1.01,
BFMI < 0.3, bulk/tail ESS < 400 on the function-space summaries (MCMC), Pareto k-hat of a guide > 0.7. R-hat of
the weights themselves is reported as a note, not a warning: a BNN's posterior is symmetric under permuting hidden
units (and flipping their signs for odd activations), so chains in equivalent modes disagree in weight space
however well each has mixed; convergence is judged in function space (Izmailov et al. 2021).
"""

from __future__ import annotations

import csv
import html
import io
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import arviz as az
import numpy as np
import pandas as pd
import pyro
import pyro.distributions as dist
import torch
import xarray as xr
from pyro import poutine
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from zoo import registry
from zoo.data.base import Dataset
from zoo.errors import ZooInputError
from zoo.inference_data import FUNCTION_SUMMARIES, as_numpy, save_inference_data, to_inference_data
from zoo.plots import new_figure, save_figure
from zoo.posterior import ChainPosterior, Posterior
from zoo.runs import write_json, write_text

DIAGNOSTICS_FILE = "diagnostics.json"
SUMMARY_FILE = "summary.csv"
TRACE_PLOT, ENERGY_PLOT, PAIR_PLOT = "trace.png", "energy.png", "pair.png"
# Vehtari et al. (2021): rank-normalised R-hat <= 1.01 and bulk/tail ESS > 400 before trusting MCMC summaries
RHAT_MAX, ESS_MIN, BFMI_MIN, KHAT_MAX = 1.01, 400.0, 0.3, 0.7
WORST_SHOWN, PAIR_WEIGHTS = 10, 4
QUANTILES = {"min": 0.0, "5%": 0.05, "50%": 0.5, "95%": 0.95, "max": 1.0}


def guide_log_density(guide: torch.nn.Module,
                      draws: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list[str], list[str]]:
    """log q(w_s) of the guide at each of S draws ``[S]`` (traced, conditioned on each draw, with each site's scale
    and mask as the guide declares them), its point-mass (Delta) sites, and its sites whose terms are scaled.

    A guide whose ``log_density(draws)`` is not None (a guide over one joint latent, SWAG's Gaussians) scores the
    draws itself.

    :param guide: the guide.
    :param draws: S draws of its latent sites ``{site: [S, ...]}``.
    :returns: ``(log_q, point_mass_sites, scaled_sites)``: ``log_q`` ``[S]`` and two sorted lists of site names.
    """
    total = next(iter(draws.values())).shape[0]
    density = guide.log_density(draws)  # a guide over one joint latent scores its draws itself
    if density is not None:
        return density, [], []
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
    """The usual reading of a PSIS Pareto k-hat (Vehtari et al.; Yao et al. 2018 for VI).

    :param k: the k-hat.
    :returns: its reading: good (below 0.5), ok (up to :data:`KHAT_MAX`), bad (below 1) or very bad.
    """
    if k < 0.5:
        return "good: q covers the posterior; importance-weighted estimates are reliable"
    if k <= KHAT_MAX:
        return "ok: usable, though importance-weighted estimates converge slowly"
    if k < 1.0:
        return "bad: q misses posterior mass (too narrow or misplaced); estimates from q are unreliable"
    return "very bad: the importance weights have infinite variance; q is far from the posterior"


def pareto_k(guide: Any, draws: dict[str, torch.Tensor], lp: torch.Tensor) -> dict[str, Any]:
    """PSIS k-hat of a guide (or of anything with ``log_density(draws)``) from S draws of it and the log joint
    there: log w = log p(w, y | x) - log q(w).

    :param guide: the guide (or other approximation) the draws come from.
    :param draws: S iid draws of it ``{site: [S, ...]}``.
    :param lp: the model's log joint at each draw ``[S]``.
    :returns: ``k_hat`` (None where q has no density, e.g. point-mass sites; inf for non-finite weights),
        ``num_draws``, ``interpretation`` and, where the model and q scale some sites' terms, a ``caveat``.
    """
    unavailable = guide.density_unavailable
    if unavailable:
        return {"k_hat": None, "num_draws": int(len(lp)), "interpretation": f"undefined: {unavailable}"}
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
                "r_hat": _float(_stuck_as_infinite(rhat[name].sel(sel).values, values.sel(sel).values))
                if rhat is not None else None,
                "ess_bulk": _float(bulk[name].sel(sel)), "ess_tail": _float(tail[name].sel(sel)),
                "mcse_mean": _float(mcse[name].sel(sel)),
            })
    return rows


def _stuck_as_infinite(r_hat: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """R-hat of draws ``[chains, draws, ...]`` (one value per trailing element), made infinite where it is undefined
    because every chain is constant but the chains differ: stuck chains, the worst disagreement, not a pass
    (whether ArviZ reports such draws as NaN or as a finite value depends on whether it runs its numba path)."""
    r_hat = np.asarray(r_hat, dtype=float)
    constant = np.all(draws == draws[:, :1], axis=1)  # [chains, ...]: each chain constant
    differ = np.any(draws[:, 0] != draws[:1, 0], axis=0)
    return np.where(np.isnan(r_hat) & constant.all(axis=0) & differ, np.inf, r_hat)


def _per_chain_rows(post: xr.Dataset) -> list[dict[str, Any]]:
    """Each chain on its own: mean and sd of ``lp``, its within-chain bulk ESS, and how far the chain's mean of
    each ``f_test`` element sits from the pooled mean, in pooled posterior sd (the largest over test points).

    How SG-MCMC chains are read (Zhang et al. 2020; Izmailov et al. 2021): each chain explores its own mode, and
    what matters is whether they agree in function space, not whether R-hat pools them into one distribution.
    """
    lp, f = post["lp"].values, post["f_test"].values  # [C, S] and [C, S, T]
    pooled_mean = f.reshape(-1, f.shape[-1]).mean(0)
    pooled_sd = f.reshape(-1, f.shape[-1]).std(0)
    rows = []
    for chain in range(lp.shape[0]):
        ess = _quiet(lambda c=chain: az.ess(lp[c][None], method="bulk")) if lp.shape[1] > 3 else math.nan
        with np.errstate(divide="ignore", invalid="ignore"):
            shift = np.abs(f[chain].mean(0) - pooled_mean) / pooled_sd
        shift = shift[np.isfinite(shift)]
        rows.append({"chain": chain, "lp_mean": float(lp[chain].mean()), "lp_sd": float(lp[chain].std()),
                     "lp_ess_bulk": _float(ess), "f_test_max_shift_sd": float(shift.max()) if shift.size else None})
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
    """Every (site, index) element of the latent sites in ``post``, site after site in C order.

    :param post: an InferenceData's posterior group (dims ``chain, draw, ...``).
    :returns: ``(site, index)`` pairs, ``f_test`` and ``lp`` left out.
    """
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
    rhat = np.concatenate([_stuck_as_infinite(rhat_ds[n].values, ds[n].values).reshape(-1) for n in names])
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


def sampler_checks(stats: dict[str, np.ndarray], dim: int | None = None) -> dict[str, Any]:
    """Divergences (count, fraction) and BFMI per chain from MCMC statistics ``[chains, draws]``.

    :param stats: sampler statistics by name, ``diverging`` and ``energy`` read where present.
    :param dim: the posterior's dimension (its latent elements); with it each chain's BFMI is explained
        (:func:`energy_exploration`, under ``energy``).
    :returns: ``divergences`` (``count``, ``fraction``, ``per_chain``) and ``bfmi`` (one per chain; none with a
        single draw per chain), each only where its statistic was given, and ``energy`` with ``dim``.
    """
    out: dict[str, Any] = {}
    if "diverging" in stats:
        diverging = np.asarray(stats["diverging"]).astype(bool)
        out["divergences"] = {"count": int(diverging.sum()), "fraction": float(diverging.mean()),
                              "per_chain": [int(c) for c in diverging.sum(axis=1)]}
    if "energy" in stats:
        energy = np.asarray(stats["energy"], dtype=float)
        out["bfmi"] = [float(b) for b in _quiet(lambda: az.bfmi(energy))] if energy.shape[1] > 1 else []
        if dim and out["bfmi"]:
            out["energy"] = energy_exploration(energy, dim)
    return out


def energy_exploration(energy: np.ndarray, dim: int) -> list[dict[str, float]]:
    """Why each chain's E-BFMI is what it is, from its Hamiltonian at each draw ``[chains, draws]``.

    With a fresh Gaussian momentum each draw and a trajectory that conserves the Hamiltonian, a draw changes the
    energy by the kinetic energy's fluctuation alone, whose mean square is the dimension D under any mass matrix;
    at stationarity the energy's variance is Var(U) + D/2, the potential's plus the kinetic's. So E-BFMI, their
    ratio, is about D / (Var(U) + D/2): 1 on a Gaussian posterior (Var(U) = D/2), and below 0.3 wherever the log
    density's variance exceeds 2.8 D. A linear change of variables (a mass matrix) leaves Var(U) as it is, so a low
    BFMI with draws that change the energy in full is the posterior's heavy log-density tails, which more draws
    estimate better but do not raise (Betancourt 2016).

    :param energy: the Hamiltonian at each draw, ``[chains, draws]``.
    :param dim: the posterior's dimension.
    :returns: per chain: ``change_over_dim``, the mean square change of the energy per draw over D (about 1 when
        the momenta are refreshed in full; less points at the sampler), and ``spread_over_gaussian``, the
        potential's variance (the energy's less D/2) over a Gaussian posterior's D/2.
    """
    rows = []
    for chain in energy:
        rows.append({"change_over_dim": float(np.mean(np.diff(chain) ** 2) / dim),
                     "spread_over_gaussian": float((np.var(chain) - dim / 2) / (dim / 2))})
    return rows


def lp_moves_with(post: xr.Dataset, top: int = 2) -> list[dict[str, Any]]:
    """The latent sites the log density moves with most: each site's value (a scalar site) or half its squared norm
    (its prior's own term under a Normal prior), correlated with ``lp`` within each chain and averaged over chains,
    the ``top`` largest in size. Where a chain's BFMI is low, these are the directions of the heavy tails.

    :param post: the posterior group (latent sites and ``lp``, ``[chains, draws, ...]``).
    :param top: how many sites to return.
    :returns: ``site`` and ``correlation`` rows, strongest first.
    """
    lp = post["lp"].values
    rows = []
    for name in (n for n in post.data_vars if n not in FUNCTION_SUMMARIES):
        values = post[name].values.reshape(lp.shape + (-1,))
        feature = values[..., 0] if values.shape[-1] == 1 else (values**2).sum(-1) / 2
        with np.errstate(divide="ignore", invalid="ignore"):
            per_chain = [np.corrcoef(feature[c], lp[c])[0, 1] for c in range(lp.shape[0])]
        corr = float(np.nanmean(per_chain)) if np.isfinite(per_chain).any() else math.nan
        if math.isfinite(corr):
            rows.append({"site": str(name), "correlation": corr, "norm": values.shape[-1] > 1})
    return sorted(rows, key=lambda r: -abs(r["correlation"]))[:top]


def _bfmi_message(chain: int, value: float, explained: dict[str, float] | None, dim: int | None,
                  moves_with: list[dict[str, Any]] | None = None) -> str:
    """The warning of a chain's BFMI under :data:`BFMI_MIN`: what its draws say caused it."""
    head = f"BFMI {value:.3f} < {BFMI_MIN} in chain {chain}"
    if explained is None or dim is None:
        return f"{head}: momentum resampling explores the energy poorly (heavy tails or a poorly adapted mass matrix)"
    change, spread = explained["change_over_dim"], explained["spread_over_gaussian"]
    if change < 0.8:
        return (f"{head}: its draws change the energy less than fresh momenta would (mean square {change:.2f} x the "
                f"{dim:,} dimensions, about 1 when the momenta are refreshed in full and the trajectory conserves "
                "the energy): a sampler not yet adapted; run more warm-up (inference.warmup_steps)")
    where = ("" if not moves_with else "; it moves most with " + " and ".join(
        f"{'the norm of ' if r['norm'] else ''}{r['site']} (correlation {r['correlation']:+.2f})" for r in moves_with))
    return (f"{head}: its draws change the energy as much as fresh Gaussian momenta can (mean square {change:.2f} x "
            f"the {dim:,} dimensions, as under any mass matrix), but its log density's variance is {spread:.1f}x a "
            f"Gaussian posterior's of that dimension{where}: heavy tails, which neither a mass matrix nor more "
            "draws change. Whether the chain crossed its energy levels is what the lp's R-hat and ESS measure; a "
            "reparameterisation of the heavy-tailed directions might raise BFMI")


def fmt(value: float | None, digits: int = 3) -> str:
    """A figure for the console tables: ``-`` when missing, ``inf`` when infinite.

    :param value: the figure, or None.
    :param digits: decimals shown.
    :returns: its text.
    """
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

    :param idata: the run's InferenceData (:func:`zoo.diagnostics.to_inference_data`).
    :param pareto: :func:`pareto_k`'s result for iid draws of an approximation with a density; None without one.
    :param stats: every stored sampler statistic ``{name: [chains, draws]}``; None to read ``idata.sample_stats``.
    :returns: the result: ``draws`` (``mcmc`` or ``iid``), ``num_chains``, ``num_draws``, ``function_space`` rows,
        ``weights`` and ``per_chain`` summaries (MCMC), the sampler's ``divergences`` and ``bfmi``, ``pareto_k``,
        ``checks`` (each with ``ok``), ``warnings`` and ``notes``.
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
            warnings_.append(message or f"{name} = {fmt(value)} (want {threshold})")

    rows = result["function_space"]
    if with_rhat:
        worst = max(rows, key=lambda r: -math.inf if math.isnan(r["r_hat"]) else r["r_hat"])
        bad = [r for r in rows if r["r_hat"] > RHAT_MAX]
        add("R-hat, function space and lp (max)", worst["r_hat"], f"<= {RHAT_MAX}", not bad,
            f"R-hat > {RHAT_MAX} on {len(bad)} of {len(rows)} function-space summaries (worst {fmt(worst['r_hat'])} "
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
        if n_chains >= 2:
            result["per_chain"] = _per_chain_rows(post)
        w = result["weights"]
        if with_rhat and w["r_hat_quantiles"]["max"] is not None and w["n_r_hat_over"]:
            top = w["worst"][0]
            result["notes"].append(
                f"R-hat > {RHAT_MAX} on {w['n_r_hat_over']} of {w['n_elements']} latent-site elements (worst "
                f"{fmt(top['r_hat'])} at {top['site']}{top['index']}): the chains sit in different weight-space "
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
    dim = result["weights"]["n_elements"] if mcmc else None
    sampler = sampler_checks(sample_stats or {}, dim) if mcmc else {}
    result.update(sampler)
    if "divergences" in sampler:
        d = sampler["divergences"]
        add(f"divergences (count; {100 * d['fraction']:.2f}% of draws)", float(d["count"]), "= 0", d["count"] == 0,
            f"{d['count']} divergent transitions ({100 * d['fraction']:.1f}% of draws): the sampler could not follow "
            "the posterior's curvature and the draws may be biased; raise inference.target_accept_prob or "
            "reparameterise")
    explained = sampler.get("energy")
    if explained and min(sampler["bfmi"]) < BFMI_MIN and "lp" in post:
        result["lp_moves_with"] = lp_moves_with(post)
    for chain, value in enumerate(sampler.get("bfmi", [])):
        add(f"BFMI chain {chain}", value, f">= {BFMI_MIN}", value >= BFMI_MIN,
            _bfmi_message(chain, value, explained[chain] if explained else None, dim, result.get("lp_moves_with")))

    if pareto is not None:
        result["pareto_k"] = pareto
        k = pareto["k_hat"]
        if pareto.get("caveat"):
            result["notes"].append(f"PSIS k-hat: {pareto['caveat']}")
        if k is None:
            result["notes"].append(f"PSIS k-hat {pareto['interpretation']}")
        else:
            add("PSIS Pareto k-hat of q", k, f"<= {KHAT_MAX}", k <= KHAT_MAX,
                f"Pareto k-hat {fmt(k, 2)} > {KHAT_MAX}: {pareto['interpretation']}")
    result["checks"], result["warnings"] = checks, warnings_
    return result


def draws_would_help(result: dict[str, Any]) -> bool:
    """Whether more draws may turn a failing verdict into a passing one: its R-hat or ESS check failed. Divergences
    and BFMI do not fall with more draws (more draws meet more divergences; BFMI is the posterior's energy spread,
    :func:`energy_exploration`).

    :param result: a :func:`check` (or :func:`diagnosis`) result.
    :returns: whether more draws are worth taking.
    """
    return any(not c["ok"] for c in result["checks"] if c["check"].startswith(("R-hat", "bulk/tail ESS")))


def verdict(result: dict[str, Any]) -> str:
    """One line on whether MCMC draws passed every check of :func:`check` (what ``zoo train`` ends with).

    For a sampler that is not exact (SG-MCMC: no Metropolis correction, chains in separate modes) the same figures
    are read as warnings: the line says so and points at the per-chain table.

    :param result: a :func:`diagnosis` (or :func:`check`) result.
    :returns: the line: ``converged: ...``, ``warning: ...`` or ``NOT CONVERGED: ...`` with the figures.
    """
    rows = result["function_space"]
    r_hats = [r["r_hat"] for r in rows if r["r_hat"] is not None]
    ess = min(min(r["ess_bulk"], r["ess_tail"]) for r in rows)
    divergences = result.get("divergences", {}).get("count", 0)
    figures = (f"function-space R-hat max {fmt(max(r_hats)) if r_hats else 'n/a'} (<= {RHAT_MAX}), min bulk/tail "
               f"ESS {fmt(ess, 0)} (>= {ESS_MIN:.0f}), {divergences} divergences")
    if not result["warnings"]:
        return f"converged: {figures}"
    if not result.get("exact_sampler", True):
        return (f"warning: {figures}; {len(result['warnings'])} exact-sampler check(s) not met (above). These chains "
                f"come from {result.get('method', 'a sampler')} without a Metropolis correction, so they are judged "
                "chain by chain and in function space (the per-chain table), not as one converged MCMC run; they "
                "are never a reference for zoo compare. zoo train --strict exits 3 on this")
    advice = "".join(f"; {line}" for line in result.get("advice", []))
    remedy = ("run more warm-up and draws (or more chains)" if draws_would_help(result) else "R-hat and ESS pass, "
              "and more draws do not fix the checks that failed (divergences, BFMI): the warnings above say what would")
    return (f"NOT CONVERGED: {figures}; {len(result['warnings'])} check(s) failed (above). Do not use these draws as "
            f"a reference: {remedy}, and check again with zoo diagnose --strict{advice}")


def plot_trace(idata: az.InferenceData, path: str | Path) -> Path:
    """Density and rank bars (a plain trace for a single chain) of every function-space summary.

    :param idata: the run's InferenceData.
    :param path: the image file to write.
    :returns: the path written.
    """
    rows = int(idata.posterior.sizes["test_point"]) + 1
    fig, axes = new_figure(rows, 2, (10, 1.8 * rows))
    fig.subplots_adjust(hspace=0.9, wspace=0.25, top=1 - 0.4 / rows, bottom=0.3 / rows)
    kind = "rank_bars" if idata.posterior.sizes["chain"] > 1 else "trace"
    with az.rc_context({"plot.max_subplots": 2 * rows + 2}):
        _quiet(lambda: az.plot_trace(idata, var_names=list(FUNCTION_SUMMARIES), kind=kind, compact=False,
                                     axes=axes))
    return save_figure(fig, path)


def plot_energy(idata: az.InferenceData, path: str | Path) -> Path:
    """Marginal energy vs energy transition distributions (MCMC).

    :param idata: the run's InferenceData, with the sampler's ``energy``.
    :param path: the image file to write.
    :returns: the path written.
    """
    fig, axes = new_figure(1, 1, (6, 4))
    _quiet(lambda: az.plot_energy(idata, ax=axes[0, 0]))
    return save_figure(fig, path)


def plot_pair(idata: az.InferenceData, elements: list[tuple[str, tuple[int, ...]]], path: str | Path) -> Path | None:
    """Pair plot of a few latent-site elements (divergent draws marked for MCMC); None with fewer than two.

    :param idata: the run's InferenceData.
    :param elements: the ``(site, index)`` elements to plot (:func:`weight_elements`).
    :param path: the image file to write.
    :returns: the path written, or None when nothing was plotted.
    """
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


def jsonable(obj: Any) -> Any:
    """Plain JSON values: numpy scalars to floats/ints, NaN and inf to None.

    :param obj: a value, walked through dicts (keys made strings), lists and tuples.
    :returns: the same value made of plain JSON values (tuples as lists).
    """
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


def method_label(spec) -> str:
    """``svi/<guide>`` or the sampler's / method's name: how the report names what fitted a run.

    :param spec: the run's spec (a :class:`zoo.spec.RunSpec`).
    :returns: the label.
    """
    fitted_guide = registry.method_of(spec).fits_guide
    return f"{spec.inference.method}/{spec.guide.label}" if fitted_guide else spec.inference.method


def diagnosis_of(spec, data: Dataset, posterior: Posterior, run_dir: str | Path | None = None,
                 num_samples: int | None = None) -> Diagnosis:
    """The checks of a fitted posterior (see :class:`Diagnosis`), writing nothing.

    MCMC draws: R-hat, bulk/tail ESS, divergences, BFMI per chain, on every stored draw (``num_samples`` thins each
    chain; divergences and BFMI are still counted on all stored draws). A guide's (or any approximation's with a
    density): ``num_samples`` (default 200) iid draws of q and the PSIS Pareto k-hat of q against the model's log
    joint. ``exact_sampler`` in the result says whether the method is an exact (Metropolis-corrected) sampler, whose
    failed checks make its draws unusable; for the others (SG-MCMC, VI) they are warnings about the draws.

    :param spec: the fit's run spec (a :class:`zoo.spec.RunSpec`).
    :param data: the data it was fitted on (the function-space summaries are taken at its test inputs).
    :param posterior: the fitted posterior.
    :param run_dir: the run directory, recorded in the result (None: a fit kept in memory).
    :param num_samples: the draws to check: about this many stored draws, thinned evenly per chain (MCMC), or this
        many iid draws (default 200) of the approximation; None for every stored draw (MCMC).
    :returns: the diagnosis.
    :raises ZooInputError: ``num_samples`` below 1, or data without test rows.
    """
    if not len(data.y_test):
        raise ZooInputError("test", data.name, "has no test rows to take the function-space summaries at: a run of "
                            "data given in Python keeps none; pass test=(x, y) (BNN.diagnose, zoo.compare)")
    attrs = {"method": method_label(spec), "family": spec.model.family, "run_dir": "" if run_dir is None
             else str(run_dir)}
    full_stats = None
    if isinstance(posterior, ChainPosterior):
        idata = to_inference_data(posterior, data, chains=posterior.chains, stats=posterior.stats,
                                  num_samples=num_samples, seed=spec.seed, attrs=attrs)
        full_stats = {k: as_numpy(v) for k, v in posterior.stats.items()}
    else:
        idata = to_inference_data(posterior, data, num_samples=num_samples, seed=spec.seed, attrs=attrs)
    pareto = None
    # iid draws of an approximation with a density (a guide, or a posterior that scores its draws, e.g. SWAG)
    density = posterior.density()
    if density is not None:
        draws = {n: torch.tensor(idata.posterior[n].values[0], device=data.device)  # the model's, not the rows'
                 for n in posterior.family.latent_sites()}
        lp = torch.tensor(idata.posterior["lp"].values[0])
        pareto = pareto_k(density, draws, lp)
    out = check(idata, pareto, full_stats)
    method = registry.method_of(spec)
    return Diagnosis({"run_dir": attrs["run_dir"], "method": attrs["method"], "family": attrs["family"],
                      "data": data.name, "exact_sampler": method.exact,
                      "advice": method.convergence_advice(spec.inference, posterior), **out}, idata)


@dataclass
class Diagnosis:
    """A fitted posterior's checks (:func:`diagnosis_of`; ``BNN.diagnose()``, ``zoo diagnose``): the figures, their
    verdict, the ArviZ ``InferenceData`` they were made on, and the files and plots on request.

    In a notebook it shows as its tables (HTML); ``rich.print`` shows it as ``zoo diagnose`` prints it.

    :param result: :func:`check`'s result with the fit's ``run_dir``, ``method``, ``family``, ``data``,
        ``exact_sampler`` and ``advice`` (what ``diagnostics.json`` holds).
    :param idata: the InferenceData the checks were made on.
    """

    result: dict[str, Any]
    idata: az.InferenceData

    @property
    def verdict(self) -> str:
        """One line: ``converged: ...``, ``warning: ...`` or ``NOT CONVERGED: ...`` with the figures
        (:func:`verdict`)."""
        return verdict(self.result)

    @property
    def passed(self) -> bool:
        """Whether every check passed (no warnings)."""
        return not self.result["warnings"]

    @property
    def warnings(self) -> list[str]:
        """The failed checks, one line each, with what to change."""
        return list(self.result["warnings"])

    def fails(self, strict: bool = False) -> bool:
        """Whether the checks fail the fit: any warning for an exact sampler's draws (nuts, hmc), or for any
        method's with ``strict``.

        :param strict: fail on the warnings of a method that is not an exact sampler too.
        :returns: whether they do.
        """
        return not self.passed and (self.result["exact_sampler"] or strict)

    @property
    def summary(self) -> pd.DataFrame:
        """The function-space summaries (mean, sd, R-hat, bulk/tail ESS of f at each test input and of lp), one
        row per variable."""
        return pd.DataFrame(self.result["function_space"]).set_index("variable")

    @property
    def checks(self) -> pd.DataFrame:
        """Each check's value, threshold and whether it passed, one row per check."""
        return pd.DataFrame(self.result["checks"], columns=["check", "value", "threshold", "ok"]).set_index("check")

    def advise(self, line: str) -> None:
        """Add a line to the verdict's advice (what to change), e.g. how far a reference whose budget ran out is.

        :param line: the advice.
        """
        self.result["advice"] = [*self.result.get("advice", []), line]

    def save(self, run_dir: str | Path, plots: bool = True) -> dict[str, str]:
        """Write what ``zoo diagnose`` writes into ``run_dir``: ``posterior.nc``, ``summary.csv``,
        ``diagnostics.json`` (NaN and inf as null) and, with ``plots``, ``trace.png``, ``pair.png`` and (MCMC)
        ``energy.png``.

        :param run_dir: the directory (a run directory, or any folder).
        :param plots: also draw the plots.
        :returns: the files written by kind (also the result's ``files``).
        """
        run = Path(run_dir)
        run.mkdir(parents=True, exist_ok=True)
        files = {"inference_data": str(save_inference_data(self.idata, run))}
        files["summary"] = str(write_text(run / SUMMARY_FILE, _csv(self.result["function_space"])))
        if plots:
            files.update(self.plots(run))
        files["diagnostics"] = str(run / DIAGNOSTICS_FILE)
        self.result["files"] = files
        write_json(run / DIAGNOSTICS_FILE, jsonable(self.result))  # NaN/inf (R-hat of stuck chains): null there
        return files

    def plots(self, out_dir: str | Path) -> dict[str, str]:
        """Draw the trace (rank bars), pair and (MCMC) energy plots into ``out_dir``.

        :param out_dir: the folder (created).
        :returns: the files written by kind.
        """
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        idata, files = self.idata, {"trace": str(plot_trace(self.idata, out / TRACE_PLOT))}
        if self.result["draws"] == "mcmc" and "energy" in idata.sample_stats:
            files["energy"] = str(plot_energy(idata, out / ENERGY_PLOT))
        worst = [(w["site"], tuple(w["index"])) for w in (self.result["weights"] or {}).get("worst", [])]
        pair = plot_pair(idata, (worst or weight_elements(idata.posterior))[:PAIR_WEIGHTS], out / PAIR_PLOT)
        if pair is not None:
            files["pair"] = str(pair)
        return {k: v for k, v in files.items() if v is not None}

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from diagnose_report(self.result)

    def _repr_html_(self) -> str:
        color = "green" if self.passed else "#b00"
        warnings_ = "".join(f"<li>{html.escape(w)}</li>" for w in self.result["warnings"])
        return (f'<p style="color:{color}"><b>{html.escape(self.verdict)}</b></p>'
                + (f"<ul>{warnings_}</ul>" if warnings_ else "")
                + self.checks.to_html() + "<p>function-space summaries</p>" + self.summary.to_html(float_format="%.4g"))


def diagnose_report(result: dict[str, Any]) -> list[RenderableType]:
    """Rich tables of a :func:`diagnose` result: summaries, latent-site quantiles and worst ten, checks in red.

    :param result: a :func:`diagnose` (or :func:`diagnosis`) result.
    :returns: the tables, notes and warnings, to print one after another.
    """
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
        table.add_row(escape(row["variable"]), fmt(row["mean"]), fmt(row["sd"]), fmt(r_hat),
                      fmt(row["ess_bulk"], 1), fmt(row["ess_tail"], 1), style="red" if bad else None)
    out.append(table)

    weights = result.get("weights")
    if weights:
        table = Table(title=f"latent sites: {weights['n_elements']:,} elements (quantiles over elements)",
                      title_justify="left")
        table.add_column("statistic")
        for key in QUANTILES:
            table.add_column(key, justify="right")
        if weights["r_hat_quantiles"] is not None:
            table.add_row("R-hat", *(fmt(v) for v in weights["r_hat_quantiles"].values()))
        table.add_row("bulk ESS", *(fmt(v, 1) for v in weights["ess_bulk_quantiles"].values()))
        out.append(table)
        if weights["worst"]:
            table = Table(title=f"worst {len(weights['worst'])} latent-site elements by R-hat", title_justify="left")
            for key in ("site", "index", "r_hat", "ess_bulk"):
                table.add_column(key, justify="left" if key in ("site", "index") else "right")
            for w in weights["worst"]:
                r_hat = w["r_hat"]
                table.add_row(escape(w["site"]), escape(str(w["index"])), fmt(r_hat), fmt(w["ess_bulk"], 1),
                              style="red" if r_hat is None or r_hat > RHAT_MAX else None)
            out.append(table)

    if result.get("per_chain"):
        table = Table(title="per chain (f_test shift: largest |chain mean - pooled mean| over test points, in "
                      "pooled sd)", title_justify="left")
        for key in ("chain", "lp mean", "lp sd", "lp bulk ESS", "f_test shift (sd)"):
            table.add_column(key, justify="right")
        for row in result["per_chain"]:
            table.add_row(str(row["chain"]), fmt(row["lp_mean"], 2), fmt(row["lp_sd"], 2),
                          fmt(row["lp_ess_bulk"], 1), fmt(row["f_test_max_shift_sd"], 2))
        out.append(table)

    table = Table(title="checks", title_justify="left")
    for key in ("check", "value", "threshold", "status"):
        table.add_column(key, justify="right" if key == "value" else "left")
    for c in result["checks"]:
        table.add_row(escape(c["check"]), fmt(c["value"]), c["threshold"], "ok" if c["ok"] else "WARNING",
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
