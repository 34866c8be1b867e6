"""Issue 56, a fresh round: user input the earlier rounds did not try, each now a clear refusal naming the field, the
value and the fix (or a right result), never a traceback, a silent wrong result or an overwrite.

One table, as in ``tests/test_refusals.py``: ``zoo`` command lines (in-process through :func:`zoo.cli.main`) exit 2
with one ``error:`` paragraph, and Python calls raise :class:`~zoo.errors.ZooInputError`. The cases read a tiny
mean-field run trained once for the module ({run}) and the files each test makes ({in}). Then what now works: a
net whose in-place op vmap cannot batch, a ``DataLoader`` of an ``IterableDataset`` without ``__len__``.
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm, weight_norm
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import zoo
from tests.conftest import assert_fragments, refused
from zoo.errors import NotFitted, ZooInputError

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TINY = ["--no-progress", "--set", "device=cpu", "--set", "inference.num_steps=2", "--set",
        "inference.predictive_samples=2"]
X = torch.randn(16, 3, generator=torch.Generator().manual_seed(1))
Y = X.sum(1)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))


def fit(net: nn.Module | None = None, data=None, member: str = "map", **settings) -> zoo.BNN:
    return zoo.BNN(net if net is not None else mlp(), member=member, device="cpu").fit(
        data if data is not None else (X, Y), progress=False, **{"num_steps": 2, "predictive_samples": 2, **settings})


class Inplace(nn.Module):
    """``h.relu_(); h[:, 0] = 0``: writes over the ReLU output autograd saved for the gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden, self.out = nn.Linear(3, 4), nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.hidden(x)
        h.relu_()
        h[:, 0] = 0.0
        return self.out(h)


