"""One process or many: data-parallel SVI and sharded MCMC chains on ``torch.distributed``, launched by ``torchrun``.

A distributed run changes who computes what, not the maths. Every rank holds the same parameters and draws the same
random numbers (one seed, one stream), takes its shard of each global minibatch, and the ranks average their
gradients with one all-reduce per step: the step equals the one-process step on the whole minibatch, up to float
summation order. Rank 0 alone writes the run directory. Gloo on CPU, NCCL on CUDA, chosen by the device.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from pyro.poutine.messenger import Messenger

from zoo.errors import ZooInputError
from zoo.interrupts import Interrupted, ignore_late_signals

TIMEOUT_ENV = "ZOO_DIST_TIMEOUT"  # seconds a collective (or the rendezvous) may wait before the job fails
DEFAULT_TIMEOUT = 300
EXIT_FILE_ENV = "ZOO_EXIT_FILE"  # set by launch(): where rank 0 leaves its exit code (and each rank its pid)


@dataclass(frozen=True)
class World:
    """This process's place in the job: ``rank`` of ``size`` (``size`` 1: a plain one-process run)."""

    rank: int = 0
    size: int = 1

    @property
    def is_writer(self) -> bool:
        """Whether this process writes the run directory (rank 0)."""
        return self.rank == 0

    def shard(self, rows: torch.Tensor) -> tuple[torch.Tensor, slice, float]:
        """This rank's contiguous share of a global minibatch ``rows``, where it lies, and its likelihood factor.

        Shares differ by at most one row. The factor ``W * len(share) / len(rows)`` makes the averaged gradient
        that of the whole minibatch: each rank's model scales its observations by ``N / len(share)``, so the factor
        turns that into ``W * N / len(rows)``, and the average over W ranks into ``N / len(rows)``. It is 1 for
        equal shares.
        """
        n, w = len(rows), self.size
        start, stop = self.rank * n // w, (self.rank + 1) * n // w
        return rows[start:stop], slice(start, stop), w * (stop - start) / n

    def average(self, tensors: list[torch.Tensor], counts: torch.Tensor) -> torch.Tensor:
        """Average ``tensors`` (gradients) across ranks in place and sum the 1-d ``counts``, in one all-reduce.
        The sums stay on the device: reading them is the caller's (host) synchronisation."""
        if self.size == 1:
            return counts
        flat = torch.cat([t.reshape(-1) for t in tensors] + [counts.to(tensors[0].dtype)])
        dist.all_reduce(flat)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t) / self.size)
            offset += t.numel()
        return flat[offset:]

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over ranks (in place; itself in one process)."""
        if self.size > 1:
            dist.all_reduce(tensor)
        return tensor

    def chains(self, total: int) -> slice:
        """This rank's chains of ``total`` (which the ranks share evenly; see :func:`check_chains`)."""
        per_rank = total // self.size
        return slice(self.rank * per_rank, (self.rank + 1) * per_rank)

    def all_chains(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Every rank's ``tensor`` (its chains along ``dim``) concatenated in rank order, on every rank."""
        if self.size == 1:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts, dim=dim)

    def agreed_signal(self, received: int) -> int:
        """SIGTERM if any rank received it, else SIGINT if any did, else 0: every rank stops at the same point."""
        if self.size == 1:
            return received
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
        return signal_from_flags(self.sum(torch.tensor(signal_flags(received), device=device)).tolist())

    def broadcast(self, tensors: list[torch.Tensor]) -> None:
        """Copy rank 0's ``tensors`` to every rank (so that every rank starts from the same values)."""
        if self.size > 1:
            for t in tensors:
                dist.broadcast(t.data, src=0)

    def every_object(self, obj: object) -> list[object]:
        """Every rank's (picklable) ``obj`` in rank order, on every rank."""
        if self.size == 1:
            return [obj]
        out: list[object] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out


def signal_flags(received: int) -> list[float]:
    """A signal (or 0) as two counts to sum over ranks: [SIGINT received, SIGTERM received]."""
    return [float(received == signal.SIGINT), float(received == signal.SIGTERM)]


