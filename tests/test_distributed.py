"""Several processes, one run: data-parallel SVI and sharded MCMC chains under ``torchrun`` equal the one-process
run, stop together on SIGTERM, resume in another world size, and refuse what they cannot share.

The multi-process tests launch ``zoo train --nproc 2`` (gloo, one thread per process) as a user would.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyro
import pyro.distributions as dist
import pytest
import torch
import yaml

from tests.conftest import sigterm_ends_cleanly, tiny_hmc
from zoo.cli import main, without_nproc
from zoo.distributed import ObservationScale, World, check_chains
from zoo.errors import ZooInputError
from zoo.inference.draws import SAMPLES_FILE
from zoo.runs import (
    CHECKPOINT_FILE,
    MARKER_FILE,
    SPEC_FILE,
    load_checkpoint,
    previous_version,
    save_checkpoint,
)

REPO = Path(__file__).resolve().parents[1]
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
needs_two_cores = pytest.mark.skipif(CORES < 2, reason="two processes need two CPU cores")

MEAN_FIELD = {  # 101 rows in batches of 32: the last batch (5 rows) splits 2 + 3, so the shares' factor matters
    "data": {"name": "toy_gap", "n_train": 101},
    "net": {"hidden": [8]},
    "inference": {"num_steps": 40, "batch_size": 32, "lr": 0.01, "local_reparam": True, "checkpoint_every": 20,
                  "predictive_samples": 3},
    "device": "cpu",
}
RANK1 = {  # point-estimated W, a mixture guide, the full batch split 50 + 51
    "data": {"name": "toy_gap", "n_train": 101},
    "net": {"hidden": [8], "activation": "tanh"},
    "prior": {"name": "normal", "loc": 1.0, "scale": 0.5},
    "model": {"family": "rank1", "members": 2},
    "guide": {"name": "mixture"},
    "likelihood": {"noise": 0.1},
    "inference": {"num_steps": 30, "batch_size": None, "lr": 0.01, "predictive_samples": 3},
    "device": "cpu",
}


def write(path: Path, tree: dict) -> Path:
    path.write_text(yaml.safe_dump(tree))
    return path


def trained_state(run: Path) -> dict[str, torch.Tensor]:
    state = load_checkpoint(run / CHECKPOINT_FILE)
    return {**{f"guide.{k}": v for k, v in state["guide"].items()},
            **{f"point.{i}": v for i, v in enumerate(state["point_parameters"])}}


def assert_same_state(a: Path, b: Path) -> None:
    sa, sb = trained_state(a), trained_state(b)
    assert sa.keys() == sb.keys()
    for key in sa:  # the same maths; only the order of float sums differs
        torch.testing.assert_close(sa[key], sb[key], rtol=1e-4, atol=1e-5, msg=key)


def two_processes_past_a_checkpoint(spec: Path, out: Path) -> subprocess.Popen:
    """``zoo train --nproc 2`` in the background, returned once its first checkpoint exists (killed on failure)."""
    job = subprocess.Popen([sys.executable, "-m", "zoo.cli", "train", str(spec), "--out", str(out), "--nproc", "2",
                            "--no-progress"], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not (out / CHECKPOINT_FILE).exists():
        if time.monotonic() > deadline or job.poll() is not None:
            job.kill()
            raise AssertionError(f"no checkpoint appeared: {job.communicate()[1][-2000:]}")
        time.sleep(0.05)
    return job


# ------------------------------------------------------------------------------------------ the maths, one process
def test_shares_cover_the_batch_and_their_factors_restore_the_whole_batch_gradient():
    rows = torch.arange(5)
    shares = [World(rank, 2).shard(rows) for rank in range(2)]
    assert [s[0].tolist() for s in shares] == [[0, 1], [2, 3, 4]]
    assert [s[1] for s in shares] == [slice(0, 2), slice(2, 5)]
    # a row's log-likelihood is scaled by N / n_r in its rank's model, times the factor W n_r / n, and the gradient
    # average divides by W: N / n, the one-process minibatch weight, for every row of every share
    n_total, n = 101, 5
    assert [s[2] for s in shares] == pytest.approx([2 * 2 / 5, 2 * 3 / 5])
    for share, _, factor in shares:
        assert n_total / len(share) * factor / 2 == pytest.approx(n_total / n)


def test_observation_scale_touches_the_likelihood_and_not_the_prior():
    def model():
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        pyro.sample("y", dist.Normal(w, 1.0), obs=torch.tensor(0.5))

    with pyro.poutine.trace() as plain:
        model()
    with ObservationScale(3.0), pyro.poutine.trace() as scaled:
        pyro.poutine.replay(model, trace=plain.trace)()
    assert scaled.trace.nodes["w"]["scale"] == 1.0 and scaled.trace.nodes["y"]["scale"] == 3.0


def test_the_launched_command_drops_only_nproc():
    argv = ["train", "s.yaml", "--out", "r", "--nproc", "2", "--set", "seed=1", "--nproc=4", "--resume"]
    assert without_nproc(argv) == ["train", "s.yaml", "--out", "r", "--set", "seed=1", "--resume"]


# ------------------------------------------------------------------------------------------ bad input
def test_more_processes_than_cores_are_refused(tmp_path, capsys):
    code = main(["train", str(write(tmp_path / "s.yaml", MEAN_FIELD)), "--out", str(tmp_path / "run"),
                 "--nproc", str(CORES + 1)])
    err = capsys.readouterr().err
    assert code == 2 and f"--nproc: got {CORES + 1}; this machine gives this process {CORES} CPU core(s)" in err
    assert not (tmp_path / "run").exists()


def test_a_global_batch_the_processes_cannot_share_is_refused_with_both_numbers(tmp_path, capsys):
    spec = write(tmp_path / "s.yaml", {**MEAN_FIELD, "inference": {**MEAN_FIELD["inference"], "batch_size": 33}})
    code = main(["train", str(spec), "--out", str(tmp_path / "run"), "--nproc", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "inference.batch_size: got 33; the global minibatch is split across 2 processes" in err


# ------------------------------------------------------------------------------------------ two processes
@pytest.mark.slow  # torchrun, two processes: 16-20 s a case (make test-slow)
@needs_two_cores
@pytest.mark.parametrize("tree", [
    MEAN_FIELD, RANK1, {**MEAN_FIELD, "inference": {**MEAN_FIELD["inference"], "read_loss_every": 8}},
], ids=["mean_field_local_reparam", "rank1_full_batch", "losses_and_signals_read_every_8_steps"])
def test_two_processes_take_the_same_steps_as_one(tmp_path, tree):
    spec = write(tmp_path / "s.yaml", tree)
    assert main(["train", str(spec), "--out", str(tmp_path / "one"), "--no-progress"]) == 0
    assert main(["train", str(spec), "--out", str(tmp_path / "two"), "--no-progress", "--nproc", "2"]) == 0
    assert_same_state(tmp_path / "one", tmp_path / "two")
    assert (tmp_path / "two" / "metrics.json").exists()
    assert "2 processes" in (tmp_path / "two" / "train.log").read_text()


@pytest.mark.slow  # torchrun, kill and resume: ~45 s (make test-slow)
@needs_two_cores
def test_sigterm_stops_every_process_at_one_step_and_one_process_resumes_it(tmp_path):
    tree = {**MEAN_FIELD, "inference": {**MEAN_FIELD["inference"], "num_steps": 1500, "checkpoint_every": 100}}
    spec, out = write(tmp_path / "s.yaml", tree), tmp_path / "two"
    sigterm_ends_cleanly(two_processes_past_a_checkpoint(spec, out))
    reached = load_checkpoint(out / CHECKPOINT_FILE)["step"]
    assert 100 <= reached < 1500
    assert main(["train", str(spec), "--out", str(out), "--no-progress", "--resume"]) == 0
    assert main(["train", str(spec), "--out", str(tmp_path / "one"), "--no-progress"]) == 0
    assert_same_state(out, tmp_path / "one")


HMC = tiny_hmc(num_chains=4, warmup_steps=40, num_samples=10, checkpoint_every=20)


def draws(run: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run / SAMPLES_FILE)["draws"]


@pytest.mark.slow  # torchrun: ~50 s a case (make test-slow)
@needs_two_cores
@pytest.mark.parametrize(("kernel", "metric"), [("chees", "diagonal"), ("mams", "diagonal"), ("chees", "low_rank")])
def test_two_processes_share_the_hmc_chains_and_one_process_resumes_their_checkpoint(tmp_path, kernel, metric):
    """The adaptation pools all chains in one order and each process draws every chain's random numbers, so the
    draws are bit-identical; a checkpoint written by two processes continues in one. Both kernels, and the low-rank
    metric (fitted from every chain's draws and gradients, gathered in one order)."""
    spec = write(tmp_path / "s.yaml", {**HMC, "inference": {**HMC["inference"], "kernel": kernel, "metric": metric}})
    assert main(["train", str(spec), "--out", str(tmp_path / "one"), "--no-progress"]) in (0, 3)
    assert main(["train", str(spec), "--out", str(tmp_path / "two"), "--no-progress", "--nproc", "2"]) in (0, 3)
    one, two = draws(tmp_path / "one"), draws(tmp_path / "two")
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)
    assert one["out.weight"].shape[:2] == (4, 10)

    resumed = tmp_path / "resumed"  # the two processes' checkpoint at iteration 40 of 50, continued by one
    resumed.mkdir()
    for name in (SPEC_FILE, MARKER_FILE, "train.log"):
        (resumed / name).write_bytes((tmp_path / "two" / name).read_bytes())
    at_40 = load_checkpoint(previous_version(tmp_path / "two" / SAMPLES_FILE))
    assert not at_40["done"] and at_40["sampler"]["iteration"] == 40
    save_checkpoint(resumed / SAMPLES_FILE, at_40)
    assert main(["train", str(spec), "--out", str(resumed), "--no-progress", "--resume"]) in (0, 3)
    again = draws(resumed)
    assert all(torch.equal(one[k], again[k]) for k in one)


