"""MkDocs hooks: the spec and CLI references are written from the code at build time, so they cannot drift.

``<!-- spec-reference -->`` in a page becomes a table per section of the run spec (:func:`zoo.spec.spec_sections`:
every field with its type, default and description); ``<!-- cli-reference -->`` becomes the help of every ``zoo``
subcommand, as the parser prints it; ``<!-- parts-reference -->`` becomes every registered part (what ``zoo list``
prints: data sets, nets, priors, families, guides, likelihoods, inference methods).
"""

from __future__ import annotations

import argparse
import re
import typing

from pydantic_core import PydanticUndefined

from zoo.cli import build_parser
from zoo.registry import TABLES
from zoo.spec import spec_sections


def _type(annotation: typing.Any) -> str:
    text = re.sub(r"typing\.|pydantic\.types\.|annotated_types\.|<class '|'>", "", repr(annotation))
    text = re.sub(r"Annotated\[(\w+), [^\]]*\]", r"\1", text)
    text = re.sub(r"Literal\[([^\]]*)\]", lambda m: " | ".join(v.strip() for v in m.group(1).split(",")), text)
    text = re.sub(r"\b(?:\w+\.)+(\w+)", r"\1", text)  # zoo.sections.DataSpec -> DataSpec
    return text.replace("NoneType", "null").replace("|", "\\|")


def _default(field) -> str:
    if field.default is PydanticUndefined:
        return "*required*" if field.default_factory is None else "*a section*"
    return "null" if field.default is None else f"`{field.default!r}`"


def spec_reference() -> str:
    parts = []
    for section in spec_sections():
        title = f"`{section.path}`" if section.path else "The top level"
        parts.append(f"### {title}" + (f" ({section.variant})" if section.variant else "") + "\n")
        doc = (section.model.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        parts.append(doc + "\n")
        parts.append("| field | type | default | description |\n|---|---|---|---|")
        for name, field in section.model.model_fields.items():
            description = (field.description or "").replace("|", "\\|").replace("\n", " ")
            parts.append(f"| `{name}` | {_type(field.annotation)} | {_default(field)} | {description} |")
        parts.append("")
    return "\n".join(parts)


def cli_reference() -> str:
    parser = build_parser()
    parts = ["```text\n" + parser.format_help() + "```\n"]
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        parts.append(f"## `zoo {name}`\n\n```text\n{sub.format_help()}```\n")
    return "\n".join(parts)


def parts_reference() -> str:
    parts = []
    for title, table in TABLES.items():
        parts.append(f"## {title[0].upper()}{title[1:]}\n\n| name | what it is |\n|---|---|")
        parts += ["| `" + name + "` | " + what.replace("|", "\\|") + " |" for name, what in table.items()]
        parts.append("")
    return "\n".join(parts)


REFERENCES = {"<!-- spec-reference -->": spec_reference, "<!-- cli-reference -->": cli_reference,
              "<!-- parts-reference -->": parts_reference}


def on_config(config, **_):
    """The site's name carries the installed version (``zoo --version``'s)."""
    from zoo import __version__

    config["site_name"] = f"pyro-bnn-zoo {__version__}"
    return config


def on_page_markdown(markdown: str, **_) -> str:
    for marker, write in REFERENCES.items():
        if marker in markdown:
            markdown = markdown.replace(marker, write())
    return markdown


def on_post_page(output: str, **_) -> str:
    """The docstrings' Sphinx roles (``:class:`~zoo.spec.RunSpec```) render as the plain code they name."""
    return re.sub(r":(?:class|func|meth|mod|data|attr|obj):(<code>)~?", r"\1", output)
