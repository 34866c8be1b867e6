"""The one protocol every inference method implements, and the checkpoint loading that guide-based methods share.

An :class:`InferenceMethod` fits a model family (and, for some methods, the spec's guide) to a
:class:`~zoo.posterior.Posterior`, loads that posterior back from a run directory, says in one phrase what it does
and names the files it writes. It is registered once, in :data:`zoo.inference.METHODS` (a :class:`MethodCatalogue`);
its spec section (a pydantic model whose ``method`` field lists the names it answers to) joins the run spec from
there. The pipeline, ``zoo diagnose`` and ``zoo report`` know nothing else about a method.

Every fitter takes one :class:`FitContext`: what it fits, on which data, under which settings, and where it writes.
What a method needs from above is handed down in it: ``start``, the posterior of the run named by
:meth:`InferenceMethod.start_from` (e.g. the MAP or VI fit MCMC chains start at), so no method imports the
pipeline.
"""

from __future__ import annotations

import dataclasses
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Protocol, Union

import torch
from pydantic import BaseModel, Field

from zoo.errors import ZooInputError, ZooWarning
from zoo.models.base import ModelFamily, WidensPriors, restore_buffers
from zoo.parts import Catalogue
from zoo.posterior import Posterior
from zoo.runs import CHECKPOINT_FILE, RunLog, checkpoint_exists, load_checkpoint

if TYPE_CHECKING:
    from zoo.data.base import Dataset
    from zoo.evaluate import ValidationMonitor


@dataclass
class FitContext:
    """Everything one fit is handed: what it fits, to which data, under which settings, and where it writes.

    :param family: the model family to fit.
    :param guide: the spec's guide (fitted by methods that fit it; others ignore it or build their own).
    :param data: the data set, its training rows on the fit's device (or streamed, for methods that stream).
    :param spec: the run's ``inference`` section.
    :param seed: seeds the fit's random streams.
    :param run_dir: where the fit writes its files and checkpoints; None writes nothing.
    :param resume: continue the fit from the checkpoint in ``run_dir``.
    :param log: the run's log (by default: no messages).
    :param progress: whether to show a progress bar.
    :param monitor: scores the posterior on evaluation rows during the fit (None: no scoring).
    :param start: the posterior of the run :meth:`InferenceMethod.start_from` named (None: a fresh start).
    """

    family: ModelFamily
    guide: torch.nn.Module
    data: Dataset
    spec: Any
    seed: int
    run_dir: Path | None = None
    resume: bool = False
    log: RunLog = field(default_factory=lambda: RunLog(None, echo=None))
    progress: bool = True
    monitor: ValidationMonitor | None = None
    start: Posterior | None = None

    def __post_init__(self) -> None:
        self.log = self.log or RunLog(None, echo=None)
        self.run_dir = Path(self.run_dir) if self.run_dir is not None else None

    def file(self, name: str) -> Path | None:
        """The path of one of the fit's files in its run directory, or None when the fit writes nothing.

        :param name: the file's name.
        :returns: ``run_dir / name``, or None.
        """
        return self.run_dir / name if self.run_dir is not None else None


class Fit(Protocol):
    """What every ``fit`` returns: the fitted posterior and the fit's wall time; methods add their own records.

    A method that chooses settings on the calibration rows also gives ``chosen``: each choice by the spec field it
    set (``{"inference.lr": 0.003, "guide.dropout_rate": 0.1}``), which ``BNN.chosen`` shows. A method that chooses
    nothing (one of your own, say) may leave it out."""

    posterior: Posterior | None
    seconds: float


