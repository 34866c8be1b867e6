"""``zoo report``: hand-made run directories gathered into one table (exact means and standard errors, "—" for
what a run did not record, CSV, plot), the errors for non-run directories, and the benchmarks' ``--runs-dir``."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from zoo.cli import main
from zoo.errors import ZooInputError
from zoo.report import (
    MISSING,
    REPORT_MARK,
    RunRecord,
    build_report,
    diagnostic_metrics,
    group_value,
    run_label,
    write_report,
)
from zoo.spec import load_spec, spec_to_yaml

MEAN_FIELD_UCI = {"data": {"name": "uci:bostonHousing"}, "net": {"hidden": [50]}, "device": "cpu"}
RANK1_UCI = {"data": {"name": "uci:bostonHousing"}, "prior": {"name": "cauchy", "loc": 1.0, "scale": 0.01},
             "model": {"family": "rank1"}, "guide": {"name": "mixture"}, "device": "cpu"}
NUTS_TOY = {"data": {"name": "toy_gap"}, "likelihood": {"noise": 0.1}, "inference": {"method": "nuts"},
            "device": "cpu"}
DIAGNOSTICS = {
    "draws": "mcmc",
    "function_space": [{"variable": "f_test[0]", "r_hat": 1.01, "ess_bulk": 300.0, "ess_tail": 250.0},
                       {"variable": "lp", "r_hat": 1.05, "ess_bulk": 120.0, "ess_tail": None}],
    "weights": {"r_hat_quantiles": {"max": 1.2}},
    "divergences": {"count": 3, "fraction": 0.0015},
    "bfmi": [0.9, 0.4],
    "warnings": ["R-hat ...", "divergences ..."],
}


def make_run(root: Path, name: str, tree: dict, metrics: dict, diagnostics: dict | None = None, **fields) -> Path:
    """A run directory written by hand: spec.yaml of a real RunSpec (``fields`` as --set overrides), metrics.json."""
    run = root / name
    run.mkdir(parents=True)
    spec = load_spec(tree, [f"{k.replace('__', '.')}={v}" for k, v in fields.items()])
    (run / "spec.yaml").write_text(spec_to_yaml(spec))
    (run / "metrics.json").write_text(json.dumps(metrics))
    if diagnostics is not None:
        (run / "diagnostics.json").write_text(json.dumps(diagnostics))
    return run


@pytest.fixture
def runs(tmp_path) -> list[Path]:
    """Three mean-field splits (rmse 1, 2, 4; the third has no test_ll), one rank-1 run, one diagnosed NUTS run."""
    root = tmp_path / "runs"
    return [
        make_run(root, "mf-split00", MEAN_FIELD_UCI, {"rmse": 1.0, "test_ll": -1.0}, data__split=0),
        make_run(root, "mf-split01", MEAN_FIELD_UCI, {"rmse": 2.0, "test_ll": -2.0}, data__split=1),
        make_run(root, "mf-split02", MEAN_FIELD_UCI, {"rmse": 4.0}, data__split=2),
        make_run(root, "rank1-split00", RANK1_UCI, {"rmse": 3.0, "train_seconds": 12.5}),
        make_run(root, "nuts", NUTS_TOY, {"rmse": 0.25, "test_ll": 0.5}, DIAGNOSTICS),
    ]


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


# Hand example: rmse 1, 2, 4 -> mean 7/3, population variance 14/9, s.e. sqrt(14/9) / sqrt(3) = sqrt(14/27);
# test_ll -1, -2 (two of three runs) -> mean -1.5, s.e. 0.5 / sqrt(2).
RMSE_MEAN, RMSE_SE = 7 / 3, math.sqrt(14 / 27)
LL_MEAN, LL_SE = -1.5, 0.5 / math.sqrt(2)


def test_grouped_by_label_through_the_cli(runs, tmp_path, capsys):
    out = tmp_path / "out" / "report.md"
    assert main(["report", *map(str, runs), "--group-by", "label", "--out", str(out),
                 "--metrics", "rmse,test_ll,r_hat_max"]) == 0
    printed = capsys.readouterr().out
    assert "2.33 ± 0.72" in printed and "-1.50 ± 0.35 (n=2)" in printed and "report.md" in printed

    rows = read_csv(out.with_suffix(".csv"))
    assert list(rows[0]) == ["label", "n", "rmse_mean", "rmse_se", "rmse_n", "test_ll_mean", "test_ll_se", "test_ll_n",
                             "r_hat_max_mean", "r_hat_max_se", "r_hat_max_n"]
    assert len(rows) == 3
    mf, rank1, nuts = rows
    assert mf["label"] == "family all_weights, guide mean_field, prior normal, uci:bostonHousing" and mf["n"] == "3"
    assert float(mf["rmse_mean"]) == pytest.approx(RMSE_MEAN, abs=1e-15)
    assert float(mf["rmse_se"]) == pytest.approx(RMSE_SE, abs=1e-15) and mf["rmse_n"] == "3"
    assert float(mf["test_ll_mean"]) == LL_MEAN and float(mf["test_ll_se"]) == pytest.approx(LL_SE, abs=1e-15)
    assert mf["test_ll_n"] == "2" and mf["r_hat_max_mean"] == "" and mf["r_hat_max_n"] == ""
    assert rank1["label"] == "family rank1, guide mixture, prior cauchy, uci:bostonHousing"
    assert (rank1["n"], rank1["rmse_mean"], rank1["rmse_se"], rank1["test_ll_mean"]) == ("1", "3.0", "0.0", "")
    assert nuts["label"] == "family all_weights, sampled by nuts, prior normal, toy_gap"
    assert float(nuts["r_hat_max_mean"]) == 1.05

    markdown = out.read_text()
    lines = markdown.splitlines()
    header = lines.index("| label | n | rmse | test_ll | r_hat_max |")
    assert lines[header + 1] == "| --- | --- | --- | --- | --- |"
    assert lines[header + 2] == ("| family all_weights, guide mean_field, prior normal, uci:bostonHousing | 3 "
                                 f"| 2.33 ± 0.72 | -1.50 ± 0.35 (n=2) | {MISSING} |")
    assert lines[header + 3] == f"| family rank1, guide mixture, prior cauchy, uci:bostonHousing | 1 | 3 | {MISSING} " \
                                f"| {MISSING} |"
    assert lines[header + 4] == "| family all_weights, sampled by nuts, prior normal, toy_gap | 1 | 0.25 | 0.5 | 1.05 |"
    assert "![metrics](report.png)" in markdown and "population std / sqrt(n)" in markdown
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in out.parent.iterdir()) == ["report.csv", "report.md", "report.png"]  # no temp files


def test_one_row_per_run_through_the_python_function(runs, tmp_path):
    everything = build_report(runs)
    assert everything.metrics == ["rmse", "test_ll", "train_seconds", "r_hat_max", "r_hat_max_weights", "ess_min",
                                  "divergences", "bfmi_min", "diagnostic_warnings"]  # only what some run recorded
    nuts = everything.rows[4].cells
    assert {m: (c.mean, c.se, c.n) for m, c in nuts.items() if m not in ("rmse", "test_ll")} == {
        "r_hat_max": (1.05, None, 1), "r_hat_max_weights": (1.2, None, 1), "ess_min": (120.0, None, 1),
        "divergences": (3.0, None, 1), "bfmi_min": (0.4, None, 1), "diagnostic_warnings": (2.0, None, 1)}

    report = write_report(runs, tmp_path / "runs.md", metrics=["rmse", "test_ll", "train_seconds", "ess_min"])
    assert [row.key for row in report.rows] == [str(r) for r in runs]
    assert report.rows[2].cells["rmse"].mean == 4.0 and "test_ll" not in report.rows[2].cells
    assert report.files == {"csv": tmp_path / "runs.csv", "plot": tmp_path / "runs.png",
                            "markdown": tmp_path / "runs.md"}
    rows = read_csv(tmp_path / "runs.csv")
    assert list(rows[0]) == ["run", "label", "rmse", "test_ll", "train_seconds", "ess_min"]
    assert [r["run"] for r in rows] == [str(r) for r in runs]
    assert rows[2]["rmse"] == "4.0" and rows[2]["test_ll"] == "" and rows[0]["ess_min"] == ""
    assert rows[3]["train_seconds"] == "12.5" and rows[4]["train_seconds"] == "" and rows[4]["ess_min"] == "120.0"
    row = next(line for line in (tmp_path / "runs.md").read_text().splitlines() if "mf-split02" in line)
    assert row.split(" | ")[2:] == ["4", MISSING, MISSING, f"{MISSING} |"]
    assert (tmp_path / "runs.png").read_bytes()[:4] == b"\x89PNG"


def test_group_by_name_and_spec_fields(runs, tmp_path):
    by_name = write_report(runs, tmp_path / "a.md", group_by="name", metrics=["rmse"])
    assert [(r.key, r.n) for r in by_name.rows] == [("mf", 3), ("rank1", 1), ("nuts", 1)]
    assert by_name.rows[0].cells["rmse"].mean == pytest.approx(RMSE_MEAN)
    assert by_name.rows[0].label.startswith("family all_weights, guide mean_field")
    by_data = write_report(runs, tmp_path / "b.md", group_by="data", metrics=["rmse"])
    assert [(r.key, r.n, r.label) for r in by_data.rows][0] == ("uci:bostonHousing", 4, "2 different labels")
    assert by_data.rows[0].cells["rmse"].mean == 2.5
    by_split = write_report(runs, tmp_path / "c.md", group_by="data.split", metrics=["rmse"])
    # the toy NUTS run's data set has no splits: its own row, not split 0
    assert [(r.key, r.n) for r in by_split.rows] == [("0", 2), ("1", 1), ("2", 1), (MISSING, 1)]
    assert read_csv(tmp_path / "c.csv")[0]["data.split"] == "0"


@pytest.mark.parametrize(("directory", "name"), [
    ("bostonHousing-split03", "bostonHousing"), ("digits_seed2", "digits"), ("mf.run-4", "mf"), ("rank1", "rank1"),
    ("rank1-seed0", "rank1"), ("mnist1d", "mnist1d"), ("seed2", "seed2")])
def test_group_by_name_drops_only_a_run_index(directory, name):
    record = RunRecord(Path("runs") / directory, load_spec(MEAN_FIELD_UCI), "label", {})
    assert group_value(record, "name") == name


def test_diagnostic_numbers_skip_what_is_missing():
    assert diagnostic_metrics({"draws": "iid", "function_space": [{"r_hat": None, "ess_bulk": 200.0}],
                               "weights": None, "pareto_k": {"k_hat": 0.62}, "warnings": []}) == \
        {"pareto_k": 0.62, "diagnostic_warnings": 0.0}
    assert diagnostic_metrics({"pareto_k": {"k_hat": None}}) == {}


def test_label_marks_validation_and_site_rules():
    spec = load_spec({**MEAN_FIELD_UCI, "prior": {"name": "laplace", "scale": 0.3,
                                                  "sites": {"*.bias": {"scale": 1.0}}}},
                     ["data.validation_fraction=0.2"])
    assert run_label(spec) == "family all_weights, guide mean_field, prior laplace (+1 site rule), " \
                              "uci:bostonHousing [validation]"


def test_not_a_run_directory(runs, tmp_path, capsys):
    empty, half = tmp_path / "empty", tmp_path / "half"
    empty.mkdir()
    half.mkdir()
    (half / "spec.yaml").write_text((runs[0] / "spec.yaml").read_text())
    out = str(tmp_path / "r.md")
    for bad, fragment in ((empty, "lacks spec.yaml and metrics.json"), (half, "lacks metrics.json"),
                          (tmp_path / "missing", "no such directory"), (runs[0] / "spec.yaml", "is a file")):
        assert main(["report", str(runs[0]), str(bad), "--out", out]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: RUN_DIR") and str(bad) in err and fragment in err, err
        assert "Traceback" not in err
    assert not (tmp_path / "r.md").exists()
    with pytest.raises(ZooInputError, match="lacks spec.yaml and metrics.json"):
        write_report([empty], tmp_path / "r.md")


@pytest.mark.parametrize("argv, fragment", [
    (["--group-by", "colour"], "--group-by"),
    (["--metrics", "rmse,accuracy"], "no run records it"),
])
def test_bad_options_exit_2(runs, tmp_path, capsys, argv, fragment):
    assert main(["report", *map(str, runs), "--out", str(tmp_path / "r.md"), *argv]) == 2
    assert fragment in capsys.readouterr().err


def test_out_must_be_markdown(runs, tmp_path, capsys):
    assert main(["report", str(runs[0]), "--out", str(tmp_path / "r.csv")]) == 2
    assert ".md" in capsys.readouterr().err


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("case", "fragment"), [
    ("users_csv", "data.csv exists and was not written by zoo report"),  # the user's data beside --out data.md
    ("users_png", "data.png exists and was not written by zoo report"),
    ("users_md", "data.md exists and was not written by zoo report"),
    ("inside_run", "is a run directory; write the report outside it"),  # would replace zoo diagnose's summary.csv
    ("inside_sweep", "is a sweep directory; write the report outside it"),
])
def test_report_never_overwrites_what_it_did_not_write(runs, tmp_path, capsys, case, fragment):
    user = tmp_path / "user"
    user.mkdir()
    out = user / "data.md"
    if case.startswith("users_"):
        out.with_suffix("." + case.split("_")[1]).write_text("x,y\n1,2\n")
    elif case == "inside_run":
        out = runs[0] / "summary.md"
        (runs[0] / "summary.csv").write_text("variable,mean\n")
    else:
        (user / ".zoo-sweep").write_text("{}")
    before = {"user": _tree(user), "run": _tree(runs[0])}
    assert main(["report", *map(str, runs), "--out", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith("error: --out") and fragment in err and "Traceback" not in err
    assert {"user": _tree(user), "run": _tree(runs[0])} == before  # nothing written, nothing replaced


def test_a_report_overwrites_its_own_earlier_files(runs, tmp_path):
    out = tmp_path / "r.md"
    for _ in range(2):
        assert main(["report", *map(str, runs), "--out", str(out)]) == 0
    assert out.read_text().splitlines()[0] == REPORT_MARK
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix) == ["r.csv", "r.md", "r.png"]


def fake_train(spec, out_dir, **_):
    """Stands in for zoo.pipeline.train in the benchmarks: spec.yaml and metrics.json from the split and seed."""
    from zoo.pipeline import RunSummary

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    split = spec.data.model_dump().get("split", 0)  # UCI runs have a split; the digits benchmark's none
    metrics = {"rmse": 1.0 + split ** 2, "test_ll": -1.0 - split, "accuracy": 0.9 + spec.seed / 100,
               "nll": 0.3, "train_seconds": 0.5}
    (out / "spec.yaml").write_text(spec_to_yaml(spec))
    (out / "metrics.json").write_text(json.dumps(metrics))
    return RunSummary(out, metrics, None)


def test_uci_benchmark_keeps_runs_for_the_report(tmp_path, capsys, monkeypatch):
    from tests.test_uci_benchmark import CONFIG, uci, write_folder

    monkeypatch.setattr("zoo.pipeline.train", fake_train)
    root = tmp_path / "uci"
    write_folder(root, "tiny", n_splits=3)
    kept = tmp_path / "kept"
    argv = ["--spec", str(CONFIG), "--datasets", "tiny", "--splits", "0-2", "--data-dir", str(root),
            "--json", str(tmp_path / "out.json"), "--runs-dir", str(kept)]
    assert uci.main(argv) == 0
    assert sorted(p.name for p in kept.iterdir()) == ["tiny-split00", "tiny-split01", "tiny-split02"]
    block = json.loads((tmp_path / "out.json").read_text())["datasets"]["tiny"]
    assert block["rmse"] == [1.0, 2.0, 5.0]
    assert "runs kept in" in capsys.readouterr().out

    report = write_report(sorted(kept.iterdir()), tmp_path / "r.md", group_by="name", metrics=["rmse", "test_ll"])
    (row,) = report.rows
    assert (row.key, row.n) == ("tiny", 3)
    assert (row.cells["rmse"].mean, row.cells["rmse"].se) == (block["rmse_mean"], block["rmse_se"])
    # by hand: rmse 1, 2, 5 -> mean 8/3, population std sqrt(26/9), s.e. sqrt(26/9) / sqrt(3)
    assert row.cells["rmse"].mean == pytest.approx(8 / 3) and row.cells["rmse"].se == pytest.approx(math.sqrt(26 / 27))
    assert uci.main(argv) == 2  # kept runs are never overwritten
    assert "already holds files" in capsys.readouterr().err


def test_digits_benchmark_keeps_runs_for_the_report(tmp_path, monkeypatch):
    from tests.conftest import load_benchmark

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "digits.py"
    digits = load_benchmark("digits", "digits_benchmark_for_report")
    monkeypatch.setattr(digits, "train", fake_train)
    config = str(script.parents[1] / "configs" / "mean_field_digits.yaml")
    figures = digits.main(["--spec", config, "--seeds", "0-1", "--runs-dir", str(tmp_path / "kept")])
    kept = sorted((tmp_path / "kept").iterdir())
    assert [p.name for p in kept] == ["mean_field_digits-seed0", "mean_field_digits-seed1"]
    (row,) = write_report(kept, tmp_path / "r.md", group_by="label", metrics=["accuracy"]).rows
    assert row.n == 2 and row.cells["accuracy"].mean == pytest.approx(figures["accuracy_mean"])
    assert row.cells["accuracy"].se == pytest.approx(figures["accuracy_se"])
    assert row.cells["accuracy"].mean == pytest.approx(0.905) and row.cells["accuracy"].se == pytest.approx(
        0.005 / math.sqrt(2))  # by hand: 0.90 and 0.91
