"""The whole run spec: every part's section composed (priors, guides, families and inference methods from their
catalogues, the shared sections of :mod:`zoo.sections`), with the names checked against the registry and every
cross-section rule read from what the parts declare."""

from __future__ import annotations

import copy
import difflib
import importlib.resources
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Annotated, Any, Literal, get_args

import torch
import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    NonNegativeInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from guides import GUIDES, GuideConfig
from guides.auto import AutoGuideSpec  # noqa: F401 - re-exported: users build specs from zoo.spec alone
from guides.base import INIT_RHO_MAX, INIT_RHO_MIN, GuideSection, softplus  # noqa: F401
from guides.delta import DeltaGuideSpec  # noqa: F401
from guides.dropout import DropoutGuideSpec  # noqa: F401
from guides.full_rank import FullRankGuideSpec  # noqa: F401
from guides.laplace import LaplaceGuideSpec  # noqa: F401
from guides.mean_field import MeanFieldGuideSpec
from guides.mixture import BatchEnsembleGuideSpec, MixtureGuideSpec  # noqa: F401
from zoo import registry
from zoo.data import DATA_SETS, DataConfig, data_section  # noqa: F401 - data_section re-exported
from zoo.errors import ZooInputError
from zoo.likelihoods import (  # noqa: F401 - re-exported
    LIKELIHOODS,
    AutoLikelihoodSpec,
    CategoricalSpec,
    GaussianSpec,
    LikelihoodConfig,
    NoisePrior,
)
from zoo.members import MEMBERS, with_member
from zoo.models import FAMILIES, ModelSpec
from zoo.models.all_weights import AllWeightsModelSpec
from zoo.models.deterministic import DeepEnsembleModelSpec  # noqa: F401
from zoo.models.rank1 import Rank1ModelSpec  # noqa: F401
from zoo.models.subnetwork import SubnetSelectionSpec, SubnetworkModelSpec  # noqa: F401
from zoo.nets import NETS, NetConfig, net_section  # noqa: F401 - net_section re-exported
from zoo.nets.mlp import MLPSpec
from zoo.priors import (  # noqa: F401 - re-exported
    PRIORS,
    CauchyPrior,
    GaussianScaleMixturePrior,
    LaplacePrior,
    NormalPrior,
    PriorConfig,
    PriorSpec,
    ScaleMixturePrior,
    nested_prior,
)
from zoo.sections import Strict, SVISpec  # noqa: F401

try:
    from importlib.resources.abc import Traversable
except ImportError:  # Python 3.10
    from importlib.abc import Traversable

# The inference section is whichever registered method's spec its ``method`` names
InferenceSpec = registry.METHODS.union()


# The parts of each section of the run spec, by the name each answers to
_SECTION_PARTS: dict[str, dict[str, type[BaseModel]]] = {
    "data": {name: section for section in dict.fromkeys(DATA_SETS.sections.values()) for name in section.catalogue},
    "net": dict(NETS.items()), "prior": dict(PRIORS.items()), "model": dict(FAMILIES.items()),
    "guide": dict(GUIDES.items()), "likelihood": {"auto": AutoLikelihoodSpec, **dict(LIKELIHOODS.items())},
    "inference": dict(registry.METHODS.items()),
}


def _owners(loc: tuple, field: str) -> list[str]:
    """The parts of the section ``loc`` starts in that do have a setting called ``field`` (for 'not permitted
    here' messages)."""
    parts = _SECTION_PARTS.get(str(loc[0]), {}) if loc else {}
    return sorted(tag for tag, cls in parts.items() if field in cls.model_fields)


_UNION_TAGS = {tag for parts in _SECTION_PARTS.values() for tag in parts} | set(DATA_SETS)


# The catalogue of each section that names a registered part, and the name a section without one takes
_CATALOGUES = {"data": (DATA_SETS, None), "net": (NETS, "mlp"), "model": (FAMILIES, "all_weights"),
               "guide": (GUIDES, "mean_field"), "likelihood": (LIKELIHOODS, None)}


# NumPy's global generator (which Pyro seeds with the run's seed) takes seeds below 2**32, and the run also seeds
# streams with seed + 1 (the predictive draws, the minibatch order)
SEED_MAX = 2**32 - 2