class InferenceMethod(ABC):
    """One inference method: fit -> Posterior, run directory -> Posterior, a description, its files."""

    names: ClassVar[tuple[str, ...]]  # the inference.method values it answers to
    spec: ClassVar[type[BaseModel]]  # its spec section; ``method: Literal[*names]``
    files: ClassVar[tuple[str, ...]]  # what it writes into a run directory; the first holds the fit
    summary: ClassVar[str]  # one line for ``zoo list``
    own_guide: ClassVar[str | None] = None  # the guide this method builds itself (the spec may only name that one)
    fits_guide: ClassVar[bool] = True  # fits the guide the spec names (MCMC ignores it; Laplace builds its own)
    # Its draws converge to the exact posterior (Metropolis-corrected MCMC): only such a run can be a reference for
    # ``zoo compare``, and only its convergence checks decide ``zoo train``'s exit code without ``--strict``
    exact: ClassVar[bool] = False
    # It reads the training rows a minibatch (or a chunk) at a time, so rows streamed from a loader need not all be in
    # memory; a method that reads every row at each step has a streamed data set read into memory first
    streams_rows: ClassVar[bool] = False
    # What the processes of ``zoo train --nproc N`` share, by method name (e.g. each global minibatch); a method
    # left out would run its whole fit in every process, so ``--nproc`` is refused for it
    shared_work: ClassVar[dict[str, str]] = {}
    # The method names whose finished runs take more draws: resumed with a larger ``inference.num_samples``, they
    # continue their chains to that many draws instead of starting again (a reference grown until it converges)
    adds_draws: ClassVar[tuple[str, ...]] = ()

    # Where a fit's budget (``fit(epochs=E)`` or ``num_steps=``) goes: the method's own section, or the spec section
    # of the phase that trains (Laplace: the family's MAP phase, ``model.map``), so every member reads the same budget
    budget_section: ClassVar[str] = "inference"

    def noise_start(self, spec: Any, has_calibration_rows: bool, likelihood: Any) -> float | None:
        """Where this method's fit starts a learned Gaussian noise σ that ``likelihood.noise_prior.init`` leaves
        open, in standardised target units; None (the default): the noise prior's median. A start given here is
        weighed against the median by a fit that chooses on calibration rows
        (:meth:`zoo.likelihoods.base.Likelihood.open_start`).

        :param spec: the run's ``inference`` section.
        :param has_calibration_rows: whether the fit has rows held out of training.
        :param likelihood: the likelihood as the spec builds it.
        :returns: σ, or None.
        """
        return None

    def map_noise_by(self, spec: Any, has_calibration_rows: bool, likelihood: Any) -> str:
        """How a family's MAP phase (:class:`~zoo.models.base.StructureFit`) scores the candidate runs it chooses
        between on calibration rows: ``calibration``, at the σ likeliest on those rows, where this method's
        predictive sets its σ there once the fit ends; ``fit`` (the default), at the σ each run learned.

        :param spec: the run's ``inference`` section.
        :param has_calibration_rows: whether the fit has rows held out of training.
        :param likelihood: the likelihood as the spec builds it.
        :returns: ``calibration`` or ``fit``.
        """
        return "fit"

    def spend_budget(self, budget: dict[str, Any], section: dict[str, Any]) -> dict[str, Any]:
        """The settings that spend a fit's whole budget (``fit(epochs=E)``), to go into :attr:`budget_section`: the
        budget itself by default; a method whose run has phases splits it between them.

        :param budget: the fit's budget, ``{"epochs": E}`` or ``{"num_steps": T}``.
        :param section: the budget section as set so far (the preset's and the user's settings; no defaults).
        :returns: the settings to merge into the section.
        """
        return budget

    def complete(self, tree: dict[str, Any]) -> dict[str, Any]:
        """A spec tree (before validation) with the settings of this method whose default depends on other
        sections written out, so that the saved spec and a run's identity carry the value the run used (nothing by
        default).

        :param tree: the spec as a dict, the member's preset and the method's own guide already in it.
        :returns: the tree, completed.
        """
        return tree

    def convergence_advice(self, spec: Any, posterior: Any) -> list[str]:
        """What to change when this run's draws fail their convergence checks, read off the fit (e.g. a cap the
        sampler's adaptation ran into); the verdict's generic advice covers the rest. None by default.

        :param spec: the run's ``inference`` section.
        :param posterior: the run's posterior.
        :returns: one sentence per setting to change.
        """
        return []

    def describe(self, spec: Any) -> str:
        """What the run's ``inference`` section does, in a phrase: ``sampled by hmc``.

        :param spec: the run's ``inference`` section.
        :returns: the phrase (by default the method's name).
        """
        return spec.method

    def start_from(self, spec: Any) -> Path | None:
        """A run directory whose posterior this fit starts from (handed to ``fit``/``load`` as ``start``), or None.

        :param spec: the run's ``inference`` section.
        :returns: the run directory, or None for a fresh start (the default).
        """
        return None

    def check_processes(self, spec: Any, nproc: int) -> None:
        """Refuse an ``inference`` section that ``nproc`` processes cannot share (e.g. chains that do not divide);
        every share works unless a method says otherwise.

        :param spec: the run's ``inference`` section.
        :param nproc: the processes of ``zoo train --nproc``.
        :raises ZooInputError: where a method's override finds the section cannot be shared (never by default).
        """
        return None

    def check(self, run_spec: Any) -> list[ZooInputError]:
        """Cross-section problems of a whole run spec that only this method has (e.g. the family it needs).

        :param run_spec: the whole :class:`~zoo.spec.RunSpec`.
        :returns: the problems; empty when there are none.
        """
        return []

    def check_net(self, spec: Any, family: Any, convolutional: bool) -> ZooInputError | None:
        """A problem of this method's settings with the family on the built net (whether it convolves: a net given
        in Python tells only when it is there), or None; the spec checks a named net's declaration the same way.

        :param spec: the run's ``inference`` section.
        :param family: the run's ``model`` section.
        :param convolutional: whether the net has convolution layers.
        :returns: the problem, or None.
        """
        return None

    def most_weights(self, run_spec: Any, likelihood: Any, rows: int, outputs: int) -> tuple[int, str] | None:
        """The most weights of a selected weight vector (a sized subnetwork) this method can fit its Gaussian over,
        with why, beyond the guide's dense matrices (which the family checks against memory itself); None: no
        bound of its own (the default).

        :param run_spec: the whole :class:`~zoo.spec.RunSpec`.
        :param likelihood: the run's likelihood.
        :param rows: training rows.
        :param outputs: the net's outputs per row.
        :returns: ``(most, why)``, or None.
        """
        return None

    def check_rows_on_host(self, spec: Any, n_train: int, why: str) -> None:
        """Refuse a fit whose training rows must stay in host memory (too large for the GPU), unless this method
        moves them to the device a minibatch at a time (none does by default).

        :param spec: the run's ``inference`` section.
        :param n_train: training rows.
        :param why: why the rows stay in host memory, for the message.
        :raises ZooInputError: always, unless the method streams its rows.
        """
        raise ZooInputError("inference.method", spec.method, f"{why}, and {spec.method} steps on every row on the "
                            "device: use method svi (it moves a minibatch at a time), or a smaller data set")

    fitter: ClassVar[Callable[[FitContext], Fit]]  # the module's fit function

    def fit(self, family: ModelFamily, guide: torch.nn.Module, data: Dataset, spec: Any, seed: int, *,
            run_dir: Path | None = None, resume: bool = False, log: RunLog | None = None, progress: bool = True,
            monitor: ValidationMonitor | None = None, start: Posterior | None = None) -> Fit:
        """Fit ``family`` to ``data`` by :attr:`fitter`; write checkpoints under ``run_dir`` (resumable with
        ``resume``). ``start`` reaches only the fitters of methods that start from a run (:meth:`start_from`).

        :param family: the model family to fit.
        :param guide: the spec's guide (fitted where :attr:`fits_guide`; other methods ignore it or build their own).
        :param data: the data set, its training rows on the fit's device.
        :param spec: the run's ``inference`` section.
        :param seed: seeds the fit's random streams.
        :param run_dir: where the fit writes its files (:attr:`files`); None writes nothing.
        :param resume: continue the fit from the checkpoint in ``run_dir``.
        :param log: the run's log (None: no messages).
        :param progress: whether to show a progress bar.
        :param monitor: scores the posterior on evaluation rows during the fit (None: no scoring).
        :param start: the posterior of the run :meth:`start_from` named (None: a fresh start).
        :returns: the fit, with its posterior and wall time.
        """
        return type(self).fitter(FitContext(family, guide, data, spec, seed, run_dir, resume, log, progress, monitor,
                                            start))

    @abstractmethod
    def load(self, family: ModelFamily, guide: torch.nn.Module, spec: Any, run_dir: Path, device: torch.device,
             start: Posterior | None = None) -> Posterior:
        """The posterior a finished (or, where the method allows it, unfinished) fit left in ``run_dir``; ``start``
        is given where the family has point parameters the fit took from the run it started from.

        :param family: the model family, built from the run's spec.
        :param guide: the spec's guide, built from the run's spec (filled in by methods that fit it).
        :param spec: the run's ``inference`` section.
        :param run_dir: the run directory.
        :param device: where the posterior's tensors go.
        :param start: the posterior of the run :meth:`start_from` names, or None.
        :returns: the fitted posterior.
        """

    def fit_record(self, result: Fit) -> dict[str, Any]:
        """What the file holding a fit (:attr:`files`'s first) holds, from a fit kept in memory (fitted with no run
        directory), in the format :meth:`load` reads and marked done: so that ``BNN.save`` writes the run a fit with
        a run directory would have left. The default refuses: a method that does not override this writes its
        posterior only from its fitter.

        :param result: the fit (its ``posterior``, ``seconds`` and the method's own records).
        :returns: the record, for :func:`~zoo.runs.save_checkpoint`.
        :raises ZooInputError: always, by default.
        """
        raise ZooInputError("out", None, "", message=f"save: this {self.names[0]} fit was kept in memory (fit "
                            f"without out=), and its posterior (a {type(result.posterior).__name__}) is written only "
                            "by its fitter: fit it again with out=DIR to keep its run directory")

    def holds_fit(self, run_dir: Path) -> bool:
        """Whether ``run_dir`` holds what this method's fit writes.

        :param run_dir: a run directory.
        :returns: whether the first of :attr:`files` (the one holding the fit) is there.
        """
        return checkpoint_exists(Path(run_dir) / self.files[0])


