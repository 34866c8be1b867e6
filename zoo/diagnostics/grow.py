"""Growing a many-chain HMC run until its convergence verdict passes (``zoo train --add-draws N
[--until-converged] [--budget-minutes M]``, and the same in Python).

A finished ``hmc`` run resumed with a larger ``inference.num_samples`` continues every chain where it stopped, with
its adapted step size, mass matrix, trajectory length and random stream (:func:`zoo.pipeline.train` with
``resume=True``). :func:`grow_until_converged` does that in rounds of ``add_draws`` draws per chain and judges the
run after each round with :func:`convergence_verdict` (the checks of :func:`zoo.diagnostics.diagnose`), so that a
reference run can be taken to a passing verdict by one call, from a script as from the command line. It lives here,
above the pipeline, because it needs both the training and the verdict.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoo.bnn import BNN, TrainingData
from zoo.diagnostics.checks import ESS_MIN, RHAT_MAX, Diagnosis, draws_would_help, run_diagnosis
from zoo.errors import ZooInputError
from zoo.pipeline import RunSummary
from zoo.spec import RunSpec, load_spec

NOT_CONVERGED_EXIT = 3  # the exit of zoo train (and zoo diagnose --strict) when a convergence check fails


@dataclass(frozen=True)
class ConvergenceVerdict:
    """A run's convergence verdict: the checks, their one line and whether they fail the run.

    :param result: the :func:`zoo.diagnostics.diagnose` result (also written to the run's diagnostics.json).
    :param line: the verdict's line (:func:`zoo.diagnostics.verdict`): ``converged: ...``, ``warning: ...`` or
        ``NOT CONVERGED: ...``.
    :param fails: a check failed for an exact sampler's draws (nuts, hmc), or for any sampler's with ``strict``.
    """

    result: dict[str, Any]
    line: str
    fails: bool

    @property
    def exit_code(self) -> int:
        """:data:`NOT_CONVERGED_EXIT` when the verdict fails the run, else 0 (what ``zoo train`` exits with)."""
        return NOT_CONVERGED_EXIT if self.fails else 0


def convergence_verdict(run_dir: str | Path, strict: bool = False) -> ConvergenceVerdict:
    """Diagnose a run's chains (as ``zoo diagnose``, writing its files and plots) and judge them.

    Exact samplers' draws (nuts, hmc) fail on any warning; SG-MCMC's warnings are a warning only (its chains sit in
    separate modes without a Metropolis correction) unless ``strict``.

    :param run_dir: a run directory of draws stored chain by chain.
    :param strict: fail on the warnings of a sampler that is not exact too (``zoo train --strict``).
    :returns: the checks, their line and whether they fail the run.
    :raises ZooInputError: when ``run_dir`` holds no run that can be loaded.
    """
    found = run_diagnosis(run_dir)
    found.save(run_dir)
    return verdict_of(found, strict)


def verdict_of(found: Diagnosis, strict: bool = False) -> ConvergenceVerdict:
    """A diagnosis judged as :func:`convergence_verdict` judges a run's.

    :param found: the checks (``BNN.diagnose()``).
    :param strict: fail on the warnings of a sampler that is not exact too.
    :returns: the verdict.
    """
    return ConvergenceVerdict(found.result, found.verdict, found.fails(strict))


def estimated_draws(draws: int, r_hat: float | None, ess: float | None) -> int:
    """Draws per chain a failing run may need: R-hat - 1 and 1 / ESS taken to shrink in proportion to the draws (a
    guide, not a promise: a chain stuck in another mode breaks the proportion).

    :param draws: the draws per chain so far.
    :param r_hat: the largest function-space R-hat (None: not measured).
    :param ess: the smallest function-space bulk/tail ESS (None: not measured).
    :returns: the draws per chain that would meet both thresholds at that rate (at least ``draws``).
    """
    need_r_hat = draws * (r_hat - 1.0) / (RHAT_MAX - 1.0) if r_hat is not None and r_hat > RHAT_MAX else draws
    need_ess = draws * ESS_MIN / ess if ess is not None and 0 < ess < ESS_MIN else draws
    return math.ceil(max(draws, need_r_hat, need_ess))


def check_value(result: dict[str, Any], starts: str) -> float | None:
    """The value of the check whose name starts with ``starts`` (``R-hat``, ``bulk/tail ESS``, ``divergences``) in a
    diagnosis result, or None where it was not made.

    :param result: a diagnosis result (``diagnostics.json``).
    :param starts: the start of the check's name.
    :returns: its value.
    """
    values = [c["value"] for c in result["checks"] if c["check"].startswith(starts) and c["value"] is not None]
    return float(values[0]) if values else None


def duration(minutes: float, unit: bool = False) -> str:
    """A time in words: ``"40 seconds"``, ``"20 minutes"``, ``"1.5 hours"`` (``unit``: as an adjective,
    ``"20-minute"``).

    :param minutes: the time in minutes.
    :param unit: hyphenate the number and a singular unit (``"20-minute budget"``).
    :returns: the words.
    """
    value, name = ((minutes * 60, "second") if minutes < 1 else (minutes, "minute") if minutes < 120
                   else (minutes / 60, "hour"))
    value = float(f"{value:.3g}") if value < 10 else round(value)
    if unit:
        return f"{value:g}-{name}"
    return f"{value:g} {name}{'' if value == 1 else 's'}"


def still_to_go(result: dict[str, Any], draws: int, seconds_per_draw: float | None) -> str:
    """How far a failing verdict is from passing, and how long the rest may take: the draws per chain
    :func:`estimated_draws` expects to pass, priced at ``seconds_per_draw``.

    :param result: the failing diagnosis result.
    :param draws: the draws per chain so far.
    :param seconds_per_draw: the run's seconds per draw per chain (all chains at once); None: not priced.
    :returns: the sentence.
    """
    r_hat, ess = check_value(result, "R-hat"), check_value(result, "bulk/tail ESS")
    need = estimated_draws(draws, r_hat, ess)
    if need <= draws:
        return (f"at {draws:,} draws per chain the failed checks are not R-hat or ESS (divergences, BFMI): more draws "
                "will not fix them; see the advice above")
    minutes = None if seconds_per_draw is None else (need - draws) * seconds_per_draw / 60
    priced = ("" if minutes is None else f", about {duration(minutes)} more at this run's pace" if minutes >= 1
              else ", under a minute more at this run's pace")
    return (f"about {need:,} draws per chain may pass (R-hat and ESS taken to improve in proportion to the "
            f"draws){priced}")


@dataclass(frozen=True)
class GrowResult:
    """Where :func:`grow_until_converged` left a run.

    :param run_dir: the run directory.
    :param rounds: the rounds of sampling run (0 when the finished run passed already; a round that finishes a run
        cut short counts).
    :param draws_per_chain: the run's draws per chain now (its ``inference.num_samples``).
    :param passed: whether the last verdict passed (``exit_code`` 0).
    :param exit_code: what ``zoo train --add-draws`` exits with: 0, or :data:`NOT_CONVERGED_EXIT` when the last
        verdict fails the run.
    :param verdict: the last verdict.
    :param summary: the last round's outputs and metrics (None when no round ran).
    :param stopped_short: why the rounds stopped before a passing verdict, when they did (else None): the budget ran
        out (how far the run is from passing and how long the rest may take), or R-hat and ESS pass and the checks
        that fail are ones more draws do not fix (divergences, BFMI).
    :param bnn: the fitted run (its draws, data and verdict: ``bnn.diagnose()``).
    """

    run_dir: Path
    rounds: int
    draws_per_chain: int
    passed: bool
    exit_code: int
    verdict: ConvergenceVerdict
    summary: RunSummary | None = None
    stopped_short: str | None = None
    bnn: BNN | None = None


def check_growth(add_draws: int | None, until_converged: bool, budget_minutes: float | None) -> None:
    """Refuse round settings :func:`grow_until_converged` cannot follow (the messages name ``zoo train``'s options).

    :param add_draws: the draws per chain each round adds.
    :param until_converged: whether rounds go on while the verdict fails.
    :param budget_minutes: the minutes after which no new round starts.
    :raises ZooInputError: ``add_draws`` below 1 (or None); a budget that is not positive, or without
        ``until_converged``.
    """
    if add_draws is None or add_draws < 1:
        raise ZooInputError("--add-draws", add_draws, "give the draws per chain each round adds (1 or more); "
                            "--until-converged and --budget-minutes go with it")
    if budget_minutes is not None and (not until_converged or budget_minutes <= 0):
        raise ZooInputError("--budget-minutes", budget_minutes, "give a positive number of minutes, with "
                            "--until-converged (it bounds the rounds)")


def grow_until_converged(run_dir: str | Path, add_draws: int, *, spec: RunSpec | dict | str | Path | None = None,
                         data: TrainingData | None = None, val: Any = None, until_converged: bool = True,
                         budget_minutes: float | None = None, started: float | None = None, strict: bool = False,
                         progress: bool = True,
                         echo: Callable[[str], None] | None = print,
                         on_round: Callable[[RunSummary, int], None] | None = None,
                         on_verdict: Callable[[ConvergenceVerdict], None] | None = None) -> GrowResult:
    """Continue a finished many-chain HMC run for ``add_draws`` more draws per chain, then judge it; with
    ``until_converged``, again while the verdict fails and the budget lasts.

    What ``zoo train SPEC --out RUN --add-draws N [--until-converged [--budget-minutes M]]`` and
    :func:`zoo.reference` run. With ``until_converged`` the finished run's own verdict comes first, and a run that
    passes gets no round. A run cut short (Ctrl-C, SIGTERM, a lost machine) is first finished at the draws it asked
    for. Each round is an ordinary resume (:meth:`zoo.BNN.fit` with ``resume=True``), checkpointed as any run, so a
    round stopped by an interrupt (``KeyboardInterrupt`` propagates, the run checkpointed) is finished by the same
    call. The budget bounds the rounds: none starts after ``budget_minutes``, and the one running then is finished.
    Each verdict writes what ``zoo diagnose`` writes into the run.

    :param run_dir: the run directory of a finished (or cut short) ``hmc`` run.
    :param add_draws: the draws per chain each round adds (1 or more).
    :param spec: the spec to continue (its ``inference.num_samples`` is set per round; it must otherwise be the
        run's, see :func:`zoo.spec.run_identity`); None reads the run's own spec.yaml. A net given in Python comes
        with the spec (``bnn.spec``).
    :param data: the training rows of data given in Python (as :meth:`zoo.BNN.fit` takes them); None: the data set
        the spec names.
    :param val: with ``data``, the rows the run was scored on (:meth:`zoo.BNN.fit`'s ``val``).
    :param until_converged: add rounds until the verdict passes or the budget is spent; False adds one round.
    :param budget_minutes: with ``until_converged``, start no new round after this many minutes (None: no bound).
    :param started: when the budget began, a ``time.monotonic()`` reading (None: now).
    :param strict: fail the verdict on a sampler that is not exact too (see :func:`convergence_verdict`).
    :param progress: show the sampler's progress bars.
    :param echo: where the run's log lines and this function's progress lines go (None: nowhere).
    :param on_round: called after each round with its summary and the draws per chain it reached (e.g. to print
        its metrics).
    :param on_verdict: called with each verdict; None echoes its line.
    :returns: the run directory, the rounds run, the draws per chain, the last verdict with its exit code, and the
        fitted BNN.
    :raises ZooInputError: bad round settings (:func:`check_growth`), a ``run_dir`` that holds no MCMC run, or a
        run the resume refuses (another spec or other data; NUTS, which keeps no kernel to continue).
    """
    from zoo.inference.draws import SAMPLES_FILE
    from zoo.runs import SPEC_FILE, load_checkpoint

    check_growth(add_draws, until_converged, budget_minutes)
    run = Path(run_dir)
    if not (run / SPEC_FILE).is_file() or not (run / SAMPLES_FILE).is_file():
        raise ZooInputError("--out", str(run), "holds no MCMC run to add draws to: train it first, without "
                            "--add-draws")
    say = echo or (lambda line: None)
    begun = time.monotonic() if started is None else started
    deadline = None if budget_minutes is None else begun + 60 * budget_minutes
    stored = load_spec(run / SPEC_FILE)
    base = stored if spec is None else spec if isinstance(spec, RunSpec) else load_spec(spec)
    total = stored.inference.num_samples

    def fitted(draws: int) -> BNN:
        """The run resumed to ``draws`` per chain (a finished run at its draws is read back, not sampled)."""
        inference = base.inference.model_copy(update={"num_samples": draws})
        return BNN.from_spec(base.model_copy(update={"inference": inference})).fit(
            base.data if data is None else data, val=val, out=run, resume=True, progress=progress, echo=echo)

    def judged(bnn: BNN) -> ConvergenceVerdict:
        found = bnn.diagnose()
        found.save(run)
        judgement = verdict_of(found, strict)
        (on_verdict or (lambda v: say(v.line)))(judgement)
        return judgement

    found: ConvergenceVerdict | None = None
    bnn: BNN | None = None
    summary: RunSummary | None = None
    adding = load_checkpoint(run / SAMPLES_FILE).get("done", False)  # a round cut short is finished first
    if adding:
        if until_converged:
            bnn = fitted(total)
            found = judged(bnn)
            if found.exit_code == 0:
                say(f"{run}: converged at {total} draws per chain; no draws added")
                return GrowResult(run, 0, total, True, 0, found, bnn=bnn)
            if not draws_would_help(found.result):
                return _no_round_helps(run, 0, total, found, None, bnn, say)
        total += add_draws
    rounds = 0
    while True:
        if adding and found is not None and deadline is not None and time.monotonic() > deadline:
            reached = total - add_draws
            to_go = still_to_go(found.result, reached, _seconds_per_draw(run, stored.inference.warmup_steps))
            spent = (f"the {duration(budget_minutes, unit=True)} budget is spent: {reached} draws per chain so far; "
                     f"{to_go}; the same call adds more")
            say(spent)
            return GrowResult(run, rounds, reached, False, found.exit_code, found, summary, spent, bnn)
        say(f"{run}: sampling to {total} draws per chain")
        bnn = fitted(total)
        rounds += 1
        summary = RunSummary(bnn.run_dir, bnn.metrics, bnn.plot, bnn.chains)
        if on_round is not None:
            on_round(summary, total)
        found = judged(bnn)
        if found.exit_code == 0 or not until_converged:
            return GrowResult(run, rounds, total, found.exit_code == 0, found.exit_code, found, summary, bnn=bnn)
        if not draws_would_help(found.result):
            return _no_round_helps(run, rounds, total, found, summary, bnn, say)
        total += add_draws
        adding = True


def _no_round_helps(run: Path, rounds: int, draws: int, found: ConvergenceVerdict, summary: RunSummary | None,
                    bnn: BNN | None, say: Callable[[str], None]) -> GrowResult:
    """The rounds stopped because what fails is not what more draws fix (:func:`draws_would_help`)."""
    failed = "; ".join(c["check"] for c in found.result["checks"] if not c["ok"])
    line = (f"{run}: at {draws:,} draws per chain R-hat and ESS pass and the failed checks ({failed}) are not ones "
            "more draws fix: no round added; the warnings above say why and what would")
    say(line)
    return GrowResult(run, rounds, draws, False, found.exit_code, found, summary, line, bnn)


def _seconds_per_draw(run: Path, warmup_steps: int) -> float | None:
    """The sampling seconds per iteration (all chains at once, warm-up included) a finished run's checkpoint
    records, or None."""
    from zoo.inference.draws import SAMPLES_FILE
    from zoo.runs import load_checkpoint

    saved = load_checkpoint(run / SAMPLES_FILE)
    draws = saved.get("draws") or {}
    if not saved.get("seconds") or not draws:
        return None
    iterations = next(iter(draws.values())).shape[1] + warmup_steps
    return float(saved["seconds"]) / max(iterations, 1)
