"""Run directories that cannot be mixed up or lost: the writer's lock, SIGTERM, corrupt files, OS errors, file modes.

The CLI's exits are checked in subprocesses where a second process or the process's own end is the point, in-process
where the exit code and message are (a real signal then comes from a watcher thread, :func:`signal_when`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import signal
import stat
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml

import zoo.pipeline as pipeline
import zoo.runs as runs
from tests.conftest import interrupt_at, sigterm_ends_cleanly, tiny_hmc
from zoo import bnn as bnn_module
from zoo.cli import main
from zoo.errors import ZooInputError, ZooWarning
from zoo.inference.draws import SAMPLES_FILE
from zoo.inference.swag import SWAG_FILE
from zoo.interrupts import Interrupted, deferred_interrupt
from zoo.runs import (
    CHECKPOINT_FILE,
    LOCK_FILE,
    METRICS_FILE,
    SPEC_FILE,
    load_checkpoint,
    previous_version,
    save_checkpoint,
)
from zoo.spec import load_spec

REPO = Path(__file__).resolve().parents[1]
TINY = {
    "data": {"name": "toy_gap"},
    "net": {"hidden": [4]},
    "inference": {"num_steps": 6, "batch_size": 32, "predictive_samples": 3, "checkpoint_every": 2},
    "device": "cpu",
}
HMC = tiny_hmc()


def write_spec(path: Path, tree: dict | None = None, **inference) -> Path:
    spec = yaml.safe_load(yaml.safe_dump(tree or TINY))
    spec["inference"].update(inference)
    path.write_text(yaml.safe_dump(spec))
    return path


def zoo(*argv: str) -> list[str]:
    return [sys.executable, "-m", "zoo.cli", *argv]


def child_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def wait_for(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def exit_and_error(capsys, argv: list[str]) -> tuple[int, str]:
    code = main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return code, captured.err.strip()


def train_argv(spec: Path, out: Path, *extra: str) -> list[str]:
    return ["train", str(spec), "--out", str(out), "--no-progress", *extra]


# ------------------------------------------------------------------------- 1. one writer per run directory
def test_a_second_zoo_train_on_the_same_out_is_refused_and_sigterm_checkpoints_the_first(tmp_path, capsys):
    """Two ``zoo train`` on one --out: the second exits 2 naming the first's pid and writes nothing; SIGTERM then
    stops the first at a step boundary with exit 143, a checkpoint (none existed before) and the resume command."""
    spec = write_spec(tmp_path / "spec.yaml", num_steps=200_000, checkpoint_every=1_000_000)
    out = tmp_path / "run"
    first = subprocess.Popen(zoo(*train_argv(spec, out)), cwd=REPO, env=child_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        log = out / "train.log"
        wait_for(lambda: log.exists() and "KL analytic" in log.read_text(), "the first run's training to start")
        assert (out / LOCK_FILE).read_text() == str(first.pid)
        spec_before = (out / SPEC_FILE).read_text()

        code, err = exit_and_error(capsys, train_argv(write_spec(tmp_path / "other.yaml", lr=0.5), out))
        assert code == 2 and f"another zoo process (pid {first.pid}) is writing this run directory" in err
        assert (out / SPEC_FILE).read_text() == spec_before and not (out / CHECKPOINT_FILE).exists()
    except BaseException:
        first.kill()
        raise
    stderr = sigterm_ends_cleanly(first)
    assert f"zoo train {spec} --out {out} --resume" in stderr
    state = load_checkpoint(out / CHECKPOINT_FILE)
    assert 0 < state["step"] < 200_000 and not state["done"]
    assert f"interrupted at step {state['step']}; checkpoint saved" in (out / "train.log").read_text()


def test_a_lock_held_by_a_killed_process_is_released(tmp_path, capsys):
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from zoo.runs import claimed_run_directory; "
         "claim = claimed_run_directory(sys.argv[1]); claim.__enter__(); print('held', flush=True); time.sleep(600)",
         str(out)], cwd=REPO, env=child_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code, err = exit_and_error(capsys, train_argv(write_spec(tmp_path / "spec.yaml"), out))
        assert code == 2 and f"pid {holder.pid}" in err
    finally:
        holder.kill()
        holder.wait()
    assert main(train_argv(write_spec(tmp_path / "spec.yaml"), out)) == 0  # kill -9 released the lock


@pytest.mark.slow  # kill -9 and resume in subprocesses: ~22 s (make test-slow)
def test_kill_9_keeps_the_last_checkpoint_and_resume_is_bit_exact(tmp_path):
    spec = write_spec(tmp_path / "spec.yaml", num_steps=1500, checkpoint_every=50)
    out = tmp_path / "killed"
    victim = subprocess.Popen(zoo(*train_argv(spec, out)), cwd=REPO, env=child_env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (out / CHECKPOINT_FILE).exists(), "the first checkpoint")
        victim.kill()
        assert victim.wait(timeout=60) == -signal.SIGKILL
    finally:
        victim.kill()
    reached = load_checkpoint(out / CHECKPOINT_FILE)["step"]
    assert 50 <= reached < 1500 and reached % 50 == 0
    assert main(train_argv(spec, out, "--resume")) == 0
    assert main(train_argv(spec, tmp_path / "whole")) == 0
    resumed, whole = (load_checkpoint(d / CHECKPOINT_FILE)["guide"] for d in (out, tmp_path / "whole"))
    assert resumed.keys() == whole.keys() and all(torch.equal(resumed[k], whole[k]) for k in whole)


# ------------------------------------------------------------------------- 2. never the user's own files
@pytest.mark.parametrize("resume", [False, True], ids=["new", "resume"])
def test_a_directory_of_the_users_own_files_is_refused_untouched(tmp_path, capsys, resume):
    out = tmp_path / "mine"
    out.mkdir()
    (out / SPEC_FILE).write_text("my notes\n")
    (out / METRICS_FILE).write_text('{"mine": 1}\n')
    argv = train_argv(write_spec(tmp_path / "spec.yaml"), out, *(["--resume"] if resume else []))
    code, err = exit_and_error(capsys, argv)
    assert code == 2 and "holds files that are not a zoo run (metrics.json, spec.yaml)" in err
    assert sorted(p.name for p in out.iterdir()) == [METRICS_FILE, SPEC_FILE]
    assert (out / SPEC_FILE).read_text() == "my notes\n"


def test_an_empty_directory_and_a_finished_run_behave_as_before(tmp_path, capsys):
    out = tmp_path / "empty"
    out.mkdir()
    spec = write_spec(tmp_path / "spec.yaml")
    assert main(train_argv(spec, out)) == 0
    code, err = exit_and_error(capsys, train_argv(spec, out))
    assert code == 2 and "already holds a run; pass --resume" in err


# ------------------------------------------------------------------------- 3. interruptions tell the truth
def test_an_interrupt_before_any_checkpoint_says_there_is_nothing_to_resume(tmp_path, capsys, monkeypatch):
    def interrupted_while_loading(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bnn_module, "place", interrupted_while_loading)
    out = tmp_path / "run"
    code, err = exit_and_error(capsys, train_argv(write_spec(tmp_path / "spec.yaml"), out))
    assert code == 130
    assert "interrupted by SIGINT" in err and "no checkpoint had been written yet" in err and "--resume" not in err
    assert not (out / CHECKPOINT_FILE).exists()
    monkeypatch.undo()
    assert main(train_argv(write_spec(tmp_path / "spec.yaml"), out)) == 0  # the same command runs it afresh


def test_an_interrupt_after_a_checkpoint_prints_the_resume_command(tmp_path, capsys, monkeypatch):
    interrupt_at(monkeypatch, 3)
    spec, out = write_spec(tmp_path / "spec.yaml"), tmp_path / "run"
    code, err = exit_and_error(capsys, train_argv(spec, out, "--set", "seed=3"))
    assert code == 130 and f"continue it with: zoo train {spec} --out {out} --set seed=3 --resume" in err
    monkeypatch.undo()
    assert main(train_argv(spec, out, "--set", "seed=3", "--resume")) == 0


# Every inference method of the registry (and the deep ensemble, SVI's K members, and MultiSWAG, SWAG's), from its
# toy config with a fit of a few seconds: the file its first checkpoint lands in (the sign that the fit is under way)
# and the file that says the fit is done. MAP_CHECKPOINT: subnetwork Laplace spends its time fitting the MAP net.
MAP_CHECKPOINT = f"map/{CHECKPOINT_FILE}"
SIGNAL_CASES = {
    "svi": ("mean_field_toy", CHECKPOINT_FILE, CHECKPOINT_FILE,
            ["inference.num_steps=800", "inference.checkpoint_every=200", "inference.predictive_samples=5"]),
    "deep_ensemble": ("mean_field_toy", CHECKPOINT_FILE, CHECKPOINT_FILE,
                      ["model={family: deep_ensemble, members: 2}", "guide={name: delta}", "inference.num_steps=800",
                       "inference.checkpoint_every=200", "inference.predictive_samples=1"]),
    "swag": ("swag_toy", SWAG_FILE, SWAG_FILE,
             ["inference.pretrain_epochs=150", "inference.epochs=20", "inference.rank=2",
              "inference.checkpoint_every=200", "inference.predictive_samples=5"]),
    "multiswag": ("multiswag_toy", SWAG_FILE, SWAG_FILE,
                  ["inference.pretrain_epochs=150", "inference.epochs=20", "inference.rank=2",
                   "inference.checkpoint_every=200", "inference.predictive_samples=5"]),
    "sgld": ("sgld_toy", SAMPLES_FILE, SAMPLES_FILE,
             ["inference.epochs=1000", "inference.burn_in_epochs=500", "inference.thin=100",
              "inference.checkpoint_every=200", "inference.predictive_samples=5"]),
    "sghmc": ("sghmc_toy", SAMPLES_FILE, SAMPLES_FILE,
              ["inference.epochs=1000", "inference.burn_in_epochs=500", "inference.thin=100",
               "inference.checkpoint_every=200", "inference.predictive_samples=5"]),
    "hmc": ("hmc_toy", SAMPLES_FILE, SAMPLES_FILE,
            ["inference.compile=false", "inference.num_chains=4", "inference.warmup_steps=30",
             "inference.num_samples=20", "inference.max_leapfrog_steps=16", "inference.checkpoint_every=10",
             "inference.predictive_samples=5"]),
    "nuts": ("nuts_toy", SAMPLES_FILE, SAMPLES_FILE,
             ["inference.compile=false", "inference.num_chains=2", "inference.warmup_steps=30",
              "inference.num_samples=20", "inference.max_tree_depth=5", "inference.checkpoint_every=10",
              "inference.predictive_samples=5"]),
    "laplace": ("subnet_laplace_toy", MAP_CHECKPOINT, CHECKPOINT_FILE,
                ["model.map.num_steps=800", "model.map.checkpoint_every=200"]),
}


def test_every_inference_method_has_a_sigterm_case():
    from zoo.registry import METHODS

    covered = {load_spec(REPO / "configs" / f"{config}.yaml", sets).inference.method
               for config, _, _, sets in SIGNAL_CASES.values()}
    assert covered == set(METHODS)


@contextlib.contextmanager
def signal_when(ready, signum: int) -> Iterator[None]:
    """Within the block a watcher thread sends this process ``signum`` as soon as ``ready()`` holds (e.g. a fit's
    first checkpoint is on disk): a real signal, taken by whatever handler the code under test has installed. One
    that lands after that code has restored the handlers is caught here, so it never ends the test run itself."""
    previous = signal.signal(signum, lambda *_: None)
    done = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + 120
        while not ready():
            if done.is_set() or time.monotonic() > deadline:
                return
            time.sleep(0.02)
        os.kill(os.getpid(), signum)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        signal.signal(signum, previous)


@pytest.mark.parametrize("case", list(SIGNAL_CASES))
def test_sigterm_mid_fit_exits_143_naming_it_and_resume_finishes_the_run(tmp_path, capsys, case):
    """Issue 39: SIGTERM during SWAG, MultiSWAG, SGLD and SGHMC said "interrupted by SIGINT" and exited 130. Every
    method's own loop stops, saves its state and exits 143 naming SIGTERM; ``--resume`` then finishes the run."""
    config, ready, finished, sets = SIGNAL_CASES[case]
    spec, out = REPO / "configs" / f"{config}.yaml", tmp_path / "run"
    argv = train_argv(spec, out, *(a for s in sets for a in ("--set", s)))
    with signal_when(lambda: (out / ready).exists(), signal.SIGTERM):
        code, err = exit_and_error(capsys, argv)
    assert code == 143 and "interrupted by SIGTERM" in err, err
    assert f"the run is checkpointed in {out}; continue it with: zoo train {spec} --out {out}" in err
    assert not load_checkpoint(out / ready)["done"]  # stopped mid-fit ...
    assert "interrupted " in (out / "train.log").read_text()  # ... by the fit's own loop, which saved its state
    code, err = exit_and_error(capsys, [*argv, "--resume"])
    # 3: a finished MCMC run whose (tiny) chains fail the convergence checks; its run directory is complete
    assert code == 0 or (code == 3 and case in ("hmc", "nuts")), err
    assert load_checkpoint(out / finished)["done"] and (out / METRICS_FILE).exists()