def signal_from_flags(flags: list[float]) -> int:
    """The signal every rank acts on, from :func:`signal_flags` summed over ranks: SIGTERM wins, then SIGINT.

    A rank that acts on one stops now, perhaps before its own copy of the signal (sent by the launcher to one rank
    after another) has landed: from then on it ignores SIGINT and SIGTERM (see :func:`ignore_late_signals`).
    """
    agreed = int(signal.SIGTERM) if flags[1] else int(signal.SIGINT) if flags[0] else 0
    if agreed:
        ignore_late_signals()
    return agreed


def check_global_batch(batch_size: int | None, world_size: int) -> None:
    """Refuse a global minibatch the processes cannot share evenly (the full batch, ``None``, is split by rows)."""
    if batch_size is not None and batch_size % world_size:
        raise ZooInputError("inference.batch_size", batch_size, f"the global minibatch is split across {world_size} "
                            f"processes: use a multiple of {world_size}")


def world() -> World:
    """The current job's :class:`World` (one process unless ``torch.distributed`` is initialised)."""
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size())
    return World()


def launched_by_torchrun() -> bool:
    """Whether this process is one of several started by ``torchrun`` (``WORLD_SIZE`` > 1 in its environment)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def timeout() -> timedelta:
    """How long a collective may wait for the other ranks (``$ZOO_DIST_TIMEOUT`` seconds, default 300); a value
    that is not a positive number of seconds is refused."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip() or str(DEFAULT_TIMEOUT)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ZooInputError(TIMEOUT_ENV, os.environ.get(TIMEOUT_ENV), "set the environment variable to a positive "
                            f"number of seconds, e.g. {TIMEOUT_ENV}=600, or unset it for the default "
                            f"{DEFAULT_TIMEOUT}")
    return timedelta(seconds=seconds)


def join(device: torch.device) -> World:
    """Join the ``torchrun`` job this process belongs to (gloo on CPU, NCCL on CUDA); a no-op for one process."""
    if not launched_by_torchrun() or dist.is_initialized():
        return world()
    backend = "nccl" if device.type == "cuda" else "gloo"
    where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    exit_file = os.environ.get(EXIT_FILE_ENV)
    if exit_file:  # under launch(): say where this rank is, so that the launcher can hand it a signal
        with open(os.path.join(os.path.dirname(exit_file), f"rank{os.environ.get('RANK', 0)}.pid"), "w") as h:
            h.write(str(os.getpid()))
    wait = timeout()
    try:
        dist.init_process_group(backend, timeout=wait)
    except Exception as err:  # noqa: BLE001 (any failure to reach the rendezvous is reported the same way)
        raise ZooInputError("rendezvous", where, "", message=f"rank {os.environ.get('RANK')} could not join the job "
                            f"at {where} within {wait.total_seconds():.0f} s ({type(err).__name__}: {err}); "
                            "check MASTER_ADDR/MASTER_PORT and that every node can reach it") from None
    return world()


def leave(together: bool) -> None:
    """Leave the job. After a run that ended normally (``together``) every rank first waits at a barrier for the
    others, rank 0 last (it evaluates and writes after the fit), so that no process tears down its connections and
    exits while another still holds them: gloo can abort a process that exits beside a live peer. A barrier that
    outlasts ``$ZOO_DIST_TIMEOUT`` is given up, and the rank leaves anyway (rank 0's files do not depend on it)."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    if together and dist.get_world_size() > 1:
        with contextlib.suppress(RuntimeError):
            dist.barrier()
    dist.destroy_process_group()


@contextlib.contextmanager
def joined(device: torch.device) -> Iterator[World]:
    """This process's place in the job for the length of a ``with`` block (see :func:`join` and :func:`leave`)."""
    team = join(device)
    try:
        yield team
    except Interrupted:  # an agreed signal stops every rank at the same step (rank 0 saving the checkpoint first)
        leave(together=True)
        raise
    except BaseException:
        leave(together=False)
        raise
    leave(together=True)


def end_rank(code: int) -> None:
    """End this ``torchrun`` rank now with ``code``, its output flushed, skipping the interpreter's teardown.

    By then the rank has left its process group and written and closed its files; only the C++ teardown of
    ``torch.distributed``'s state is left, and in CI a rank that had stopped cleanly on SIGTERM was aborted
    (SIGABRT) after its last message, which ``torchrun`` reports as a crash of the whole job.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class ObservationScale(Messenger):
    """Multiply the scale of observed sites only (the likelihood), leaving every latent site's KL untouched."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def _pyro_sample(self, msg: dict) -> None:
        if msg["is_observed"]:
            msg["scale"] = msg["scale"] * self.factor


