"""Issue 56: data given in Python is read whole where it is scored, and rows that cannot be read are refused by name.

``BNN.evaluate`` once scored only the two stand-in rows of a ``DataLoader`` or a ``Dataset`` (a silent wrong NLL);
empty data and rows of another width ended in torch's own errors.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import zoo
from zoo.errors import ZooInputError

X = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
Y = (X[:, 0] > 0).long()


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


@pytest.fixture(scope="module")
def fitted() -> zoo.BNN:
    return zoo.BNN(net(), member="map").fit((X[:32], Y[:32]), progress=False, num_steps=20)


@pytest.mark.parametrize("form", [
    pytest.param(lambda x, y: DataLoader(TensorDataset(x, y), batch_size=8), id="dataloader"),
    pytest.param(lambda x, y: DataLoader(TensorDataset(x, y), batch_size=5, shuffle=True), id="shuffled-loader"),
    pytest.param(lambda x, y: TensorDataset(x, y), id="dataset"),
    pytest.param(lambda x, y: (x.numpy(), y.numpy()), id="arrays"),
])
def test_evaluate_scores_every_row_whatever_the_form(fitted: zoo.BNN, form) -> None:
    rows = fitted.evaluate((X[32:], Y[32:]))
    assert fitted.evaluate(form(X[32:], Y[32:])) == pytest.approx(rows, rel=1e-6)
    # and not the first rows alone: the two first rows score otherwise
    assert fitted.evaluate((X[32:34], Y[32:34]))["nll"] != pytest.approx(rows["nll"], rel=1e-3)


CASES = [
    pytest.param(lambda b: zoo.BNN(net(), member="map").fit((X[:0], Y[:0]), progress=False, num_steps=2),
                 "training data: got 'no rows'; give at least one row", id="fit-empty-tensors"),
    pytest.param(lambda b: zoo.BNN(net(), member="map").fit(TensorDataset(X[:0], Y[:0]), progress=False,
                                                            num_steps=2),
                 "training data: got 'an empty TensorDataset'", id="fit-empty-dataset"),
    pytest.param(lambda b: zoo.BNN(net(), member="map").fit(DataLoader(TensorDataset(X[:0], Y[:0])), progress=False,
                                                            num_steps=2),
                 "training data: got 'an empty DataLoader'", id="fit-empty-loader"),
    pytest.param(lambda b: zoo.BNN(net(), member="map").fit((X, Y), val=(X[:8, :5], Y[:8]), progress=False,
                                                            num_steps=2),
                 "val inputs: got 'rows of shape (5,)'; the training rows are (8,)", id="val-other-width"),
    pytest.param(lambda b: zoo.BNN(net(), member="map").fit(DataLoader(TensorDataset(X, Y), batch_size=16),
                                                            val=(X[:8, :5], Y[:8]), progress=False, num_steps=2),
                 "val inputs: got 'rows of shape (5,)'", id="val-other-width-streamed"),
    pytest.param(lambda b: zoo.BNN(net(), member="map").fit((X, Y), val=TensorDataset(X[:0], Y[:0]), progress=False,
                                                            num_steps=2),
                 "val: got 'an empty TensorDataset'", id="val-empty"),
    pytest.param(lambda b: zoo.BNN(net(), member="map").fit((X, Y), val=(X[:8], Y[:8] + 5), progress=False,
                                                            num_steps=2),
                 "got 'labels 0 .. 6'; the net gives 2 logits per row", id="val-labels-beyond-the-net"),
    pytest.param(lambda b: b.evaluate((X[:0], Y[:0])), "evaluation data: got 'no rows'", id="evaluate-empty"),
    pytest.param(lambda b: b.evaluate((X[:4, :5], Y[:4])), "evaluation data inputs: got 'rows of shape (5,)'",
                 id="evaluate-other-width"),
    pytest.param(lambda b: b.evaluate((X[:4], torch.tensor([0, 1, 2, 1]))), "evaluation data labels 0 .. 2",
                 id="evaluate-label-beyond-the-classes"),
    pytest.param(lambda b: b.evaluate((X[:4], Y[:3])), "evaluation data: got '4 input rows, 3 targets'",
                 id="evaluate-rows-and-targets-differ"),
    pytest.param(lambda b: b.evaluate((torch.full((4, 8), float("nan")), Y[:4])), "NaN/inf values",
                 id="evaluate-nan"),
    pytest.param(lambda b: b.predict(X[:4, :5]), "predict x inputs: got 'rows of shape (5,)'", id="predict-width"),
    pytest.param(lambda b: b.predict(X[:4].long()), None, id="predict-integer-rows-of-a-float-net-convert"),
]


@pytest.mark.parametrize("call, fragment", CASES)
def test_unreadable_rows_are_refused_naming_them(fitted: zoo.BNN, call, fragment: str | None) -> None:
    if fragment is None:
        assert call(fitted).probs.shape == (4, 2)
        return
    with pytest.raises(ZooInputError) as info:
        call(fitted)
    assert fragment in str(info.value), str(info.value)


def test_integer_token_rows_refuse_floating_point_rows() -> None:
    tokens = torch.randint(0, 10, (16, 4))
    embed = nn.Sequential(nn.Embedding(10, 3), nn.Flatten(), nn.Linear(12, 2))
    bnn = zoo.BNN(embed, member="map").fit((tokens, Y[:16]), progress=False, num_steps=2)
    with pytest.raises(ZooInputError, match="the training inputs are torch.int64"):
        bnn.predict(tokens.float())


@pytest.mark.parametrize("data, fragment", [
    pytest.param((X[:, 0], Y), "training data inputs: got 'shape (64,)'; give rows of features", id="one-dim-rows"),
    pytest.param(DataLoader(TensorDataset(X[:, 0], Y), batch_size=16),
                 "training data batch 0 inputs: got 'shape (16,)'", id="one-dim-rows-streamed"),
    pytest.param((X, Y, Y), "got 'a tuple of 3 arrays'; give (inputs, targets)", id="three-arrays"),
    pytest.param((X.numpy(), __import__("numpy").array(["a", "b"] * 32)), "got 'a numpy array of <U1'; give numbers",
                 id="string-labels"),
    pytest.param((X.numpy().astype(object), Y.numpy()), "got 'a numpy array of object'", id="object-array"),
])
def test_rows_the_zoo_cannot_read_are_refused_before_the_fit(data, fragment: str) -> None:
    with pytest.raises(ZooInputError) as info:
        zoo.BNN(net(), member="map").fit(data, progress=False, num_steps=2)
    assert fragment in str(info.value), str(info.value)


def test_a_single_row_to_predict_is_named_with_the_fix(fitted: zoo.BNN) -> None:
    with pytest.raises(ZooInputError, match=r"one row of shape \(8,\)'; give a batch of rows: x\[None\]"):
        fitted.predict(X[0])
    assert fitted.predict(X[0][None]).probs.shape == (1, 2)
