"""No import loops in the zoo's packages, a package's ``__init__`` included: a module that imports another which
(directly or through others) imports it back. The layers contract of ``lint-imports`` forbids upward imports
between layers; a loop inside a layer (e.g. a data set module importing its own package, whose ``__init__`` imports
it) is what this adds."""

from __future__ import annotations

import sys

import grimp


def import_loops(*packages: str) -> list[tuple[str, ...]]:
    """Every import that closes a loop, as the loop's chain of modules (the importer first).

    :param packages: the top-level packages to read.
    :returns: one chain per loop found, each loop once.
    """
    graph = grimp.build_graph(*packages, cache_dir=None)
    loops: dict[frozenset, tuple[str, ...]] = {}
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back:
                loops.setdefault(frozenset(back), (module, *back))
    return list(loops.values())


def test_the_zoo_has_no_import_loop():
    assert import_loops("zoo", "guides") == []


def test_a_loop_through_a_package_init_is_found(tmp_path, monkeypatch):
    """The check itself: a package whose ``__init__`` imports a module that imports the package back."""
    package = tmp_path / "loopy"
    package.mkdir()
    (package / "__init__.py").write_text("from loopy import parts\n")
    (package / "parts.py").write_text("import loopy\n")
    (package / "clean.py").write_text("import json\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert import_loops("loopy") == [("loopy", "loopy.parts", "loopy")]
    finally:
        sys.modules.pop("loopy", None)
