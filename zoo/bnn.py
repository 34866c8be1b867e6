"""A Bayesian neural network as one object: your ``nn.Module`` (or a named net), a model family, priors, a guide, a
likelihood and an inference method, fitted to your data in memory, or as a run directory written as it goes.

::

    bnn = zoo.BNN(my_net, family="rank1", prior={"name": "normal", "loc": 1.0}, guide="mixture")
    bnn.fit(train_loader, epochs=20, val=val_loader)      # in memory; fit(..., out="runs/mine") writes as it goes
    bnn.predict(x).probs
    bnn.save("runs/mine")          # zoo.load("runs/mine") reads it back; so do zoo eval, diagnose, report

Every part is given as the spec's section object, as the spec's dict, or by name, and validated as a spec is, with
the same messages. ``zoo train`` builds a :class:`BNN` from the spec and fits it the same way
(:func:`zoo.pipeline.train`): the zoo's nets and data sets are presets of a module and of data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import operator
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pydantic import BaseModel
from torch import nn

from zoo import distributed, registry
from zoo.assemble import build, build_likelihood, describe, place, resolve_device
from zoo.data import DataSection, Dataset, data_section, dataset_from, load_dataset
from zoo.data.base import rows_digest
from zoo.data.given import (
    GIVEN_FILE,
    ArrayLike,
    GivenData,
    Rows,
    as_training_rows,
    evaluation_rows,
    from_stand_in,
    predict_rows,
    stand_in,
)
from zoo.errors import NotFitted, ZooInputError
from zoo.evaluate import ValidationMonitor, check_draw_memory, check_draws_fit, evaluate, plot_predictive
from zoo.inference.noise_choice import (
    chooses_noise,
    load_predictive_noise,
    save_predictive_noise,
    set_noise_on_calibration_rows,
)
from zoo.likelihoods import AutoLikelihoodSpec, PredictiveDraws
from zoo.models import FAMILIES
from zoo.models.base import ModelFamily
from zoo.nets import NET_FILE, ModuleNetSpec, load_weights
from zoo.nets.weights import WeightsSource
from zoo.posterior import ChainPosterior, GuidePosterior, Posterior
from zoo.posterior_checks import Diagnosis, diagnosis_of, method_label
from zoo.runs import (
    CHOSEN_FILE,
    LOG_FILE,
    METRICS_FILE,
    POINT_ESTIMATE_FILE,
    SPEC_FILE,
    RunLog,
    claimed_run_directory,
    load_torch,
    mark_saved_from_memory,
    recorded_choices,
    save_checkpoint,
    save_torch,
    saved_from_memory,
    write_atomically,
    write_json,
    write_text,
)
from zoo.spec import RunSpec, load_spec, run_identity, spec_differences, spec_to_yaml
from zoo.tasks import task_of

if TYPE_CHECKING:
    import arviz

BUDGET_SETTINGS = ("epochs", "num_steps")  # a fit's budget: where it goes is its method's (budget_section)

# What BNN's arguments take, for its signatures (the docstrings say what each accepts in full):
PartChoice = str | Mapping[str, Any] | BaseModel | None  # a registered name, the spec section as a dict, or the section
TrainingData = Rows | Dataset | DataSection | Mapping[str, Any]  # rows, a zoo Dataset, a data section (or its dict)


def holds_a_fit(run_dir: Path) -> bool:
    """Whether a run directory holds anything a fit wrote (any method's files, or any family's, e.g. a subnetwork's
    MAP stage: :attr:`~zoo.models.base.FamilySection.files`).

    :param run_dir: the directory.
    :returns: whether it does.
    """
    run = Path(run_dir)
    return (any(method.holds_fit(run) for method in registry.METHODS.methods())
            or any((run / name).exists() for _, section in FAMILIES.items() for name in section.files))


def holds_another_spec(run_dir: Path, spec: RunSpec) -> bool:
    """Whether a run directory holds a run of a spec other than ``spec`` (its spec.yaml differs beyond where the data
    lives, :func:`zoo.spec.run_identity`): a script that reuses run directories refuses such a one rather than report
    its figures as ``spec``'s.

    :param run_dir: the directory (it may not exist yet).
    :param spec: the spec the caller is about to run or read back.
    :returns: whether it does; False when the directory holds no spec.yaml.
    """
    kept = Path(run_dir) / SPEC_FILE
    return kept.is_file() and run_identity(load_spec(kept)) != run_identity(spec)


# ------------------------------------------------------------------------------------------ the parts
def _tree(value: Any, key: str) -> Any:
    """A part given by name (``"rank1"``), as a section object, or as the spec's dict, as the spec's dict."""
    if value is None or isinstance(value, dict):
        return value
    if isinstance(value, str):
        return {key: value}
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise ZooInputError(key, type(value).__name__, "give a part by name, as its spec section, or as a dict")


def _net_tree(net: Any) -> tuple[dict, nn.Module | None]:
    if isinstance(net, nn.Module):
        return ModuleNetSpec.of(net).model_dump(mode="json"), net
    if isinstance(net, ModuleNetSpec):
        return net.model_dump(mode="json"), net.module
    if not isinstance(net, str | dict | BaseModel):
        raise ZooInputError("net", type(net).__name__, "give a torch.nn.Module, a net's name (e.g. 'mlp') or a spec's "
                            "net section")
    return _tree(net, "name"), None


def _attach(spec: RunSpec, module: nn.Module | None, data: Dataset | None) -> RunSpec:
    """The spec with the module and the data given in Python attached to its sections (they are not spec values)."""
    if module is not None and isinstance(spec.net, ModuleNetSpec):
        spec.net.holding(module)
    if data is not None and isinstance(spec.data, GivenData):
        spec.data.holding(data)
    return spec


@dataclass
class Prediction:
    """The predictive distribution at B inputs: the posterior's mixture over its draws, and every draw's own.

    Classification: :attr:`probs` ``[B, C]`` (the mean of the draws' class probabilities). Regression:
    :attr:`mean` and :attr:`variance` ``[B]`` in the targets' original units (the variance of the mixture: the
    mean of the draws' variances plus the variance of their means).

    :param draws: every draw's predictive, in standardised units (``log_probs [S, B, C]``, or ``loc`` and ``scale``).
    :param y_mean: the targets' training mean (regression; 0 for data given in Python).
    :param y_std: the targets' training standard deviation (regression; 1 for data given in Python).
    """

    draws: PredictiveDraws
    y_mean: float = 0.0
    y_std: float = 1.0

    @property
    def probs(self) -> torch.Tensor | None:
        """Class probabilities ``[B, C]`` (None for a regression)."""
        return None if self.draws.log_probs is None else self.draws.log_probs.exp().mean(0)

    @property
    def mean(self) -> torch.Tensor:
        """The predictive mean ``[B]``: of the targets (regression) or of the class probabilities ``[B, C]``."""
        if self.draws.loc is None:
            return self.probs
        return self.draws.loc.mean(0) * self.y_std + self.y_mean

    @property
    def variance(self) -> torch.Tensor:
        """The predictive variance ``[B]`` (regression) or of each class probability ``[B, C]``."""
        if self.draws.loc is None:
            return self.draws.log_probs.exp().var(0, unbiased=False)
        loc, scale = self.draws.loc, self.draws.scale.expand_as(self.draws.loc)
        return (scale.square().mean(0) + loc.var(0, unbiased=False)) * self.y_std**2


# ------------------------------------------------------------------------------------------ the object
def resumed_spec(spec: RunSpec, saved: RunSpec, run: Path) -> RunSpec:
    """The spec a resume of ``run`` continues with: the run's own. Only ``inference.num_samples`` of a method that
    adds draws (many-chain HMC) may differ: a larger value adds draws to the run, a smaller one continues it as it
    was asked for (so the first command resumes a run that a later one had grown). ``data.dir`` says where the data
    lives, not what it is, so it may differ too (a run copied to another machine resumes there) and the resume
    reads from the directory it was given.

    :param spec: the spec the resume was given.
    :param saved: the run's own spec (its spec.yaml).
    :param run: the run directory, for the message.
    :returns: the spec to continue the run with.
    :raises ZooInputError: when anything else differs.
    """
    asked, had = run_identity(spec), run_identity(saved)
    if asked == had:
        return spec
    grows = spec.inference.method in registry.method_of(spec).adds_draws
    differ = [(field, was, given) for field, was, given in spec_differences(had, asked)
              if not (grows and field == "inference.num_samples")]
    if differ:
        fields = "; ".join(f"{field}: {was!r} in the run, {given!r} given" for field, was, given in differ)
        raise ZooInputError("--resume", str(run), f"the spec differs from the run's {SPEC_FILE} in {len(differ)} "
                            f"field(s): {fields}; resume with the run's own spec (e.g. {run / SPEC_FILE})"
                            + (" (only inference.num_samples may grow, to add draws)" if grows else ""))
    if spec.inference.num_samples >= saved.inference.num_samples:
        return spec
    return spec.model_copy(update={"inference": spec.inference.model_copy(
        update={"num_samples": saved.inference.num_samples})})


def draw_count(num_samples: Any, default: int) -> int:
    """A count of posterior draws asked of the Python API: ``default`` for None, else a positive whole number.

    :param num_samples: the count asked for.
    :param default: the spec's ``predictive_samples``.
    :returns: the count.
    :raises ZooInputError: naming ``num_samples``, for anything but a whole number of 1 or more.
    """
    if num_samples is None:
        return default
    try:
        count = operator.index(num_samples)  # an int or NumPy integer, not a float or a bool
    except TypeError:
        count = None
    if count is None or isinstance(num_samples, bool):
        raise ZooInputError("num_samples", num_samples, "give a whole number of posterior draws, 1 or more (None: "
                            f"the spec's predictive_samples, {default})")
    if count < 1:
        raise ZooInputError("num_samples", num_samples, "give 1 or more posterior draws (None: the spec's "
                            f"predictive_samples, {default})")
    return count


@dataclass
class KeptFit:
    """What a fit without a run directory keeps beside its posterior, so that :meth:`BNN.save` can write the run
    directory afterwards as the fit would have written it.

    :param net: the net given in Python as ``torch.save`` pickled it when the fit began (``net.pt``), or None.
    :param given: what the run keeps of data given in Python (``data.pt``: :func:`~zoo.data.given.stand_in`), or
        None.
    :param result: the fit's result: its posterior and the method's records of the fit.
    :param log: the fit's log lines (``train.log``).
    """

    net: bytes | None = None
    given: dict[str, Any] | None = None
    result: Any = None
    log: list[str] = dataclasses.field(default_factory=list)


def _pickled(module: nn.Module) -> bytes:
    """The module as ``torch.save`` writes it to ``net.pt``."""
    buffer = io.BytesIO()
    torch.save(module, buffer)
    return buffer.getvalue()


class BNN:
    """A Bayesian neural network: ``net`` made Bayesian by a model family, under priors, with a likelihood, fitted
    by an inference method to a posterior.

    Every part may be given as its spec section, as the spec's dict (``{"name": "normal", "scale": 0.5}``) or by
    name (``"rank1"``); left out, it is the spec's default. They are validated together as a spec is (the same
    refusals and messages: a guide that does not fit the family, a prior the family cannot take, ...).

    :param net: your ``nn.Module``, or a net by name (``"mlp"``) or as the spec's net section (its widths then come
        from the data).
    :param family: the model family (``model`` section): ``all_weights`` (default), ``rank1``, ``deep_ensemble``,
        ``subnetwork``, ...
    :param prior: the prior (``prior`` section): a default and overrides by site-name glob.
    :param guide: the guide (``guide`` section); the inference method's own where it builds one (Laplace).
    :param likelihood: ``categorical``, ``gaussian`` (with its noise settings) or ``auto`` (what the data's task
        picks; default).
    :param inference: the inference method (``inference`` section): ``svi`` (default) or any registered in
        :data:`zoo.inference.METHODS` (``zoo list inference``); its settings may also be given to :meth:`fit`.
    :param member: a named member of the zoo (``rank1_cauchy``, ``mc_dropout``, ``subnetwork_laplace``, ...: ``zoo
        list members``), whose family, guide, prior and inference method the other arguments override.
    :param weights: trained weights to start from: a ``state_dict``, or the path of a ``.pt``/``.pth`` state dict, a
        ``.safetensors`` file or a zoo run directory (refused, listing the keys and shapes that differ, where they do
        not fit the net). Mean-field's means and rank-1's shared W start at them (rank-1's members at the trained net
        with ``guide={"init_sign_prob": 1.0}``); subnetwork Laplace (``map_from: net``), SWAG and SG-MCMC
        (``init: weights``) and MC dropout (``num_steps: 0``) work post hoc on them.
    :param seed: seeds every random stream of the fit.
    :param device: ``auto`` (CUDA where present), ``cpu`` or ``cuda``.
    :param dtype: ``float32`` or ``float64``.
    :raises ZooInputError: parts that do not fit together, with every problem listed.
    """

    def __init__(self, net: nn.Module | str | dict | BaseModel = "mlp", *, family: PartChoice = None,
                 prior: PartChoice = None, guide: PartChoice = None, likelihood: PartChoice = None,
                 inference: PartChoice = None, member: str | None = None, weights: WeightsSource | None = None,
                 seed: int = 0, device: str = "auto", dtype: str = "float32") -> None:
        net_tree, module = _net_tree(net)
        if weights is not None:
            if isinstance(weights, str | os.PathLike):
                net_tree = {**net_tree, "weights": str(weights)}  # the spec records where they came from
            elif module is not None:
                load_weights(module, weights, "weights")
            else:
                raise ZooInputError("weights", type(weights).__name__, "a net by name takes trained weights from a "
                                    "file: give the path of a .pt/.pth state dict, a .safetensors file or a run")
        if module is not None and net_tree.get("weights") is not None:
            load_weights(module, net_tree.pop("weights"), "weights")  # a module keeps its weights in net.pt
        tree = {"data": {"name": "given"}, "net": net_tree, "model": _tree(family, "family"),
                "prior": _tree(prior, "name"), "guide": _tree(guide, "name"),
                "likelihood": _tree(likelihood, "name"), "inference": _tree(inference, "method"),
                "member": member, "seed": seed, "device": device, "dtype": dtype}
        self._built = _attach(load_spec({k: v for k, v in tree.items() if v is not None}), module, None)
        self._spec = self._built
        self._reset()

    def _reset(self) -> None:
        self.family: ModelFamily | None = None
        self.guide: Any = None
        self._posterior: Posterior | None = None
        self.data: Dataset | None = None
        self.run_dir: Path | None = None
        self.metrics: dict[str, float] = {}
        self.plot: Path | None = None
        self.seconds = 0.0
        self.data_digests: dict[str, str] = {}  # of the rows fitted on and scored on (Dataset.digests)
        self._diagnoses: dict[int | None, Diagnosis] = {}  # diagnose()'s, by num_samples: the fit does not change
        self._memory: KeptFit | None = None
        self._chosen: dict[str, Any] = {}

    @classmethod
    def from_spec(cls, spec: RunSpec | dict | str | Path) -> BNN:
        """The BNN a run spec describes (a :class:`~zoo.spec.RunSpec`, a dict of sections or a YAML path).

        :param spec: the spec.
        :returns: the unfitted BNN.
        """
        spec = spec if isinstance(spec, RunSpec) else load_spec(spec)
        bnn = cls.__new__(cls)
        bnn._built = bnn._spec = spec
        bnn._reset()
        return bnn

    @property
    def spec(self) -> RunSpec:
        """The whole run spec: every part's section. Before a fit, the spec the BNN was built with; after one, the
        fit's (its data section, the settings given to :meth:`fit`: what ``spec.yaml`` of its run directory
        records). Each fit starts from the spec the BNN was built with, not from an earlier fit's."""
        return self._spec

    @property
    def posterior(self) -> Posterior:
        """The fitted posterior (draws of the latent sites, predictions from them).

        :raises RuntimeError: before :meth:`fit`.
        """
        if self._posterior is None:
            raise NotFitted("BNN", "not fitted", "this BNN is not fitted yet: call .fit(data) first (or "
                            "zoo.load(run_dir))")
        return self._posterior

    @property
    def chosen(self) -> dict[str, Any]:
        """What the fit chose on its calibration rows (the rows given as ``fit(val=...)``), by the spec field each
        choice set: the starting lr (``inference.lr``; a Laplace member's MAP phase ``model.map.lr``), the settings
        a member's spec leaves open (``guide.init_rho``, ``guide.init_scale``, ``guide.dropout_rate``,
        ``likelihood.noise_prior.init``, ``inference.pretrain_by``, ``inference.explore_burn_in``,
        ``inference.explore_lr``), the factor on the priors' scale (``inference.prior_scale_factor``; a Laplace
        member's MAP phase ``model.map.prior_scale_factor``) and a Laplace classifier's link (``inference.link``).
        Empty where it chose nothing: every such setting given, or no calibration rows. A regression's predictive
        noise set on the rows is :attr:`predictive_noise`. The run directory keeps it (``chosen.json``), so
        :func:`zoo.load` gives it back.

        :raises RuntimeError: before :meth:`fit`.
        """
        self.posterior  # noqa: B018 -- refuses before a fit
        return dict(self._chosen)

    @property
    def predictive_noise(self) -> float | None:
        """The one Gaussian noise σ every draw predicts with, in the targets' units, where the fit set it on its
        calibration rows (``inference.noise_by``, :mod:`zoo.inference.noise_choice`); None where each draw predicts
        with its own σ, the noise is fixed, or the task is not a regression.

        :raises RuntimeError: before :meth:`fit`.
        """
        noise = self.posterior.family.likelihood.predictive_noise
        return None if noise is None else noise * self.data.y_std

    # -- fitting -----------------------------------------------------------------------------------------
    @staticmethod
    def _with_settings(spec: RunSpec, settings: dict[str, Any]) -> RunSpec:
        """A copy of ``spec`` with ``settings`` in its inference section (``spec`` itself is left as it is); the
        budget (``epochs``, ``num_steps``) in the section its method trains in (e.g. Laplace's MAP phase)."""
        if not settings:
            return spec
        tree = spec.model_dump(mode="json", exclude_unset=True)  # defaults stay defaults (a rank scaled to a budget)
        method = registry.method_of(spec)
        budget = {k: v for k, v in settings.items() if k in BUDGET_SETTINGS}
        tree["inference"] = {**tree.get("inference", {}), **{k: v for k, v in settings.items() if k not in budget}}
        if budget:
            *path, last = method.budget_section.split(".")
            section = tree
            for key in path:
                section = section.setdefault(key, {})
            section[last] = {**section.get(last, {}), **method.spend_budget(budget, section.get(last, {}))}
        module = spec.net.module if isinstance(spec.net, ModuleNetSpec) else None
        return _attach(load_spec(tree), module, None)

    def _dataset(self, data: Any, val: Any, spec: RunSpec) -> tuple[Dataset, DataSection]:
        """The data to fit under ``spec``, and the spec's data section for it."""
        if isinstance(data, Mapping) and "name" in data:  # the spec's data section, as a dict
            data = data_section(**data)
        if isinstance(data, DataSection):
            if val is not None:
                raise ZooInputError("val", type(val).__name__, "a data set named by the spec brings its own "
                                    "evaluation rows: use data.validation_fraction for validation rows")
            return load_dataset(data, spec.seed), data
        if isinstance(data, Dataset):
            dataset = data if val is None else dataset_from((data.x_train, data.y_train), val, task=data.task,
                                                            n_classes=data.n_classes, name=data.name,
                                                            test_name="val")
        else:
            likelihood = spec.likelihood
            task = None if isinstance(likelihood, AutoLikelihoodSpec) else likelihood.task
            batch = spec.inference.model_dump().get("batch_size") or 128
            dataset = dataset_from(data, val, task=task, batch_size=batch, test_name="val")
        if val is not None and dataset.x_calibration is None:  # held out of training: what post-hoc steps tune on
            dataset = dataclasses.replace(dataset, x_calibration=dataset.x_test, y_calibration=dataset.y_test)
        return dataset, GivenData.of(dataset)

    def fit(self, data: TrainingData, *, val: Rows | Dataset | None = None, out: str | Path | None = None,
            resume: bool = False, progress: bool = True, echo: Callable[[str], Any] | None = None,
            monitor: ValidationMonitor | None = None,
            **settings: Any) -> BNN:
        """Fit the posterior to ``data``, in memory, or writing run directory ``out`` as it goes.

        Without ``out`` nothing is written to disk: the posterior, the metrics and the log stay in memory, and
        :meth:`save` writes the run directory afterwards. With ``out`` the fit writes it as it runs (checkpoints
        included, so that ``resume=True`` can continue an interrupted fit) and :attr:`plot` is drawn there.

        ``settings`` hold for this fit only: it runs a copy of the spec with them, which :attr:`spec` then shows
        (with the fit's data section), and the next ``fit`` starts again from the spec the BNN was built with.

        :param data: the training rows: ``(x, y)`` tensors or arrays, a torch ``Dataset`` of ``(x, y)`` items, a
            ``DataLoader`` of ``(x, y)`` batches, a zoo :class:`~zoo.data.base.Dataset`, or a spec's data section.
        :param val: rows to score the fit on at its end (the forms of ``data``), their metrics then
            :attr:`metrics`; with ``echo``, also scored five times as it goes (the last at its end), each score a
            line. They are also the calibration rows that choices are made on (the lr, ``inference.lr_by``; a
            regression's predictive noise, ``inference.noise_by``; a Laplace classifier's link), so score on other
            rows for a figure nothing was tuned on.
        :param out: the run directory to write as the fit runs (None: nothing is written); ``zoo eval``, ``zoo
            diagnose`` and ``zoo report`` read it, ``zoo.load`` rebuilds the BNN from it.
        :param resume: continue the fit checkpointed in ``out`` (needs ``out``).
        :param progress: show progress bars.
        :param echo: where the run's log lines go besides ``train.log`` (``print``; None: nowhere).
        :param monitor: scores the fit on its evaluation rows as it goes (a sweep prunes on it).
        :param settings: the inference method's settings for this fit (``epochs=20``, ``lr=0.01``, ...), as in the
            spec's ``inference`` section.
        :returns: the BNN itself, fitted.
        :raises ZooInputError: bad data or settings, ``resume`` without ``out``, or a run directory that holds
            another run.
        """
        if resume and out is None:
            raise ZooInputError("resume", True, "a fit without out= is kept in memory and writes no checkpoint to "
                                "continue: pass out=DIR, the run directory of the fit to resume")
        spec = self._with_settings(self._built, settings)
        dataset, section = self._dataset(data, val, spec)
        # refused here, before a run directory is claimed, where it cannot be set
        sets_noise = chooses_noise(spec.inference, dataset.x_calibration is not None,
                                   build_likelihood(spec.likelihood, dataset))
        digests = dataset.digests()
        spec = spec.model_copy(update={"data": section})
        module = spec.net.module if isinstance(spec.net, ModuleNetSpec) else None
        if monitor is None and val is not None and echo is not None:
            # scored five times as the fit goes where the scores are shown (echo); else only once, at its end, as
            # the fit's metrics below: each score is predictive_samples passes over the rows, most of a sampled
            # member's fit on a small net
            metric, reports = next(iter(task_of(dataset).metrics)), 5
            monitor = ValidationMonitor(metric, lambda k, v: echo(
                f"validation {metric} {v:.4g} ({k}/{reports} of the fit)"), spec.inference.predictive_samples,
                spec.seed, reports=reports)
        with distributed.joined(resolve_device(spec.device)) as team, (
                contextlib.nullcontext(None) if out is None
                else claimed_run_directory(Path(out), resume) if team.is_writer
                else contextlib.nullcontext(Path(out))
        ) as run:
            if run is None:  # kept in memory: what save() writes, as the run directory would have held it
                memory = KeptFit(net=_pickled(module) if module is not None else None,
                                 given=stand_in(dataset) if isinstance(section, GivenData) else None)
            else:
                memory = None
                if resume and (run / SPEC_FILE).exists():
                    if saved_from_memory(run):
                        raise ZooInputError("resume", str(run), "this run directory was saved from a fit kept in "
                                            "memory (BNN.save): it holds the finished fit, not the checkpoints of a "
                                            "fit as it ran, so there is nothing to resume; zoo.load it, or fit "
                                            "again with a new out")
                    spec = resumed_spec(spec, load_spec(run / SPEC_FILE), run)
                    kept = load_torch(run / GIVEN_FILE) if (run / GIVEN_FILE).exists() else {}
                    if kept.get("digests", digests)["train"] != digests["train"]:
                        raise ZooInputError("data", str(run), "are not the training rows this run was fitted on "
                                            f"({kept.get('n_train')} rows then, {dataset.n_train} now, or other "
                                            "values): resume with the same rows, or fit them into a new out")
                elif team.is_writer and holds_a_fit(run):
                    raise ZooInputError("--out", str(run),
                                        "already holds a run; pass --resume to continue it, or pick a new --out")
                write_text(run / SPEC_FILE, spec_to_yaml(spec))
                if module is not None:
                    torch.save(module, run / NET_FILE)
                if isinstance(section, GivenData):
                    save_torch(run / GIVEN_FILE, stand_in(dataset))
            log = RunLog(run, echo if team.is_writer else None, keep=memory is not None)
            method = registry.method_of(spec)
            if dataset.streamed and (not method.streams_rows or spec.guide.needs_every_row):
                log(f"{spec.inference.method} reads every training row at each step: the loader's "
                    f"{dataset.n_train:,} rows are read into memory")
                dataset = dataset.materialised()
            placed, device = place(spec, dataset, log)
            family, guide = build(spec, placed, run, log, progress and team.is_writer)
            if len(placed.y_test):  # the test set is scored at the end: refused now, not after the fit
                check_draws_fit(family, placed, spec.inference.predictive_samples, "inference.predictive_samples")
            log(f"{placed.name}: {placed.n_train} train / {len(placed.y_test)} test, {placed.in_dim} inputs -> "
                f"{placed.out_dim} outputs; {describe(spec)}, device {device}"
                + (f", {team.size} processes" if team.size > 1 else ""))
            result = method.fit(family, guide, placed, spec.inference, spec.seed, run_dir=run, resume=resume,
                                log=log, progress=progress and team.is_writer, monitor=monitor,
                                start=starting_posterior(spec))
            noise_seconds = 0.0
            if sets_noise:  # the predictive's noise, set on the calibration rows (zoo.inference.noise_choice)
                started = time.perf_counter()
                log(set_noise_on_calibration_rows(result.posterior, family.likelihood, placed,
                                                  spec.inference.predictive_samples, spec.seed))
                noise_seconds = time.perf_counter() - started
                if run is not None and team.is_writer:
                    save_predictive_noise(run, family.likelihood)
            self._reset()
            self._spec = spec
            self.family, self.guide, self._posterior, self.data = family, guide, result.posterior, placed
            # the whole fit: the structure's (a MAP phase), the method's, as their files record them, and the noise's
            self.run_dir, self.data_digests = run, digests
            self.seconds = result.seconds + family.structure_seconds + noise_seconds
            # a method of your own that chooses nothing on the rows may leave ``chosen`` out of its fit
            self._chosen = {**family.structure_chosen, **getattr(result, "chosen", {})}
            if memory is not None:
                memory.result, memory.log = result, log.lines
                self._memory = memory
            if not team.is_writer:  # rank 0 evaluates and writes
                return self
            if run is not None:
                write_json(run / CHOSEN_FILE, self._chosen)
            if run is not None and isinstance(result.posterior, GuidePosterior):  # what guide.init_from reads
                save_torch(run / POINT_ESTIMATE_FILE, guide.point_estimate())
            if len(placed.y_test):
                self.metrics = evaluate(result.posterior, placed, spec.inference.predictive_samples, seed=spec.seed)
                self.metrics["train_seconds"] = round(self.seconds, 3)
                if run is not None:
                    write_json(run / METRICS_FILE, self.metrics)
                    self.plot = plot_predictive(result.posterior, placed, run, spec.inference.predictive_samples,
                                                seed=spec.seed)
        return self

    @property
    def label(self) -> str:
        """How tables and plots name this BNN: its member's name (``rank1_cauchy``), else its inference method and
        guide (``svi/mean_field``, ``hmc``)."""
        return self._spec.member or method_label(self._spec)

    @property
    def chains(self) -> bool:
        """Whether the posterior is draws stored chain by chain (MCMC), whose convergence can be checked."""
        return isinstance(self._posterior, ChainPosterior)

    # -- using the fit -----------------------------------------------------------------------------------
    def _inputs(self, x: Any) -> torch.Tensor:
        data = self.data
        x = predict_rows(x)
        x = as_training_rows(x, data.x_train, "predict x")  # another row shape: named here, not in a batched call
        if data.x_mean is not None:  # a zoo data set standardises its inputs: predict takes them as it gave them
            x = (x.to(data.x_mean) - data.x_mean) / data.x_std
        return x.to(device=data.device, dtype=data.dtype if x.is_floating_point() else x.dtype)

    def predict(self, x: ArrayLike, num_samples: int | None = None) -> Prediction:
        """The predictive distribution at inputs ``x``, as the data gave them.

        :param x: inputs ``[B, ...]`` (a tensor or an array).
        :param num_samples: posterior draws (None: the inference method's ``predictive_samples``).
        :returns: the mixture's :attr:`~Prediction.probs` or :attr:`~Prediction.mean` and
            :attr:`~Prediction.variance`, and every draw's own predictive.
        :raises ZooInputError: ``num_samples`` not a positive whole number, or more draws than fit in memory.
        """
        samples = draw_count(num_samples, self._spec.inference.predictive_samples)
        posterior, rows = self.posterior, self._inputs(x)
        check_draw_memory(posterior, samples, len(rows), 3 * max(self.data.out_dim, 1), rows.element_size(),
                          "num_samples", also=", or predict on fewer rows at a time")
        draws = posterior.predict(rows, samples)
        return Prediction(draws, self.data.y_mean, self.data.y_std)

    def evaluate(self, data: Rows | Dataset, num_samples: int | None = None) -> dict[str, float]:
        """The test metrics of the task (NLL, accuracy, ECE, Brier; or RMSE and test log-likelihood) on ``data``.

        :param data: ``(x, y)`` tensors or arrays, a torch ``Dataset`` or a ``DataLoader``, as :meth:`fit` takes.
        :param num_samples: posterior draws (None: the inference method's ``predictive_samples``).
        :returns: the metrics, as ``metrics.json`` holds them.
        """
        return evaluate(self.posterior, self.test_set(data),
                        draw_count(num_samples, self._spec.inference.predictive_samples), seed=self._spec.seed)

    def test_set(self, data: Rows | Dataset) -> Dataset:
        """The fit's data set with ``data`` as its test rows, placed and standardised as the fit's own (what
        :meth:`evaluate` scores, and :func:`zoo.compare` compares on).

        :param data: ``(x, y)`` tensors or arrays, a torch ``Dataset`` or a ``DataLoader``, as :meth:`fit` takes.
        :returns: the data set.
        :raises ZooInputError: rows that do not fit the fit's data (row shape, dtype, task, classes).
        """
        self.posterior  # noqa: B018 - an unfitted BNN is refused here, naming fit()
        fitted = self.data
        x, y = evaluation_rows(data, fitted)  # every row, whatever the form: a loader is read whole, not streamed
        y = y.to(fitted.device)
        if y.is_floating_point():  # targets as the data gave them, standardised as the fit's were
            y = ((y - fitted.y_mean) / fitted.y_std).to(fitted.dtype)
        return Dataset(fitted.name, fitted.task, fitted.x_train, fitted.y_train, self._inputs(x), y,
                       n_classes=fitted.n_classes, y_mean=fitted.y_mean, y_std=fitted.y_std,
                       image_shape=fitted.image_shape, x_mean=fitted.x_mean, x_std=fitted.x_std,
                       fingerprint={**self.data_digests, "test": rows_digest(x, y)} if self.data_digests else None)

    def save(self, out: str | Path) -> Path:
        """Keep the fit in run directory ``out`` (``zoo.load(out)`` reads it back, as do ``zoo eval``, ``zoo
        diagnose`` and ``zoo report``).

        A fit with a run directory is copied from it. A fit kept in memory (:meth:`fit` without ``out``) is written
        as its run directory would have held it at its end: ``spec.yaml``, ``net.pt`` and ``data.pt`` (a net and
        data given in Python), what the family fitted of its structure (a subnetwork and its MAP net), the fit
        (its method's :meth:`~zoo.inference.base.InferenceMethod.fit_record`), ``point_estimate.pt``,
        ``metrics.json``, ``train.log`` and the plot (which :attr:`plot` then names). It holds the finished fit, not
        checkpoints of its progress: it loads, and does not resume. The BNN itself stays in memory.

        :param out: the directory (created; it must not hold another run).
        :returns: the directory.
        :raises ZooInputError: a directory that holds files already, or a fit kept in memory whose posterior only its
            fitter writes (fit it with ``out`` instead).
        """
        target = Path(out)
        if self._posterior is None:
            raise NotFitted("BNN", "not fitted", "this BNN is not fitted yet: call .fit(data) first")
        if self.run_dir is not None:
            if target.resolve() == self.run_dir.resolve():
                return target
            if self.run_dir.resolve() in target.resolve().parents:
                raise ZooInputError("out", str(target), f"lies inside this BNN's run directory {self.run_dir}, which "
                                    "would then hold a copy of itself: pick a directory outside it")
        if target.exists() and not target.is_dir() or any(p.is_file() for p in target.parents):
            raise ZooInputError("out", str(target), "is a file, or lies under one: give the path of a directory for "
                                "the run (e.g. a new folder name)")
        if target.exists() and any(target.iterdir()):
            raise ZooInputError("out", str(target), "holds files already: pick a new directory")
        if self.run_dir is not None:
            shutil.copytree(self.run_dir, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.lock"))
            return target
        return self._write_run(target)

    def _write_run(self, target: Path) -> Path:
        """Write the run directory of a fit kept in memory (see :meth:`save`)."""
        memory, spec, posterior = self._memory, self._spec, self.posterior
        if memory is None or memory.result is None:
            raise NotFitted("BNN", "not fitted", "this BNN holds no fit of its own to save: call .fit(data) first")
        method = registry.method_of(spec)
        record = method.fit_record(memory.result)  # refused before anything is written
        with claimed_run_directory(target) as run:
            mark_saved_from_memory(run)
            write_text(run / SPEC_FILE, spec_to_yaml(spec))
            if memory.net is not None:
                write_atomically(run / NET_FILE, lambda tmp: tmp.write_bytes(memory.net))
            if memory.given is not None:
                save_torch(run / GIVEN_FILE, memory.given)
            self.family.save_structure(run)
            save_checkpoint(run / method.files[0], record)
            save_predictive_noise(run, self.family.likelihood)
            write_json(run / CHOSEN_FILE, self._chosen)
            if isinstance(posterior, GuidePosterior):  # what guide.init_from of a later run reads
                save_torch(run / POINT_ESTIMATE_FILE, self.guide.point_estimate())
            if memory.log:
                write_text(run / LOG_FILE, "".join(f"{line}\n" for line in memory.log))
            if self.metrics:
                write_json(run / METRICS_FILE, self.metrics)
            if len(self.data.y_test):
                self.plot = plot_predictive(posterior, self.data, run, spec.inference.predictive_samples,
                                            seed=spec.seed)
        return target

    @classmethod
    def load(cls, run_dir: str | Path) -> BNN:
        """The fitted BNN a run directory holds (written by ``zoo train``, :meth:`fit` or :meth:`save`).

        An unfinished SVI run loads at the step it reached, with a :class:`~zoo.errors.ZooWarning` saying so; an
        unfinished MCMC run is refused (its draws are not there yet).

        :param run_dir: the run directory.
        :returns: the BNN, with its data set (for data given in Python: a stand-in of two example rows) and the test
            metrics the fit recorded (:attr:`metrics`).
        :raises ZooInputError: not a run directory, a run that holds no fit yet, or a net given in Python whose class
            no longer imports (naming its import path).
        """
        run = Path(run_dir)
        if not (run / SPEC_FILE).exists():
            raise ZooInputError("RUN_DIR", str(run), "not a run directory (it has no spec.yaml)")
        spec = load_spec(run / SPEC_FILE)
        method = registry.method_of(spec)
        if not method.holds_fit(run):
            kept = [what for name, what in spec.model.files.items() if (run / name).exists()]
            stage = f"only {' and '.join(kept)} so far" if kept else "nothing was fitted yet"
            raise ZooInputError("RUN_DIR", str(run), f"holds no {' or '.join(method.files)} ({stage}); finish it with "
                                "zoo train --resume")
        module = _load_module(run, spec.net) if isinstance(spec.net, ModuleNetSpec) else None
        stand_in_rows = from_stand_in(load_torch(run / GIVEN_FILE)) if isinstance(spec.data, GivenData) else None
        spec = _attach(spec, module, stand_in_rows)
        rows = load_dataset(spec.data, spec.seed)
        data, device = place(spec, rows)
        family, guide = build(spec, data, run)
        # a fitted run needs the run it started from only for the point parameters it did not fit itself (rank-1's W)
        start = starting_posterior(spec) if family.point_parameters() else None
        bnn = cls.from_spec(spec)
        bnn.family, bnn.guide, bnn.data, bnn.run_dir, bnn.data_digests = family, guide, data, run, rows.digests()
        bnn._posterior = method.load(family, guide, spec.inference, run, device, start=start)
        load_predictive_noise(run, family.likelihood)
        bnn.metrics = _recorded_metrics(run)
        bnn._chosen = recorded_choices(run)
        return bnn

    def diagnose(self, num_samples: int | None = None, test: Rows | None = None) -> Diagnosis:
        """Check the fitted posterior: for chains (MCMC), R-hat and bulk/tail ESS in function space, divergences,
        BFMI and the convergence verdict; for a guide or any approximation with a density, the PSIS Pareto k-hat of
        ``num_samples`` iid draws against the model's log joint. Nothing is written: the result shows as tables in a
        notebook, and its ``save(dir)`` writes what ``zoo diagnose`` writes (plots included).

        :param num_samples: the draws to check: about this many stored draws, thinned evenly per chain (MCMC), or
            this many iid draws (default 200) of the approximation; None for every stored draw (MCMC).
        :param test: rows ``(x, y)`` to take the function-space summaries at (None: the fit's test rows; a run of
            data given in Python, read back, keeps none and needs them).
        :returns: the :class:`~zoo.posterior_checks.Diagnosis`: ``.verdict``, ``.passed``, ``.warnings`` (each with
            what to change), ``.summary`` and ``.checks`` as DataFrames, ``.idata``, ``.plots(dir)``, ``.save(dir)``.
        :raises ZooInputError: ``num_samples`` below 1; no test rows to summarise the function at.
        """
        if test is not None:
            return diagnosis_of(self._spec, self.test_set(test), self.posterior, self.run_dir, num_samples)
        if num_samples not in self._diagnoses:
            self._diagnoses[num_samples] = diagnosis_of(self._spec, self.data, self.posterior, self.run_dir,
                                                        num_samples)
        return self._diagnoses[num_samples]

    @property
    def verdict(self) -> str:
        """The one-line verdict of :meth:`diagnose` (``converged: ...``, ``NOT CONVERGED: ...`` with the figures and
        what to change)."""
        return self.diagnose().verdict

    def to_inference_data(self, num_samples: int | None = None) -> arviz.InferenceData:
        """The fit as an ArviZ ``InferenceData`` (posterior draws with named dims, the posterior predictive and
        pointwise log-likelihood at the training rows, sampler statistics), as ``zoo diagnose`` writes it.

        :param num_samples: draws of a guide's posterior (MCMC keeps its chains).
        :returns: the ``arviz.InferenceData``.
        """
        from zoo.inference_data import to_inference_data

        posterior = self.posterior
        if isinstance(posterior, ChainPosterior):
            return to_inference_data(posterior, self.data, chains=posterior.chains, stats=posterior.stats,
                                     seed=self._spec.seed)
        samples = draw_count(num_samples, self._spec.inference.predictive_samples)
        return to_inference_data(posterior, self.data, num_samples=samples, seed=self._spec.seed)


def _recorded_metrics(run: Path) -> dict[str, float]:
    """The test metrics a run recorded (``metrics.json``); {} where it has none or it cannot be read (``zoo compare``
    names a damaged one; loading the fit does not need it)."""
    try:
        stored = json.loads((run / METRICS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return stored if isinstance(stored, dict) else {}


def _load_module(run: Path, section: ModuleNetSpec) -> nn.Module:
    """A run's net given in Python, from its ``net.pt``; refused naming the import path when its class is gone."""
    try:
        module = torch.load(run / NET_FILE, weights_only=False, map_location="cpu")
    except (ImportError, AttributeError) as err:
        raise ZooInputError("net", section.target, f"this run's net is an instance of {section.target}, which must "
                            f"be importable to load it ({type(err).__name__}: {err})") from None
    except FileNotFoundError:
        raise ZooInputError("RUN_DIR", str(run), f"its net was given in Python and {NET_FILE} is missing") from None
    except Exception as err:  # noqa: BLE001 - unpickling a damaged file fails in many ways
        raise ZooInputError("RUN_DIR", str(run), f"its {NET_FILE} cannot be read ({type(err).__name__}: "
                            f"{str(err)[:160]}): it is damaged; restore it from a copy, or fit the run again") from None
    if not isinstance(module, nn.Module):
        raise ZooInputError("RUN_DIR", str(run), f"its {NET_FILE} holds a {type(module).__name__}, not the pickled "
                            "nn.Module the run was fitted with; restore it (zoo.BNN(...).fit writes it)")
    return module


def starting_posterior(spec: RunSpec) -> Posterior | None:
    """The posterior of the run the spec's inference method starts from (e.g. MCMC's ``inference.init``), if any.

    :param spec: the run spec.
    :returns: that run's posterior, or None.
    """
    source = registry.method_of(spec).start_from(spec.inference)
    return BNN.load(source).posterior if source is not None else None


def load(run_dir: str | Path) -> BNN:
    """The fitted BNN a run directory holds (see :meth:`BNN.load`).

    :param run_dir: the run directory.
    :returns: the BNN.
    """
    return BNN.load(run_dir)
