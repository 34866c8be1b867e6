"""MkDocs hooks: the spec and CLI references are written from the code at build time, so they cannot drift.

``<!-- spec-reference -->`` in a page becomes a table per section of the run spec (:func:`zoo.spec.spec_sections`:
every field with its type, default and description); ``<!-- cli-reference -->`` becomes the help of every ``zoo``
subcommand, as the parser prints it; ``<!-- parts-reference -->`` becomes every registered part (what ``zoo list``
prints: data sets, nets, priors, families, guides, likelihoods, inference methods). A notebook's page gets a
button that downloads it; in a table, a figure keeps its error (``± 0.08``) and a name is not broken.
"""

from __future__ import annotations

import argparse
import json
import re
import types
import typing
from pathlib import Path

from pydantic_core import PydanticUndefined

from zoo.cli import build_parser
from zoo.registry import TABLES
from zoo.spec import spec_sections


def _anchor(section) -> str:
    """The id of a section's heading: the slug Markdown's toc would give it (``data-name-toy_gap``), set explicitly so
    that the type cells can link to it and links from elsewhere keep working."""
    from markdown.extensions.toc import slugify

    return slugify(f"{section.path} ({section.variant})" if section.variant else section.path or "the top level", "-")


def _type(annotation: typing.Any, sections: dict | None = None) -> str:
    """A field's type as a reader writes it, Markdown for a table cell: ``int | null``, ``list[int]``,
    ``"normal" | "laplace"`` for a Literal, a nested section by its model's name, a discriminated union of sections by
    the names that select them (``name: mlp | cnn | ...``); a section that ``sections`` (model -> its
    :class:`~zoo.spec.SectionReference`) lists is a link to its table."""
    sections = sections or {}
    link = "\0{}\1{}\2"  # a link to a section's table, written out below

    def render(tp) -> str:
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if tp is None or tp is type(None):
            return "null"
        if tp is typing.Any:
            return "Any"
        if origin is typing.Annotated:  # constraints and discriminators: the type they constrain
            return render(args[0])
        if origin is typing.Literal:
            return " | ".join(json.dumps(value) if isinstance(value, str) else repr(value) for value in args)
        if origin in (typing.Union, types.UnionType):
            members = list(dict.fromkeys(typing.get_args(a)[0] if typing.get_origin(a) is typing.Annotated else a
                                         for a in args))  # a section that serves several names is tagged once each
            variants = [sections[m].variant.split(": ", 1) for m in members
                        if m in sections and ": " in sections[m].variant]
            if len(members) > 1 and len(variants) == len(members) and len({key for key, _ in variants}) == 1:
                # a discriminated union: the names that select a variant, each linked to the variant's table
                names = [link.format(name, _anchor(sections[m]))
                         for m, (_, label) in zip(members, variants, strict=True) for name in label.split(" | ")]
                return f"{variants[0][0]}: " + " | ".join(names)
            return " | ".join([render(m) for m in members if m is not type(None)] + ["null"] * (type(None) in members))
        if origin is not None:  # list[int], dict[str, ...]
            name = getattr(origin, "__name__", None) or repr(origin).removeprefix("typing.")
            return f"{name}[{', '.join(render(a) for a in args)}]" if args else name
        if isinstance(tp, type):
            return link.format(tp.__name__, _anchor(sections[tp])) if tp in sections else tp.__name__
        return re.sub(r"\b(?:\w+\.)+(\w+)", r"\1", repr(tp).removeprefix("typing."))  # anything else, unqualified

    text = render(annotation)
    if "\0" not in text:
        return f"`{text}`"  # a code span (Markdown's tables leave the pipes inside one alone)
    text = text.replace("[", "\\[").replace("]", "\\]").replace("|", "\\|")
    return re.sub("\0(.*?)\1(.*?)\2", r"[`\1`](#\2)", text)


def _default(field) -> str:
    if field.default is PydanticUndefined:
        return "*required*" if field.default_factory is None else "*a section*"
    if field.default is None:
        return "null"
    return f"`{json.dumps(field.default) if isinstance(field.default, str) else repr(field.default)}`"  # as the types


def spec_reference() -> str:
    parts = []
    sections = spec_sections()
    by_model = {section.model: section for section in sections}
    for section in sections:
        title = f"`{section.path}`" if section.path else "The top level"
        title += f" ({section.variant})".replace("<", "&lt;") if section.variant else ""  # uci:<folder>
        parts.append(f"### {title} {{ #{_anchor(section)} }}\n")
        doc = (section.model.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        parts.append(doc + "\n")
        parts.append("| field | type | default | description |\n|---|---|---|---|")
        for name, field in section.model.model_fields.items():
            description = (field.description or "").replace("|", "\\|").replace("\n", " ")
            parts.append(f"| `{name}` | {_type(field.annotation, by_model)} | {_default(field)} | {description} |")
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


def on_page_content(html: str, **_) -> str:
    """Tables: a figure keeps its error (``-2.66 ± 0.08`` breaks before the ``±`` where the column is too narrow,
    never after it), and a first cell that is one short name in code (a spec field, a registered part) is marked
    ``zoo-name``, which docs/stylesheets/extra.css keeps from breaking inside the name."""
    html = re.sub(r"<td\b.*?</td>", lambda cell: re.sub(r"(?<=\d) ± (?=[\d.])", " ±\u00a0", cell.group(0)), html,
                  flags=re.S)
    return re.sub(r"(<tr>\s*<td[^>]*>)<code>([^<\s]{1,32})</code></td>", r'\1<code class="zoo-name">\2</code></td>',
                  html)


def _download_button(page, config) -> str:
    """A notebook page's download button, beside the title as Material's page actions are: a link to the ``.ipynb``
    that mkdocs-jupyter's ``include_source`` copies next to the page. Empty for any other page."""
    plugin = config["plugins"].get("mkdocs-jupyter")
    if not page.file.src_uri.endswith(".ipynb") or plugin is None or not plugin.config["include_source"]:
        return ""
    import material

    name = page.file.src_uri.rsplit("/", 1)[-1]
    icon = (Path(material.__file__).parent / "templates" / ".icons" / "material" / "download.svg").read_text()
    return (f'<a href="{name}" download class="md-content__button md-icon jp-DownloadNB" '
            f'title="Download the notebook ({name})">{icon}</a>')


def on_post_page(output: str, page, config, **_) -> str:
    """The docstrings' Sphinx roles (``:class:`~zoo.spec.RunSpec```) render as the plain code they name; a notebook's
    page gets its download button."""
    output = re.sub(r":(?:class|func|meth|mod|data|attr|obj):(<code>)~?", r"\1", output)
    article = '<article class="md-content__inner md-typeset">'
    return output.replace(article, article + _download_button(page, config), 1)
