"""``zoo sweep``: the space file, scoring on validation rows only, pruning, resumption, workers and the report."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import torch
import yaml

from tests.conftest import SPECS, interrupt_at, tiny_hmc
from zoo.cli import main
from zoo.errors import ZooInputError
from zoo.evaluate import ValidationMonitor
from zoo.pipeline import load_run, train
from zoo.runs import METRICS_FILE, SPEC_FILE
from zoo.spec import load_spec
from zoo.sweep import (
    BEST_SPEC_FILE,
    SWEEP_FILE,
    TRIALS_DIR,
    load_space,
    open_storage,
    parse_repeat,
    read_sweep,
    requeue_interrupted,
    sweep,
    tally,
    trial_spec,
)

# A toy sweep: 60 full-batch steps of a tiny net scored on a fifth of the toy's training rows.
TOY = {**copy.deepcopy(SPECS["toy"]), "data": {"name": "toy_gap", "validation_fraction": 0.2}}
TOY["inference"] = {**TOY["inference"], "num_steps": 60, "batch_size": None}
SPACE = {"inference.lr": {"low": 0.001, "high": 0.05, "log": True}, "prior.scale": [0.3, 1.0, 3.0]}


def run_sweep(out: Path, trials: int = 4, **kwargs):
    return sweep(TOY, kwargs.pop("space", SPACE), trials, out, progress=False, echo=None, **kwargs)


# ------------------------------------------------------------------------------------------------ the space
@pytest.mark.parametrize("space, field, pattern", [
    ({"inference.lrr": {"low": 0.001, "high": 0.1}}, "space: inference.lrr", "unknown setting"),
    ({"inference.lr": {"low": 0.1, "high": 0.1}}, "space: inference.lr", "empty or inverted"),
    ({"inference.lr": {"low": 0.1, "high": 0.01}}, "space: inference.lr", "empty or inverted"),
    ({"inference.lr": {"low": 0.0, "high": 0.1, "log": True}}, "space: inference.lr", "log-scale range needs low > 0"),
    ({"inference.lr": {"low": -1.0, "high": 0.1}}, "space: inference.lr", "spec refuses this value"),
    ({"inference.lr": {"low": 0.001}}, "space: inference.lr", "needs both low and high"),
    ({"inference.lr": {"low": 0.001, "high": 0.1, "choices": [0.1]}}, "space: inference.lr", "not both"),
    ({"inference.lr": {"choices": []}}, "space: inference.lr", "choices is empty"),
    ({"inference.lr": {"low": 0.001, "high": 0.1, "scale": "log"}}, "space: inference.lr", "unknown setting"),
    ({"inference.lr": 0.01}, "space: inference.lr", "low: .., high"),
    ({"data.validation_fraction": [0.1, 0.2]}, "space: data.validation_fraction", "holds the data and the seed"),
    ({"seed": {"low": 0, "high": 5}}, "space: seed", "holds the data and the seed"),
    ({"guide.name": ["mean_field", "mixture"]}, "space: guide.name", "spec refuses this value"),
])
def test_bad_space_is_refused_naming_the_key(space, field, pattern, tmp_path):
    with pytest.raises(ZooInputError, match=pattern) as info:
        run_sweep(tmp_path / "sweep", space=space)
    assert info.value.field == field
    assert not (tmp_path / "sweep").exists()  # refused before anything is written


def test_space_file_errors(tmp_path):
    with pytest.raises(ZooInputError, match="no such file"):
        load_space(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("inference.lr: [0.1\n")
    with pytest.raises(ZooInputError, match="not valid YAML"):
        load_space(tmp_path / "bad.yaml")
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(ZooInputError, match="mapping of spec keys"):
        load_space(tmp_path / "empty.yaml")


def test_integer_float_and_section_choices_reach_the_trial_spec():
    space = load_space({"inference.num_steps": {"low": 10, "high": 50, "step": 10},
                        "inference.lr": {"low": 0.001, "high": 0.1, "log": True},
                        "prior": {"choices": [{"name": "normal", "scale": 0.5}, {"name": "cauchy", "scale": 0.1}]}})
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(6):
        trial = study.ask()
        params = space.suggest(trial)
        assert isinstance(params["inference.num_steps"], int) and params["inference.num_steps"] % 10 == 0
        assert 0.001 <= params["inference.lr"] <= 0.1
        spec = trial_spec(TOY, params)  # applied as --set applies it, to the spec as written
        assert spec.inference.num_steps == params["inference.num_steps"]
        assert spec.prior.default.name == params["prior"]["name"]


def test_a_sweep_needs_validation_rows(tmp_path):
    no_validation = {**TOY, "data": {"name": "toy_gap"}}
    with pytest.raises(ZooInputError, match="never on the test rows") as info:
        sweep(no_validation, SPACE, 3, tmp_path / "sweep", progress=False, echo=None)
    assert info.value.field == "data.validation_fraction"


@pytest.mark.parametrize("url", ["sqlite:////no/such/directory/study.db", "postgresql://zoo@127.0.0.1:9/none",
                                 "nosuchdialect://x/y"])
def test_a_storage_that_cannot_be_opened_is_refused(url, tmp_path):
    with pytest.raises(ZooInputError, match="cannot be opened") as info:
        open_storage(url, tmp_path)
    assert info.value.field == "--storage"


def test_an_rdb_storage_holds_the_study(tmp_path):
    """An RDB URL (here SQLite; PostgreSQL or MySQL for several machines) instead of the journal file."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    result = run_sweep(tmp_path / "sweep", trials=2, storage=url, study_name="toy")
    assert not (tmp_path / "sweep" / "study.log").exists()
    assert len(optuna.load_study(study_name="toy", storage=url).trials) == len(result.trials) == 2
    assert [t.number for t in read_sweep(tmp_path / "sweep").trials] == [0, 1]


