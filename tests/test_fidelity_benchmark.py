"""The fidelity benchmark, tiny: a 2-chain NUTS reference on a 1-3-1 toy net and two cheap members."""

import json
import math
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import fidelity  # noqa: E402

from zoo.errors import ZooInputError  # noqa: E402
from zoo.pipeline import train  # noqa: E402
from zoo.runs import claimed_run_directory  # noqa: E402
from zoo.spec import load_spec  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fidelity") / "tiny" / "nuts"
    spec = load_spec(CONFIGS / "nuts_toy.yaml", [
        "net.hidden=[3]", "inference.num_chains=2", "inference.warmup_steps=20", "inference.num_samples=20",
        "inference.max_tree_depth=4", "inference.predictive_samples=40", "device=cpu"])
    train(spec, out, progress=False, echo=None)
    return out


def test_member_specs_keep_the_reference_data_net_and_prior(reference):
    ref = load_spec(reference / "spec.yaml")
    for name in fidelity.MEMBERS:
        spec = fidelity.member_spec(ref, name, "regression")
        assert spec.data == ref.data and spec.likelihood == ref.likelihood and spec.seed == ref.seed
        if name != "subnet_laplace":  # configs/subnet_laplace_toy.yaml's 1-50-50-1 net
            assert spec.net == ref.net
        if spec.model.family in ("all_weights", "deep_ensemble", "subnetwork"):
            assert spec.prior == ref.prior
    assert fidelity.member_spec(ref, "subnet_laplace", "regression").net.hidden == [50, 50]
    assert fidelity.member_spec(ref, "mc_dropout", "classification").guide.dropout_rate == 0.1
    assert fidelity.member_spec(ref, "map", "regression", steps=7).inference.num_steps == 7
    with pytest.raises(Exception, match="--members"):
        fidelity.parse_members("mean_field,nope")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.replace("┃", "│").split("│")[1:-1]]


