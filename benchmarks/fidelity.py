"""Posterior fidelity of every zoo member against an MCMC reference (NUTS or HMC), on the reference run's own task.

    python benchmarks/fidelity.py --reference runs/notebooks/regression/full/hmc \\
        [--members all|name,...] [--runs-dir DIR] [--json PATH] [--threads N] [--samples S] [--steps N]
    python benchmarks/fidelity.py --reference runs/hmc_uci/bostonHousing-split0{0,1,2} ...   # UCI, several splits

The task follows from the reference run's spec: the toy with a gap (regression), two moons (classification), a
UCI data set or digits. On a UCI or digits reference each member is its own config for that data
(:func:`member_configs`: the settings of the UCI and digits tables) run on the reference's data set, split (UCI) or
seed (digits) and net width, and the members' runs go to ``runs/fidelity/uci/<data set>-split<NN>/<member>`` or
``runs/fidelity/digits/digits-seed<NN>/<member>``. Given several references, the script also prints, per data
set, each member's figures as mean ± standard error over the references (splits or seeds), and how many of them pass
``zoo diagnose --strict``; the JSON then holds ``per_reference`` and ``summary``.
Every member is a preset of :data:`zoo.members.MEMBERS` (the zoo's one table of members; ``member: NAME`` in a
spec) with this benchmark's own settings on top (:data:`MEMBERS` below: the preset's name, the row's label and, on
the toy and two moons, the run lengths and the settings the toy configs chose), applied to the reference run's own
spec (its data, net, prior and likelihood, which a member keeps unless it has to replace them: a preset with a
prior of its own, the rank-1 factors' centred at 1, replaces the reference's), then trained, or reused:

* a run directory next to the reference (e.g. the notebooks' ``runs/notebooks/<topic>/full/mean_field``) whose
  ``spec.yaml`` equals the spec the table builds, the member's name aside, is used as it is (the table says which);
* otherwise the run goes to ``--runs-dir`` (default ``runs/fidelity/<toy|moons>/<member>``); a finished run there
  with the same spec is reused, an unfinished one is resumed, and one with a different spec is an error.

Figures. All of them come from one set of S posterior draws per run (``--samples``, default 200), taken the way
``zoo compare`` takes them: ``pyro.set_rng_seed(seed + 1)``, then
``posterior.predict(x_test, draws=posterior.sample(S))`` -- the same treatment for every method, including the
ones with a closed-form predictive (subnetwork Laplace's GLM is evaluated at draws here, so its RMSE / test LL can
differ slightly from its metrics.json).

* Regression: ``coverage_95`` (share of the NUTS predictive of y inside the member's central 95% interval, mean
  over test inputs; 0.95 ideal) and ``w1`` (Wasserstein-1 between predictive marginals of y, original units):
  exactly ``zoo.diagnostics.compare``'s; ``rmse`` and ``test_ll`` (``zoo.metrics.regression_metrics`` on those
  draws); ``sd_ratio``: the mean predictive sd of f inside the gap (the widest space between training inputs, on a
  300-point grid from min - 1 to max + 1 of the training inputs) divided by its mean at the training inputs, from
  400 draws seeded 0, grid and training inputs in one call -- as the regression notebook defines it (null, shown
  as -, for a point estimate such as MAP: its f has sd 0 everywhere, so the ratio is 0 / 0). The JSON also has
  both sds (``sd_gap``, ``sd_data``, original units): the ratio is scale-free, so a narrow band can score well.
* Classification: ``agreement`` (argmax matches NUTS's) and ``tv`` (mean total variation between predictive class
  distributions), exactly ``compare``; ``accuracy``, ``nll``, ``ece`` (``classification_metrics`` on those draws).

Where each member's settings come from (nothing was tuned on test inputs; the SVI settings are the notebooks':
3000 full-batch Adam steps at lr 0.01, those of ``configs/mean_field_toy.yaml`` and ``configs/rank1_toy.yaml``):

* ``mean_field``: ``configs/mean_field_toy.yaml`` (guide ``mean_field``, init rho -5, 200 predictive draws), as
  both notebooks train it -- their cached runs are reused.
* ``map``: guide ``delta`` with the reference's N(0, 1) prior as weight decay (``configs/map_*.yaml``); steps and
  lr the notebooks' SVI settings (the map configs' own schedules were chosen for UCI / digits).
* ``mc_dropout``: guide ``dropout`` (``configs/mc_dropout_*.yaml``); rate p = 0.2 on regression (chosen on
  validation LL for a one-hidden-layer regression net in ``configs/mc_dropout_uci.yaml``) and p = 0.1 on
  classification (``configs/mc_dropout_digits.yaml``); 100 predictive passes; the notebooks' SVI settings.
* ``deep_ensemble``: family ``deep_ensemble``, 5 members, guide ``delta`` (``configs/deep_ensemble_*.yaml``),
  each a MAP fit under the reference's prior; the notebooks' SVI settings.
* ``rank1``: ``configs/rank1_toy.yaml`` (K = 4, N(1, 0.5) factor priors, weight decay 1 on the shared W, mixture
  guide) as both notebooks train it -- their cached runs are reused.
* ``batch_ensemble``: the rank-1 family of ``configs/rank1_toy.yaml`` with guide ``batch_ensemble`` (Dirac
  factors; prior N(1, 1), unused, and guide init of ``configs/batchensemble_uci.yaml``); the notebooks' SVI
  settings.
* ``subnet_laplace``: family ``subnetwork``, ``inference: laplace``, GLM predictive, one prior precision per
  layer. Toy: exactly ``configs/subnet_laplace_toy.yaml``, which uses a **1-50-50-1** tanh net (not the
  reference's 1-50-1: with 1-50-1, 5% of the weights is 8 and the in-between sd stays low; see that config), 5%
  largest-magnitude weights, evidence at the linearised mode -- the regression notebook's cached run. Two moons:
  the reference's 2-16-2 net, the 25% largest-magnitude of its 82 weights, evidence at the MAP (as
  ``configs/subnet_laplace_uci.yaml`` chose on validation data), probit link; MAP by the notebooks' SVI settings.
* ``sgld``, ``sghmc``, ``swag``, ``multiswag``: toy: ``configs/<member>_toy.yaml``'s inference section on the
  reference's net, prior and likelihood (8 chains / 5 models; the SGD-based steps are small because sigma = 0.1
  makes the toy stiff). Two moons: 8 chains x 4,000 full-batch steps at lr 0.05 (SGLD polynomial, SGHMC 8 cosine
  cycles), burn-in 1,000, every 25th; SWAG 300 + 100 epochs of batch 20 at lr 0.05 -> 0.01, an iterate every 10
  steps, rank 20 (``MOONS_SGMCMC``, ``MOONS_SWAG``).
* ``auto_normal``, ``auto_low_rank_mvn``, ``auto_mvn``: Pyro's autoguides (``configs/auto_*_toy.yaml``): init
  scale softplus(-5), rank 10, the notebooks' SVI settings.
* ``auto_laplace_approximation``: Pyro's Laplace autoguide (``configs/auto_laplace_approximation_toy.yaml``): a
  MAP fit by the notebooks' SVI settings, polished by L-BFGS, the inverse Hessian as covariance, in float64 (in
  float32 the polish stops short of the mode and the Hessian is indefinite); no UCI config (the Hessian at the
  UCI nets' MAP is not positive definite), so it is skipped on UCI references.
* ``concrete_dropout``: guide ``dropout`` with ``dropout: concrete`` from p = 0.1 (``configs/concrete_dropout_*``),
  the notebooks' SVI settings.

Two columns keep every row honest: ``same posterior as the reference`` (``no: net`` etc. when a member's data,
net, prior or likelihood differ from the reference's, so it approximates another posterior) and ``reference
passes --strict`` (``zoo diagnose --strict`` on the reference: function-space R-hat <= 1.01, bulk/tail ESS >= 400,
no divergences, BFMI >= 0.3). A reference that fails it, or is not NUTS/HMC draws, is refused before any member
trains; ``--allow-unconverged`` goes on with it, the column then saying ``NO``: every figure carries the reference's
own Monte Carlo error.

``--steps N`` replaces every member's SVI step count (and the subnetwork's MAP step count) -- for smoke tests; it
changes the specs, so such runs never reuse full-size ones.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import pyro
import torch
from rich.console import Console
from rich.table import Table

from zoo.cli import exit_code
from zoo.diagnostics import (
    COMPARE_DRAWS,
    RunPredictive,
    compare_predictives,
    jsonable,
    run_predictive,
    trusted_reference,
)
from zoo.errors import TrainingDiverged, ZooInputError
from zoo.members import MEMBERS as PRESETS
from zoo.metrics import classification_metrics, mean_and_standard_error, regression_metrics
from zoo.pipeline import load_run, train
from zoo.runs import METRICS_FILE, SPEC_FILE, write_json
from zoo.spec import RunSpec, load_spec

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
RATIO_DRAWS, RATIO_SEED, GRID_POINTS = 400, 0, 300  # the regression notebook's predictive_band

# The notebooks' SVI settings (configs/mean_field_toy.yaml, configs/rank1_toy.yaml): full batch, 3000 Adam steps.
SVI = {"method": "svi", "num_steps": 3000, "batch_size": None, "lr": 0.01}
SUBNET_MAP = {"num_steps": 3000, "batch_size": None, "lr": 0.01}  # the subnetwork's MAP fit, by the same settings

# name -> the row's preset in zoo.members.MEMBERS ("member"), its label, and this benchmark's own settings on the toy
# and two moons ("overrides": by section, merged into the preset's section key by key, as a spec's own sections
# are; a value may be given per task, {"regression": ..., "classification": ...}; "net.hidden" is set on its own).
# On a UCI or digits reference a row is its config for that data instead (member_configs).
MEMBERS: dict[str, dict[str, Any]] = {
    "mean_field": {"member": "mean_field", "label": "mean-field VI", "overrides": {
        "guide": {"init_rho": -5.0}, "inference": {**SVI, "predictive_samples": 200}}},
    "map": {"member": "map", "label": "MAP", "overrides": {"inference": {**SVI, "predictive_samples": 1}}},
    "mc_dropout": {"member": "mc_dropout", "label": "MC dropout", "overrides": {
        # configs/mc_dropout_uci.yaml's; classes: configs/mc_dropout_digits.yaml's (the preset's, no validation rows)
        "guide": {"regression": {"dropout_rate": 0.2}, "classification": {"dropout_rate": 0.1}},
        "inference": {**SVI, "predictive_samples": 100}}},
    "deep_ensemble": {"member": "deep_ensemble", "label": "deep ensemble (5)", "overrides": {
        "inference": {**SVI, "predictive_samples": 1}}},
    "rank1": {"member": "rank1_normal", "label": "rank-1 (K = 4)", "overrides": {  # configs/rank1_toy.yaml's
        "prior": {"scale": 0.5}, "model": {"weight_decay": 1.0}, "inference": {**SVI, "predictive_samples": 100}}},
    "batch_ensemble": {"member": "batch_ensemble", "label": "BatchEnsemble (K = 4)", "overrides": {
        "model": {"weight_decay": 1.0}, "inference": {**SVI, "predictive_samples": 100}}},
    "subnet_laplace": {
        "member": "subnetwork_laplace",
        "label": {"regression": "subnetwork Laplace (5%, 1-50-50-1 net)",
                  "classification": "subnetwork Laplace (25%)"},
        "overrides": {
            "net.hidden": {"regression": [50, 50]},  # configs/subnet_laplace_toy.yaml's net; moons keep 2-16-2
            "model": {
                "regression": {"selection": {"strategy": "largest_magnitude", "size": 0.05}, "map": SUBNET_MAP},
                "classification": {"selection": {"strategy": "largest_magnitude", "size": 0.25}, "map": SUBNET_MAP}},
            "inference": {
                "regression": {"predictive": "glm"},
                "classification": {"evidence_at": "map", "predictive": "glm", "link": "probit"}},
        },
    },
}


def _toy_inference(name: str) -> dict:
    """The inference section of ``configs/<name>`` as it resolves (a new member's toy config, so the toy table runs
    what the config says)."""
    return load_spec(CONFIG_DIR / name).inference.model_dump(mode="json")


# The members that came with the inference-method protocol: on the toy, their configs' settings; on two moons
# (categorical, far less stiff than the toy's sigma = 0.1), a step 100x larger for the SGD-based ones.
MOONS_SGMCMC = {"num_chains": 8, "epochs": 4000, "batch_size": None, "lr": 0.05, "burn_in_epochs": 1000,
                "thin": 25, "predictive_samples": 400}
MOONS_SWAG = {"epochs": 100, "pretrain_epochs": 300, "batch_size": 20, "lr": 0.01, "pretrain_lr": 0.05,
              "collect_every": 10, "predictive_samples": 200}
for _name, _member, _label, _config, _moons in (
        ("sgld", "sgld", "SGLD (8 chains)", "sgld_toy.yaml", MOONS_SGMCMC),
        ("sghmc", "cyclical_sghmc", "cyclical SGHMC (8 chains)", "sghmc_toy.yaml", {"cycles": 8, **MOONS_SGMCMC}),
        ("swag", "swag", "SWAG", "swag_toy.yaml", MOONS_SWAG),
        ("multiswag", "multiswag", "MultiSWAG (5)", "multiswag_toy.yaml", MOONS_SWAG)):
    MEMBERS[_name] = {"member": _member, "label": _label, "overrides": {
        "inference": {"regression": _toy_inference(_config), "classification": _moons}}}
for _kind, _label in (("normal", "AutoNormal"), ("low_rank_mvn", "AutoLowRankMVN (rank 10)"),
                      ("mvn", "AutoMultivariateNormal")):
    MEMBERS[f"auto_{_kind}"] = {"member": f"auto_{_kind}", "label": f"Pyro {_label}", "overrides": {
        "guide": {"init_rho": -5.0}, "inference": {**SVI, "predictive_samples": 200}}}
MEMBERS["auto_laplace_approximation"] = {
    "member": "auto_laplace_approximation", "label": "Pyro AutoLaplaceApproximation (float64)",
    "overrides": {"inference": {**SVI, "predictive_samples": 200}, "dtype": "float64"}}
MEMBERS["concrete_dropout"] = {"member": "concrete_dropout", "label": "concrete dropout (learned p)", "overrides": {
    "inference": {**SVI, "predictive_samples": 200}}}
assert all(row["member"] in PRESETS for row in MEMBERS.values())

# On a reference on real data (a UCI data set, digits) each member is its own config for that data,
# configs/<stem>_<topic>.yaml (the stem is the member's name unless CONFIG_STEMS says otherwise), run on the
# reference's data (set, split, seed) and net width: the settings the UCI and digits tables report, not the
# notebooks' toy settings. A member without such a config is skipped there.
REAL_DATA_TOPICS = ("uci", "digits")
CONFIG_STEMS = {"rank1": "rank1_cauchy", "batch_ensemble": "batchensemble"}


def member_configs(topic: str) -> dict[str, str]:
    """``{member: config file name}`` of the members that have a config for ``topic`` (``uci`` or ``digits``)."""
    names = {name: f"{CONFIG_STEMS.get(name, name)}_{topic}.yaml" for name in MEMBERS}
    return {name: file for name, file in names.items() if (CONFIG_DIR / file).is_file()}


TOPICS = {"regression": "toy", "classification": "moons"}
COLUMNS = {"regression": ["coverage_95", "w1", "rmse", "test_ll", "sd_ratio"],
           "classification": ["agreement", "tv", "accuracy", "nll", "ece"]}
UCI_COLUMNS = ["coverage_95", "w1", "rmse", "test_ll"]  # no gap to measure the sd in: inputs are many-dimensional

HEADERS = {"coverage_95": "coverage of {ref}", "w1": "W1 to {ref}", "rmse": "RMSE", "test_ll": "test LL",
           "sd_ratio": "sd in gap ÷ sd at data", "agreement": "agreement with {ref}", "tv": "total variation",
           "accuracy": "accuracy", "nll": "NLL", "ece": "ECE"}


def topic_of(spec: RunSpec, task: str) -> str:
    """``uci`` for a UCI reference, ``digits`` for a digits one, else the toy task's topic (``toy`` or ``moons``)."""
    if spec.data.name.startswith("uci:"):
        return "uci"
    return "digits" if spec.data.name == "digits" else TOPICS[task]


