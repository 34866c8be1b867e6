"""The ``zoo`` command: exit codes, one-paragraph error messages without tracebacks, list/train/eval/prune."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from tests.conftest import interrupt_at
from zoo import registry
from zoo.cli import main
from zoo.runs import CHECKPOINT_FILE, SPEC_FILE

TINY = {
    "data": {"name": "toy_gap"},
    "net": {"hidden": [4]},
    "inference": {"num_steps": 5, "batch_size": 32, "predictive_samples": 3},
    "device": "cpu",
}


def write_spec(path, tree=None, **sections):
    spec = {**(tree or TINY), **sections}
    path.write_text(yaml.safe_dump(spec))
    return path


def uci_folder(root, name="tiny", n_rows=30, n_splits=1):
    """A UCI folder in the standard format: data.txt, feature/target indices, one train/test split."""
    folder = root / name
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n_rows, 2))
    y = x @ np.array([1.5, -0.5]) + 0.1 * rng.normal(size=n_rows)
    np.savetxt(folder / "data.txt", np.column_stack([x, y]))
    (folder / "index_features.txt").write_text("0\n1\n")
    (folder / "index_target.txt").write_text("2\n")
    for split in range(n_splits):
        (folder / f"index_train_{split}.txt").write_text("\n".join(str(i) for i in range(24)) + "\n")
        (folder / f"index_test_{split}.txt").write_text("\n".join(str(i) for i in range(24, n_rows)) + "\n")
    (folder / "n_splits.txt").write_text(f"{n_splits}\n")
    return folder


def assert_input_error(capsys, argv, *fragments):
    """Exit code 2, a single ``error:`` paragraph on stderr naming ``fragments``, and no traceback."""
    code = main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2, captured
    assert err.startswith("error: "), err
    assert "Traceback" not in captured.err and "Traceback" not in captured.out
    assert "\n\n" not in err  # one paragraph
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


@pytest.fixture(autouse=True)
def no_data_dir_env(monkeypatch):
    monkeypatch.delenv("ZOO_DATA_DIR", raising=False)


# ----------------------------------------------------------------------------------------- input errors
def test_missing_spec_file(tmp_path, capsys):
    missing = tmp_path / "nope.yaml"
    assert_input_error(capsys, ["train", str(missing), "--out", str(tmp_path / "run")], "spec", str(missing),
                       "no such file")
    assert not (tmp_path / "run").exists()


def test_unknown_dataset_name(tmp_path, capsys):
    spec = write_spec(tmp_path / "spec.yaml", data={"name": "imagenet"})
    assert_input_error(capsys, ["train", str(spec), "--out", str(tmp_path / "run")], "data.name", "imagenet",
                       "toy_gap")


def test_invalid_spec_field(tmp_path, capsys):
    spec = write_spec(tmp_path / "spec.yaml", net={"hidden": [4], "activation": "swish"})
    assert_input_error(capsys, ["train", str(spec), "--out", str(tmp_path / "run")], "net.activation", "swish")


@pytest.mark.parametrize(("override", "fragment"), [
    ("data.split", "--set"),
    ("=3", "--set"),
    ("net.hidden=[-2]", "net.hidden"),
    ("prior.sites={'hiden*': {name: normal}}", "matches no weight site"),
])
def test_bad_set(tmp_path, capsys, override, fragment):
    spec = write_spec(tmp_path / "spec.yaml")
    assert_input_error(capsys, ["train", str(spec), "--out", str(tmp_path / "run"), "--set", override], fragment)


@pytest.mark.parametrize("fractions", ["abc", "0.5,x", "0.5;0.7"])
def test_bad_fractions(tmp_path, capsys, fractions):
    assert_input_error(capsys, ["prune", str(tmp_path), "--fractions", fractions], "--fractions", fractions)


def test_prune_fraction_out_of_range(toy_run, capsys):
    assert_input_error(capsys, ["prune", str(toy_run.run_dir), "--fractions", "0.5,1.2"], "--fractions", "[0, 1)")


def test_uci_split_out_of_range(tmp_path, capsys):
    uci_folder(tmp_path / "data")
    spec = write_spec(tmp_path / "spec.yaml", data={"name": "uci:tiny"})
    assert_input_error(capsys, ["train", str(spec), "--out", str(tmp_path / "run"), "--data-dir",
                                str(tmp_path / "data"), "--set", "data.split=1"], "data.split", "1 splits", "0..0")


def test_uci_without_data_dir(tmp_path, capsys):
    spec = write_spec(tmp_path / "spec.yaml", data={"name": "uci:tiny"})
    assert_input_error(capsys, ["train", str(spec), "--out", str(tmp_path / "run")], "--data-dir", "ZOO_DATA_DIR")


def test_uci_unknown_folder_lists_the_folders(tmp_path, capsys):
    uci_folder(tmp_path / "data")
    spec = write_spec(tmp_path / "spec.yaml", data={"name": "uci:housing"})
    assert_input_error(capsys, ["train", str(spec), "--out", str(tmp_path / "run"), "--data-dir",
                                str(tmp_path / "data")], "uci:housing", "tiny")


def test_guide_that_does_not_fit_the_family(tmp_path, capsys):
    spec = write_spec(tmp_path / "spec.yaml", guide={"name": "full_rank"})  # needs one vector of weights
    assert_input_error(capsys, ["train", str(spec), "--out", str(tmp_path / "run")], "guide.name", "full_rank",
                       "all_weights", "one vector of weights")


def test_likelihood_that_does_not_fit_the_task(tmp_path, capsys):
    spec = write_spec(tmp_path / "spec.yaml", likelihood={"name": "categorical"})
    assert_input_error(capsys, ["train", str(spec), "--out", str(tmp_path / "run")], "likelihood.name",
                       "categorical", "regression")
    spec = write_spec(tmp_path / "moons.yaml", data={"name": "two_moons"}, likelihood={"name": "gaussian"})
    assert_input_error(capsys, ["train", str(spec), "--out", str(tmp_path / "run2")], "likelihood.name",
                       "classification")


def test_eval_of_a_non_run_directory(tmp_path, capsys):
    assert_input_error(capsys, ["eval", str(tmp_path)], "not a run directory")


def test_existing_run_without_resume(toy_run, tmp_path, capsys):
    spec = write_spec(tmp_path / "spec.yaml")
    assert_input_error(capsys, ["train", str(spec), "--out", str(toy_run.run_dir)], "--out", "--resume")


def test_resume_without_checkpoint(tmp_path, capsys):
    spec = write_spec(tmp_path / "spec.yaml")
    assert_input_error(capsys, ["train", str(spec), "--out", str(tmp_path / "run"), "--resume"], "--resume",
                       "checkpoint")


# ----------------------------------------------------------------------------------- other exit codes
def test_diverged_training_exits_1(tmp_path, capsys):
    spec = write_spec(tmp_path / "spec.yaml", inference={"num_steps": 50, "batch_size": None, "lr": 1e30},
                      likelihood={"noise": 0.1})
    code = main(["train", str(spec), "--out", str(tmp_path / "run"), "--no-progress"])
    captured = capsys.readouterr()
    assert code == 1
    assert captured.err.startswith("training stopped: ELBO is not finite at step")
    assert "Traceback" not in captured.err


def test_ctrl_c_exits_130_and_keeps_a_checkpoint(tmp_path, capsys, monkeypatch):
    interrupt_at(monkeypatch, 3)
    spec = write_spec(tmp_path / "spec.yaml")
    code = main(["train", str(spec), "--out", str(tmp_path / "run"), "--no-progress"])
    captured = capsys.readouterr()
    assert code == 130 and "--resume" in captured.err and "Traceback" not in captured.err
    assert (tmp_path / "run" / CHECKPOINT_FILE).is_file()
    monkeypatch.undo()
    assert main(["train", str(spec), "--out", str(tmp_path / "run"), "--no-progress", "--resume"]) == 0
    assert "resumed from" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------- commands
def test_list_prints_every_registered_name(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for title, table in registry.TABLES.items():
        assert title in out
        for name in table:
            assert name in out, (title, name)
    for name in ("toy_gap", "digits", "uci:<folder>", "mlp", "relu", "scale_mixture", "cauchy", "laplace",
                 "mean_field", "delta", "categorical", "gaussian", "trace_mean_field", "svi"):
        assert name in out


def test_list_descriptions_are_whole_sentences():
    """A docstring's first line is often cut mid-sentence by wrapping: zoo list takes the first sentence."""
    assert registry.summary_of("First part of a\n    wrapped sentence (e.g. this). Second one.") == \
        "First part of a wrapped sentence (e.g. this)."
    for title, table in registry.TABLES.items():
        for name, text in table.items():
            assert text.count("(") == text.count(")"), (title, name, text)
            assert not text.rstrip().endswith((",", ";", ":", " and", " or", " of", " the")), (title, name, text)
            assert "``" not in text, (title, name, text)


