"""inference.lr_by for SWAG, MultiSWAG and SG-MCMC (zoo.inference.lr_choice): a whole run at each of the method's
candidate lrs (SWAG's each pretrained both ways where its pretraining is left open), SG-MCMC's reaching below the
lowest while it wins, the best on the calibration rows kept exactly as a run given its lr by hand, resumable, with
every candidate's divergence named. (SVI's choice, which continues one guide in place, is pinned in
tests/test_svi.py.)"""

from __future__ import annotations

import json

import pytest
import torch

from tests.test_mcmc import linear_spec
from zoo.errors import TrainingDiverged, ZooInputError
from zoo.inference import lr_choice, sgmcmc, swag
from zoo.inference.draws import SAMPLES_FILE
from zoo.inference.lr_choice import LR_CHOICE_DIR, chooses_lr
from zoo.inference.sgmcmc import SGMCMC
from zoo.inference.swag import SWAG, SWAG_FILE
from zoo.pipeline import prepare
from zoo.runs import CHOSEN_FILE, RunLog
from zoo.sections import LR_CANDIDATES
from zoo.spec import load_spec

CALIBRATION = {"name": "toy_gap", "n_train": 60, "calibration_fraction": 0.25}
# the prior's scale factor given, so the lr's choice is pinned alone (the factor's, made after it, in
# tests/test_prior_scale_choice.py)
SWAG_RUN = {"epochs": 4, "pretrain_epochs": 4, "batch_size": 15, "rank": 3, "prior_scale_factor": 1.0}
SGLD_RUN = {"num_chains": 2, "epochs": 8, "batch_size": 15, "burn_in_epochs": 2, "thin": 2, "prior_scale_factor": 1.0}


def _prepared(method: str, data: dict | None = None, **inference):
    tree = linear_spec(method, **inference)
    tree["data"] = data or CALIBRATION
    spec = load_spec(tree)
    return spec, *prepare(spec)[:3]


def _logged() -> tuple[RunLog, list[str]]:
    lines: list[str] = []
    return RunLog(None, echo=lines.append), lines


def _swag_moments(result) -> list[torch.Tensor]:
    return [result.posterior.mean, result.posterior.sq_mean, result.posterior.deviations]


def _draws(result) -> list[torch.Tensor]:
    return [result.draws[k] for k in sorted(result.draws)]


def _ladder_runs(scores: dict[str, float], candidates: tuple[float, ...], lower: tuple[float, ...],
                 values: list[str]) -> list[str]:
    """The runs a choice makes, by the rule, given each run's score (none diverging): every candidate lr at every
    open option (``values``, each key's tail after the lr), then each lower rung from the highest down while the
    lowest lr run so far scores best."""
    runs = [f"{lr:g}{v}" for lr in candidates for v in values]
    ran = list(candidates)
    for lr in sorted(lower, reverse=True):
        if float(min(runs, key=scores.__getitem__).split(",")[0]) != min(ran):
            break
        runs += [f"{lr:g}{v}" for v in values]
        ran.append(lr)
    return runs


def _scored_by_lr(monkeypatch, scores: dict[float, float]) -> None:
    """Make the calibration rows score each run by its lr alone, as ``scores`` says."""
    monkeypatch.setattr(lr_choice, "calibration_score",
                        lambda posterior, *_: (scores[posterior.settings["lr"]], "NLL"))


# each method's candidates: every lr at every option of the settings it leaves open (SWAG's pretraining, SGLD's climb
# step, whether sghmc's burn-in climbs and at which step), each option by its key's tail in the log
OPEN_SETTINGS = {
    "swag": (swag.SWAG_LR_CANDIDATES, {f", pretrain_by {way}": {"pretrain_by": way} for way in ("sgd", "adam")}),
    "sgld": (sgmcmc.SGMCMC_LR_CANDIDATES, {f", explore_lr {c:g}": {"explore_lr": c} for c in LR_CANDIDATES}),
    "sghmc": (sgmcmc.SGMCMC_LR_CANDIDATES, {", explore_burn_in false": {"explore_burn_in": False}} | {
        f", explore_burn_in true, explore_lr {c:g}": {"explore_burn_in": True, "explore_lr": c}
        for c in LR_CANDIDATES}),
}


