"""The run spec: YAML/dict specs, the flat prior form, --set overrides, every bad input, prior assignment."""

from __future__ import annotations

import pytest
import yaml

from zoo.errors import ZooInputError
from zoo.priors import assign_priors
from zoo.spec import (
    CauchyPrior,
    LaplacePrior,
    NormalPrior,
    PriorSpec,
    RunSpec,
    ScaleMixturePrior,
    load_spec,
    parse_overrides,
    spec_to_yaml,
    spec_tree,
)

BASE = {"data": {"name": "toy_gap"}}
SITES = ["hidden0.weight", "hidden0.bias", "out.weight", "out.bias"]


def spec_error(overrides: list[str], base: dict | None = None) -> str:
    with pytest.raises(ZooInputError) as info:
        load_spec(base or BASE, overrides)
    return str(info.value)


# ------------------------------------------------------------------------------------------- good specs
def test_yaml_file_validates_into_runspec(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(
        "data: {name: digits, ood_classes: [8, 9]}\n"
        "net: {hidden: [20, 10], activation: tanh}\n"
        "prior: {name: laplace, scale: 0.5}\n"
        "guide: {name: delta}\n"
        "inference: {num_steps: 7, batch_size: null, lr: 0.05, local_reparam: true}\n"
        "seed: 3\n"
    )
    spec = load_spec(path)
    assert isinstance(spec, RunSpec)
    assert spec.data.name == "digits" and spec.data.ood_classes == [8, 9]
    assert spec.net.hidden == [20, 10] and spec.net.activation == "tanh"
    assert spec.prior.default == LaplacePrior(name="laplace", scale=0.5) and spec.prior.sites == {}
    assert spec.guide.name == "delta"
    assert spec.inference.num_steps == 7 and spec.inference.batch_size is None and spec.inference.lr == 0.05
    assert spec.inference.local_reparam is True
    assert spec.seed == 3
    # untouched sections keep their defaults
    assert spec.model.family == "all_weights" and spec.likelihood.name == "auto" and spec.likelihood.noise == "learned"


def test_dict_spec_defaults():
    spec = load_spec(BASE)
    assert spec.net.hidden == [50] and spec.net.activation == "relu"
    assert spec.prior.default == NormalPrior() and spec.prior.sites == {}
    assert spec.guide.name == "mean_field" and spec.guide.init_rho is None  # chosen on calibration rows, else -5
    assert spec.inference.method == "svi" and spec.inference.elbo == "trace_mean_field"


def test_dict_source_is_not_mutated():
    tree = {"data": {"name": "toy_gap"}, "net": {"hidden": [3]}}
    load_spec(tree, ["net.hidden=[5, 6]", "seed=4"])
    assert tree == {"data": {"name": "toy_gap"}, "net": {"hidden": [3]}}


def test_flat_prior_form_with_site_globs():
    spec = load_spec({**BASE, "prior": {
        "name": "scale_mixture", "pi": 0.25, "sigma1": 2.0, "sigma2": 0.01,
        "sites": {"*.bias": {"name": "normal", "scale": 3.0}, "out.*": {"name": "cauchy", "scale": 0.1}},
    }})
    assert spec.prior.default == ScaleMixturePrior(name="scale_mixture", pi=0.25, sigma1=2.0, sigma2=0.01)
    assert list(spec.prior.sites) == ["*.bias", "out.*"]  # order kept: first match wins
    assert spec.prior.sites["*.bias"] == NormalPrior(scale=3.0)
    assert spec.prior.sites["out.*"] == CauchyPrior(name="cauchy", scale=0.1)


def test_prior_with_only_sites_defaults_to_normal():
    spec = load_spec({**BASE, "prior": {"sites": {"*.bias": {"name": "laplace"}}}})
    assert spec.prior.default == NormalPrior()
    assert spec.prior.sites == {"*.bias": LaplacePrior(name="laplace")}


def test_nested_prior_form_is_accepted_too():
    spec = load_spec({**BASE, "prior": {"default": {"name": "cauchy", "scale": 2.0}, "sites": {}}})
    assert spec.prior.default == CauchyPrior(name="cauchy", scale=2.0)


def test_parse_overrides_reads_yaml_values():
    assert parse_overrides(["data.split=3", "net.hidden=[20,20]", "inference.local_reparam=true",
                            "inference.batch_size=null", "likelihood.noise=learned", "data.dir=", "a.b= 0.5 ",
                            "net:={name: cnn}"]) == [
        ("data.split", 3, False), ("net.hidden", [20, 20], False), ("inference.local_reparam", True, False),
        ("inference.batch_size", None, False), ("likelihood.noise", "learned", False), ("data.dir", None, False),
        ("a.b", 0.5, False), ("net", {"name": "cnn"}, True)]
    # only the first '=' separates key from value
    assert parse_overrides(["data.name=file:/tmp/a=b.csv"]) == [("data.name", "file:/tmp/a=b.csv", False)]


def test_a_mapping_override_merges_and_colon_equals_replaces():
    tree = {**BASE, "net": {"hidden": [50], "activation": "tanh"},
            "prior": {"name": "normal", "sites": {"*.bias": {"scale": 2.0}, "out.*": {"name": "cauchy"}}}}
    merged = spec_tree(tree, ['prior.sites={"out.*": {scale: 0.3}, "hidden0.*": {name: laplace}}', "net={hidden: [8]}"])
    assert merged["prior"]["sites"] == {"*.bias": {"scale": 2.0}, "out.*": {"name": "cauchy", "scale": 0.3},
                                        "hidden0.*": {"name": "laplace"}}  # new keys after the old: first match wins
    assert merged["net"] == {"hidden": [8], "activation": "tanh"}
    replaced = spec_tree(tree, ['prior.sites:={"out.*": {scale: 0.3}}', "net:={hidden: [8]}"])
    assert replaced["prior"]["sites"] == {"out.*": {"scale": 0.3}} and replaced["net"] == {"hidden": [8]}
    assert tree["net"] == {"hidden": [50], "activation": "tanh"}  # the source is not touched
    assert load_spec(tree, "net={hidden: [8]}").net.activation == "tanh"
    assert load_spec(tree, "net:={hidden: [8]}").net.activation == "relu"


def test_overrides_apply_to_a_yaml_file(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("data: {name: uci:housing}\nnet: {hidden: [50]}\nprior: {name: normal}\n")
    spec = load_spec(path, ["data.split=3", "net.hidden=[20,20]", "prior.scale=0.3", "inference.lr=1e-2"])
    assert spec.data.split == 3 and spec.net.hidden == [20, 20]
    assert spec.prior.default == NormalPrior(scale=0.3)
    assert spec.inference.lr == 0.01


def test_override_creates_missing_sections():
    spec = load_spec(BASE, ["guide.init_rho=-3", "likelihood.noise=0.2"])
    assert spec.guide.init_rho == -3.0 and spec.likelihood.noise == 0.2


@pytest.mark.parametrize("bad", ["data.split", "=3", "  =3", ""])
def test_override_without_key_or_equals_is_refused(bad):
    with pytest.raises(ZooInputError) as info:
        parse_overrides([bad])
    assert info.value.field == "--set"
    assert "key.path=value" in str(info.value)
    with pytest.raises(ZooInputError, match="--set"):
        load_spec(BASE, [bad])


def test_override_into_a_scalar_is_refused():
    with pytest.raises(ZooInputError) as info:
        load_spec({**BASE, "seed": 1}, ["seed.value=2"])
    assert info.value.field == "--set" and "'seed' is not a section" in str(info.value)


def test_spec_to_yaml_round_trips(tmp_path):
    spec = load_spec({
        **BASE, "net": {"hidden": [7, 3], "activation": "gelu"},
        "prior": {"name": "scale_mixture", "pi": 0.3, "sites": {"*.bias": {"name": "normal", "scale": 2.0}}},
        "likelihood": {"noise": 0.25}, "inference": {"num_steps": 11, "kl_annealing_steps": 5}, "seed": 9,
    })
    text = spec_to_yaml(spec)
    assert load_spec(yaml.safe_load(text)) == spec
    path = tmp_path / "round.yaml"
    path.write_text(text)
    assert load_spec(path) == spec
    assert spec_to_yaml(load_spec(path)) == text


# -------------------------------------------------------------------------------------------- bad specs
@pytest.mark.parametrize(("overrides", "field", "value"), [
    (["guide.name=lowrank"], "guide.name", "lowrank"),
    (["net.name=resnet50"], "net.name", "resnet50"),
    (["net.activation=swish"], "net.activation", "swish"),
])
def test_unknown_registry_names_are_refused_with_the_choices(overrides, field, value):
    msg = spec_error(overrides)
    assert f"unknown {field} {value!r}" in msg
    assert "use one of:" in msg


def test_unknown_family_is_refused_with_the_choices():
    msg = spec_error(["model.family=bayesian_lstm"])
    assert "model" in msg and "bayesian_lstm" in msg and "all_weights" in msg and "rank1" in msg


def test_unknown_inference_method_is_refused_with_the_choices():
    msg = spec_error(["inference.method=expectation_propagation"])
    assert "inference" in msg and "'expectation_propagation'" in msg
    assert all(f"'{method}'" in msg for method in ("svi", "nuts", "hmc", "laplace"))


def test_an_svi_setting_under_mcmc_is_refused_naming_its_owner():
    msg = spec_error(["inference.method=nuts", "inference.lr=0.1"])
    assert "inference.lr: got 0.1; unknown setting here; it belongs to: sghmc, sgld, svi, swag" in msg


def test_a_setting_of_another_family_is_refused_naming_its_owner():
    msg = spec_error(["model.members=3"])
    assert "model.members: got 3; unknown setting here; it belongs to: deep_ensemble, rank1" in msg


def test_a_run_directory_s_bag_of_fields_loads_where_two_parts_share_a_name_at_other_defaults():
    """Run directories record every field of a section: ``guide.rank: 10`` (the auto guide's default; the laplace
    guide's is unset) under a mean-field guide never did anything and is dropped; another value is refused naming
    both parts that have the setting."""
    assert load_spec({**BASE, "guide": {"name": "mean_field", "rank": 10}}).guide.name == "mean_field"
    msg = spec_error(["guide.rank=7"])
    assert "guide.rank: got 7; unknown setting here; it belongs to: auto, laplace" in msg


def test_a_run_directory_s_bag_of_fields_loads_at_a_default_that_has_since_changed():
    """``guide.dropout_rate: 0.05`` was the dropout guide's default until its default became null (chosen on the
    validation rows): a run directory of another guide that recorded it loads; another value is still refused."""
    assert load_spec({**BASE, "guide": {"name": "mean_field", "dropout_rate": 0.05}}).guide.name == "mean_field"
    msg = spec_error(["guide.dropout_rate=0.2"])
    assert "guide.dropout_rate: got 0.2; unknown setting here; it belongs to: dropout" in msg
    assert load_spec({**BASE, "guide": {"name": "dropout", "dropout_rate": 0.05}}).guide.dropout_rate == 0.05


def test_unknown_activation_lists_the_known_ones():
    msg = spec_error(["net.activation=swish"])
    for name in ("relu", "tanh", "gelu", "elu", "silu", "sigmoid"):
        assert name in msg


@pytest.mark.parametrize(("overrides", "names"), [
    (["prior.name=horseshoe"], ["prior", "horseshoe"]),
    (["prior.sites={'*.bias': {name: spike_slab}}"], ["prior.sites", "spike_slab"]),
])
def test_unknown_prior_name_is_refused(overrides, names):
    msg = spec_error(overrides)
    for name in names:
        assert name in msg
    for known in ("normal", "laplace", "cauchy", "scale_mixture"):
        assert known in msg


@pytest.mark.parametrize(("overrides", "field"), [
    (["prior.name=normal", "prior.scale=0"], "prior.default.scale"),
    (["prior.name=normal", "prior.scale=-1"], "prior.default.scale"),
    (["prior.name=laplace", "prior.scale=0"], "prior.default.scale"),
    (["prior.name=cauchy", "prior.scale=-2"], "prior.default.scale"),
    (["prior.name=scale_mixture", "prior.sigma1=0"], "prior.default.sigma1"),
    (["prior.name=scale_mixture", "prior.sigma2=-0.1"], "prior.default.sigma2"),
    (["prior.sites={'*.bias': {name: normal, scale: 0}}"], "prior.sites.*.bias.scale"),
])
def test_nonpositive_prior_scale_is_refused(overrides, field):
    msg = spec_error(overrides)
    assert field in msg and "greater than 0" in msg


@pytest.mark.parametrize("pi", [0, 1, 1.5, -0.2])
def test_mixture_weight_outside_open_unit_interval_is_refused(pi):
    msg = spec_error(["prior.name=scale_mixture", f"prior.pi={pi}"])
    assert "prior.default.pi" in msg


@pytest.mark.parametrize("pi", [1e-6, 0.5, 0.999])
def test_mixture_weight_inside_unit_interval_is_accepted(pi):
    assert load_spec(BASE, ["prior.name=scale_mixture", f"prior.pi={pi}"]).prior.default.pi == pi


@pytest.mark.parametrize("hidden", ["[4, -1]", "[0]", "[-3]"])
def test_nonpositive_hidden_width_is_refused(hidden):
    msg = spec_error([f"net.hidden={hidden}"])
    assert "net.hidden" in msg and "positive" in msg


def test_empty_hidden_list_is_a_linear_net():
    assert load_spec(BASE, ["net.hidden=[]"]).net.hidden == []


@pytest.mark.parametrize(("overrides", "field"), [
    (["bogus=1"], "bogus"),
    (["net.layers=3"], "net.layers"),
    (["inference.steps=3"], "inference.steps"),
])
def test_unknown_keys_are_refused(overrides, field):
    msg = spec_error(overrides)
    assert f"{field}:" in msg and "unknown setting here" in msg


@pytest.mark.parametrize(("overrides", "field"), [
    (["likelihood.noise=0"], "likelihood.noise"),
    (["likelihood.noise=-0.1"], "likelihood.noise"),
    (["likelihood.noise=guess"], "likelihood.noise"),
    (["likelihood.name=poisson"], "likelihood.name"),
    (["inference.lr=0"], "inference.lr"),
    (["inference.num_steps=-1"], "inference.num_steps"),
    (["inference.lr_decay=1.5"], "inference.lr_decay"),
    (["inference.elbo=renyi"], "inference.elbo"),
    (["data.split=-1"], "data.split"),
    (["data.test_fraction=1"], "data.test_fraction"),
    (["seed=-1"], "seed"),
    (["device=tpu"], "device"),
    (["dtype=float16"], "dtype"),
])
def test_bad_field_values_name_the_field(overrides, field):
    assert field in spec_error(overrides)


def test_every_bad_field_is_reported_at_once():
    msg = spec_error(["prior.name=normal", "prior.scale=0", "bogus=1", "net.hidden=[-1]"])
    assert msg.startswith("invalid spec; fix these fields:")
    for field in ("prior.default.scale", "bogus", "net.hidden"):
        assert field in msg


def test_missing_data_section_is_refused():
    with pytest.raises(ZooInputError, match="data"):
        load_spec({"net": {"hidden": [3]}})


def test_non_mapping_yaml_is_refused(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- data\n- net\n")
    with pytest.raises(ZooInputError) as info:
        load_spec(path)
    assert info.value.field == "spec" and "mapping" in str(info.value) and str(path) in str(info.value)


def test_invalid_yaml_is_refused(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("data: {name: toy_gap\nnet: [")
    with pytest.raises(ZooInputError, match="not valid YAML"):
        load_spec(path)


def test_empty_yaml_is_refused_for_its_missing_data_section(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    with pytest.raises(ZooInputError, match="data"):
        load_spec(path)


def test_missing_spec_file_is_refused(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ZooInputError) as info:
        load_spec(path)
    assert info.value.field == "spec" and str(path) in str(info.value) and "no such file" in str(info.value)


def test_a_directory_is_not_a_spec_file(tmp_path):
    with pytest.raises(ZooInputError, match="no such file"):
        load_spec(tmp_path)


def test_shipped_configs_validate():
    from pathlib import Path

    configs = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
    assert configs
    for path in configs:
        assert isinstance(load_spec(path), RunSpec), path


def test_shipped_search_spaces_fit_their_configs():
    """Each ``configs/spaces/X.yaml`` is swept over ``configs/X.yaml``: every key is a spec field and every range
    end and choice is a value that config accepts (what ``zoo sweep`` checks before its first trial)."""
    from pathlib import Path

    import yaml

    from zoo.sweep import check_space, load_space

    configs = Path(__file__).resolve().parents[1] / "configs"
    spaces = sorted((configs / "spaces").glob("*.yaml"))
    assert spaces
    for path in spaces:
        check_space(load_space(path), yaml.safe_load((configs / path.name).read_text()))


# --------------------------------------------------------------------------------------- assign_priors
def test_assign_priors_default_everywhere():
    spec = PriorSpec.model_validate({"name": "laplace", "scale": 0.2})
    assert assign_priors(spec, SITES) == {s: LaplacePrior(name="laplace", scale=0.2) for s in SITES}


def test_assign_priors_first_matching_glob_wins():
    spec = PriorSpec.model_validate({
        "name": "normal", "scale": 1.0,
        "sites": {
            "out.bias": {"name": "cauchy", "scale": 5.0},
            "*.bias": {"name": "normal", "scale": 2.0},
            "out.*": {"name": "laplace", "scale": 0.1},
        },
    })
    assigned = assign_priors(spec, SITES)
    assert assigned == {
        "hidden0.weight": NormalPrior(scale=1.0),
        "hidden0.bias": NormalPrior(scale=2.0),
        "out.weight": LaplacePrior(name="laplace", scale=0.1),
        "out.bias": CauchyPrior(name="cauchy", scale=5.0),  # listed first, so it beats *.bias and out.*
    }
    # reversing the order of the globs changes the winner for out.bias
    reordered = PriorSpec.model_validate({
        "name": "normal", "sites": {"out.*": {"name": "laplace", "scale": 0.1}, "out.bias": {"name": "cauchy"}},
    })
    assert assign_priors(reordered, SITES)["out.bias"] == LaplacePrior(name="laplace", scale=0.1)


def test_assign_priors_globs_are_case_sensitive_and_whole_name():
    spec = PriorSpec.model_validate({"sites": {"hidden0.*": {"name": "cauchy"}}})
    assigned = assign_priors(spec, SITES)
    assert assigned["hidden0.weight"] == assigned["hidden0.bias"] == CauchyPrior(name="cauchy")
    assert assigned["out.weight"] == NormalPrior()
    with pytest.raises(ZooInputError):
        assign_priors(PriorSpec.model_validate({"sites": {"HIDDEN0.*": {"name": "cauchy"}}}), SITES)
    with pytest.raises(ZooInputError):
        assign_priors(PriorSpec.model_validate({"sites": {"bias": {"name": "cauchy"}}}), SITES)


def test_assign_priors_refuses_a_glob_that_matches_nothing():
    spec = PriorSpec.model_validate({"sites": {"*.bias": {"name": "normal"}, "hiden*": {"name": "cauchy"}}})
    with pytest.raises(ZooInputError) as info:
        assign_priors(spec, SITES)
    assert info.value.field == "prior.sites.hiden*"
    msg = str(info.value)
    assert "matches no weight site" in msg
    for site in SITES:
        assert site in msg
