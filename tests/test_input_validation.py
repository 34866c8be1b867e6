"""Issue 15, items 7 and 8: values the spec accepts but the maths cannot use, and the Python API's load_spec."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
import yaml
from torch.distributions import kl_divergence

from guides.mean_field import MeanFieldNormalGuide
from zoo.data import DATA_SETS, load_dataset, make_dataset
from zoo.data.base import STAT_LIMIT
from zoo.data.table import load_table
from zoo.errors import ZooInputError, ZooWarning
from zoo.spec import INIT_RHO_MAX, INIT_RHO_MIN, RunSpec, data_section, load_spec, softplus

BASE = {"data": {"name": "toy_gap"}, "device": "cpu"}


def spec_error(overrides: list[str] | str, base: dict | None = None) -> ZooInputError:
    with pytest.raises(ZooInputError) as info:
        load_spec(base or BASE, overrides)
    return info.value


def write_csv(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    path.write_text("\n".join(",".join(map(str, r)) for r in [header, *rows]) + "\n")
    return path


# ------------------------------------------------------------------------------------------ guide.init_rho
@pytest.mark.parametrize(("rho", "sigma", "why"), [
    (-200, "1.38e-87", "sigma itself rounds to 0, a scale Pyro refuses"),
    (-45, "2.86e-20", "below float32's smallest normal number (1.2e-38), where the KL's gradient is already infinite"),
    (-31, "3.44e-14", "it is a point mass already (guide.name: delta is one)"),
    (1e6, "1e+06", "far wider than a prior of scale ~1 on standardised weights"),
    (5.5, "5.5", "far wider than a prior of scale ~1"),
])
def test_init_rho_outside_the_sane_range_is_refused_with_its_sigma(rho, sigma, why):
    err = spec_error([f"guide.init_rho={rho}"])
    assert err.field == "guide.init_rho" and err.value == rho
    msg = str(err)
    assert f"guide.init_rho: got {rho!r}; sigma = softplus(rho) = {sigma}: " in msg
    assert why in msg
    assert "use a rho in [-30, 5] (sigma 9.4e-14 .. 5.01), typically -5 (the default, sigma 0.0067)" in msg
    if rho > -104:
        assert "rounds to 0" not in msg


def test_init_rho_nan_is_refused():
    err = spec_error(["guide.init_rho=.nan"])
    assert err.field == "guide.init_rho" and "rho must be a number; use a rho in [-30, 5]" in str(err)


@pytest.mark.parametrize("rho", [INIT_RHO_MIN, -5.0, 0.0, INIT_RHO_MAX])
def test_init_rho_inside_the_range_is_accepted(rho):
    assert load_spec(BASE, [f"guide.init_rho={rho}"]).guide.init_rho == rho


def test_softplus_matches_torch_and_does_not_overflow():
    for rho in (-200.0, -30.0, -5.0, 0.0, 5.0, 30.0):
        assert softplus(rho) == pytest.approx(float(F.softplus(torch.tensor(rho, dtype=torch.float64))), rel=1e-12)
    assert softplus(1e6) == 1e6 and softplus(-1e6) == 0.0


def _kl_gradients(guide: MeanFieldNormalGuide) -> list[torch.Tensor]:
    """Gradients of the KL of every real site against N(0, 1) with respect to rho, in float32."""
    total = 0.0
    for name, site in guide.sites.items():
        q = guide.distribution(name)
        if site.support is dist.constraints.real:
            prior = dist.Normal(torch.zeros(site.shape), torch.ones(site.shape)).to_event(site.event_dim)
            total = total + kl_divergence(q, prior).sum()
    total.backward()
    return [p.grad for p in guide.rho.values() if p.grad is not None]


def test_the_lower_bound_keeps_the_float32_kl_gradient_finite():
    from zoo.pipeline import prepare

    _, family, guide, _ = prepare(load_spec(BASE, [f"guide.init_rho={INIT_RHO_MIN}", "net.hidden=[4]"]))
    assert isinstance(guide, MeanFieldNormalGuide) and guide.rho["out/weight"].dtype == torch.float32
    grads = _kl_gradients(guide)
    assert grads and all(torch.isfinite(g).all() for g in grads)
    # past the bound's reason (sigma^2 below float32's smallest normal number) the same gradient is infinite
    too_small = MeanFieldNormalGuide(family.latent_sites(), init_rho=-45.0)
    assert not all(torch.isfinite(g).all() for g in _kl_gradients(too_small))


# ------------------------------------------------------------------------------------- data magnitudes
def big_feature_csv(tmp_path: Path, magnitude: float) -> Path:
    rows = [[i, magnitude * (1 + i % 3), 2 * i + 1, "test" if i % 5 == 0 else "train"] for i in range(20)]
    return write_csv(tmp_path / "big.csv", ["a", "big", "y", "fold"], rows)


def test_feature_near_1e300_is_refused_naming_the_column(tmp_path):
    path = big_feature_csv(tmp_path, 1e300)
    with pytest.raises(ZooInputError) as info:
        load_table(str(path), "y", "regression", seed=0, split_column="fold")
    assert info.value.field == "column 'big'"
    msg = str(info.value)
    assert "column 'big': got 'values up to 3e+300 in magnitude'" in msg
    assert "overflow float64" in msg and "float32 (largest 3.4e+38" in msg
    assert "divide it by 1e300" in msg
    # the same through the spec's data section
    with pytest.raises(ZooInputError) as info:
        load_dataset(data_section(name=f"file:{path}", target="y", task="regression", split_column="fold"), seed=0)
    assert info.value.field == "column 'big'"


def test_target_near_1e300_is_refused_naming_the_column(tmp_path):
    rows = [[i, 1e300 * (i % 4 + 1)] for i in range(20)]
    path = write_csv(tmp_path / "t.csv", ["x", "y"], rows)
    with pytest.raises(ZooInputError) as info:
        load_table(str(path), "y", "regression", seed=0)
    assert info.value.field == "column 'y'"
    assert "values up to 4e+300 in magnitude" in str(info.value) and "divide it by 1e300" in str(info.value)


def test_npz_column_beyond_float32_headroom_is_refused(tmp_path):
    # finite in float64 and even in float32, but its mean leaves no headroom for predictions in float32
    a = np.linspace(1e35, 2e35, 30)
    np.savez(tmp_path / "n.npz", a=a, b=np.arange(30.0), y=np.arange(30.0) % 7)
    with pytest.raises(ZooInputError) as info:
        load_table(str(tmp_path / "n.npz"), "y", "regression", seed=0)
    assert info.value.field == "column 'a'"
    assert f"exceed {STAT_LIMIT:.2g}" in str(info.value) and "2e+35" in str(info.value)


def test_test_row_whose_standardised_value_overflows_float32_is_refused(tmp_path):
    # training values of spread 1e-6: a test value of 1e33 standardises to ~1e39, past float32's 3.4e38
    rows = [[(-1) ** i * 1e-6, i, i % 3, "train"] for i in range(10)] + [[1e33, 3, 1, "test"]]
    path = write_csv(tmp_path / "s.csv", ["a", "b", "y", "fold"], rows)
    with pytest.raises(ZooInputError) as info:
        load_table(str(path), "y", "regression", seed=0, split_column="fold")
    assert info.value.field == "column 'a'" and info.value.value == "1e+33 in test row 1"
    assert "standardised with the training mean 0 and standard deviation 1e-06 it is 1e+39" in str(info.value)


def test_large_but_representable_columns_standardise_to_finite_values(tmp_path):
    rows = [[1e20 * (i + 1), -3e25 + 1e24 * i, 1e30 * (i % 5) + 1e29, "test" if i % 4 == 0 else "train"]
            for i in range(24)]
    path = write_csv(tmp_path / "ok.csv", ["a", "b", "y", "fold"], rows)
    d = load_table(str(path), "y", "regression", seed=0, split_column="fold")
    for t in (d.x_train, d.x_test, d.y_train, d.y_test):
        assert t.dtype == torch.float32 and torch.isfinite(t).all()
    assert d.x_train.abs().max() < 10 and d.y_train.abs().max() < 10
    assert math.isfinite(d.y_std) and d.y_std < STAT_LIMIT
    back = d.inputs_in_original_units(d.x_test.double())[:, 0].numpy()
    assert np.allclose(back, [1e20 * (i + 1) for i in range(0, 24, 4)], rtol=1e-5)


def test_make_dataset_names_an_unnamed_feature_and_its_split():
    x = np.ones((4, 2))
    x[:, 1] = [1e-7, -1e-7, 1e-7, -1e-7]
    with pytest.raises(ZooInputError) as info:
        make_dataset("mine", "regression", x, np.arange(4.0), np.array([[1.0, 1e35]]), np.zeros(1),
                     x_ood={"far": np.zeros((2, 2))})
    assert info.value.field == "mine input feature 1" and info.value.value == "1e+35 in test row 1"
    with pytest.raises(ZooInputError) as info:
        make_dataset("mine", "regression", np.eye(3), np.arange(3.0), np.eye(3)[:1], np.zeros(1),
                     x_ood={"far": np.array([[np.inf, 0.0, 0.0]])})
    assert info.value.field == "mine OOD inputs 'far'" and "1 NaN/inf values" in str(info.value)


# ----------------------------------------------------------------------------------- classification labels
def test_continuous_target_under_classification_is_refused(tmp_path):
    rng = np.random.default_rng(0)
    rows = [[f"{a:.3f}", f"{b:.3f}", f"{2 * a - b:.4f}"] for a, b in rng.normal(size=(40, 2))]
    path = write_csv(tmp_path / "c.csv", ["a", "b", "y"], rows)
    with pytest.raises(ZooInputError) as info:
        load_table(str(path), "y", "classification", seed=0)
    assert info.value.field == "column 'y'"
    assert info.value.value == f"{rows[0][2]!r} in data row 1"
    assert "data.task is classification, but 40 of 40 labels are not whole numbers" in str(info.value)
    assert "use data.task: regression" in str(info.value)


def test_continuous_npz_target_under_classification_is_refused(tmp_path):
    np.savez(tmp_path / "c.npz", x=np.arange(12.0), y=np.array([0, 1, 2.5] * 4))
    with pytest.raises(ZooInputError) as info:
        load_table(str(tmp_path / "c.npz"), "y", "classification", seed=0)
    assert info.value.field == "column 'y'" and info.value.value == "'2.5' in data row 3"
    assert "4 of 12 labels are not whole numbers" in str(info.value)


def test_whole_float_labels_are_classes(tmp_path):
    np.savez(tmp_path / "w.npz", x=np.arange(12.0), y=np.array([0.0, 1.0, 2.0] * 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = load_table(str(tmp_path / "w.npz"), "y", "classification", seed=0)
    assert d.n_classes == 3 and d.class_names == ["0", "1", "2"] and d.y_train.dtype == torch.int64


def test_implausibly_many_classes_warn(tmp_path):
    rows = [[i, i % 30] for i in range(40)]
    path = write_csv(tmp_path / "ids.csv", ["x", "label"], rows)
    with pytest.warns(ZooWarning, match=r"column 'label': 30 classes from 40 rows; .*\(use data\.task: regression\)"):
        d = load_table(str(path), "label", "classification", seed=0)
    assert d.n_classes == 30


def test_make_dataset_refuses_fractional_labels_instead_of_truncating():
    x = np.arange(8.0).reshape(4, 2)
    with pytest.raises(ZooInputError) as info:
        make_dataset("mine", "classification", x, np.array([0.0, 1.0, 1.5, 0.0]), x[:1], np.array([1.0]))
    assert info.value.field == "mine training labels" and info.value.value == "np.float64(1.5) in row 3"
    assert "whole numbers" in str(info.value)


# --------------------------------------------------------------------------------- load_spec up front
@pytest.mark.parametrize(("data", "value", "line"), [
    ({"name": "imagenet"}, "imagenet", "unknown data.name 'imagenet'; use one of: toy_gap, two_moons, digits, "
                                       "mnist1d, mnist5k, mnist, fashion_mnist, cifar10, cifar100, svhn, uci:<folder>, "
                                       "file:<path>, python"),
    ({"name": "uci:"}, "uci:", "data.name: got 'uci:'; name the UCI folder after the prefix, e.g. uci:housing"),
    ({"name": "file:table.txt", "target": "y", "task": "regression"}, "file:table.txt",
     "data.name: got 'file:table.txt'; give the path of a .csv or .npz file after the prefix, e.g. "
     "file:data/table.csv"),
])
def test_unknown_data_name_is_refused_by_load_spec(data, value, line):
    err = spec_error([], {"data": data})
    assert err.field == "data.name" and err.value == value
    assert str(err) == f"invalid spec; fix these fields:\n  {line}"


@pytest.mark.parametrize(("data", "field", "text"), [
    ({"name": "toy_gap", "ood_classes": [1]}, "data.ood_classes", "unknown setting here; it belongs to: cifar10"),
    ({"name": "digits", "split": 2}, "data.split", "unknown setting here; it belongs to: uci:<folder>"),
    ({"name": "file:t.csv", "task": "regression"}, "data.target", "a file: data set needs data.target"),
    ({"name": "file:t.csv", "target": "y"}, "data.task", "a file: data set needs data.task"),
])
def test_data_fields_no_loader_uses_are_refused_by_load_spec(data, field, text):
    err = spec_error([], {"data": data})
    assert err.field == field and text in str(err)


def test_file_data_is_checked_without_reading_the_file(tmp_path):
    spec = load_spec({"data": {"name": f"file:{tmp_path / 'later.csv'}", "target": "y", "task": "regression"}})
    assert spec.data.name.endswith("later.csv")
    assert DATA_SETS.tag(spec.data.name) == "file:"


@pytest.mark.parametrize(("overrides", "family", "allowed"), [
    (["guide.name=mixture"], "all_weights", "mean_field, delta, dropout, auto"),
    (["model.family=deep_ensemble"], "deep_ensemble", "delta"),
    (["model.family=rank1", "prior.loc=1.0", "guide.name=dropout"], "rank1", "mean_field, delta, mixture, "
                                                                              "batch_ensemble, auto"),
])
def test_guide_that_does_not_fit_the_family_is_refused_by_load_spec(overrides, family, allowed):
    err = spec_error(overrides)
    assert err.field == "guide.name"
    assert f"  guide.name: got {err.value!r}; does not fit family '{family}': " in str(err)
    assert f"; family '{family}' takes the guides: {allowed}" in str(err)


def test_every_cross_field_problem_is_listed_and_the_first_is_the_field():
    err = spec_error(["data.name=imagenet", "net.activation=swish", "guide.name=mixture"])
    assert err.field == "data.name" and err.value == "imagenet"
    lines = str(err).splitlines()
    assert lines[0] == "invalid spec; fix these fields:"
    assert lines[1].startswith("  unknown data.name 'imagenet'; use one of: toy_gap")
    assert lines[2].startswith("  unknown net.activation 'swish'; use one of: elu, gelu")
    assert lines[3] == ("  guide.name: got 'mixture'; does not fit family 'all_weights': it needs rank-1 factors of "
                        "ensemble members, and the family has weight matrices; family 'all_weights' takes the guides: "
                        "mean_field, delta, dropout, auto")


def test_laplace_problems_name_their_fields():
    err = spec_error(["inference.method=laplace"])  # the guide follows the method: only the family is wrong
    assert err.field == "model.family" and len(str(err).splitlines()) == 2
    assert "  model.family: inference.method: laplace linearises a MAP net" in str(err)
    err = spec_error(["model.family=subnetwork", "inference.method=laplace", "guide.name=mean_field"])
    assert err.field == "guide.name" and err.value == "mean_field"
    assert "guide.name: the laplace guide is what inference.method: laplace fits" in str(err)


@pytest.mark.parametrize(("overrides", "field", "value", "listed"), [
    (["guide.init_rho=-200"], "guide.init_rho", -200, []),
    (["prior.name=normal", "prior.scale=0"], "prior.default.scale", 0, []),
    (["net.hidden=[-1]", "seed=-2", "guide.init_rho=9"], "net.hidden", [-1], ["guide.init_rho: got 9", "seed: got -2"]),
    (["seed=-2"], "seed", -2, []),
    (["bogus=1"], "bogus", 1, []),
    (["net.activation=swish"], "net.activation", "swish", []),
])
def test_error_field_is_the_dotted_path_of_the_first_offending_field(overrides, field, value, listed):
    err = spec_error(overrides)
    assert err.field == field and err.value == value
    lines = str(err).splitlines()
    assert len(lines) == 2 + len(listed) and field in lines[1]
    for line, text in zip(lines[2:], listed, strict=True):
        assert line.startswith(f"  {text}")


def test_missing_data_section_names_data():
    with pytest.raises(ZooInputError) as info:
        load_spec({"net": {"hidden": [3]}})
    assert info.value.field == "data" and "  data: Field required" in str(info.value)


# ------------------------------------------------------------------------------------- load_spec's source
@pytest.mark.parametrize("source", [None, ["data: {name: toy_gap}"], 42, b"spec.yaml"])
def test_load_spec_refuses_what_is_not_a_spec_source(source):
    with pytest.raises(ZooInputError) as info:
        load_spec(source)
    assert info.value.field == "spec" and info.value.value == source
    assert str(info.value) == (f"spec: got {source!r}; pass the path of a YAML spec file (a str or pathlib.Path), "
                               "a dict of sections (data, net, ...) or a RunSpec")


def test_load_spec_accepts_a_runspec_and_applies_overrides():
    spec = load_spec({**BASE, "net": {"hidden": [7]}, "prior": {"name": "laplace", "scale": 0.5}})
    assert isinstance(spec, RunSpec)
    assert load_spec(spec) == spec
    changed = load_spec(spec, ["seed=3", "guide.init_rho=-4"])
    assert changed.seed == 3 and changed.guide.init_rho == -4.0 and changed.net.hidden == [7]
    assert spec.seed == 0 and spec.guide.init_rho is None  # the given spec is left alone
    assert load_spec(yaml.safe_load(yaml.safe_dump(changed.model_dump(mode="json")))) == changed


def test_load_spec_validates_a_runspec_again():
    spec = load_spec(BASE)
    spec.guide.init_rho = -200.0  # assignment is not validated by pydantic
    with pytest.raises(ZooInputError) as info:
        load_spec(spec)
    assert info.value.field == "guide.init_rho"


def test_load_spec_takes_a_path_object_or_string(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("data: {name: toy_gap}\nseed: 2\n")
    assert load_spec(path).seed == load_spec(str(path)).seed == 2


# --------------------------------------------------------------------------------------------- overrides
def test_a_single_override_string_is_one_override():
    assert load_spec(BASE, "seed=3").seed == 3
    assert load_spec(BASE, "net.hidden=[20, 20]").net.hidden == [20, 20]
    assert load_spec(BASE, ("seed=4", "guide.name=delta")).seed == 4


def test_a_single_string_without_equals_is_refused_as_one_override():
    err = spec_error("seed")
    assert err.field == "--set" and err.value == "seed" and "key.path=value" in str(err)


@pytest.mark.parametrize(("overrides", "value", "hint"), [
    ({"seed": 3}, {"seed": 3}, "give one 'key.path=value' string or a list of them, e.g. ['seed=3', "
                               "'net.hidden=[20, 20]']"),
    (3, 3, "give one 'key.path=value' string or a list of them"),
    (["seed=3", 4], 4, "every override is one 'key.path=value' string, e.g. 'seed=3'"),
])
def test_other_override_types_are_refused(overrides, value, hint):
    err = spec_error(overrides)
    assert err.field == "overrides" and err.value == value
    assert str(err).startswith(f"overrides: got {value!r}; {hint}")