@pytest.mark.slow  # torchrun: ~50 s (make test-slow)
@needs_two_cores
def test_two_processes_share_the_nuts_chains(tmp_path):
    tree = {**HMC, "inference": {"method": "nuts", "num_chains": 3, "warmup_steps": 20, "num_samples": 10,
                                 "predictive_samples": 4}}
    spec = write(tmp_path / "s.yaml", tree)
    assert main(["train", str(spec), "--out", str(tmp_path / "one"), "--no-progress"]) in (0, 3)
    assert main(["train", str(spec), "--out", str(tmp_path / "two"), "--no-progress", "--nproc", "2"]) in (0, 3)
    one, two = draws(tmp_path / "one"), draws(tmp_path / "two")
    assert all(torch.equal(one[k], two[k]) for k in one)  # 3 chains: rounds of two, then one


@pytest.mark.slow  # torchrun, a rendezvous timeout (make test-slow)
def test_a_rank_that_cannot_reach_the_rendezvous_fails_within_the_timeout_naming_the_address(tmp_path):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO), "WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "ZOO_DIST_TIMEOUT": "2"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "zoo.cli", "train", str(write(tmp_path / "s.yaml", MEAN_FIELD)),
                           "--out", str(tmp_path / "run"), "--no-progress"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"[rank 1] error: rank 1 could not join the job at 127.0.0.1:{port} within 2 s" in done.stderr
    assert time.monotonic() - started < 60