def test_tiny_run_table_json_and_resume(reference, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # rich: no wrapped cells
    out, runs = tmp_path / "fidelity.json", tmp_path / "runs"
    argv = ["--reference", str(reference), "--allow-unconverged", "--members", "mean_field,map", "--runs-dir",
            str(runs), "--steps", "20", "--samples", "40", "--json", str(out)]
    with pytest.raises(ZooInputError, match="cannot be trusted as a reference: R-hat"):
        fidelity.main([a for a in argv if a != "--allow-unconverged"])  # refused before any member trains
    assert not runs.exists()
    figures = fidelity.main(argv)
    printed = capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["task"] == "regression" and saved["columns"] == ["coverage_95", "w1", "rmse", "test_ll", "sd_ratio"]
    assert [r["member"] for r in saved["rows"]] == ["nuts", "mean_field", "map"]
    assert {"label", "run", "how", "coverage_95", "w1", "rmse", "test_ll", "sd_ratio", "sd_gap", "sd_data",
            "stored_metrics", "train_seconds"} <= set(saved["rows"][1])
    assert saved["rows"][2]["sd_ratio"] is None and saved["rows"][2]["sd_gap"] == 0  # MAP: 0 / 0
    assert {"reference", "data", "num_samples", "wall_seconds"} <= set(saved)
    nuts = saved["rows"][0]
    assert nuts["coverage_95"] == pytest.approx(0.95, abs=0.005) and nuts["w1"] == 0
    for member in saved["rows"][1:]:  # trained for 20 steps: a real distance from NUTS, a coverage in [0, 1]
        assert 0 <= member["coverage_95"] <= 1 and member["w1"] > 0 and math.isfinite(member["test_ll"])
    assert [r["how"] for r in saved["rows"]] == ["reference", "trained", "trained"]
    # every row says whether it approximates the reference's own posterior and whether the reference is converged
    assert [r["differs_from_reference"] for r in saved["rows"]] == [[], [], []]
    assert saved["reference_check"]["passes_strict"] is False  # 2 chains x 30 draws: ESS far below 400
    ref = load_spec(reference / "spec.yaml")
    assert fidelity.posterior_differences(ref, fidelity.member_spec(ref, "subnet_laplace", "regression")) == ["net"]
    assert saved["rows"] == json.loads(json.dumps(figures["rows"]))

    # the printed table shows the JSON's figures, row by row
    lines = [_cells(line) for line in printed.splitlines() if line.startswith("│")]
    assert len(lines) == 3
    for cells, row in zip(lines, saved["rows"], strict=True):
        assert cells[0] == row["label"]
        assert cells[1:6] == [fidelity._fmt(k, row[k]) for k in saved["columns"]]
        assert cells[6:] == ["yes", "NO"]
    assert lines[0][1:3] == ["0.950", "0"]

    # resume-safe: finished runs are reused, and a run next to the reference with the same spec is found there
    again = fidelity.main(argv)
    assert [r["how"] for r in again["rows"]] == ["reference", "reused", "reused"]
    assert again["rows"][1]["coverage_95"] == saved["rows"][1]["coverage_95"]
    (runs / "map").rename(reference.parent / "map_elsewhere")
    third = fidelity.main(argv[:-2])
    assert third["rows"][2]["how"] == "reused, next to the reference"
    assert third["rows"][2]["run"] == str(reference.parent / "map_elsewhere")


@pytest.fixture(scope="module")
def uci_references(tmp_path_factory) -> list[Path]:
    """Tiny HMC references on two splits of a small UCI folder in the standard format."""
    import numpy as np

    from tests.test_data import write_uci

    root = tmp_path_factory.mktemp("uci")
    rng = np.random.default_rng(0)
    data = rng.normal(size=(40, 4))
    data[:, 3] = 5 + 2 * data[:, 0] - data[:, 1] + 0.3 * rng.normal(size=40)
    splits = [(list(range(8, 40)), list(range(8))), (list(range(32)), list(range(32, 40)))]
    write_uci(root, "tiny", data, [0, 1, 2], 3, splits, {"n_hidden.txt": "3\n"})
    references = []
    for split in (0, 1):
        out = root / "hmc" / f"tiny-split{split:02d}"
        spec = load_spec(CONFIGS / "hmc_uci.yaml", [
            "data.name=uci:tiny", f"data.dir={root}", f"data.split={split}", "net.hidden=[3]",
            "inference.num_chains=2", "inference.warmup_steps=15", "inference.num_samples=15",
            "inference.compile=false", "inference.predictive_samples=20", "device=cpu"])
        train(spec, out, progress=False, echo=None)
        references.append(out)
    return references


def test_each_topic_has_the_member_configs_that_ship():
    """Every member has a UCI config but the float64 Laplace autoguide; on digits the two full-covariance
    autoguides have none, so a config that goes missing shows here, not as a skipped row."""
    assert set(fidelity.MEMBERS) - set(fidelity.member_configs("uci")) == {"auto_laplace_approximation"}
    assert set(fidelity.MEMBERS) - set(fidelity.member_configs("digits")) == {
        "auto_mvn", "auto_laplace_approximation"}
    assert fidelity.member_configs("digits")["rank1"] == "rank1_cauchy_digits.yaml"


@pytest.mark.slow  # builds tiny UCI references: ~50 s (make test-slow)
def test_uci_members_are_their_uci_configs_on_the_references_data(uci_references):
    ref = load_spec(uci_references[1] / "spec.yaml")
    for name, config in fidelity.member_configs("uci").items():
        spec = fidelity.member_spec(ref, name, "regression")
        own = load_spec(CONFIGS / config)
        assert spec.data == ref.data and spec.seed == ref.seed and spec.net.hidden == [3]
        assert spec.inference == own.inference and spec.guide == own.guide and spec.model == own.model
        assert config in fidelity.member_label(name, "regression", "uci")
    mean_field = fidelity.member_spec(ref, "mean_field", "regression")
    assert fidelity.posterior_differences(ref, mean_field) == []  # the same model as the HMC reference


@pytest.mark.slow  # the tiny UCI references (make test-slow)
def test_several_uci_references_are_summarised_per_data_set(uci_references, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    out = tmp_path / "fidelity.json"
    result = fidelity.main(["--reference", *map(str, uci_references), "--members",
                            "map,mean_field,auto_laplace_approximation", "--runs-dir", str(tmp_path / "runs"),
                            "--steps", "20", "--samples", "20", "--json", str(out), "--allow-unconverged"])
    printed = capsys.readouterr().out
    assert "auto_laplace_approximation: no uci config" in printed  # a member without one is skipped
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(result))
    first, second = saved["per_reference"]
    assert first["topic"] == "uci" and first["columns"] == fidelity.UCI_COLUMNS and (first["split"], second["split"]) \
        == (0, 1)
    assert "sd_ratio" not in first["rows"][1]  # many-dimensional inputs: no gap
    assert Path(first["rows"][1]["run"]).parent.name == "tiny-split00"
    (summary,) = saved["summary"]
    assert summary["data"] == "uci:tiny" and summary["splits"] == [0, 1]
    assert summary["references_passing_strict"] == 0  # 2 chains x 15 draws
    for position, row in enumerate(summary["rows"]):
        values = [first["rows"][position]["test_ll"], second["rows"][position]["test_ll"]]
        assert row["test_ll"] == pytest.approx(sum(values) / 2)
        assert row["test_ll_se"] == pytest.approx(abs(values[0] - values[1]) / 2 / math.sqrt(2))  # as uci.py
    assert "posterior fidelity on uci:tiny, splits [0, 1]" in printed and "0/2" in printed


def test_a_member_whose_training_diverges_gets_a_row_saying_so_and_the_rest_go_on(reference, tmp_path, capsys,
                                                                                   monkeypatch):
    from zoo.errors import TrainingDiverged

    monkeypatch.setenv("COLUMNS", "400")
    obtain = fidelity.obtain_run

    def diverging_map(spec, name, *args):
        if name == "map":
            raise TrainingDiverged("SGD diverged at step 3 (lr 0.05); lower inference.lr")
        return obtain(spec, name, *args)

    monkeypatch.setattr(fidelity, "obtain_run", diverging_map)
    figures = fidelity.main(["--reference", str(reference), "--allow-unconverged", "--members", "map,mean_field",
                             "--runs-dir", str(tmp_path / "runs"), "--steps", "20", "--samples", "20"])
    assert [r["member"] for r in figures["rows"]] == ["nuts", "mean_field", "map"]
    failed = figures["rows"][2]
    assert failed["how"] == "failed" and "SGD diverged at step 3" in failed["failed"] and "w1" not in failed
    assert figures["rows"][1]["w1"] > 0  # the other member was compared as usual
    printed = capsys.readouterr().out
    assert "map: training failed on" in printed and "training failed" in printed.split("posterior fidelity")[-1]


def test_a_member_run_that_stopped_before_its_first_checkpoint_is_trained_afresh(reference, tmp_path, monkeypatch):
    spec = fidelity.member_spec(fidelity.load_run(reference)[0], "map", "regression", steps=5)
    out = tmp_path / "runs" / "map"
    with claimed_run_directory(out):  # what a run that diverged before its first checkpoint leaves: marker, spec
        (out / fidelity.SPEC_FILE).write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    calls = []
    real_train = fidelity.train
    monkeypatch.setattr(fidelity, "train", lambda *a, **k: calls.append(k.get("resume", False)) or real_train(*a, **k))
    run_dir, how = fidelity.obtain_run(spec, "map", reference, tmp_path / "runs", lambda message: None)
    assert (run_dir, how) == (out, "trained") and calls == [True, False]  # the resume found nothing, so it started over
    assert fidelity._finished(out)


def test_summary_over_splits_skips_a_member_where_its_training_failed():
    def row(member, **figures):
        return {"member": member, "label": member.upper(), "differs_from_reference": [], **figures}

    figures = [{"data": "uci:a", "split": s, "seed": 0, "topic": "uci", "columns": ["w1"], "reference_method": "hmc",
                "num_samples": 10, "reference_check": {"passes_strict": True},
                "rows": [row("hmc", w1=0.0), row("swag", failed="SGD diverged") if s == 1 else row("swag", w1=1.0 + s)]}
               for s in range(3)]
    (summary,) = fidelity.summarise_splits(figures)
    hmc, swag = summary["rows"]
    assert hmc["failed_on"] == [] and swag["failed_on"] == [1]
    assert swag["w1"] == pytest.approx(2.0) and swag["w1_se"] == pytest.approx(1 / math.sqrt(2))  # splits 0 and 2
    assert "training failed on 1" in str(fidelity.summary_table(summary).columns[0]._cells)


def test_summary_of_hand_figures():
    rows = [{"member": "hmc", "label": "HMC", "differs_from_reference": [], "w1": 0.0, "test_ll": -1.0},
            {"member": "map", "label": "MAP", "differs_from_reference": [], "w1": 0.5, "test_ll": None}]
    figures = [{"data": "uci:a", "split": s, "seed": 0, "topic": "uci", "columns": ["w1", "test_ll"],
                "reference_method": "hmc", "num_samples": 10, "reference_check": {"passes_strict": s == 0},
                "rows": [dict(rows[0], test_ll=-1.0 - s), dict(rows[1], w1=0.5 + s)]} for s in range(3)]
    (summary,) = fidelity.summarise_splits(figures)
    hmc, map_row = summary["rows"]
    # -1, -2, -3: population sd sqrt(2/3), over sqrt(3) splits (the UCI tables' convention)
    assert hmc["test_ll"] == pytest.approx(-2.0) and hmc["test_ll_se"] == pytest.approx(math.sqrt(2) / 3)
    assert map_row["w1"] == pytest.approx(1.5) and map_row["test_ll"] is None and map_row["test_ll_se"] is None
    assert summary["references_passing_strict"] == 1


@pytest.fixture(scope="module")
def digits_reference(tmp_path_factory) -> Path:
    """A tiny HMC reference on digits (a 64-3-10 net): the digits topic's members run on its data and seed."""
    out = tmp_path_factory.mktemp("digits") / "hmc"
    spec = load_spec(CONFIGS / "hmc_digits.yaml", [
        "net.hidden=[3]", "seed=1", "inference.num_chains=2", "inference.warmup_steps=10",
        "inference.num_samples=10", "inference.compile=false", "inference.predictive_samples=20", "device=cpu"])
    train(spec, out, progress=False, echo=None)
    return out


@pytest.mark.slow  # builds a digits reference: ~75 s (make test-slow)
def test_digits_members_are_their_digits_configs_on_the_references_data(digits_reference, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    ref = load_spec(digits_reference / "spec.yaml")
    for name, config in fidelity.member_configs("digits").items():
        spec = fidelity.member_spec(ref, name, "classification")
        own = load_spec(CONFIGS / config)
        assert spec.data == ref.data and spec.seed == 1 and spec.net.hidden == [3]
        assert spec.inference == own.inference and spec.guide == own.guide and spec.prior == own.prior
        assert config in fidelity.member_label(name, "classification", "digits")
    assert fidelity.posterior_differences(ref, fidelity.member_spec(ref, "map", "classification")) == []
    result = fidelity.main(["--reference", str(digits_reference), "--allow-unconverged", "--members",
                            "map,auto_mvn", "--steps", "3",
                            "--runs-dir", str(tmp_path / "runs"), "--samples", "10"])
    assert result["topic"] == "digits" and result["columns"] == fidelity.COLUMNS["classification"]
    hmc, map_row = result["rows"]  # auto_mvn has no digits config: skipped
    assert hmc["agreement"] == 1 and hmc["tv"] == 0
    assert 0 <= map_row["agreement"] <= 1 and 0 < map_row["tv"] <= 1 and map_row["label"] == "MAP (map_digits.yaml)"
    assert Path(map_row["run"]).parent == tmp_path / "runs" / "digits-seed01"
