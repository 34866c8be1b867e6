"""What the minibatch-gradient methods (SG-MCMC, SWAG) share around their update rules: the minibatch potential
of C points at once, and the resumable step loop.

:class:`MinibatchPotential` is U_B(z) = -(log prior + N/B sum over B rows of log p(y | x, w)) / T - log|det J| in
the unconstrained coordinates of :mod:`zoo.inference.mcmc` (its ``Coordinates`` and ``LogJoint``): an unbiased
estimate of the full-data potential. :class:`StepLoop` draws a seeded minibatch order per epoch, runs an update
per step behind a progress bar, takes Ctrl-C and SIGTERM at step boundaries, and saves the state (the method's
own and the loop's: step, time, order) atomically every ``checkpoint_every`` steps and on an interrupt, so that
``resume`` continues exactly.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import pyro
import torch
from tqdm.auto import tqdm

from zoo.data.base import Dataset
from zoo.errors import ZooInputError
from zoo.inference.mcmc import Coordinates, LogJoint
from zoo.interrupts import deferred_interrupt
from zoo.models.base import ModelFamily
from zoo.runs import RunLog, checkpoint_exists, load_checkpoint, save_checkpoint


class MinibatchPotential:
    """U_B(z) = -(log prior + N/B sum over B rows of log p(y | x, w)) / T - log|det J| at C points ``z [C, D]``."""

    def __init__(self, family: ModelFamily, data: Dataset, temperature: float = 1.0) -> None:
        self.coords = Coordinates(family)
        self.log_joint = LogJoint(family, data.x_train, data.y_train)
        self.n, self.temperature = data.n_train, temperature
        with torch.no_grad():
            probe = self.coords.pack({n: s.init.unsqueeze(0).to(data.x_train) for n, s in self.coords.sites.items()})
        self.log_joint.verify(self.coords.unpack(probe)[0])
        if self.log_joint.exact_only:
            raise ZooInputError("model.family", type(family).__name__, "its batched log-likelihood differs from its "
                                "model, and minibatch methods evaluate minibatches only through the batched one; use "
                                "inference.method: hmc or nuts")

    def value_and_grad(self, z: torch.Tensor, rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """U_B ``[C]`` and its gradient ``[C, D]`` on training rows ``rows`` (all rows when None)."""
        x, y = self.log_joint.x, self.log_joint.y
        if rows is not None:
            x, y = x.index_select(0, rows), y.index_select(0, rows)
        with torch.enable_grad():
            z = z.detach().requires_grad_(True)
            values, log_det = self.coords.unpack(z)
            log_joint = self.log_joint.on_rows(values, x, y, self.n / len(x))
            energy = -(log_joint / self.temperature + log_det)
            (grad,) = torch.autograd.grad(energy.sum(), z)
        return energy.detach(), grad


class StepLoop:
    """Steps over seeded minibatches with a progress bar, checkpointed to ``path`` and resumable exactly."""

    def __init__(self, data: Dataset, batch_size: int | None, seed: int, path: Path | None, checkpoint_every: int,
                 desc: str, progress: bool, log: RunLog) -> None:
        self.n, self.device = data.n_train, data.x_train.device
        self.batch = self.n if batch_size is None else min(batch_size, self.n)
        self.per_epoch = math.ceil(self.n / self.batch)
        self.path, self.checkpoint_every, self.desc, self.progress, self.log = (
            path, checkpoint_every, desc, progress, log)
        self.order = torch.Generator().manual_seed(seed + 1)
        self.perm: torch.Tensor | None = None
        self.step, self.seconds = 0, 0.0
        self.state: Callable[[], dict] = dict  # the method's own state, saved beside the loop's

    def resume(self, run_dir: Path | None) -> dict:
        """The state saved in ``path`` (the loop's part restored here); refused where there is none."""
        if self.path is None or not checkpoint_exists(self.path):
            name = self.path.name if self.path is not None else "a checkpoint"
            raise ZooInputError("--resume", str(run_dir), f"no {name} there to resume; drop --resume")
        saved = load_checkpoint(self.path, self.device, set_aside=True)
        if not saved.get("done"):
            self.step, self.seconds, self.perm = saved["step"], saved["seconds"], saved["perm"]
            self.order.set_state(saved["order_rng"].cpu())
        return saved

    def save(self, done: bool = False) -> None:
        """Write the method's state and the loop's atomically (nothing without a run directory)."""
        if self.path is not None:
            save_checkpoint(self.path, {**self.state(), "step": self.step, "seconds": self.seconds,
                                        "perm": self.perm, "order_rng": self.order.get_state(), "done": done})

    def rows(self) -> torch.Tensor | None:
        """The minibatch of the current step (None: the full batch); a new permutation at each epoch's start."""
        if self.batch >= self.n:
            return None
        within = self.step % self.per_epoch
        if within == 0 or self.perm is None:
            self.perm = torch.randperm(self.n, generator=self.order)
        return self.perm[within * self.batch:(within + 1) * self.batch].to(self.device)

    def run(self, total: int, update: Callable[[torch.Tensor | None], None]) -> None:
        """Call ``update(rows)`` for steps ``step .. total - 1``; checkpoint every ``checkpoint_every`` steps and on
        Ctrl-C (then re-raised), with the time spent added to ``seconds``."""
        bar = tqdm(total=total, initial=self.step, disable=not self.progress, desc=self.desc, mininterval=0.5,
                   leave=False)
        started = time.perf_counter()
        with deferred_interrupt() as signalled, pyro.validation_enabled(False):
            try:
                while self.step < total:
                    if signalled():
                        raise KeyboardInterrupt
                    update(self.rows())
                    self.step += 1
                    bar.update(1)
                    if self.step % self.checkpoint_every == 0 and self.step < total:
                        self.seconds += time.perf_counter() - started
                        started = time.perf_counter()
                        self.save()
            except KeyboardInterrupt:
                self.seconds += time.perf_counter() - started
                self.save()
                self.log(f"interrupted at step {self.step}; state saved, continue with --resume")
                raise
            finally:
                bar.close()
        self.seconds += time.perf_counter() - started