def test_bad_command_line_exits_2(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(TOY))
    space = tmp_path / "space.yaml"
    space.write_text("inference.lr: {low: 0.1, high: 0.01}\n")
    code = main(["sweep", str(spec), "--space", str(space), "--trials", "3", "--out", str(tmp_path / "s")])
    assert code == 2
    err = capsys.readouterr().err
    assert "space: inference.lr" in err and "inverted" in err and "Traceback" not in err
    code = main(["sweep", str(spec), "--space", str(space), "--trials", "0", "--out", str(tmp_path / "s")])
    assert code == 2 and "--trials" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ the monitor
def test_a_monitored_fit_takes_the_same_steps(tmp_path, spec_factory):
    """Scoring the validation rows mid-fit draws from its own stream: the fitted guide is bit-identical."""
    spec = load_spec(TOY)
    scores = []
    monitor = ValidationMonitor("test_ll", lambda k, v: scores.append((k, v)), 10, seed=0, reports=10)
    plain = train(spec, tmp_path / "plain", progress=False, echo=None)
    watched = train(spec, tmp_path / "watched", progress=False, echo=None, monitor=monitor)
    assert [k for k, _ in scores] == list(range(1, 11))
    _, _, a = load_run(plain.run_dir)
    _, _, b = load_run(watched.run_dir)
    for (name, p), (_, q) in zip(a.guide.named_parameters(), b.guide.named_parameters(), strict=True):
        assert torch.equal(p, q), name
    assert plain.metrics == {**watched.metrics, "train_seconds": plain.metrics["train_seconds"]}


def test_a_monitor_can_stop_a_fit(tmp_path):
    class Stop(Exception):
        pass

    def stop(k, value):
        if k == 3:
            raise Stop

    with pytest.raises(Stop):
        train(load_spec(TOY), tmp_path / "run", progress=False, echo=None,
              monitor=ValidationMonitor("test_ll", stop, 5))


def test_mcmc_and_laplace_fits_score_once_at_the_end(tmp_path):
    scores = []
    spec = load_spec({**tiny_hmc(), "data": {"name": "toy_gap", "n_train": 20, "validation_fraction": 0.2}})
    train(spec, tmp_path / "hmc", progress=False, echo=None,
          monitor=ValidationMonitor("test_ll", lambda k, v: scores.append(k), 5, reports=10))
    assert scores == [10]


# ------------------------------------------------------------------------------------------------ sweeps
def test_sweep_scores_validation_rows_and_writes_the_best_spec(tmp_path):
    result = run_sweep(tmp_path / "sweep", trials=4)
    assert len(result.trials) == 4 and result.best is not None
    out = tmp_path / "sweep"
    best_run = out / TRIALS_DIR / f"{result.best.number:04d}"
    metrics = json.loads((best_run / METRICS_FILE).read_text())
    assert metrics["test_ll"] == pytest.approx(result.best.value)
    trial = load_spec(best_run / SPEC_FILE)
    assert trial.data.validation_fraction == 0.2  # every trial is scored on validation rows
    assert trial.inference.lr == pytest.approx(result.best.params["inference.lr"])
    best = load_spec(out / BEST_SPEC_FILE)
    assert best.data.validation_fraction == 0.0  # ready for the test split
    assert best.inference.lr == trial.inference.lr and best.prior == trial.prior
    record = json.loads((out / SWEEP_FILE).read_text())
    assert record["metric"] == "test_ll" and record["direction"] == "maximize"
    assert [t["number"] for t in record["trials"]] == [0, 1, 2, 3]
    assert (out / "trials.png").stat().st_size > 0


