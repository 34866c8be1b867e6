"""The whole run spec: the sections of :mod:`zoo.sections` composed, with the names in them checked against the
registry (data sets, nets, priors, families, guides, inference methods) and every cross-section refusal."""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args

import yaml
from pydantic import BaseModel, Field, NonNegativeInt, ValidationError, field_validator, model_validator

from zoo import registry
from zoo.data import check_data_spec
from zoo.errors import ZooInputError
from zoo.nets import check_net_settings
from zoo.sections import (  # noqa: F401 - re-exported: users build specs from zoo.spec alone
    INIT_RHO_MAX,
    INIT_RHO_MIN,
    CauchyPrior,
    DataSpec,
    DeepEnsembleModelSpec,
    GaussianScaleMixturePrior,
    GuideSpec,
    LaplacePrior,
    LikelihoodSpec,
    MeanFieldModelSpec,
    ModelSpec,
    NetSpec,
    NoisePrior,
    NormalPrior,
    PriorConfig,
    PriorSpec,
    Rank1ModelSpec,
    ScaleMixturePrior,
    Strict,
    SubnetSelectionSpec,
    SubnetworkModelSpec,
    SVISpec,
    softplus,
)

# The inference section is whichever registered method's spec its ``method`` names
_METHOD_SPECS = tuple(dict.fromkeys(method.spec for method in registry.METHODS.values()))
InferenceSpec = Annotated[Union[_METHOD_SPECS], Field(discriminator="method")]  # noqa: UP007 - built from a tuple


def _owners(field: str) -> list[str]:
    """The priors/families/methods that do have a setting called ``field`` (for 'not permitted here' messages)."""
    return sorted(tag for tag, cls in _UNION_MEMBERS.items() if field in cls.model_fields)



_UNION_MEMBERS = {tag: cls
                  for union, key in ((PriorConfig, "name"), (ModelSpec, "family"), (InferenceSpec, "method"))
                  for cls in get_args(get_args(union)[0])
                  for tag in get_args(cls.model_fields[key].annotation)}
_UNION_TAGS = set(_UNION_MEMBERS)