def check_chains(num_chains: int, world_size: int) -> None:
    """Refuse a chain count the processes cannot share evenly."""
    if num_chains % world_size:
        raise ZooInputError("inference.num_chains", num_chains, f"the chains are shared by {world_size} processes: "
                            f"use a multiple of {world_size}")


# ------------------------------------------------------------------------------------------ the launcher
def check_launch(nproc: int, device: str, inference: Any, shared_work: dict[str, str]) -> None:
    """Refuse, before any process starts, a ``--nproc`` run of a spec (its ``device`` and ``inference`` section)
    that cannot work: fewer than one process, a bad ``$ZOO_DIST_TIMEOUT``, a method that does not share its work,
    or more processes than the machine can run (a share that the method cannot split evenly, it refuses itself).
    ``shared_work``: what the processes share, by method name, for every method that splits its work by
    :func:`world` (the methods' ``shared_work``; any other method would run its whole fit in every process)."""
    if nproc < 1:
        raise ZooInputError("--nproc", nproc, "give 1 or more processes")
    timeout()
    method = inference.method
    if method not in shared_work:
        shared = "; ".join(f"{name} ({what})" for name, what in shared_work.items())
        raise ZooInputError("--nproc", nproc, f"inference.method {method} does not split its work across processes, "
                            "so each would run the whole fit (the same result for N times the work): drop --nproc, or "
                            f"use a method whose processes share the work: {shared}")
    check_nproc(nproc, device)


def check_nproc(nproc: int, device: str) -> None:
    """Refuse a process count the machine cannot run: beyond its GPUs (CUDA) or its CPU cores."""
    if nproc < 1:
        raise ZooInputError("--nproc", nproc, "give 1 or more processes")
    if device in ("cuda", "auto") and torch.cuda.is_available():
        if nproc > torch.cuda.device_count():
            raise ZooInputError("--nproc", nproc, f"this node has {torch.cuda.device_count()} GPU(s): one process "
                                "per GPU at most")
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if nproc > cores:
        raise ZooInputError("--nproc", nproc, f"this machine gives this process {cores} CPU core(s); more "
                            "processes than cores only slow each other down")


def launch(nproc: int, argv: list[str]) -> int:
    """Run ``zoo <argv>`` in ``nproc`` processes on this node under ``torchrun --standalone``; rank 0's exit code.

    Rank 0 hands its exit code back through a file (see :func:`report_exit`). Ctrl-C and SIGTERM reach every
    process, which checkpoint and stop together. One torch thread per process unless ``OMP_NUM_THREADS`` says
    otherwise.
    """
    import tempfile

    with tempfile.TemporaryDirectory(prefix="zoo-launch-") as tmp:
        exit_file = os.path.join(tmp, "exit_code")
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                   "--module", "zoo.cli", *argv]
        env = {**os.environ, EXIT_FILE_ENV: exit_file, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        # its own session: the terminal's Ctrl-C reaches this launcher only, which hands it to the ranks (torchrun
        # itself, signalled, would tear the ranks down before their checkpoint, with a traceback of its own)
        child = subprocess.Popen(command, env=env, start_new_session=True)

        def forward(signum: int, _frame) -> None:
            ranks = [int(open(os.path.join(tmp, f)).read()) for f in os.listdir(tmp) if f.endswith(".pid")]
            for pid in ranks:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)
            if not ranks:  # not started yet: stop the whole job
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signum)

        previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            code = child.wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        if os.path.exists(exit_file):
            with open(exit_file) as handle:
                return int(handle.read().strip() or code)
        return code if code >= 0 else 128 - code


ENDED_TOGETHER = (0, 3, 130, 143)  # exits every rank reaches at the same step: done, unconverged, interrupted


def report_exit(code: int) -> int:
    """Under :func:`launch`, rank 0 records ``code`` for the launcher, and an exit every rank reaches together
    becomes 0 (``torchrun`` would report it as a crash). Any other non-zero exit stays, so that ``torchrun`` stops
    the other ranks at once instead of leaving them waiting in a collective."""
    path = os.environ.get(EXIT_FILE_ENV)
    if not path:
        return code
    if int(os.environ.get("RANK", "0")) == 0:
        with open(path, "w") as handle:
            handle.write(str(code))
    return 0 if code in ENDED_TOGETHER else code