def _seed_in_range(v: int) -> int:
    if v > SEED_MAX:
        raise ValueError(f"a seed is a whole number from 0 to {SEED_MAX} (2**32 - 2: NumPy's generator, which Pyro "
                         "seeds too, takes seeds below 2**32, and the run also seeds seed + 1); e.g. seed: 3")
    return v


class RunSpec(Strict):
    """A whole run: any valid combination of parts is one spec away."""

    data: DataConfig = Field(description="the data set and its splits (section data)")
    net: NetConfig = Field(default_factory=MLPSpec, description=(
        "the deterministic architecture the family makes Bayesian (section net)"))
    prior: PriorSpec = Field(default_factory=PriorSpec, description=(
        "the prior on the weights: a default plus overrides by site-name glob (section prior)"))
    model: ModelSpec = Field(default_factory=AllWeightsModelSpec, description=(
        f"the model family, chosen by model.family: {', '.join(FAMILIES)}"))
    guide: GuideConfig = Field(default_factory=MeanFieldGuideSpec, description=(
        "the variational family (or point estimate) that SVI fits, chosen by guide.name"))
    likelihood: LikelihoodConfig = Field(default_factory=AutoLikelihoodSpec, description=(
        "the observation model: auto (what the data's task picks), categorical, or Gaussian with fixed, learned or "
        "heteroscedastic noise"))
    inference: InferenceSpec = Field(default_factory=SVISpec, description=(
        f"how the posterior is computed, chosen by inference.method ({', '.join(registry.METHODS)})"))
    seed: Annotated[NonNegativeInt, AfterValidator(_seed_in_range)] = Field(0, description=(
        f"seeds torch, Pyro and every sampler of the run; the same seed gives the same run; 0 to {SEED_MAX}"))
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description=(
        "auto is CUDA when present, else the CPU; cuda without a visible GPU is refused"))
    dtype: Literal["float32", "float64"] = Field("float32", description=(
        "the floating-point type of the net, the guide and the data"))
    member: str | None = Field(None, description=(
        f"a named member of the zoo ({', '.join(MEMBERS)}): its family, guide, prior and inference sections "
        "underneath the spec's own, which override them (zoo list members)"))

    @field_validator("data", "net", "model", "guide", "likelihood", mode="before")
    @classmethod
    def _known_part(cls, v: Any, info: ValidationInfo) -> Any:
        """A section naming a registered part, normalised by its catalogue (old names, old run directories' flat
        sections). A name no part answers to is refused; while :func:`load_spec` collects problems it is noted
        instead and the section stands in as its kind's default, so that every other problem is listed too."""
        if info.field_name == "likelihood" and isinstance(v, dict) and v.get("name", "auto") == "auto":
            return {"name": "auto", **v}
        catalogue, default = _CATALOGUES[info.field_name]
        try:
            return catalogue.normalise(v, default)
        except ZooInputError as err:
            if not isinstance(info.context, dict) or "problems" not in info.context:
                raise
            info.context["problems"].append(err)
            info.context["stand_ins"].add(info.field_name)
            return {catalogue.key: default or next(iter(catalogue))}

    @field_validator("inference", mode="before")
    @classmethod
    def _default_method(cls, v: Any) -> Any:
        # an inference section without a method is SVI, like the section's own default
        return {"method": "svi", **v} if isinstance(v, dict) else v

    @model_validator(mode="before")
    @classmethod
    def _member_and_own_guide(cls, v: Any) -> Any:
        # a member's preset goes underneath the spec's own sections
        if isinstance(v, dict):
            v = with_member(v, {"prior": lambda prior: nested_prior(prior, name=None)})
        # a method that builds its own guide (laplace: a Gaussian with the Laplace covariance) names it by default
        if isinstance(v, dict) and isinstance(v.get("inference"), dict):
            name = v["inference"].get("method", "svi")
            method = registry.METHODS.method(name) if name in registry.METHODS else None
            guide = v.get("guide") or {}
            if method is not None and method.own_guide and isinstance(guide, dict) and "name" not in guide:
                v = {**v, "guide": {**guide, "name": method.own_guide}}
            if method is not None:
                v = method.complete(v)
        return v

    @model_validator(mode="after")
    def _known_names(self, info: ValidationInfo) -> RunSpec:
        noted = info.context if isinstance(info.context, dict) and "problems" in info.context else None
        problems: list[ZooInputError] = list(noted["problems"]) if noted else []
        stand_ins: set[str] = noted["stand_ins"] if noted else set()
        if noted:
            noted["problems"].clear()  # now reported here

        def check(fn: Any, *args: Any) -> bool:
            try:
                fn(*args)
            except ZooInputError as err:
                problems.append(err)
                return False
            return True

        if "net" not in stand_ins:
            problems.extend(self.net.refusals())
        if not stand_ins & {"guide", "model"} and registry.method_of(self).fits_guide:
            check(registry.check_guide_fits, self.guide, self.model)

        def refuse(field: str, value: Any, allowed: str) -> None:
            problems.append(ZooInputError(field, value, allowed, message=f"{field}: {allowed}"))

        if stand_ins:  # the rest reads sections that stand in for unknown names
            raise _SpecProblems(problems)
        takes_hierarchical = [name for name, family in FAMILIES.items() if family.hierarchical_priors]
        for prior in self.prior.every_prior():
            if prior.hierarchical and not self.model.hierarchical_priors:
                refuse("prior.name", prior.name, f"a hierarchical prior places per-neuron scales on ensemble members' "
                       f"factors; family '{self.model.family}' has none: use model.family: "
                       f"{' or '.join(takes_hierarchical)}")
        for field, value, allowed in self.model.refusals(self.prior.every_prior()):
            refuse(field, value, allowed)
        priors = {"prior.default": self.prior.default, **{f"prior.sites.{k}": v for k, v in self.prior.sites.items()}}
        for where, prior in priors.items():
            for field, value, allowed in prior.scale_refusals(getattr(torch, self.dtype)):
                refuse(f"{where}.{field}", value, allowed)

        method = registry.method_of(self)
        builder = next((m for m in registry.METHODS.methods() if m.own_guide == self.guide.name), None)
        owner = method if method.own_guide is not None else builder
        if owner is not None and (method is not owner or self.guide.name != owner.own_guide):
            refuse("guide.name", self.guide.name, f"the {owner.own_guide} guide is what inference.method: "
                   f"{owner.names[0]} fits, and only that: use both (leave guide.name out with it) or neither")
        if self.likelihood.noise_from_net and self.model.needs_global_noise:
            refuse("likelihood.noise", self.likelihood.noise, f"family '{self.model.family}' takes a Gaussian of one "
                   "noise (fixed or learned); a heteroscedastic net has two outputs per input: use "
                   "likelihood.noise: learned or a number")
        for problem in method.check(self):
            refuse(problem.field, problem.value, problem.allowed)
        if problems:
            raise _SpecProblems(problems)
        return self