def widen_priors(family: ModelFamily, factor: float | None) -> None:
    """Widen ``family``'s priors by the fit's factor (``inference.prior_scale_factor``; None: 1, the spec's priors).
    A family is reused by the candidate runs of a choice, so each run sets its own factor, 1 included.

    :param family: the fit's model family.
    :param factor: the multiplier of every prior's scale.
    :raises ZooInputError: a factor other than 1 on a family whose priors no factor reaches (its priors are on other
        sites than the weights').
    """
    factor = 1.0 if factor is None else factor
    if not isinstance(family, WidensPriors):
        if factor == 1.0:
            return
        raise ZooInputError("inference.prior_scale_factor", factor, f"the {type(family).__name__} family has no "
                            "weight priors it widens (the all_weights and deep_ensemble families do, and a Laplace "
                            "member's model.map phase); scale the prior itself (prior.scale) or drop the factor")
    family.widen_priors(factor)


def hyperparameter_record(family: ModelFamily) -> dict[str, Any]:
    """A family's tuned hyperparameters (a prior precision, a prior scale factor) as a fit's file keeps them.

    :param family: the fitted family.
    :returns: ``{"hyperparameters": {...}}``, or empty where it has none.
    """
    values = family.hyperparameters()
    return {"hyperparameters": {k: v.detach().clone() for k, v in values.items()}} if values else {}