def replicate_of(spec: RunSpec, topic: str) -> str:
    """The folder of one reference's members among several: per data set and split (UCI), per seed elsewhere (the
    digits' test rows follow the seed)."""
    if topic == "uci":
        return f"{spec.data.name.removeprefix('uci:')}-split{spec.data.split:02d}"
    return f"{spec.data.name}-seed{spec.seed:02d}"


def columns_of(topic: str, task: str) -> list[str]:
    return UCI_COLUMNS if topic == "uci" else COLUMNS[task]


def _by_task(value: Any, task: str) -> Any:
    """A per-task entry ({"regression": ..., "classification": ...}) for ``task``, or the value itself."""
    if isinstance(value, dict) and set(value) <= {"regression", "classification"} and value:
        return value.get(task)
    return value


def member_label(name: str, task: str, topic: str = "") -> str:
    if topic in REAL_DATA_TOPICS:
        return f"{_by_task(MEMBERS[name]['label'], task).split(' (')[0]} ({member_configs(topic)[name]})"
    return _by_task(MEMBERS[name]["label"], task)


def member_spec(reference: RunSpec, name: str, task: str, steps: int | None = None) -> RunSpec:
    """The reference's spec with row ``name``'s preset (:data:`zoo.members.MEMBERS`) and this benchmark's settings
    in place of its own family, guide, inference (and prior, where the preset has one) (``steps``: every SVI / MAP
    step count); on a UCI or digits reference, the member's config for that data on the reference's data (set,
    split, directory), net width and seed."""
    topic = topic_of(reference, task)
    if topic in REAL_DATA_TOPICS:
        tree = load_spec(CONFIG_DIR / member_configs(topic)[name]).model_dump(mode="json")
        tree["data"], tree["seed"] = reference.data.model_dump(mode="json"), reference.seed
        tree["net"]["hidden"] = list(reference.net.hidden)
    else:
        row = MEMBERS[name]
        tree = reference.model_dump(mode="json")
        own = ("model", "guide", "inference", *(("prior",) if "prior" in PRESETS[row["member"]].sections else ()))
        for section in own:  # the member's: its preset's (zoo.members.with_member), this row's settings on top
            del tree[section]
        tree["member"] = row["member"]
        for key, value in row["overrides"].items():
            value = copy.deepcopy(_by_task(value, task))
            if value is None:
                continue
            if key == "net.hidden":
                tree["net"]["hidden"] = value
            else:
                tree[key] = value
        tree = load_spec(tree).model_dump(mode="json")
    # the spec without the member's name, as this benchmark built it before the presets, so that its runs from then
    # are found, reused and resumed (the resolved sections are the run; _same_spec ignores the name either way)
    tree["member"] = None
    if steps is not None:
        if tree["inference"].get("method") == "svi":
            tree["inference"]["num_steps"] = steps
        if tree["model"].get("family") == "subnetwork":
            tree["model"]["map"]["num_steps"] = steps
    return load_spec(tree)