class RunSpec(Strict):
    """A whole run: any valid combination of parts is one spec away."""

    data: DataSpec = Field(description="the data set and its splits (section data)")
    net: NetSpec = Field(default_factory=NetSpec, description=(
        "the deterministic architecture the family makes Bayesian (section net)"))
    prior: PriorSpec = Field(default_factory=PriorSpec, description=(
        "the prior on the weights: a default plus overrides by site-name glob (section prior)"))
    model: ModelSpec = Field(default_factory=MeanFieldModelSpec, description=(
        "the model family, chosen by model.family: mean_field, rank1, deep_ensemble or subnetwork"))
    guide: GuideSpec = Field(default_factory=GuideSpec, description=(
        "the variational family (or point estimate) that SVI fits, chosen by guide.name"))
    likelihood: LikelihoodSpec = Field(default_factory=LikelihoodSpec, description=(
        "the observation model: categorical or Gaussian with fixed, learned or heteroscedastic noise"))
    inference: InferenceSpec = Field(default_factory=SVISpec, description=(
        "how the posterior is computed, chosen by inference.method (svi, nuts, hmc, laplace, sgld, sghmc, swag)"))
    seed: NonNegativeInt = Field(0, description=(
        "seeds torch, Pyro and every sampler of the run; the same seed gives the same run"))
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description=(
        "auto is CUDA when present, else the CPU; cuda without a visible GPU is refused"))
    dtype: Literal["float32", "float64"] = Field("float32", description=(
        "the floating-point type of the net, the guide and the data"))

    @field_validator("model", mode="before")
    @classmethod
    def _default_family(cls, v: Any) -> Any:
        # a model section without a family is the mean-field one, like the section's own default
        return {"family": "mean_field", **v} if isinstance(v, dict) else v

    @field_validator("inference", mode="before")
    @classmethod
    def _default_method(cls, v: Any) -> Any:
        # an inference section without a method is SVI, like the section's own default
        return {"method": "svi", **v} if isinstance(v, dict) else v

    @model_validator(mode="before")
    @classmethod
    def _own_guide(cls, v: Any) -> Any:
        # a method that builds its own guide (laplace: a Gaussian with the Laplace covariance) names it by default
        if isinstance(v, dict) and isinstance(v.get("inference"), dict):
            method = registry.METHODS.get(v["inference"].get("method", "svi"))
            guide = v.get("guide") or {}
            if method is not None and method.own_guide and isinstance(guide, dict) and "name" not in guide:
                v = {**v, "guide": {**guide, "name": method.own_guide}}
        return v

    @model_validator(mode="after")
    def _known_names(self) -> RunSpec:
        problems: list[ZooInputError] = []

        def check(fn: Any, *args: Any) -> bool:
            try:
                fn(*args)
            except ZooInputError as err:
                problems.append(err)
                return False
            return True

        check(check_data_spec, self.data)
        if check(registry.check_choice, "net.name", self.net.name, registry.NETS):
            check(check_net_settings, self.net)
        check(registry.check_choice, "net.activation", self.net.activation, registry.ACTIVATIONS)
        family = check(registry.check_choice, "model.family", self.model.family, registry.FAMILIES)
        guide = check(registry.check_choice, "guide.name", self.guide.name, registry.GUIDES)
        if family and guide:
            check(registry.check_guide_fits, self.model.family, self.guide.name)

        def refuse(field: str, value: Any, allowed: str) -> None:
            problems.append(ZooInputError(field, value, allowed, message=f"{field}: {allowed}"))

        method = registry.method_of(self)
        builder = next((m for m in registry.METHODS.values() if m.own_guide == self.guide.name), None)
        owner = method if method.own_guide is not None else builder
        if owner is not None and (method is not owner or self.guide.name != owner.own_guide):
            refuse("guide.name", self.guide.name, f"the {owner.own_guide} guide is what inference.method: "
                   f"{owner.names[0]} fits, and only that: use both (leave guide.name out with it) or neither")
        if self.likelihood.noise == "heteroscedastic" and self.model.family == "subnetwork":
            refuse("likelihood.noise", self.likelihood.noise, "the subnetwork family's linearised Laplace takes a "
                   "Gaussian of one noise (fixed or learned); a heteroscedastic net has two outputs per input: use "
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
        loc = ".".join(str(p) for p in e["loc"]
                       if not str(p).startswith(("function-", "tagged-union")) and p not in _UNION_TAGS
                       and not _MEMBER_TAG.match(str(p))) or "spec"
        given = e.get("input")
        given_txt = "" if isinstance(given, dict) else f"got {given!r}; "
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            owners = _owners(str(e["loc"][-1]))
            msg = "unknown setting here" + (f"; it belongs to: {', '.join(owners)}" if owners else " (a typo?)")
        if out and out[-1][0] == loc and out[-1][1] is given:  # another member of the same union field
            if msg not in out[-1][2]:
                out[-1] = (loc, given, f"{out[-1][2]}, or {msg[0].lower()}{msg[1:]}")
            continue
        out.append((loc, given, f"{loc}: {given_txt}{msg}"))
    return out


def _format_pydantic_error(err: ValidationError) -> str:
    """One indented line per problem."""
    return "\n".join(f"  {line}" for _, _, line in _spec_problems(err))


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
    ``value`` merges into a mapping already there (see :func:`spec_tree`); returns whether a merge kept keys that
    ``value`` does not name."""
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
    into (key, value, replace); values are read as YAML (numbers, lists, mappings, booleans, null)."""
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


def _read_tree(source: str | Path | dict | RunSpec) -> dict:
    """The spec as written: a YAML file's mapping, a copy of a dict, or a RunSpec's fields."""
    if isinstance(source, RunSpec):
        return source.model_dump(mode="json")
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source))
    if not isinstance(source, str | os.PathLike):
        raise ZooInputError("spec", source, "pass the path of a YAML spec file (a str or pathlib.Path), a dict of "
                            "sections (data, net, ...) or a RunSpec")
    path = Path(source)
    if not path.is_file():
        raise ZooInputError("spec", str(path), "no such file; pass the path of a YAML spec (see configs/)")
    try:
        tree = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as exc:
        raise ZooInputError("spec", str(path), f"is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                            f"{exc.start}); save the spec as UTF-8") from None
    except yaml.YAMLError as exc:
        raise ZooInputError("spec", str(path), f"is not valid YAML: {exc}") from None
    if not isinstance(tree, dict):
        raise ZooInputError("spec", str(path), "the top level must be a mapping of sections (data, net, ...)")
    return tree


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
    stay). ``key:=VALUE`` replaces whatever is at the key with VALUE."""
    tree = _read_tree(source)
    _apply_overrides(tree, overrides)
    return tree


def load_spec(source: str | Path | dict | RunSpec, overrides: str | list[str] | None = None) -> RunSpec:
    """Read a spec from a YAML file, a dict or a RunSpec, apply ``--set`` overrides (one ``key.path=value``
    string or a list of them; see :func:`spec_tree`), and validate it."""
    tree = _read_tree(source)
    merged = _apply_overrides(tree, overrides)
    try:
        return RunSpec.model_validate(tree)
    except ValidationError as exc:
        problems = _spec_problems(exc)
        lines = [line for _, _, line in problems]
        for key in merged:
            if any(f == key or f.startswith(f"{key}.") for f, _, _ in problems):
                lines.append(f"(--set {key}=... merged into the spec's {key}, keeping its other keys; write "
                             f"--set {key}:=... to replace it)")
        text = "\n".join(f"  {line}" for line in lines)
        field, value, _ = problems[0]
        raise ZooInputError(field, value, text, message=f"invalid spec; fix these fields:\n{text}") from None


def spec_to_yaml(spec: RunSpec) -> str:
    """The fully resolved spec as YAML (what a run directory records)."""
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)


# ----------------------------------------------------------------------------------------- the reference
@dataclass(frozen=True)
class SectionReference:
    """One section of the run spec as the documentation lists it: its dotted path, the variant a discriminator
    selects (``method: svi``; empty for a section of one kind), and its pydantic model."""

    path: str
    variant: str
    model: type[BaseModel]


def spec_sections() -> list[SectionReference]:
    """Every section of :class:`RunSpec`, walked from the top: each nested model once, at the first path that
    reaches it, each member of a discriminated union (priors, families, methods) as its own variant. The docs'
    spec reference is generated from this, and a test holds every field to a description."""
    found: list[SectionReference] = []
    seen: set[type[BaseModel]] = set()

    def models_in(annotation: Any) -> list[type[BaseModel]]:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return [annotation]
        return [m for arg in get_args(annotation) for m in models_in(arg)]

    def walk(path: str, model: type[BaseModel], variant: str = "") -> None:
        if model in seen:
            return
        seen.add(model)
        found.append(SectionReference(path, variant, model))
        for name, field in model.model_fields.items():
            members = models_in(field.annotation)
            tag = next((key for key in ("name", "family", "method") if len(members) > 1
                        and all(key in m.model_fields for m in members)), None)
            for member in members:
                label = f"{tag}: {' | '.join(map(str, get_args(member.model_fields[tag].annotation)))}" if tag else ""
                walk(f"{path}.{name}" if path else name, member, label)

    walk("", RunSpec)
    return found
