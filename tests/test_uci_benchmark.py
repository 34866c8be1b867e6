"""benchmarks/uci.py: split parsing, the printed table and the JSON, on a tiny UCI folder and on the real data."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import load_benchmark
from zoo.errors import ZooInputError
from zoo.metrics import mean_and_standard_error
from zoo.spec import load_spec
from zoo.sweep import load_space

REPO = Path(__file__).resolve().parents[1]
SHARED_UCI = REPO.parent / "shared" / "data" / "uci"
CONFIG = REPO / "configs" / "mean_field_uci.yaml"


uci = load_benchmark("uci")

TINY_SETS = ["--set", "inference.num_steps=3", "--set", "inference.predictive_samples=4"]


def write_folder(root: Path, name: str, n_rows: int = 24, n_splits: int = 2, n_hidden: int = 3) -> Path:
    """A UCI folder in the standard format: 3 inputs, a linear target, ``n_splits`` 75/25 splits."""
    rng = np.random.default_rng(0)
    data = rng.normal(size=(n_rows, 4))
    data[:, 3] = 5 + 2 * data[:, 0] - data[:, 2] + 0.1 * rng.normal(size=n_rows)
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "data.txt").write_text("\n".join(" ".join(f"{v:.6f}" for v in row) for row in data) + "\n")
    (folder / "index_features.txt").write_text("0\n1\n2\n")
    (folder / "index_target.txt").write_text("3\n")
    (folder / "n_splits.txt").write_text(f"{n_splits}\n")
    (folder / "n_hidden.txt").write_text(f"{n_hidden}\n")
    for i in range(n_splits):
        perm = rng.permutation(n_rows)
        cut = n_rows * 3 // 4
        (folder / f"index_train_{i}.txt").write_text("\n".join(map(str, perm[:cut])) + "\n")
        (folder / f"index_test_{i}.txt").write_text("\n".join(map(str, perm[cut:])) + "\n")
    return folder


@pytest.mark.parametrize("text, expected", [("0-19", list(range(20))), ("0,3,5", [0, 3, 5]), ("3", [3]),
                                            ("0-2,7", [0, 1, 2, 7]), ("5,1,1", [1, 5])])
def test_parse_splits(text, expected):
    assert uci.parse_splits(text) == expected


@pytest.mark.parametrize("text", ["", "a", "3-1", "1-", "-2"])
def test_parse_splits_refuses(text):
    with pytest.raises(ZooInputError, match="--splits"):
        uci.parse_splits(text)


def test_mean_se():
    mean, se = mean_and_standard_error([1.0, 3.0])
    assert mean == 2.0 and se == pytest.approx(1.0 / math.sqrt(2))
    assert mean_and_standard_error([4.0]) == (4.0, 0.0)


def test_published_table_is_complete():
    for dataset in ("bostonHousing", "concrete", "energy", "kin8nm", "power-plant", "wine-quality-red"):
        assert set(uci.PUBLISHED[dataset]) == {"pbp", "dropout", "ensembles"}
        for figs in uci.PUBLISHED[dataset].values():
            assert set(figs) == {"rmse", "test_ll"}
    assert uci.PUBLISHED["bostonHousing"]["pbp"] == {"rmse": (3.01, 0.18), "test_ll": (-2.57, 0.09)}


def test_tiny_folder_table_and_json(tmp_path, capsys, monkeypatch):
    root = tmp_path / "uci"
    write_folder(root, "bostonHousing")  # a synthetic stand-in under the real name: the published rows show
    write_folder(root, "tiny", n_hidden=2)
    out_json = tmp_path / "res" / "out.json"
    monkeypatch.chdir(tmp_path)  # nothing may be written into the working directory
    code = uci.main(["--spec", str(CONFIG), "--datasets", "bostonHousing,tiny", "--splits", "0-1",
                     "--data-dir", str(root), "--json", str(out_json), *TINY_SETS])
    assert code == 0
    printed = capsys.readouterr().out
    for text in ("bostonHousing", "tiny", "this spec (n=2)", "PBP (2015)", "MC dropout (2016)",
                 "deep ensembles (2017)", "3.01 ± 0.18", "-2.46 ± 0.06", "s/split", "RMSE", "test LL"):
        assert text in printed, text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res", "uci"], "no run directories left behind"

    result = json.loads(out_json.read_text())
    assert result["evaluated_on"] == "test" and set(result["datasets"]) == {"bostonHousing", "tiny"}
    for name, n_hidden in (("bostonHousing", 3), ("tiny", 2)):
        block = result["datasets"][name]
        for key in ("rmse_mean", "rmse_se", "test_ll_mean", "test_ll_se", "rmse", "test_ll", "seconds",
                    "published", "n_hidden", "splits"):
            assert key in block, key
        assert block["splits"] == [0, 1] and block["n_hidden"] == n_hidden
        assert len(block["rmse"]) == len(block["test_ll"]) == len(block["seconds"]) == 2
        assert all(math.isfinite(v) for v in [*block["rmse"], *block["test_ll"], *block["seconds"]])
        assert block["rmse_mean"] == pytest.approx(sum(block["rmse"]) / 2)
        assert block["rmse_se"] == pytest.approx(abs(block["rmse"][0] - block["rmse"][1]) / 2 / math.sqrt(2))
    assert result["datasets"]["bostonHousing"]["published"]["pbp"]["rmse"] == [3.01, 0.18]
    assert result["datasets"]["tiny"]["published"] == {}


def test_mcmc_rows_say_how_many_splits_pass_strict(tmp_path, capsys, monkeypatch):
    root = tmp_path / "uci"
    write_folder(root, "tiny", n_hidden=2)
    out_json = tmp_path / "out.json"
    monkeypatch.setenv("COLUMNS", "300")
    code = uci.main(["--spec", str(REPO / "configs" / "hmc_uci.yaml"), "--datasets", "tiny", "--splits", "0-1",
                     "--data-dir", str(root), "--json", str(out_json), "--set", "inference.num_chains=2",
                     "--set", "inference.warmup_steps=10", "--set", "inference.num_samples=10",
                     "--set", "inference.compile=false", "--set", "inference.predictive_samples=10"])
    assert code == 0
    block = json.loads(out_json.read_text())["datasets"]["tiny"]
    assert block["converged_splits"] == 0  # 2 chains x 10 draws: far from ESS 400
    printed = capsys.readouterr().out
    assert "passes --strict" in printed and "0/2" in printed
    # the other methods have no such column
    uci.main(["--spec", str(CONFIG), "--datasets", "tiny", "--splits", "0", "--data-dir", str(root), *TINY_SETS])
    assert "passes --strict" not in capsys.readouterr().out


def test_protocol_width_unless_set(tmp_path):
    base = ["inference.num_steps=3"]
    auto = uci.split_overrides(base, "x", 4, tmp_path, 50, depth=2)
    assert "net.hidden=[50, 50]" in auto and "data.name=uci:x" in auto and "data.split=4" in auto
    mine = uci.split_overrides([*base, "net.hidden=[7]"], "x", 0, tmp_path, 50, depth=1)
    assert "net.hidden=[50]" not in mine and "net.hidden=[7]" in mine


def test_validation_mode_is_labelled(tmp_path, capsys):
    root = tmp_path / "uci"
    write_folder(root, "tiny", n_rows=30)
    out_json = tmp_path / "out.json"
    code = uci.main(["--spec", str(CONFIG), "--datasets", "tiny", "--splits", "1", "--data-dir", str(root),
                     "--json", str(out_json), "--set", "data.validation_fraction=0.2", *TINY_SETS])
    assert code == 0
    assert "VALIDATION" in capsys.readouterr().out
    result = json.loads(out_json.read_text())
    assert result["evaluated_on"] == "validation" and result["validation_fraction"] == 0.2


def test_bad_input_exits_2(tmp_path, capsys):
    root = tmp_path / "uci"
    write_folder(root, "tiny")
    assert uci.main(["--spec", str(CONFIG), "--datasets", "tiny", "--splits", "5", "--data-dir", str(root)]) == 2
    assert "tiny has 2 splits" in capsys.readouterr().err
    assert uci.main(["--spec", str(CONFIG), "--datasets", "nope", "--splits", "0", "--data-dir", str(root)]) == 2
    assert uci.main(["--spec", str(CONFIG), "--splits", "0", "--data-dir", str(tmp_path / "missing")]) == 2


def test_data_dir_falls_back_to_env(tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_DATA_DIR", str(tmp_path))
    assert uci.resolve_data_dir(None) == tmp_path.resolve()
    assert uci.resolve_data_dir(str(tmp_path)) == tmp_path.resolve()


@pytest.mark.skipif(not (SHARED_UCI / "bostonHousing").is_dir(),
                    reason=f"the shared UCI data (bostonHousing) is not at {SHARED_UCI}")
def test_real_boston_one_split(tmp_path, capsys):
    out_json = tmp_path / "boston.json"
    code = uci.main(["--spec", str(CONFIG), "--datasets", "bostonHousing", "--splits", "0",
                     "--data-dir", str(SHARED_UCI), "--json", str(out_json), "--set", "inference.num_steps=20",
                     "--set", "inference.predictive_samples=10"])
    assert code == 0
    block = json.loads(out_json.read_text())["datasets"]["bostonHousing"]
    assert block["n_hidden"] == 50 and block["splits"] == [0]
    for key in ("rmse_mean", "rmse_se", "test_ll_mean", "test_ll_se"):
        assert math.isfinite(block[key]), key
    assert 0 < block["rmse_mean"] < 50
    assert "bostonHousing" in capsys.readouterr().out


def test_set_for_applies_overrides_to_one_data_set_only():
    assert uci.parse_set_for(["kin8nm:model.map.num_steps=4000", "kin8nm:seed=2"], ["bostonHousing", "kin8nm"]) == {
        "bostonHousing": [], "kin8nm": ["model.map.num_steps=4000", "seed=2"]}
    for bad in ("kin8nm=3", "energy:seed=1", "kin8nm:seed"):
        with pytest.raises(ZooInputError, match="--set-for"):
            uci.parse_set_for([bad], ["bostonHousing", "kin8nm"])


def test_tune_sweeps_each_data_set_then_runs_the_splits_with_its_choice(tmp_path, capsys):
    root = tmp_path / "uci"
    write_folder(root, "tiny", n_rows=40)
    write_folder(root, "other", n_rows=40)
    space = tmp_path / "space.yaml"
    space.write_text("inference.lr: {low: 0.001, high: 0.1, log: true}\nprior.scale: [0.5, 2.0]\n")
    out_json, runs = tmp_path / "out.json", tmp_path / "runs"
    code = uci.main(["--spec", str(CONFIG), "--datasets", "tiny,other", "--splits", "0-1", "--data-dir", str(root),
                     "--json", str(out_json), "--tune", str(space), "--trials", "3", "--runs-dir", str(runs),
                     *TINY_SETS])
    assert code == 0
    printed = capsys.readouterr().out
    assert "tiny: sweep of 3 trials" in printed and "other: sweep of 3 trials" in printed
    result = json.loads(out_json.read_text())
    for name in ("tiny", "other"):
        tuned = result["datasets"][name]["tuned"]
        assert tuned["trials"] == 3 and tuned["splits"] == [0] and tuned["validation_fraction"] == 0.2
        assert set(tuned["params"]) == {"inference.lr", "prior.scale"}
        edge = load_space(str(space)).dimensions["inference.lr"].edge(tuned["params"]["inference.lr"])
        assert tuned["at_edge"] == (["inference.lr"] if edge else [])  # what the JSON records, the sweep found
        sweep_trials = json.loads((runs / "sweeps" / name / "sweep.json").read_text())["trials"]
        assert {t["number"] for t in sweep_trials} == {0, 1, 2}
        for split in (0, 1):  # the test splits ran with the sweep's choice, on the test rows
            spec = load_spec(runs / f"{name}-split{split:02d}" / "spec.yaml")
            assert spec.inference.lr == pytest.approx(tuned["params"]["inference.lr"])
            assert spec.prior.default.scale == tuned["params"]["prior.scale"]
            assert spec.data.validation_fraction == 0.0
    assert result["evaluated_on"] == "test" and result["tune_trials"] == 3


def tune_tiny_lr(tmp_path, splits: str, *flags: str) -> tuple[dict, Path]:
    """``--tune`` of the learning rate alone, 2 trials, on a 3-split data set "tiny": the JSON and the runs dir."""
    root = tmp_path / "uci"
    write_folder(root, "tiny", n_rows=40, n_splits=3)
    space = tmp_path / "space.yaml"
    space.write_text("inference.lr: {low: 0.001, high: 0.1, log: true}\n")
    out_json, runs = tmp_path / "out.json", tmp_path / "runs"
    assert uci.main(["--spec", str(CONFIG), "--datasets", "tiny", "--splits", splits, "--data-dir", str(root),
                     "--json", str(out_json), "--tune", str(space), "--trials", "2", *flags,
                     "--runs-dir", str(runs), *TINY_SETS]) == 0
    return json.loads(out_json.read_text()), runs


def test_tune_on_several_splits_scores_the_mean(tmp_path):
    result, runs = tune_tiny_lr(tmp_path, "2", "--tune-splits", "0-1")
    assert result["datasets"]["tiny"]["tuned"]["splits"] == [0, 1]
    record = json.loads((runs / "sweeps" / "tiny" / "sweep.json").read_text())
    assert record["repeat"] == {"data.split": [0, 1]}
    assert [load_spec(runs / "sweeps" / "tiny" / "trials" / "0000" / f"repeat{r}" / "spec.yaml").data.split
            for r in (0, 1)] == [0, 1]


def test_tune_each_split_sweeps_every_split_on_its_own_rows_and_runs_it_with_its_own_choice(tmp_path, capsys):
    result, runs = tune_tiny_lr(tmp_path, "1-2", "--tune-each-split")
    printed = " ".join(capsys.readouterr().out.split())  # the table wraps its cells
    assert "tiny-split01: sweep of 2 trials" in printed and "tiny-split02: sweep of 2 trials" in printed
    assert "2 runs and 2 sweeps" in printed and "tuned per" in printed and "(4 trials" in printed
    tuned = result["datasets"]["tiny"]["tuned"]
    assert result["tune_each_split"] and tuned["each_split"] and tuned["splits"] == [1, 2] and tuned["trials"] == 4
    assert tuned["sweep_seconds"] == pytest.approx(sum(b["sweep_seconds"] for b in tuned["per_split"].values()))
    for split in (1, 2):
        own = tuned["per_split"][str(split)]
        assert own["splits"] == [split]  # the sweep scored validation rows of this split's training rows only
        trial = load_spec(runs / "sweeps" / f"tiny-split{split:02d}" / "trials" / "0000" / "spec.yaml")
        assert trial.data.split == split and trial.data.validation_fraction == 0.2
        spec = load_spec(runs / f"tiny-split{split:02d}" / "spec.yaml")  # the test run took its own sweep's choice
        assert spec.inference.lr == pytest.approx(own["params"]["inference.lr"])
        assert spec.data.split == split and spec.data.validation_fraction == 0.0
    # each sweep scored its own split's validation rows (the same seeded candidates, other rows)
    assert tuned["per_split"]["1"]["validation"] != tuned["per_split"]["2"]["validation"]
    assert not (runs / "sweeps" / "tiny").exists()


def test_tune_refuses_bad_input(tmp_path, capsys):
    root = tmp_path / "uci"
    write_folder(root, "tiny")
    space = tmp_path / "space.yaml"
    space.write_text("inference.lr: {low: 0.1, high: 0.001}\n")
    args = ["--spec", str(CONFIG), "--datasets", "tiny", "--splits", "0", "--data-dir", str(root), "--tune", str(space)]
    assert uci.main(args) == 2
    assert "space: inference.lr" in capsys.readouterr().err
    space.write_text("inference.lr: {low: 0.001, high: 0.1}\n")
    assert uci.main([*args, "--set", "data.validation_fraction=0.2"]) == 2
    assert "leave it at 0" in capsys.readouterr().err
    assert uci.main([*args, "--tune-splits", "0-7"]) == 2
    assert "--tune-splits" in capsys.readouterr().err
    assert uci.main([*args, "--tune-splits", "0", "--tune-each-split"]) == 2
    assert "leave --tune-splits out" in capsys.readouterr().err
    assert uci.main([a for a in args if a not in ("--tune", str(space))] + ["--tune-each-split"]) == 2
    assert "--tune SPACE.yaml" in capsys.readouterr().err


def test_resume_reads_back_finished_splits_continues_the_rest_and_keeps_the_sweep_time(tmp_path, capsys):
    """A stopped ``--tune`` run continues with ``--resume``: the finished sweep runs no trial again (its wall time
    is kept), a finished split is read back unchanged, a split cut off before its metrics is fitted."""
    root = tmp_path / "uci"
    write_folder(root, "tiny", n_rows=40)
    space = tmp_path / "space.yaml"
    space.write_text("inference.lr: {low: 0.001, high: 0.1, log: true}\n")
    out_json, runs = tmp_path / "out.json", tmp_path / "runs"
    args = ["--spec", str(CONFIG), "--datasets", "tiny", "--splits", "0-1", "--data-dir", str(root), "--json",
            str(out_json), "--tune", str(space), "--trials", "2", "--runs-dir", str(runs), *TINY_SETS]
    assert uci.main(args) == 0
    first = json.loads(out_json.read_text())["datasets"]["tiny"]
    assert first["reused_splits"] == 0
    (runs / "tiny-split01" / "metrics.json").unlink()  # as if stopped before split 1 finished
    assert uci.main(args) == 2  # the kept runs are not overwritten without --resume
    assert "--resume" in capsys.readouterr().err
    assert uci.main([*args, "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "(1 read back from an earlier process)" in printed and "tiny: sweep of 2 trials" in printed
    again = json.loads(out_json.read_text())
    block = again["datasets"]["tiny"]
    assert again["resumed"] and block["reused_splits"] == 1
    assert block["test_ll"][0] == first["test_ll"][0]
    assert block["tuned"]["params"] == first["tuned"]["params"]
    assert block["tuned"]["sweep_seconds"] >= first["tuned"]["sweep_seconds"] > 0
    record = json.loads((runs / "sweeps" / "tiny" / "sweep.json").read_text())
    assert len(record["trials"]) == 2  # no trial ran twice
    assert (runs / "tiny-split01" / "metrics.json").is_file()


def test_resume_refuses_a_run_dir_of_another_spec(tmp_path, capsys):
    root = tmp_path / "uci"
    write_folder(root, "tiny", n_rows=40)
    runs = tmp_path / "runs"
    args = ["--spec", str(CONFIG), "--datasets", "tiny", "--splits", "0", "--data-dir", str(root),
            "--runs-dir", str(runs), *TINY_SETS]
    assert uci.main(args) == 0
    assert uci.main([*args, "--resume", "--set", "inference.lr=0.05"]) == 2
    assert "holds a run of another spec" in capsys.readouterr().err
    assert uci.main(["--spec", str(CONFIG), "--datasets", "tiny", "--splits", "0", "--data-dir", str(root),
                     "--resume"]) == 2
    assert "give the same --runs-dir" in capsys.readouterr().err


def test_resume_reads_back_a_runs_dir_whose_data_now_live_elsewhere(tmp_path, capsys):
    """Runs copied to another machine: the same command with that machine's --data-dir reads them back."""
    import shutil

    root, moved = tmp_path / "uci", tmp_path / "elsewhere" / "uci"
    write_folder(root, "tiny", n_rows=40)
    shutil.copytree(root, moved)
    runs, out_json = tmp_path / "runs", tmp_path / "out.json"
    common = ["--spec", str(CONFIG), "--datasets", "tiny", "--splits", "0", "--runs-dir", str(runs),
              "--json", str(out_json), *TINY_SETS]
    assert uci.main([*common, "--data-dir", str(root)]) == 0
    first = json.loads(out_json.read_text())["datasets"]["tiny"]
    assert uci.main([*common, "--data-dir", str(moved), "--resume"]) == 0
    again = json.loads(out_json.read_text())["datasets"]["tiny"]
    assert again["reused_splits"] == 1 and again["test_ll"] == first["test_ll"]


