"""Every fenced code block of README.md and docs/ is run or checked, so a page cannot drift from the code it shows.

- **python**: a page's blocks run in page order, as one script (a block builds on the ones above it), in a fresh
  process from an empty folder that holds a ``configs`` link to the shipped configs, as a user pastes them. A call
  that takes minutes at full size is swapped for its small-size twin from :data:`SMALL` (the test fails when the
  page no longer holds the original). Blocks titled with a file path (``title="zoo/priors/student_t.py"`` on the
  extending page) are modules to add to the tree: ``test_the_extending_examples_join_the_tree_and_train`` adds
  each to a copy of the packages, registers it and trains with it.
- **yaml**: parsed; a block headed ``# configs/NAME.yaml`` must say what that file says; a run spec, or a section of
  one, is validated by :func:`zoo.spec.load_spec` (a section merged into the config its page names); a search
  space by the sweep's own reader.
- **bash**: each command is parsed by the parser of the program it calls: ``zoo`` (and every ``zoo train``'s spec
  built with its data and net, nothing fitted), the ``benchmarks/`` scripts, ``torchrun -m zoo.cli``, ``make``
  (the target exists), ``pip install`` (the extras exist), ``python -m pytest`` (the file exists).
- **text**: a diagram or a listing; nothing to run.

A block that cannot run here says so in its fence, with why: ```` ```{.bash data-norun="needs a SLURM cluster"} ````.
The count of blocks of each kind closes the test log (``tests/conftest.py``).
"""

from __future__ import annotations

import argparse
import os
import re
import runpy
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import release_check
from zoo.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LANGUAGES = ("python", "yaml", "bash", "text")
UCI = Path(os.environ.get("ZOO_DATA_DIR") or ROOT.parent / "shared" / "data" / "uci")

