"""What makes a swappable part: its spec section (a strict pydantic model that names it and declares what it needs
and offers), and the :class:`Catalogue` it is registered in once.

Every prior, guide, model family, likelihood and net is one module that holds its section and its behaviour; the
package of its kind registers the section in a :class:`Catalogue` (one line). The run spec's field for that kind is
the catalogue's :meth:`~Catalogue.union`, discriminated by the section's name, so a registered part is in the spec,
in ``zoo list`` and in the generated spec reference without another edit. Capabilities are class-level
declarations on the sections (``ClassVar``), read by the combination rules; no rule compares a part's name.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Annotated, Any, ClassVar, Generic, TypeVar, Union, get_args

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError

from zoo.errors import ZooInputError


class Strict(BaseModel):
    """A spec section: unknown keys are refused, and so is inf or NaN in any float field (no scale, rate,
    temperature or bound of the zoo means anything there)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    # the values a field defaulted to before its default changed: run directories record a section's fields, those of
    # every part of its kind among them, and an old one's value at such a default did nothing (Registry.normalise)
    former_defaults: ClassVar[dict[str, tuple[Any, ...]]] = {}


S = TypeVar("S", bound=type[BaseModel])


# The abbreviations a sentence does not end at ("i.e. K = 4 members", "Wen et al. 2020"): fixed-width lookbehinds
_NOT_AN_END = "".join(rf"(?<!\b{re.escape(a)})" for a in ("i.e.", "e.g.", "et al.", "cf.", "vs.", "resp."))


def first_sentence(obj: object) -> str:
    """The first sentence of ``obj``'s docstring (or of ``obj``, a string), unwrapped, double backquotes dropped;
    the whole first paragraph where it has no sentence end (what ``zoo list`` shows of a part).

    :param obj: a documented object, or a docstring.
    :returns: one line of text.
    """
    doc = obj if isinstance(obj, str) else obj.__doc__ or ""
    paragraph = " ".join(line.strip() for line in doc.strip().split("\n\n")[0].splitlines())
    sentence = re.split(rf"{_NOT_AN_END}(?<=[.!?])\s+(?=[A-Z(])", paragraph, maxsplit=1)[0]
    return sentence.replace("``", "")


def tags_of(section: type[BaseModel], key: str) -> tuple[str, ...]:
    """The names a section answers to: the values of its ``Literal`` field ``key`` (one, or several for a section
    that serves a family of names).

    :param section: a registered section class.
    :param key: its discriminating field (``name``, ``family``, ``method``).
    :returns: the names.
    """
    return tuple(get_args(section.model_fields[key].annotation))