@pytest.mark.parametrize(("method", "settings", "files", "fitted"), [
    ("swag", SWAG_RUN, SWAG_FILE, _swag_moments),
    ("sgld", SGLD_RUN, SAMPLES_FILE, _draws),
    ("sghmc", SGLD_RUN, SAMPLES_FILE, _draws),
])
def test_the_kept_run_is_the_run_given_the_chosen_lr_by_hand(tmp_path, method, settings, files, fitted):
    spec, data, family, guide = _prepared(method, **settings)
    assert spec.inference.lr is None and spec.inference.lr_by is None and data.x_calibration is not None
    inference = SWAG() if method == "swag" else SGMCMC()
    log, lines = _logged()
    chosen = inference.fit(family, guide, data, spec.inference, 0, run_dir=tmp_path / "chosen", log=log,
                           progress=False)
    scores = {line.split(" lr ")[1].split(": ")[0]: float(line.split()[-5])
              for line in lines if "on the calibration rows" in line and "chosen" not in line}
    lrs, options = OPEN_SETTINGS[method]
    lower = () if method == "swag" else sgmcmc.SGMCMC_LR_LOWER
    assert list(scores) == _ladder_runs(scores, lrs, lower, list(options))
    best = min(scores, key=scores.get)
    assert f"lr {best}, chosen on 15 calibration rows" in lines[-1]
    lr, tail = best.split(",", 1)
    at_best = (swag if method == "swag" else sgmcmc).with_lr(spec.inference.model_copy(update=options[f",{tail}"]),
                                                               float(lr))
    by_hand = inference.fit(family, guide, data, at_best, 0, progress=False)
    for got, want in zip(fitted(chosen), fitted(by_hand), strict=True):
        assert torch.equal(got, want)
    assert (tmp_path / "chosen" / files).exists() and not (tmp_path / "chosen" / LR_CHOICE_DIR).exists()
    # the result names the choice by spec field, and the run keeps that record beside the kept run's files
    option = {f"inference.{field}": value for field, value in options[f",{tail}"].items()}
    assert chosen.chosen == {"inference.lr": float(lr)} | option
    assert json.loads((tmp_path / "chosen" / CHOSEN_FILE).read_text()) == chosen.chosen
    # resumed, the finished run is loaded as kept: nothing chosen again
    log, lines = _logged()
    again = inference.fit(family, guide, data, spec.inference, 0, run_dir=tmp_path / "chosen", resume=True, log=log,
                          progress=False)
    assert not any("calibration rows" in line for line in lines)
    for got, want in zip(fitted(again), fitted(chosen), strict=True):
        assert torch.equal(got, want)
    assert again.chosen == chosen.chosen


def test_an_interrupted_choice_resumes_the_candidates_where_they_stopped(tmp_path, monkeypatch):
    spec, data, family, guide = _prepared("swag", **SWAG_RUN, checkpoint_every=5)
    whole = SWAG().fit(family, guide, data, spec.inference, 0, progress=False)
    steps = (SWAG_RUN["epochs"] + SWAG_RUN["pretrain_epochs"]) * 3  # 45 training rows in batches of 15
    moves, crashed, sgd_move, adam_move = [], [], swag.sgd_move, swag.adam_move

    def crashing(move):
        def counted(*args, **kwargs):
            moves.append(1)
            if len(moves) == steps + 17 and not crashed:  # the second candidate's step 16: its step 15 is on disk
                crashed.append(1)
                raise RuntimeError("the machine went down")
            return move(*args, **kwargs)
        return counted

    monkeypatch.setattr(swag, "sgd_move", crashing(sgd_move))
    monkeypatch.setattr(swag, "adam_move", crashing(adam_move))
    with pytest.raises(RuntimeError, match="went down"):
        SWAG().fit(family, guide, data, spec.inference, 0, run_dir=tmp_path, progress=False)
    assert not (tmp_path / SWAG_FILE).exists()
    assert sorted(p.name for p in (tmp_path / LR_CHOICE_DIR).iterdir()) == ["0.003_adam", "0.003_sgd"]
    moves.clear()
    resumed, run_swag = [], swag.run_swag
    monkeypatch.setattr(swag, "run_swag", lambda fit: resumed.append(fit.resume) or run_swag(fit))
    again = SWAG().fit(family, guide, data, spec.inference, 0, run_dir=tmp_path, resume=True, progress=False)
    assert resumed == [True, True] + [False] * 4  # the first read back, the second from its step 15, the rest fresh
    assert len(moves) == (steps - 15) + 4 * steps
    for got, want in zip(_swag_moments(again), _swag_moments(whole), strict=True):
        assert torch.equal(got, want)


