"""The release (issue 52): the shipped configs are package data that ``zoo`` finds from any folder, by path
(``configs/<name>.yaml``) or name, a file on disk winning; a name that is neither is refused with the close shipped
names; the wheel holds the configs and every module, the sdist the configs and the project's documents.

The whole release (``python -m build``, a fresh venv, the README's quick start from outside the repository) is
``make test-release`` (``.ci/check_release``), minutes long; here the wheel and the sdist are built in-process
without isolation (a few seconds).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.conftest import release_check
from zoo.cli import main
from zoo.errors import ZooInputError
from zoo.spec import LIST_CONFIGS, find_config, load_spec, shipped_configs, shipped_configs_dir, spec_tree

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
TOY = CONFIGS / "mean_field_toy.yaml"


@pytest.fixture
def elsewhere(tmp_path, monkeypatch) -> Path:
    """An empty working directory with no configs/ folder."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_shipped_configs_are_the_repository_configs_folder():
    assert Path(str(shipped_configs_dir())).resolve() == CONFIGS.resolve()  # a source checkout, an editable install
    names = shipped_configs()
    assert list(names) == sorted(p.stem for p in CONFIGS.glob("*.yaml"))  # the specs; configs/spaces/ left out
    assert names["mean_field_toy"].read_text(encoding="utf-8") == TOY.read_text(encoding="utf-8")


@pytest.mark.parametrize("source", ["configs/mean_field_toy.yaml", "mean_field_toy.yaml", "mean_field_toy",
                                    Path("configs/mean_field_toy.yaml"), "./configs/mean_field_toy.yaml"])
def test_a_shipped_config_is_found_from_any_folder(source, elsewhere):
    found = find_config(source)
    assert found is not None and Path(str(found)).resolve() == TOY.resolve()
    assert spec_tree(source) == yaml.safe_load(TOY.read_text(encoding="utf-8"))
    assert load_spec(source, "inference.num_steps=7").inference.num_steps == 7


def test_a_search_space_is_found_under_configs_spaces(elsewhere):
    found = find_config("configs/spaces/map_uci.yaml")
    assert found is not None and Path(str(found)).resolve() == (CONFIGS / "spaces" / "map_uci.yaml").resolve()


@pytest.mark.parametrize("source", ["configs/mean_field_toy.yaml", "mean_field_toy.yaml"])
def test_a_file_on_disk_wins_over_the_shipped_config(source, elsewhere):
    mine = elsewhere / source
    mine.parent.mkdir(parents=True, exist_ok=True)
    mine.write_text(TOY.read_text(encoding="utf-8").replace("seed: 0", "seed: 7"))
    assert find_config(source) == Path(source)
    assert load_spec(source).seed == 7


def test_a_misspelt_name_is_refused_with_the_close_shipped_names(elsewhere):
    with pytest.raises(ZooInputError) as info:
        load_spec("configs/mean_feild_toy.yaml")
    message = str(info.value)
    assert info.value.field == "spec" and "configs/mean_feild_toy.yaml" in message
    assert "no such file" in message and "closest: mean_field_toy" in message and LIST_CONFIGS in message
    with pytest.raises(ZooInputError, match="closest: hmc_digits, hmc_toy, hmc_uci"):
        load_spec("hmc")


def test_a_name_close_to_none_says_how_to_see_them_all(elsewhere):
    with pytest.raises(ZooInputError) as info:
        load_spec("qqqq")
    assert "no such file, nor a shipped config named 'qqqq'" in str(info.value)
    assert "closest" not in str(info.value) and LIST_CONFIGS in str(info.value)


@pytest.mark.parametrize("source", ["runs/toy/spec.yaml", "../configs/mean_field_toy.yaml", "~/mean_field_toy.yaml",
                                    "configs", ""])