class Accumulate(nn.Module):
    """``h = zeros(); h += layer(x)``: an in-place add into a tensor vmap does not batch."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden, self.out = nn.Linear(3, 4), nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(x.shape[0], 4, dtype=x.dtype)
        h += self.hidden(x)
        return self.out(torch.tanh(h))


class Rows(IterableDataset):
    """An iterable dataset of ``(x, y)`` items without ``__len__``."""

    def __iter__(self):
        for i in range(len(X)):
            yield X[i], Y[i]


def hooked() -> nn.Module:
    net = mlp()
    net[0].register_forward_hook(lambda module, args, out: out * 0.5)
    return net


def batch_norm() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))


def tampered(run: Path, folder: Path, name: str, file: str, content: bytes | Callable[[Path], None]) -> Path:
    """A copy of ``run`` in ``folder`` whose ``file`` is replaced."""
    copy = folder / name
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns(".zoo-run.lock"))
    content(copy / file) if callable(content) else (copy / file).write_bytes(content)
    return copy


def saved_python_run(folder: Path) -> Path:
    return fit().save(folder / "py")


def weights_file(folder: Path, change: Callable[[torch.Tensor], torch.Tensor]) -> Path:
    torch.save({k: change(v) for k, v in mlp().state_dict().items()}, folder / "changed.pt")
    return folder / "changed.pt"


def train(*args: str) -> list[str]:
    return ["train", str(CONFIGS / "mean_field_toy.yaml"), "--out", "{out}", *TINY, *args]


SPEC_TWICE = "data: {name: toy_gap}\ninference: {num_steps: 2, predictive_samples: 2}\ninference: {num_steps: 3}\n"
SPEC_KEY_TWICE = "data: {name: toy_gap}\ninference:\n  lr: 0.1\n  lr: 0.2\n"
PARAMETRIZED = ("torch.save cannot pickle it", "Serialization of parametrized modules",
                "torch.nn.utils.parametrize.remove_parametrizations")

CASES = [
    # nets the zoo could not keep with the run (net.pt) or make Bayesian: refused when zoo.BNN is built
    pytest.param(lambda f, r: zoo.BNN(torch.jit.script(mlp())), ("net: got 'RecursiveScriptModule'",
                                                                  "TorchScript module", "before scripting it"),
                 id="net-torchscript"),
    pytest.param(lambda f, r: zoo.BNN(torch.jit.trace(mlp(), X)), "TorchScript module", id="net-traced"),
    pytest.param(lambda f, r: zoo.BNN(nn.Sequential(weight_norm(nn.Linear(3, 4)), nn.Linear(4, 1))), PARAMETRIZED,
                 id="net-weight-norm"),
    pytest.param(lambda f, r: zoo.BNN(nn.Sequential(spectral_norm(nn.Linear(3, 4)), nn.Linear(4, 1))), PARAMETRIZED,
                 id="net-spectral-norm"),
    pytest.param(lambda f, r: zoo.BNN(hooked()), ("Can't pickle local object", "not lambdas or local functions"),
                 id="net-lambda-hook"),
    pytest.param(lambda f, r: zoo.BNN(nn.Linear(3, 1).to(torch.complex64)),
                 ("its parameter weight is torch.complex64", "drop the imaginary parts"), id="net-complex"),
    # nets that failed deep inside the fit
    pytest.param(lambda f, r: fit(Inplace(), member="mean_field"),
                 ("net: got 'Inplace'; its forward modifies in place a tensor autograd needs", "torch.relu(h)"),
                 id="net-inplace-autograd"),
    pytest.param(lambda f, r: fit(batch_norm(), (X[:1], Y[:1])),
                 ("a batch of 1 row (1 rows, batches of 1)", "BatchNorm1d takes batch statistics"), id="bn-one-row"),
    pytest.param(lambda f, r: fit(batch_norm(), batch_size=1), "a batch of 1 row (16 rows, batches of 1)",
                 id="bn-batch-size-1"),
    pytest.param(lambda f, r: fit(batch_norm(), (X, Y), batch_size=5), ("(16 rows, batches of 5)",
                                                                         "inference.batch_size of 2 or more"),
                 id="bn-last-batch-one-row"),
    pytest.param(lambda f, r: fit(batch_norm(), DataLoader(TensorDataset(X[:9], Y[:9]), batch_size=4)),
                 ("(9 rows, batches of 4)", "DataLoader(..., drop_last=True)"), id="bn-loader-last-batch"),
    # data
    pytest.param(lambda f, r: fit(data=(X, Y * 1e30)), ("training data targets: got 'values up to",
                                                         "overflow float32", "rescale the targets"), id="targets-1e30"),
    pytest.param(lambda f, r: fit(data=DataLoader(TensorDataset(X, Y * 1e30), batch_size=4)),
                 "training data batch 0 targets: got 'values up to", id="targets-1e30-streamed"),
    pytest.param(lambda f, r: fit(data=(X, Y), val=(X, Y * 1e30)), "val targets: got 'values up to",
                 id="val-targets-1e30"),
    pytest.param(lambda f, r: fit(data=(X.to("meta"), Y.to("meta"))),
                 "training data inputs: got 'a tensor on the meta device'", id="data-on-meta"),
    pytest.param(lambda f, r: fit(data=(__import__("pandas").DataFrame(X.numpy()), Y)),
                 ("training data inputs: got 'DataFrame'", "frame.to_numpy"), id="fit-pandas"),
    # API misuse
    pytest.param(lambda f, r: zoo.BNN(mlp()).predict(X), ("BNN: got 'not fitted'", "call .fit(data) first"),
                 id="predict-before-fit"),
    pytest.param(lambda f, r: zoo.BNN(mlp()).save(f / "out"), "call .fit(data) first", id="save-before-fit"),
    pytest.param(lambda f, r: zoo.BNN(mlp()).to_inference_data(), "not fitted", id="inference-data-before-fit"),
    pytest.param(lambda f, r: zoo.load(r).to_inference_data(num_samples=0), "num_samples: got 0",
                 id="inference-data-zero-draws"),
    pytest.param(lambda f, r: zoo.load(r).to_inference_data(num_samples=2.5), "num_samples: got 2.5",
                 id="inference-data-float-draws"),
    pytest.param(lambda f, r: zoo.load(r).predict(__import__("pandas").DataFrame(np.zeros((2, 1)))),
                 ("predict x: got 'DataFrame'", "to_numpy"), id="predict-pandas"),
    pytest.param(lambda f, r: fit().save(f / "user.txt"), ("out: got '{in}/user.txt'; is a file",),
                 id="save-to-a-file"),
    pytest.param(lambda f, r: fit().save(f / "user.txt" / "run"), "is a file, or lies under one",
                 id="save-under-a-file"),
    pytest.param(lambda f, r: (lambda b: b.save(b.run_dir / "copy"))(fit(out=f / "own")),
                 "lies inside this BNN's run directory", id="save-into-its-own-run"),
    # broken run files
    pytest.param(lambda f, r: zoo.load(tampered(saved_python_run(f), f, "garbage", "net.pt", b"garbage")),
                 ("its net.pt cannot be read (UnpicklingError", "restore it"), id="load-garbage-net-pt"),
    pytest.param(lambda f, r: zoo.load(tampered(saved_python_run(f), f, "state", "net.pt",
                                                lambda p: torch.save(mlp().state_dict(), p))),
                 "its net.pt holds a OrderedDict, not the pickled nn.Module", id="load-net-pt-state-dict"),
    pytest.param(lambda f, r: zoo.BNN(mlp(), weights=weights_file(f, lambda v: v * float("nan"))),
                 "0.weight holds NaN/inf values", id="weights-nan"),
    pytest.param(lambda f, r: zoo.BNN(mlp(), weights=weights_file(f, lambda v: v.to(torch.complex64))),
                 "0.weight is torch.complex64 and the net's is torch.float32", id="weights-complex"),
    pytest.param(["report", "{in}/strings", "--out", "{in}/report.md"],
                 "its metrics.json holds no metric that is a number", id="report-metrics-not-numbers"),
    pytest.param(["train", "{in}/twice.yaml", "--out", "{out}", "--no-progress"],
                 ("the key 'inference' is given twice in one mapping (line 2 and line 3)", "keep one"),
                 id="spec-section-twice"),
    pytest.param(["train", "{in}/key_twice.yaml", "--out", "{out}", "--no-progress"],
                 "the key 'lr' is given twice", id="spec-key-twice"),
    # already clean (kept as they are)
    pytest.param(lambda f, r: fit(num_steps=-1), "inference.num_steps: got -1", id="num-steps-negative"),
    pytest.param(lambda f, r: fit(num_steps=2.5), "inference.num_steps: got 2.5", id="num-steps-fraction"),
    pytest.param(lambda f, r: fit(lr=-0.01), "inference.lr: got -0.01", id="lr-negative"),
    pytest.param(lambda f, r: fit(net=nn.Linear(3, 2), data=(X, torch.zeros(16, dtype=torch.long))),
                 "targets: got '1 class'", id="one-class"),
    pytest.param(train("--set", "nosection.lr=3"), "nosection: unknown setting here", id="set-unknown-section"),
    pytest.param(["eval", "{in}", "--samples", "2"], "not a run directory (it has no spec.yaml)",
                 id="eval-not-a-run"),
]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny mean-field run of data given in Python, fitted once for the module."""
    torch.set_num_threads(1)
    return fit(member="mean_field").save(tmp_path_factory.mktemp("fresh") / "run")


