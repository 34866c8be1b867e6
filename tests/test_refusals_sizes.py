"""Issue 56: sizes that grew memory until the process was killed (or ended in a raw allocator error) are refused
before anything is allocated, by the one guard :func:`zoo.runs.check_size_fits`, naming the size in GiB, the limit
(a share of the memory available) and the largest value that fits.

One table, in the style of ``test_refusals.py``: ``zoo`` command lines (in-process through :func:`zoo.cli.main`)
exit 2 with an ``error:`` line; Python calls raise :class:`~zoo.errors.ZooInputError`. ``memory`` is the memory
available the case pretends to have (bytes; None: the machine's own), so that a size is 'too large' without
building anything large; the real-number cases are refused by the estimate alone.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import zoo
import zoo.runs
from tests.conftest import assert_fragments, refused
from zoo.errors import ZooInputError
from zoo.pipeline import train

from .test_refusals import TINY_DIGITS
from .test_refusals import zoo as zoo_train

MiB, GiB = 2**20, 2**30
BIG = "100000000"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A tiny finished mean-field run on digits (two steps)."""
    out = tmp_path_factory.mktemp("run") / "run"
    train(TINY_DIGITS, out, progress=False, echo=lambda line: None)
    return out


def _predict(num_samples):
    return lambda run: zoo.load(run).predict(torch.zeros(3, 64), num_samples=num_samples)


def _rank1(run):
    net = torch.nn.Sequential(torch.nn.Linear(4, 50), torch.nn.ReLU(), torch.nn.Linear(50, 1))
    bnn = zoo.BNN(net, family={"family": "rank1", "members": 100000}, prior={"name": "normal", "loc": 1.0},
                  device="cpu")
    return bnn.fit((torch.randn(64, 4), torch.randn(64)), num_steps=1, progress=False)


CASES = [
    # 4. draws of zoo diagnose / zoo compare (real numbers: 10^8 draws of a 7,510-weight net)
    pytest.param(["diagnose", "{run}", "--samples", BIG], None,
                 ("--samples: got 100000000; 100,000,000 draws scored on", "GiB, more than 50% of the",
                  "use --samples"), id="diagnose-samples"),
    pytest.param(["compare", "{run}", "{run}", "--samples", BIG, "--allow-unconverged", "--out", "{out}"], None,
                 ("--samples: got 100000000", "GiB of memory available", "or fewer ("), id="compare-samples"),
    # 5. BNN.predict: too many draws, and counts that are not positive whole numbers
    pytest.param(_predict(10**9), None, ("num_samples: got 1000000000; 1,000,000,000 draws scored on 3 rows would take",
                                         "use num_samples="), id="predict-1e9"),
    pytest.param(_predict(-2), None, "num_samples: got -2; give 1 or more posterior draws", id="predict-negative"),
    pytest.param(_predict(0), None, "num_samples: got 0; give 1 or more posterior draws", id="predict-zero"),
    pytest.param(_predict(2.5), None, "num_samples: got 2.5; give a whole number of posterior draws",
                 id="predict-float"),
    # 6. rank-1 members: per-member factors plus the K-times tiled batch
    pytest.param(_rank1, 2 * GiB, ("model.members: got 100000; 100,000 members (their factors and 64 rows a step",
                                   "use model.members:"), id="rank1-members"),
    # 7. D x D covariances: Pyro's full-covariance autoguides and subnetwork Laplace over the whole net
    pytest.param(zoo_train("mean_field_digits", "--set", "guide:={name: auto, auto: mvn}"), 256 * MiB,
                 ("guide.auto: got 'mvn'; 4 full 7,308 x 7,308 matrices", "use guide.auto: low_rank_mvn"),
                 id="auto-mvn"),
    pytest.param(zoo_train("mean_field_digits", "--set", "guide:={name: auto, auto: laplace_approximation}"),
                 256 * MiB, ("guide.auto: got 'laplace_approximation'", "a full covariance fits up to about"),
                 id="auto-laplace-approximation"),
    pytest.param(zoo_train("subnet_laplace_toy", "--set", "model.selection.size=2701"), 16 * MiB,
                 ("model.selection.size: got 2701; 4 full 2,701 x 2,701", "use model.selection.size:"),
                 id="subnet-size-whole-net"),
    # 8. widths: refused from the spec's widths before the net is built (real numbers: 10^10 weights)
    pytest.param(zoo_train("mean_field_digits", "--set", "net.hidden=[100000, 100000]"), None,
                 ("net.hidden: got [100000, 100000]; a net of 10,007,400,008 weights would take about",
                  "use narrower layers, e.g. net.hidden: ["), id="net-hidden"),
    # further sizes: zoo eval's draws, the spec's predictive_samples (refused before the fit, not after it),
    # BNN.evaluate's count
    pytest.param(["eval", "{run}", "--samples", BIG], None, ("--samples: got 100000000", "use --samples"),
                 id="eval-samples"),
    pytest.param(zoo_train("mean_field_digits", "--set", f"inference.predictive_samples={BIG}"), None,
                 ("inference.predictive_samples: got 100000000", "use inference.predictive_samples: "),
                 id="spec-predictive-samples"),
    pytest.param(lambda run: zoo.load(run).evaluate((torch.zeros(3, 64), torch.zeros(3, dtype=torch.long)),
                                                    num_samples=0), None,
                 "num_samples: got 0; give 1 or more posterior draws", id="bnn-evaluate-zero"),
]