def test_a_signal_that_stops_a_loop_is_named_whatever_the_loop_raises():
    """The root cause of issue 39: a loop that saw the signal raised a bare KeyboardInterrupt, reported as Ctrl-C."""
    with pytest.raises(KeyboardInterrupt) as stopped, deferred_interrupt() as signalled:
        os.kill(os.getpid(), signal.SIGTERM)
        wait_for(lambda: signalled(), "the signal")
        raise KeyboardInterrupt
    assert isinstance(stopped.value, Interrupted) and stopped.value.signum == signal.SIGTERM
    assert stopped.value.exit_code == 143 and str(stopped.value) == "interrupted by SIGTERM"
    with pytest.raises(KeyboardInterrupt) as plain, deferred_interrupt():
        raise KeyboardInterrupt  # no signal: a KeyboardInterrupt of the code's own stays what it is
    assert not isinstance(plain.value, Interrupted)


@pytest.mark.slow  # NUTS interrupted and resumed: ~18 s (make test-slow)
def test_ctrl_c_stops_nuts_inside_a_draw_and_resume_gives_the_uninterrupted_chains(tmp_path, capsys, monkeypatch):
    """Issue 39: NUTS took signals only between chains, tens of minutes apart on the README's toy. Ctrl-C (as SIGTERM)
    now stops it inside the draw in progress, which is given up; the chain's state is saved and resumes bit for bit."""
    from zoo.inference import mcmc

    spec = write_spec(tmp_path / "spec.yaml", tiny_hmc(method="nuts", warmup_steps=30, num_samples=20,
                                                       max_tree_depth=5, checkpoint_every=1000))
    pipeline.train(load_spec(spec), tmp_path / "whole", progress=False, echo=None)  # no verdict: only the draws
    real_build_tree, kernels, drawing = mcmc.RecordingNUTS._build_tree, [], []

    def build_tree(self, *args):
        if self not in kernels:
            kernels.append(self)
        # inside a subtree of draw 36 of the second chain (in warm-up), once
        if len(kernels) == 2 and self._t >= 35 and self._nesting > 0 and not drawing:
            drawing.append(self._t)  # the draws finished before this one
            os.kill(os.getpid(), signal.SIGINT)
        return real_build_tree(self, *args)

    monkeypatch.setattr(mcmc.RecordingNUTS, "_build_tree", build_tree)
    out = tmp_path / "cut"
    code, err = exit_and_error(capsys, train_argv(spec, out))
    assert code == 130 and "interrupted by SIGINT" in err
    monkeypatch.undo()
    state = load_checkpoint(out / SAMPLES_FILE)
    assert [c["chain"] for c in state["chains"]] == [0] and list(state["unfinished"]) == [1]
    assert state["unfinished"][1]["iteration"] == drawing[0]  # the draw in progress was given up, not finished
    capsys.readouterr()
    assert main(train_argv(spec, out, "--resume")) in (0, 3)
    whole, resumed = (load_checkpoint(d / SAMPLES_FILE) for d in (tmp_path / "whole", out))
    assert all(torch.equal(whole["draws"][k], resumed["draws"][k]) for k in whole["draws"])
    assert all(torch.equal(whole["stats"][k], resumed["stats"][k]) for k in whole["stats"])