@pytest.mark.parametrize("call, fragments", CASES)
def test_fresh_bad_input_is_refused_naming_the_fix(call: list[str] | Callable, fragments: str | tuple[str, ...],
                                                   run: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    folder, out = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    monkeypatch.chdir(tmp_path)
    (folder / "user.txt").write_text("the user's own file\n")
    (folder / "twice.yaml").write_text(SPEC_TWICE)
    (folder / "key_twice.yaml").write_text(SPEC_KEY_TWICE)
    tampered(run, folder, "strings", "metrics.json", b'{"rmse": "abc", "test_ll": null}')
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if callable(call):
            with pytest.raises(ZooInputError) as info:
                call(folder, run)
            message = str(info.value)
        else:
            message = refused([a.replace("{in}", str(folder)).replace("{out}", str(out)) for a in call], capsys, ())
    assert_fragments(message, tuple(text.replace("{in}", str(folder))
                                    for text in ((fragments,) if isinstance(fragments, str) else fragments)))
    assert (folder / "user.txt").read_text() == "the user's own file\n"  # never replaced
    assert not (out / "checkpoint.pt").exists()


def test_not_fitted_is_still_the_runtime_error_it_was() -> None:
    with pytest.raises(RuntimeError, match="not fitted"):
        zoo.BNN(mlp()).predict(X)
    assert issubclass(NotFitted, ZooInputError)


# ------------------------------------------------------------------------------------------ what now works
@pytest.mark.parametrize("member", ["mean_field", "deep_ensemble"])
def test_an_in_place_add_vmap_cannot_batch_runs_its_draws_in_a_loop(member: str) -> None:
    bnn = fit(Accumulate(), member=member)  # was "output with shape [16, 4] doesn't match the broadcast shape"
    assert bool(torch.isfinite(bnn.predict(X[:4]).mean).all())


def test_a_loader_of_an_iterable_dataset_without_len_streams() -> None:
    bnn = fit(data=DataLoader(Rows(), batch_size=4), num_steps=9)  # was TypeError: object of type 'Rows' has no len()
    assert bnn.data.n_train == 16
    assert set(bnn.evaluate(DataLoader(Rows(), batch_size=4))) == {"rmse", "test_ll"}


def test_batch_norm_trains_where_no_batch_has_one_row() -> None:
    fit(batch_norm(), DataLoader(TensorDataset(X[:9], Y[:9]), batch_size=4, drop_last=True))
    fit(batch_norm(), (X, Y), batch_size=4)