class Catalogue(Generic[S]):
    """The registered sections of one kind of part, by name.

    A section answers to one name, several (``name: Literal["mnist", "cifar10"]``), or a prefix ending in ``:``
    (``uci:``: every ``uci:<folder>``), as ``names_of`` says. A section whose class sets ``offered = False`` (one
    only the zoo writes, e.g. data given in Python) is accepted but not offered in place of an unknown name.

    :param kind: what the parts are (``prior``, ``guide``, ...), for messages.
    :param sections: the section classes; their order is the listing order.
    :param key: the field whose value names the part in a spec.
    :param field: the dotted spec field that names the part, for messages (``guide.name``).
    :param renamed: old names still accepted, each with its new name (a :class:`FutureWarning` says so).
    :param names_of: the names a section serves (by default the values of its ``Literal`` field ``key``).
    :param shown: how messages spell a registered name (a prefix as ``uci:<folder>``), where not as it is.
    """

    def __init__(self, kind: str, *sections: S, key: str = "name", field: str | None = None,
                 renamed: dict[str, str] | None = None,
                 names_of: Callable[[S], tuple[str, ...]] | None = None, shown: dict[str, str] | None = None) -> None:
        self.kind, self.key, self.field = kind, key, field or f"{kind}.{key}"
        names = names_of or (lambda section: tags_of(section, key))
        self.sections: dict[str, S] = {tag: section for section in sections for tag in names(section)}
        self.renamed = dict(renamed or {})
        self.shown = dict(shown or {})

    def __iter__(self) -> Iterator[str]:
        return iter(self.sections)

    def __contains__(self, name: object) -> bool:
        return self.tag(name) is not None

    def tag(self, name: object) -> str | None:
        """The registered name that serves ``name``: itself, or the prefix it starts with; None if none does.

        :param name: a name as a spec gives it.
        :returns: the registered name, or None.
        """
        if not isinstance(name, str):
            return None
        if name in self.sections and not name.endswith(":"):
            return name
        return next((p for p in self.sections if p.endswith(":") and name.startswith(p)), None)

    def __getitem__(self, name: str) -> S:
        """The section that serves ``name``; refused with the registered names otherwise."""
        tag = self.tag(name)
        if tag is None:
            offered = [n for n, section in self.sections.items() if getattr(section, "offered", True)]
            allowed = f"use one of: {', '.join(self.shown.get(n, n) for n in offered)}"
            raise ZooInputError(self.field, name, allowed, message=f"unknown {self.field} {name!r}; {allowed}")
        return self.sections[tag]

    def items(self) -> Iterator[tuple[str, S]]:
        """(name, section) pairs in registration order (a section serving several names once per name).

        :returns: an iterator over ``(name, section class)``.
        """
        return iter(self.sections.items())

    def union(self) -> Any:
        """The spec field's type: the registered sections, discriminated by the name they serve.

        :returns: the one section class where only one is registered; otherwise an ``Annotated`` union of the
            sections, discriminated by the field ``key`` (or, where a section serves several names or a prefix,
            by the registered name that serves the value's ``key``).
        """
        members = tuple(dict.fromkeys(self.sections.values()))
        if len(members) == 1:
            return members[0]
        if len(members) == len(self.sections):  # one name each: pydantic's own tagged union
            return Annotated[Union[members], Field(discriminator=self.key)]  # noqa: UP007 - built from a tuple
        tagged = tuple(Annotated[section, Tag(tag)] for tag, section in self.sections.items())

        def discriminate(value: Any) -> str | None:
            return self.tag(value.get(self.key) if isinstance(value, dict) else value.model_dump().get(self.key))

        return Annotated[Union[tagged], Discriminator(discriminate)]  # noqa: UP007 - built from a tuple

    def summaries(self) -> dict[str, str]:
        """Every registered name with the first sentence of its section's docstring (``zoo list``).

        :returns: ``{name: first sentence}`` in registration order.
        """
        return {name: first_sentence(section) for name, section in self.sections.items()}

    def owners(self, key: str) -> list[str]:
        """The registered parts that have a setting ``key``.

        :param key: a field name.
        :returns: their names.
        """
        return sorted(self.shown.get(name, name) for name, section in self.sections.items()
                      if key in section.model_fields)

    def owner_sections(self, key: str) -> list[S]:
        """The registered sections that have a setting ``key`` (each once).

        :param key: a field name.
        :returns: the section classes.
        """
        return [s for s in dict.fromkeys(self.sections.values()) if key in s.model_fields]

    def validate(self, value: dict, default: str | None = None) -> Any:
        """A section from a mapping of its fields (as :meth:`normalise` reads it), as a spec would validate it.

        :param value: the fields, ``{key: name, ...}``.
        :param default: the name assumed where ``value`` names none.
        :returns: the registered section, validated.
        :raises ZooInputError: the first problem, naming the field.
        """
        value = self.normalise(value, default)
        try:
            return self[value[self.key]].model_validate(value)
        except ValidationError as err:
            problem = err.errors()[0]
            cause = (problem.get("ctx") or {}).get("error")
            if isinstance(cause, ZooInputError):  # a section's own check names its field
                raise cause from None
            field = ".".join([self.field.rsplit(".", 1)[0], *map(str, problem["loc"])])
            message = problem["msg"].removeprefix("Value error, ")
            if problem["type"] == "extra_forbidden":
                owners = self.owners(str(problem["loc"][-1]))
                message = "unknown setting here" + (f"; it belongs to: {', '.join(owners)}" if owners else "")
            raise ZooInputError(field, problem.get("input"), message) from None

    def normalise(self, value: Any, default: str | None = None) -> Any:
        """A section as a spec (or a run directory's ``spec.yaml``) writes it, made valid for the registered sections.

        An old name in :attr:`renamed` becomes its new one, with a :class:`FutureWarning`. A key that the named
        section does not have but another registered section does is dropped where it holds that section's default:
        run directories record every field of a section as it once was, one flat bag for every part of the kind,
        and those values never did anything (where several sections have the key, at every one's default but those
        left unset: a guide's ``rank`` is 10 for auto, unset for laplace). A key at any other value is kept, so the
        spec refuses it naming the parts it belongs to.

        :param value: the section as written (a mapping; anything else passes through for pydantic to refuse).
        :param default: the name assumed where the section names none.
        :returns: the section to validate.
        """
        if not isinstance(value, dict):
            return value
        value = dict(value)
        if default is not None:
            value.setdefault(self.key, default)
        name = value.get(self.key)
        if name in self.renamed:
            new = self.renamed[name]
            warnings.warn(f"{self.field}: {name!r} is now called {new!r}; the old name still works, but write "
                          f"{self.field}: {new} in new specs", FutureWarning, stacklevel=2)
            name = value[self.key] = new
        own = self[name]  # an unknown name is refused here, with the registered ones
        for key in [k for k in value if k not in own.model_fields]:
            sections = [s for s in self.owner_sections(key) if not s.model_fields[key].is_required()]
            if not sections:
                continue
            recorded = [r for r in (_recorded_defaults(s, key) for s in sections) if r]
            if all(any(_same(value[key], v) for v in r) for r in recorded or [[None]]):  # every default unset: null
                del value[key]
        return value