class _SpecProblems(ValueError):
    """Every cross-field problem of a spec at once (pydantic reports one error per validator)."""

    def __init__(self, problems: list[ZooInputError]) -> None:
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


# --------------------------------------------------------------------------------------- load / dump
# pydantic's names for the members of a plain union (``float | Literal[...]``, ``int | float``) in an error's loc:
# not fields, so they are dropped, and the members' messages for one field joined on one line
_MEMBER_TAG = re.compile(r"^(int|float|str|bool|none|(literal|list|dict|tuple)\[.*\])$")


def _field_path(loc: tuple) -> list[str]:
    """The spec fields of a pydantic error location: a union member's tag (the part's name, right after the field
    that holds the union) and pydantic's own markers are left out; a field of the same name as a tag is kept."""
    path: list[str] = []
    after_tag = False
    for p in map(str, loc):
        if p.startswith(("function-", "tagged-union")) or _MEMBER_TAG.match(p):
            continue
        if p in _UNION_TAGS and not after_tag:
            after_tag = True
            continue
        path.append(p)
        after_tag = False
    return path


def _spec_problems(err: ValidationError) -> list[tuple[str, Any, str]]:
    """(dotted field, given value, message line) for every problem in ``err``, in pydantic's order."""
    out: list[tuple[str, Any, str]] = []
    for e in err.errors():
        cause = (e.get("ctx") or {}).get("error")
        causes = cause.problems if isinstance(cause, _SpecProblems) else [cause]
        if all(isinstance(c, ZooInputError) for c in causes):
            for c in causes:  # our own checks name their field themselves
                text = str(c)
                out.append((c.field, c.value, text if c.field in text else f"{c.field}: {text}"))
            continue
        loc = ".".join(_field_path(e["loc"])) or "spec"
        given = e.get("input")
        given_txt = "" if isinstance(given, dict) else f"got {given!r}; "
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            owners = _owners(e["loc"], str(e["loc"][-1]))
            msg = "unknown setting here" + (f"; it belongs to: {', '.join(owners)}" if owners else " (a typo?)")
        if out and out[-1][0] == loc and out[-1][1] is given:  # another member of the same union field
            if msg not in out[-1][2]:
                out[-1] = (loc, given, f"{out[-1][2]}, or {msg[0].lower()}{msg[1:]}")
            continue
        out.append((loc, given, f"{loc}: {given_txt}{msg}"))
    return out