def test_the_validation_rows_are_never_the_test_rows(tmp_path):
    """A trial's metrics are those of the validation carve, not of the test split."""
    from zoo.data import load_dataset

    spec = load_spec(TOY)
    validation = load_dataset(spec.data, spec.seed)
    test = load_dataset(load_spec(TOY, "data.validation_fraction=0").data, spec.seed)
    assert len(validation.y_test) != len(test.y_test) or not torch.equal(validation.x_test, test.x_test)
    assert len(validation.y_train) + len(validation.y_test) == len(test.y_train)


def test_an_interrupted_sweep_continues_where_it_stopped(tmp_path, monkeypatch):
    out = tmp_path / "sweep"
    run_sweep(out, trials=2)
    interrupt_at(monkeypatch, 30)  # the third trial is interrupted mid-fit
    with pytest.raises(KeyboardInterrupt, match="run the same command again"):
        run_sweep(out, trials=5)
    monkeypatch.undo()
    stopped = read_sweep(out).trials
    assert [t.state for t in stopped] == ["complete", "complete", "fail"]
    result = run_sweep(out, trials=5)
    states = [t.state for t in result.trials]
    assert states.count("complete") + states.count("pruned") == 5
    rerun = next(t for t in result.trials if "reruns trial 2" in t.note)
    assert rerun.params == stopped[2].params  # the interrupted settings ran again
    again = run_sweep(out, trials=5)  # finished: nothing more runs
    assert len(again.trials) == len(result.trials)


def test_a_killed_sweeps_running_trial_runs_again(tmp_path):
    """A trial left RUNNING by a killed process (its pid is gone) is failed and its settings queued again."""
    out = tmp_path / "sweep"
    run_sweep(out, trials=1)
    study = optuna.load_study(study_name="zoo-sweep", storage=open_storage(None, out))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    trial = study.ask({"inference.lr": optuna.distributions.FloatDistribution(0.001, 0.05, log=True),
                       "prior.scale": optuna.distributions.CategoricalDistribution([0.3, 1.0, 3.0])})
    for key, value in {"out": str(out.resolve()), "host": os.uname().nodename, "pid": dead.pid}.items():
        trial.set_user_attr(key, value)
    assert tally(study).running == 1
    assert requeue_interrupted(study, out) == [trial.number]
    assert tally(study).running == 0
    result = run_sweep(out, trials=2)
    assert any(f"reruns trial {trial.number}" in t.note for t in result.trials)


def test_a_different_spec_cannot_join_a_sweep(tmp_path):
    out = tmp_path / "sweep"
    run_sweep(out, trials=1)
    with pytest.raises(ZooInputError, match="another space"):
        run_sweep(out, trials=2, space={"inference.lr": {"low": 0.001, "high": 0.01}})
    with pytest.raises(ZooInputError, match="another spec"):
        sweep(TOY, SPACE, 2, out, overrides=["inference.num_steps=70"], progress=False, echo=None)


def test_a_repeated_key_scores_each_trial_by_the_mean_of_its_fits(tmp_path):
    out = tmp_path / "sweep"
    result = run_sweep(out, trials=2, repeat=("seed", [0, 1]))
    for trial in result.trials:
        fits = [json.loads((out / TRIALS_DIR / f"{trial.number:04d}" / f"repeat{r}" / METRICS_FILE).read_text())
                for r in (0, 1)]
        assert trial.value == pytest.approx((fits[0]["test_ll"] + fits[1]["test_ll"]) / 2)
        assert [load_spec(out / TRIALS_DIR / f"{trial.number:04d}" / f"repeat{r}" / SPEC_FILE).seed
                for r in (0, 1)] == [0, 1]
    assert json.loads((out / SWEEP_FILE).read_text())["repeat"] == {"seed": [0, 1]}
    assert load_spec(out / BEST_SPEC_FILE).seed == 0  # the base spec's own value
    with pytest.raises(ZooInputError, match="another repeat"):
        run_sweep(out, trials=3, repeat=("seed", [0, 2]))


@pytest.mark.parametrize("repeat, pattern", [
    (("inference.lr", [0.01, 0.02]), "also a key of the space"),
    (("seed", [3, 3]), "two or more distinct values"),
    (("data.split", [0, 1]), "spec refuses this value"),
])
def test_bad_repeats_are_refused(repeat, pattern, tmp_path):
    with pytest.raises(ZooInputError, match=pattern) as info:
        run_sweep(tmp_path / "sweep", repeat=repeat)
    assert info.value.field == "--repeat"


@pytest.mark.parametrize("text", ["seed", "seed=1", "=1,2"])
def test_parse_repeat_refuses(text):
    with pytest.raises(ZooInputError, match="KEY=V1,V2"):
        parse_repeat(text)
    assert parse_repeat("data.split=0,1,2") == ("data.split", [0, 1, 2])