def restore_hyperparameters(family: ModelFamily, state: dict[str, Any]) -> None:
    """Set the tuned hyperparameters a fit's file kept (:func:`hyperparameter_record`); none kept: nothing changes.

    :param family: the family, set in place.
    :param state: the file's record.
    """
    if "hyperparameters" in state:
        family.set_hyperparameters(state["hyperparameters"])


def result_record(result: Fit) -> dict[str, Any]:
    """A fit's own records (its result's dataclass fields but the posterior: a loss curve, an evidence, a sampler's
    settings, ...), its family's tuned hyperparameters and its wall time, marked done: what every saved fit's file
    starts from.

    :param result: the fit.
    :returns: the record.
    """
    fields = dataclasses.fields(result) if dataclasses.is_dataclass(result) else ()
    record = {f.name: getattr(result, f.name) for f in fields if f.name != "posterior"}
    return {**record, **hyperparameter_record(result.posterior.family), "seconds": result.seconds, "done": True}


def guide_fit_record(result: Fit) -> dict[str, Any]:
    """A guide-based fit's record (SVI, Laplace) in the format :func:`load_guide_checkpoint` reads: the guide's state,
    the family's point parameters, buffers and tuned hyperparameters (e.g. a Laplace prior precision).

    :param result: the fit, its posterior a :class:`~zoo.posterior.GuidePosterior`.
    :returns: the record.
    """
    family = result.posterior.family
    record = result_record(result) | {
        "guide": result.posterior.guide.state_dict(),
        "point_parameters": [p.detach().clone() for p in family.point_parameters()],
        "buffers": [b.detach().clone() for b in family.buffers()]}
    return record


