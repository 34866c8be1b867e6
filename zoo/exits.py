"""How a zoo command ends: the exit code and the one-paragraph message for each way a command can stop."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from zoo.errors import TrainingDiverged, ZooInputError
from zoo.interrupts import Interrupted, signal_of


def exit_code(run: Callable[[], object]) -> int:
    """Call ``run`` (an int it returns is the exit code, else 0) and turn what stops it into a one-paragraph message.

    Bad input and OS errors exit 2, a diverged fit 1, Ctrl-C 130 and SIGTERM 143 (128 + the signal). Under
    ``torchrun`` the messages of ranks other than 0 start with ``[rank r]``.
    """
    try:
        code = run()
    except ZooInputError as err:
        say(f"error: {err}")
        return 2
    except OSError as err:  # a path the command could not read or write
        where = f" {err.filename}" if err.filename else ""
        say(f"error: cannot use{where}: {err.strerror or err}")
        return 2
    except TrainingDiverged as err:
        say(f"training stopped: {err}")
        return 1
    except KeyboardInterrupt as err:
        stopped = err if isinstance(err, Interrupted) else Interrupted(signal_of(err))
        say(str(stopped))
        return stopped.exit_code
    return code if isinstance(code, int) else 0


def rank() -> int:
    """This process's rank under ``torchrun`` (0 otherwise)."""
    return int(os.environ.get("RANK", "0"))


def say(message: str) -> None:
    """One message on stderr, marked with the rank when it is not rank 0's."""
    print(f"[rank {rank()}] {message}" if rank() else message, file=sys.stderr)