def _same_spec(run_dir: Path, spec: RunSpec) -> bool:
    """Whether the run in ``run_dir`` is of ``spec``, the member's name aside (a run of a config that says
    ``member: mean_field`` is the run of the same sections without it)."""
    try:
        saved = load_spec(run_dir / SPEC_FILE).model_dump()
    except ZooInputError:  # a spec.yaml this version no longer reads
        return False
    return {**saved, "member": None} == {**spec.model_dump(), "member": None}


def _finished(run_dir: Path) -> bool:
    return (run_dir / METRICS_FILE).exists() and (run_dir / SPEC_FILE).exists()


def obtain_run(spec: RunSpec, name: str, reference_dir: Path, runs_dir: Path, echo) -> tuple[Path, str]:
    """A finished run of ``spec``: a sibling of the reference with this spec, else ``runs_dir/name`` (trained,
    resumed or reused). Returns the directory and how it was obtained."""
    for sibling in sorted(p for p in reference_dir.parent.iterdir() if p.is_dir() and p != reference_dir):
        if _finished(sibling) and _same_spec(sibling, spec):
            return sibling, "reused, next to the reference"
    out = runs_dir / name
    if (out / SPEC_FILE).exists():
        if not _same_spec(out, spec):
            raise ZooInputError("--runs-dir", str(out), f"holds a run of member {name} with a different spec; "
                                "remove it or pick another --runs-dir")
        if _finished(out):
            return out, "reused"
        try:
            train(spec, out, resume=True, progress=False, echo=None)
            echo(f"{name}: resumed {out}")
            return out, "resumed"
        except ZooInputError as exc:  # a run that stopped before its first checkpoint (it diverged): start over
            if exc.field != "--resume":
                raise
    echo(f"{name}: training into {out}")
    train(spec, out, progress=False, echo=None)
    return out, "trained"


