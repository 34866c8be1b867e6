"""The search space: the swept spec keys and their ranges or choices (:class:`Dimension`, :class:`SearchSpace`),
read from a space file (:func:`load_space`), checked against the spec before any trial (:func:`check_space`), and a
trial's spec with its settings applied (:func:`trial_spec`)."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from zoo.errors import ZooInputError
from zoo.spec import RunSpec, find_config, load_spec, set_path

# A best value in the outer 5% of its range (log-scaled where the range is) sits at the range's edge: the search was
# cut off there, and a better setting may lie beyond it.
EDGE_SHARE = 0.05

# Spec keys a sweep holds fixed: the data (its validation rows are what every trial is scored on) and the seed.
FIXED_KEYS = ("data", "seed")

# An inner point of a float range that no spec value is likely to sit at (the golden section): a probe that finds a
# key taking only whole numbers (a range written 10.0 .. 60.0 on inference.num_steps) before a trial does.
INNER_PROBE = 0.381966


class Dimension(BaseModel):
    """One swept spec key: a range (``low``, ``high``, optional ``log`` scale or ``step``) or a list of ``choices``.

    A range whose ends (and step) are integers is searched over integers. Choices may be whole spec sections (e.g.
    priors), not only numbers and names.

    :ivar low: the range's lower end.
    :ivar high: the range's upper end, above ``low``.
    :ivar log: search the range on a log scale (``low`` > 0, no ``step``).
    :ivar step: the spacing of the values searched, in ``(0, high - low]``; None for a continuous range.
    :ivar choices: the values to choose from, instead of a range.
    """

    model_config = ConfigDict(extra="forbid")
    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    step: int | float | None = None
    choices: list[Any] | None = None

    @model_validator(mode="after")
    def _one_form(self) -> Dimension:
        ranged = self.low is not None or self.high is not None
        if self.choices is not None:
            if ranged or self.log or self.step is not None:
                raise ValueError("give either choices or a range (low, high, log, step), not both")
            if not self.choices:
                raise ValueError("choices is empty; list at least one value")
            return self
        if self.low is None or self.high is None:
            raise ValueError("a range needs both low and high (or give choices: [...])")
        for name, value in (("low", self.low), ("high", self.high), ("step", self.step)):
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name} is {value}; the ends and step of a range are finite numbers")
        if not math.isfinite(float(self.high) - float(self.low)):
            raise ValueError(f"the range from {self.low} to {self.high} is wider than a float holds; narrow it")
        if not self.low < self.high:
            raise ValueError(f"the range is empty or inverted (low {self.low} >= high {self.high}); use low < high")
        if self.log and self.low <= 0:
            raise ValueError(f"a log-scale range needs low > 0 (got {self.low})")
        if self.log and self.step is not None:
            raise ValueError("a log-scale range takes no step")
        if self.step is not None and not 0 < self.step <= self.high - self.low:
            raise ValueError(f"step must lie in (0, high - low] = (0, {self.high - self.low}]")
        return self

    @property
    def integer(self) -> bool:
        """Whether the range is searched over integers (its ends and step are all integers)."""
        ends = [v for v in (self.low, self.high, self.step) if v is not None]
        return self.choices is None and all(isinstance(v, int) and not isinstance(v, bool) for v in ends)

    def probes(self) -> list[Any]:
        """The values every trial's spec must accept: both ends of a range, every choice.

        :returns: the values.
        """
        return list(self.choices) if self.choices is not None else [self.low, self.high]

    def inner_probe(self) -> float | None:
        """A value inside a float range (on its step grid, if any) that is not a whole number where the range allows
        one, for the spec to accept before any trial draws such a value; None for choices and integer ranges.

        :returns: the value, or None.
        """
        if self.choices is not None or self.integer:
            return None
        low, high = float(self.low), float(self.high)
        if self.log:
            value = math.exp(math.log(low) + INNER_PROBE * (math.log(high) - math.log(low)))
        else:
            value = low + INNER_PROBE * (high - low)
        if self.step is not None:
            value = low + round((value - low) / self.step) * self.step
        return value

    def edge(self, value: Any) -> str | None:
        """``"low"`` or ``"high"`` when ``value`` lies in the outer :data:`EDGE_SHARE` of the range at that end (on
        the log scale for a log range), else None; choices have no edge.

        :param value: a value of the dimension.
        :returns: ``"low"``, ``"high"`` or None.
        """
        if self.choices is not None or not isinstance(value, int | float) or isinstance(value, bool):
            return None
        scale = math.log if self.log else float
        low, high, at = scale(self.low), scale(self.high), scale(value)
        share = (at - low) / (high - low)
        return "low" if share <= EDGE_SHARE else "high" if share >= 1 - EDGE_SHARE else None

    def suggest(self, trial, key: str) -> Any:
        """The trial's value for ``key`` (choices that are sections travel through Optuna as one-line YAML).

        :param trial: the Optuna trial.
        :param key: the dotted spec key, the parameter's name in the study.
        :returns: the value suggested (a section choice read back from its YAML).
        """
        if self.choices is not None:
            if all(_primitive(c) for c in self.choices):
                return trial.suggest_categorical(key, self.choices)
            return yaml.safe_load(trial.suggest_categorical(key, [_one_line(c) for c in self.choices]))
        if self.integer:
            return trial.suggest_int(key, self.low, self.high, step=self.step or 1, log=self.log)
        return trial.suggest_float(key, float(self.low), float(self.high), step=self.step, log=self.log)


def _primitive(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def _one_line(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False).strip()


@dataclass(frozen=True)
class SearchSpace:
    """The swept spec keys (dotted, as ``--set`` writes them) and their dimensions, in file order.

    :param dimensions: each swept key's range or choices.
    """

    dimensions: dict[str, Dimension]

    def suggest(self, trial) -> dict[str, Any]:
        """One value per key for an Optuna trial.

        :param trial: the Optuna trial.
        :returns: the trial's settings by spec key.
        """
        return {key: dim.suggest(trial, key) for key, dim in self.dimensions.items()}

    def as_dict(self) -> dict[str, Any]:
        """The space as its YAML file gives it (what ``sweep.json`` records).

        :returns: each key's dimension as a mapping, defaults left out.
        """
        return {k: d.model_dump(exclude_defaults=True) for k, d in self.dimensions.items()}

    def edges(self, params: dict[str, Any]) -> dict[str, str]:
        """The keys whose value in ``params`` sits at an edge of its range, each with a sentence saying which and
        what to do (a sweep's best trial at an edge means the range cut the search short).

        :param params: settings by spec key, e.g. the best trial's.
        :returns: the sentence by key, for the keys at an edge only.
        """
        found = {}
        for key, value in params.items():
            dim = self.dimensions.get(key)
            side = dim.edge(value) if dim is not None else None
            if side is not None:
                found[key] = (f"the best {key} ({_format_param(value)}) is at the {side} end of its range "
                              f"[{_format_param(dim.low)}, {_format_param(dim.high)}]; a better value may lie beyond "
                              f"it: {'lower low' if side == 'low' else 'raise high'} in the space file and sweep again")
        return found


def _format_param(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def load_space(source: str | Path | dict) -> SearchSpace:
    """Read and check a space file: a mapping of dotted spec keys to a range or choices (a bare list is choices).

    :param source: a YAML file, or the mapping itself.
    :returns: the search space.
    :raises ZooInputError: when the file is missing or not UTF-8 YAML, the space is empty or not a mapping, a key
        is under ``data`` or ``seed`` (held fixed), or an entry is not a valid range or list of choices.
    """
    if isinstance(source, dict):
        tree, where = source, "space"
    else:
        path = find_config(source)  # a file, or a shipped space (configs/spaces/<name>.yaml) from any folder
        if path is None:
            raise ZooInputError("--space", str(source), "no such file; pass a YAML file of spec keys and their ranges "
                                "(the shipped ones: configs/spaces/<config>.yaml)")
        try:
            tree = yaml.safe_load(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:
            raise ZooInputError("--space", str(path), f"is not UTF-8 text (byte {exc.start} is "
                                f"{exc.object[exc.start]:#x}); save it as UTF-8 and run the command again") from None
        except yaml.YAMLError as exc:
            raise ZooInputError("--space", str(path), f"is not valid YAML: {exc}") from None
        where = str(path)
    if not isinstance(tree, dict) or not tree:
        raise ZooInputError("--space", where, "give a mapping of spec keys to ranges, e.g. "
                            "'inference.lr: {low: 1.0e-4, high: 1.0e-1, log: true}'")
    dimensions = {}
    for key, entry in tree.items():
        key = str(key)
        if key.split(".")[0] in FIXED_KEYS:
            raise ZooInputError(f"space: {key}", entry, "a sweep holds the data and the seed fixed (every trial is "
                                "scored on the same validation rows); sweep another key")
        if isinstance(entry, list):
            entry = {"choices": entry}
        if not isinstance(entry, dict):
            raise ZooInputError(f"space: {key}", entry, "give {low: .., high: ..} (with log: true or step: ..) or "
                                "{choices: [..]}")
        try:
            dimensions[key] = Dimension.model_validate(entry)
        except ValidationError as exc:
            reasons = "; ".join(_reason(e) for e in exc.errors())
            raise ZooInputError(f"space: {key}", entry, reasons) from None
    return SearchSpace(dimensions)


def _reason(error: dict) -> str:
    where = ".".join(str(p) for p in error.get("loc", ()))
    message = str(error.get("msg", "")).removeprefix("Value error, ")
    if error.get("type") == "extra_forbidden":
        message = "unknown setting (use low, high, log, step or choices)"
    return f"{where}: {message}" if where else message


def check_space(space: SearchSpace, tree: dict) -> None:
    """Refuse a key that is not a spec field, or a range end / choice the spec (``tree``, as written) does not
    accept, naming it; and a float range whose inner values it refuses (float ends on a key that takes integers),
    which would otherwise stop the sweep at its first trial.

    :param space: the search space.
    :param tree: the spec as written (:func:`zoo.spec.spec_tree`).
    :raises ZooInputError: naming the key and the value the spec refuses.
    """
    for key, dim in space.dimensions.items():
        for value in dim.probes():
            try:
                trial_spec(tree, {key: value})
            except ZooInputError as err:
                raise ZooInputError(f"space: {key}", value, f"the spec refuses this value: {err}") from None
        inner = dim.inner_probe()
        if inner is None:
            continue
        try:
            trial_spec(tree, {key: inner})
        except ZooInputError as err:
            whole = all(float(v).is_integer() for v in (dim.low, dim.high, dim.step) if v is not None)
            hint = (f"the key takes whole numbers: write the ends as integers (low: {int(dim.low)}, high: "
                    f"{int(dim.high)}, no decimal point) so that the range is searched over integers" if whole else
                    f"the spec accepts both ends but refuses {inner:.6g} inside the range ({err}); narrow the range "
                    "or give choices")
            raise ZooInputError(f"space: {key}", dim.model_dump(exclude_defaults=True), hint) from None


def trial_spec(tree: dict, params: dict[str, Any]) -> RunSpec:
    """The spec ``tree`` (as written) with a trial's settings applied as ``--set`` would apply them, validated.

    :param tree: the spec as written (left unchanged).
    :param params: the trial's settings by dotted spec key.
    :returns: the trial's spec.
    :raises ZooInputError: when the spec refuses the settings.
    """
    tree = copy.deepcopy(tree)
    for key, value in params.items():
        set_path(tree, key, value)
    return load_spec(tree)