# Calls that take minutes at the size a page shows, and the same call at a size a test can afford: (page, the text
# on the page, its small-size twin). The page must still hold the text.
# The many-chain HMC at the small size the release check runs the README's HMC line at (.ci/check_release).
SMALL_HMC = release_check()["SMALL"]["hmc"]
SMALL = [
    ("docs/getting-started.md", 'hmc_spec = load_spec("configs/hmc_toy.yaml")',
     f'hmc_spec = load_spec("configs/hmc_toy.yaml", {SMALL_HMC!r})'),
    # 20 draws of 4 chains are no reference: compared anyway, as the refusal says how
    ("docs/getting-started.md", "zoo.compare(hmc, bnn)", "zoo.compare(hmc, bnn, allow_unconverged=True)"),
    ("docs/getting-started.md", "for _ in range(1000):", "for _ in range(20):"),
    # a reference of 4 short chains under a budget spent at once: no reference, compared anyway
    ("docs/guide/diagnostics.md", 'budget="30min", **parts)',
     'budget="1s", inference={"num_chains": 4, "warmup_steps": 20, "num_samples": 20, "max_leapfrog_steps": 32}, '
     '**parts)'),
    ("docs/guide/diagnostics.md", "epochs=500)", "epochs=40)"),
    ("docs/guide/diagnostics.md", "epochs=500,", "epochs=40,"),
    ("docs/guide/diagnostics.md", "zoo.compare(ref, mean_field, laplace)",
     "zoo.compare(ref, mean_field, laplace, allow_unconverged=True)"),
]


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its language, its fence's attributes and its text."""

    page: Path
    line: int
    language: str
    attributes: str
    text: str

    @property
    def where(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page.name
        return f"{page}:{self.line}"

    @property
    def norun(self) -> str | None:
        """Why the block must not run (its fence's ``data-norun``), or None."""
        found = re.search(r'data-norun="([^"]*)"', self.attributes)
        return found.group(1) if found else None

    @property
    def title(self) -> str | None:
        found = re.search(r'title="([^"]*)"', self.attributes)
        return found.group(1) if found else None


_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


def _blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page: ```` ```lang attrs ```` or ```` ```{.lang attrs} ````."""
    lines, blocks, i = page.read_text().splitlines(), [], 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, info = opening["fence"], opening["info"].strip()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(fence)), len(lines))
        braced = re.match(r"\{\s*\.([\w-]+)", info)  # {.bash data-norun="..."}
        language = braced[1] if braced else "" if info.startswith("{") else info.split(" ", 1)[0]
        indent = len(opening["indent"])
        text = "\n".join(line[indent:] for line in lines[i + 1:end])
        blocks.append(Block(page, i + 1, language, info, text + "\n"))
        i = end + 1
    return blocks


BLOCKS = [block for page in PAGES for block in _blocks(page)]


def _runnable(kind: str) -> list[Block]:
    """The blocks of a language that run (or are checked): all but those marked data-norun."""
    return [b for b in BLOCKS if b.language == kind and not b.norun]


def test_every_block_names_its_language_and_every_norun_says_why(record_property):
    unnamed = [b.where for b in BLOCKS if b.language not in LANGUAGES]
    assert not unnamed, f"give these blocks one of the languages {LANGUAGES} (text: a diagram or a listing): {unnamed}"
    silent = [b.where for b in BLOCKS if b.norun is not None and len(b.norun.split()) < 3]
    assert not silent, f"a data-norun fence says why the block cannot run here: {silent}"
    counts = {kind: len(_runnable(kind)) for kind in LANGUAGES}
    counts["norun"] = sum(1 for b in BLOCKS if b.norun)
    assert len(BLOCKS) >= 60
    record_property("docs_blocks", f"{len(BLOCKS)} fenced blocks in README.md and docs/: "
                    f"{counts['python']} python run, {counts['yaml']} yaml validated, {counts['bash']} bash "
                    f"checked ({len(_commands())} commands), {counts['text']} text, {counts['norun']} marked "
                    "no-run with their reason")


# ------------------------------------------------------------------------------------------------------ python


def _script(page: Path) -> str:
    """A page's untitled python blocks, in page order, with the long calls at their small size."""
    text = "\n\n".join(b.text for b in _runnable("python") if b.page == page and not b.title)
    for where, original, small in SMALL:
        if ROOT / where == page:
            assert original in text, f"{where} no longer holds {original!r}: update SMALL in {__name__}"
            text = text.replace(original, small)
    return text


def _workspace(tmp_path: Path) -> Path:
    """An empty folder, but for the shipped configs (the pages' commands and paths are written from the repository
    root)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    return tmp_path


PYTHON_PAGES = sorted({b.page for b in _runnable("python") if not b.title}, key=PAGES.index)


SLOW_PAGES = {"docs/getting-started.md": "trains the toy, then a small many-chain HMC and compares them: ~60 s"}


@pytest.mark.parametrize("page", [pytest.param(p, marks=pytest.mark.slow) if str(p.relative_to(ROOT)) in SLOW_PAGES
                                  else p for p in PYTHON_PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_a_pages_python_blocks_run_in_page_order(page, tmp_path):
    script = tmp_path / "blocks.py"
    script.write_text(_script(page))
    workspace = _workspace(tmp_path / "work")
    done = subprocess.run([sys.executable, str(script)], cwd=workspace, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, f"{page.relative_to(ROOT)}'s python blocks failed:\n{done.stderr[-4000:]}"


# ------------------------------------------------------------------------------------------------------ yaml


def _base_config(block: Block) -> Path:
    """The config a section-only block belongs to: the nearest ``configs/*.yaml`` its page names above it."""
    above = "\n".join(block.page.read_text().splitlines()[:block.line])
    named = re.findall(r"configs/([\w-]+)\.yaml", above)
    return ROOT / "configs" / f"{named[-1] if named else 'mean_field_toy'}.yaml"


@pytest.mark.parametrize("block", _runnable("yaml"), ids=lambda b: b.where)
def test_a_yaml_block_is_what_it_says(block, monkeypatch):
    from zoo.spec import RunSpec, load_spec

    monkeypatch.chdir(ROOT)
    document = yaml.safe_load(block.text)
    assert isinstance(document, dict), f"{block.where}: not a mapping"
    header = re.match(r"#\s*(configs/\S+\.yaml)", block.text)
    if header:  # a shipped file shown on the page: every key it shows holds the file's value
        shipped = yaml.safe_load((ROOT / header[1]).read_text())
        assert document == {k: shipped[k] for k in document}, f"{block.where} differs from {header[1]}"
    if header and "spaces/" in header[1]:  # a search space: read and checked against its config, as `zoo sweep`
        from zoo.spec import spec_tree
        from zoo.sweep import check_space, load_space

        check_space(load_space(document), spec_tree(ROOT / "configs" / Path(header[1]).name))
        return
    if set(document) <= set(RunSpec.model_fields):
        sections = document if {"data", "net"} <= set(document) else {
            **yaml.safe_load(_base_config(block).read_text()), **document}
        load_spec(sections)
        return
    pytest.fail(f"{block.where}: neither a run spec, a section of one nor a search space")


# ------------------------------------------------------------------------------------------------------ bash


@dataclass(frozen=True)
class Command:
    """One shell command of a bash block, split into words, variables and loops resolved."""

    block: Block
    words: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.block.where}: {' '.join(self.words)[:120]}"


def _logical_lines(text: str) -> list[str]:
    return [line for line in re.sub(r"\\\n\s*", " ", text).splitlines() if line.strip()]


def _commands(block: Block | None = None) -> list[Command]:
    """Every command of the bash blocks (or of one): comments, ``VAR=value`` and ``nice`` prefixes, ``[optional]``
    groups and ``...`` elisions dropped; ``&&`` and ``;`` separate commands; ``$VAR`` takes an earlier assignment's
    value or a ``for`` loop's first one."""
    commands = []
    for b in [block] if block else _runnable("bash"):
        variables: dict[str, str] = {}
        for line in _logical_lines(b.text):
            line = re.sub(r"\[(--[^\]]+)\]", r"\1", line)  # [--workers 2]: an optional group, written out
            lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
            lexer.whitespace_split, lexer.commenters = True, "#"
            words, pieces = list(lexer), [[]]
            for word in words:
                if word in (";", "&&", "||", "|"):
                    pieces.append([])
                else:
                    pieces[-1].append(word)
            for piece in pieces:
                loop = piece[:1] == ["for"] and "in" in piece[:3]
                if loop:  # for VAR in A B C; do ...: VAR is A
                    variables[piece[1]] = piece[3]
                    continue
                piece = [w for w in piece if w != "..."]
                if piece[:1] in (["do"], ["done"]):
                    piece = piece[1:]
                piece = [re.sub(r"\$\{?(\w+)\}?", lambda m, known=variables: known.get(m[1], m[0]), w) for w in piece]
                while piece and re.fullmatch(r"[A-Z_]+=\S*", piece[0]):
                    name, value = piece.pop(0).split("=", 1)
                    variables[name] = value
                if piece[:1] == ["nice"]:
                    piece = piece[3:] if piece[1:2] == ["-n"] else piece[1:]
                if piece:
                    commands.append(Command(b, tuple(piece)))
    return commands


def _placeholders(words: list[str]) -> list[str]:
    """``configs/<member>_uci.yaml`` -> the first shipped config that fits; any other ``<name>`` -> ``name``."""
    out = []
    for word in words:
        if "<" in word and word.startswith("configs/"):
            matches = sorted((ROOT / "configs").glob(re.sub(r"<\w+>", "*", word).removeprefix("configs/")))
            assert matches, f"no shipped config fits {word}"
            word = f"configs/{matches[0].name}"
        out.append(re.sub(r"<(\w+)>", r"\1", word))
    return out


class _Parsed(Exception):
    """Raised by the patched ``ArgumentParser.parse_args``: the command line parsed, nothing run."""

    def __init__(self, namespace: argparse.Namespace):
        self.namespace = namespace


def _parse_with_main(script: Path, argv: list[str], monkeypatch) -> argparse.Namespace:
    """A script's command line parsed by its own ``main(argv)``, which stops right after parsing."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise _Parsed(original(self, args, namespace))

    module = runpy.run_path(str(script), run_name="docs_block_check")
    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
        try:
            module["main"](argv)
        except _Parsed as parsed:
            return parsed.namespace
    raise AssertionError(f"{script.name}: main() returned without parsing its arguments")


def _check_zoo(argv: list[str]) -> None:
    """A ``zoo`` command line: parsed; a ``train``'s spec built with its data and net (nothing fitted)."""
    from zoo.pipeline import prepare
    from zoo.spec import load_spec

    args = build_parser().parse_args(argv)
    if args.command != "train" or str(args.spec).startswith("runs/"):
        return  # a run directory or a spec an earlier command of the block writes
    spec = load_spec(args.spec, [*(args.set or []), "device=cpu"])
    data_dir = args.data_dir
    if data_dir or str(spec.data.name).startswith("uci:"):
        if not UCI.is_dir():
            return  # the UCI folders are not here: parsed and validated, not built
        spec = load_spec(spec, [f"data.dir={UCI}"])
    if spec.data.name in ("cifar10", "cifar100", "svhn", "mnist", "fashion_mnist"):
        return  # the user's copy of the files: validated, not read
    prepare(spec)


def _check(command: Command, monkeypatch) -> None:
    words = _placeholders(list(command.words))
    program, argv = words[0], words[1:]
    if program == "zoo":
        _check_zoo(argv)
    elif program == "torchrun":
        assert "-m" in argv and argv[argv.index("-m") + 1] == "zoo.cli", "torchrun starts the zoo's CLI"
        _check_zoo(argv[argv.index("-m") + 2:])
    elif program in ("python", ".venv/bin/python") and argv[:2] == ["-m", "pytest"]:
        assert all((ROOT / a.split("::")[0]).exists() for a in argv[2:] if a.startswith("tests/"))
    elif program in ("python", ".venv/bin/python") and argv and argv[0].startswith("benchmarks/"):
        namespace = _parse_with_main(ROOT / argv[0], argv[1:], monkeypatch)
        specs = [v for v in vars(namespace).values() for v in (v if isinstance(v, list) else [v])
                 if isinstance(v, str | Path) and str(v).startswith("configs/")]
        assert all((ROOT / s).is_file() for s in specs), f"missing configs: {specs}"
    elif program == "make":
        makefile = (ROOT / "Makefile").read_text()
        for target in (a for a in argv if "=" not in a and not a.startswith("-")):
            assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"no make target {target}"
    elif program == "pip" and argv[:1] == ["install"]:
        from importlib.metadata import metadata

        extras = set(metadata("pyro-bnn-zoo").get_all("Provides-Extra"))
        for requirement in argv[1:]:
            wanted = re.findall(r"\[([\w,-]+)\]", requirement)
            assert all(set(w.split(",")) <= extras for w in wanted), f"{requirement}: extras are {sorted(extras)}"
    else:
        pytest.fail(f"{command.where}: no check for {program!r}; mark the block data-norun with the reason")


def _check_block(block: Block, monkeypatch) -> None:
    """Every command of a bash block checked, from the repository root (as the pages write them)."""
    monkeypatch.chdir(ROOT)
    commands = _commands(block)
    assert commands, f"{block.where}: a bash block without a command"
    for command in commands:
        try:
            _check(command, monkeypatch)
        except SystemExit as exit_:  # argparse refusing the line
            pytest.fail(f"{command.where}: the command line is refused (exit {exit_.code})")


@pytest.mark.parametrize("block", _runnable("bash"), ids=lambda b: b.where)
def test_every_command_of_a_bash_block_parses_and_builds(block, monkeypatch):
    _check_block(block, monkeypatch)


@pytest.mark.parametrize("line, wrong", [
    ("zoo train configs/mean_field_toy.yaml --epochs-typo 3", "refused (exit 2)"),
    ("zoo train configs/no_such_config.yaml --out runs/x", "no_such_config"),
    ("zoo train configs/mean_field_toy.yaml --set inference.lr=-1", "inference.lr"),
    ("OMP_NUM_THREADS=1 python benchmarks/uci.py --no-such-option", "refused (exit 2)"),
    ("make no-such-target", "no make target"),
    ("pip install -e '.[no_such_extra]'", "extras are"),
    ("curl https://example.org", "no check for 'curl'"),
])
def test_the_checks_refuse_a_wrong_command(line, wrong, tmp_path, monkeypatch):
    """The bash check is a check: a command line its program refuses, a spec that does not build, a make target or
    an extra that does not exist, a program it does not know, each fails it."""
    page = tmp_path / "page.md"
    page.write_text(f"```bash\n{line}\n```\n")
    with pytest.raises((pytest.fail.Exception, Exception)) as failure:
        _check_block(_blocks(page)[0], monkeypatch)
    assert wrong in str(failure.value)


# ------------------------------------------------------------------------------------------------------ extending


def _after(block: Block) -> str:
    """The page's prose after a block, up to the next heading."""
    rest = "\n".join(block.page.read_text().splitlines()[block.line:])
    rest = rest.split("\n```\n", 1)[1]
    return rest.split("\n#", 1)[0]


def _register(tree: Path, block: Block) -> list[str]:
    """Write a titled block into the copied tree and register it as its page says; the ``--set`` it trains with."""
    prose = _after(block)
    where, entry = re.search(r"Registered in `([\w/.]+)`.*?`(\w+(?:\(\))?)`\s+added\s+to", prose, re.S).groups()
    (tree / block.title).write_text(block.text)
    module = block.title.removesuffix(".py").replace("/", ".")
    catalogue = tree / where
    source = catalogue.read_text()
    listing = re.search(r'(= Catalogue\("\w+", |= MethodCatalogue\()', source)
    assert listing, f"{where}: no catalogue to add {entry} to"
    source = (source[:listing.end()] + f"{entry}, " + source[listing.end():])
    line_start = source.rfind("\n", 0, listing.start()) + 1
    while source[line_start] in " )":  # back to the line the statement starts on
        line_start = source.rfind("\n", 0, line_start - 1) + 1
    source = source[:line_start] + f"from {module} import {entry.removesuffix('()')}\n" + source[line_start:]
    catalogue.write_text(source)
    return re.findall(r"--set '([^']+)'", prose.replace("\n", " "))[:1]


@pytest.mark.slow  # five modules added to a copy of the tree, each trained by `zoo train` at small size (~90 s)
def test_the_extending_examples_join_the_tree_and_train(tmp_path):
    """Each titled block of the extending page goes into a copy of the packages with the import and catalogue entry
    its page names, and `zoo train` trains with the ``--set`` the page gives (toy config, 100 SVI steps)."""
    import shutil

    titled = [b for b in _runnable("python") if b.title]
    assert len(titled) >= 5
    tree = tmp_path / "tree"
    for package in ("zoo", "guides"):
        shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__"))
    sets = {block.title: _register(tree, block) for block in titled}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tree)}
    for block in titled:
        assert sets[block.title], f"{block.where}: the page gives no --set to train with the new part"
        small = [] if sets[block.title][0].startswith("inference:=") else ["--set", "inference.num_steps=100"]
        out = tmp_path / "runs" / Path(block.title).stem
        argv = [sys.executable, "-m", "zoo.cli", "train", str(ROOT / "configs" / "mean_field_toy.yaml"), "--out",
                str(out), "--no-progress", "--set", sets[block.title][0], *small]
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{block.title} with --set {sets[block.title][0]!r}:\n{done.stderr[-3000:]}"
        assert (out / "metrics.json").is_file()
