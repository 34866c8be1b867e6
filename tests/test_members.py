"""The member presets (zoo.members) are the zoo's one table of members: each preset's about line says what its
sections hold, each loads as a spec on its own, every shipped config names its member and resolves to its own
values over the preset's, and benchmarks/fidelity.py builds its rows from the presets."""

import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from zoo.members import MEMBERS, Member, with_member
from zoo.priors import nested_prior
from zoo.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
TOY = {"data": {"name": "toy_gap"}, "net": {"hidden": [8]}, "device": "cpu"}
NORMAL_FORMS = {"prior": lambda prior: nested_prior(prior, name=None)}  # as zoo.spec puts a preset underneath

# What each preset's about line claims, phrase -> the resolved spec's values (dotted paths). Every number the line
# states must sit in one of its phrases (a year in a citation aside), so a number changed on either side fails.
CLAIMS: dict[str, dict[str, dict[str, Any]]] = {
    "map": {"point estimate": {"guide.name": "delta", "model.family": "all_weights"}},
    "mean_field": {"factorised Gaussian per weight": {"guide.name": "mean_field", "model.family": "all_weights"}},
    "bayes_by_backprop": {
        "scale-mixture prior": {"prior.default.name": "scale_mixture", "guide.name": "mean_field"},
        "pi 0.5": {"prior.default.pi": 0.5},
        "sigma1 1": {"prior.default.sigma1": 1.0},
        "sigma2 0.0025": {"prior.default.sigma2": 0.0025},
        "local reparameterisation": {"inference.local_reparam": True}},
    "mc_dropout": {
        "Bernoulli masks": {"guide.name": "dropout", "guide.dropout": "bernoulli"},
        "the rate p chosen on the validation rows": {"guide.dropout_rate": None},
        "inputs but the first": {"guide.drop_inputs": False}},
    "concrete_dropout": {
        "learned per layer": {"guide.name": "dropout", "guide.dropout": "concrete"},
        "from the p chosen on the validation rows": {"guide.dropout_rate": None}},
    "deep_ensemble": {
        "K = 5": {"model.family": "deep_ensemble", "model.members": 5},
        "MAP nets": {"guide.name": "delta"}},
    "rank1_normal": {
        "K = 4": {"model.family": "rank1", "model.members": 4},
        "Normal(1, 1)": {"prior.default.name": "normal", "prior.default.loc": 1.0, "prior.default.scale": 1.0},
        "mixture guide": {"guide.name": "mixture", "guide.component": "normal"}},
    "rank1_cauchy": {
        "K = 4": {"model.family": "rank1", "model.members": 4},
        "Cauchy(1, 0.1)": {"prior.default.name": "cauchy", "prior.default.loc": 1.0, "prior.default.scale": 0.1}},
    "rank1_gsm": {
        "K = 4": {"model.family": "rank1", "model.members": 4},
        "hierarchical Gaussian scale mixture": {"prior.default.name": "gsm"},
        "1 + tau z": {"prior.default.loc": 1.0},
        "half-Cauchy tau of scale 0.3": {"prior.default.scale_prior": "half_cauchy", "prior.default.scale": 0.3},
        "mixture of Normal components": {"guide.name": "mixture", "guide.component": "normal"}},
    "batch_ensemble": {
        "Dirac special case": {"model.family": "rank1", "guide.name": "batch_ensemble"},
        "K = 4": {"model.members": 4}},
    "subnetwork_laplace": {
        "full-covariance Gaussian": {"model.family": "subnetwork", "inference.method": "laplace",
                                     "guide.name": "laplace"},
        "10% of a MAP net's weights with the largest variance": {"model.selection.strategy": "largest_variance",
                                                                 "model.selection.size": 0.1},
        "one prior precision per layer tuned by the evidence": {"inference.prior_structure": "layer",
                                                                "inference.tune": True}},
    "last_layer_laplace": {
        "a Gaussian over the output layer": {"model.family": "subnetwork", "model.selection.strategy": "last_layer",
                                             "inference.method": "laplace"},
        "(guide.covariance auto)": {"guide.covariance": "auto"},
        "one prior precision per layer tuned by the evidence": {"inference.prior_structure": "layer",
                                                                "inference.tune": True},
        "predictions by the Laplace bridge or the link likeliest on validation rows": {
            "inference.predictive": "glm", "inference.link": "bridge", "inference.link_by": None}},
    "diagonal_laplace": {
        "diagonal linearised Laplace over every weight": {"model.family": "subnetwork", "guide.covariance": "diag",
                                                          "model.selection.strategy": "all",
                                                          "inference.method": "laplace"},
        "one prior precision per layer tuned by the evidence at the MAP": {"inference.prior_structure": "layer",
                                                                           "inference.tune": True},
        "predictions by the Laplace bridge or the link likeliest on validation rows": {
            "inference.predictive": "glm", "inference.link": "bridge", "inference.link_by": None}},
    "kfac_laplace": {
        "Kronecker-factored (KFAC) linearised Laplace over every weight": {
            "model.family": "subnetwork", "guide.covariance": "kron", "model.selection.strategy": "all",
            "inference.method": "laplace"},
        "one prior precision per layer tuned by the evidence at the MAP": {"inference.prior_structure": "layer",
                                                                           "inference.tune": True},
        "predictions by the Laplace bridge or the link likeliest on validation rows": {
            "inference.predictive": "glm", "inference.link": "bridge", "inference.link_by": None}},
    "swag": {
        "rank-20 Gaussian": {"inference.method": "swag", "inference.rank": 20, "inference.num_models": 1},
        "momentum 0.9": {"inference.momentum": 0.9}},
    "multiswag": {"5 SWAG Gaussians": {"inference.method": "swag", "inference.num_models": 5}},
    "sgld": {
        "Langevin": {"inference.method": "sgld"},
        "4 chains": {"inference.num_chains": 4},
        "polynomial step decay": {"inference.schedule": "polynomial"}},
    "cyclical_sghmc": {
        "4 chains": {"inference.method": "sghmc", "inference.num_chains": 4},
        "4 restarts of a cosine step size": {"inference.schedule": "cyclical", "inference.cycles": 4}},
    "hmc": {
        "16 chains": {"inference.method": "hmc", "inference.num_chains": 16},
        "ChEES-tuned trajectories": {"inference.kernel": "chees", "inference.adapt_trajectory_length": True}},
    "nuts": {"NUTS, 4 chains": {"inference.method": "nuts", "inference.num_chains": 4}},
    "auto_normal": {"AutoNormal": {"guide.name": "auto", "guide.auto": "normal"}},
    "auto_low_rank_mvn": {
        "AutoLowRankMultivariateNormal": {"guide.name": "auto", "guide.auto": "low_rank_mvn"},
        "rank 10": {"guide.rank": 10}},
    "auto_mvn": {"AutoMultivariateNormal": {"guide.name": "auto", "guide.auto": "mvn"}},
    "auto_laplace_approximation": {"AutoLaplaceApproximation": {"guide.name": "auto",
                                                                "guide.auto": "laplace_approximation"}},
}

