"""Every run as one :class:`arviz.InferenceData`: latent sites with named dims, the function-space summaries
``f_test`` (at a few test inputs) and ``lp`` (the model's log joint), the posterior predictive and pointwise
log-likelihood at the training inputs, sampler statistics and the observed targets.

MCMC runs keep their chains; draws of a guide are one chain of iid draws. ``f_test`` is the predictive mean
(regression) or the log-probability of the class the mean predictive picks (classification); a rank-1 BNN's draw
predicts with the uniform mixture of its members. ``f_test``, the posterior predictive, the observed ``y`` and the
pointwise log-likelihood of a regression run are in original target units (the latter as ``test_ll`` in
metrics.json), so ``az.loo`` reports an elpd comparable across runs; ``lp`` is log p(w, y | x) in the standardised
units the model is written in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import arviz as az
import numpy as np
import pyro
import torch

from zoo.data.base import Dataset
from zoo.errors import ZooInputError
from zoo.evaluate import check_draw_memory
from zoo.inference.potential import LogJoint
from zoo.posterior import Posterior
from zoo.runs import write_atomically
from zoo.sites import LatentSite
from zoo.tasks import task_of

INFERENCE_DATA_FILE = "posterior.nc"
FUNCTION_SUMMARIES = ("f_test", "lp")
VI_DRAWS = 200  # iid draws of a guide when no count is given


def site_dims(name: str, site: LatentSite, shape: Sequence[int] | None = None) -> list[str]:
    """Named dims of a site: ``hidden0.weight`` -> ``hidden0.weight_out, hidden0.weight_in``; a plate dim is shared.

    :param name: the site's name.
    :param site: the latent site.
    :param shape: the shape of one draw of it; None for the site's own shape.
    :returns: one dim name per axis of ``shape``.
    """
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
    """``count`` test-set indices spread over the test set (over the sorted input for 1-D inputs).

    :param data: the data set.
    :param count: how many indices (fewer when the test set is smaller).
    :returns: the test-set indices.
    """
    n = len(data.x_test)
    order = torch.argsort(data.x_test[:, 0]).cpu().numpy() if data.in_dim == 1 else np.arange(n)
    picks = np.unique(np.linspace(0, n - 1, min(count, n)).round().astype(int))
    return order[picks]


def _chunked(fn: Callable[[dict, slice], torch.Tensor], draws: dict[str, torch.Tensor], size: int = 64) -> torch.Tensor:
    total = next(iter(draws.values())).shape[0]
    parts = [fn({n: v[i:i + size] for n, v in draws.items()}, slice(i, i + size)) for i in range(0, total, size)]
    return torch.cat(parts)


def log_joint(posterior: Posterior, data: Dataset, draws: dict[str, torch.Tensor]) -> torch.Tensor:
    """log p(w, y | x) of the model on the full training set at S draws, in standardised target units.

    :param posterior: the posterior whose model is scored.
    :param data: the data set whose training rows are scored.
    :param draws: S draws of the latent sites ``{site: [S, ...]}``.
    :returns: the log joint at each draw ``[S]``.
    """
    joint = LogJoint(posterior.family, data.x_train, data.y_train)
    with torch.no_grad(), pyro.validation_enabled(False):
        joint.verify({n: v[:4] for n, v in draws.items()})  # the batched form, checked against the traced model
        return _chunked(lambda d, _: joint(d), draws)


def pointwise_log_likelihood(posterior: Posterior, data: Dataset, draws: dict[str, torch.Tensor],
                             rows: int = 4096) -> torch.Tensor:
    """log p(y_i | x_i, w_s) on the training set; regression in original units (minus log ``y_std``).

    :param posterior: the posterior whose model is scored.
    :param data: the data set whose training rows are scored.
    :param draws: S draws of the latent sites ``{site: [S, ...]}``.
    :param rows: training rows scored at a time.
    :returns: the pointwise log-likelihood ``[S, N]``.
    """
    family = posterior.family

    def one(d: dict[str, torch.Tensor], _) -> torch.Tensor:
        return torch.cat([family.log_likelihood(d, xb, yb) for xb, yb in
                          zip(data.x_train.split(rows), data.y_train.split(rows), strict=True)], dim=1)

    with torch.no_grad(), pyro.validation_enabled(False):
        ll = _chunked(one, draws)
    return ll + task_of(data).log_likelihood_shift(data)


def _thin(chains: dict[str, torch.Tensor], num_samples: int | None) -> np.ndarray:
    """Stored draw indices kept per chain: all, or every k-th so that about ``num_samples`` remain in all."""
    n_chains, n_draws = next(iter(chains.values())).shape[:2]
    if num_samples is None or num_samples >= n_chains * n_draws:
        return np.arange(n_draws)
    stride = math.ceil(n_draws / max(1, math.ceil(num_samples / n_chains)))
    return np.arange(0, n_draws, stride)


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as a NumPy array on the CPU.

    :param t: the tensor (detached first).
    :returns: its values.
    """
    return t.detach().cpu().numpy()


