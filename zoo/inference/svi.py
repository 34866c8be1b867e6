"""Stochastic variational inference: minibatch training of any model/guide pair, checkpointed and resumable."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import random
import shutil
import statistics
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyro
import torch
from pyro.optim.clipped_adam import ClippedAdam

from zoo import distributed
from zoo.data.augment import build_augmentation
from zoo.distributed import ObservationScale, World, check_global_batch, signal_flags, signal_from_flags
from zoo.errors import TrainingDiverged, ZooInputError, ZooWarning
from zoo.inference.base import FitContext, InferenceMethod, guide_fit_record, load_guide_checkpoint, widen_priors
from zoo.inference.compiled import TracedCompile
from zoo.inference.elbo import ANALYTIC, ELBOS, MONTE_CARLO, LazyTraceMeanField_ELBO
from zoo.inference.local_reparam import LocalReparameterization
from zoo.inference.loop import TrainingLoop
from zoo.inference.lr_choice import (
    LR_CHOICE_DIR,
    calibration_score,
    chooses_lr,
    chooses_prior_scale,
    every_candidate_diverged,
    reach_past,
)
from zoo.inference.noise_choice import chooses_noise
from zoo.likelihoods import Likelihood, gaussian
from zoo.models.base import restore_buffers
from zoo.nets import batch_dependent, input_image_shape
from zoo.posterior import GuidePosterior, Posterior
from zoo.runs import CHECKPOINT_FILE, RunLog
from zoo.sections import (
    CUDA_READ_LOSS_EVERY,
    DEFAULT_LR,
    DEFAULT_LR_DECAY_TO,
    DEFAULT_LR_HOLD,
    LR_CANDIDATES,
    PRIOR_SCALE_FACTORS,
    SVIFitting,
    SVISpec,
)

AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {"none": None, "bf16": torch.bfloat16}  # inference.autocast


@dataclass
class SVIResult:
    """What a fit leaves behind besides the trained guide: the loss curve and its cost.

    :ivar losses: the loss of every step, in order: the negative ELBO (KL-weighted while annealing, tempered with
        ``temperature``) scaled to all training rows, in nats.
    :ivar seconds: the fit's wall time in seconds, over every resumed part (completing the guide included).
    :ivar kl_methods: how each latent site's KL term was computed, ``{site: "analytic" or "monte_carlo"}``.
    :ivar posterior: the fitted guide's posterior; None until the fit ends.
    :ivar chosen: what the fit chose on its calibration rows, by spec field: ``inference.lr`` (``lr_by``), then
        each setting its spec left open (``guide.dropout_rate``, ``likelihood.noise_prior.init``).
    """

    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    kl_methods: dict[str, str] = field(default_factory=dict)
    posterior: Posterior | None = None
    chosen: dict[str, Any] = field(default_factory=dict)


class SVIStep:
    """One SVI update of ``model``/``guide``: ELBO estimate, backward, optimiser step.

    Kept separate from the loop so that the benchmark times exactly the step that training runs. The first
    step runs with Pyro's and torch's argument validation on (it catches model/guide mistakes); later steps
    run with it off, because re-checking every distribution's arguments costs more than the maths of a small net.

    With ``compile=True``, later steps run the ELBO as a compiled graph: the eager ELBO (Pyro's handlers,
    the guide's draws, every KL and log-likelihood term) is traced once per minibatch size by ``make_fx``
    into the tensor operations it performs, with the parameters read in place, and ``torch.compile`` fuses
    them. Pyro's per-site bookkeeping then costs nothing per step; the estimator and its gradients are the
    same (a test checks the traced graph against the eager ELBO at the same seed). Anything the tracer cannot
    follow makes it say so and stay eager. The graph holds the reverse pass too: it returns the loss and every
    gradient, so no autograd graph is built at run time, and the optimiser (torch's fused Adam: one kernel, in place)
    steps on them; with several processes the gradients' all-reduce sits between. On a net with BatchNorm the graph
    is the ELBO alone and AOTAutograd compiles its reverse pass (``reverse_in_graph``). On a GPU the graph is
    captured as a CUDA graph, its random draws made eagerly and passed in
    (:class:`~zoo.inference.compiled.TracedCompile`).

    :param model: the Pyro model, called as ``model(x, y, batch)`` (a family's
        :meth:`~zoo.models.base.ModelFamily.model`).
    :param guide: the guide over the model's latent sites, called with the model's arguments.
    :param elbo: the ELBO estimator; the caller sets its ``kl_weight`` and ``temperature``.
    :param optimizer: the optimiser over every trained tensor (:func:`make_optimizer`); its parameters' device is
        where the model computes.
    :param local_reparam: sample the Linear and Conv2d pre-activations instead of the weights of every weight drawn
        from a Normal guide (:class:`~zoo.inference.local_reparam.LocalReparameterization`).
    :param compile: run the steps after the first as a traced and compiled ELBO graph (see above).
    :param world: the processes training together, each on its share of every minibatch (None: this one alone).
    :param augment: a training-time augmentation applied to each minibatch's inputs ``x`` (None: none).
    :param read_each_step: read each step's loss on the host before stepping, skipping the optimiser step on a
        non-finite one; False leaves the reads to the caller and never waits for the device.
    :param autocast: the lower precision (``torch.bfloat16``) the step's matmuls and convolutions run in under
        ``torch.autocast``; None keeps the parameters' dtype.
    :param rows_on_host: the training rows stay in host memory: each minibatch is moved to the device as it steps.
    :param reverse_in_graph: compile the reverse pass into the step's graph, which returns the gradients (True), or
        compile the ELBO alone and let AOTAutograd compile its reverse pass (False); None: the former except for a
        net with BatchNorm, where the latter was measured faster (ResNet-20: 1.19x).
    :raises ZooInputError: when both ``augment`` and ``compile`` are asked for.
    """

    def __init__(self, model, guide, elbo: LazyTraceMeanField_ELBO, optimizer: torch.optim.Optimizer,
                 local_reparam: bool = False, compile: bool = False, world: World | None = None,
                 augment: Callable[[torch.Tensor], torch.Tensor] | None = None, read_each_step: bool = True,
                 autocast: torch.dtype | None = None, rows_on_host: bool = False,
                 reverse_in_graph: bool | None = None) -> None:
        if augment is not None and compile:
            raise ZooInputError("inference.compile", True, "is not supported with inference.augment yet; drop one")
        self.autocast = autocast  # the lower precision of the step's matmuls and convolutions (None: the params')
        self.model, self.guide, self.elbo, self.optimizer = model, guide, elbo, optimizer
        self.augment = augment
        self.reparam = LocalReparameterization() if local_reparam else None
        self.validated = False
        net = getattr(getattr(model, "__self__", None), "net", None)  # a family's model knows its net
        net = net if isinstance(net, torch.nn.Module) else None
        if reverse_in_graph is None:
            reverse_in_graph = net is None or not batch_dependent(net)
        self.reverse_in_graph = reverse_in_graph
        traced = self._loss_and_grads if reverse_in_graph else self._weighted_loss
        buffers = (lambda: list(net.buffers())) if net is not None else None  # running statistics: tracing keeps them
        self._compiled = (TracedCompile(traced, "the SVI step", cuda_graphs=True, differentiable=not reverse_in_graph,
                                        untouched=buffers) if compile else None)
        self.world = world or World()
        self.signalled: Callable[[], int] = lambda: 0  # the fit loop's deferred_interrupt sets it
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.device = self.params[0].device if self.params else torch.device("cpu")  # where the model computes
        self.rows_on_host = rows_on_host  # the training rows stay in host memory: move each minibatch to the device
        self.read_each_step = read_each_step  # read the loss on the host before stepping (else the loop reads it)
        self.signal = 0  # the signal (SIGINT/SIGTERM) some rank received by the end of the last read step, else 0
        self._flags: torch.Tensor | None = None  # several ranks: the last step's all-reduced signal counts

    @property
    def compiled(self) -> bool:
        """Whether steps run the compiled ELBO (asked for, and tracing and compiling have not failed)."""
        return self._compiled is not None and self._compiled.active

    def __call__(self, x: torch.Tensor, y: torch.Tensor, batch: torch.Tensor | None,
                 n_rows: int | None = None) -> torch.Tensor:
        """Step on rows ``batch`` of (x, y) and return the loss, a detached 0-d tensor on the device.

        ``n_rows`` says that ``x, y`` are one minibatch streamed from a loader (moved to the device here) of a data
        set of ``n_rows`` rows, which the likelihood is scaled to.

        With ``read_each_step`` the loss is read on the host first and a non-finite one is returned without a
        step. Without it nothing here waits for the device: the optimiser steps whatever the loss, and the caller
        reads the losses later (see :func:`fit_svi`). With several ranks, this rank computes the ELBO on its share
        of ``batch`` (all rows when ``None``) and one all-reduce averages the gradients and the losses and counts
        the ranks that received a signal (:meth:`read_signal`).
        """
        rows, factor, noise_rows = batch, 1.0, None
        if self.world.size > 1:
            every = batch if batch is not None else torch.arange(len(x), device=x.device)
            rows, where, factor = self.world.shard(every)
            noise_rows = (where.start, where.stop, len(every))
        streamed = n_rows is not None
        if self.augment is not None or self.rows_on_host or streamed:
            # the minibatch's rows taken out (moved to the device when the training rows stay in host memory or come
            # from a loader) and augmented alike on every rank (one random stream), this rank's rows kept; the model
            # then sees only these rows as its data, so the likelihood factor scales them to all n_rows rows
            n_rows = n_rows if streamed else len(x)
            if batch is not None:
                x, y = x.index_select(0, batch), y.index_select(0, batch)
            if self.rows_on_host or streamed:
                x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            if self.augment is not None:
                x = self.augment(x)
            if self.world.size > 1:
                x, y = x[where], y[where]
            rows, factor = None, factor * n_rows / len(x)
        loss, grads = None, None
        if self.validated and self.compiled and not self.rows_on_host and not streamed:
            weight = torch.tensor(self.elbo.kl_weight, dtype=self.params[0].dtype, device=x.device)
            inputs = (x, y, weight) if rows is None else (x, y, weight, rows)
            if self.world.size > 1:
                inputs += (torch.tensor(factor, dtype=self.params[0].dtype, device=x.device),)
            out = self._compiled(*inputs, static={"noise_rows": noise_rows})
            if out is not None and self.reverse_in_graph:
                loss, *grads = out
            else:
                loss = out
        if loss is None:
            loss = self.loss(x, y, rows, factor, noise_rows)
        self.validated = True
        value = loss.detach()
        finite = math.isfinite(float(value)) if self.read_each_step else True
        self.optimizer.zero_grad(set_to_none=self.world.size == 1)
        if finite and grads is not None:  # the compiled graph's reverse pass
            for p, g in zip(self.params, grads, strict=True):
                p.grad = g
        elif finite:
            loss.backward()
        if self.world.size > 1:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
            for p, g in zip(self.params, grads, strict=True):
                p.grad = g
            counts = torch.cat([value.reshape(1), value.new_tensor(signal_flags(self.signalled()))])
            summed = self.world.average(grads, counts)
            value, self._flags = summed[0] / self.world.size, summed[1:]
            if self.read_each_step:
                finite = math.isfinite(float(value))
                self.signal = self.read_signal()
        else:
            self.signal = self.signalled()  # a host flag: no device read
        if finite:
            self.optimizer.step()
        elif self.compiled:  # the per-site terms of an eager evaluation, for the diagnosis
            with torch.no_grad():
                self.loss(x, y, rows, factor, noise_rows)
        return value

    def read_signal(self) -> int:
        """The signal (SIGINT/SIGTERM) any rank had received by the last step, else 0. With several ranks this
        reads the all-reduced counts on the host; every rank reads at the same steps, so all stop at the same one.

        :returns: the signal's number, or 0 when no rank received one.
        """
        if self.world.size == 1:
            return self.signalled()
        return signal_from_flags(self._flags.tolist()) if self._flags is not None else 0

    def loss(self, x: torch.Tensor, y: torch.Tensor, batch: torch.Tensor | None,
             obs_factor: float | torch.Tensor = 1.0, noise_rows: tuple[int, int, int] | None = None) -> torch.Tensor:
        """The negative ELBO on rows ``batch``, evaluated eagerly (validation on until the first step is done).

        ``obs_factor`` scales the likelihood only and ``noise_rows`` places a rank's rows in the global minibatch
        (see :meth:`World.shard`); one process leaves both at their defaults.

        :param x: the inputs ``[N, ...]``: every training row, or only the minibatch's own rows.
        :param y: the targets of the rows of ``x`` ``[N]``.
        :param batch: the indices of the minibatch's rows in ``x`` and ``y`` (None: every row of them).
        :param obs_factor: the factor the likelihood is scaled by on top of the model's own scaling (a rank's share,
            or the data set's rows over the minibatch's when ``x`` holds only the minibatch).
        :param noise_rows: ``(start, stop, total)``: this rank's rows are ``start:stop`` of a ``total``-row global
            minibatch, so that the local reparameterisation draws each row's noise as one process would.
        :returns: the negative ELBO (KL-weighted, tempered), a 0-d tensor that gradients flow back through.
        """
        scaled = isinstance(obs_factor, torch.Tensor) or obs_factor != 1.0
        scale = ObservationScale(obs_factor) if scaled else contextlib.nullcontext()
        if self.reparam is not None:
            self.reparam.rows = noise_rows
        lower = torch.autocast(x.device.type, self.autocast) if self.autocast else contextlib.nullcontext()
        with pyro.validation_enabled(not self.validated), self.reparam or contextlib.nullcontext(), scale, lower:
            return self.elbo.differentiable_loss(self.model, self.guide, x, y, batch)

    def _loss_and_grads(self, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
                        batch: torch.Tensor | None = None, obs_factor: torch.Tensor | None = None,
                        noise_rows: tuple[int, int, int] | None = None) -> tuple[torch.Tensor, ...]:
        """:meth:`_weighted_loss` and its gradient in every trained tensor, for tracing into one graph: the loss, then
        one gradient per parameter (zeros for one the loss does not read)."""
        loss = self._weighted_loss(x, y, weight, batch, obs_factor, noise_rows)
        grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        return loss.detach(), *(g if g is not None else torch.zeros_like(p)
                                for p, g in zip(self.params, grads, strict=True))

    def _weighted_loss(self, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
                       batch: torch.Tensor | None = None, obs_factor: torch.Tensor | None = None,
                       noise_rows: tuple[int, int, int] | None = None) -> torch.Tensor:
        """:meth:`loss` with the KL weight (and a rank's likelihood factor) as tensor inputs, so that one traced
        graph serves every weight."""
        saved = self.elbo.kl_weight
        self.elbo.kl_weight = weight
        try:
            return self.loss(x, y, batch, 1.0 if obs_factor is None else obs_factor, noise_rows)
        finally:  # the traced terms are not tensors of any later eager step
            self.elbo.kl_weight, self.elbo.last_terms = saved, {}


def make_optimizer(params: list[torch.nn.Parameter], spec: SVIFitting) -> torch.optim.Optimizer:
    """One optimiser over every trained tensor (no per-parameter optimiser bookkeeping), at the run's starting
    learning rate; the run sets its lr each step from :func:`scheduled_lr` (ClippedAdam's own decay is off).

    :param params: the trained tensors: the guide's parameters and the family's point parameters.
    :param spec: the run's ``inference`` section (its ``optimizer``, ``lr`` and ``clip_norm``).
    :returns: a :class:`~pyro.optim.clipped_adam.ClippedAdam` for ``clipped_adam``, else a torch Adam (fused when
        every tensor is float32 or float64).
    """
    if spec.optimizer == "clipped_adam":
        return ClippedAdam(params, lr=starting_lr(spec), clip_norm=spec.clip_norm, lrd=1.0)
    fused = all(p.dtype in (torch.float32, torch.float64) for p in params)
    return torch.optim.Adam(params, lr=starting_lr(spec), fused=fused)


def starting_lr(spec: SVIFitting) -> float:
    """The learning rate of the first step: ``lr``, or :data:`~zoo.sections.DEFAULT_LR` where none is set.

    :param spec: the run's ``inference`` section.
    :returns: the learning rate.
    """
    return DEFAULT_LR if spec.lr is None else spec.lr


def _hold_share(spec: SVIFitting) -> float:
    return spec.lr_hold if spec.lr_hold is not None else (DEFAULT_LR_HOLD if spec.lr is None else 0.0)


def lr_hold_steps(spec: SVIFitting, n_steps: int | None = None) -> int:
    """Steps taken at the starting lr before its decay begins: ``lr_hold`` of the run, or
    :data:`~zoo.sections.DEFAULT_LR_HOLD` of it for the default lr; 0 when the lr is constant.

    :param spec: the run's ``inference`` section (its ``lr``, ``lr_hold``, ``lr_decay`` and ``lr_decay_to``).
    :param n_steps: the run's steps; needed only when a share of them is held.
    :returns: the held steps.
    :raises ValueError: when a share is held and ``n_steps`` is None.
    """
    if _hold_share(spec) == 0.0 or lr_decay_per_step(spec, n_steps) == 1.0:
        return 0
    return int(_hold_share(spec) * _run_length(spec, n_steps, "lr_hold"))


def scheduled_lr(spec: SVIFitting, step: int, n_steps: int | None = None) -> float:
    """The learning rate of step ``step`` (from 0): the starting lr for the held steps, then times the per-step
    decay once for each step after them.

    :param spec: the run's ``inference`` section.
    :param step: the step, from 0.
    :param n_steps: the run's steps; needed only when the lr decays to a share of itself or a share is held.
    :returns: the learning rate.
    """
    return starting_lr(spec) * lr_decay_per_step(spec, n_steps) ** max(0, step - lr_hold_steps(spec, n_steps))


def loss_read_interval(spec: SVIFitting, device: torch.device) -> int:
    """Steps between host reads of the loss: ``inference.read_loss_every``, else 1 on CPU (a read costs nothing
    there) and ``CUDA_READ_LOSS_EVERY`` on CUDA (a read each step would stall the GPU's queue every step).

    :param spec: the run's ``inference`` section (its ``read_loss_every``).
    :param device: where the model computes.
    :returns: the steps between reads, at least 1 (1: every step's loss is read before the next step).
    """
    if spec.read_loss_every is not None:
        return spec.read_loss_every
    return CUDA_READ_LOSS_EVERY if device.type == "cuda" else 1


def total_steps(spec: SVIFitting, n_train: int) -> int:
    """Number of optimisation steps: ``num_steps`` if given, else ``epochs`` passes over the data.

    :param spec: the run's ``inference`` section (its ``num_steps``, ``epochs`` and ``batch_size``).
    :param n_train: training rows.
    :returns: the run's steps.
    """
    if spec.num_steps is not None:
        return spec.num_steps
    return (spec.epochs or 1) * steps_per_epoch(spec, n_train)


def steps_per_epoch(spec: SVIFitting, n_train: int) -> int:
    """Minibatches per pass over the training set.

    :param spec: the run's ``inference`` section (its ``batch_size``; None: the full batch).
    :param n_train: training rows.
    :returns: the minibatches per epoch, at least 1 (the last one may be partial).
    """
    return 1 if spec.batch_size is None else max(1, math.ceil(n_train / spec.batch_size))


def check_shards(spec: SVIFitting, n_train: int, world_size: int) -> None:
    """Refuse minibatches that ``world_size`` processes cannot share: a global batch not divisible by it, or an
    epoch's last (partial) batch, or the full batch, with fewer rows than processes.

    :param spec: the run's ``inference`` section (its ``batch_size``).
    :param n_train: training rows.
    :param world_size: the processes training together.
    :raises ZooInputError: when the processes cannot share the minibatches.
    """
    if world_size == 1:
        return
    if spec.batch_size is not None and spec.batch_size < n_train:
        check_global_batch(spec.batch_size, world_size)
        last = n_train % spec.batch_size
        if 0 < last < world_size:
            raise ZooInputError("inference.batch_size", spec.batch_size, f"each epoch ends with a batch of {last} "
                                f"of the {n_train} rows, fewer than the {world_size} processes: pick another size")
    elif n_train < world_size:
        raise ZooInputError("--nproc", world_size, f"more processes than the {n_train} training rows")


def _run_length(spec: SVIFitting, n_steps: int | None, what: str) -> int:
    if n_steps is None:
        raise ValueError(f"{what} is a share of the run: pass the run's number of steps")
    return max(1, n_steps)


def lr_decay_per_step(spec: SVIFitting, n_steps: int | None = None) -> float:
    """The per-step lr factor: ``lr_decay``, or the one that leaves ``lr_decay_to`` of the lr at the last of
    ``n_steps`` steps, the decay starting after the held steps (:func:`lr_hold_steps`); without a set lr and without
    either, the one that leaves :data:`~zoo.sections.DEFAULT_LR_DECAY_TO`.

    :param spec: the run's ``inference`` section (its ``lr``, ``lr_decay``, ``lr_decay_to`` and ``lr_hold``).
    :param n_steps: the run's steps; needed only when the lr decays to a share of itself.
    :returns: the factor the lr is multiplied by at each decaying step, in (0, 1].
    :raises ValueError: when the lr decays to a share of itself and ``n_steps`` is None.
    """
    decay_to = spec.lr_decay_to
    if decay_to is None and spec.lr is None and spec.lr_decay == 1.0:
        decay_to = DEFAULT_LR_DECAY_TO
    if decay_to is None:
        return spec.lr_decay
    n = _run_length(spec, n_steps, "lr_decay_to")
    return decay_to ** (1.0 / max(1, n - int(_hold_share(spec) * n)))


def annealing_steps(spec: SVIFitting, n_steps: int | None = None) -> int:
    """Steps of the KL warm-up: ``kl_annealing_steps``, or ``kl_annealing_fraction`` of ``n_steps``.

    :param spec: the run's ``inference`` section (its ``kl_annealing_steps`` and ``kl_annealing_fraction``).
    :param n_steps: the run's steps; needed only with ``kl_annealing_fraction``.
    :returns: the warm-up's steps (0: no warm-up; at least 1 from a fraction).
    :raises ValueError: when ``kl_annealing_fraction`` is set and ``n_steps`` is None.
    """
    if spec.kl_annealing_fraction is None:
        return spec.kl_annealing_steps
    return max(1, round(spec.kl_annealing_fraction * _run_length(spec, n_steps, "kl_annealing_fraction")))


def kl_weight(step: int, spec: SVIFitting, n_steps: int | None = None) -> float:
    """Linear KL annealing: weight (step + 1) / the warm-up's steps, capped at 1 (1 throughout without one).

    :param step: the step, from 0.
    :param spec: the run's ``inference`` section (its KL annealing settings, see :func:`annealing_steps`).
    :param n_steps: the run's steps; needed only with ``kl_annealing_fraction``.
    :returns: the weight of the KL term at ``step``, in (0, 1].
    """
    warmup = annealing_steps(spec, n_steps)
    return 1.0 if warmup == 0 else min(1.0, (step + 1) / warmup)


def describe_kl(kl_methods: dict[str, str]) -> str:
    """One log line saying which sites had an analytic KL and which a Monte Carlo estimate.

    :param kl_methods: ``{site: "analytic" or "monte_carlo"}``, as the ELBO recorded them.
    :returns: the line, each list ``-`` when empty.
    """
    analytic = [n for n, m in kl_methods.items() if m == ANALYTIC]
    mc = [n for n, m in kl_methods.items() if m == MONTE_CARLO]
    return f"KL analytic: {', '.join(analytic) or '-'} | KL Monte Carlo: {', '.join(mc) or '-'}"


def _non_finite(params: dict[str, torch.Tensor]) -> list[str]:
    return [n for n, p in params.items() if not torch.isfinite(p).all()]


def untried_remedies(spec: SVIFitting, dtype: torch.dtype, init_rho: float | None) -> list[str]:
    """What may stop a non-finite ELBO, leaving out what the run already does.

    :param spec: the run's ``inference`` section (its ``lr``, ``optimizer``, ``clip_norm`` and KL annealing).
    :param dtype: the run's floating-point type.
    :param init_rho: the guide's initial rho (its softplus-parameterised scale); None for a guide without one.
    :returns: the remedies, each a short instruction naming the spec setting to change.
    """
    lr = starting_lr(spec)
    hints = [f"lower inference.lr (now {lr:g}), e.g. to {lr / 10:g}"]
    if spec.optimizer != "clipped_adam":
        hints.append("use inference.optimizer: clipped_adam (it clips each gradient's norm)")
    else:
        hints.append(f"lower inference.clip_norm (now {spec.clip_norm:g})")
    if init_rho is not None and init_rho > -6:
        hints.append(f"start from a narrower guide: guide.init_rho below {init_rho:g}")
    if spec.kl_annealing_steps == 0 and spec.kl_annealing_fraction is None:
        hints.append("warm the KL up: inference.kl_annealing_steps, e.g. 1000")
    if dtype != torch.float64:
        hints.append("compute in dtype: float64")
    return hints


def _diagnose(elbo: LazyTraceMeanField_ELBO, params: dict[str, torch.Tensor], step: int, ckpt: Path | None,
              remedies: list[str], read_at: int | None = None) -> str:
    """Why the fit stops at a non-finite loss of step ``step``; ``read_at``: the step whose end read it, when
    the loss was read later (the steps in between were applied, so the terms and parameters are of that step)."""
    bad_terms = [n for n, t in elbo.last_terms.items() if not torch.isfinite(t).all()]
    bad_params = _non_finite(params)
    where = f"last good checkpoint: {ckpt}" if ckpt is not None and ckpt.exists() else "no checkpoint was written yet"
    late = ""
    if read_at is not None and read_at > step + 1:
        late = (f" (read after step {read_at - 1}: inference.read_loss_every lets steps run before their loss is "
                f"read; the terms and parameters below are as of step {read_at - 1})")
    return (f"ELBO is not finite at step {step}{late}. Non-finite terms: {', '.join(bad_terms) or 'none'}; "
            f"non-finite parameters: {', '.join(bad_params) or 'none'}. {where}. Try: {'; or '.join(remedies)}.")


class DivergenceWatch:
    """Catches an SVI fit whose loss runs away while staying finite (NaN is caught where the loss is read).

    The loss is read per training row, as the median of the last ``window`` steps (a single noisy step moves it
    little). When that median rises more than ``factor`` x max(|best|, ``floor``) nats per row above the best
    median so far, the fit is blowing up: a :class:`~zoo.errors.ZooWarning` names the step, the largest ELBO
    terms and the remedies not yet tried; if it has not come back below that line ``patience`` steps later, the
    fit stops with :class:`~zoo.errors.TrainingDiverged`. The floor (1,000 nats per row with the defaults) keeps
    the rise that KL annealing causes, at most the KL per row, from ever counting.

    :param n_rows: training rows (each step's loss, scaled to all of them, is divided by it).
    :param n_steps: the run's steps (they set the default ``patience``).
    :param window: the steps whose median loss is compared.
    :param factor: how many times max(|best|, ``floor``) the median may rise above the best before it counts.
    :param floor: the smallest scale of the allowed rise, in nats per row.
    :param patience: the steps the median may stay over the line before the fit stops (None: max(100,
        ``n_steps // 20``)).
    """

    def __init__(self, n_rows: int, n_steps: int, window: int = 20, factor: float = 100.0, floor: float = 10.0,
                 patience: int | None = None) -> None:
        self.n_rows, self.window, self.factor, self.floor = n_rows, window, factor, floor
        self.patience = patience if patience is not None else max(100, n_steps // 20)
        self.best: tuple[float, int] | None = None  # (median loss per row, step)
        self.since: int | None = None  # the step the loss first went over the line, while it stays there

    def resume(self, losses: list[float], step: int) -> None:
        """Take the best median of a resumed fit's earlier losses, so the line is where it was before the stop.

        :param losses: the resumed fit's losses so far, one per step (:attr:`SVIResult.losses`).
        :param step: the steps taken so far (the fit resumes at this step); ``losses`` ends with the last one's.
        """
        for end in range(self.window, len(losses) + 1):
            median = statistics.median(losses[end - self.window:end]) / self.n_rows
            if self.best is None or median < self.best[0]:
                self.best = (median, step - len(losses) + end)

    def line(self) -> float:
        """The loss per row above which the fit counts as blowing up.

        :returns: the line, in nats per training row (only once a best median is known).
        """
        assert self.best is not None
        return self.best[0] + self.factor * max(abs(self.best[0]), self.floor)

    def __call__(self, losses: list[float], step: int, elbo: LazyTraceMeanField_ELBO, remedies: list[str],
                 checkpoint: Path | None) -> None:
        if len(losses) < self.window:
            return
        median = statistics.median(losses[-self.window:]) / self.n_rows
        if self.best is None or median < self.best[0]:
            self.best = (median, step)
        if median <= self.line():
            self.since = None
            return
        terms = sorted(elbo.last_terms.items(), key=lambda kv: -abs(float(kv[1].detach().sum())))[:3]
        largest = ", ".join(f"{name} {float(t.detach().sum()):.3g}" for name, t in terms) or "not recorded"
        what = (f"the SVI loss per training row rose from {self.best[0]:.4g} (its best, by step {self.best[1]}) to "
                f"{median:.4g} by step {step}, over {self.factor:g}x its best; largest ELBO terms at the last step: "
                f"{largest}")
        if self.since is None:
            self.since = step
            warnings.warn(f"{what}. The fit may be diverging; it stops if the loss is not back under "
                          f"{self.line():.4g} per row within {self.patience} steps. Try: {'; or '.join(remedies)}",
                          ZooWarning, stacklevel=2)
        elif step - self.since >= self.patience:
            where = f"Last checkpoint: {checkpoint}" if checkpoint is not None and checkpoint.exists() else \
                "No checkpoint was written yet"
            raise TrainingDiverged(f"diverged: {what}, and it stayed there since step {self.since}. {where}. "
                                   f"Try: {'; or '.join(remedies)}.")


def fit_svi(fit: FitContext) -> SVIResult:
    """Maximise the ELBO of ``family.model`` under ``guide`` with minibatches scaled to the full data set.

    Every ``checkpoint_every`` steps (and at the end, and on Ctrl-C) the guide, the optimiser, the data order
    and the random state are saved atomically to ``run_dir/checkpoint.pt``; ``resume=True`` continues from
    there and reproduces the uninterrupted run exactly on CPU. ``monitor`` scores the guide's posterior on the
    evaluation rows at evenly spaced steps (a sweep prunes on it); it does not change the steps taken.

    :param fit: the fit's :class:`~zoo.inference.base.FitContext`, read as follows. ``family``: the model family whose
        Pyro model is fitted (its point parameters are trained alongside); ``guide``: the spec's guide, trained in
        place and completed after the fit (its ``finish``); ``data``: the data set: its training rows on the device,
        in host memory (moved a minibatch at a time) or streamed from a loader; ``spec``: the run's ``inference``
        section (steps or epochs, minibatch size, optimiser and learning rate, ELBO, KL annealing, checkpoint
        interval); ``seed``: seeds the minibatch order; ``run_dir``: where ``checkpoint.pt`` is written; None writes
        nothing; ``resume``: continue from ``run_dir``'s ``checkpoint.pt``; ``log``: the run's log (None: no
        messages); ``progress``: whether to show a progress bar; ``monitor``: scores the guide's posterior on the
        evaluation rows during the fit (None: no scoring).
    :returns: the loss curve, the KL method of each site, the wall time and the guide's posterior.
    :raises ZooInputError: when the processes cannot share the minibatches, or ``resume`` finds no checkpoint.
    :raises TrainingDiverged: when the initial or trained parameters or a step's loss are not finite, or the loss
        runs away (:class:`DivergenceWatch`).
    """
    run = SVIRun(fit)
    if fit.resume:
        run.resume()
    run.choose_lr()
    run.check_start()
    run.train()
    if fit.run_dir is not None:  # the run has kept its lr's candidate run: the others' checkpoints go
        shutil.rmtree(fit.run_dir / LR_CHOICE_DIR, ignore_errors=True)
    return run.finish()


def with_starting_lr(spec: SVIFitting, lr: float) -> SVIFitting:
    """``spec`` (its lr null) with ``lr`` in place of :data:`~zoo.sections.DEFAULT_LR`, held and decayed as the
    default schedule holds and decays it: every step's lr is the default's times ``lr / DEFAULT_LR``.

    :param spec: an ``inference`` section whose ``lr`` is null.
    :param lr: the starting lr.
    :returns: the section with ``lr``, ``lr_hold`` and ``lr_decay_to`` written out (``lr_by: fixed``).
    """
    decay_to = spec.lr_decay_to
    if decay_to is None and spec.lr_decay == 1.0:
        decay_to = DEFAULT_LR_DECAY_TO
    return spec.model_copy(update={"lr": lr, "lr_by": "fixed", "lr_hold": _hold_share(spec), "lr_decay_to": decay_to})


@dataclass
class OpenSetting:
    """A setting the spec left null for the fit to choose on its calibration rows once it has its starting lr (MC
    dropout's rate, :meth:`guides.base.Guide.open_setting`; a learned noise's start,
    :meth:`zoo.likelihoods.base.Likelihood.open_start`).

    :ivar name: the spec field (``guide.dropout_rate``).
    :ivar held: the value the run holds until the choice (its incumbent's).
    :ivar candidates: the values the choice runs.
    :ivar take: makes the run at its start hold a value (the guide's state then carries it).
    :ivar each_lr: where the fit chooses its lr too, run each candidate at every starting lr
        (:data:`~zoo.sections.LR_CANDIDATES`), not only at the one chosen before: a joint choice, for a setting that
        changes which lr is best (a noise's start).
    :ivar beyond: values past the candidates' nearest edge, nearest first, each run only while the value run last at
        that edge scores best (:attr:`guides.base.SettingChoice.beyond`: MC dropout's rates below its grid;
        :meth:`runs`).
    """

    name: str
    held: float
    candidates: tuple[float, ...]
    take: Callable[[float], None]
    each_lr: bool = False
    beyond: tuple[float, ...] = ()

    def runs(self, lrs: tuple[float | None, ...], incumbent: CandidateRun | None,
             say: Callable[[str], None]) -> Iterator[CandidateRun]:
        """The choice's runs, made lazily: each candidate at each of ``lrs`` but the incumbent's value (the run kept by
        the choice before, at :attr:`held`), then each of :attr:`beyond` while the value run last at the edge holds
        the best score so far (:func:`~zoo.inference.lr_choice.reach_past`; the runs' scores are read as they come).

        :param lrs: the starting lrs each value runs at.
        :param incumbent: the run kept so far (None: the first choice, every candidate runs).
        :param say: the fit's log, told why a value past the grid runs.
        :returns: the runs.
        """
        made = [] if incumbent is None else [incumbent]

        def why(edge: float) -> str | None:
            best = min(made, key=lambda run: run.score)  # the first of equals, as the choice keeps it
            return f"svi: {self.name} {edge:g}, the edge of the values run, scored best" if best.value == edge else None

        for value in reach_past(self.candidates, self.beyond, why, say):
            for lr in lrs:
                if incumbent is None or value != self.held:
                    made.append(CandidateRun(lr, value, self.name))
                    yield made[-1]


@dataclass
class CandidateRun:
    """One candidate run of a choice on the calibration rows (:meth:`SVIRun.choose_lr`).

    :ivar lr: its starting lr (None: the spec's).
    :ivar value: the setting's value (None: an lr's candidate).
    :ivar setting: the setting's spec field (None: an lr's candidate).
    :ivar score: its score on the calibration rows, lower is better.
    :ivar ended: its end state (:meth:`SVIRun.end_state`).
    """

    lr: float | None
    value: float | None
    setting: str | None = None
    score: float = math.inf
    ended: dict = field(default_factory=dict)

    @property
    def choice(self) -> str:
        """The value chosen between the candidates: ``0.003`` (an lr), ``0.05`` (a setting's)."""
        return f"{self.lr if self.value is None else self.value:g}"

    def key(self, each_lr: bool) -> str:
        """How a choice's scores name it: :attr:`choice`, and a setting's lr where its candidates run at each.

        :param each_lr: whether the choice runs the setting's candidates at every starting lr.
        :returns: ``0.05`` or ``0.367879 at lr 0.003``.
        """
        at = each_lr and self.value is not None and self.lr is not None
        return f"{self.choice} at lr {self.lr:g}" if at else self.choice

    def shown(self) -> str:
        """How the log names it.

        :returns: ``lr 0.003`` (an lr's candidate), ``guide.dropout_rate 0.05 at lr 0.01`` (a setting's).
        """
        if self.value is None:
            return f"lr {self.lr:g}"
        return f"{self.setting} {self.value:g}" + ("" if self.lr is None else f" at lr {self.lr:g}")

    def folder(self) -> str:
        """Its run directory's name in ``lr_choice/``.

        :returns: ``0.003`` (an lr's candidate), ``0.01_dropout_rate0.05`` (a setting's at lr 0.01),
            ``dropout_rate0.05`` (at the spec's lr).
        """
        lr = "" if self.lr is None else f"{self.lr:g}"
        if self.value is None:
            return lr
        return f"{lr}_{(self.setting or '').rsplit('.', 1)[-1]}{self.value:g}".lstrip("_")


class SVIRun:
    """One SVI fit in its phases: set up (:meth:`__init__`), :meth:`resume`, :meth:`check_start`, :meth:`train`,
    :meth:`finish`; :func:`fit_svi` runs them in that order.

    The losses of the steps are kept on the device and read to the host every ``read_loss_every`` steps (a host read
    is the step's only device sync); a read checks them, extends the loss curve and watches for a runaway loss.

    :param fit: the fit's context.
    """

    def __init__(self, fit: FitContext) -> None:
        self.fit = fit
        family, guide, data, spec = fit.family, fit.guide, fit.data, fit.spec
        if spec.prior_scale_factor is not None:
            widen_priors(family, spec.prior_scale_factor)
        self.named = {f"guide.{n}": p for n, p in guide.named_parameters()}
        self.named.update({f"family.{i}": p for i, p in enumerate(family.point_parameters())})
        self.ckpt_path = fit.file(CHECKPOINT_FILE)
        self.team = distributed.world()
        check_shards(spec, data.n_train, self.team.size)
        # streamed rows come from the loader a batch at a time (its own batch size), else minibatches of rows in memory
        self.loop = TrainingLoop(data.n_train, spec.batch_size, fit.seed, self.ckpt_path, spec.checkpoint_every,
                                 "SVI", fit.progress, fit.log, data.x_train.device, writer=self.team.is_writer,
                                 stream=data if data.streamed else None)
        self.n_steps = spec.num_steps if spec.num_steps is not None else (spec.epochs or 1) * self.loop.per_epoch
        self.optimizer = make_optimizer(list(self.named.values()), spec)
        self.elbo = ELBOS[spec.elbo](spec.num_particles)
        self.elbo.temperature = spec.temperature
        self.result = SVIResult()
        self.remedies = untried_remedies(spec, data.dtype, guide.init_rho)
        self.loop.state = lambda: {
            "total_steps": self.n_steps, "guide": guide.state_dict(),
            "point_parameters": list(family.point_parameters()), "buffers": family.buffers(),
            "optimizer": self.optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
            "losses": self.result.losses, "kl_methods": self.result.kl_methods,
            "hyperparameters": family.hyperparameters()}
        self.unread: list[torch.Tensor] = []  # the losses of the steps taken since the last host read, on the device
        self.read_every = loss_read_interval(spec, data.device)
        self.step: SVIStep | None = None
        self.chosen_lr: float | None = None  # lr_by: calibration's choice, kept in the checkpoint for a resume
        self.chosen = False  # whether the run has made its choices on the calibration rows (choose_lr)
        self.chosen_settings: dict[str, float] = {}  # the open settings' choices (open_settings), by spec field
        state = self.loop.state
        self.loop.state = lambda: {**state(), "chosen_lr": self.chosen_lr, "chosen": self.chosen,
                                   "chosen_settings": self.chosen_settings}

    def resume(self) -> None:
        """Restore the guide, point parameters, buffers, optimiser, random state and loss curve of the checkpoint."""
        family = self.fit.family
        state = self.loop.resume(self.fit.run_dir)
        self.fit.guide.load_state_dict(state["guide"])
        with torch.no_grad():
            for p, saved in zip(family.point_parameters(), state["point_parameters"], strict=True):
                p.copy_(saved)
        restore_buffers(family, state.get("buffers"))
        if "hyperparameters" in state:  # a prior widened by a factor the fit chose (or was given)
            family.set_hyperparameters(state["hyperparameters"])
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        self.result.losses, self.result.kl_methods = state["losses"], state["kl_methods"]
        self.chosen_lr = state.get("chosen_lr")
        self.chosen = state.get("chosen", self.chosen_lr is not None)
        self.chosen_settings = dict(state.get("chosen_settings", {}))
        self.fit.log(f"resumed from {self.ckpt_path} at step {self.loop.step}/{self.n_steps}")

    def choose_lr(self) -> None:
        """Choose on the calibration rows what the spec left open, each by a whole run at each candidate from the run's
        start, keeping the best run as it ended (its steps are exactly those of a run given its choice by hand): with
        ``lr_by: calibration``, the starting lr of the default schedule from :data:`~zoo.sections.LR_CANDIDATES`; then
        each setting left null (:meth:`open_settings`: MC dropout's rate, a learned noise's start, a point estimate's
        prior scale factor) at the choices made before it, the kept run (at the setting's held value) among its
        candidates; a setting that changes which lr is best (:attr:`OpenSetting.each_lr`: a noise's start) runs its
        candidates at every starting lr, and the run kept may bring another lr. With a run directory each candidate
        checkpoints in ``lr_choice/<name>/`` (removed once the run has kept one), so an interrupted choice resumes; a
        resumed run that has chosen keeps its checkpoint's choices.

        :raises ZooInputError: ``lr_by: calibration`` and the fit has no calibration rows.
        :raises TrainingDiverged: when every candidate diverged.
        """
        fit = self.fit
        has_rows = fit.data.x_calibration is not None
        by_lr = chooses_lr(fit.spec, has_rows)
        settings = self.open_settings() if has_rows else []
        if not by_lr and not settings:
            return
        if not self.chosen:
            self.loop.save()  # the common start, which a resumed choice starts its candidates from
            start = self.end_state()  # each candidate starts here, with the same random state
            kept = None
            if by_lr:
                kept = self._best_run(start, [CandidateRun(lr, None) for lr in LR_CANDIDATES], None, "starting lr",
                                      [])
                self.chosen_lr = kept.lr
            taken: list[tuple[OpenSetting, float]] = []  # the choices so far, which a later candidate starts with
            for setting in settings:
                if kept is not None:  # the incumbent: the run kept so far, at the setting's held value
                    kept.value, kept.setting = setting.held, setting.name
                each_lr = by_lr and setting.each_lr
                lrs = LR_CANDIDATES if each_lr else (self.chosen_lr,)
                kept = self._best_run(start, setting.runs(lrs, kept, fit.log), kept, setting.name, taken,
                                      setting.take, each_lr)
                taken.append((setting, kept.value))
                self.chosen_settings[setting.name] = kept.value
                self.chosen_lr = kept.lr  # a joint choice may keep another lr
            self.chosen = True
        if self.chosen_lr is not None:
            self.fit = dataclasses.replace(fit, spec=with_starting_lr(fit.spec, self.chosen_lr))

    def open_settings(self) -> list[OpenSetting]:
        """The settings this fit chooses on its calibration rows after its lr, in that order.

        :returns: the guide's (MC dropout's rate), then a learned noise's start where the inference method set one the
            spec left open (a value moves the guide's location of the noise site), then a point estimate's prior
            scale factor (:meth:`prior_scale_setting`); empty where there is none.
        """
        guide, likelihood = self.fit.guide, self.fit.family.likelihood
        settings = []
        if (open_guide := guide.open_setting()) is not None:
            settings.append(OpenSetting(open_guide.name, open_guide.held, open_guide.candidates, guide.take_setting,
                                        beyond=open_guide.beyond))
        start = likelihood.open_start()
        if start is not None and guide.locates(start[1]):
            name, site, held, candidates = start
            shape = guide.sites[site].shape
            # joint with the lr: from the low start a short run's best lr is not the median start's (bostonHousing)
            settings.append(OpenSetting(name, held, candidates,
                                        lambda value: guide.init_from({site: torch.full(shape, value)}), each_lr=True))
        if (prior_scale := self.prior_scale_setting()) is not None:
            settings.append(prior_scale)
        return settings

    def prior_scale_setting(self) -> OpenSetting | None:
        """The prior scale factor, where the spec left it null and the guide leaves it open
        (:attr:`~guides.base.Guide.prior_scale_open`): a MAP's or dropout net's prior is its weight decay, which the
        plain-net recipe tunes on held-out rows, and N(0, 1) is too strong for some nets (the 1-D toy's tanh MLP under
        it fits its clusters loosely and misses in the gap; measured in ``benchmarks/defaults.py``); a mean-field or
        Gaussian autoguide's spread is fitted against the same prior. Its candidates
        (:data:`~zoo.sections.PRIOR_SCALE_FACTORS`) run at the lr and settings chosen before.

        :returns: the setting, or None: a factor given, a guide that keeps the spec's priors (rank-1's, a flow's), or
            a family that cannot widen.
        """
        fit = self.fit  # (asked only where the fit has calibration rows)
        if not fit.guide.prior_scale_open or not chooses_prior_scale(fit.spec, fit.family, True):
            return None
        return OpenSetting("inference.prior_scale_factor", fit.family.prior_scale_factor, PRIOR_SCALE_FACTORS,
                           fit.family.widen_priors)

    def _best_run(self, start: dict, candidates: Iterable[CandidateRun], best: CandidateRun | None, what: str,
                  taken: list[tuple[OpenSetting, float]], take: Callable[[float], None] | None = None,
                  each_lr: bool = False) -> CandidateRun:
        """Run each candidate from ``start`` and continue as the best on the calibration rows (NLL; regression:
        -test LL), ``best`` (a run of an earlier choice) among them: guide, point parameters, buffers, optimiser,
        loss curve, data order and random state.

        :param start: the state every candidate starts from (:meth:`end_state`).
        :param candidates: the runs to make, each with its starting lr (None: the spec's) and setting's value; an
            iterator may decide its next run from the scores of those before (:meth:`OpenSetting.runs`).
        :param best: an earlier choice's kept run, the incumbent.
        :param what: what is chosen, for the log (``starting lr``, ``guide.dropout_rate``).
        :param taken: the settings chosen before, and their values, which every candidate starts with.
        :param take: makes the run at its start hold a candidate's value (the setting's; None: an lr's choice).
        :param each_lr: whether the setting's candidates run at every starting lr (the log names each one's lr).
        :returns: the kept run.
        :raises TrainingDiverged: when every candidate diverged and there is no incumbent.
        """
        fit = self.fit
        family, guide = fit.family, fit.guide
        started = time.perf_counter()
        scores = {} if best is None else {best.key(each_lr): best.score}
        failures, label = {}, "score"
        for run in candidates:
            self._take(start)
            for earlier, value in taken:
                earlier.take(value)
            if take is not None:
                take(run.value)
            where = None if fit.run_dir is None else fit.run_dir / LR_CHOICE_DIR / run.folder()
            candidate = SVIRun(dataclasses.replace(  # a monitor scores each candidate's run as it goes
                fit, spec=fit.spec if run.lr is None else with_starting_lr(fit.spec, run.lr), run_dir=where,
                log=RunLog(None, echo=None), monitor=copy.copy(fit.monitor),
                resume=where is not None and (where / CHECKPOINT_FILE).exists()))
            candidate.loop.desc = f"SVI at {run.shown()}"
            try:
                if candidate.fit.resume:
                    candidate.resume()
                candidate.check_start()
                candidate.train()
            except TrainingDiverged as err:
                scores[run.key(each_lr)], failures[run.key(each_lr)] = math.inf, err
                fit.log(f"svi: {run.shown()} diverged: {err}")
                continue
            run.ended = candidate.end_state()  # before scoring, which may draw from the random state
            run.score, label = calibration_score(GuidePosterior(family, guide), fit.data,
                                                 fit.spec.predictive_samples, fit.seed, fit.spec)
            scores[run.key(each_lr)] = run.score
            fit.log(f"svi: {run.shown()}: {label} {run.score:.4g} on the calibration rows")
            if best is None or run.score < best.score:
                best = run
        if best is None:
            self._take(start)
            raise every_candidate_diverged(failures, what)
        self._take(best.ended)
        self.loop.seconds += time.perf_counter() - started
        shown = ", ".join(f"{k}: {v:.4g}" for k, v in scores.items())
        kept = f"{what} {best.choice}" + ("" if best.value is None or best.lr is None else f" at lr {best.lr:g}")
        fit.log(f"svi: {kept}, chosen on {len(fit.data.x_calibration):,} calibration rows by a whole run "
                f"at each ({label} {shown})")
        return best

    def end_state(self) -> dict:
        """Everything a run carries on from, copied: what :meth:`_take` puts back (the start of the lr choice's
        candidates) or gives another run (the one kept).

        :returns: the state.
        """
        family = self.fit.family
        return {"guide": copy.deepcopy(self.fit.guide.state_dict()),
                "point_parameters": [p.detach().clone() for p in family.point_parameters()],
                "buffers": [b.clone() for b in family.buffers()],
                "optimizer": copy.deepcopy(self.optimizer.state_dict()), "losses": list(self.result.losses),
                "kl_methods": dict(self.result.kl_methods), "step": self.loop.step, "perm": self.loop.perm,
                "order": self.loop.order.get_state(), "hyperparameters": family.hyperparameters(),
                "randomness": (torch.get_rng_state(), random.getstate(), np.random.get_state())}

    def _take(self, state: dict) -> None:
        """Continue as the run whose :meth:`end_state` is ``state`` (the same parameters, so its optimiser's state
        fits this run's)."""
        family = self.fit.family
        self.fit.guide.load_state_dict(state["guide"])
        with torch.no_grad():
            for p, saved in zip(family.point_parameters(), state["point_parameters"], strict=True):
                p.copy_(saved)
        restore_buffers(family, state["buffers"])
        family.set_hyperparameters(state["hyperparameters"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.result.losses, self.result.kl_methods = state["losses"], state["kl_methods"]
        self.loop.step, self.loop.perm = state["step"], state["perm"]
        self.loop.order.set_state(state["order"])
        torch.set_rng_state(state["randomness"][0])
        random.setstate(state["randomness"][1])
        np.random.set_state(state["randomness"][2])

    def check_start(self) -> None:
        """Refuse non-finite starting parameters, and make every process start from the same ones.

        :raises TrainingDiverged: a parameter that is not finite.
        """
        bad = _non_finite(self.named)
        if bad:
            raise TrainingDiverged(f"initial parameters are not finite: {', '.join(bad)}; check guide.init_from")
        self.team.broadcast(list(self.named.values()))  # the same seed built the same values; make sure of it

    def train(self) -> None:
        """Take the run's steps (from where a resumed run stopped), checkpointing as the loop says."""
        fit, spec = self.fit, self.fit.spec
        augment = build_augmentation(spec.augment, input_image_shape(fit.family.net))
        self.step = SVIStep(fit.family.model, fit.guide, self.elbo, self.optimizer, spec.local_reparam, spec.compile,
                            self.team, augment, read_each_step=self.read_every == 1,
                            autocast=AUTOCAST_DTYPES[spec.autocast],
                            rows_on_host=fit.data.training_rows_on_host)  # too large for the GPU (pipeline.prepare)
        self.step.signalled = lambda: self.loop.signalled()
        self.watch = DivergenceWatch(fit.data.n_train, self.n_steps)
        self.watch.resume(self.result.losses, self.loop.step)
        self.loop.run(self.n_steps, self._update, after_step=self._after_step,
                      before_save=self._before_save, stop_signal=lambda: self.step.signal)
        self._before_save()
        self.loop.save(done=self.loop.step >= self.n_steps)

    def finish(self) -> SVIResult:
        """Complete a guide that is completed after its fit (Pyro's Laplace approximation: the Hessian), on the
        tempered posterior's curvature as the ELBO tempers it, and return the fit.

        :returns: the loss curve, the KL method of each site, the wall time and the guide's posterior.
        """
        fit = self.fit
        started = time.perf_counter()
        with ObservationScale(1.0 / fit.spec.temperature):
            done = fit.guide.finish(fit.data.x_train, fit.data.y_train)
        if done:
            fit.log(done)
            self.loop.seconds += time.perf_counter() - started
            self.loop.save(done=True)
        self.result.seconds = self.loop.seconds
        self.result.posterior = GuidePosterior(fit.family, fit.guide)
        lr = {} if self.chosen_lr is None else {"inference.lr": self.chosen_lr}
        self.result.chosen = lr | self.chosen_settings
        return self.result

    def _read_losses(self) -> None:
        """One host read of the unread losses: a non-finite one stops the run, the others join the loss curve; with
        several ranks, also the signal they agree on."""
        if not self.unread:
            return
        values = torch.stack(self.unread).tolist()
        self.unread.clear()
        step, losses = self.loop.step, self.result.losses
        bad = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
        if bad is not None:
            raise TrainingDiverged(_diagnose(self.elbo, self.named, step - len(values) + bad, self.ckpt_path,
                                             self.remedies, read_at=step))
        losses.extend(values)
        self.watch(losses, step, self.elbo, self.remedies, self.ckpt_path)
        if self.read_every > 1 or step % 50 == 0 or step == self.n_steps:
            recent = losses[-50:]
            self.loop.bar.set_postfix(elbo=f"{-sum(recent) / len(recent):.4g}", refresh=False)
        if not self.step.read_each_step:
            self.step.signal = self.step.read_signal()

    def _update(self, batch: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None) -> None:
        spec = self.fit.spec
        self.elbo.kl_weight = kl_weight(self.loop.step, spec, self.n_steps)
        lr = scheduled_lr(spec, self.loop.step, self.n_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        data = self.fit.data
        if isinstance(batch, tuple):  # a streamed (x, y) batch of a data set of n_train rows
            loss = self.step(*batch, None, n_rows=data.n_train)
        else:
            loss = self.step(data.x_train, data.y_train, batch)
        if self.loop.step == 0 or not self.result.kl_methods:
            self.result.kl_methods = dict(self.elbo.kl_methods)
            self.fit.log(describe_kl(self.result.kl_methods))
        self.unread.append(loss)

    def _after_step(self, checkpoint_due: bool) -> None:
        fit, step = self.fit, self.loop.step
        monitor_due = fit.monitor is not None and fit.monitor.due(step, self.n_steps)
        if step % self.read_every == 0 or step == self.n_steps or monitor_due or checkpoint_due:
            self._read_losses()
        if monitor_due:
            fit.monitor(step, self.n_steps, GuidePosterior(fit.family, fit.guide), fit.data)

    def _before_save(self) -> None:
        self._read_losses()
        bad = _non_finite(self.named)
        if bad:  # never overwrite the last good checkpoint with a broken state
            raise TrainingDiverged(f"parameters became non-finite by step {self.loop.step}: {', '.join(bad)}; "
                                   f"{self.ckpt_path} holds the last good state. Try: {'; or '.join(self.remedies)}.")


class SVI(InferenceMethod):
    """Stochastic variational inference of the spec's guide (:func:`fit_svi`)."""

    streams_rows = True
    names = ("svi",)
    shared_work = {"svi": "each global minibatch"}
    spec = SVISpec
    fitter = staticmethod(fit_svi)
    files = (CHECKPOINT_FILE,)
    summary = "minibatch ELBO maximisation of the spec's guide; checkpointed and resumable"

    def noise_start(self, spec: SVIFitting, has_calibration_rows: bool, likelihood: Likelihood) -> float | None:
        """Low (:data:`~zoo.likelihoods.gaussian.LOW_NOISE_START`) where the fit sets its predictive's noise on
        calibration rows afterwards, so that the fit's σ shapes only the training; the prior's median otherwise.

        :param spec: the run's ``inference`` section.
        :param has_calibration_rows: whether the fit has rows held out of training.
        :param likelihood: the likelihood as the spec builds it.
        :returns: σ, or None (the prior's median).
        """
        return gaussian.LOW_NOISE_START if chooses_noise(spec, has_calibration_rows, likelihood) else None

    def describe(self, spec: SVIFitting) -> str:
        return "svi"

    def check(self, run_spec) -> list[ZooInputError]:
        autocast = run_spec.inference.autocast
        if autocast != "none" and run_spec.dtype == "float64":
            return [ZooInputError("inference.autocast", autocast, "bf16 autocast lowers a float32 run's matmuls; "
                                  "with dtype: float64 use autocast: none")]
        if autocast != "none" and not run_spec.model.supports_autocast:
            return [ZooInputError("inference.autocast", autocast, f"torch's autocast does not reach the "
                                  f"{run_spec.model.family} family's vmapped layers (they would stay float32): use "
                                  "autocast: none")]
        on_gpu = run_spec.device == "cuda" or (run_spec.device == "auto" and torch.cuda.is_available())
        if autocast == "bf16" and on_gpu and not torch.cuda.is_bf16_supported(including_emulation=False):
            return [ZooInputError("inference.autocast", autocast, f"this GPU ({torch.cuda.get_device_name()}) has "
                                  "no bfloat16 arithmetic (it needs compute capability 8.0 or later; bf16 would be "
                                  "emulated, slower than float32): use autocast: none")]
        if run_spec.net.convolutional is not None:  # a net given in Python is checked when it is built
            problem = self.check_net(run_spec.inference, run_spec.model, run_spec.net.convolutional)
            return [problem] if problem is not None else []
        return []

    def check_net(self, spec: SVIFitting, family, convolutional: bool) -> ZooInputError | None:
        if spec.compile and convolutional and not family.compiles_convolutions:
            return ZooInputError("inference.compile", True, f"the {family.family} family's step on a convolutional "
                                 "net runs slower compiled than eager (one convolution per member, which Inductor "
                                 "fuses badly with the batch norms after them): use compile: false")
        return None

    def check_processes(self, spec: SVIFitting, nproc: int) -> None:
        """Each process takes an equal share of every global minibatch.

        :param spec: the run's ``inference`` section (its ``batch_size``).
        :param nproc: the processes of ``zoo train --nproc``.
        :raises ZooInputError: when the minibatch size is not a multiple of ``nproc``.
        """
        check_global_batch(spec.batch_size, nproc)

    def check_rows_on_host(self, spec: SVIFitting, n_train: int, why: str) -> None:
        """Minibatch SVI moves each minibatch to the device: it needs a minibatch size, and no compiled step.

        :param spec: the run's ``inference`` section (its ``batch_size`` and ``compile``).
        :param n_train: training rows.
        :param why: why the rows stay in host memory, for the message.
        :raises ZooInputError: when there is no minibatch smaller than ``n_train``, or ``compile`` is on.
        """
        if spec.batch_size is None or spec.batch_size >= n_train:
            raise ZooInputError("inference.batch_size", spec.batch_size, f"{why}: set a minibatch size")
        if spec.compile:
            raise ZooInputError("inference.compile", True, f"{why}; compile does not trace that yet: drop it")

    def fit_record(self, result) -> dict:
        return guide_fit_record(result)

    def load(self, family, guide, spec, run_dir, device, start=None) -> Posterior:
        load_guide_checkpoint(family, guide, run_dir, device)
        return GuidePosterior(family, guide)

