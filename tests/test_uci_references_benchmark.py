"""benchmarks/uci_references.py: the progress table, the estimate, the budget's stop and a tiny reference grown to a
passing verdict by the real ``zoo train`` commands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from tests.conftest import load_benchmark
from tests.test_uci_benchmark import write_folder
from zoo.diagnostics import ESS_MIN, RHAT_MAX, estimated_draws

REPO = Path(__file__).resolve().parents[1]
references = load_benchmark("uci_references")

# a reference that converges in seconds: linear regression (no hidden layer) with 16 chains, uncompiled
TINY = ["--set", "net.hidden=[]", "--set", "inference.num_chains=16", "--set", "inference.warmup_steps=100",
        "--set", "inference.compile=false", "--set", "inference.predictive_samples=8"]


def test_estimated_draws_scale_r_hat_and_ess_in_proportion_to_the_draws():
    assert estimated_draws(1000, 1.0 + 2 * (RHAT_MAX - 1), ESS_MIN) == 2000  # R-hat binds
    assert estimated_draws(1000, 1.0, ESS_MIN / 4) == 4000  # ESS binds
    assert estimated_draws(1000, 1.0 + 3 * (RHAT_MAX - 1), ESS_MIN / 2) == 3000  # the larger
    assert estimated_draws(1000, RHAT_MAX, 2 * ESS_MIN) == 1000  # passing: no more


@pytest.mark.parametrize("argv, message", [
    ([], "--budget-minutes"),
    (["--budget-minutes", "0"], "--budget-minutes"),
    (["--status", "--add-draws", "0"], "--add-draws"),
    (["--status", "--spec", "no/such.yaml"], "--spec"),
    (["--status", "--splits", "3-1"], "--splits"),
    (["--budget-minutes", "1", "--datasets", "concrete", "--set-for", "energy:inference.num_samples=10"],
     "--set-for"),
])
def test_bad_input_exits_2_before_anything_runs(argv, message, tmp_path, capsys):
    assert references.main([*argv, "--runs-dir", str(tmp_path / "refs")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "refs").exists()


def test_a_round_that_has_not_checkpointed_yet_reads_as_sampling_and_runs_no_diagnosis(tmp_path):
    """A round that asks more draws rewrites spec.yaml before its first checkpoint: the status reads the draws the
    run holds (not the spec's), says it is being sampled, and does not diagnose the live run."""
    import yaml

    from tests.conftest import tiny_hmc
    from zoo.pipeline import train

    run = tmp_path / "run"
    train(tiny_hmc(), run, progress=False, echo=None)
    (run / "diagnostics.json").unlink(missing_ok=True)
    spec = yaml.safe_load((run / "spec.yaml").read_text())
    spec["inference"]["num_samples"] = 9  # what a round to 9 draws writes before it samples
    (run / "spec.yaml").write_text(yaml.safe_dump(spec))
    row = references.progress("tiny/0", run)
    assert row.state == "sampling" and row.draws_per_chain == 4
    assert (row.iterations_done, row.iterations_asked) == (4 + 4, 4 + 9)
    assert not (run / "diagnostics.json").exists()


def test_a_live_run_before_its_first_checkpoint_reads_as_sampling_not_as_not_started(tmp_path):
    """A reference whose zoo train holds the run directory but has written no draws yet (its first warm-up
    iterations: minutes on a large set) is being sampled, with its pid; without a live writer it has not started."""
    from zoo.runs import MARKER_FILE, locked_directory

    run = tmp_path / "run"
    run.mkdir()
    assert references.progress("tiny/0", run).state == "not started"
    with locked_directory(run, "run", MARKER_FILE):
        row = references.progress("tiny/0", run)
        assert row.state == "sampling" and row.writer_pid == str(os.getpid())
        assert row.iterations_done is None and row.r_hat_max is None
    assert references.progress("tiny/0", run).state == "not started"


def test_a_reference_whose_failing_checks_draws_cannot_fix_is_stuck_and_skipped(tmp_path):
    """R-hat and ESS pass and BFMI fails (wine-quality-red split 1): the table says ``stuck`` and the budget goes to
    the next reference instead of rounds that cannot pass."""
    from tests.conftest import tiny_hmc
    from zoo.pipeline import train

    run = tmp_path / "refs" / "tiny-split00"
    train(tiny_hmc(), run, progress=False, echo=None)
    checks = [{"check": "R-hat, function space and lp (max)", "value": 1.005, "threshold": "<= 1.01", "ok": True},
              {"check": "bulk/tail ESS, function space and lp (min)", "value": 900.0, "threshold": ">= 400",
               "ok": True},
              {"check": "BFMI chain 1", "value": 0.25, "threshold": ">= 0.3", "ok": False}]
    (run / "diagnostics.json").write_text(json.dumps({"num_draws": 4, "checks": checks, "warnings": ["BFMI ..."]}))
    row = references.progress("tiny/0", run)
    assert row.state == "stuck" and row.estimated_draws_per_chain is None
    args = references.build_parser().parse_args(["--budget-minutes", "5", "--runs-dir", str(tmp_path / "refs")])
    console = Console(record=True, width=200)
    assert references.grow(args, [("tiny", 0, run)], {"tiny": []}, console) is None
    out = console.export_text()
    assert "not what more draws fix; going on with the next reference" in out and "$ zoo" not in out


@pytest.mark.slow  # a subprocess stopped by its budget (make test-slow)
def test_the_budget_stops_a_command_with_sigterm_and_says_so(tmp_path):
    child = ("import signal, sys, time\n"
             "signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\n"
             "print('started', flush=True)\n"
             "time.sleep(120)\n")
    console = Console(record=True, width=200)
    started = time.monotonic()
    code = references.run_until([sys.executable, "-c", child, "-", "x"], tmp_path / "logs" / "r.log",
                                time.monotonic() + 2, 1, console)
    assert code is None and time.monotonic() - started < 60
    assert "budget is spent" in console.export_text()
    assert (tmp_path / "logs" / "r.log").read_text().startswith("\n$ ")


@pytest.mark.slow  # kill-and-resume subprocess: ~26 s (make test-slow)
def test_sigterm_to_the_script_checkpoints_the_running_reference_which_then_reads_as_sampling(tmp_path):
    write_folder(tmp_path / "uci", "tiny", n_rows=40)
    runs = tmp_path / "refs"
    run = runs / "tiny-split00"
    argv = [sys.executable, str(REPO / "benchmarks" / "uci_references.py"), "--datasets", "tiny", "--splits", "0",
            "--data-dir", str(tmp_path / "uci"), "--runs-dir", str(runs), "--budget-minutes", "30", *TINY,
            "--set", "inference.num_samples=1000000", "--set", "inference.checkpoint_every=50"]
    job = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path, text=True)
    try:
        deadline = time.monotonic() + 180
        while not (run / "samples.pt").is_file() and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.5)
        assert (run / "samples.pt").is_file(), job.communicate()[1] if job.poll() is not None else "no draws"
        busy = references.progress("tiny/0", run)
        assert busy.state == "sampling" and busy.writer_pid not in (None, str(job.pid))  # the zoo train it runs
        job.send_signal(signal.SIGTERM)
        out, err = job.communicate(timeout=120)
    finally:
        job.kill()
    assert job.returncode == 143, err
    assert "interrupted by SIGTERM" in (runs / "logs" / "tiny-split00.log").read_text()
    assert "Traceback" not in err
    row = references.progress("tiny/0", run)
    assert row.state == "sampling" and row.writer_pid is None
    assert 0 < row.iterations_done < row.iterations_asked == 100 + 1_000_000
    assert row.estimated_hours_left > 0 and row.r_hat_max is None
    # what the next call runs: --add-draws, which finishes the cut-short run before it adds rounds
    again = references.train_command(str(references.DEFAULT_SPEC), run, "tiny", 0, "uci", [], 10, 1.0)
    assert again[-5:] == ["--add-draws", "10", "--until-converged", "--budget-minutes", "1.00"]
    once = references.train_command(str(references.DEFAULT_SPEC), run, "tiny", 0, "uci", [], None)
    assert once[-2:] == ["--no-progress", "--resume"]  # one run, resumed (benchmarks/hmc_metric_uci.py's)