def _merge(into: dict, mapping: dict) -> bool:
    """Deep-merge ``mapping`` into ``into`` (its keys win, nested mappings merge); whether ``into`` kept a key."""
    kept = bool(set(into) - set(mapping))
    for key, value in mapping.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            kept = _merge(into[key], dict(value)) or kept
        else:
            into[key] = copy.deepcopy(value)
    return kept


def set_path(tree: dict, dotted: str, value: Any, merge: bool = False) -> bool:
    """Set ``tree['a']['b'] = value`` for ``dotted='a.b'``, creating dicts on the way. With ``merge``, a mapping
    ``value`` merges into a mapping already there (see :func:`spec_tree`).

    :param tree: the spec as written, changed in place.
    :param dotted: the key path, e.g. ``inference.lr``.
    :param value: the value to set (a copy is stored).
    :param merge: merge a mapping ``value`` into a mapping already at the key instead of replacing it.
    :returns: whether a merge kept keys that ``value`` does not name.
    :raises ZooInputError: when a key on the way holds something other than a mapping.
    """
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        if not isinstance(node.get(k, {}), dict):
            raise ZooInputError("--set", dotted, f"'{k}' is not a section, so it has no key '{keys[-1]}'")
        node = node.setdefault(k, {})
    if merge and isinstance(value, Mapping) and isinstance(node.get(keys[-1]), dict):
        return _merge(node[keys[-1]], dict(value))
    node[keys[-1]] = copy.deepcopy(value)
    return False


def parse_overrides(pairs: list[str]) -> list[tuple[str, Any, bool]]:
    """Parse ``key.path=value`` (merge a mapping value into the spec's) and ``key.path:=value`` (replace) strings
    into (key, value, replace); values are read as YAML (numbers, lists, mappings, booleans, null).

    :param pairs: the ``--set`` strings.
    :returns: ``(key, value, replace)`` for each, in order; an empty value is None.
    :raises ZooInputError: a string without ``=`` or a key, or a value that is not valid YAML.
    """
    out = []
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        replace = key.rstrip().endswith(":")
        key = key.rstrip().removesuffix(":").strip()
        if not sep or not key:
            raise ZooInputError("--set", pair, "write overrides as key.path=value, e.g. --set data.split=3")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as exc:
            where = f" (column {exc.problem_mark.column + 1})" if getattr(exc, "problem_mark", None) else ""
            raise ZooInputError("--set", pair, "", message=f"--set {pair}: the value is not valid YAML: "
                                f"{getattr(exc, 'problem', None) or exc}{where}; quote it for the shell, e.g. "
                                "--set 'net={name: mlp, hidden: [20]}'") from None
        out.append((key, value, replace))
    return out