def test_a_diverging_candidate_loses_and_all_diverging_names_each(monkeypatch):
    spec, data, family, guide = _prepared("sgld", **SGLD_RUN, explore_lr=0.01)  # the lr alone open
    run_sgmcmc = sgmcmc.run_sgmcmc

    def diverging_at(bad):
        def run(fit, climbs=None):
            if fit.spec.lr in bad:
                raise TrainingDiverged(f"sgld diverged at lr {fit.spec.lr:g}")
            return run_sgmcmc(fit, climbs)
        return run

    monkeypatch.setattr(sgmcmc, "run_sgmcmc", diverging_at({0.1}))
    log, lines = _logged()
    with monkeypatch.context() as rows:
        _scored_by_lr(rows, {0.01: 2.0, 0.03: 1.0})  # the rows prefer 0.03: the grid reaches no lower
        SGMCMC().fit(family, guide, data, spec.inference, 0, log=log, progress=False)
    assert any("lr 0.1 diverged" in line for line in lines) and "0.1: inf" in lines[-1]
    assert lines[-1].startswith("sgld: lr 0.03, chosen") and not any("lower" in line for line in lines)
    # every candidate diverging: the lower rungs run, and the best of them is kept as a run given it by hand
    monkeypatch.setattr(sgmcmc, "run_sgmcmc", diverging_at(set(sgmcmc.SGMCMC_LR_CANDIDATES)))
    log, lines = _logged()
    kept = SGMCMC().fit(family, guide, data, spec.inference, 0, log=log, progress=False)
    assert "sgld: every lr run diverged; the choice runs 0.003" in lines
    assert "sgld: the lowest lr run, 0.003, scored best; the choice runs 0.001" in lines
    assert lines[-1].startswith(("sgld: lr 0.001, chosen", "sgld: lr 0.003, chosen"))
    by_hand = SGMCMC().fit(family, guide, data, sgmcmc.with_lr(spec.inference, kept.settings["lr"]), 0,
                           progress=False)
    assert kept.settings["lr"] in sgmcmc.SGMCMC_LR_LOWER
    for got, want in zip(_draws(kept), _draws(by_hand), strict=True):
        assert torch.equal(got, want)
    monkeypatch.setattr(sgmcmc, "run_sgmcmc", diverging_at({*sgmcmc.SGMCMC_LR_CANDIDATES, *sgmcmc.SGMCMC_LR_LOWER}))
    with pytest.raises(TrainingDiverged, match="every candidate lr .0.01: .*0.03: .*0.1: .*0.003: .*0.001: sgld"):
        SGMCMC().fit(family, guide, data, spec.inference, 0, progress=False)


@pytest.mark.parametrize(("scores", "runs", "kept"), [
    ({0.01: 1.0, 0.03: 2.0, 0.1: 3.0, 0.003: 0.5, 0.001: 0.7}, (0.01, 0.03, 0.1, 0.003, 0.001), 0.003),
    ({0.01: 1.0, 0.03: 2.0, 0.1: 3.0, 0.003: 0.5, 0.001: 0.4}, (0.01, 0.03, 0.1, 0.003, 0.001), 0.001),
    ({0.01: 1.0, 0.03: 2.0, 0.1: 3.0, 0.003: 1.5}, (0.01, 0.03, 0.1, 0.003), 0.01),
    ({0.01: 2.0, 0.03: 1.0, 0.1: 3.0}, (0.01, 0.03, 0.1), 0.03),
])
def test_a_choice_on_its_grids_lower_edge_reaches_down_while_the_lowest_wins(monkeypatch, scores, runs, kept):
    """Where the lowest candidate lr scores best, the choice runs the next rung below, and goes on down while the
    lowest lr run keeps scoring best; where a higher lr wins, it runs the candidates alone. The kept run is the best
    of all it ran."""
    spec, data, family, guide = _prepared("sgld", **SGLD_RUN, explore_lr=0.01)  # the lr alone open
    _scored_by_lr(monkeypatch, scores)
    seen, run_sgmcmc = [], sgmcmc.run_sgmcmc
    monkeypatch.setattr(sgmcmc, "run_sgmcmc", lambda fit, climbs=None: seen.append(fit.spec.lr)
                        or run_sgmcmc(fit, climbs))
    log, lines = _logged()
    result = SGMCMC().fit(family, guide, data, spec.inference, 0, log=log, progress=False)
    assert tuple(seen) == runs and result.settings["lr"] == kept
    assert lines[-1].startswith(f"sgld: lr {kept:g}, chosen")
    reasons = [line for line in lines if "; the choice runs " in line]
    assert reasons == [f"sgld: the lowest lr run, {above:g}, scored best; the choice runs {lr:g}"
                       for above, lr in zip((0.01, 0.003), runs[3:], strict=False)]


