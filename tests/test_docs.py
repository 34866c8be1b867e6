"""The documentation: the spec reference is generated from the code and complete, the CLI reference covers every
subcommand, the API reference's docstrings state every argument and return value, the README stays a front door,
and the site check catches what a reader's browser would see broken."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import shutil
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from zoo.cli import build_parser
from zoo.spec import RunSpec, spec_sections

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_{name}", ROOT / "docs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_field_of_every_spec_section_has_a_description():
    missing = [f"{s.path or 'top level'} ({s.variant or s.model.__name__}).{name}"
               for s in spec_sections() for name, field in s.model.model_fields.items() if not field.description]
    assert not missing, f"fields without a description (the docs' spec reference shows it): {missing}"


def test_the_sections_cover_the_run_spec_and_every_registered_method():
    sections = spec_sections()
    assert sections[0].model is RunSpec
    paths = {s.path for s in sections}
    assert {"data", "net", "prior", "model", "guide", "likelihood", "inference", "model.selection"} <= paths
    methods = " ".join(s.variant for s in sections if s.path == "inference")
    from zoo.inference import METHODS

    for method in METHODS:
        assert method in methods


def test_the_spec_reference_lists_every_field_with_its_description():
    reference = _load("hooks").spec_reference()
    for section in spec_sections():
        for name, field in section.model.model_fields.items():
            assert f"| `{name}` |" in reference
            assert field.description.split("|")[0][:40] in reference


def test_the_cli_reference_has_every_subcommand_and_the_page_markers_are_replaced():
    hooks = _load("hooks")
    reference = hooks.cli_reference()
    commands = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction").choices
    for name in commands:
        assert f"## `zoo {name}`" in reference
    page = hooks.on_page_markdown("a\n<!-- spec-reference -->\n<!-- cli-reference -->\n<!-- parts-reference -->\n")
    assert "<!--" not in page and "### `data`" in page and "## `zoo train`" in page


def test_the_parts_catalogue_lists_every_registered_name():
    from zoo.registry import TABLES

    catalogue = _load("hooks").parts_reference()
    for table in TABLES.values():
        for name in table:
            assert f"| `{name}` |" in catalogue


def test_the_readme_is_a_front_door_with_the_test_command_and_links_that_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert "make test" in text and "pip install" in text
    for target, anchor in re.findall(r"\]\(((?!https?:)[^)#]+)(?:#([^)]+))?\)", text):
        page = ROOT / target
        assert page.is_file(), f"README links to a missing file: {target}"
        if anchor:  # a heading's slug, or an explicit { #id }
            slugs = {re.sub(r"[^a-z0-9 -]", "", h.lower()).strip().replace(" ", "-")
                     for h in re.findall(r"^#+ (.*?)(?: \{ #[^}]+ \})?$", page.read_text(), re.M)}
            assert anchor in slugs | set(re.findall(r"\{ #([\w-]+) \}", page.read_text())), f"{target}#{anchor}"


def test_every_headline_figure_of_the_readme_is_on_the_uci_results_page():
    readme = (ROOT / "README.md").read_text().split("## Headline results", 1)[1]
    page = (ROOT / "docs" / "results" / "uci.md").read_text().splitlines()
    rows = [line for line in readme.splitlines() if line.startswith("| ") and "±" in line]
    assert len(rows) >= 5
    for row in rows:
        figures = row.split("|", 2)[2]  # the cells after the member's name
        assert any(line.endswith(figures) for line in page), f"not on docs/results/uci.md: {row}"


@pytest.mark.skipif(not (shutil.which("chromedriver") and shutil.which("chromium")),
                    reason="needs Debian's chromium and chromium-driver (make docs-check installs them)")
def test_the_site_check_finds_a_broken_link_a_missing_anchor_and_a_missing_image(tmp_path, capsys):
    pytest.importorskip("selenium")
    check_site = _load("check_site")
    (tmp_path / "tutorials").mkdir()
    icon = '<link rel="icon" href="data:,">'  # no favicon request (a site's theme links its own)
    (tmp_path / "index.html").write_text(icon + '<h1 id="top">x</h1><a href="tutorials/hmc_vs_vi_regression.html">'
                                         't</a><a href="gone.html">g</a><a href="index.html#nowhere">n</a>'
                                         '<img src="missing.png">')
    (tmp_path / "tutorials" / "hmc_vs_vi_regression.html").write_text(icon + '<a href="../index.html#top">back</a>')
    problems = check_site.check(tmp_path, tmp_path / "shots")
    kinds = sorted(p.split(": ", 1)[1].split(":")[0] for p in problems)
    # the missing image also logs a failed request (404) in the console
    assert kinds == ["console error", "image did not load", "link to a missing anchor", "link to a missing page"]
    assert "index.html: link to a missing page: gone.html" in problems
    assert (tmp_path / "shots" / "front_page.png").is_file() and (tmp_path / "shots" / "tutorial.png").is_file()


def test_a_notebooks_links_to_site_pages_name_the_built_page_not_its_markdown():
    # mkdocs rewrites .md links in Markdown pages; a notebook's cells are rendered as they are, so a link to another
    # page of the site must name the built .html page (make docs-check finds the broken link; this finds it sooner)
    import nbformat

    wrong = [f"{path.name}: {target}" for path in sorted((ROOT / "notebooks").glob("*.ipynb"))
             for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "markdown"
             for target in re.findall(r"\]\(([^)\s]+)\)", cell.source)
             if not re.match(r"[a-z]+://", target) and re.search(r"\.md(#|$)", target)]
    assert not wrong, "link the built page (.html) from a notebook: " + ", ".join(wrong)


# The modules whose public functions, classes and methods must state their arguments (``:param name:``) and, when
# they return something, their return value (``:returns:``) in their docstrings: the API reference renders these
# fields as tables (docs/reference/api.md, Sphinx style). Add a module here when its docstrings follow the style.
API_MODULES = [
    "zoo.bnn",
    "zoo.assemble",
    "zoo.pipeline",
    "zoo.members",
    "zoo.posterior",
    "zoo.posterior_checks",
    "zoo.diagnostics.checks",
    "zoo.diagnostics.comparison",
    "zoo.diagnostics.reference",
    "zoo.inference_data",
    "zoo.evaluate",
    "zoo.metrics",
    "zoo.report",
    "zoo.diagnostics.grow",
    "zoo.inference.metric",
    "zoo.sweep.directory",
    "zoo.sweep.space",
    "zoo.sweep.study",
    "zoo.sweep.trials",
    "zoo.sweep.workers",
    "zoo.sweep.report",
    "zoo.sweep.run",
    "zoo.shift",
    "zoo.runs",
    "zoo.parts",
    "zoo.priors",
    "zoo.priors.base",
    "zoo.priors.normal",
    "zoo.priors.laplace",
    "zoo.priors.cauchy",
    "zoo.priors.scale_mixture",
    "zoo.priors.gsm",
    "zoo.likelihoods",
    "zoo.likelihoods.base",
    "zoo.likelihoods.categorical",
    "zoo.likelihoods.gaussian",
    "zoo.models.base",
    "zoo.inference.base",
    "zoo.inference.svi",
    "zoo.inference.sgmcmc",
    "zoo.inference.loop",
    "zoo.inference.draws",
    "zoo.inference.swag",
    "zoo.inference.laplace",
    "guides.base",
    "zoo.nets.base",
    "zoo.nets.module",
    "zoo.nets.python",
    "zoo.nets.weights",
    "zoo.data.base",
    "zoo.data.given",
    "zoo.data.python",
    "zoo.curvature",
    "zoo.spec",
]
_DOCUMENTED_PARAM = re.compile(r"^\s*:param\s+\*{0,2}(\w+):", re.M)
_DOCUMENTED_FIELD = re.compile(r"^\s*:(?:param|ivar)\s+(\w+):", re.M)  # a class's constructor arguments
_DOCUMENTED_RETURN = re.compile(r"^\s*:returns?:", re.M)


def _parameters(callable_) -> list[str]:
    """The parameter names of a function or a class's own constructor, without ``self``/``cls`` (a constructor a
    class inherits from outside the project, torch's or pydantic's, is documented there)."""
    if inspect.isclass(callable_):
        init = next((c.__dict__["__init__"] for c in callable_.__mro__ if "__init__" in c.__dict__), None)
        if init is None or not getattr(init, "__module__", "").startswith(("zoo", "guides")):
            return []
    try:
        signature = inspect.signature(callable_)
    except (TypeError, ValueError):  # a class whose constructor Python cannot describe takes no arguments of its own
        return []
    return [name for name in signature.parameters if name not in ("self", "cls")]


def _returns_something(function) -> bool:
    """Whether the return annotation says the function returns a value (anything but None)."""
    try:
        annotation = typing.get_type_hints(function).get("return", inspect.Signature.empty)
    except Exception:  # noqa: BLE001 - an annotation naming a type only a type checker imports: read it as written
        annotation = inspect.signature(function).return_annotation
    return annotation not in (inspect.Signature.empty, None, type(None), "None")


def _function_problems(where: str, function) -> list[str]:
    doc = function.__doc__ or ""
    documented = set(_DOCUMENTED_PARAM.findall(doc))
    problems = [f"{where}: no ':param {name}:'" for name in _parameters(function) if name not in documented]
    if _returns_something(function) and not _DOCUMENTED_RETURN.search(doc):
        problems.append(f"{where}: no ':returns:'")
    return problems


def _api_problems(module_name: str) -> list[str]:
    """Every missing ``:param``/``:returns:`` of the public functions, classes and methods defined in a module."""
    module = importlib.import_module(module_name)
    problems = []
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module_name:
            continue  # private, or imported from elsewhere
        where = f"{module_name}.{name}"
        if inspect.isfunction(obj):
            problems += _function_problems(where, obj)
        elif inspect.isclass(obj):
            documented = set(_DOCUMENTED_FIELD.findall(obj.__doc__ or ""))
            # a typing.Protocol is never constructed; a pydantic model's constructor arguments are its fields, each
            # documented by its Field(description=...) (the spec reference renders them, a test above requires them)
            if not getattr(obj, "_is_protocol", False) and not issubclass(obj, BaseModel):
                problems += [f"{where}: no ':param {p}:' (or ':ivar {p}:')" for p in _parameters(obj)
                             if p not in documented]
            for method_name, attr in vars(obj).items():
                if method_name.startswith("_") or isinstance(attr, property) or method_name == "model_post_init":
                    continue  # private and dunder methods, properties, pydantic's hook after validation
                method = attr.__func__ if isinstance(attr, staticmethod | classmethod) else attr
                if not inspect.isfunction(method):
                    continue
                if method.__doc__ is None and inspect.getdoc(getattr(obj, method_name)):
                    continue  # the docstring is inherited from the method it overrides
                problems += _function_problems(f"{where}.{method_name}", method)
    return problems


@pytest.mark.parametrize("module_name", API_MODULES)
def test_the_api_docstrings_state_every_argument_and_the_return_value(module_name):
    problems = _api_problems(module_name)
    assert not problems, "docstrings that do not state an argument or the return value (Sphinx fields, rendered " \
                         "in the API reference):\n" + "\n".join(problems)


@pytest.mark.skipif(not (shutil.which("chromedriver") and shutil.which("chromium")),
                    reason="needs Debian's chromium and chromium-driver (make docs-check installs them)")
def test_the_site_check_finds_a_table_wider_than_its_column(tmp_path):
    pytest.importorskip("selenium")
    check_site = _load("check_site")
    (tmp_path / "tutorials").mkdir()
    icon = '<link rel="icon" href="data:,">'
    row = "<table><tr>" + "".join(f"<td>{'figure' * 8}{i}</td>" for i in range(12)) + "</tr></table>"  # ~3,500 px
    column = '<div class="md-content" style="width: 600px">{}</div>'
    (tmp_path / "index.html").write_text(icon + column.format(
        row                                                            # runs past the column
        + f'<div style="overflow-x: auto">{row}</div>'                 # scrolls in its own box: fine
        + f'<div style="overflow: hidden">{row}</div>'                 # cut off
        + f'<div style="overflow-x: auto; width: 900px">{row}</div>'   # its scroll box runs past the column
        + "<table><tr><td>narrow</td></tr></table>"))                  # fits
    (tmp_path / "tutorials" / "hmc_vs_vi_regression.html").write_text(icon + row)  # no column: the page's body
    problems = check_site.check(tmp_path, None)
    found = sorted(re.fullmatch(r"(\S+): table wider than its column: table (\d) \('figure.*'\), \d+ px in a \d+ px "
                                r"column, (.*)", p).groups() for p in problems)
    assert found == [("index.html", "1", "runs past the column"), ("index.html", "3", "is cut off (overflow: hidden)"),
                     ("index.html", "4", "its scroll box runs past the column"),
                     ("tutorials/hmc_vs_vi_regression.html", "1", "runs past the column")], problems


def test_the_spec_references_types_read_as_written_and_link_to_their_sections():
    hooks = _load("hooks")
    reference = hooks.spec_reference()
    sections = spec_sections()
    by_model = {section.model: section for section in sections}
    cells = {}
    for section in sections:
        for name, field in section.model.model_fields.items():
            cell = hooks._type(field.annotation, by_model)
            assert f"| `{name}` | {cell} |" in reference
            cells[f"{section.path or 'top level'} ({section.variant or section.model.__name__}).{name}"] = cell
    raw = {where: cell for where, cell in cells.items()
           if any(s in cell for s in ("Annotated", "Union[", "Optional[", "typing.", "<class", "NoneType", "Tag("))}
    assert not raw, f"type cells that show Python's repr, not the type: {raw}"
    assert cells["top level (RunSpec).member"] == "`str | null`"
    assert cells["data (name: mnist1d).name"] == '`"mnist1d"`'
    assert cells["data (name: digits).ood_classes"] == "`list[int]`"
    assert cells["model (family: rank1).member_likelihood"] == '`"mixture" | "average"`'
    assert cells["top level (RunSpec).net"].startswith("name: [`mlp`](#net-name-mlp) \\| [`cnn`](#net-name-cnn)")
    ids = set(re.findall(r"^###.* \{ #([\w-]+) \}$", reference, re.M))
    assert len(ids) == len(sections)
    targets = {anchor for cell in cells.values() for anchor in re.findall(r"\]\(#([\w-]+)\)", cell)}
    assert targets and targets <= ids, f"type cells linking to no section's heading: {targets - ids}"
