"""Issue 56: a failure of the user's own code (a net given to ``zoo.BNN``, a ``target:`` a spec names) is a clear
refusal naming the user's object, the cause and the fix, or it now works; never a traceback, never a silent wrong
result.

One table: ``zoo train`` on a spec whose ``net:``/``data:`` names code in a module written to ``tmp_path`` (exit 2,
one ``error:`` paragraph), and ``zoo.BNN(...).fit`` on a net that used to fail deep inside a fit (ZooInputError).
Then what now works: recurrent nets under the vmapped families, frozen parameters under subnetwork Laplace, weight
ties under the all-weights family.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn
from torch.func import functional_call

import zoo
from tests.conftest import assert_fragments, refused
from zoo.errors import ZooInputError
from zoo.nets import ParameterSwap, forward_stacked

USER_MODULE = """
import torch
from torch import nn


def rows(n=30):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, generator=gen)
    return x, x.sum(1)


def three_sets():
    x, y = rows()
    return (x[:20], y[:20]), (x[20:], y[20:]), (x[20:], y[20:])


def with_val():
    x, y = rows()
    return {"train": (x[:20], y[:20]), "test": (x[20:], y[20:]), "val": (x[20:], y[20:])}


def no_data():
    return None


def odd_width(in_dim, out_dim, width=3):
    if width % 2:
        raise ValueError("width must be even")
    return nn.Linear(in_dim, out_dim)


def needs_key():
    settings = {}
    return settings["rows"]
"""


def spec(folder: Path, name: str, net: str | None = None, data: str = "usercode:rows") -> list[str]:
    """``zoo train`` of a tiny spec written to ``folder/name.yaml`` (net: an MLP, or the ``target`` given)."""
    tree = {"data": {"name": "python", "target": data},
            "net": {"name": "python", "target": net} if net else {"name": "mlp", "hidden": [4]},
            "inference": {"num_steps": 2, "predictive_samples": 2}, "device": "cpu"}
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(tree))
    return ["train", str(folder / f"{name}.yaml"), "--out", str(folder / "out"), "--no-progress"]


class Tied(nn.Module):
    """A language-model head tied to its embedding (``head.weight = emb.weight``)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5, 4)
        self.head = nn.Linear(4, 5, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids).mean(1))


class Recurrent(nn.Module):
    """A GRU or LSTM over the row's features as a sequence, then a linear read-out."""

    def __init__(self, kind: type[nn.RNNBase] = nn.GRU) -> None:
        super().__init__()
        self.rnn = kind(1, 4, batch_first=True)
        self.out = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(x.unsqueeze(-1))
        return self.out(h[:, -1])


class Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lin(x), x


class BuffersOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("centre", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.centre).sum(1, keepdim=True)


X = torch.randn(16, 3, generator=torch.Generator().manual_seed(1))
Y = X.sum(1)
IDS = torch.randint(0, 5, (16, 3), generator=torch.Generator().manual_seed(2))
SVI = {"num_steps": 2, "predictive_samples": 2}


def fit(net: nn.Module, member: str, x: torch.Tensor = X, y: torch.Tensor = Y) -> zoo.BNN:
    return zoo.BNN(net, member=member, inference=SVI, device="cpu").fit((x, y), progress=False)


def meta_net() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)).to("meta")


