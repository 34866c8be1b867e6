"""zoo.BNN.fit without ``out`` writes nothing: the fit lives in memory, predicts as the same fit with a run directory
does, and ``save`` writes that run directory afterwards; settings given to one fit do not outlive it."""

from __future__ import annotations

import glob
import os
import re
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pyro
import pytest
import torch
from torch import nn

import zoo
from zoo.bnn import holds_a_fit
from zoo.errors import ZooInputError
from zoo.inference.base import InferenceMethod
from zoo.inference.svi import SVI
from zoo.posterior import ChainPosterior, GuidePosterior, SamplePosterior
from zoo.runs import load_torch, saved_from_memory

GRID = torch.randn(32, 2, generator=torch.Generator().manual_seed(0))
ROWS = (GRID, (GRID[:, 0] * GRID[:, 1] > 0).long())
VAL = (ROWS[0][::4], ROWS[1][::4])
SUBNETWORK = {"family": "subnetwork", "selection": {"size": 6}, "map": {"num_steps": 20, "batch_size": 16}}
# One small fit per kind of posterior: a guide (SVI; Laplace over a subnetwork whose MAP stage is fitted too),
# chains (MCMC, SG-MCMC), SWAG's moments.
CASES = {
    "svi": ({}, {"method": "svi", "num_steps": 20, "batch_size": 16, "lr": 0.01, "predictive_samples": 4}),
    "hmc": ({}, {"method": "hmc", "num_chains": 2, "warmup_steps": 6, "num_samples": 4, "predictive_samples": 4,
                 "max_leapfrog_steps": 8}),
    "sgld": ({}, {"method": "sgld", "num_chains": 2, "epochs": 4, "burn_in_epochs": 2, "batch_size": 16,
                  "thin": 1, "predictive_samples": 4}),
    "swag": ({}, {"method": "swag", "pretrain_epochs": 1, "epochs": 4, "rank": 2, "batch_size": 16,
                  "predictive_samples": 4}),
    "laplace": (SUBNETWORK, {"method": "laplace", "tune_iterations": 2, "predictive_samples": 4}),
}


def net() -> nn.Module:
    torch.manual_seed(0)  # the same initialisation for every fit of a comparison
    return nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 2))


def bnn(case: str = "svi") -> zoo.BNN:
    family, inference = CASES[case]
    return zoo.BNN(net(), family=family or None, inference=inference, device="cpu")


def draws(model: zoo.BNN):
    pyro.set_rng_seed(7)
    return model.predict(GRID[:5]).draws


def assert_same_draws(a: zoo.BNN, b: zoo.BNN) -> None:
    assert torch.equal(draws(a).log_probs, draws(b).log_probs)


def files(run: Path) -> set[str]:
    """The run directory's files (the lock and checkpoints' previous versions aside)."""
    return {str(p.relative_to(run)) for p in run.rglob("*")
            if p.is_file() and not p.name.endswith(".lock") and ".prev." not in p.name}


def log_lines(run: Path) -> list[str]:
    """The run's train.log, its wall times aside."""
    return [re.sub(r"[0-9.]+ ?s\b", "<time>", line) for line in (run / "train.log").read_text().splitlines()]


def test_a_fit_without_out_writes_nothing_and_needs_no_temporary_directory(tmp_path, monkeypatch):
    scratch = set(glob.glob(os.path.join(tempfile.gettempdir(), "zoo-bnn-*")))

    def refuse(*args, **kwargs):
        raise AssertionError("a fit without out made a temporary file or directory")

    for name in ("TemporaryDirectory", "mkdtemp", "mkstemp", "NamedTemporaryFile"):
        monkeypatch.setattr(tempfile, name, refuse)
    monkeypatch.chdir(tmp_path)
    model = bnn().fit(ROWS, val=VAL, progress=False)
    monkeypatch.undo()
    assert model.run_dir is None and model.plot is None and set(model.metrics) >= {"accuracy", "nll"}
    assert list(tmp_path.iterdir()) == []
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "zoo-bnn-*"))) == scratch
    assert model.predict(GRID[:3]).probs.shape == (3, 2)
    assert set(model.evaluate(VAL)) >= {"accuracy", "nll"}
    assert set(model.posterior.sample(3)) >= {"0.weight", "2.bias"}