@pytest.mark.slow  # torchrun (make test-slow)
@needs_two_cores
@pytest.mark.parametrize("ending", ["normal", "agreed_signal"])
def test_no_rank_leaves_before_rank_0_has_finished_writing(tmp_path, ending):
    """A rank that exits while another still holds its gloo connections can be aborted; so the ranks leave together,
    after rank 0's evaluation and writing (here a 1.5 s sleep), and only then tear the group down. The same after
    a signal every rank agreed on, where rank 0 saves the checkpoint before it raises."""
    stop = "    raise Interrupted(15)\n" if ending == "agreed_signal" else ""
    script = tmp_path / "job.py"
    script.write_text(
        "import contextlib, os, sys, time, torch\n"
        "from zoo.distributed import joined\n"
        "from zoo.interrupts import Interrupted\n"
        "ended = None\n"
        "with contextlib.suppress(Interrupted), joined(torch.device('cpu')) as team:\n"
        "    if team.is_writer:\n"
        "        time.sleep(1.5)\n"
        "        ended = time.time()\n"
        + stop +
        "left = time.time()\n"
        f"path = os.path.join({str(tmp_path)!r}, f'rank{{team.rank}}')\n"
        "open(path, 'w').write(repr((left, ended)))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    _, writer_ended = eval((tmp_path / "rank0").read_text())
    other_left, _ = eval((tmp_path / "rank1").read_text())
    assert other_left >= writer_ended


def test_chains_the_processes_cannot_share_evenly_are_refused():
    with pytest.raises(ZooInputError, match="inference.num_chains: got 5; the chains are shared by 2 processes"):
        check_chains(5, 2)


@pytest.mark.slow  # torchrun, a rank killed: ~27 s (make test-slow)
@needs_two_cores
def test_a_rank_that_dies_ends_the_job_at_once_and_the_last_checkpoint_stays_usable(tmp_path):
    psutil = pytest.importorskip("psutil")
    tree = {**MEAN_FIELD, "inference": {**MEAN_FIELD["inference"], "num_steps": 100_000, "checkpoint_every": 100}}
    spec, out = write(tmp_path / "s.yaml", tree), tmp_path / "two"
    job = two_processes_past_a_checkpoint(spec, out)
    try:
        ranks = [p for p in psutil.Process(job.pid).children(recursive=True) if p.environ().get("RANK") == "1"]
        assert len(ranks) == 1
        ranks[0].kill()
        started = time.monotonic()
        _, stderr = job.communicate(timeout=120)
    finally:
        job.kill()
    assert time.monotonic() - started < 60  # torchrun stops rank 0 instead of leaving it in the all-reduce
    assert job.returncode != 0 and "rank      : 1" in stderr and "SIGKILL" in stderr
    assert load_checkpoint(out / CHECKPOINT_FILE)["step"] % 100 == 0


def test_a_rank_that_agreed_to_stop_ignores_its_own_late_signal():
    """The launcher signals the ranks one after another; a rank told to stop by the others' all-reduce must not be
    killed when its own copy lands after it has left the loop (its handlers restored)."""
    import subprocess
    import sys

    script = (
        "import os, signal\n"
        "from zoo.interrupts import deferred_interrupt, ignore_late_signals, sigterm_interrupts\n"
        "with sigterm_interrupts():\n"
        "    with deferred_interrupt() as signalled:\n"
        "        ignore_late_signals()\n"  # what a rank does when the all-reduce says another rank was signalled
        "os.kill(os.getpid(), signal.SIGTERM)\n"  # its own copy, after the handlers were restored
        "print('still alive')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "still alive" in done.stdout, done.stderr
    without = script.replace("        ignore_late_signals()\n", "        pass\n")
    assert subprocess.run([sys.executable, "-c", without], capture_output=True, timeout=60).returncode == -15