def _gap_grid(data) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The notebook's grid (original units), which of its points are in the gap, and the training inputs."""
    raw_x = data.inputs_in_original_units(data.x_train)[:, 0].detach().cpu().float()
    grid = torch.linspace(float(raw_x.min()) - 1.0, float(raw_x.max()) + 1.0, GRID_POINTS)[:, None]
    ordered = raw_x.sort().values
    widest = int((ordered[1:] - ordered[:-1]).argmax())
    left, right = ordered[widest], ordered[widest + 1]
    return grid, (grid[:, 0] > left) & (grid[:, 0] < right), raw_x


def in_between_sd(posterior, data) -> dict[str, float]:
    """Mean sd of f (original units) in the gap, at the training inputs, and their ratio (the notebook's)."""
    grid, in_gap, raw_x = _gap_grid(data)
    inputs = torch.cat([grid, raw_x[:, None]])
    x = ((inputs - data.x_mean.cpu()) / data.x_std.cpu()).to(data.x_train)
    pyro.set_rng_seed(RATIO_SEED)
    pred = posterior.predict(x, draws=posterior.sample(RATIO_DRAWS))
    sd = (pred.loc * data.y_std).std(0).detach().cpu()
    gap, at_data = float(sd[: len(grid)][in_gap].mean()), float(sd[len(grid):].mean())
    return {"sd_ratio": gap / at_data if at_data > 0 else math.nan, "sd_gap": gap, "sd_data": at_data}