def test_diverging_trials_fail_without_stopping_the_sweep(tmp_path):
    result = run_sweep(tmp_path / "sweep", trials=3, space={"inference.lr": {"low": 1e6, "high": 1e7, "log": True}})
    assert all(t.state == "fail" and "TrainingDiverged" in t.note for t in result.trials)
    assert result.best is None


@pytest.mark.parametrize("dimension, value, side", [
    ({"low": 0.001, "high": 0.1, "log": True}, 0.1, "high"),
    ({"low": 0.001, "high": 0.1, "log": True}, 0.00125, "low"),  # 4.8% of the way on the log scale
    ({"low": 0.001, "high": 0.1, "log": True}, 0.0013, None),   # 5.7%: inside
    ({"low": 0.001, "high": 0.1, "log": True}, 0.05, None),     # 85% on the log scale, though 50% on the linear one
    ({"low": 200, "high": 1000, "step": 100}, 1000, "high"),
    ({"low": 200, "high": 1000, "step": 100}, 900, None),
    ({"low": 200, "high": 1000, "step": 100}, 200, "low"),
    ({"choices": [0.3, 1.0, 3.0]}, 3.0, None),
])
def test_a_best_value_at_the_end_of_its_range_is_an_edge(dimension, value, side):
    space = load_space({"inference.lr": dimension})
    assert space.dimensions["inference.lr"].edge(value) == side
    edges = space.edges({"inference.lr": value})
    assert list(edges) == ([] if side is None else ["inference.lr"])
    if side:
        assert f"at the {side} end of its range" in edges["inference.lr"]
        assert ("lower low" if side == "low" else "raise high") in edges["inference.lr"]