def test_the_lr_is_chosen_only_where_it_is_unset_and_calibration_rows_exist():
    spec = load_spec(linear_spec("swag")).inference
    assert not chooses_lr(spec, False) and chooses_lr(spec, True)
    assert not chooses_lr(spec.model_copy(update={"lr": 0.003}), True)
    assert not chooses_lr(spec.model_copy(update={"lr_by": "fixed"}), True)
    with pytest.raises(ZooInputError, match="needs rows held out of training"):
        chooses_lr(spec.model_copy(update={"lr_by": "calibration"}), False)
    with pytest.raises(ZooInputError, match="lr_by: calibration chooses the lr, and lr is set"):
        load_spec(linear_spec("sghmc", lr=0.01, lr_by="calibration"))
    # without calibration rows: the default lr, SWAG's pretraining at its default too
    fixed = swag.with_lr(spec, swag.DEFAULT_SWAG_LR)
    assert (fixed.lr, fixed.pretrain_lr, fixed.lr_by) == (0.01, 0.05, "fixed")
    assert fixed.pretrain_by == "sgd"  # an unset pretraining is SGD's where nothing chooses it
    # a chosen lr scales an unset pretraining lr with it (Adam's a third of it), and leaves a set one alone
    assert swag.with_lr(spec, 0.001).pretrain_lr == pytest.approx(0.005)
    assert swag.with_lr(spec.model_copy(update={"pretrain_by": "adam"}), 0.03).pretrain_lr == pytest.approx(0.01)
    assert swag.with_lr(spec.model_copy(update={"pretrain_lr": 0.02}), 0.001).pretrain_lr == 0.02


@pytest.mark.parametrize("settings", [{"pretrain_by": "sgd"}, {"pretrain_by": "adam"}, {"pretrain_lr": 0.02},
                                      {"pretrain_epochs": 0, "epochs": 8}])
def test_swag_chooses_the_lr_alone_where_its_pretraining_is_set_or_absent(monkeypatch, settings):
    spec, data, family, guide = _prepared("swag", **{**SWAG_RUN, **settings})
    seen = []
    run_swag = swag.run_swag
    monkeypatch.setattr(swag, "run_swag", lambda fit: seen.append((fit.spec.lr, fit.spec.pretrain_by))
                        or run_swag(fit))
    SWAG().fit(family, guide, data, spec.inference, 0, progress=False)
    way = settings.get("pretrain_by", "sgd")
    assert seen == [(lr, way) for lr in swag.SWAG_LR_CANDIDATES]


@pytest.mark.parametrize(("method", "settings", "per_lr"), [
    ("sgld", {}, [(True, step) for step in LR_CANDIDATES]),  # its climb's step open
    ("sgld", {"explore_lr": 0.003}, [(True, 0.003)]),  # a climb step given: the lr alone
    ("sgld", {"explore_burn_in": False}, [(False, None)]),
    # sghmc's burn-in left open: no climb, or a climb at each of the MAP's steps (which serves depends on the net,
    # as the MAP's lr does: mnist5k's MLP), or at the step given
    ("sghmc", {}, [(False, None), *((True, step) for step in LR_CANDIDATES)]),
    ("sghmc", {"explore_lr": 0.003}, [(False, None), (True, 0.003)]),
    ("sghmc", {"explore_burn_in": True}, [(True, step) for step in LR_CANDIDATES]),  # told to climb: SGLD's choice
    ("sghmc", {"explore_burn_in": False}, [(False, None)]),
    ("sghmc", {"preconditioner": "scale_adapted"}, [(False, None)]),  # a metric from noisy steps
    ("sghmc", {"epochs": 1, "burn_in_epochs": None, "batch_size": 8}, [(False, None)]),  # 6 steps, thin 2
])
def test_sgmcmc_runs_each_lr_at_the_burn_in_options_its_spec_leaves_open(monkeypatch, method, settings, per_lr):
    """Each candidate lr runs at every burn-in option the spec leaves open, and at the burn-in given by hand alone;
    so where a preconditioner is estimated from the burn-in, and where a climbing burn-in would leave sghmc's short
    run no draw (the run that does not climb still keeps one)."""
    spec, data, family, guide = _prepared(method, **{**SGLD_RUN, **settings})
    _scored_by_lr(monkeypatch, {0.01: 2.0, 0.03: 1.0, 0.1: 3.0})  # a candidate above the lowest wins: none lower
    seen = []
    run_sgmcmc = sgmcmc.run_sgmcmc
    monkeypatch.setattr(sgmcmc, "run_sgmcmc", lambda fit, climbs=None: seen.append(
        (fit.spec.lr, fit.spec.explore_burn_in, fit.spec.explore_lr)) or run_sgmcmc(fit, climbs))
    SGMCMC().fit(family, guide, data, spec.inference, 0, progress=False)
    assert seen == [(lr, *run) for lr in sgmcmc.SGMCMC_LR_CANDIDATES for run in per_lr]