def draw_figures(run: RunPredictive) -> dict[str, float]:
    """Test metrics from the draws ``compare`` used (``run.pred``); the sd ratio on one-input regression."""
    data, pred = run.data, run.pred
    if data.task == "classification":
        out = classification_metrics(pred.log_probs, data.y_test)
        return {k: out[k] for k in ("accuracy", "nll", "ece")}
    out = regression_metrics(pred.loc, pred.scale, data.y_test, data.y_mean, data.y_std)
    return {**out, **in_between_sd(run.posterior, data)} if data.in_dim == 1 else out


POSTERIOR_PARTS = ("data", "net", "prior", "likelihood")  # what defines the posterior a member approximates


def posterior_differences(reference: RunSpec, spec: RunSpec) -> list[str]:
    """The parts of the posterior's definition in which a member's spec differs from the reference's."""
    return [part for part in POSTERIOR_PARTS if getattr(spec, part) != getattr(reference, part)]


def _fmt(key: str, value: float | None) -> str:
    if value is None:  # e.g. the sd ratio of a point estimate: 0 / 0
        return "-"
    if key in ("w1", "tv") and value == 0:
        return "0"
    if key in ("agreement",) and value == 1:
        return "1"
    return f"{value:.1f}" if key == "sd_ratio" else f"{value:.3f}"