@pytest.mark.slow  # the benchmark end to end: ~60 s (make test-slow)
def test_a_tiny_reference_is_grown_until_it_passes_then_left_alone(tmp_path, capsys):
    write_folder(tmp_path / "uci", "tiny", n_rows=40)
    runs, out_json = tmp_path / "refs", tmp_path / "progress.json"
    common = ["--datasets", "tiny", "--splits", "0", "--data-dir", str(tmp_path / "uci"), "--runs-dir", str(runs),
              "--spec", str(references.DEFAULT_SPEC), *TINY]
    assert references.main([*common, "--status", "--json", str(out_json)]) == references.NOT_CONVERGED_EXIT
    assert json.loads(out_json.read_text())["references"][0]["state"] == "not started"
    # 20 draws per chain miss R-hat; rounds of 300 more are added until the run passes (one round on most machines,
    # two on some: the chains' float rounding differs from CPU to CPU, and the checks' margins with it)
    code = references.main([*common, "--set", "inference.num_samples=20", "--budget-minutes", "10",
                            "--add-draws", "300", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert code == 0, (runs / "logs" / "tiny-split00.log").read_text()[-3000:]
    assert out.count("$ zoo train") == 1 and "--add-draws 300" in out  # one command: the first round, then rounds
    row = json.loads(out_json.read_text())["references"][0]
    rounds, left = divmod(row["draws_per_chain"] - 20, 300)
    assert row["state"] == "converged" and rounds >= 1 and left == 0
    assert row["iterations_done"] == 100 + row["draws_per_chain"]  # the warm-up and every draw
    assert row["r_hat_max"] <= RHAT_MAX and row["ess_min"] >= ESS_MIN and row["divergences"] == 0
    log = (runs / "logs" / "tiny-split00.log").read_text()
    assert all(f"sampling to {20 + 300 * k} draws per chain" in log for k in range(1, rounds + 1))
    assert log.count("NOT CONVERGED") == rounds  # every check failed before the last round's, which passed: no more
    assert log.rstrip().splitlines()[-1].startswith("converged")
    # converged: the next call runs nothing
    assert references.main([*common, "--set", "inference.num_samples=20", "--budget-minutes", "10"]) == 0
    assert "$ zoo train" not in capsys.readouterr().out
