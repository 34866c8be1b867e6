"""data.validation_fraction: a seeded share of the TRAINING rows becomes the evaluation set, for honest tuning."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from zoo.data import DataSection, load_dataset
from zoo.data.base import carve_validation, make_dataset
from zoo.errors import ZooInputError
from zoo.spec import data_section, load_spec

SHARED_UCI = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "uci"

N_ROWS, TRAIN, TEST = 40, list(range(0, 30)), list(range(30, 40))


@pytest.fixture
def uci_dir(tmp_path: Path) -> Path:
    """A UCI folder whose rows are recognisable: column 0 is the row id, the target is column 3."""
    rng = np.random.default_rng(1)
    data = rng.normal(size=(N_ROWS, 4))
    data[:, 0] = np.arange(N_ROWS)
    data[:, 3] = 50 + 10 * data[:, 1] + rng.normal(size=N_ROWS)
    folder = tmp_path / "ids"
    folder.mkdir()
    (folder / "data.txt").write_text("\n".join(" ".join(f"{v:.8f}" for v in row) for row in data) + "\n")
    (folder / "index_features.txt").write_text("0\n1\n2\n")
    (folder / "index_target.txt").write_text("3\n")
    (folder / "n_splits.txt").write_text("2\n")
    splits = [(TRAIN, TEST), (list(range(10, 40)), list(range(10)))]
    for i, (train, test) in enumerate(splits):
        (folder / f"index_train_{i}.txt").write_text("\n".join(map(str, train)) + "\n")
        (folder / f"index_test_{i}.txt").write_text("\n".join(map(str, test)) + "\n")
    np.save(tmp_path / "raw.npy", data)
    return tmp_path


def _ids(data, x: torch.Tensor) -> list[int]:
    """Row ids (column 0 in raw units) of standardised inputs."""
    return [int(round(v)) for v in data.inputs_in_original_units(x)[:, 0].double().tolist()]


def _spec(root: Path, fraction: float, split: int = 0) -> DataSection:
    return data_section(name="uci:ids", dir=str(root), split=split, validation_fraction=fraction)


def test_default_is_no_validation():
    assert data_section(name="toy_gap").validation_fraction == 0.0


def test_sizes_and_disjoint_from_the_real_test_split(uci_dir):
    full = load_dataset(_spec(uci_dir, 0.0), seed=0)
    val = load_dataset(_spec(uci_dir, 0.2), seed=0)
    assert full.n_train == 30 and len(full.y_test) == 10
    assert val.n_train == 24 and len(val.y_test) == 6 and len(val.x_test) == 6
    train_ids, val_ids = _ids(val, val.x_train), _ids(val, val.x_test)
    assert not set(train_ids) & set(val_ids), "a row is both trained on and validated on"
    assert set(train_ids) | set(val_ids) == set(TRAIN), "validation rows come from the training split only"
    assert not set(val_ids) & set(TEST), "the real test split must never be touched"
    assert not set(train_ids) & set(TEST)


def test_targets_match_their_rows(uci_dir):
    raw = np.load(uci_dir / "raw.npy")
    val = load_dataset(_spec(uci_dir, 0.25), seed=0)
    for x, y in ((val.x_train, val.y_train), (val.x_test, val.y_test)):
        ids = _ids(val, x)
        y_raw = y.double().numpy() * val.y_std + val.y_mean
        np.testing.assert_allclose(y_raw, raw[ids, 3], rtol=1e-5)
        np.testing.assert_allclose(val.inputs_in_original_units(x).double().numpy(), raw[ids, :3], atol=1e-4)


def test_restandardised_with_remaining_training_rows_only(uci_dir):
    raw = np.load(uci_dir / "raw.npy")
    full = load_dataset(_spec(uci_dir, 0.0), seed=0)
    val = load_dataset(_spec(uci_dir, 0.3), seed=0)
    kept = _ids(val, val.x_train)
    x_kept, y_kept = raw[kept, :3], raw[kept, 3]
    np.testing.assert_allclose(val.x_mean.double().numpy(), x_kept.mean(0), atol=1e-4)
    np.testing.assert_allclose(val.x_std.double().numpy(), x_kept.std(0), rtol=1e-4)
    assert val.y_mean == pytest.approx(y_kept.mean(), rel=1e-6)
    assert val.y_std == pytest.approx(y_kept.std(), rel=1e-6)
    assert val.y_mean != pytest.approx(full.y_mean, rel=1e-9), "statistics must not be the full training split's"
    x = val.x_train.double()
    assert torch.allclose(x.mean(0), torch.zeros(3, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(x.std(0, unbiased=False), torch.ones(3, dtype=torch.float64), atol=1e-4)
    assert abs(float(val.y_train.double().mean())) < 1e-5
    assert abs(float(val.y_train.double().std(unbiased=False)) - 1) < 1e-4


def test_seeded(uci_dir):
    a = load_dataset(_spec(uci_dir, 0.2), seed=0)
    b = load_dataset(_spec(uci_dir, 0.2), seed=0)
    c = load_dataset(_spec(uci_dir, 0.2), seed=1)
    for field in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert set(_ids(a, a.x_test)) != set(_ids(c, c.x_test)), "another seed should carve other rows"


def test_other_split_carves_from_its_own_training_rows(uci_dir):
    val = load_dataset(_spec(uci_dir, 0.2, split=1), seed=0)
    ids = set(_ids(val, val.x_train)) | set(_ids(val, val.x_test))
    assert ids == set(range(10, 40))


def test_synthetic_sets_too():
    plain = load_dataset(data_section(name="toy_gap"), seed=0)
    val = load_dataset(data_section(name="toy_gap", validation_fraction=0.2), seed=0)
    assert plain.n_train == 100 and val.n_train == 80 and len(val.y_test) == 20
    assert val.x_ood.keys() == plain.x_ood.keys()
    train_x = set(plain.inputs_in_original_units(plain.x_train)[:, 0].tolist())
    for v in val.inputs_in_original_units(val.x_test)[:, 0].tolist():
        assert min(abs(v - t) for t in train_x) < 1e-5, "validation inputs are training inputs"


def test_classification_keeps_ood_sets_and_classes():
    spec = data_section(name="digits", ood_classes=[8, 9], validation_fraction=0.25)
    plain = load_dataset(data_section(name="digits", ood_classes=[8, 9]), seed=0)
    val = load_dataset(spec, seed=0)
    assert val.task == "classification" and val.n_classes == plain.n_classes == 8
    assert val.class_names == plain.class_names
    assert val.n_train + len(val.y_test) == plain.n_train
    assert len(val.y_test) == round(0.25 * plain.n_train)
    assert val.y_test.dtype == torch.int64 and int(val.y_test.max()) < 8
    assert val.x_ood.keys() == plain.x_ood.keys() and "heldout_classes" in val.x_ood
    for name in plain.x_ood:  # same raw OOD inputs, standardised with the new training statistics
        assert torch.allclose(val.inputs_in_original_units(val.x_ood[name]),
                              plain.inputs_in_original_units(plain.x_ood[name]), atol=1e-3)


def test_zero_fraction_returns_the_data_unchanged():
    data = make_dataset("t", "regression", np.arange(10.0)[:, None], np.arange(10.0), np.ones((2, 1)), np.ones(2))
    assert carve_validation(data, 0.0, seed=0) is data


def test_bad_fractions_are_refused(uci_dir):
    with pytest.raises(ZooInputError, match="validation_fraction"):
        load_spec({"data": {"name": "toy_gap", "validation_fraction": 1.0}})
    with pytest.raises(ZooInputError, match="validation_fraction"):
        load_spec({"data": {"name": "toy_gap", "validation_fraction": -0.1}})
    small = make_dataset("t", "regression", np.arange(3.0)[:, None], np.arange(3.0), np.ones((1, 1)), np.ones(1))
    with pytest.raises(ZooInputError, match="fewer than 2"):
        carve_validation(small, 0.5, seed=0)
    with pytest.raises(ZooInputError, match="validation_fraction"):
        carve_validation(small, 1.5, seed=0)


def test_spec_override_reaches_the_data(uci_dir):
    spec = load_spec({"data": {"name": "uci:ids", "dir": str(uci_dir)}}, ["data.validation_fraction=0.2"])
    assert spec.data.validation_fraction == 0.2
    assert len(load_dataset(spec.data, spec.seed).y_test) == 6


@pytest.mark.skipif(not SHARED_UCI.is_dir(), reason=f"the shared UCI data is not at {SHARED_UCI}")
def test_real_boston_split():
    spec = data_section(name="uci:bostonHousing", dir=str(SHARED_UCI), split=0, validation_fraction=0.2)
    val = load_dataset(spec, seed=0)
    full = load_dataset(data_section(name="uci:bostonHousing", dir=str(SHARED_UCI), split=0), seed=0)
    assert val.n_train + len(val.y_test) == full.n_train
    assert len(val.y_test) == round(0.2 * full.n_train)
    test_rows = {tuple(np.round(r, 3)) for r in full.inputs_in_original_units(full.x_test).double().tolist()}
    val_rows = {tuple(np.round(r, 3)) for r in val.inputs_in_original_units(val.x_test).double().tolist()}
    assert not test_rows & val_rows
