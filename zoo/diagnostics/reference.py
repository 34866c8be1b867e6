"""``zoo.reference``: the exact posterior of the user's own net and data, as far as a budget allows.

The zoo's many-chain HMC (member ``hmc``) samples the net's posterior under the user's prior and likelihood, and
:func:`zoo.diagnostics.grow_until_converged` continues the chains round by round until the convergence verdict
passes or the budget is spent. The run directory holds every checkpoint, so a call that was interrupted (Ctrl-C,
SIGTERM, a closed notebook) or ran out of budget is continued by the same call again. :func:`zoo.compare` then
measures how far each approximation is from it.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from zoo import registry
from zoo.bnn import BNN, PartChoice, TrainingData
from zoo.diagnostics.grow import grow_until_converged
from zoo.errors import ZooInputError
from zoo.inference.draws import SAMPLES_FILE

UNITS = {"s": 1 / 60, "sec": 1 / 60, "second": 1 / 60, "seconds": 1 / 60, "m": 1.0, "min": 1.0, "minute": 1.0,
         "minutes": 1.0, "h": 60.0, "hour": 60.0, "hours": 60.0}
DEFAULT_BUDGET = "30min"


def budget_minutes(budget: float | str) -> float:
    """A budget in minutes: a number (minutes) or a string with its unit (``"90s"``, ``"20min"``, ``"1.5h"``).

    :param budget: the budget.
    :returns: the minutes.
    :raises ZooInputError: naming ``budget``, for anything but a positive, finite time.
    """
    if isinstance(budget, bool) or not isinstance(budget, int | float | str):
        raise ZooInputError("budget", budget, "give minutes as a number (30) or a time with its unit ('90s', "
                            "'20min', '1.5h')")
    minutes: float | None = None
    if isinstance(budget, str):
        found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*([a-z]*)\s*", budget.lower())
        if found and found.group(2) in {*UNITS, ""}:
            minutes = float(found.group(1)) * UNITS.get(found.group(2), 1.0)
    else:
        minutes = float(budget)
    if minutes is None or not math.isfinite(minutes) or minutes <= 0:
        raise ZooInputError("budget", budget, "give a positive time: minutes as a number (30) or a time with its "
                            "unit ('90s', '20min', '1.5h')")
    return minutes


def reference(net: nn.Module | str | dict, data: TrainingData, *, out: str | Path,
              budget: float | str = DEFAULT_BUDGET, val: Any = None, prior: PartChoice = None,
              likelihood: PartChoice = None, inference: PartChoice = None, add_draws: int | None = None,
              seed: int = 0, device: str = "auto", dtype: str = "float32", progress: bool = True,
              echo: Callable[[str], Any] | None = print) -> BNN:
    """Sample the exact posterior of ``net`` on ``data`` with the many-chain HMC, adding draws until the verdict
    passes or ``budget`` is spent; checkpointed in ``out``, so that the same call again resumes it.

    The first call runs the ``hmc`` member (16 chains, ChEES-tuned trajectories; ``inference`` overrides its
    settings) and judges it; while the verdict fails and the budget lasts, each round adds ``add_draws`` draws per
    chain to every chain. A later call with the same ``out`` continues where the last one stopped: an interrupted
    round is finished, then rounds go on under the new budget. When the budget ends first, the log and the verdict's
    advice say how far the run is and about how long the rest would take.

    :param net: your ``nn.Module`` (or a net by name), as :class:`zoo.BNN` takes it.
    :param data: the training rows, as :meth:`zoo.BNN.fit` takes them.
    :param out: the run directory (created; a second call with the same directory resumes).
    :param budget: the time after which no new round starts: minutes (``30``) or a time with its unit (``"90s"``,
        ``"20min"``, ``"1.5h"``). The first round (warm-up and the first draws) always runs to its end.
    :param val: the rows the comparison scores on (test rows), as :meth:`zoo.BNN.fit`'s ``val``.
    :param prior: the prior, as :class:`zoo.BNN` takes it (the members you compare must share it).
    :param likelihood: the likelihood, as :class:`zoo.BNN` takes it.
    :param inference: settings of the many-chain HMC (``{"num_chains": 8, "warmup_steps": 300}``).
    :param add_draws: the draws per chain each round adds (None: the first round's ``num_samples``).
    :param seed: seeds the chains.
    :param device: ``auto`` (CUDA where present), ``cpu`` or ``cuda``.
    :param dtype: ``float32`` or ``float64``.
    :param progress: show the sampler's progress bars.
    :param echo: where the run's log lines and the rounds' verdicts go (None: nowhere).
    :returns: the fitted reference: ``.diagnose()`` and ``.verdict`` say whether it converged (R-hat, ESS,
        divergences, BFMI) and what to change.
    :raises ZooInputError: a budget that is not a positive time, an inference method that cannot add draws (only
        ``hmc`` continues its chains), or an ``out`` that holds another run (another net, spec or data).
    """
    minutes = budget_minutes(budget)
    started = time.monotonic()
    bnn = BNN(net, member="hmc", prior=prior, likelihood=likelihood, inference=inference, seed=seed, device=device,
              dtype=dtype)
    method = bnn.spec.inference.method
    if method not in registry.method_of(bnn.spec).adds_draws:
        raise ZooInputError("inference.method", method, "a reference grows by continuing its chains, which only "
                            "the many-chain HMC does: leave inference.method out (hmc)")
    run = Path(out)
    if not (run / SAMPLES_FILE).is_file():
        bnn.fit(data, val=val, out=run, progress=progress, echo=echo)  # the first round: warm-up and first draws
    grown = grow_until_converged(run, add_draws or bnn.spec.inference.num_samples, spec=bnn.spec, data=data,
                                 val=val, budget_minutes=minutes, started=started, progress=progress, echo=echo)
    fitted = grown.bnn
    if grown.stopped_short is not None:
        fitted.diagnose().advise(grown.stopped_short)
    return fitted