def _override_list(overrides: Any) -> list[str]:
    """``overrides`` as a list of ``key.path=value`` strings: None, one string, or a list/tuple of strings."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        return [overrides]
    if not isinstance(overrides, list | tuple):
        raise ZooInputError("overrides", overrides, "give one 'key.path=value' string or a list of them, "
                            "e.g. ['seed=3', 'net.hidden=[20, 20]']")
    for item in overrides:
        if not isinstance(item, str):
            raise ZooInputError("overrides", item, "every override is one 'key.path=value' string, e.g. 'seed=3'")
    return list(overrides)


# Where ``zoo list configs`` and the refusal of a missing spec send the user to see every shipped config
LIST_CONFIGS = "zoo list configs"


def shipped_configs_dir() -> Traversable | None:
    """The folder of the configs shipped with the package: ``zoo/configs`` inside an installed wheel (package data,
    the repository's ``configs/`` mapped onto the package ``zoo.configs``), the repository's ``configs/`` itself in a
    source checkout and its editable install (which Python cannot import as ``zoo.configs``: no ``__init__.py``).

    :returns: the folder, or None where neither is there.
    """
    inside = importlib.resources.files("zoo") / "configs"
    if inside.is_dir():
        return inside
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "pyproject.toml").is_file() and (checkout / "configs").is_dir():
        return checkout / "configs"
    return None


def shipped_configs() -> dict[str, Traversable]:
    """The run specs shipped with the package by name, sorted: ``mean_field_toy`` for ``configs/mean_field_toy.yaml``
    (the search spaces of ``configs/spaces/`` are not specs and are left out).

    :returns: each name's file (``.read_text()`` reads it); empty where the package ships none.
    """
    folder = shipped_configs_dir()
    if folder is None:
        return {}
    found = {entry.name.removesuffix(".yaml"): entry for entry in folder.iterdir()
             if entry.name.endswith(".yaml") and entry.is_file()}
    return dict(sorted(found.items()))


def _shipped_parts(source: str | os.PathLike) -> tuple[str, ...] | None:
    """The path below the shipped configs folder that ``source`` names, or None where it names none: a relative
    ``configs/<name>.yaml`` (or ``configs/spaces/<name>.yaml``), ``<name>.yaml`` or bare ``<name>``."""
    text = os.fspath(source)
    path = PurePath(text)
    if not text or path.is_absolute() or text.startswith("~"):
        return None
    parts = path.parts
    if parts[:1] == ("configs",):
        parts = parts[1:]
    elif len(parts) != 1:
        return None
    if not parts or ".." in parts:
        return None
    return (*parts[:-1], parts[-1] if parts[-1].endswith(".yaml") else f"{parts[-1]}.yaml")


def find_config(source: str | os.PathLike) -> Path | Traversable | None:
    """The file a spec (or search-space) path names: the file itself where it exists on disk, which always wins;
    else, for a relative ``configs/<name>.yaml``, ``<name>.yaml`` or bare ``<name>`` (``configs/spaces/<name>.yaml``
    for a search space), the config of that name shipped with the package, so that ``zoo train
    configs/mean_field_toy.yaml`` runs from any folder.

    :param source: the path as given (a str or a path).
    :returns: the file to read, or None where ``source`` is neither a file nor a shipped config's name.
    """
    path = Path(source)
    if path.is_file():
        return path
    parts, folder = _shipped_parts(source), shipped_configs_dir()
    if parts is None or folder is None or path.exists():
        return None
    entry = folder
    for part in parts:
        entry = entry / part
    return entry if entry.is_file() else None


def _no_such_config(source: str | os.PathLike) -> str:
    """The refusal of a spec path that is neither a file nor a shipped config: the closest shipped names, and how to
    see them all."""
    parts = _shipped_parts(source)
    if parts is None or Path(source).exists():
        return (f"no such file; pass the path of a YAML spec, or a shipped config's name such as "
                f"configs/mean_field_toy.yaml (`{LIST_CONFIGS}` prints them all)")
    asked = "/".join(parts).removesuffix(".yaml")
    names = list(shipped_configs())
    close = [name for name in names if asked and asked in name][:5]
    close += [name for name in difflib.get_close_matches(asked, names, n=5, cutoff=0.6) if name not in close]
    hint = f"; the closest: {', '.join(close[:5])}" if close else ""
    return (f"no such file, nor a shipped config named {asked!r}{hint} (`{LIST_CONFIGS}` prints them all; give one "
            "as configs/NAME.yaml or NAME from any folder)")


def _read_tree(source: str | Path | dict | RunSpec) -> dict:
    """The spec as written: a YAML file's mapping, a copy of a dict, or a RunSpec's fields."""
    if isinstance(source, RunSpec):
        return source.model_dump(mode="json")
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source))
    if not isinstance(source, str | os.PathLike):
        raise ZooInputError("spec", source, "pass the path of a YAML spec file (a str or pathlib.Path), a dict of "
                            "sections (data, net, ...) or a RunSpec")
    path = find_config(source)
    if path is None:
        raise ZooInputError("spec", str(Path(source)), _no_such_config(source))
    try:
        tree = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader) or {}
    except UnicodeDecodeError as exc:
        raise ZooInputError("spec", str(path), f"is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                            f"{exc.start}); save the spec as UTF-8") from None
    except yaml.YAMLError as exc:
        raise ZooInputError("spec", str(path), f"is not valid YAML: {exc}") from None
    if not isinstance(tree, dict):
        raise ZooInputError("spec", str(path), "the top level must be a mapping of sections (data, net, ...)")
    return tree


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (plain YAML keeps the last one silently, so a
    second ``inference:`` section would drop every setting of the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str | int | float | bool) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice in one mapping (line {seen[key].start_mark.line + 1} "
                    f"and line {key_node.start_mark.line + 1}); keep one, merging their settings", key_node.start_mark)
            if isinstance(key, str | int | float | bool):
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def _apply_overrides(tree: dict, overrides: str | list[str] | None) -> list[str]:
    """Apply ``--set`` overrides to ``tree`` in order; the keys where a mapping merged into one that kept keys."""
    merged = []
    for key, value, replace in parse_overrides(_override_list(overrides)):
        if set_path(tree, key, value, merge=not replace):
            merged.append(key)
    return merged


def spec_tree(source: str | Path | dict | RunSpec, overrides: str | list[str] | None = None) -> dict:
    """The spec as written (a YAML file, a dict or a RunSpec's fields) with ``--set`` overrides applied, before
    validation: where further ``key.path=value`` settings go exactly as ``--set`` would put them.

    ``key=VALUE`` sets the key; a mapping VALUE merges into a mapping already at the key (its keys win, the others
    stay). ``key:=VALUE`` replaces whatever is at the key with VALUE.

    :param source: the path of a YAML spec file, a dict of sections, or a :class:`RunSpec`.
    :param overrides: one ``key.path=value`` string or a list of them, applied in order.
    :returns: the spec tree, a new dict (``source`` is not changed).
    :raises ZooInputError: an unreadable source, or a malformed override.
    """
    tree = _read_tree(source)
    _apply_overrides(tree, overrides)
    return tree


def load_spec(source: str | Path | dict | RunSpec, overrides: str | list[str] | None = None) -> RunSpec:
    """Read a spec from a YAML file, a dict or a RunSpec, apply ``--set`` overrides (one ``key.path=value``
    string or a list of them; see :func:`spec_tree`), and validate it.

    :param source: the path of a YAML spec file, a dict of sections, or a :class:`RunSpec`.
    :param overrides: one ``key.path=value`` string or a list of them, applied in order.
    :returns: the validated spec.
    :raises ZooInputError: an unreadable source, a malformed override, or an invalid spec (every problem listed,
        each naming its field).
    """
    tree = _read_tree(source)
    merged = _apply_overrides(tree, overrides)
    noted: dict[str, Any] = {"problems": [], "stand_ins": set()}  # unknown names, reported with every other problem
    try:
        return RunSpec.model_validate(tree, context=noted)
    except ValidationError as exc:
        problems = [(p.field, p.value, str(p) if p.field in str(p) else f"{p.field}: {p}") for p in noted["problems"]]
        problems += _spec_problems(exc)
        lines = [line for _, _, line in problems]
        for key in merged:
            if any(f == key or f.startswith(f"{key}.") for f, _, _ in problems):
                lines.append(f"(--set {key}=... merged into the spec's {key}, keeping its other keys; write "
                             f"--set {key}:=... to replace it)")
        text = "\n".join(f"  {line}" for line in lines)
        field, value, _ = problems[0]
        raise ZooInputError(field, value, text, message=f"invalid spec; fix these fields:\n{text}") from None


def spec_to_yaml(spec: RunSpec) -> str:
    """The fully resolved spec as YAML (what a run directory records).

    :param spec: a validated spec.
    :returns: the YAML text, every field written, in the spec's field order.
    """
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)


def run_identity(spec: RunSpec) -> dict:
    """What makes two specs the same run: the spec as a dict, less where its data lives (``data.dir``), so a run
    directory copied to another machine resumes there with that machine's data directory, and less the ``member``
    name, which only says where the sections came from (a run started from a spec that spelled them out resumes
    from one that names their member).

    :param spec: a validated spec.
    :returns: ``spec.model_dump()`` without ``data.dir`` and ``member``.
    """
    tree = spec.model_dump()
    tree["data"].pop("dir", None)
    tree.pop("member", None)
    return tree


_KINDS = ("name", "method", "family")  # the keys that choose a section's kind: another kind has other fields


def spec_differences(had: Any, asked: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Every field where two spec trees (:func:`run_identity`) differ, as ``(dotted path, had, asked)``; where a
    section's kind differs (its ``name``, ``method`` or ``family``), that field alone stands for the section.

    :param had: one tree (e.g. the run's own spec).
    :param asked: the other (e.g. the spec a resume was given).
    :param path: the dotted path of the trees (empty at the top).
    :returns: the differences, in the trees' order; a field one tree lacks has the value :data:`MISSING`.
    """
    if not isinstance(had, dict) or not isinstance(asked, dict):
        return [] if had == asked else [(path or "spec", had, asked)]
    where = f"{path}." if path else ""
    for kind in _KINDS:
        if kind in had and kind in asked and had[kind] != asked[kind]:
            return [(f"{where}{kind}", had[kind], asked[kind])]
    out = []
    for key in [*had, *(k for k in asked if k not in had)]:
        out += spec_differences(had.get(key, MISSING), asked.get(key, MISSING), f"{where}{key}")
    return out


class _Missing:
    def __repr__(self) -> str:
        return "not set"


MISSING = _Missing()  # a field one spec tree has and the other does not


# ----------------------------------------------------------------------------------------- the reference
@dataclass(frozen=True)
class SectionReference:
    """One section of the run spec as the documentation lists it: its dotted path, the variant a discriminator
    selects (``method: svi``; empty for a section of one kind), and its pydantic model.

    :param path: the section's dotted path in the run spec (empty for the top level).
    :param variant: the discriminator and the names that select this variant, e.g. ``method: svi``; empty for a
        section of one kind.
    :param model: the section's pydantic model.
    """

    path: str
    variant: str
    model: type[BaseModel]


def spec_sections() -> list[SectionReference]:
    """Every section of :class:`RunSpec`, walked from the top: each nested model once, at the first path that
    reaches it, each member of a discriminated union (data sets, nets, priors, families, guides, likelihoods,
    methods) as its own variant, labelled with the names it answers to. A section that is a variant of a union
    somewhere (the SVI settings) is listed there, not where another section nests it (``model.map``). The docs'
    spec reference is generated from this, and a test holds every field to a description.

    :returns: the sections, in the order the walk meets them.
    """
    found: list[SectionReference] = []
    seen: set[type[BaseModel]] = set()
    names_of: dict[type[BaseModel], list[str]] = {}
    for parts in _SECTION_PARTS.values():
        for name, cls in parts.items():
            names_of.setdefault(cls, []).append(name)

    def models_in(annotation: Any) -> list[type[BaseModel]]:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return [annotation]
        return list(dict.fromkeys(m for arg in get_args(annotation) for m in models_in(arg)))

    def unions(model: type[BaseModel]) -> list[list[type[BaseModel]]]:
        out = []
        for field in model.model_fields.values():
            members = models_in(field.annotation)
            out += [members] if len(members) > 1 else []
            out += [u for m in members for u in unions(m)]
        return out

    variants = {m for members in unions(RunSpec) for m in members}

    def walk(path: str, model: type[BaseModel], variant: str = "") -> None:
        if model in seen or (not variant and model in variants):
            return
        seen.add(model)
        found.append(SectionReference(path, variant, model))
        for name, field in model.model_fields.items():
            members = models_in(field.annotation)
            tag = next((key for key in ("name", "family", "method") if len(members) > 1
                        and all(key in m.model_fields for m in members)), None)
            for member in members:
                label = f"{tag}: {' | '.join(names_of.get(member, []))}" if tag else ""
                walk(f"{path}.{name}" if path else name, member, label)

    walk("", RunSpec)
    return found