def fidelity_table(title: str, figures: dict[str, Any], strict_header: str) -> Table:
    """An empty table: member, the figures' columns, whether it is the reference's posterior, ``strict_header``."""
    table = Table(title=title, title_justify="left")
    table.add_column("member")
    for key in figures["columns"]:
        table.add_column(HEADERS[key].format(ref=figures["reference_method"].upper()), justify="right")
    table.add_column("same posterior as the reference")
    table.add_column(strict_header)
    return table


def table_of(figures: dict[str, Any]) -> Table:
    table = fidelity_table(f"posterior fidelity against {figures['reference']} ({figures['data']}, "
                           f"{figures['num_samples']} draws per run)", figures, "reference passes --strict")
    strict = "yes" if figures["reference_check"]["passes_strict"] else "NO"
    for row in figures["rows"]:
        differs = row["differs_from_reference"]
        same = "yes" if not differs else f"no: {', '.join(differs)}"
        cells = ["training failed", *["-"] * (len(figures["columns"]) - 1)] if "failed" in row else [
            _fmt(k, row.get(k)) for k in figures["columns"]]
        table.add_row(row["label"], *cells, same, strict)
    return table


def parse_members(text: str) -> list[str]:
    names = list(MEMBERS) if text == "all" else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in MEMBERS]
    if unknown or not names:
        raise ZooInputError("--members", text, f"use all or a comma-separated list of {', '.join(MEMBERS)}")
    return names