def test_train_prints_run_directory_and_plot(tmp_path, capsys):
    spec = write_spec(tmp_path / "spec.yaml")
    out_dir = tmp_path / ("a_long_run_directory_name_" + "x" * 60) / "[run]"
    assert main(["train", str(spec), "--out", str(out_dir), "--no-progress"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert f"run directory: {out_dir}" in lines
    assert f"plot: {out_dir / 'uncertainty.png'}" in lines
    for name in ("rmse", "test_ll", "train_seconds"):
        assert name in out
    assert (out_dir / "uncertainty.png").is_file()
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert set(metrics) == {"rmse", "test_ll", "train_seconds"}


def test_data_dir_is_honoured(tmp_path, capsys):
    data_dir = tmp_path / "data"
    uci_folder(data_dir)
    spec = write_spec(tmp_path / "spec.yaml", data={"name": "uci:tiny"})
    out_dir = tmp_path / "run"
    assert main(["train", str(spec), "--out", str(out_dir), "--data-dir", str(data_dir), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "uci:tiny: 24 train / 6 test, 2 inputs -> 1 outputs" in out
    saved = yaml.safe_load((out_dir / SPEC_FILE).read_text())
    assert saved["data"]["dir"] == str(data_dir)
    # 2-D inputs: no uncertainty band is drawn, and no plot line is printed
    assert not (out_dir / "uncertainty.png").exists() and "plot:" not in out


def test_data_dir_env_var_is_the_fallback(tmp_path, capsys, monkeypatch):
    data_dir = tmp_path / "data"
    uci_folder(data_dir)
    monkeypatch.setenv("ZOO_DATA_DIR", str(data_dir))
    spec = write_spec(tmp_path / "spec.yaml", data={"name": "uci:tiny"})
    assert main(["train", str(spec), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    # --data-dir wins over the environment
    assert_input_error(capsys, ["train", str(spec), "--out", str(tmp_path / "run2"), "--data-dir",
                                str(tmp_path / "missing")], "data.dir", "missing")


def test_eval_reprints_the_metrics(toy_run, capsys):
    assert main(["eval", str(toy_run.run_dir), "--samples", "20"]) == 0
    out = capsys.readouterr().out
    assert "rmse" in out and "test_ll" in out
    assert f"{toy_run.metrics['rmse']:.4f}" in out  # same draws (same seed, same count): same numbers


def test_prune_writes_a_table_per_fraction(toy_run, capsys):
    assert main(["prune", str(toy_run.run_dir), "--fractions", "0.2,0.6"]) == 0
    out = capsys.readouterr().out
    rows = json.loads((toy_run.run_dir / "prune.json").read_text())
    assert [r["fraction"] for r in rows] == [0.0, 0.2, 0.6]
    assert all({"rmse", "test_ll"} <= set(r) for r in rows)
    assert rows[0]["rmse"] == toy_run.metrics["rmse"]  # fraction 0 is the unpruned posterior
    assert (toy_run.run_dir / "pruning.png").is_file()
    assert f"written: {toy_run.run_dir / 'prune.json'}" in out


def test_version_is_the_package_version(capsys):
    import re
    from pathlib import Path

    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    declared = re.search(r'^version = "([^"]+)"$', pyproject, re.MULTILINE).group(1)
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"pyro-bnn-zoo {declared}"


@pytest.mark.parametrize("text, first", [
    ("One thing. Another.", "One thing."),
    ("The rank-1 family, i.e. K = 4 members. No KL.", "The rank-1 family, i.e. K = 4 members."),
    ("BatchEnsemble (Wen et al. 2020) on digits. Held out: 8, 9.", "BatchEnsemble (Wen et al. 2020) on digits."),
    ("A prior, e.g. Normal (cf. Cauchy). More.", "A prior, e.g. Normal (cf. Cauchy)."),
    ("A paragraph with no end\nwrapped", "A paragraph with no end wrapped"),
])
def test_zoo_lists_a_part_by_its_first_sentence_not_cut_at_an_abbreviation(text, first):
    from zoo.parts import first_sentence

    assert first_sentence(text) == first
