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

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from zoo.diagnostics.checks import diagnose, verdict
from zoo.errors import ZooInputError
from zoo.pipeline import RunSummary, train
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
    result = diagnose(run_dir)
    fails = bool(result["warnings"]) and (result["exact_sampler"] or strict)
    return ConvergenceVerdict(result, verdict(result), fails)


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
    :param budget_spent: the line saying the budget ran out, when it stopped the rounds (else None).
    """

    run_dir: Path
    rounds: int
    draws_per_chain: int
    passed: bool
    exit_code: int
    verdict: ConvergenceVerdict
    summary: RunSummary | None = None
    budget_spent: str | None = None


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
                         until_converged: bool = True, budget_minutes: float | None = None, strict: bool = False,
                         progress: bool = True, echo: Callable[[str], None] | None = print,
                         on_round: Callable[[RunSummary, int], None] | None = None,
                         on_verdict: Callable[[ConvergenceVerdict], None] | None = None) -> GrowResult:
    """Continue a finished many-chain HMC run for ``add_draws`` more draws per chain, then judge it; with
    ``until_converged``, again while the verdict fails and the budget lasts.

    What ``zoo train SPEC --out RUN --add-draws N [--until-converged [--budget-minutes M]]`` runs. With
    ``until_converged`` the finished run's own verdict comes first, and a run that passes gets no round. A run cut
    short (Ctrl-C, SIGTERM, a lost machine) is first finished at the draws it asked for. Each round is an ordinary
    resume, checkpointed as any run, so a round stopped by an interrupt (``KeyboardInterrupt`` propagates, the run
    checkpointed) is finished by the same call. The budget bounds the rounds: none starts after ``budget_minutes``,
    and the one running then is finished.

    :param run_dir: the run directory of a finished (or cut short) ``hmc`` run.
    :param add_draws: the draws per chain each round adds (1 or more).
    :param spec: the spec to continue (its ``inference.num_samples`` is set per round; it must otherwise be the
        run's, see :func:`zoo.spec.run_identity`); None reads the run's own spec.yaml.
    :param until_converged: add rounds until the verdict passes or the budget is spent; False adds one round.
    :param budget_minutes: with ``until_converged``, start no new round after this many minutes (None: no bound).
    :param strict: fail the verdict on a sampler that is not exact too (see :func:`convergence_verdict`).
    :param progress: show the sampler's progress bars.
    :param echo: where the run's log lines and this function's progress lines go (None: nowhere).
    :param on_round: called after each round with its summary and the draws per chain it reached (e.g. to print
        its metrics).
    :param on_verdict: called with each verdict; None echoes its line.
    :returns: the run directory, the rounds run, the draws per chain, and the last verdict with its exit code.
    :raises ZooInputError: bad round settings (:func:`check_growth`), a ``run_dir`` that holds no MCMC run, or a
        run the resume refuses (another spec; NUTS, which keeps no kernel to continue).
    """
    from zoo.inference.draws import SAMPLES_FILE
    from zoo.runs import SPEC_FILE, load_checkpoint

    check_growth(add_draws, until_converged, budget_minutes)
    run = Path(run_dir)
    if not (run / SPEC_FILE).is_file() or not (run / SAMPLES_FILE).is_file():
        raise ZooInputError("--out", str(run), "holds no MCMC run to add draws to: train it first, without "
                            "--add-draws")
    say = echo or (lambda line: None)

    def judged(run_at: Path) -> ConvergenceVerdict:
        found = convergence_verdict(run_at, strict)
        (on_verdict or (lambda v: say(v.line)))(found)
        return found

    deadline = None if budget_minutes is None else time.monotonic() + 60 * budget_minutes
    stored = load_spec(run / SPEC_FILE)
    base = stored if spec is None else spec if isinstance(spec, RunSpec) else load_spec(spec)
    total = stored.inference.num_samples
    if load_checkpoint(run / SAMPLES_FILE).get("done", False):  # a round cut short is finished before a new one
        if until_converged:
            found = judged(run)
            if found.exit_code == 0:
                say(f"{run}: converged at {total} draws per chain; no draws added")
                return GrowResult(run, 0, total, True, 0, found)
        total += add_draws
    rounds = 0
    while True:
        say(f"{run}: sampling to {total} draws per chain")
        inference = base.inference.model_copy(update={"num_samples": total})
        summary = train(base.model_copy(update={"inference": inference}), run, resume=True, progress=progress,
                        echo=echo)
        rounds += 1
        if on_round is not None:
            on_round(summary, total)
        found = judged(summary.run_dir)
        done = GrowResult(summary.run_dir, rounds, total, found.exit_code == 0, found.exit_code, found, summary)
        if found.exit_code == 0 or not until_converged:
            return done
        if deadline is not None and time.monotonic() > deadline:
            spent = (f"the {budget_minutes:g}-minute budget is spent: {total} draws per chain so far; the same "
                     "command adds more")
            say(spent)
            return replace(done, budget_spent=spent)
        total += add_draws