CASES = [
    # 2. a data callable of three sets was read as three batches of training rows (test rows trained on)
    pytest.param(lambda f: spec(f, "three", data="usercode:three_sets"),
                 ("data.target: got 'tuple of 3 items'", "return (train, test)", "a third set"), id="data-three-sets"),
    pytest.param(lambda f: spec(f, "val", data="usercode:with_val"),
                 ("'val' would not be read", "merge those rows into train or test"), id="data-dict-extra-key"),
    # 19. a factory that raises: named with its exception, not a traceback
    pytest.param(lambda f: spec(f, "net-raises", net="usercode:odd_width"),
                 ("net.target: got 'usercode:odd_width'", "building the net raised ValueError: width must be even",
                  "usercode.py, line"), id="net-factory-valueerror"),
    pytest.param(lambda f: spec(f, "data-raises", data="usercode:needs_key"),
                 ("data.target: got 'usercode:needs_key'", "raised KeyError: 'rows'"), id="data-factory-keyerror"),
    pytest.param(lambda f: spec(f, "none", data="usercode:no_data"), "returned None", id="data-factory-none"),
    # 20. a module that does not parse: its file and line
    pytest.param(lambda f: spec(f, "syntax", data="broken:rows"),
                 ("module 'broken' does not import: SyntaxError in", "broken.py, line 3"), id="target-syntax-error"),
    pytest.param(lambda f: spec(f, "missing", data="needsdep:rows"),
                 "module 'needsdep' imports 'not_a_package_zoo56', which is not installed", id="target-missing-dep"),
    pytest.param(lambda f: spec(f, "boom", data="boom:rows"),
                 ("module 'boom' does not import: running it raised RuntimeError: no settings.toml", "boom.py, line 1"),
                 id="target-raises-on-import"),
    # 10. weight ties under the rank-1 family (was a raw RuntimeError in its member embedding)
    pytest.param(lambda f: fit(Tied(), "rank1_normal", IDS, IDS[:, 0]),
                 ("model.family: got 'rank1'; modules 'emb' and 'head' share one weight tensor", "untie them"),
                 id="rank1-tied-weights"),
    # 18. a net on the meta device (was NotImplementedError)
    pytest.param(lambda f: fit(meta_net(), "mean_field"),
                 ("net: got 'Sequential'", "lie on the meta device", "net.to_empty(device='cpu')"),
                 id="meta-device-net"),
    # a forward that returns a tuple; a net with buffers but no parameters
    pytest.param(lambda f: fit(Pair(), "mean_field"), ("net: got 'Pair'; its forward returns a tuple",
                                                       "return that tensor alone"), id="forward-returns-tuple"),
    pytest.param(lambda f: fit(BuffersOnly(), "mean_field"), ("net: got 'BuffersOnly'; it has no parameters",),
                 id="buffers-only-net"),
]


@pytest.mark.parametrize("run, fragments", CASES)
def test_a_failure_of_user_code_is_refused_naming_it(run: Callable, fragments: str | tuple[str, ...],
                                                     tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "usercode.py").write_text(USER_MODULE)
    (tmp_path / "broken.py").write_text("import torch\n\ndef rows(:\n    pass\n")
    (tmp_path / "needsdep.py").write_text("import not_a_package_zoo56\n")
    (tmp_path / "boom.py").write_text("raise RuntimeError('no settings.toml')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("usercode", "broken", "needsdep", "boom"):  # imported afresh from this test's folder
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            command = run(tmp_path)  # a zoo command line, or a Python call that refuses
        except ZooInputError as err:
            message = str(err)
        else:
            assert isinstance(command, list), f"no refusal: {command!r}"
            message = refused(command, capsys, ())
    assert_fragments(message, fragments)


# ------------------------------------------------------------------------------------------ what now works
def test_a_loop_over_draws_equals_vmap_on_a_net_vmap_batches() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
    stacked = {n: p.detach() + 0.1 * torch.randn(4, *p.shape) for n, p in net.named_parameters()}
    torch.testing.assert_close(forward_stacked(net, stacked, X, loop=True), forward_stacked(net, stacked, X))


@pytest.mark.parametrize("kind, member", [(nn.GRU, "mean_field"), (nn.LSTM, "mean_field"), (nn.GRU, "mc_dropout"),
                                          (nn.LSTM, "deep_ensemble")])
def test_a_recurrent_net_fits_and_its_draws_equal_a_manual_loop(kind: type[nn.RNNBase], member: str) -> None:
    torch.manual_seed(0)
    bnn = fit(Recurrent(kind), member)  # was "Batching rule not implemented for aten::gru.input"
    prediction = bnn.predict(X[:4])
    assert prediction.mean.shape == (4,) and bool(torch.isfinite(prediction.mean).all())
    family = bnn.family
    net = family.net
    if member == "deep_ensemble":
        stacked = {n: v.detach() for n, v in family.init.items()}
        out = family.forward_members(stacked, X[:4])
    else:
        stacked = {n: p.detach() + 0.1 * torch.randn(3, *p.shape) for n, p in net.named_parameters()}
        out = family.forward_draws(stacked, X[:4])
    count = next(iter(stacked.values())).shape[0]
    looped = torch.stack([functional_call(net, {n: v[s] for n, v in stacked.items()}, (X[:4],))
                          for s in range(count)])
    torch.testing.assert_close(out, looped)


@pytest.mark.parametrize("member, inference", [
    ("hmc", {"num_chains": 2, "warmup_steps": 3, "num_samples": 2, "predictive_samples": 2}),
    ("sgld", {"num_chains": 2, "epochs": 2, "burn_in_epochs": 1, "thin": 1, "batch_size": 8,
              "predictive_samples": 2})])
def test_an_lstm_samples_under_the_mcmc_members(member: str, inference: dict) -> None:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bnn = zoo.BNN(Recurrent(nn.LSTM), member=member, inference=inference, device="cpu").fit((X, Y),
                                                                                               progress=False)
    assert bool(torch.isfinite(bnn.predict(X[:4]).mean).all())


def test_frozen_parameters_stay_at_their_values_under_subnetwork_laplace() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 1))
    net[0].weight.requires_grad_(False)
    frozen = net[0].weight.detach().clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bnn = zoo.BNN(net, member="subnetwork_laplace", device="cpu",
                      family={"family": "subnetwork", "selection": {"strategy": "largest_magnitude", "size": 5},
                              "map": {"num_steps": 3}}).fit((X, Y), progress=False)
    assert torch.equal(net[0].weight, frozen)  # the MAP stage left it as it was
    assert "0.weight" not in bnn.family.parameter_names()  # and it is no part of the subnetwork
    assert len(bnn.family.parameter_names()) == 5
    assert bool(torch.isfinite(bnn.predict(X[:4]).mean).all())