# ------------------------------------------------------------------------------------------------ failed splits
def test_a_diverging_split_is_recorded_and_the_finished_splits_kept(tmp_path, capsys, monkeypatch):
    """Issue 39: one split that diverged ended the benchmark with exit 1 and no JSON, losing the finished splits."""
    from zoo.errors import TrainingDiverged

    root = tmp_path / "uci"
    write_folder(root, "tiny", n_splits=3)
    real = uci.run_split

    def split_1_diverges(spec, overrides, *args, **kwargs):
        if "data.split=1" in overrides:
            raise TrainingDiverged("ELBO is not finite at step 2")
        return real(spec, overrides, *args, **kwargs)

    monkeypatch.setattr(uci, "run_split", split_1_diverges)
    monkeypatch.chdir(tmp_path)
    out_json = tmp_path / "res" / "out.json"
    code = uci.main(["--spec", str(CONFIG), "--datasets", "tiny", "--splits", "0-2", "--data-dir", str(root),
                     "--json", str(out_json), *TINY_SETS])
    said = capsys.readouterr()
    assert code == 1  # the benchmark is incomplete, and says so only after writing everything
    assert "Traceback" not in said.out + said.err
    assert "1 of 3 split(s) failed" in said.err and "figures of the 2 that finished" in said.err
    printed = " ".join(said.out.split())
    assert "this spec (n=2, 1 failed)" in printed
    assert "failed: tiny split 1: TrainingDiverged: ELBO is not finite at step 2" in printed
    result = json.loads(out_json.read_text())
    block = result["datasets"]["tiny"]
    assert block["splits"] == [0, 2] and block["n_splits"] == 2 and len(block["rmse"]) == 2
    assert block["failed_splits"] == {"1": "TrainingDiverged: ELBO is not finite at step 2"}
    assert block["rmse_mean"] == pytest.approx(sum(block["rmse"]) / 2)
    assert result["failed"] == [{"dataset": "tiny", "split": 1,
                                 "reason": "TrainingDiverged: ELBO is not finite at step 2"}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res", "uci"]


def test_every_split_diverging_still_writes_the_table_and_the_json(tmp_path, capsys):
    root = tmp_path / "uci"
    write_folder(root, "tiny")
    out_json = tmp_path / "out.json"
    code = uci.main(["--spec", str(CONFIG), "--datasets", "tiny", "--splits", "0-1", "--data-dir", str(root),
                     "--json", str(out_json), *TINY_SETS, "--set", "inference.lr=1.0e+6"])
    said = capsys.readouterr()
    assert code == 1 and "Traceback" not in said.out + said.err
    assert "2 of 2 split(s) failed" in said.err and "no split finished" in said.err
    block = json.loads(out_json.read_text())["datasets"]["tiny"]
    assert block["n_splits"] == 0 and block["rmse_mean"] is None and block["splits"] == []
    assert set(block["failed_splits"]) == {"0", "1"}
    assert all(reason.startswith("TrainingDiverged: ") for reason in block["failed_splits"].values())
    assert "this spec (n=0, 2 failed)" in " ".join(said.out.split())


def test_tune_counts_failed_trials_and_says_when_the_best_is_a_lone_survivor(tmp_path, capsys):
    """Issue 39: a sweep where most trials failed printed "N trials (0 pruned)" and went on with the survivor."""
    root = tmp_path / "uci"
    write_folder(root, "tiny", n_rows=40)
    space = tmp_path / "space.yaml"
    space.write_text("inference.lr: [0.01, 1.0e+6, 1.0e+7, 1.0e+8]\n")  # the three large ones fail
    out_json = tmp_path / "out.json"
    args = ["--spec", str(CONFIG), "--datasets", "tiny", "--splits", "0", "--data-dir", str(root), "--json",
            str(out_json), "--tune", str(space), *TINY_SETS]
    assert uci.main([*args, "--trials", "4"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    tuned = json.loads(out_json.read_text())["datasets"]["tiny"]["tuned"]
    assert tuned["trials"] == 4 and tuned["complete"] + tuned["failed"] + tuned["pruned"] == 4
    assert tuned["complete"] == 1 and tuned["params"]["inference.lr"] == 0.01  # the scenario: one survivor
    assert f"tiny: sweep of 4 trials (1 complete, 0 pruned, {tuned['failed']} failed)" in printed
    assert "tiny: warning: the best trial" in printed and "not the best of a search" in printed
    assert "--runs-dir DIR keeps it" in printed  # its sweep directory was a temporary one
    assert len(tuned["caveats"]) == 1 and "only one of 4 finished trials" in tuned["caveats"][0]

    # A sweep with no complete trial fails its data set's splits; the JSON is still written.
    space.write_text("inference.lr: [1.0e+6, 1.0e+7]\n")
    assert uci.main([*args, "--trials", "2"]) == 1
    said = capsys.readouterr()
    assert "Traceback" not in said.out + said.err
    result = json.loads(out_json.read_text())
    assert [f["split"] for f in result["failed"]] == [0]
    assert result["failed"][0]["reason"].startswith("tiny: no trial of the sweep completed: 2 trials (0 complete")
    assert result["datasets"]["tiny"]["n_splits"] == 0 and "tuned" not in result["datasets"]["tiny"]