@pytest.mark.parametrize("run, memory, fragments", CASES)
def test_a_size_that_would_not_fit_is_refused_before_allocating(run: list[str] | Callable, memory: int | None,
                                                               fragments: str | tuple[str, ...], run_dir: Path,
                                                               tmp_path: Path, monkeypatch, capsys) -> None:
    if memory is not None:
        monkeypatch.setattr(zoo.runs, "available_memory", lambda: memory)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    if callable(run):
        with pytest.raises(ZooInputError) as info:
            run(run_dir)
        message = str(info.value)
    else:
        message = refused([arg.replace("{run}", str(run_dir)).replace("{out}", str(out)) for arg in run], capsys, ())
    assert_fragments(message, fragments)


def test_the_guard_names_size_limit_and_fix(monkeypatch) -> None:
    monkeypatch.setattr(zoo.runs, "available_memory", lambda: 4 * GiB)
    zoo.runs.check_size_fits("x", 1, 2 * GiB, "unused", "it")  # exactly the share: allowed
    with pytest.raises(ZooInputError, match=r"x: got 3; it would take about 3.0 GiB, more than 50% of the 4.0 GiB of "
                       r"memory available \(2.0 GiB\): use 2"):
        zoo.runs.check_size_fits("x", 3, 3 * GiB, lambda allowed: f"use {int(allowed // GiB)}", "it")
    monkeypatch.setattr(zoo.runs, "available_memory", lambda: None)
    zoo.runs.check_size_fits("x", 3, 3 * GiB, "unused", "it")  # unknown memory: never refused


def test_the_largest_covariance_that_fits_is_the_one_the_guard_lets_through(monkeypatch) -> None:
    monkeypatch.setattr(zoo.runs, "available_memory", lambda: 64 * MiB)
    most = zoo.runs.most_covariance_dim(4, 4)
    assert most == 1448  # (32 MiB / 16 bytes) ** 0.5
    zoo.runs.check_covariance_fits("x", most, most, 4, 4, str)
    with pytest.raises(ZooInputError, match="use 1448"):
        zoo.runs.check_covariance_fits("x", most + 1, most + 1, 4, 4, lambda allowed: f"use {allowed}")
    monkeypatch.setattr(zoo.runs, "available_memory", lambda: None)
    assert zoo.runs.most_covariance_dim(4, 4) is None  # unknown memory: no bound
