"""Image sets read from tiny files the tests write in each set's real on-disk format (torchvision's layout):
CIFAR-10 / CIFAR-100 pickles, SVHN .mat files and, with torchvision, MNIST / FashionMNIST idx files."""

from __future__ import annotations

import pickle
import random
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.io import savemat

from zoo.data import load_dataset
from zoo.data.vision import load_vision
from zoo.errors import ZooInputError
from zoo.pipeline import train
from zoo.spec import data_section, load_spec

RNG = np.random.default_rng(0)


def write_cifar10(root: Path, per_batch: int = 4, n_test: int = 6) -> None:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)

    def batch(n: int, offset: int) -> dict:
        return {b"data": RNG.integers(0, 256, (n, 3072), dtype=np.uint8), b"labels": [(offset + i) % 10
                                                                                       for i in range(n)]}

    for i in range(1, 6):
        (folder / f"data_batch_{i}").write_bytes(pickle.dumps(batch(per_batch, i), protocol=2))
    (folder / "test_batch").write_bytes(pickle.dumps(batch(n_test, 0), protocol=2))
    names = [n.encode() for n in ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
                                  "truck")]
    (folder / "batches.meta").write_bytes(pickle.dumps({b"label_names": names}, protocol=2))


def write_cifar100(root: Path, n_train: int = 12, n_test: int = 5) -> None:
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    for name, n in (("train", n_train), ("test", n_test)):
        fine = [i % 100 for i in range(n)]
        (folder / name).write_bytes(pickle.dumps({b"data": RNG.integers(0, 256, (n, 3072), dtype=np.uint8),
                                                  b"fine_labels": fine, b"coarse_labels": [f // 5 for f in fine]},
                                                 protocol=2))
    (folder / "meta").write_bytes(pickle.dumps({b"fine_label_names": [f"class{i}".encode() for i in range(100)]},
                                               protocol=2))


def write_svhn(root: Path, n_train: int = 10, n_test: int = 4) -> dict[str, np.ndarray]:
    arrays = {}
    for split, n in (("train", n_train), ("test", n_test)):
        x = RNG.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)  # SVHN's layout: H, W, C, N
        y = (np.arange(n) % 10 + 1).reshape(n, 1).astype(np.uint8)  # labels 1..10, 10 is the digit 0
        savemat(root / f"{split}_32x32.mat", {"X": x, "y": y})
        arrays[split] = x
    return arrays


def write_idx(folder: Path, prefix: str, images: np.ndarray, labels: np.ndarray) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    n, h, w = images.shape
    (folder / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 0x803, n, h, w) + images.tobytes())
    (folder / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 0x801, n) + labels.tobytes())


def write_mnist(root: Path, name: str = "MNIST", n_train: int = 12, n_test: int = 5) -> None:
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = RNG.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        write_idx(root / name / "raw", prefix, images, (np.arange(n) % 10).astype(np.uint8))


# --------------------------------------------------------------------------------------------- CIFAR, SVHN
def test_cifar10_reads_every_batch_channel_major_with_class_names(tmp_path):
    write_cifar10(tmp_path)
    data = load_vision("cifar10", str(tmp_path), seed=0)
    assert data.x_train.shape == (20, 3072) and data.x_test.shape == (6, 3072)
    assert data.n_classes == 10 and data.class_names[0] == "airplane"
    raw = pickle.loads((tmp_path / "cifar-10-batches-py" / "data_batch_1").read_bytes())
    first = data.inputs_in_original_units(data.x_train[:1]).round()
    assert torch.equal(first[0].to(torch.uint8), torch.from_numpy(raw[b"data"][0]))  # rows are CIFAR's own order
    assert "svhn" not in data.x_ood  # no SVHN files here: no companion, and nothing downloaded


def test_cifar_gets_svhn_as_its_ood_companion_and_svhn_maps_10_to_digit_0(tmp_path):
    write_cifar10(tmp_path)
    arrays = write_svhn(tmp_path)
    cifar = load_vision("cifar10", str(tmp_path), seed=0)
    assert cifar.x_ood["svhn"].shape == (4, 3072)
    svhn = load_vision("svhn", str(tmp_path), seed=0)
    assert sorted(svhn.y_train.tolist()) == sorted([(i % 10 + 1) % 10 for i in range(10)])
    image = svhn.inputs_in_original_units(svhn.x_train[:1]).round().reshape(3, 32, 32)
    assert torch.equal(image.to(torch.uint8), torch.from_numpy(np.transpose(arrays["train"][..., 0], (2, 0, 1))))
    assert "cifar10" in svhn.x_ood


def test_cifar100_uses_the_fine_labels(tmp_path):
    write_cifar100(tmp_path)
    data = load_vision("cifar100", str(tmp_path), seed=0, ood_classes=[3])
    assert data.n_classes == 99 and "class3" not in data.class_names
    assert data.x_train.shape == (11, 3072)  # fine labels 0..11: the one image of class 3 is held out
    assert data.x_ood["heldout_classes"].shape == (1, 3072)  # test fine labels 0..4: one of class 3


def test_a_missing_file_is_named_with_the_layout(tmp_path):
    write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(ZooInputError, match="cifar-10-batches-py/data_batch_3"):
        load_vision("cifar10", str(tmp_path), seed=0)
    with pytest.raises(ZooInputError, match="train_32x32.mat"):
        load_dataset(data_section(name="svhn", dir=str(tmp_path)), seed=0)


@pytest.mark.parametrize("content", [b"", random.Random(454).randbytes(2000), pickle.dumps([1, 2])],
                         ids=["empty", "noise", "a list"])
def test_a_corrupt_cifar_batch_is_named_and_refused(tmp_path, content):
    write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_2").write_bytes(content)
    with pytest.raises(ZooInputError, match="data_batch_2.*does not hold a CIFAR batch"):
        load_vision("cifar10", str(tmp_path), seed=0)


def test_a_resnet_trains_on_three_channel_images_end_to_end(tmp_path):
    write_cifar10(tmp_path / "data")
    spec = load_spec({"data": {"name": "cifar10", "dir": str(tmp_path / "data")},
                      "net": {"name": "resnet", "depth": 8, "in_channels": 3},
                      "model": {"family": "rank1", "members": 2}, "guide": {"name": "batch_ensemble"},
                      "prior": {"name": "normal", "loc": 1.0, "scale": 0.5},
                      "inference": {"num_steps": 2, "batch_size": 8, "predictive_samples": 1}, "device": "cpu"})
    summary = train(spec, tmp_path / "run", progress=False, echo=None)
    assert 0.0 <= summary.metrics["accuracy"] <= 1.0
    one_channel = load_spec(spec.model_dump(), ["net.in_channels=1"])
    with pytest.raises(ZooInputError, match="3072 inputs are not 1 x side x side"):
        train(one_channel, tmp_path / "wrong", progress=False, echo=None)


# ------------------------------------------------------------------------------- torchvision (vision extra)
@pytest.mark.vision
@pytest.mark.parametrize("name, folder", [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")])
def test_torchvision_sets_read_idx_files(name, folder, tmp_path):
    pytest.importorskip("torchvision.datasets", reason="the vision extra (make test-vision) runs this")
    write_mnist(tmp_path, folder)
    data = load_vision(name, str(tmp_path), seed=0)
    assert data.x_train.shape == (12, 784) and data.n_classes == 10
    companion = "fashion_mnist" if name == "mnist" else "mnist"
    assert companion not in data.x_ood
    write_mnist(tmp_path, "FashionMNIST" if name == "mnist" else "MNIST")
    assert load_vision(name, str(tmp_path), seed=0).x_ood[companion].shape == (5, 784)
