"""The one error type for bad user input: the CLI turns it into a short message and exit code 2."""

from __future__ import annotations

from typing import Any


class ZooInputError(ValueError):
    """Bad input from the user (spec, data, command line), with a message that says what to change."""

    def __init__(self, field: str, value: Any, allowed: str, message: str | None = None) -> None:
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(message or f"{field}: got {value!r}; {allowed}")


class NotFitted(ZooInputError, RuntimeError):
    """A BNN used (predict, evaluate, save, ...) before it was fitted: an input error that is also the
    ``RuntimeError`` it used to be."""


class TrainingDiverged(RuntimeError):
    """The objective became NaN/inf: the message names the step, the offending terms and the last good checkpoint."""


class ZooWarning(UserWarning):
    """Something the user should know that does not stop the run (the CLI prints it as one ``warning:`` line)."""