def compare_reference(reference: Path, names: list[str], args: argparse.Namespace, several: bool, echo) -> dict:
    """Train or reuse every member for one reference and compare it with the reference: that reference's figures."""
    start = time.perf_counter()
    if not _finished(reference):
        raise ZooInputError("--reference", str(reference), "not a finished run directory (spec.yaml, metrics.json)")
    standing = trusted_reference(reference, args.allow_unconverged, field="--reference")  # before any training
    ref_spec, ref_data, _ = load_run(reference)
    task = ref_data.task
    topic = topic_of(ref_spec, task)
    runs_dir = Path(args.runs_dir) if args.runs_dir else Path("runs") / "fidelity" / topic
    if topic in REAL_DATA_TOPICS or several:  # one folder of members per data set and split (or seed)
        runs_dir = runs_dir / replicate_of(ref_spec, topic)
    reference_check = {"passes_strict": standing.trusted, "warnings": standing.problems}
    if not standing.trusted:
        echo(f"{reference} {standing.column()} (kept by --allow-unconverged)")
    members: list[tuple[str, Path, str, float]] = []
    failed: list[dict] = []  # members whose training diverged: a row that says so, and the others go on
    specs = [ref_spec]  # a reused run's spec.yaml equals the one built here (obtain_run checks)
    for name in names:
        if topic in REAL_DATA_TOPICS and name not in member_configs(topic):
            echo(f"{name}: no {topic} config (see its configs/ comments), skipped on {reference}")
            continue
        spec = member_spec(ref_spec, name, task, args.steps)
        t0 = time.perf_counter()
        try:
            run_dir, how = obtain_run(spec, name, reference, runs_dir, echo)
        except TrainingDiverged as exc:
            echo(f"{name}: training failed on {reference} ({exc}); its row says so")
            failed.append({"member": name, "label": member_label(name, task, topic), "run": str(runs_dir / name),
                           "how": "failed", "failed": str(exc), "differs_from_reference": posterior_differences(
                               ref_spec, spec), "obtain_seconds": round(time.perf_counter() - t0, 1)})
            continue
        members.append((name, run_dir, how, time.perf_counter() - t0))
        specs.append(spec)

    method = ref_spec.inference.method
    columns = columns_of(topic, task)
    entries = [(method, reference, "reference", 0.0), *members]
    predictives = [run_predictive(run_dir, args.samples) for _, run_dir, _, _ in entries]  # one set of draws each
    rows = []
    for (name, run_dir, how, seconds), row, predictive, spec in zip(entries, compare_predictives(
            predictives[0], predictives[1:], same_net=False)[0], predictives, specs, strict=True):
        label = f"{method.upper()} (reference, {ref_spec.inference.num_chains} chains)" if how == "reference" \
            else member_label(name, task, topic)
        fidelity = {k: row[k] for k in columns[:2]}
        stored = json.loads((run_dir / METRICS_FILE).read_text())
        rows.append({"member": name, "label": label, "run": str(run_dir), "how": how,
                     "differs_from_reference": posterior_differences(ref_spec, spec),
                     "obtain_seconds": round(seconds, 1), **fidelity, **draw_figures(predictive),
                     "train_seconds": stored.get("train_seconds"),
                     "stored_metrics": {k: v for k, v in stored.items() if isinstance(v, int | float)}})
    rows += failed
    return jsonable({"reference": str(reference), "reference_method": method, "reference_check": reference_check,
                     "task": task, "topic": topic, "data": ref_data.name,
                     "split": ref_spec.data.model_dump().get("split"), "seed": ref_spec.seed,
                     "num_samples": args.samples, "steps": args.steps, "columns": columns, "rows": rows,
                     "wall_seconds": round(time.perf_counter() - start, 1)})