def _check_kept_draws(posterior: Posterior, data: Dataset, draws: int) -> None:
    """Refuse draws whose InferenceData would not fit: per training row its pointwise log-likelihood, its replicate
    and three copies of the net's outputs (:func:`zoo.evaluate.check_draw_memory`)."""
    check_draw_memory(posterior, draws, len(data.x_train), 3 * max(data.out_dim, 1) + 2, data.x_train.element_size(),
                      "--samples", "training rows")


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

    :param posterior: the posterior whose model predicts and scores the draws (and is drawn from without
        ``chains``).
    :param data: the run's data set.
    :param chains: MCMC draws ``{site: [chains, draws, *shape]}``; None to draw iid from ``posterior``.
    :param num_samples: about how many draws to keep in all (thinning each chain), or how many iid draws to take.
    :param stats: the sampler's statistics ``{name: [chains, draws]}`` (e.g. ``diverging``, ``energy``).
    :param seed: seeds the draws and the posterior predictive's replicates.
    :param num_test_points: test inputs that ``f_test`` summarises (:func:`pick_test_points`).
    :param attrs: extra attributes of the posterior group (e.g. the run's ``method`` and ``run_dir``).
    :returns: the InferenceData, its posterior group's attrs saying how the draws were made (``draws``: ``mcmc``
        or ``iid``).
    :raises ZooInputError: when ``num_samples`` is below 1, or the draws kept would not fit in memory
        (:func:`_check_kept_draws`).
    """
    if num_samples is not None and num_samples < 1:
        raise ZooInputError("--samples", num_samples, "use a positive number of posterior draws")
    pyro.set_rng_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    if chains is not None:
        keep = _thin(chains, num_samples)
        _check_kept_draws(posterior, data, len(keep) * next(iter(chains.values())).shape[0])
        index = torch.as_tensor(keep, device=next(iter(chains.values())).device)
        draws = {n: v.index_select(1, index) for n, v in chains.items()}
        kept_stats = {k: v.index_select(1, index.to(v.device)) for k, v in (stats or {}).items()}
        kind = "mcmc"
    else:
        _check_kept_draws(posterior, data, num_samples or VI_DRAWS)
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
    task = task_of(data)
    f_test, per_point = task.summarise(posterior.predict(data.x_test.index_select(0, pick_index), draws=flat), total,
                                       data)
    extra_coords: dict[str, tuple[str, np.ndarray]] = {k: ("test_point", v) for k, v in per_point.items()}
    if data.in_dim == 1:
        x_raw = data.inputs_in_original_units(data.x_test.index_select(0, pick_index))[:, 0]
        extra_coords["test_x"] = ("test_point", as_numpy(x_raw).astype(np.float64))
    lp = as_numpy(log_joint(posterior, data, flat)).astype(np.float64)

    # training-set groups
    ll = as_numpy(pointwise_log_likelihood(posterior, data, flat))
    y_rep = task.replicate(posterior.predict(data.x_train, draws=flat), total, data, generator)
    y_obs = task.targets(data, data.y_train)

    sites = posterior.family.latent_sites()
    post = {n: as_numpy(v) for n, v in draws.items()}
    dims = {n: site_dims(n, sites[n], v.shape[2:]) for n, v in post.items() if n in sites}
    post.update(f_test=per_chain(f_test), lp=per_chain(lp))
    dims.update(f_test=["test_point"], y=["train_point"])
    sample_stats = {k: as_numpy(v) for k, v in kept_stats.items()}
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
    """Write ``idata`` as netCDF to ``run_dir/posterior.nc`` atomically (temp file, fsync, rename).

    :param idata: the InferenceData.
    :param run_dir: the run directory.
    :returns: the path written.
    :raises ZooInputError: on an OS error while writing.
    """
    return write_atomically(Path(run_dir) / INFERENCE_DATA_FILE, lambda tmp: idata.to_netcdf(tmp, engine="h5netcdf"))