def test_a_sweep_says_when_its_best_setting_is_at_an_edge(tmp_path, capsys):
    """A range of two integers puts every best value at an edge: the sweep, best.yaml and the report all say so."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(TOY))
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({**SPACE, "inference.num_steps": {"low": 59, "high": 60}}))
    out = tmp_path / "sweep"
    assert main(["sweep", str(spec), "--space", str(space), "--trials", "2", "--out", str(out), "--no-progress"]) == 0
    said = capsys.readouterr().out
    assert "note: the best inference.num_steps" in said and "in the space file and sweep again" in said
    assert "# Note: the best inference.num_steps" in (out / BEST_SPEC_FILE).read_text()
    assert "inference.num_steps" in read_sweep(out).edges
    assert main(["report", str(out), "--out", str(tmp_path / "reports" / "trials.md")]) == 0
    assert "note: the best inference.num_steps" in capsys.readouterr().out

    # Several sweeps: one row each, with the keys at an edge.
    other = tmp_path / "other"
    assert main(["sweep", str(spec), "--space", str(space), "--trials", "2", "--out", str(other), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["report", str(out), str(other), "--out", str(tmp_path / "reports" / "sweeps.md")]) == 0
    assert "2 sweeps; 2 chose a setting at an edge of its range" in capsys.readouterr().out
    table = [line for line in (tmp_path / "reports" / "sweeps.md").read_text().splitlines() if line.startswith("|")]
    assert table[0] == "| sweep | trials | pruned | failed | best | settings | at edge | seconds |"
    assert [row.split(" | ")[0] for row in table[2:]] == [f"| {out}", f"| {other}"]
    assert all("inference.num_steps" in row.split(" | ")[6] for row in table[2:])


@pytest.mark.slow  # two worker processes: ~21 s (make test-slow)
def test_two_workers_share_one_study_and_the_report_reads_it(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(TOY))
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(SPACE))
    out = tmp_path / "sweep"
    code = main(["sweep", str(spec), "--space", str(space), "--trials", "4", "--out", str(out), "--workers", "2",
                 "--no-progress"])
    assert code == 0
    result = read_sweep(out)
    assert len([t for t in result.trials if t.state in ("complete", "pruned")]) >= 4
    assert {t.params["prior.scale"] for t in result.trials} <= {0.3, 1.0, 3.0}
    assert len({os.path.basename(str(t.number)) for t in result.trials}) == len(result.trials)
    capsys.readouterr()
    reports = tmp_path / "reports"
    assert main(["report", str(out), "--out", str(reports / "trials.md")]) == 0
    table = [line for line in (reports / "trials.md").read_text().splitlines() if line.startswith("|")]
    assert table[0].startswith("| trial | state | test_ll | inference.lr | prior.scale |")
    assert "(best)" in table[2]
    assert (reports / "trials.csv").exists() and (reports / "trials.png").exists()
    assert main(["report", str(out), str(out / TRIALS_DIR / "0000"), "--out", str(reports / "x.md")]) == 2


@pytest.mark.slow  # worker processes killed: ~18 s (make test-slow)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's prctl")
def test_workers_stop_when_the_sweep_process_is_killed(tmp_path):
    """kill -9 of `zoo sweep` leaves no worker running its trial to the end: each gets SIGTERM from the kernel."""
    import signal
    import time

    spec, space = tmp_path / "spec.yaml", tmp_path / "space.yaml"
    slow = {**TOY, "inference": {**TOY["inference"], "num_steps": 200000}}
    spec.write_text(yaml.safe_dump(slow))
    space.write_text(yaml.safe_dump(SPACE))
    job = subprocess.Popen([sys.executable, "-m", "zoo.cli", "sweep", str(spec), "--space", str(space), "--trials",
                            "4", "--out", str(tmp_path / "sweep"), "--workers", "2", "--no-progress"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    workers: list[int] = []
    while time.time() < deadline and len(workers) < 2:
        time.sleep(0.5)
        found = subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True, text=True).stdout.split()
        workers = [int(w) for w in found if "spawn_main" in Path(f"/proc/{w}/cmdline").read_text(errors="ignore")]
    assert len(workers) == 2
    trials = tmp_path / "sweep" / TRIALS_DIR
    while time.time() < deadline and len(list(trials.glob("*/train.log"))) < 2:  # both workers are in a trial
        time.sleep(0.5)
    assert len(list(trials.glob("*/train.log"))) == 2
    job.send_signal(signal.SIGKILL)
    job.wait()
    deadline = time.time() + 60
    while time.time() < deadline and any(Path(f"/proc/{w}").exists() for w in workers):
        time.sleep(0.5)
    assert not any(Path(f"/proc/{w}").exists() and "zombie" not in Path(f"/proc/{w}/status").read_text()
                   .lower() for w in workers)


# ------------------------------------------------------------------------------------------------ issue 39
# SGLD on the toy, fast: a burn-in longer than its 10 epochs leaves no draw to keep, which the fit refuses
# (a ZooInputError raised while the trial fits, not by the spec: the space check lets those values through).
SGLD_TOY = {**copy.deepcopy(TOY), "inference": {"method": "sgld", "num_chains": 2, "epochs": 10, "batch_size": 32,
                                                 "lr": 0.01, "burn_in_epochs": 2.0, "thin": 1,
                                                 "predictive_samples": 10}}


def test_fit_time_refusals_are_failed_trials_counted_and_a_lone_survivor_is_flagged(tmp_path, capsys):
    spec, space, out = tmp_path / "spec.yaml", tmp_path / "space.yaml", tmp_path / "sweep"
    spec.write_text(yaml.safe_dump(SGLD_TOY))
    space.write_text("inference.burn_in_epochs: [0.0, 100.0, 200.0, 300.0]\n")
    code = main(["sweep", str(spec), "--space", str(space), "--trials", "5", "--out", str(out), "--no-progress"])
    said = capsys.readouterr()
    assert code == 0, said.err  # the refusals did not stop the sweep
    rows = read_sweep(out).trials
    refused = [t for t in rows if t.params["inference.burn_in_epochs"] >= 10]
    assert len(rows) == 5 and all(t.state == "fail" and "leaves no draw to keep" in t.note for t in refused)
    complete = [t for t in rows if t.state == "complete"]
    assert len(complete) == 1 and len(refused) == 4  # the scenario: one survivor of four failures
    assert f"5 trial(s): 1 complete, 0 pruned, {len(refused)} failed ({len(refused)} refused while fitting)" in said.out
    assert f"warning: the best trial ({complete[0].number}) is the only one of 5 finished trials" in said.err
    assert "not the best of a search" in (out / BEST_SPEC_FILE).read_text().split("\ndata:")[0]
    record = json.loads((out / SWEEP_FILE).read_text())
    assert record["counts"]["complete"] == 1 and record["counts"]["failed"] == 4
    assert record["failures"] == {"refused while fitting": 4}
    assert any("only one of 5 finished trials" in c for c in record["caveats"])


def test_a_sweep_without_failures_raises_no_caveat(tmp_path):
    result = run_sweep(tmp_path / "sweep", trials=2)
    assert result.counts["complete"] == 2 and result.counts["failed"] == 0 and result.caveats == []
    assert "# Note" not in (tmp_path / "sweep" / BEST_SPEC_FILE).read_text()


@pytest.mark.parametrize("env, torch_threads, flag, expected", [
    ({"OMP_NUM_THREADS": "1"}, 1, None, 1),   # the issue: OMP_NUM_THREADS=1 was overridden by cores / workers
    ({"OMP_NUM_THREADS": "2"}, 1, None, 2),   # the variable wins over torch's current count
    ({}, 1, None, 1),                         # torch.set_num_threads(1) in the user's own process
    ({}, 1, 3, 3),                            # --threads
])
def test_the_users_thread_setting_is_kept(env, torch_threads, flag, expected, tmp_path, monkeypatch):
    from zoo import pipeline

    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)  # a machine whose cores would give another count
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    seen, real = [], pipeline.train

    def watched(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "train", watched)
    torch.set_num_threads(torch_threads)
    try:
        run_sweep(tmp_path / "sweep", trials=1, threads=flag)
        assert torch.get_num_threads() == torch_threads  # the process's own setting is back afterwards
    finally:
        torch.set_num_threads(1)
    assert seen == [expected]
    assert json.loads((tmp_path / "sweep" / SWEEP_FILE).read_text())["threads"] == expected


@pytest.mark.parametrize("env, torch_threads, workers, cores, expected", [
    ({}, 8, 2, 8, (4, "8 cores / 2 workers")),           # torch's default: the cores are shared
    ({}, 1, 2, 8, (1, "this process's torch threads")),   # the user's torch.set_num_threads(1)
    ({"OMP_NUM_THREADS": "3"}, 8, 2, 8, (3, "OMP_NUM_THREADS=3")),
    ({"MKL_NUM_THREADS": "2"}, 8, 4, 8, (2, "MKL_NUM_THREADS=2")),
])
def test_threads_for_several_workers(env, torch_threads, workers, cores, expected, monkeypatch):
    from zoo.sweep import choose_threads

    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    torch.set_num_threads(torch_threads)
    try:
        assert choose_threads(None, workers, cores) == expected
        assert choose_threads(5, workers, cores) == (5, "--threads")
    finally:
        torch.set_num_threads(1)


GIB = 2**30


@pytest.mark.parametrize("asked, left, cores, memory, per_worker, used, reason", [
    (24, 2, 16, 64 * GIB, GIB // 2, 2, "only 2 trial(s) are left to run"),
    (24, 100, 16, 64 * GIB, GIB // 2, 16, "gives the sweep 16 core(s)"),
    (24, 100, 64, 9 * GIB, GIB, 9, "9.0 GiB of memory is available and each worker takes about 1.0 GiB"),
    (24, 2, 2, 9 * GIB, GIB, 2, "only 2 trial(s) are left to run; this machine gives the sweep 2 core(s)"),
    (4, 0, 8, None, GIB, 1, "no trial is left to run"),
    (2, 5, 8, None, GIB, 2, None),  # nothing to cap; unknown memory caps nothing
])
def test_workers_are_capped_by_trials_cores_and_memory(asked, left, cores, memory, per_worker, used, reason):
    from zoo.sweep import cap_workers

    n, why = cap_workers(asked, left, cores, memory, per_worker)
    assert n == used
    assert (why is None) if reason is None else (reason in why and why.startswith(f"--workers {asked}: starting"))


def test_workers_beyond_the_trials_left_are_not_started(tmp_path, capsys):
    """The issue: --workers 24 for 2 trials started 24 processes. One trial left: one worker, in this process."""
    spec, space, out = tmp_path / "spec.yaml", tmp_path / "space.yaml", tmp_path / "sweep"
    spec.write_text(yaml.safe_dump(TOY))
    space.write_text(yaml.safe_dump(SPACE))
    code = main(["sweep", str(spec), "--space", str(space), "--trials", "1", "--out", str(out), "--workers", "24",
                 "--no-progress"])
    said = capsys.readouterr()
    assert code == 0, said.err
    assert "warning: --workers 24: starting 1 worker(s), as only 1 trial(s) are left to run" in said.err
    assert "1 worker(s) x" in said.out
    assert json.loads((out / SWEEP_FILE).read_text())["workers"] == 1


def test_with_a_shared_storage_best_yaml_comes_from_the_whole_study_and_running_trials_are_named(tmp_path):
    """The issue: the sweep that ended first wrote best.yaml while a better trial still ran. Here another machine's
    trial completed with a better score, and another one still runs, when this sweep ends."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    from zoo.errors import ZooWarning

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    first = run_sweep(tmp_path / "a", trials=2, storage=url, study_name="shared")
    study = optuna.load_study(study_name="shared", storage=url)
    dists = {"inference.lr": FloatDistribution(0.001, 0.05, log=True),
             "prior.scale": CategoricalDistribution([0.3, 1.0, 3.0])}
    better = max(t.value for t in first.trials) + 1.0
    study.add_trial(optuna.trial.create_trial(params={"inference.lr": 0.0123, "prior.scale": 3.0},
                                              distributions=dists, value=better,
                                              user_attrs={"out": "/elsewhere/b", "host": "other-machine"}))
    running = study.ask(dists)
    running.set_user_attr("host", "other-machine")
    with pytest.warns(ZooWarning, match=r"1 trial\(s\) of study 'shared' are still running"):
        result = run_sweep(tmp_path / "c", trials=3, storage=url, study_name="shared")
    assert result.best.number == 2 and result.best.value == pytest.approx(better)
    best = (tmp_path / "c" / BEST_SPEC_FILE).read_text()
    assert load_spec(tmp_path / "c" / BEST_SPEC_FILE).inference.lr == pytest.approx(0.0123)
    assert f"# The best of 3 complete trials of study 'shared' in {url}: trial 2" in best
    assert "# Note: 1 trial(s) of study 'shared' are still running" in best and "run the same command again" in best
    record = json.loads((tmp_path / "c" / SWEEP_FILE).read_text())
    assert record["counts"]["running"] == 1 and record["counts"]["complete"] == 3
    assert not (tmp_path / "c" / TRIALS_DIR).exists()  # the study had its trials: this process ran none


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 2-trial sweep (made by the zoo command in a process of its own, so that its trials' process is
    gone, as after any real sweep) and a finished run, made once; each case works on a copy."""
    root = tmp_path_factory.mktemp("finished")
    (root / "in").mkdir()
    (root / "in" / "spec.yaml").write_text(yaml.safe_dump(TOY))
    (root / "in" / "space.yaml").write_text(yaml.safe_dump(SPACE))
    subprocess.run([sys.executable, "-m", "zoo.cli", "sweep", str(root / "in" / "spec.yaml"), "--space",
                    str(root / "in" / "space.yaml"), "--trials", "2", "--out", str(root / "sweep"), "--no-progress"],
                   check=True, capture_output=True, cwd=Path(__file__).resolve().parents[1],
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    train(load_spec(TOY, "data.validation_fraction=0"), root / "run", progress=False, echo=None)
    return root


def _journal_lines(root: Path) -> list[bytes]:
    return (root / "sweep" / "study.log").read_bytes().splitlines(keepends=True)


def _cut_off(root: Path) -> None:
    """The journal as a crash leaves it: its last record half written."""
    log = root / "sweep" / "study.log"
    os.truncate(log, log.stat().st_size - 10)


def _corrupt(root: Path) -> None:
    lines = _journal_lines(root)
    (root / "sweep" / "study.log").write_bytes(b"".join([*lines[:2], b"this is not a record\n", *lines[3:]]))


def _cut_short(root: Path) -> None:
    """The journal cut back to before the second trial's first record: trials/0001 is a run it does not know."""
    lines = _journal_lines(root)
    second = [i for i, line in enumerate(lines) if json.loads(line)["op_code"] == 4][1]  # 4: create a trial
    (root / "sweep" / "study.log").write_bytes(b"".join(lines[:second]))


