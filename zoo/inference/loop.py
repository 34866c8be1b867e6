"""The one training loop: SVI, SG-MCMC and SWAG plug a step into it.

:class:`TrainingLoop` owns what every stepping method needs around its update rule: a seeded minibatch order (a
new permutation at each epoch's start), the progress bar, Ctrl-C and SIGTERM taken at step boundaries, the
checkpoint (every ``checkpoint_every`` steps, on an interrupt and at the end, written atomically with the method's
own state beside the loop's), an exact resume from it, the random state a step started from (put back when the
step is cut short, so a resume repeats it exactly), and the fit's wall time. A method hands :meth:`TrainingLoop.run`
its ``update(rows)`` and, where it needs them, hooks after each step (reading losses, scoring validation rows) and
before each save (checks that the state is worth keeping).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from tqdm.auto import tqdm

from zoo.data.base import Dataset
from zoo.errors import ZooInputError
from zoo.interrupts import Interrupted, deferred_interrupt
from zoo.runs import RunLog, checkpoint_exists, load_checkpoint, save_checkpoint


def steps_per_epoch(n_rows: int, batch_size: int | None, stream: Dataset | None = None) -> int:
    """The steps of one pass over ``n_rows`` training rows in minibatches of ``batch_size`` (None: one full batch), or
    over a streamed loader's batches.

    :param n_rows: training rows.
    :param batch_size: the minibatch size, or None.
    :param stream: a data set streamed from a loader (its own batches), or None.
    :returns: the steps per epoch.
    """
    if stream is not None:
        return stream.streamed_batches
    return math.ceil(n_rows / (n_rows if batch_size is None else min(batch_size, n_rows)))


class TrainingLoop:
    """Steps over seeded minibatches of ``n_rows`` rows with a progress bar, checkpointed to ``path`` and resumable
    exactly.

    :param n_rows: training rows (the full-data size the minibatches are drawn from).
    :param batch_size: rows per minibatch; None (or at least ``n_rows``) for the full batch.
    :param order_seed: seeds the minibatch order's own generator.
    :param path: the checkpoint file (None: no checkpoints).
    :param checkpoint_every: steps between checkpoints.
    :param desc: the progress bar's label.
    :param progress: whether to show the progress bar.
    :param log: the run's log.
    :param device: where the minibatch indices go.
    :param writer: whether this process writes the checkpoint (rank 0 of several).
    :param stream: a data set whose training rows are streamed from a loader: each step then takes the loader's next
        ``(x, y)`` batch (its own batch size; a shuffling loader's order drawn from ``order_seed`` and the epoch, so
        that a resumed run repeats it) instead of indices into rows in memory.
    """

    def __init__(self, n_rows: int, batch_size: int | None, order_seed: int, path: Path | None,
                 checkpoint_every: int, desc: str, progress: bool, log: RunLog,
                 device: torch.device | str = "cpu", writer: bool = True, stream: Dataset | None = None) -> None:
        self.n, self.device, self.stream = n_rows, device, stream
        self.batch = n_rows if batch_size is None else min(batch_size, n_rows)
        self.per_epoch = steps_per_epoch(n_rows, batch_size, stream)
        self.order_seed = order_seed
        self._batches: Iterator | None = None  # the loader's current pass (stream)
        self.path, self.checkpoint_every, self.desc, self.progress, self.log = (
            path, checkpoint_every, desc, progress, log)
        self.writer = writer
        self.order = torch.Generator().manual_seed(order_seed)
        self.perm: torch.Tensor | None = None
        self.step, self.seconds = 0, 0.0
        self.state: Callable[[], dict] = dict  # the method's own state, saved beside the loop's
        self.signalled: Callable[[], int] = lambda: 0  # the signal received (0: none), while run() runs
        self.bar: tqdm | None = None  # the progress bar, while run() runs
        self._started: float | None = None

    # -- checkpoints ---------------------------------------------------------------------------------------
    def resume(self, run_dir: Path | None) -> dict:
        """The state saved in :attr:`path`, the loop's part restored where it holds one (a method's record of a
        finished fit may keep only its result).

        :param run_dir: the run directory, for the message.
        :returns: the whole saved state (the method's part included).
        :raises ZooInputError: no checkpoint to resume.
        """
        if self.path is None or not checkpoint_exists(self.path):
            name = self.path.name if self.path is not None else "a checkpoint"
            raise ZooInputError("--resume", str(run_dir), f"no {name} there to resume; drop --resume")
        saved = load_checkpoint(self.path, self.device, set_aside=True)
        if "order_rng" in saved:
            self.step, self.seconds, self.perm = saved["step"], saved["seconds"], saved["perm"]
            self.order.set_state(saved["order_rng"].cpu())
        return saved

    def position(self) -> dict:
        """Where the loop stands, for :meth:`move_to`.

        :returns: its step and minibatch order (a copy).
        """
        return {"step": self.step, "perm": None if self.perm is None else self.perm.clone(),
                "order_rng": self.order.get_state()}

    def move_to(self, position: dict) -> None:
        """Stand where :meth:`position` said another loop over the same rows stood: the steps from there take the
        minibatches that loop's would have.

        :param position: a :meth:`position`.
        """
        self.step, self.perm = position["step"], position["perm"]
        self.order.set_state(position["order_rng"])
        self._batches = None  # a streamed pass restarts at this step's batch

    def clock(self) -> float:
        """Add the time since the last call (or since the run started) to :attr:`seconds`.

        :returns: the fit's wall time so far.
        """
        now = time.perf_counter()
        if self._started is not None:
            self.seconds += now - self._started
        self._started = now
        return self.seconds

    def save(self, done: bool = False) -> None:
        """Write the method's state and the loop's atomically (nothing without a checkpoint file, or on a process
        that does not write).

        :param done: whether the fit has finished.
        """
        if self.path is not None and self.writer:
            save_checkpoint(self.path, {**self.state(), "step": self.step, "seconds": self.seconds,
                                        "perm": self.perm, "order_rng": self.order.get_state(), "done": done})

    # -- the loop ------------------------------------------------------------------------------------------
    def rows(self) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None:
        """The minibatch of the current step (None: the full batch); a new permutation at each epoch's start.

        :returns: row indices on :attr:`device`, or None; with a :attr:`stream`, the loader's next ``(x, y)`` batch.
        """
        if self.stream is not None:
            epoch, within = divmod(self.step, self.per_epoch)
            if within == 0 or self._batches is None:  # a pass's start, or a resume within one
                self._batches = self.stream.epoch_batches(self.order_seed * 100_003 + epoch, skip=within)
            try:
                return next(self._batches)
            except StopIteration:
                raise ZooInputError("training data", f"{within} batches", f"the loader gave {self.per_epoch} "
                                    "batches on its first pass and fewer now: give a loader whose passes are all "
                                    "alike") from None
        if self.batch >= self.n:
            return None
        within = self.step % self.per_epoch
        if within == 0 or self.perm is None:
            self.perm = torch.randperm(self.n, generator=self.order)
        return self.perm[within * self.batch:(within + 1) * self.batch].to(self.device)

    def run(self, total: int, update: Callable[[torch.Tensor | None], None], *,
            after_step: Callable[[bool], None] | None = None, before_save: Callable[[], None] | None = None,
            stop_signal: Callable[[], int] | None = None) -> None:
        """Call ``update(rows)`` for steps ``step .. total - 1``; checkpoint every ``checkpoint_every`` steps, and
        on Ctrl-C or SIGTERM (then re-raised as :class:`~zoo.interrupts.Interrupted`).

        A step cut short by an exception leaves the loop at the state it started from (torch's random state, the
        minibatch order), so the checkpoint written on an interrupt resumes it exactly.

        :param total: the step to stop at.
        :param update: one step on the minibatch's rows (None: every row).
        :param after_step: called after each step with whether a checkpoint is due (e.g. to read the losses the
            checkpoint holds).
        :param before_save: called before every checkpoint (e.g. to refuse writing a non-finite state).
        :param stop_signal: the signal the fit agreed to stop on (several processes agree on one), read before each
            step; by default the signal this process received.
        """
        stop = stop_signal or (lambda: self.signalled())
        self.bar = tqdm(total=total, initial=self.step, disable=not self.progress, desc=self.desc, mininterval=0.5,
                        leave=False)
        self._started = time.perf_counter()
        at_step = None
        with deferred_interrupt() as signalled:
            self.signalled = signalled
            try:
                while self.step < total:
                    if stop():  # received during the last step (by any process): stop before the next
                        raise Interrupted(stop())
                    # the state this step starts from: an exception mid-step rolls back to it, so resume is exact
                    at_step = torch.get_rng_state(), self.order.get_state(), self.perm
                    update(self.rows())
                    self.step += 1
                    at_step = None
                    self.bar.update(1)
                    due = self.step % self.checkpoint_every == 0 and self.step < total
                    if after_step is not None:
                        after_step(due)
                    if due:
                        self.clock()
                        if before_save is not None:
                            before_save()
                        self.save()
                if stop():  # received during the last step: save it and stop before the method's own ending
                    raise Interrupted(stop())
            except KeyboardInterrupt:
                self.clock()
                if at_step is not None:  # interrupted inside a step: undo the draws it made before the interrupt
                    torch.set_rng_state(at_step[0])
                    self.order.set_state(at_step[1])
                    self.perm = at_step[2]
                    self._batches = None  # a streamed pass restarts at this step's batch
                if before_save is not None:
                    before_save()
                self.save()
                self.log(f"interrupted at step {self.step}; checkpoint saved, continue with --resume")
                raise
            finally:
                self.bar.close()
                self.signalled = lambda: 0
        self.clock()
        self._started = None