def test_a_tied_weight_is_swapped_in_every_module_that_holds_it() -> None:
    torch.manual_seed(0)
    net = Tied()
    weights = {n: p.detach() + 1.0 for n, p in net.named_parameters()}
    assert list(weights) == ["emb.weight"]
    torch.testing.assert_close(ParameterSwap(net)(weights, IDS), functional_call(net, weights, (IDS,)))
    assert net.head.weight is net.emb.weight  # put back as it was


def test_a_target_beside_the_working_directory_imports_from_the_console_script(tmp_path, monkeypatch) -> None:
    """``zoo train`` (a console script: the working directory is not on sys.path) run from the folder that holds
    ``mypkg/`` finds ``mypkg.models:make``, as ``python -m`` would; elsewhere the refusal names where it searched."""
    from zoo.parts import import_target

    (tmp_path / "mypkg_zoo52").mkdir()
    (tmp_path / "mypkg_zoo52" / "__init__.py").write_text("")
    (tmp_path / "mypkg_zoo52" / "models.py").write_text("def make():\n    return 7\n")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path), os.getcwd())])
    monkeypatch.chdir(tmp_path / "mypkg_zoo52")
    with pytest.raises(ZooInputError, match="searched sys.path and the working directory .*add that directory to "
                       "PYTHONPATH"):
        import_target("mypkg_zoo52.models:make", "net.target")
    monkeypatch.chdir(tmp_path)
    assert import_target("mypkg_zoo52.models:make", "net.target")() == 7


class StemHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.head = nn.Linear(3, 8), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.stem(x)))


def test_a_glob_ending_in_dot_star_names_the_module_and_everything_under_it() -> None:
    """``include: ["head.*"]`` is a last-layer BNN for a plain ``self.head = nn.Linear`` (it was refused as naming no
    module: the glob matched only modules under head)."""
    x, y = torch.randn(16, 3), torch.randint(0, 2, (16,))
    bnn = zoo.BNN(StemHead(), family={"family": "all_weights", "include": ["head.*"]}).fit((x, y), num_steps=2,
                                                                                      progress=False)
    assert set(bnn.family.latent_sites()) == {"head.weight", "head.bias"}
