"""A fit's learning rate chosen on its calibration rows, by a whole run at each candidate.

Fits stepped by a learning rate meet nets and data where their default step is too large (a low-noise regression
whose loss sharpens as its learned noise shrinks: SGD diverges) or too small. The plain-net recipe a user follows
picks the lr on held-out rows; ``inference.lr_by`` does the same for a member: with ``lr: null`` and rows held out of
training (``fit(val=...)`` or ``data.calibration_fraction``), the whole fit runs at each of the method's candidate lrs
(the default among them), each run is scored on those rows (NLL; regression: minus the test log-likelihood), and
the best run is kept as it ended. A run that diverges scores infinity; every run diverging stops the fit naming each.
Where a method has rungs below its candidates, the grid reaches down one rung at a time while the lowest lr run so
far scores best (or every run so far diverged): a choice on its grid's lower edge does not show that its best step
lies inside the grid.

SVI chooses inside its own run (:meth:`zoo.inference.svi.SVIRun.choose_lr`: its candidates continue one guide in
place). SWAG, MultiSWAG and SG-MCMC fits start from their seed and write everything they fit into their own files,
so :func:`fit_choosing_lr` runs them as they are, one run directory per candidate. Their sections share
:class:`~zoo.sections.ChoosesLR` (the ``lr_by`` setting) and :class:`~zoo.sections.ScalesPrior`: their loss's prior
term is a weight decay, whose scale the same rows choose after the lr.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from zoo.errors import TrainingDiverged, ZooInputError
from zoo.inference.base import widen_priors
from zoo.inference.noise_choice import chooses_noise, set_noise_on_calibration_rows
from zoo.models.base import WidensPriors
from zoo.runs import CHOSEN_FILE, RunLog, checkpoint_exists, recorded_choices, write_json
from zoo.sections import PRIOR_SCALE_FACTORS

if TYPE_CHECKING:
    from zoo.data.base import Dataset
    from zoo.inference.base import Fit, FitContext
    from zoo.posterior import Posterior

LR_CHOICE_DIR = "lr_choice"  # the candidates' run directories, <run_dir>/lr_choice/<lr>/, removed once one is kept


def chooses_lr(spec: Any, has_calibration_rows: bool) -> bool:
    """Whether a fit chooses its lr on its calibration rows: ``lr_by: calibration``, or, where unset, the default lr
    (``lr: null``) and calibration rows to choose on.

    :param spec: the ``inference`` section (its ``lr`` and ``lr_by``).
    :param has_calibration_rows: whether the fit has rows held out of training.
    :returns: whether it chooses.
    :raises ZooInputError: ``lr_by: calibration`` without calibration rows.
    """
    if spec.lr_by == "calibration" and not has_calibration_rows:
        raise ZooInputError("inference.lr_by", "calibration", "needs rows held out of training: pass val= "
                            "to fit or set data.calibration_fraction (e.g. 0.1), or use lr_by: fixed")
    if spec.lr_by is None:
        return spec.lr is None and has_calibration_rows
    return spec.lr_by == "calibration"


def calibration_score(posterior: Posterior, data: Dataset, num_samples: int, seed: int,
                      spec: Any) -> tuple[float, str]:
    """A candidate run's score on the calibration rows, lower is better: the NLL (regression: minus the test
    log-likelihood); a non-finite score is infinity, so it never wins. Where the fit sets its predictive noise on
    those rows (:func:`~zoo.inference.noise_choice.chooses_noise` of ``spec``), a candidate is scored as its
    predictive would be, at the σ likeliest there, not at the σ its fit learned (a fit that starts σ low may end with
    it still short of its residuals, and would lose a choice its predictive wins).

    :param posterior: the candidate's posterior.
    :param data: the fit's data set (its calibration rows are scored).
    :param num_samples: posterior draws to average over.
    :param seed: seeds the draws.
    :param spec: the fit's ``inference`` section.
    :returns: the score and its name (``NLL`` or ``-test LL``).
    """
    from zoo.evaluate import evaluate  # (zoo.evaluate reaches the posteriors, which reach the inference methods)

    rows = dataclasses.replace(data, x_test=data.x_calibration, y_test=data.y_calibration, x_ood={})
    likelihood = posterior.family.likelihood
    sets_noise = chooses_noise(spec, True, likelihood)
    if sets_noise:
        set_noise_on_calibration_rows(posterior, likelihood, data, num_samples, seed)
    try:
        metrics = evaluate(posterior, rows, num_samples, seed)
    finally:
        if sets_noise:
            likelihood.predictive_noise = None  # the kept run sets its own once the fit ends
    label = "NLL" if "nll" in metrics else "-test LL"
    score = metrics["nll"] if "nll" in metrics else -metrics["test_ll"]
    return (score if math.isfinite(score) else math.inf), label


def every_candidate_diverged(failures: dict[str, TrainingDiverged], what: str = "starting lr") -> TrainingDiverged:
    """The error of a choice whose every candidate diverged, naming each.

    :param failures: each candidate's error, by its value (``0.01``).
    :param what: what was chosen: ``starting lr``, or a guide setting (``guide.dropout_rate``).
    :returns: the error to raise.
    """
    tried = "; ".join(f"{name}: {err}" for name, err in failures.items())
    if what == "starting lr":
        return TrainingDiverged(f"lr_by: calibration: the run diverged at every candidate lr ({tried}); set a "
                                "smaller inference.lr by hand")
    return TrainingDiverged(f"{what}: the run diverged at every candidate value ({tried}); set {what} and a smaller "
                            "inference.lr by hand")


@dataclass(frozen=True)
class JointSetting:
    """Settings of the ``inference`` section left open to be chosen with the lr: each candidate lr runs at each of
    ``options`` and the best pair is kept (SWAG's ``pretrain_by``: which way of pretraining serves depends on the
    net, the data and the lr). An option may set several fields at once (sghmc's burn-in: no climb, or a climb at
    one of the MAP's steps).

    :param options: the fields each candidate lr runs at, one mapping per option.
    """

    options: tuple[dict[str, Any], ...]

    @classmethod
    def over(cls, field: str, values: tuple[Any, ...]) -> JointSetting:
        """One field left open, run at each of ``values`` (``pretrain_by``: ``sgd``, ``adam``)."""
        return cls(tuple({field: value} for value in values))

    def label(self, option: dict[str, Any]) -> str:
        """``option`` as the log shows it: ``explore_burn_in true, explore_lr 0.003``."""
        return ", ".join(f"{field} {_shown(value)}" for field, value in option.items())

    def folder(self, option: dict[str, Any]) -> str:
        """``option``'s part of a candidate's folder name: ``true_0.003``."""
        return "_".join(_shown(value) for value in option.values())


def _shown(value: Any) -> str:
    """A setting's value as YAML writes it (``adam``, ``true``, ``0.003``)."""
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def chooses_prior_scale(spec: Any, family: Any, has_calibration_rows: bool) -> bool:
    """Whether a fit chooses its factor on every prior's scale on its calibration rows
    (:class:`~zoo.sections.ScalesPrior`): the factor left null, a family whose weights have priors to widen, and rows
    to choose on. (An SVI fit chooses it only where its guide's draws are point values, too.)

    :param spec: the ``inference`` section.
    :param family: the fit's model family.
    :param has_calibration_rows: whether the fit has rows held out of training.
    :returns: whether it chooses.
    """
    return (has_calibration_rows and getattr(spec, "prior_scale_factor", 1.0) is None
            and isinstance(family, WidensPriors))


def fit_choosing_lr(fit: FitContext, fitter: Callable[[FitContext], Fit], with_lr: Callable[[Any, float], Any],
                    default_lr: float, candidates: tuple[float, ...], files: tuple[str, ...], name: str,
                    joint: JointSetting | None = None, lower: tuple[float, ...] = ()) -> Fit:
    """Run ``fitter`` at the lr ``fit.spec`` asks for: its own, the default, or the best of a whole run at each of
    ``candidates`` (and, where ``joint`` is open, at each of its options too), scored on the calibration rows
    (:func:`chooses_lr`). Then the ``lower`` rungs run the same way, from the highest down, each only while the
    lowest lr run so far scored best or every run so far diverged (:func:`reach_past`): paid for only where the usual
    steps are too large for the net and data, or only just small enough. Where the prior's scale factor is open too
    (:func:`chooses_prior_scale`), the kept run's lr and options then run at each other factor of
    :data:`~zoo.sections.PRIOR_SCALE_FACTORS`, and the best of them all is kept.

    Each candidate runs from the fit's seed in ``<run_dir>/lr_choice/<lr>/`` (``<lr>_<option>/`` with a joint
    setting, ``..._prior<factor>/`` at a factor; so an interrupted choice resumes each where it stopped); the kept
    one's files move into the run directory, and a resumed run that had chosen loads them. The monitor scores the
    kept run only.

    :param fit: the fit's context, its spec's ``lr`` null or set.
    :param fitter: the method's fit function; it seeds itself from ``fit.seed``, widens the family's priors by its
        spec's ``prior_scale_factor`` and writes all it fits into ``files`` in its run directory.
    :param with_lr: the spec with an lr written out (and what follows from it), ``lr_by: fixed``.
    :param default_lr: the method's lr when none is set.
    :param candidates: the lrs a choice runs.
    :param files: the files the fitter writes (the first holds the fit).
    :param name: the method, for the log (``swag``).
    :param joint: the settings the section leaves open, chosen with the lr (None: the lr alone).
    :param lower: lrs below every candidate, run from the highest down while the lowest lr run scores best (none:
        the candidates alone).
    :returns: the fit.
    :raises ZooInputError: ``lr_by: calibration`` without calibration rows.
    :raises TrainingDiverged: when every candidate (and every lower rung) diverged.
    """
    spec = fit.spec
    has_rows = fit.data.x_calibration is not None
    by_lr = spec.lr is None and chooses_lr(spec, has_rows)
    by_prior = chooses_prior_scale(spec, fit.family, has_rows)
    if not by_lr and not by_prior:
        return fitter(fit if spec.lr is not None else dataclasses.replace(fit, spec=with_lr(spec, default_lr)))
    if fit.resume and fit.run_dir is not None and checkpoint_exists(fit.run_dir / files[0]):
        result = fitter(dataclasses.replace(fit, spec=with_lr(spec, default_lr) if spec.lr is None else spec))
        result.chosen = recorded_choices(fit.run_dir)  # the kept run, finished: loaded (its factor with it)
        return result
    spent = 0.0  # every candidate's wall time (a finished one's own, from before a resume too): the fit's
    scores: dict[str, float] = {}  # by candidate: "0.01", "0.01, pretrain_by adam", "0.01, prior_scale_factor 3"
    failures: dict[str, TrainingDiverged] = {}
    label, best = "score", None  # best: the kept candidate so far, a _Kept

    def run(key: str, folder: str, at: Any, choices: dict[str, Any]) -> None:
        nonlocal spent, label, best
        where = None if fit.run_dir is None else fit.run_dir / LR_CHOICE_DIR / folder
        candidate = dataclasses.replace(fit, spec=at, run_dir=where, log=RunLog(None, echo=None), monitor=None,
                                        resume=where is not None and checkpoint_exists(where / files[0]))
        began = time.perf_counter()
        try:
            result = fitter(candidate)
        except TrainingDiverged as err:
            spent += time.perf_counter() - began
            scores[key], failures[key] = math.inf, err
            fit.log(f"{name}: lr {key} diverged: {err}")
            return
        spent += result.seconds
        scores[key], label = calibration_score(result.posterior, fit.data, spec.predictive_samples, fit.seed, spec)
        fit.log(f"{name}: lr {key}: {label} {scores[key]:.4g} on the calibration rows")
        if best is None or scores[key] < scores[best.key]:
            best = _Kept(key, folder, result, at, choices)

    def reach_lower(lowest: float) -> str | None:
        if len(failures) == len(scores):
            return "every lr run diverged"
        if best is not None and best.choices["inference.lr"] == lowest:
            return f"the lowest lr run, {lowest:g}, scored best"
        return None

    if by_lr:
        for lr in reach_past(candidates, tuple(sorted(lower, reverse=True)), reach_lower,
                             lambda line: fit.log(f"{name}: {line}")):
            for option in (None,) if joint is None else joint.options:
                at = spec if option is None else spec.model_copy(update=option)
                run(f"{lr:g}" + ("" if option is None else f", {joint.label(option)}"),
                    f"{lr:g}" + ("" if option is None else f"_{joint.folder(option)}"), with_lr(at, lr),
                    {"inference.lr": lr} | {f"inference.{k}": v for k, v in (option or {}).items()})
    else:  # the lr given (or the default), the prior's factor alone chosen: its incumbent is the spec's priors
        at = spec if spec.lr is not None else with_lr(spec, default_lr)
        run(f"{at.lr:g}", f"{at.lr:g}", at, {})
    if by_prior and best is not None:  # the run kept so far is under the spec's priors (a factor of 1): the incumbent
        key, folder, at, choices = best.key, best.folder, best.spec, best.choices
        best = best._replace(choices=choices | {"inference.prior_scale_factor": 1.0})
        for factor in (f for f in PRIOR_SCALE_FACTORS if f != 1.0):
            run(f"{key}, prior_scale_factor {factor:g}", f"{folder}_prior{factor:g}",
                at.model_copy(update={"prior_scale_factor": factor}),
                choices | {"inference.prior_scale_factor": factor})
    if best is None:
        if not by_lr:
            raise next(iter(failures.values()))
        raise every_candidate_diverged(failures)
    key, folder, result, at, choices = best
    widen_priors(fit.family, at.prior_scale_factor)  # the kept run's factor (a later candidate may have set another)
    result.seconds = spent
    result.chosen = result.chosen | choices
    if fit.run_dir is not None:  # the choice first, so that the kept run's files, once there, come with it
        write_json(fit.run_dir / CHOSEN_FILE, result.chosen)
        _keep_files(fit.run_dir / LR_CHOICE_DIR / folder, fit.run_dir, files)
    shown = "; ".join(f"{c}: {v:.4g}" for c, v in scores.items())
    fit.log(f"{name}: lr {key}, chosen on {len(fit.data.x_calibration):,} calibration rows by a whole run at each "
            f"({label} {shown}; {spent:.1f} s in all)")
    if fit.monitor is not None:
        fit.monitor.final(result.posterior, fit.data)
    return result


class _Kept(NamedTuple):
    """A choice's kept candidate: its key in the log, its folder in ``lr_choice/``, its fit, its spec, and the
    choices it records by spec field."""

    key: str
    folder: str
    result: Any
    spec: Any
    choices: dict[str, Any]


def reach_past(candidates: tuple[float, ...], beyond: tuple[float, ...], why: Callable[[float], str | None],
               say: Callable[[str], None]) -> Iterator[float]:
    """The values a choice on the calibration rows runs: every candidate, then each of ``beyond`` (values past the
    candidates' nearest edge, nearest first), each only where ``why(edge)``, given the value run last at that edge,
    gives the reason to (it scored best; for an lr, also: every run so far diverged). A choice on its grid's edge does
    not show that its best lies inside the grid; the rungs are paid for only where it lands there. SWAG's and
    SG-MCMC's lr (:func:`fit_choosing_lr`) and SVI's open settings (MC dropout's rate,
    :meth:`zoo.inference.svi.SVIRun.choose_lr`) reach so.

    :param candidates: the grid.
    :param beyond: the values past its edge, nearest first.
    :param why: the reason to run the next value, given the edge so far, or None to stop; read as the values run.
    :param say: the fit's log, told the reason before each value past the grid.
    :returns: the values, lazily.
    """
    yield from candidates
    if not beyond:
        return
    edge = min(candidates, key=lambda c: abs(c - beyond[0]))
    for value in beyond:
        reason = why(edge)
        if reason is None:
            return
        say(f"{reason}; the choice runs {value:g}")
        yield value
        edge = value


def _keep_files(source: Path, run_dir: Path, files: tuple[str, ...]) -> None:
    """Move the kept candidate's files into the run directory (the file holding the fit last, so that its presence
    says the rest are there), then remove every candidate's directory."""
    for name in reversed(files):
        if (source / name).exists():
            (source / name).replace(run_dir / name)
    shutil.rmtree(run_dir / LR_CHOICE_DIR, ignore_errors=True)