# ------------------------------------------------------------------------- 4. corrupt checkpoints and draws
def corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    noise = random.Random(0).randbytes(len(data))  # seeded: one fixed garbage file, not a new draw per CI run
    path.write_bytes({"empty": b"", "truncated": data[: len(data) // 2], "garbage": noise}[how])


def test_any_noise_in_place_of_a_saved_file_is_refused_as_unreadable_whatever_the_unpickler_would_raise(tmp_path):
    """Unpickling noise can raise anything: among these 600 files, MemoryError (seed 454, as in CI once),
    OverflowError (seed 43), UnicodeDecodeError and UnpicklingError. Every one must read as a corrupt file."""
    path = tmp_path / "noise.pt"
    for seed in range(600):
        path.write_bytes(random.Random(seed).randbytes(2000))
        with pytest.raises(ZooInputError, match="is unreadable"):
            runs.load_torch(path)


def test_a_zip_archive_of_noise_in_place_of_a_saved_file_is_refused_as_unreadable(tmp_path):
    """Past the zip check (torch.save's format), members of noise must still read as a corrupt file."""
    path = tmp_path / "noise.pt"
    runs.save_torch(path, {"step": 3, "w": torch.ones(50)})
    with zipfile.ZipFile(path) as real:
        names = real.namelist()
    for seed in range(50):
        rng = random.Random(seed)
        with zipfile.ZipFile(path, "w") as fake:
            for name in names:
                fake.writestr(name, rng.randbytes(rng.randint(1, 4000)))
        with pytest.raises(ZooInputError, match="is unreadable"):
            runs.load_torch(path)


@pytest.fixture(scope="module")
def finished_svi_run(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("svi")
    spec = write_spec(root / "spec.yaml")
    assert main(train_argv(spec, root / "run")) == 0
    return spec, root / "run"


@pytest.mark.parametrize("how", ["empty", "truncated", "garbage"])
def test_a_corrupt_checkpoint_without_a_previous_one_exits_2_naming_the_file(finished_svi_run, tmp_path, capsys,
                                                                            how):
    spec, finished = finished_svi_run
    run = tmp_path / "run"
    pipeline_files = [p for p in finished.iterdir() if p.is_file()]
    run.mkdir()
    for p in pipeline_files:
        if p.name != previous_version(finished / CHECKPOINT_FILE).name:
            (run / p.name).write_bytes(p.read_bytes())
    corrupt(run / CHECKPOINT_FILE, how)
    for argv in (["eval", str(run)], train_argv(spec, run, "--resume")):
        code, err = exit_and_error(capsys, argv)
        assert code == 2 and f"{run / CHECKPOINT_FILE} is unreadable" in err, err


@pytest.mark.parametrize("how", ["empty", "truncated", "garbage"])
def test_a_corrupt_checkpoint_resumes_from_the_previous_one_with_a_warning(tmp_path, capsys, monkeypatch, how):
    spec, out = write_spec(tmp_path / "spec.yaml"), tmp_path / "run"
    interrupt_at(monkeypatch, 5)
    assert main(train_argv(spec, out)) == 130  # checkpoints at steps 2, 4 and (interrupted) 5
    monkeypatch.undo()
    assert load_checkpoint(previous_version(out / CHECKPOINT_FILE))["step"] == 4
    corrupt(out / CHECKPOINT_FILE, how)
    capsys.readouterr()
    assert main(train_argv(spec, out, "--resume")) == 0
    captured = capsys.readouterr()
    assert "warning: " in captured.err and "using the previous checkpoint checkpoint.prev.pt" in captured.err
    assert "resumed from" in captured.out and "at step 4/6" in captured.out
    assert (out / (CHECKPOINT_FILE + ".corrupt")).exists()  # kept for inspection, never rotated over the good one
    assert load_checkpoint(out / CHECKPOINT_FILE)["done"]


def test_a_crash_between_the_two_renames_leaves_the_previous_checkpoint_readable(tmp_path):
    path = tmp_path / CHECKPOINT_FILE
    save_checkpoint(path, {"step": 1})
    save_checkpoint(path, {"step": 2})
    assert load_checkpoint(previous_version(path))["step"] == 1
    path.unlink()  # as if the process died after rotating the old file away and before renaming the new one
    with pytest.warns(ZooWarning, match="does not exist; using the previous checkpoint"):
        assert load_checkpoint(path)["step"] == 1


@pytest.mark.parametrize("how", ["empty", "truncated", "garbage"])
def test_corrupt_mcmc_draws_exit_2_naming_the_file(tmp_path, capsys, how):
    spec, run = write_spec(tmp_path / "spec.yaml", HMC), tmp_path / "run"
    assert main(train_argv(spec, run)) in (0, 3)  # 3: too few draws to pass the convergence checks
    previous_version(run / SAMPLES_FILE).unlink()
    corrupt(run / SAMPLES_FILE, how)
    for argv in (["eval", str(run)], ["diagnose", str(run)]):
        code, err = exit_and_error(capsys, argv)
        assert code == 2 and f"{run / SAMPLES_FILE} is unreadable" in err, err


def test_a_file_that_is_not_a_checkpoint_dict_is_named(tmp_path):
    path = tmp_path / CHECKPOINT_FILE
    torch.save([1, 2, 3], path)
    with pytest.raises(ZooInputError, match="holds a list, not a zoo checkpoint"):
        load_checkpoint(path)


# ------------------------------------------------------------------------- 5. OS errors
def test_out_that_is_a_file_or_under_a_file_exits_2(tmp_path, capsys):
    spec = write_spec(tmp_path / "spec.yaml")
    a_file = tmp_path / "results.txt"
    a_file.write_text("mine\n")
    code, err = exit_and_error(capsys, train_argv(spec, a_file))
    assert code == 2 and f"--out: got '{a_file}'; is a file" in err
    code, err = exit_and_error(capsys, train_argv(spec, a_file / "run"))
    assert code == 2 and f"{a_file} is a file, so no directory can be made under it" in err
    assert a_file.read_text() == "mine\n"


@pytest.fixture
def unwritable_dir(tmp_path) -> Path:
    """A directory this process cannot write in: read-only permissions, or (as root, who ignores them) /sys."""
    if os.geteuid() != 0:
        locked = tmp_path / "read_only"
        locked.mkdir()
        locked.chmod(0o500)
        yield locked
        locked.chmod(0o700)
        return
    probe = Path("/sys") / f"zoo-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        yield Path("/sys")
        return
    probe.rmdir()
    pytest.skip("running as root with a writable /sys: no directory here refuses writes")


def test_an_unwritable_out_is_found_before_training_starts(tmp_path, capsys, monkeypatch, unwritable_dir):
    started = []
    monkeypatch.setattr(bnn_module, "place", lambda *a, **k: started.append(1))
    code, err = exit_and_error(capsys, train_argv(write_spec(tmp_path / "spec.yaml"), unwritable_dir / "run"))
    assert code == 2 and "--out" in err and "cannot write there" in err and not started


def test_a_full_disk_exits_2_naming_the_file_and_keeps_the_last_checkpoint(tmp_path, capsys, monkeypatch):
    real_save, saves = torch.save, []

    def save(obj, handle):
        saves.append(1)
        if len(saves) == 2:  # the second checkpoint (step 4) finds the disk full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_save(obj, handle)

    monkeypatch.setattr(runs.torch, "save", save)
    out = tmp_path / "run"
    code, err = exit_and_error(capsys, train_argv(write_spec(tmp_path / "spec.yaml"), out))
    assert code == 2 and f"cannot write {out / CHECKPOINT_FILE}: No space left on device" in err
    monkeypatch.undo()
    assert load_checkpoint(out / CHECKPOINT_FILE)["step"] == 2
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


# ------------------------------------------------------------------------- 6. eval of an unfinished run
def test_eval_of_an_unfinished_svi_run_says_the_step_reached(tmp_path, capsys, monkeypatch):
    interrupt_at(monkeypatch, 3)
    out = tmp_path / "run"
    assert main(train_argv(write_spec(tmp_path / "spec.yaml"), out)) == 130
    monkeypatch.undo()
    capsys.readouterr()
    assert main(["eval", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"warning: {out} is an unfinished run: its checkpoint is at step 3 of 6" in err


def test_eval_of_an_unfinished_mcmc_run_exits_2_with_the_iteration_reached(tmp_path, capsys, monkeypatch):
    from zoo.inference import mcmc

    real_step = mcmc.ManyChainHMC.step

    def step(self, warmup):
        if self.iteration == 3:
            raise KeyboardInterrupt
        return real_step(self, warmup)

    monkeypatch.setattr(mcmc.ManyChainHMC, "step", step)
    out = tmp_path / "run"
    assert main(train_argv(write_spec(tmp_path / "spec.yaml", HMC), out)) == 130
    monkeypatch.undo()
    code, err = exit_and_error(capsys, ["eval", str(out)])
    assert code == 2 and "holds an unfinished MCMC run (iteration 2)" in err


# ------------------------------------------------------------------------- 7. counts on the command line
@pytest.mark.parametrize("command", ["eval", "diagnose", "compare"])
@pytest.mark.parametrize("samples", ["0", "-3"])
def test_a_draw_count_below_one_is_refused(finished_svi_run, capsys, command, samples):
    run = str(finished_svi_run[1])
    code, err = exit_and_error(capsys, [command, run, *([run] if command == "compare" else []), "--samples", samples])
    assert code == 2 and f"--samples: got {samples}; use a positive number of posterior draws" in err


def test_draws_that_cannot_fit_in_memory_are_refused_up_front_with_the_estimate(finished_svi_run, capsys):
    run = str(finished_svi_run[1])
    code, err = exit_and_error(capsys, ["eval", run, "--samples", "100000000000"])
    assert code == 2 and "--samples: got 100000000000; 100,000,000,000 draws scored on 300 rows would take about" in err
    assert "of memory available" in err and "use --samples" in err and "or fewer" in err
    fits = int(err.split("use --samples ")[1].split(" or fewer")[0].replace(",", ""))
    assert 1 <= fits < 100_000_000_000


# ------------------------------------------------------------------------- 9. the NaN diagnosis
@pytest.mark.parametrize("optimizer", ["adam", "clipped_adam"])
def test_the_nan_diagnosis_suggests_only_what_was_not_tried(tmp_path, capsys, optimizer):
    spec = write_spec(tmp_path / "spec.yaml", num_steps=50, batch_size=None, lr=1e30, optimizer=optimizer,
                      kl_annealing_steps=10)
    code, err = exit_and_error(capsys, train_argv(spec, tmp_path / "run", "--set", "likelihood.noise=0.1"))
    assert code == 1 and ("ELBO is not finite" in err or "non-finite" in err)
    assert "lower inference.lr (now 1e+30)" in err
    assert ("use inference.optimizer: clipped_adam" in err) == (optimizer == "adam")
    assert ("lower inference.clip_norm (now 10)" in err) == (optimizer == "clipped_adam")
    assert "kl_annealing_steps" not in err  # already on
    assert "dtype: float64" in err


# ------------------------------------------------------------------------- 10. files a colleague can read
@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_run_files_follow_the_umask(tmp_path, umask):
    previous = os.umask(umask)
    try:
        assert main(train_argv(write_spec(tmp_path / "spec.yaml"), tmp_path / "run")) == 0
    finally:
        os.umask(previous)
    expected = 0o666 & ~umask
    for name in (SPEC_FILE, METRICS_FILE, CHECKPOINT_FILE, "train.log", "uncertainty.png"):
        assert stat.S_IMODE((tmp_path / "run" / name).stat().st_mode) == expected, name