def _recorded_defaults(section: type[BaseModel], key: str) -> list[Any]:
    """The values a run directory may have recorded for a section's field at its default: the default (none where
    it is unset) and the defaults it had before (:attr:`Strict.former_defaults`)."""
    default = section.model_fields[key].get_default(call_default_factory=True)
    return [default] * (default is not None) + list(getattr(section, "former_defaults", {}).get(key, ()))


def _same(value: Any, default: Any) -> bool:
    """Whether a written value is a field's default (a nested section compares as its dump)."""
    if isinstance(default, BaseModel):
        default = default.model_dump(mode="json")
    return value == default


def import_target(target: str, field: str) -> Any:
    """The object an import path names (``package.module:attribute``, attributes dotted for nested ones), as a spec
    points at user code (Hydra's ``_target_`` convention).

    :param target: ``module.path:attribute``.
    :param field: the spec field that gave it, for messages.
    :returns: the object.
    :raises ZooInputError: a malformed path, a module that does not import (naming it and why), or an attribute
        it does not have.
    """
    module_name, sep, attribute = str(target).partition(":")
    if not sep or not module_name or not attribute:
        raise ZooInputError(field, target, "write it as module.path:attribute, e.g. mypkg.models:make_net")
    try:
        obj = _import_module(module_name)
    except ImportError as err:
        missing = getattr(err, "name", None)
        if isinstance(err, ModuleNotFoundError) and missing and not f"{module_name}.".startswith(f"{missing}."):
            raise ZooInputError(field, target, f"module {module_name!r} imports {missing!r}, which is not installed "
                                f"here ({describe_failure(err)}): install it in this environment") from None
        raise ZooInputError(field, target, f"module {module_name!r} does not import ({type(err).__name__}: {err}; "
                            f"searched sys.path and the working directory {os.getcwd()}): install it, run from the "
                            "directory that holds it, or add that directory to PYTHONPATH") from None
    except SyntaxError as err:  # IndentationError too: the file and line Python could not read
        raise ZooInputError(field, target, f"module {module_name!r} does not import: {type(err).__name__} in "
                            f"{err.filename}, line {err.lineno}: {err.msg}; fix the file") from None
    except Exception as err:  # noqa: BLE001 - the module's own code failed as it ran: named, not a traceback
        raise ZooInputError(field, target, f"module {module_name!r} does not import: running it raised "
                            f"{describe_failure(err)}; fix the module") from None
    for part in attribute.split("."):
        if part not in vars(obj) and not hasattr(type(obj), part):
            raise ZooInputError(field, target, f"module {module_name!r} has no attribute {attribute!r}")
        obj = getattr(obj, part)
    return obj


def _import_module(name: str) -> Any:
    """``importlib.import_module``, also searching the working directory, last, as ``python -m`` would: the ``zoo``
    console script does not put it on ``sys.path``, so ``zoo train`` run beside ``mypkg/`` would not find it."""
    import importlib

    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        here = os.getcwd()
        if err.name != name.partition(".")[0] or here in sys.path or "" in sys.path:
            raise
        sys.path.append(here)  # kept: a run's pickled net of that module must import again when it is loaded
        return importlib.import_module(name)


def describe_failure(err: BaseException) -> str:
    """An exception raised in user code, in one line: ``Type: message (at file, line n)``, the line that of the
    innermost frame in the user's own files (outside the zoo and installed packages) where there is one.

    :param err: the exception.
    :returns: the line.
    """
    import traceback
    from pathlib import Path

    zoo_dir = str(Path(__file__).resolve().parent)
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if not f.filename.startswith((zoo_dir, "<")) and "site-packages" not in f.filename]
    message = str(err).splitlines()[0][:200] if str(err) else ""
    where = f" (at {frames[-1].filename}, line {frames[-1].lineno})" if frames else ""
    return f"{type(err).__name__}{': ' if message else ''}{message}{where}"


def import_path(obj: object) -> str:
    """The ``module:qualname`` import path of a class or function (what :func:`import_target` reads back).

    :param obj: a class or function.
    :returns: its import path.
    """
    return f"{obj.__module__}:{obj.__qualname__}"
