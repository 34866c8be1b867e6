"""Assembling a run from its spec: the device, the likelihood, the data placed on the device, and the model family
and guide built on the net and checked against the data (its outputs, its backward pass, its batch norms) before a
fit takes a step. :class:`~zoo.bnn.BNN` assembles every fit with these; ``zoo.pipeline`` re-exports them for
scripts that assemble a run by hand.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any

import pyro
import torch
from torch import nn

from zoo import distributed, registry
from zoo.data import Dataset
from zoo.errors import ZooInputError
from zoo.inference.svi import SVI
from zoo.likelihoods import AutoLikelihoodSpec, Likelihood, LikelihoodSection
from zoo.models.base import ModelFamily, StructureFit
from zoo.nets import build_net, has_convolutions
from zoo.priors import assign_priors
from zoo.runs import (
    RunLog,
    load_point_values,
)
from zoo.spec import RunSpec
from zoo.tasks import task_of

DEVICE_SHARE = 0.5  # the most of a GPU's free memory the training rows may take (the rest: the net, activations)


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when present, else CPU; asking for CUDA without it is an input error. Under ``torchrun``
    each process takes the GPU of its local rank.

    :param name: ``auto``, ``cpu`` or ``cuda``.
    :returns: the device.
    :raises ZooInputError: ``cuda`` where no GPU is visible.
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ZooInputError("device", name, "no CUDA device is visible here; use device: auto or cpu")
    if name == "cuda" and distributed.launched_by_torchrun():
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device(name)


def build_likelihood(spec: LikelihoodSection | AutoLikelihoodSpec, data: Dataset,
                     noise_start: float | None = None) -> Likelihood:
    """The observation model for the data's task (``auto`` picks it).

    :param spec: the spec's likelihood section.
    :param data: the data set.
    :param noise_start: where the inference method starts a learned noise the section leaves open.
    :returns: the likelihood.
    :raises ZooInputError: a likelihood of another task.
    """
    task = task_of(data)
    section = spec.resolve(task.likelihood) if isinstance(spec, AutoLikelihoodSpec) else spec
    if section.task != task.name:
        raise ZooInputError("likelihood.name", section.name, f"{data.name} is a {task.name} task; use "
                            f"{task.likelihood} or auto")
    return section.build(data, noise_start)


def check_outputs(net: nn.Module, likelihood: Likelihood, data: Dataset) -> None:
    """Refuse, before any fit, a net that cannot read the data's rows or whose output width the likelihood cannot
    use (one dry run on two training rows, in evaluation mode).

    :param net: the net.
    :param likelihood: the observation model.
    :param data: the data set.
    :raises ZooInputError: naming what the net gives and what the likelihood needs.
    """
    rows = data.x_train[:2].to(data.device)
    was_training = net.training
    net.eval()
    try:
        with torch.no_grad():
            out = net(rows)
    except (RuntimeError, TypeError, ValueError) as err:
        detail = str(err).splitlines()[0][:160] if str(err) else ""
        raise ZooInputError("net", type(net).__name__, f"it cannot read the data's rows of shape "
                            f"{tuple(rows.shape[1:])}: {type(err).__name__}: {detail}") from None
    finally:
        net.train(was_training)
    _check_backward(net, rows)
    if isinstance(out, tuple | list | dict):  # e.g. (logits, features), {"out": ...}, an RNN's (output, hidden)
        raise ZooInputError("net", type(net).__name__, f"its forward returns a {type(out).__name__}, and the zoo "
                            "reads one tensor of outputs [rows, outputs]: return that tensor alone (e.g. wrap the net "
                            "in a module whose forward returns net(x)[0] or net(x)['out'])")
    if not any(True for _ in net.parameters()):
        raise ZooInputError("net", type(net).__name__, "it has no parameters (buffers are not weights): a BNN puts "
                            "its distributions on the net's weights; give a net with trainable layers")
    want = likelihood.net_outputs(data.out_dim)
    if isinstance(out, torch.Tensor) and out.dim() == 2 and data.n_classes and out.shape[-1] < want:
        raise ZooInputError("targets", f"labels 0 .. {data.n_classes - 1}", f"the net gives {out.shape[-1]} logits per "
                            f"row, so the labels must be 0 .. {out.shape[-1] - 1}; or give the net {want} outputs")
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[-1] != want:
        got = f"outputs of shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise ZooInputError("likelihood", type(likelihood).__name__, f"it reads {want} output(s) per row "
                            f"({data.task}, {data.out_dim if data.n_classes else 1} target(s)), and the net gives "
                            f"{got} for 2 rows: give the net {want} outputs, or another likelihood")


def _check_backward(net: nn.Module, rows: torch.Tensor) -> None:
    """Refuse a net whose forward breaks its own gradient (an in-place op on a tensor autograd saved, e.g.
    ``h.relu_(); h[:, 0] = 0``): one backward pass on two rows, in evaluation mode, that leaves ``.grad`` alone."""
    trained = [p for p in net.parameters() if p.requires_grad]
    if not trained:
        return
    was_training = net.training
    net.eval()
    try:
        out = net(rows)
        if isinstance(out, torch.Tensor) and out.requires_grad and out.is_floating_point():
            torch.autograd.grad(out.sum(), trained, allow_unused=True)
    except RuntimeError as err:
        if "inplace operation" not in str(err):
            raise
        detail = str(err).split(". Hint")[0][:200]
        raise ZooInputError("net", type(net).__name__, f"its forward modifies in place a tensor autograd needs for "
                            f"the gradient ({detail}): use the out-of-place form (torch.relu(h) for h.relu_(), "
                            "h = h * mask or torch.where(...) for h[:, 0] = 0, nn.ReLU(inplace=False))") from None
    finally:
        net.train(was_training)


def check_batch_norm(net: nn.Module, data: Dataset, batch: int) -> None:
    """Refuse a net with BatchNorm whose training would see a batch of one row (batch statistics of one value per
    channel: torch raises "Expected more than 1 value per channel" mid-fit).

    :param net: the net.
    :param data: the data set.
    :param batch: the minibatch size of the method (the training rows' count for a full-batch method).
    :raises ZooInputError: naming the batch of one row and how to avoid it.
    """
    norms = [type(m).__name__ for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    loader = data.train_loader
    if data.streamed:
        size, drop_last = getattr(loader, "batch_size", None), getattr(loader, "drop_last", False)
        if size is None:
            return
        last = 0 if drop_last else data.n_train % size
        smallest, fix = (last or min(size, data.n_train)), "DataLoader(..., drop_last=True), or another batch_size"
    else:
        size = min(batch, data.n_train)
        smallest = data.n_train % size or size
        fix = "an inference.batch_size of 2 or more that leaves no batch of one row"
    if smallest == 1:
        raise ZooInputError("training data", f"a batch of 1 row ({data.n_train} rows, batches of {size})",
                            f"the net's {norms[0]} takes batch statistics and cannot train on a single row: give "
                            f"more rows, or {fix} (or use nn.GroupNorm / nn.LayerNorm)")


def training_rows_stay_on_host(data: Dataset, device: torch.device, dtype: torch.dtype,
                               free_bytes: int | None = None) -> bool:
    """Whether the training rows are too large for the device: on CUDA, more than :data:`DEVICE_SHARE` of its free
    memory (``free_bytes``, else asked of the device). A CPU run holds everything in memory as it is.

    :param data: the data set.
    :param device: where the model computes.
    :param dtype: the run's floating-point type.
    :param free_bytes: the device's free memory (None: asked of it).
    :returns: whether the training rows stay in host memory.
    """
    if device.type != "cuda":
        return False
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info(device)[0]
    return data.training_bytes(dtype) > DEVICE_SHARE * free_bytes


def check_host_rows(spec: RunSpec, data: Dataset) -> None:
    """Refuse what cannot step on training rows kept in host memory: a method that does not stream them a batch at
    a time, or a family or guide that needs every row on the device at once.

    :param spec: the run spec.
    :param data: the data set (in host memory).
    :raises ZooInputError: what cannot work on rows in host memory, with what to change.
    """
    why = ("the training rows do not fit on the GPU (more than half its free memory), so they stay in host memory "
           "and are moved a minibatch at a time")
    registry.method_of(spec).check_rows_on_host(spec.inference, data.n_train, why)
    if spec.guide.needs_every_row:
        raise ZooInputError(*spec.guide.chosen_by, f"{why}; completing this guide takes every row on the "
                            "device: use another guide, or a smaller data set")
    if spec.model.needs_every_row:
        raise ZooInputError("model.family", spec.model.family, f"{why}; this family fits its structure on every row "
                            "on the device: use another family, or a smaller data set")


def place(spec: RunSpec, data: Dataset, log: RunLog | None = None) -> tuple[Dataset, torch.device]:
    """The data on the spec's device and dtype (the training rows kept in host memory where the GPU is too small).

    :param spec: the run spec.
    :param data: the data set.
    :param log: the run's log.
    :returns: the placed data set and the device.
    """
    device, dtype = resolve_device(spec.device), getattr(torch, spec.dtype)
    on_host = training_rows_stay_on_host(data, device, dtype)
    if on_host:
        check_host_rows(spec, data)
        (log or RunLog(None, echo=None))(
            f"the training rows ({data.training_bytes(dtype) / 2**30:.1f} GiB) stay in host memory: more than "
            f"{DEVICE_SHARE:.0%} of the GPU's free memory; each minibatch is moved to the GPU as SVI steps")
    return data.to(device, dtype, training_rows_on_host=on_host), device


def build(spec: RunSpec, data: Dataset, run_dir: Path | None = None, log: RunLog | None = None,
          progress: bool = False) -> tuple[ModelFamily, Any]:
    """Net, priors, likelihood, family and guide for ``spec`` on ``data`` (seeded: same spec, same init).

    A family whose structure depends on a fit to the data (the subnetwork family: a MAP net and a selected
    subnet) fits it here (:meth:`~zoo.models.base.ModelFamily.fit_structure`), keeping what it fitted in
    ``run_dir`` for resumes and reloads.

    :param spec: the run spec.
    :param data: the data, on the run's device and dtype.
    :param run_dir: where a family keeps what it fits of its structure (None: nowhere).
    :param log: the run's log.
    :param progress: whether to show progress bars.
    :returns: the family and the guide.
    :raises ZooInputError: parts that do not fit the net or the data.
    """
    pyro.set_rng_seed(spec.seed)
    likelihood = build_likelihood(spec.likelihood, data)
    start = registry.method_of(spec).noise_start(spec.inference, data.x_calibration is not None, likelihood)
    if start is not None:
        likelihood = build_likelihood(spec.likelihood, data, start)
    net = build_net(spec.net, data.in_dim, likelihood.net_outputs(data.out_dim), data.image_shape, data.name)
    net.to(device=data.device, dtype=data.dtype)
    check_outputs(net, likelihood, data)
    rows = data.x_train[:2].to(data.device)
    batch = getattr(spec.inference, "batch_size", None) or data.n_train
    check_batch_norm(net, data, batch)
    spec.model.check_size(net, rows, min(batch, data.n_train))
    problem = registry.method_of(spec).check_net(spec.inference, spec.model, has_convolutions(net))
    if problem is not None:
        raise problem
    family = spec.model.build(net, assign_priors(spec.prior, spec.model.prior_sites(net)), likelihood)
    dtype = data.dtype
    family.to(data.device, dtype)
    # handed the SVI fit for a MAP net: families do not import inference methods
    family.fit_structure(data, StructureFit(run_dir, spec.seed, log or RunLog(None, echo=None), progress,
                                            fit_map=SVI().fit, dense_matrices=spec.guide.dense_matrices,
                                            factored_layers_only=spec.guide.factored_layers_only,
                                            map_noise_by=registry.method_of(spec).map_noise_by(
                                                spec.inference, data.x_calibration is not None, likelihood),
                                            most_weights=partial(registry.method_of(spec).most_weights, spec)))
    pyro.set_rng_seed(spec.seed)
    guide = spec.guide.build(family.latent_sites())
    # a guide built on the model itself (Pyro's autoguides) traces it at two rows
    guide.bind(family.model, data.x_train[:2].to(data.device), data.y_train[:2].to(data.device))
    if spec.guide.init_from:
        values = load_point_values(spec.guide.init_from)
        if not guide.init_from(values):
            placeless = any(name in family.latent_sites() and not guide.locates(name) for name in values)
            raise ZooInputError("guide.init_from", spec.guide.init_from, (
                f"guide {spec.guide.label} has no location to start its sites at (Pyro's AutoIAFNormal: its flows "
                "start from a standard normal); drop guide.init_from, or use guide.auto: normal, low_rank_mvn or "
                "mvn") if placeless else "no site name and shape matches this net")
    guide.to(device=data.device, dtype=dtype)
    return family, guide


def describe(spec: RunSpec) -> str:
    """``family ..., guide ...`` (a method that fits the spec's guide) or ``family ..., <the method's phrase>``
    (``sampled by hmc``, ``laplace (glm predictive)``): what a run fits, in one phrase.

    :param spec: the run spec.
    :returns: the phrase.
    """
    method = registry.method_of(spec)
    how = f"guide {spec.guide.label}" if method.fits_guide else method.describe(spec.inference)
    return f"family {spec.model.family}, {how}"