def test_an_exploring_burn_in_climbs_at_its_own_step(monkeypatch):
    """explore_lr is the step each climbing Adam move takes; unset, the MAP fit's default."""
    adam_move = sgmcmc.adam_move
    for given, step in ((0.003, 0.003), (None, sgmcmc.EXPLORE_LR)):
        spec, data, family, guide = _prepared("sgld", **SGLD_RUN, lr=0.01, explore_lr=given)
        steps: set[float] = set()
        monkeypatch.setattr(sgmcmc, "adam_move", lambda *args, seen=steps: seen.add(args[5]) or adam_move(*args))
        result = SGMCMC().fit(family, guide, data, spec.inference, 0, progress=False)
        assert steps == {step}
        # the kept run records its climb, in memory as a reloaded run does
        assert result.posterior.settings == {"lr": 0.01, "steps": 24, "explore_lr": step, "explore_steps": 6}


def test_a_fit_without_calibration_rows_runs_once_at_the_default_lr(monkeypatch):
    spec, data, family, guide = _prepared("sgld", {"name": "toy_gap", "n_train": 40}, **SGLD_RUN)
    assert data.x_calibration is None
    seen = []
    monkeypatch.setattr(lr_choice, "calibration_score", lambda *a: pytest.fail("nothing to score on"))
    run_sgmcmc = sgmcmc.run_sgmcmc
    monkeypatch.setattr(sgmcmc, "run_sgmcmc", lambda fit, climbs=None: seen.append(fit.spec.lr)
                        or run_sgmcmc(fit, climbs))
    result = SGMCMC().fit(family, guide, data, spec.inference, 0, progress=False)
    assert seen == [sgmcmc.DEFAULT_SGMCMC_LR] and result.settings["lr"] == sgmcmc.DEFAULT_SGMCMC_LR


@pytest.mark.parametrize("method", ["sgld", "sghmc"])
def test_sgmcmcs_candidates_share_each_climb_and_keep_the_runs_they_would_have_made(monkeypatch, method):
    """The climb does not depend on the sampler's lr: each Adam step's climb runs once, the other candidates start
    where it ended, and the kept run is still the run given its lr and step by hand."""
    spec, data, family, guide = _prepared(method, **SGLD_RUN)
    moves, adam_move = [], sgmcmc.adam_move
    monkeypatch.setattr(sgmcmc, "adam_move", lambda *args: moves.append(args[5]) or adam_move(*args))
    SGMCMC().fit(family, guide, data, spec.inference, 0, progress=False)
    climb = sgmcmc.burn_in_steps(spec.inference, 3)  # 45 training rows in batches of 15
    assert sorted(moves) == sorted(step for step in LR_CANDIDATES for _ in range(climb))  # a climb per step


def test_a_chosen_sgmcmc_fit_on_a_loader_is_the_fit_given_its_choice_by_hand(monkeypatch):
    """Through zoo.BNN on a shuffling DataLoader (its batches streamed): a run that starts where another's climb
    ended takes the minibatches its own climb would have left it at, and the posterior records what was chosen.
    The rows are made to prefer lr 0.1 after a climb at 0.003, a run that starts from the second run's climb."""
    import zoo

    monkeypatch.setattr(lr_choice, "calibration_score", lambda posterior, *_: (
        0.0 if (posterior.settings["lr"], posterior.settings["explore_lr"]) == (0.1, 0.003) else 1.0, "NLL"))

    x = torch.randn(90, 3, generator=torch.Generator().manual_seed(1))
    y = (x[:, 0] - x[:, 1] > 0).long()

    def fitted(**inference):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:70], y[:70]), batch_size=16,
                                             shuffle=True, generator=torch.Generator().manual_seed(2))
        bnn = zoo.BNN(net, member="sgld", device="cpu", seed=0, **({"inference": inference} if inference else {}))
        return bnn.fit(loader, val=(x[70:], y[70:]), epochs=4, progress=False).posterior

    chosen = fitted()
    assert (chosen.settings["lr"], chosen.settings["explore_lr"]) == (0.1, 0.003)
    by_hand = fitted(lr=0.1, explore_lr=0.003)
    for name, draws in chosen.chains.items():
        assert torch.equal(draws, by_hand.chains[name])
