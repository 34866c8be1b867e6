"""zoo.diagnostics.grow_until_converged: the rounds behind ``zoo train --add-draws N --until-converged``, called
from Python on a tiny many-chain HMC run (the CLI's own output and refusals: tests/test_mcmc.py)."""

from __future__ import annotations

import pytest
import yaml

from tests.test_mcmc import linear_spec
from zoo import posterior_checks as checks
from zoo.diagnostics import (
    NOT_CONVERGED_EXIT,
    ConvergenceVerdict,
    check_growth,
    convergence_verdict,
    draws_would_help,
    grow_until_converged,
)
from zoo.errors import ZooInputError
from zoo.pipeline import train


def test_the_cli_exits_with_the_library_s_code():
    from zoo.cli import STRICT_EXIT

    assert STRICT_EXIT == NOT_CONVERGED_EXIT == ConvergenceVerdict({}, "", True).exit_code
    assert ConvergenceVerdict({}, "", False).exit_code == 0


@pytest.mark.parametrize("add_draws, until_converged, budget, field", [
    (None, True, None, "--add-draws"), (0, True, None, "--add-draws"),
    (5, False, 3.0, "--budget-minutes"), (5, True, 0.0, "--budget-minutes"),
])
def test_round_settings_it_cannot_follow_are_refused(add_draws, until_converged, budget, field):
    with pytest.raises(ZooInputError) as err:
        check_growth(add_draws, until_converged, budget)
    assert err.value.field == field


def test_a_directory_without_a_run_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(ZooInputError, match="holds no MCMC run to add draws to") as err:
        grow_until_converged(tmp_path / "empty", 5, echo=None)
    assert err.value.field == "--out" and not (tmp_path / "empty").exists()


def test_a_run_grows_round_by_round_until_its_verdict_passes_then_no_further(tmp_path, monkeypatch):
    for plot in ("plot_trace", "plot_energy", "plot_pair"):  # the plots are not what is tested here: seconds each
        monkeypatch.setattr(checks, plot, lambda *args, **kwargs: None)
    run = tmp_path / "run"
    train(linear_spec("hmc", num_chains=32, warmup_steps=150, num_samples=5), run, progress=False, echo=None)
    assert convergence_verdict(run).exit_code == NOT_CONVERGED_EXIT  # 160 draws: ESS < 400

    lines, verdicts, rounds = [], [], []
    spent = grow_until_converged(run, 2, budget_minutes=1e-6, progress=False, echo=lines.append,
                                 on_verdict=verdicts.append, on_round=lambda summary, total: rounds.append(total))
    # the finished run's own verdict, then no round: the budget was spent before one could start
    assert (spent.rounds, spent.draws_per_chain, spent.passed, spent.exit_code) == (0, 5, False, NOT_CONVERGED_EXIT)
    assert len(verdicts) == 1 and spent.verdict is verdicts[-1] and spent.verdict.fails and rounds == []
    assert spent.stopped_short.startswith("the 6e-05-second budget is spent: 5 draws per chain so far; about ")
    assert "draws per chain may pass" in spent.stopped_short and "more at this run's pace" in spent.stopped_short
    assert lines[-1] == spent.stopped_short and spent.bnn.chains and spent.run_dir == run

    grown = grow_until_converged(run, 100, progress=False, echo=None)  # the run's own spec.yaml, grown
    assert grown.passed and grown.exit_code == 0 and grown.stopped_short is None and grown.rounds >= 1
    assert grown.draws_per_chain == 5 + 100 * grown.rounds and grown.bnn.diagnose().passed
    assert grown.verdict.line.startswith("converged") and not grown.verdict.result["warnings"]
    assert yaml.safe_load((run / "spec.yaml").read_text())["inference"]["num_samples"] == grown.draws_per_chain

    lines.clear()
    again = grow_until_converged(run, 100, progress=False, echo=lines.append)
    assert (again.rounds, again.draws_per_chain, again.passed, again.summary) == (0, grown.draws_per_chain, True, None)
    assert lines[-1] == f"{run}: converged at {grown.draws_per_chain} draws per chain; no draws added"


def _result(r_hat: float, ess: float, bfmi_ok: bool) -> dict:
    return {"checks": [{"check": "R-hat, function space and lp (max)", "value": r_hat, "ok": r_hat <= 1.01},
                       {"check": "bulk/tail ESS, function space and lp (min)", "value": ess, "ok": ess >= 400},
                       {"check": "BFMI chain 0", "value": 0.3 if bfmi_ok else 0.25, "ok": bfmi_ok}]}


def test_only_failing_r_hat_or_ess_asks_for_more_draws():
    assert draws_would_help(_result(1.02, 900.0, True))
    assert draws_would_help(_result(1.005, 200.0, False))
    assert not draws_would_help(_result(1.005, 900.0, False))  # BFMI alone: draws do not raise it


def test_a_verdict_that_more_draws_cannot_fix_stops_the_rounds(tmp_path, monkeypatch):
    """R-hat and ESS passing with another check failing (BFMI, divergences): no round is added, and the result
    says why, not that a budget ran out."""
    from zoo.diagnostics import grow

    for plot in ("plot_trace", "plot_energy", "plot_pair"):
        monkeypatch.setattr(checks, plot, lambda *args, **kwargs: None)
    run = tmp_path / "run"
    train(linear_spec("hmc", num_chains=4, warmup_steps=50, num_samples=5), run, progress=False, echo=None)
    monkeypatch.setattr(grow, "draws_would_help", lambda result: False)
    lines: list[str] = []
    stuck = grow_until_converged(run, 100, progress=False, echo=lines.append)
    assert (stuck.rounds, stuck.draws_per_chain, stuck.passed, stuck.exit_code) == (0, 5, False, NOT_CONVERGED_EXIT)
    assert stuck.stopped_short == lines[-1] and "are not ones more draws fix: no round added" in lines[-1]
    assert yaml.safe_load((run / "spec.yaml").read_text())["inference"]["num_samples"] == 5