@pytest.mark.parametrize("case", list(CASES))
def test_an_in_memory_fit_predicts_as_the_fit_with_a_run_directory_and_saves_that_directory(case, tmp_path):
    in_memory = bnn(case).fit(ROWS, val=VAL, progress=False)
    written = bnn(case).fit(ROWS, val=VAL, out=tmp_path / "written", progress=False)
    assert in_memory.run_dir is None
    assert_same_draws(in_memory, written)
    assert in_memory.metrics == {**written.metrics, "train_seconds": in_memory.metrics["train_seconds"]}

    saved = in_memory.save(tmp_path / "saved")
    assert files(saved) == files(tmp_path / "written")  # spec, net, data, the fit, metrics, log, plot, the family's
    assert in_memory.plot == saved / "reliability.png" and saved_from_memory(saved)
    assert not saved_from_memory(tmp_path / "written")
    loaded = zoo.load(saved)
    assert_same_draws(loaded, in_memory)
    assert_same_draws(loaded, zoo.load(tmp_path / "written"))
    assert loaded.evaluate(VAL) == pytest.approx(in_memory.evaluate(VAL), rel=1e-6)
    assert log_lines(saved) == log_lines(tmp_path / "written")
    if isinstance(in_memory.posterior, ChainPosterior):  # the chains' diagnostics need no run directory
        assert {"posterior", "sample_stats"} <= set(in_memory.to_inference_data().groups())
    if case == "laplace":  # the MAP stage was kept in memory and written where other runs read it
        map_dir = saved / "map"
        assert (map_dir / "point_estimate.pt").is_file() and (map_dir / "checkpoint.pt").is_file()
        for name, value in load_torch(tmp_path / "written" / "map" / "point_estimate.pt").items():
            assert torch.equal(load_torch(map_dir / "point_estimate.pt")[name], value), name
        assert torch.equal(loaded.family.indices, written.family.indices)
        reuse = zoo.BNN(net(), family={**SUBNETWORK, "map_from": str(map_dir)}, inference=CASES[case][1],
                        device="cpu").fit(ROWS, progress=False)
        assert torch.equal(reuse.family.indices, in_memory.family.indices)
        torch.testing.assert_close(reuse.guide.scale_tril["subnet"], in_memory.guide.scale_tril["subnet"])


def test_settings_given_to_fit_hold_for_that_fit_only(tmp_path):
    model = zoo.BNN(net(), inference={"num_steps": 5, "batch_size": 16}, device="cpu")
    built = model.spec
    assert built.inference.lr != 0.05
    model.fit(ROWS, progress=False, num_steps=7, lr=0.05)
    assert (model.spec.inference.num_steps, model.spec.inference.lr) == (7, 0.05)  # what the fit ran with
    first = model.save(tmp_path / "first")
    assert len(load_torch(first / "checkpoint.pt")["losses"]) == 7
    assert zoo.load(first).spec.inference.num_steps == 7
    model.fit(ROWS, progress=False)  # the spec the BNN was built with, not the first fit's
    assert (model.spec.inference.num_steps, model.spec.inference.lr) == (5, built.inference.lr)
    assert len(load_torch(model.save(tmp_path / "second") / "checkpoint.pt")["losses"]) == 5


def test_resume_needs_out_and_a_run_saved_from_memory_does_not_resume(tmp_path):
    with pytest.raises(ZooInputError, match="resume: got True; .*pass out=DIR"):
        bnn().fit(ROWS, progress=False, resume=True)
    saved = bnn().fit(ROWS, progress=False).save(tmp_path / "saved")
    with pytest.raises(ZooInputError, match="saved from a fit kept in memory.*nothing to resume"):
        bnn().fit(ROWS, out=saved, resume=True, progress=False)
    with pytest.raises(ZooInputError, match="already holds a run"):
        bnn().fit(ROWS, out=saved, progress=False)


def test_a_posterior_only_its_fitter_writes_is_refused_by_save_naming_out():
    fitted = bnn().fit(ROWS, progress=False)
    assert isinstance(fitted.posterior, GuidePosterior)
    assert SVI().fit_record(SimpleNamespace(posterior=fitted.posterior, seconds=1.0))["done"] is True

    class PriorDraws(InferenceMethod):  # a method added outside the zoo, which says nothing of saving from memory
        names = ("prior_draws",)

        def load(self, *args, **kwargs):
            raise NotImplementedError

    draws = SamplePosterior(fitted.family, fitted.posterior.sample(3))
    with pytest.raises(ZooInputError, match="prior_draws fit was kept in memory.*SamplePosterior.*out=DIR"):
        PriorDraws().fit_record(SimpleNamespace(posterior=draws, seconds=0.0))


def test_a_familys_own_files_count_as_a_fit_and_name_its_stage(tmp_path):
    subnetwork = bnn("laplace").fit(ROWS, out=tmp_path / "run", progress=False)
    assert subnetwork.spec.model.files and holds_a_fit(tmp_path / "run")
    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "map").mkdir()
    assert holds_a_fit(stage)
    (stage / "spec.yaml").write_text((tmp_path / "run" / "spec.yaml").read_text())
    with pytest.raises(ZooInputError, match=r"holds no checkpoint.pt \(only its MAP net so far\)"):
        zoo.load(stage)


def test_a_one_input_regression_given_in_python_plots_against_its_own_input_axis(tmp_path):
    """Inputs given in Python are not standardised by the zoo: the uncertainty plot takes them as they are (it
    raised on the missing input mean before), and save() writes the plot of a fit kept in memory."""
    torch.manual_seed(0)
    x = torch.linspace(-2, 2, 40).unsqueeze(1)
    y = torch.sin(3 * x).squeeze(1)
    net = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    fitted = zoo.BNN(net, device="cpu").fit((x[:30], y[:30]), val=(x[30:], y[30:]), num_steps=3, progress=False)
    assert fitted.plot is None
    fitted.save(tmp_path / "run")
    assert fitted.plot == tmp_path / "run" / "uncertainty.png" and fitted.plot.is_file()