def load_guide_checkpoint(family: ModelFamily, guide: torch.nn.Module, run_dir: Path, device: torch.device) -> dict:
    """Restore a guide-based fit (guide, point parameters, buffers, tuned hyperparameters) from ``checkpoint.pt``.

    An unfinished fit loads at the step it reached, with a :class:`~zoo.errors.ZooWarning` saying so.

    :param family: the model family; its point parameters, buffers and tuned hyperparameters are set in place.
    :param guide: the guide; its state is loaded in place.
    :param run_dir: the run directory holding ``checkpoint.pt``.
    :param device: where the checkpoint's tensors go.
    :returns: the whole saved checkpoint.
    """
    state = load_checkpoint(Path(run_dir) / CHECKPOINT_FILE, device)
    if not state.get("done", True):
        reached = f"step {state['step']}" + (f" of {state['total_steps']}" if "total_steps" in state else "")
        warnings.warn(f"{run_dir} is an unfinished run: its checkpoint is at {reached}, so this is the posterior of "
                      "that step, not the final one (finish it with zoo train --resume)", ZooWarning, stacklevel=3)
    guide.load_state_dict(state["guide"])
    with torch.no_grad():
        for p, saved in zip(family.point_parameters(), state["point_parameters"], strict=True):
            p.copy_(saved)
    restore_buffers(family, state.get("buffers"))
    restore_hyperparameters(family, state)  # e.g. a prior precision tuned by the Laplace evidence
    return state


def copy_point_parameters(family: ModelFamily, start: Posterior | None, field: str) -> None:
    """Take the point-estimated parameters (e.g. rank-1's W) of the run a fit starts from.

    Nothing happens for a family without point parameters.

    :param family: the family to copy into, in place.
    :param start: the posterior of the run the fit starts from.
    :param field: the spec field that names that run, for the message.
    :raises ZooInputError: when the family has point parameters and ``start`` is None.
    """
    if not family.point_parameters():
        return
    if start is None:
        raise ZooInputError(field, "prior", "this family has point-estimated weights that this method does not fit: "
                            f"train it with SVI first and set {field} to that run directory")
    with torch.no_grad():
        for mine, theirs in zip(family.point_parameters(), start.family.point_parameters(), strict=True):
            mine.copy_(theirs)


def starting_run(init: str, fresh: tuple[str, ...] = ("prior",), field: str = "inference.init") -> Path | None:
    """The run directory ``init`` names, or None for a fresh start (``prior``, or whatever else ``fresh`` lists).

    :param init: the spec's value, a fresh start's name or a run directory.
    :param fresh: the values that mean a fresh start.
    :param field: the spec field ``init`` comes from, for the message.
    :returns: the run directory, or None.
    :raises ZooInputError: when ``init`` is neither a fresh start nor an existing directory.
    """
    if init in fresh:
        return None
    if not Path(init).is_dir():
        raise ZooInputError(field, init, f"use {' or '.join(repr(f) for f in fresh)}, or the directory of a finished "
                            "run")
    return Path(init)



class MethodCatalogue(Catalogue):
    """The registered inference methods: a :class:`~zoo.parts.Catalogue` of their spec sections (discriminated by
    ``method``, so :meth:`union` is the run spec's ``inference`` field), holding each section's method.

    :param methods: one instance of each method, in listing order.
    """

    def __init__(self, *methods: InferenceMethod) -> None:
        super().__init__("inference", *(method.spec for method in methods), key="method")
        self._methods = {name: method for method in methods for name in method.names}

    def method(self, name: str) -> InferenceMethod:
        """The method that answers to ``name``; refused with the registered names otherwise.

        :param name: an ``inference.method`` value.
        :returns: the registered method.
        :raises ZooInputError: an unregistered name.
        """
        if name not in self._methods:
            self[name]  # refuses the name, listing the registered ones
        return self._methods[name]

    def methods(self) -> Iterator[InferenceMethod]:
        """Each registered method once, in listing order.

        :returns: an iterator over the methods.
        """
        return iter(dict.fromkeys(self._methods.values()))

    def union(self) -> Any:
        """The run spec's ``inference`` field: the methods' sections in pydantic's own union, discriminated by
        ``method`` (a section answering to several names lists them all in its ``Literal``).

        :returns: the annotated union.
        """
        sections = tuple(method.spec for method in self.methods())
        return Annotated[Union[sections], Field(discriminator="method")]  # noqa: UP007 - built from a tuple

    def summaries(self) -> dict[str, str]:
        """Each method's names (``sgld | sghmc``) with its one-line summary (``zoo list``).

        :returns: ``{names: summary}`` in listing order.
        """
        return {" | ".join(method.names): method.summary for method in self.methods()}

    def names_where(self, predicate: Callable[[InferenceMethod], bool]) -> list[str]:
        """The method names whose method satisfies ``predicate`` (e.g. the exact samplers), for messages and help.

        :param predicate: a test of a method.
        :returns: the names, in listing order.
        """
        return [name for name, method in self._methods.items() if predicate(method)]