def _space(text: bytes):
    def prepare(root: Path) -> None:
        (root / "in" / "space.yaml").write_bytes(text)
    return prepare


def _sweep_to(out: str, trials: int = 3) -> list[str]:
    return ["sweep", "{in}/spec.yaml", "--space", "{in}/space.yaml", "--trials", str(trials), "--out", out,
            "--no-progress"]


REFUSALS = {  # case: (prepare the copy, the command, what the message says)
    "space range with an infinite end": (_space(b"inference.lr: {low: 0.001, high: .inf, log: true}\n"),
                                         _sweep_to("{root}/new"), ["space: inference.lr", "high is inf", "finite"]),
    "space range wider than a float": (_space(b"inference.lr: {low: -1.0e+308, high: 1.0e+308}\n"),
                                       _sweep_to("{root}/new"), ["space: inference.lr", "wider than a float"]),
    "float ends on an integer key": (_space(b"inference.num_steps: {low: 10.0, high: 60.0}\n"),
                                     _sweep_to("{root}/new"),
                                     ["space: inference.num_steps", "whole numbers", "low: 10, high: 60"]),
    "space file not UTF-8": (_space(b"# caf\xe9\ninference.lr: {low: 0.001, high: 0.1}\n"), _sweep_to("{root}/new"),
                             ["--space", "space.yaml", "is not UTF-8", "save it as UTF-8"]),
    "sweep into a run": (None, _sweep_to("{root}/run"), ["holds a run", "spec.yaml", "never share a directory"]),
    "sweep inside a run": (None, _sweep_to("{root}/run/sweep"), ["lies inside the run directory", "never share"]),
    "sweep into a folder with a sweep.json of the user's": (
        lambda root: (root / "mine").mkdir() or (root / "mine" / "sweep.json").write_text("{}"),
        _sweep_to("{root}/mine"), ["holds files that are not a zoo sweep (sweep.json)"]),
    "run into a sweep": (None, ["train", "{in}/spec.yaml", "--out", "{root}/sweep", "--no-progress"],
                         ["is the sweep directory", "never share a directory"]),
    "run inside a sweep": (None, ["train", "{in}/spec.yaml", "--out", "{root}/sweep/best", "--no-progress"],
                           ["lies inside the sweep directory", "never share a directory"]),
    "study.log cut off": (_cut_off, _sweep_to("{root}/sweep"),
                          ["study.log ends in a cut-off record", "truncate -s", "no --resume"]),
    "study.log corrupt": (_corrupt, _sweep_to("{root}/sweep"),
                          ["study.log is corrupt: line 3", "from a backup", "no --resume"]),
    "study.log lost": (lambda root: (root / "sweep" / "study.log").unlink(), _sweep_to("{root}/sweep"),
                       ["holds no study 'zoo-sweep'", "lost or was replaced", "no --resume", "new --out"]),
    "study.log cut short": (_cut_short, _sweep_to("{root}/sweep"),
                            ["holds the runs of trial(s) 0001", "does not record", "0001.lost", "no --resume"]),
    "report of a corrupt study": (_corrupt, ["report", "{root}/sweep", "--out", "{root}/reports/trials.md"],
                                  ["study.log is corrupt: line 3"]),
}


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for a folder), less the OS lock files (which hold a pid)."""
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
            for p in sorted(root.rglob("*")) if not p.name.endswith(".lock")}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals_exit_2_naming_the_fix_and_touch_nothing(case, finished, tmp_path, capsys):
    import shutil

    root = tmp_path / "w"
    shutil.copytree(finished, root, symlinks=True)
    prepare, argv, patterns = REFUSALS[case]
    if prepare is not None:
        prepare(root)
    before = _tree(root)
    code = main([a.replace("{in}", str(root / "in")).replace("{root}", str(root)) for a in argv])
    said = capsys.readouterr()
    assert code == 2, said
    err = " ".join(said.err.split())  # one paragraph, however the console wrapped it
    assert err.startswith("error: ") and "Traceback" not in said.out + said.err
    for pattern in patterns:
        assert pattern in err, (pattern, err)
    assert _tree(root) == before  # nothing written, created or removed


def test_the_advised_fixes_let_a_cut_off_or_cut_short_sweep_go_on(finished, tmp_path, capsys):
    import re
    import shutil

    root = tmp_path / "w"
    shutil.copytree(finished, root, symlinks=True)
    argv = [a.replace("{in}", str(root / "in")).replace("{root}", str(root)) for a in _sweep_to("{root}/sweep", 3)]
    _cut_off(root)  # the last record (trial 1 completing) is half written
    assert main(argv) == 2
    size, path = re.search(r"truncate -s (\d+) (\S+);", " ".join(capsys.readouterr().err.split())).groups()
    os.truncate(path, int(size))
    assert main(argv) == 0, capsys.readouterr().err
    rows = read_sweep(root / "sweep").trials
    assert any("reruns trial 1" in t.note for t in rows)  # the trial whose end was lost ran again
    assert [t.state for t in rows].count("complete") == 3

    shutil.rmtree(root)
    shutil.copytree(finished, root, symlinks=True)
    _cut_short(root)
    assert main(argv) == 2
    moved = re.search(r"mv (\S+) (\S+)\)", " ".join(capsys.readouterr().err.split())).groups()
    os.rename(*moved)
    assert main(argv) == 0, capsys.readouterr().err
    assert [t.state for t in read_sweep(root / "sweep").trials] == ["complete"] * 3


def test_a_sweep_from_before_its_marker_continues_and_is_then_refused_as_a_run(finished, tmp_path):
    """Sweeps used to be claimed as runs (the run marker beside sweep.json): such a sweep continues, and from then on
    carries the sweep marker, so that zoo train (the CLI or the Python API) refuses its directory."""
    import shutil

    from zoo.runs import MARKER_FILE, SWEEP_MARKER

    out = tmp_path / "sweep"
    shutil.copytree(finished / "sweep", out)
    (out / SWEEP_MARKER).unlink()
    (out / MARKER_FILE).write_text('{"zoo_run": 1}')
    with pytest.raises(ZooInputError, match="not a zoo run"):  # the API's claim: its files are no run's
        train(load_spec(TOY), out / TRIALS_DIR, progress=False, echo=None)
    again = sweep(finished / "in" / "spec.yaml", finished / "in" / "space.yaml", 2, out, progress=False, echo=None)
    assert len(again.trials) == 2  # the same command: the sweep had finished, so no trial ran
    assert (out / SWEEP_MARKER).is_file() and not (out / MARKER_FILE).exists()
    with pytest.raises(ZooInputError, match="not a zoo run"):
        train(load_spec(TOY), out, progress=False, echo=None)