def summarise_splits(per_reference: list[dict]) -> list[dict]:
    """Per data set, every member's figures as mean and standard error over the references (splits), by the UCI
    table's convention (:func:`zoo.metrics.mean_and_standard_error`), over the splits where it trained (``failed``
    lists the others as ``failed_on``)."""
    summaries = []
    for data in dict.fromkeys(f["data"] for f in per_reference):
        group = [f for f in per_reference if f["data"] == data]
        columns, rows = group[0]["columns"], []
        by_member = [{r["member"]: r for r in f["rows"]} for f in group]
        for member in dict.fromkeys(r["member"] for f in group for r in f["rows"]):
            first = next(rows_of[member] for rows_of in by_member if member in rows_of)
            row = {"member": member, "label": first["label"], "differs_from_reference": first["differs_from_reference"],
                   "failed_on": [f["split"] if f["split"] is not None else f["seed"] for f, rows_of in
                              zip(group, by_member, strict=True) if "failed" in rows_of.get(member, {})]}
            for key in columns:
                values = [rows_of[member].get(key) for rows_of in by_member if member in rows_of]
                values = [v for v in values if v is not None and math.isfinite(v)]
                mean, spread = mean_and_standard_error(values) if values else (None, None)
                row[key], row[f"{key}_se"] = mean, spread if len(values) > 1 else None  # no s.e. of one split
            rows.append(row)
        summaries.append({"data": data, "splits": [f["split"] for f in group], "seeds": [f["seed"] for f in group],
                          "topic": group[0]["topic"], "columns": columns, "rows": rows,
                          "references_passing_strict": sum(f["reference_check"]["passes_strict"] for f in group),
                          "reference_method": group[0]["reference_method"], "num_samples": group[0]["num_samples"]})
    return summaries


def summary_table(summary: dict) -> Table:
    """One data set's members, mean ± s.e. over its splits."""
    over = f"splits {summary['splits']}" if summary["topic"] == "uci" else f"seeds {summary['seeds']}"
    table = fidelity_table(f"posterior fidelity on {summary['data']}, {over} (mean ± s.e.; "
                           f"{summary['num_samples']} draws per run)", summary, "references passing --strict")
    passing = f"{summary['references_passing_strict']}/{len(summary['splits'])}"
    for row in summary["rows"]:
        cells = [_fmt(k, row[k]) + (f" ± {row[k + '_se']:.3f}" if row[f"{k}_se"] is not None else "")
                 for k in summary["columns"]]
        differs = row["differs_from_reference"]
        failed_on = ", ".join(map(str, row["failed_on"]))
        label = row["label"] + (f" (training failed on {failed_on})" if failed_on else "")
        table.add_row(label, *cells, "yes" if not differs else f"no: {', '.join(differs)}", passing)
    return table


def main(argv: list[str] | None = None) -> dict:
    """Train or reuse every member, compare each with the reference(s), print the tables, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", required=True, nargs="+", metavar="RUN_DIR",
                        help="finished MCMC (NUTS or HMC) run directories; several (e.g. UCI splits) are also "
                        "summarised per data set, mean ± s.e. over splits")
    parser.add_argument("--members", default="all", help=f"all, or some of: {','.join(MEMBERS)}")
    parser.add_argument("--runs-dir", metavar="DIR", help="where new member runs go (default runs/fidelity/<topic>; "
                        "per data set and split for UCI references or several references)")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--samples", type=int, default=COMPARE_DRAWS, help="posterior draws per run")
    parser.add_argument("--steps", type=int, help="every member's SVI / MAP step count (smoke tests)")
    parser.add_argument("--allow-unconverged", action="store_true", help="go on with a reference that fails zoo "
                        "diagnose --strict (its rows then say NO under 'reference passes --strict'); without it such "
                        "a reference is refused before any member trains")
    args = parser.parse_args(argv)
    if args.threads < 1:
        raise ZooInputError("--threads", args.threads, "use 1 or more")
    if args.steps is not None and args.steps < 1:
        raise ZooInputError("--steps", args.steps, "use 1 or more")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    console = Console()
    names = parse_members(args.members)

    def echo(message: str) -> None:
        console.print(message, style="dim", highlight=False)

    several = len(args.reference) > 1
    per_reference = []
    for reference in args.reference:
        figures = compare_reference(Path(reference), names, args, several, echo)
        console.print(table_of(figures))
        for row in figures["rows"]:
            console.print(f"{row['member']}: {row['run']} ({row['how']})", style="dim", highlight=False)
        per_reference.append(figures)
    wall = round(time.perf_counter() - start, 1)
    if several:
        result = {"per_reference": per_reference, "summary": summarise_splits(per_reference), "wall_seconds": wall}
        for summary in result["summary"]:
            console.print(summary_table(summary))
    else:
        result = per_reference[0] | {"wall_seconds": wall}
    console.print(f"wall time {wall:.0f} s", style="dim")
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    sys.exit(exit_code(main))
