"""Ctrl-C and SIGTERM: both end a run at a step boundary with its state saved, and the exit code says which.

SIGTERM is what SLURM, Kubernetes and ``timeout`` send before they kill a process, so a fit treats it exactly as
Ctrl-C: the step in progress completes, the checkpoint is written, and the command exits 128 + the signal number
(130 for SIGINT, 143 for SIGTERM), as shells report a process ended by that signal.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

HANDLED = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A run stopped by SIGINT or SIGTERM; ``detail`` says what was kept (e.g. how to resume)."""

    def __init__(self, signum: int = signal.SIGINT, detail: str = "") -> None:
        self.signum, self.detail = int(signum), detail
        super().__init__(f"interrupted by {self.signal_name}" + (f"; {detail}" if detail else ""))

    @property
    def signal_name(self) -> str:
        """``SIGINT`` or ``SIGTERM``."""
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal number: 130 for Ctrl-C, 143 for SIGTERM."""
        return 128 + self.signum


def signal_of(err: BaseException) -> int:
    """The signal an interrupt came from (a bare ``KeyboardInterrupt`` is Ctrl-C)."""
    return err.signum if isinstance(err, Interrupted) else int(signal.SIGINT)


_late_signals_ignored = False


def ignore_late_signals() -> None:
    """From now on SIGINT and SIGTERM are ignored (a rank of a job that agreed to stop on a signal: the launcher sent
    one signal to each rank, one after another, and a rank's own copy may land after it has stopped; it must not kill
    a process that is saving its checkpoint or exiting cleanly)."""
    global _late_signals_ignored
    _late_signals_ignored = True
    if _in_main_thread():
        for s in HANDLED:
            signal.signal(s, signal.SIG_IGN)


def _restore(s: int, handler) -> None:
    signal.signal(s, signal.SIG_IGN if _late_signals_ignored else handler)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[Callable[[], int]]:
    """Turn SIGINT and SIGTERM into a flag checked between steps, so a step is never cut in half (main thread only).

    Yields a function returning the signal received (0 if none). A loop that sees it saves its state and raises
    :class:`Interrupted` (or a bare ``KeyboardInterrupt``: leaving the block, that becomes :class:`Interrupted` with
    the signal received, so SIGTERM is never reported as Ctrl-C); if the block ends with a signal pending and no
    exception, it raises one itself so the signal is never lost. The previous handlers are restored on exit.
    """
    if not _in_main_thread():
        yield lambda: 0
        return
    received: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _frame: received.append(signum)) for s in HANDLED}
    try:
        yield lambda: received[0] if received else 0
    except KeyboardInterrupt as err:
        if received and not isinstance(err, Interrupted):  # the loop stopped for the signal: name it
            raise Interrupted(received[0]) from None
        raise
    finally:
        for s, handler in previous.items():
            _restore(s, handler)
    if received:
        raise Interrupted(received[0])


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block SIGTERM raises :class:`Interrupted` where it lands, as Ctrl-C raises ``KeyboardInterrupt``."""
    if not _in_main_thread():
        yield
        return

    def interrupt(signum: int, _frame) -> None:
        raise Interrupted(signum)

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        _restore(signal.SIGTERM, previous)