NUMBER = re.compile(r"(?<![\w.-])\d+(?:\.\d+)?")  # not inside a word (sigma1) or a compound (rank-1, rank-20)


def _get(tree: Any, path: str | tuple[str, ...]) -> Any:
    """The value at a dotted path, or at a tuple of keys (a site glob such as ``*.bias`` holds a dot); ``"missing"``
    where the spec has no such field."""
    for key in path.split(".") if isinstance(path, str) else path:
        if not isinstance(tree, dict) or key not in tree:
            return "missing"
        tree = tree[key]
    return tree


def _leaves(tree: dict, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Every leaf of a nested mapping by its keys (a list is a leaf; an empty mapping sets nothing)."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_leaves(value, (*prefix, key)))
        else:
            out[(*prefix, key)] = value
    return out


def _normal(tree: dict) -> dict:
    return {k: NORMAL_FORMS[k](v) if k in NORMAL_FORMS else v for k, v in tree.items()}


def claim_problems(name: str, member: Member, claims: dict[str, dict[str, Any]]) -> list[str]:
    """Where a preset's about line and its values disagree: a claimed phrase the line lacks, a value the resolved
    spec does not hold, a number the line states that no claim covers."""
    problems = [f"{name}: the about line does not say {phrase!r}" for phrase in claims if phrase not in member.about]
    spec = load_spec({**TOY, "member": name}).model_dump(mode="json")
    for phrase, values in claims.items():
        problems += [f"{name}: {phrase!r} says {path} = {value!r}, the preset gives {_get(spec, path)!r}"
                     for path, value in values.items() if _get(spec, path) != value]
    covered = {n for phrase in claims for n in NUMBER.findall(phrase)}
    problems += [f"{name}: the about line states {n}, which no claim checks" for n in NUMBER.findall(member.about)
                 if n not in covered and not (len(n) == 4 and n.startswith(("19", "20")))]  # a citation's year
    return problems


def test_the_claims_table_covers_every_preset():
    assert set(CLAIMS) == set(MEMBERS)


@pytest.mark.parametrize("name", list(MEMBERS))
def test_a_presets_about_line_says_what_its_sections_hold(name):
    assert claim_problems(name, MEMBERS[name], CLAIMS[name]) == []


def test_the_about_check_fails_on_a_wrong_or_unchecked_value():
    ensemble = MEMBERS["deep_ensemble"]
    wrong = Member(ensemble.about.replace("K = 5", "K = 3"), ensemble.sections)
    assert any("about line does not say 'K = 5'" in p for p in claim_problems("deep_ensemble", wrong,
                                                                               CLAIMS["deep_ensemble"]))
    drifted = Member(ensemble.about, {**ensemble.sections, "model": {"family": "deep_ensemble", "members": 3}})
    MEMBERS["deep_ensemble"] = drifted  # the resolved spec reads the table
    try:
        problems = claim_problems("deep_ensemble", drifted, CLAIMS["deep_ensemble"])
    finally:
        MEMBERS["deep_ensemble"] = ensemble
    assert problems == ["deep_ensemble: 'K = 5' says model.members = 5, the preset gives 3"]
    unchecked = Member(ensemble.about + ", 7 epochs", ensemble.sections)
    assert claim_problems("deep_ensemble", unchecked, CLAIMS["deep_ensemble"]) == [
        "deep_ensemble: the about line states 7, which no claim checks"]


@pytest.mark.parametrize("name", list(MEMBERS))
def test_every_preset_loads_as_a_spec_on_its_own(name):
    for data in ({"name": "toy_gap"}, {"name": "two_moons"}):
        spec = load_spec({**TOY, "data": data, "member": name})
        resolved = spec.model_dump(mode="json")
        assert spec.member == name
        preset = with_member({"member": name}, NORMAL_FORMS)
        for path, value in _leaves({k: v for k, v in preset.items() if k != "member"}).items():
            assert _get(resolved, path) == value, (name, path)


def _config(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _own_leaves(tree: dict) -> dict[tuple[str, ...], Any]:
    """A config's settings by dotted path, its prior in the nested form the spec resolves it to."""
    return _leaves(_normal(tree))


def test_every_shipped_config_names_a_member():
    assert CONFIGS
    assert [p.name for p in CONFIGS if _config(p).get("member") not in MEMBERS] == []


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_a_config_resolves_to_its_own_values_over_its_preset(path):
    """The preset goes underneath: every key the config sets keeps the config's value in the resolved spec, and
    every key of the preset the config leaves alone has the preset's (unless the config's section names another
    part, which replaces the preset's)."""
    tree = _config(path)
    resolved = load_spec(path).model_dump(mode="json")
    own = _own_leaves(tree)
    assert {p: v for p, v in own.items() if _get(resolved, p) != v} == {}, "a setting the spec does not keep"
    preset, mine = _normal(MEMBERS[tree["member"]].sections), _normal(tree)
    replaced = {section for section, own_section in mine.items() if isinstance(own_section, dict) and section in preset
                and any(k in own_section and k in preset[section] and own_section[k] != preset[section][k]
                        for k in ("name", "family", "method"))}  # as zoo.members.with_member decides
    for leaf, value in _own_leaves({k: v for k, v in preset.items() if k not in replaced}).items():
        if leaf not in own:
            assert _get(resolved, leaf) == value, (leaf, "the preset's value is lost")


def test_a_run_is_the_same_whether_its_spec_names_its_member_or_spells_it_out():
    """run_identity leaves the member's name out: a run directory started from a spec that spelled the sections out
    (every config before they named their member) resumes from the config that names them."""
    from zoo.spec import run_identity, spec_differences

    path = ROOT / "configs" / "rank1_cauchy_digits.yaml"
    named = load_spec(path)
    spelled = load_spec({k: v for k, v in named.model_dump(mode="json").items() if k != "member"})
    assert named.member == "rank1_cauchy" and spelled.member is None
    assert spec_differences(run_identity(spelled), run_identity(named)) == []


VARIANTS = {"subnet_laplace_resnet_digits.yaml": "a ResNet-8's subnetwork: 500 weights, not 10% of them",
            "rank1_normal_digits.yaml": "the factors' Normal(1, 0.1) its results were measured at; the preset's "
                                        "Normal(1, 1) was chosen by benchmarks/defaults.py"}


def test_a_members_digits_config_overrides_none_of_its_presets_values():
    """The presets hold the digits configs' values (zoo.members); a variant on digits says why it differs."""
    differing = {}
    for path in CONFIGS:
        tree = _config(path)
        if tree["data"]["name"] != "digits" or path.name in VARIANTS:
            continue
        preset = _own_leaves(MEMBERS[tree["member"]].sections)
        differing.update({f"{path.name}: {'.'.join(leaf)}": value for leaf, value in _own_leaves(tree).items()
                          if leaf in preset and preset[leaf] != value})
    assert differing == {}
    assert all(_config(ROOT / "configs" / name)["data"]["name"] == "digits" for name in VARIANTS)


def test_the_fidelity_benchmark_builds_its_rows_from_the_presets():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fidelity

    reference = load_spec(ROOT / "configs" / "nuts_toy.yaml", ["net.hidden=[3]", "device=cpu"])
    for name, row in fidelity.MEMBERS.items():
        preset = MEMBERS[row["member"]].sections
        for task in ("regression", "classification"):
            spec = fidelity.member_spec(reference, name, task).model_dump(mode="json")
            mine = {k: fidelity._by_task(v, task) for k, v in row["overrides"].items()}
            overridden = _own_leaves({k: v for k, v in mine.items() if isinstance(v, dict)})
            for leaf, value in _own_leaves(preset).items():
                if leaf not in overridden:
                    assert _get(spec, leaf) == value, (name, task, leaf)
            assert spec["member"] is None  # the run's identity as before the presets (fidelity.member_spec)


def test_a_section_that_names_another_part_replaces_the_presets_at_any_depth():
    """A prior override on a config whose member brings a scale-mixture prior: the new default prior replaces the
    preset's whole (its pi, sigma1, sigma2 are not carried onto a normal prior), as a top-level section would."""
    gaussian = 'prior:={name: normal, scale: 1.0, sites: {"*.bias": {name: normal, scale: 1.0}}}'
    spec = load_spec(ROOT / "configs" / "mean_field_digits.yaml", [gaussian])
    assert spec.member == "bayes_by_backprop" and spec.prior.default.name == "normal"
    assert load_spec(ROOT / "configs" / "mean_field_digits.yaml").prior.default.name == "scale_mixture"
    merged = with_member({"member": "bayes_by_backprop", "prior": {"default": {"name": "laplace", "scale": 0.5}}},
                         {"prior": nested_prior})
    assert merged["prior"]["default"] == {"name": "laplace", "scale": 0.5}