def test_other_missing_paths_are_not_looked_up(source, elsewhere):
    (elsewhere / "configs").mkdir()  # a folder, not a spec: never a shipped config's name
    assert find_config(source) is None
    with pytest.raises(ZooInputError, match="no such file; pass the path of a YAML spec") as info:
        load_spec(source)
    assert "closest" not in str(info.value)


def test_an_absolute_missing_path_is_not_looked_up(tmp_path):
    assert find_config(tmp_path / "mean_field_toy.yaml") is None


def test_zoo_list_configs_prints_every_shipped_config(capsys):
    assert main(["list", "configs"]) == 0
    out = capsys.readouterr().out
    assert "configs (shipped specs" in out and "members (member: NAME)" not in out
    for name in shipped_configs():
        assert name in out, name


def test_zoo_train_runs_a_shipped_config_from_another_folder(elsewhere, capsys):
    code = main(["train", "configs/mean_field_toy.yaml", "--out", "run", "--no-progress",
                 "--set", "inference.num_steps=5", "--set", "inference.predictive_samples=10"])
    assert code == 0, capsys.readouterr().err
    assert (elsewhere / "run" / "metrics.json").is_file()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["run"]


def test_zoo_train_refuses_a_misspelt_config_naming_the_close_one(elsewhere, capsys):
    assert main(["train", "mean_feild_toy", "--out", "run"]) == 2
    err = capsys.readouterr().err
    assert "mean_field_toy" in err and LIST_CONFIGS in err and "Traceback" not in err
    assert not (elsewhere / "run").exists()


def test_the_wheel_ships_the_configs_and_every_module_and_the_sdist_the_documents(tmp_path):
    """Built from a copy of what the release takes (no build isolation: the venv's setuptools), a few seconds."""
    src, dist = tmp_path / "src", tmp_path / "dist"
    dist.mkdir()
    for top in ("zoo", "guides", "configs"):
        shutil.copytree(ROOT / top, src / top, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "MANIFEST.in", "README.md", "LICENSE", "CHANGELOG.md", "CITATION.cff"):
        shutil.copy2(ROOT / name, src / name)
    built = subprocess.run([sys.executable, "-c", f"from setuptools import build_meta as b; out = {str(dist)!r}; "
                            "b.build_sdist(out); b.build_wheel(out)"], cwd=src, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,), (sdist,) = dist.glob("*.whl"), dist.glob("*.tar.gz")
    check = release_check()  # the contents check of make test-release, on this build
    check["check_contents"](src, wheel, sdist, wheel.name.split("-")[1])


@pytest.mark.parametrize("contents, problem", [
    ({"drop": "zoo/configs/mean_field_toy.yaml"}, "the wheel lacks"),
    ({"drop": "zoo/nets/mlp.py"}, "the wheel lacks"),
    ({"add": "stray/__init__.py"}, "top-level names besides"),
])
def test_the_contents_check_refuses_a_wheel_that_lacks_a_file_or_adds_a_name(contents, problem, tmp_path):
    """The check is a check: a wheel without a config or a module, or with another top-level package, fails it."""
    check = release_check()
    src = tmp_path / "src"
    shutil.copytree(CONFIGS, src / "configs")
    for top in ("zoo", "guides"):
        shutil.copytree(ROOT / top, src / top, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    names = [f"zoo/configs/{p.relative_to(CONFIGS).as_posix()}" for p in CONFIGS.rglob("*.yaml")]
    names += [p.relative_to(src).as_posix() for top in ("zoo", "guides") for p in (src / top).rglob("*.py")]
    names = [n for n in names if n != contents.get("drop")] + ([contents["add"]] if "add" in contents else [])
    wheel = tmp_path / "pyro_bnn_zoo-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in names:
            archive.writestr(name, "")
    sdist = tmp_path / "pyro_bnn_zoo-0.0.0.tar.gz"
    with tarfile.open(sdist, "w:gz"):
        pass
    with pytest.raises(check["Failed"], match=problem):
        check["check_contents"](src, wheel, sdist, "0.0.0")
