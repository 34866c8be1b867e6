"""zoo.BNN: your own nn.Module, your data, your trained weights, with every family and inference method of the zoo,
saved and loaded in the run-directory format; the spec's python net and data, members as presets."""

from __future__ import annotations

import sys
import textwrap
import warnings
from pathlib import Path

import pyro
import pytest
import torch
from torch import nn

import zoo
from guides.base import INIT_RHO_CANDIDATES
from zoo.cli import main
from zoo.errors import ZooInputError
from zoo.sections import LR_CANDIDATES, PRIOR_SCALE_FACTORS
from zoo.spec import load_spec


class Block(nn.Module):
    """A residual block with LayerNorm (pre-norm, as a transformer's)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(width), nn.Linear(width, width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + torch.tanh(self.fc(self.norm(h)))


class TokenNet(nn.Module):
    """Token ids -> an Embedding -> two residual blocks -> the mean over tokens -> classes."""

    def __init__(self, vocabulary: int = 12, width: int = 4, classes: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocabulary, width)
        self.blocks = nn.Sequential(Block(width), Block(width))
        self.out = nn.Linear(width, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.blocks(self.embed(tokens)).mean(-2))


def tokens(rows: int = 48, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 12, (rows, 5), generator=gen)
    return x, x[:, 0] % 3


SHORT_SVI = {"num_steps": 20, "batch_size": 16, "lr": 0.01, "predictive_samples": 4}
SHORT = {"svi": SHORT_SVI,
         "hmc": {"method": "hmc", "num_chains": 2, "warmup_steps": 6, "num_samples": 4, "predictive_samples": 4,
                 "max_leapfrog_steps": 8},
         "nuts": {"method": "nuts", "num_chains": 1, "warmup_steps": 3, "num_samples": 3, "max_tree_depth": 3,
                  "predictive_samples": 3},
         "sgld": {"method": "sgld", "num_chains": 2, "epochs": 4, "burn_in_epochs": 2, "batch_size": 16,
                  "thin": 1, "predictive_samples": 4},
         "sghmc": {"method": "sghmc", "num_chains": 2, "epochs": 4, "burn_in_epochs": 2, "batch_size": 16,
                   "thin": 1, "predictive_samples": 4},
         "swag": {"method": "swag", "pretrain_epochs": 1, "epochs": 4, "rank": 2, "batch_size": 16,
                  "predictive_samples": 4},
         "laplace": {"method": "laplace", "tune_iterations": 2, "predictive_samples": 4}}
# Every family with every method that fits it (all of them; Laplace needs a linearisable family, the subnetwork),
# 25 combinations. Rank-1 factors the Embedding, the Linear layers and the output layer; the subnetwork selects
# among every weight (the Embedding's too) but LayerNorm's.
FAMILIES = {
    "all_weights": ({"family": "all_weights"}, None, ["svi", "hmc", "nuts", "sgld", "sghmc", "swag"]),
    "rank1": ({"family": "rank1", "members": 2}, {"name": "normal", "loc": 1.0},
              ["svi", "hmc", "nuts", "sgld", "sghmc", "swag"]),
    "deep_ensemble": ({"family": "deep_ensemble", "members": 2}, None, ["svi", "hmc", "nuts", "sgld", "sghmc", "swag"]),
    "subnetwork": ({"family": "subnetwork", "selection": {"size": 12},
                    "map": {"num_steps": 20, "batch_size": 16}}, None,
                   ["laplace", "svi", "hmc", "nuts", "sgld", "sghmc", "swag"]),
}
CASES = [(family, method) for family, (_, _, methods) in FAMILIES.items() for method in methods]
GUIDE = {"svi": {"all_weights": "mean_field", "rank1": "mixture", "deep_ensemble": "delta", "subnetwork": "full_rank"}}


@pytest.mark.parametrize(("family", "method"), CASES, ids=[f"{f}-{m}" for f, m in CASES])
def test_every_family_and_method_fits_a_users_net_with_residual_blocks_layernorm_and_an_embedding(family, method,
                                                                                                  tmp_path):
    model, prior, _ = FAMILIES[family]
    x, y = tokens()
    start = None
    if family == "rank1" and method != "svi":  # the shared W is point-estimated: the chains start from an SVI fit
        start = zoo.BNN(TokenNet(), family=model, prior=prior, guide="mixture").fit(
            (x, y), out=tmp_path / "svi", progress=False, **SHORT_SVI)
    inference = dict(SHORT[method]) if method != "svi" else {"method": "svi", **SHORT_SVI}
    if start is not None:
        inference["init"] = str(start.run_dir)
    guide = GUIDE.get(method, {}).get(family)
    bnn = zoo.BNN(TokenNet(), family=model, prior=prior, guide=guide, inference=inference, likelihood="categorical")
    bnn.fit((x, y), val=(x[:12], y[:12]), out=tmp_path / "run", progress=False)
    assert 0.0 <= bnn.metrics["accuracy"] <= 1.0 and bnn.metrics["nll"] > 0
    probs = bnn.predict(x[:3]).probs
    assert probs.shape == (3, 3) and torch.allclose(probs.sum(-1), torch.ones(3), atol=1e-5)
    loaded = zoo.load(tmp_path / "run")  # TokenNet is importable from this test module
    assert loaded.evaluate((x[:12], y[:12])) == pytest.approx(bnn.evaluate((x[:12], y[:12])), rel=1e-5)


def test_val_rows_are_scored_as_the_fit_goes_only_where_the_scores_are_shown(monkeypatch):
    """fit(val=...) scores the finished fit once (its metrics); with ``echo`` it also scores five times as it goes,
    each a line. Unshown scores were most of a sampled member's fit on a small net (mnist5k mean-field: 35 s
    without them, 84 s with; rank-1's 400 predictive draws scored the rows twice at the end, as the monitor's last
    report and as the metrics). This fit chooses its starting lr on the val rows, then its noise's start, so each
    candidate's run (each candidate lr, the other start at each of them, each wider prior) is scored."""
    x = torch.randn(40, 3)
    y = x @ torch.tensor([1.0, -2.0, 0.5])
    scored, metrics = [], []
    real, real_evaluate = zoo.bnn.ValidationMonitor.__call__, zoo.bnn.evaluate

    def counting(self, *args, **kwargs):
        scored.append(self.reports)
        return real(self, *args, **kwargs)

    def counting_metrics(*args, **kwargs):
        metrics.append(1)
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(zoo.bnn.ValidationMonitor, "__call__", counting)
    monkeypatch.setattr(zoo.bnn, "evaluate", counting_metrics)
    # every lr at both noise starts (joint), then mean-field's other start at the chosen lr, then the wider priors
    lines, runs = [], 2 * len(LR_CANDIDATES) + len(INIT_RHO_CANDIDATES) - 1 + len(PRIOR_SCALE_FACTORS) - 1
    for echo in (None, lines.append):
        scored.clear()
        metrics.clear()
        bnn = zoo.BNN(nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)), guide="mean_field")
        bnn.fit((x, y), val=(x[:10], y[:10]), num_steps=20, batch_size=None, progress=False, echo=echo)
        assert "nll" in bnn.metrics or "test_ll" in bnn.metrics
        assert scored == ([] if echo is None else [5] * 5 * runs) and metrics == [1]  # 5 in each candidate's run
    assert sum("validation" in line for line in lines) == 5 * runs


def test_save_and_load_round_trip_bit_exactly_and_write_the_run_format(tmp_path):
    x = torch.randn(40, 3)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.1 * torch.randn(40)
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
    bnn = zoo.BNN(net, guide="mean_field", likelihood={"name": "gaussian", "noise": "learned"})
    bnn.fit((x, y), val=(x[:10], y[:10]), num_steps=30, batch_size=None, lr=0.02, progress=False)
    saved = bnn.save(tmp_path / "saved")
    assert {"spec.yaml", "checkpoint.pt", "net.pt", "data.pt", "metrics.json"} <= {p.name for p in saved.iterdir()}
    loaded = zoo.load(saved)
    for a, b in ((bnn, loaded), (loaded, bnn)):
        pyro.set_rng_seed(3)
        first = a.predict(x[:5]).draws
        pyro.set_rng_seed(3)
        second = b.predict(x[:5]).draws
        assert torch.equal(first.loc, second.loc) and torch.equal(first.scale, second.scale)
    prediction = loaded.predict(x[:5], num_samples=50)
    assert prediction.mean.shape == (5,) and bool((prediction.variance > 0).all())
    assert set(loaded.to_inference_data(num_samples=8).groups()) >= {"posterior", "log_likelihood", "observed_data"}
    assert main(["eval", str(saved)]) == 2  # its data were given in Python: zoo eval has no test rows to read


def test_bad_input_is_refused_before_training_naming_what_to_change(tmp_path):
    x, y = tokens()
    with pytest.raises(ZooInputError, match="reads 3 output"):  # 5 logits, 3 classes
        zoo.BNN(TokenNet(classes=5), likelihood="categorical").fit((x, y), progress=False)
    with pytest.raises(ZooInputError, match="labels 0 .. 4"):
        zoo.BNN(TokenNet()).fit((x, y), val=(x[:4], torch.tensor([0, 1, 4, 0])), progress=False, num_steps=1)
    with pytest.raises(ZooInputError, match="NaN/inf"):
        xf = torch.randn(10, 2)
        xf[3, 1] = float("nan")
        zoo.BNN(nn.Linear(2, 1)).fit((xf, torch.randn(10)), progress=False)
    with pytest.raises(ZooInputError, match="one target per input row"):
        zoo.BNN(TokenNet()).fit((x, y[:-1]), progress=False)
    with pytest.raises(ZooInputError, match="cannot read the data's rows"):
        zoo.BNN(TokenNet()).fit((torch.randn(10, 5), torch.arange(10) % 3), progress=False)
    with pytest.raises(ZooInputError, match="give a torch.nn.Module"):
        zoo.BNN(object())
    with pytest.raises(ZooInputError, match="guide.name.*does not fit family 'all_weights'"):
        zoo.BNN(TokenNet(), guide="mixture")
    prelu = nn.Sequential(nn.Linear(5, 4), nn.PReLU(), nn.Linear(4, 3))  # PReLU's slope: no rank-1 factors
    with pytest.raises(ZooInputError, match=r"model.exclude.*'1' is of type PReLU.*model.exclude: \[1\]"):
        zoo.BNN(prelu, family="rank1", prior={"loc": 1.0}, guide="mixture").fit((x.float(), y), progress=False)
    zoo.BNN(prelu, family={"family": "rank1", "exclude": ["PReLU"]}, prior={"loc": 1.0}, guide="mixture").fit(
        (x.float(), y), progress=False, num_steps=2)
    with pytest.raises(ZooInputError, match="model.include.*names no module"):
        zoo.BNN(TokenNet(), family={"family": "all_weights", "include": ["decoder"]}).fit((x, y), progress=False)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y.unsqueeze(1).repeat(1, 2)), batch_size=8)
    with pytest.raises(ZooInputError, match=r"one target per row: shape \[N\]"):
        zoo.BNN(TokenNet()).fit(loader, progress=False)


def test_trained_weights_are_checked_against_the_net_and_listed_where_they_differ(tmp_path):
    other = TokenNet(width=6)
    with pytest.raises(ZooInputError, match="shapes differ: embed.weight"):
        zoo.BNN(TokenNet(), weights=other.state_dict())
    state = TokenNet().state_dict()
    state.pop("out.bias")
    state["extra.weight"] = torch.zeros(1)
    with pytest.raises(ZooInputError, match="missing keys: out.bias; unexpected keys: extra.weight"):
        zoo.BNN(TokenNet(), weights=state)
    torch.save(TokenNet().state_dict(), tmp_path / "good.pt")
    net = TokenNet()
    zoo.BNN(net, weights=tmp_path / "good.pt")
    assert torch.equal(net.out.weight, torch.load(tmp_path / "good.pt")["out.weight"])


def test_each_method_starts_post_hoc_at_the_trained_weights():
    torch.manual_seed(0)
    x = torch.randn(64, 3)
    y = (x[:, 0] > 0).long()
    trained = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    optimiser = torch.optim.Adam(trained.parameters(), lr=0.05)
    for _ in range(100):
        optimiser.zero_grad()
        nn.functional.cross_entropy(trained(x), y).backward()
        optimiser.step()
    state = {k: v.detach().clone() for k, v in trained.state_dict().items()}
    with torch.no_grad():
        expected = trained(x[:5]).softmax(-1)

    def fresh() -> nn.Module:  # another initialisation: only the weights carry the training
        torch.manual_seed(1)
        return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))

    swag = zoo.BNN(fresh(), weights=state, member="swag", device="cpu",
                   inference={"init": "weights", "pretrain_epochs": 0, "epochs": 1, "lr": 1e-9, "rank": 2,
                              "collect_every": 1, "batch_size": 16, "predictive_samples": 8})
    swag.fit((x, y), progress=False)  # SGD at a negligible rate from the weights: the SWAG Gaussian sits on them
    assert torch.allclose(swag.predict(x[:5]).probs, expected, atol=1e-4)
    for member in ("mc_dropout", "mean_field", "map", "rank1_normal"):  # no step: where each starts
        bnn = zoo.BNN(fresh(), weights=state, member=member, device="cpu", inference={"num_steps": 0})
        bnn.fit((x, y), progress=False)
        assert all(torch.equal(bnn.family.net.state_dict()[k], v) for k, v in state.items()), member
        point = bnn.guide.point_estimate()
        if member != "rank1_normal":  # rank-1's W is the net's own; its guide holds the factors
            assert all(torch.equal(point[k], v) for k, v in state.items()), member


def test_post_hoc_subnetwork_laplace_on_a_state_dict_matches_the_spec_built_run(tmp_path):
    """A MAP net trained by the zoo, then Laplace at its weights: from the spec (map_from: the MAP run) and from
    Python (the same net with the MAP's state dict, map_from: net) give the same posterior."""
    from zoo.pipeline import train

    base = {"data": {"name": "toy_gap", "n_train": 40}, "net": {"hidden": [8], "activation": "tanh"},
            "likelihood": {"name": "gaussian", "noise": 0.1}, "device": "cpu", "dtype": "float64"}
    train({**base, "guide": {"name": "delta"},
           "inference": {"num_steps": 150, "batch_size": None, "lr": 0.02, "predictive_samples": 1}},
          tmp_path / "map", progress=False, echo=None)
    laplace = {"model": {"family": "subnetwork", "selection": {"strategy": "largest_magnitude", "size": 10}},
               "inference": {"method": "laplace", "predictive_samples": 10}}
    from_spec = zoo.BNN.from_spec({**base, **laplace, "model": {**laplace["model"], "map_from": str(tmp_path / "map")}})
    from_spec.fit(from_spec.spec.data, out=tmp_path / "spec", progress=False)
    from zoo.nets import build_mlp

    net = build_mlp(1, 1, [8], "tanh").double()
    state = {k: v for k, v in torch.load(tmp_path / "map" / "point_estimate.pt").items() if k in net.state_dict()}
    python = zoo.BNN(net, weights=state, family={**laplace["model"], "map_from": "net"}, inference=laplace["inference"],
                     likelihood=base["likelihood"], dtype="float64", device="cpu")
    python.fit(from_spec.data, out=tmp_path / "python", progress=False)
    a, b = from_spec.guide, python.guide
    assert torch.equal(from_spec.family.indices, python.family.indices)
    torch.testing.assert_close(a.scale_tril["subnet"], b.scale_tril["subnet"])
    torch.testing.assert_close(from_spec.family.prior_precision, python.family.prior_precision)


def test_members_are_presets_the_spec_and_the_api_accept_and_override(tmp_path, capsys):
    spec = load_spec({"data": {"name": "toy_gap"}, "member": "rank1_cauchy", "prior": {"scale": 0.5}})
    assert (spec.model.family, spec.guide.name, spec.prior.default.name) == ("rank1", "mixture", "cauchy")
    assert spec.prior.default.scale == 0.5 and spec.prior.default.loc == 1.0
    assert load_spec({"data": {"name": "toy_gap"}, "member": "mc_dropout", "guide": {"name": "delta"}}).guide.name \
        == "delta"
    with pytest.raises(ZooInputError, match="unknown member 'rank2'; use one of: map"):
        load_spec({"data": {"name": "toy_gap"}, "member": "rank2"})
    bnn = zoo.BNN(nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2)), member="mc_dropout")
    assert bnn.spec.guide.name == "dropout" and bnn.spec.member == "mc_dropout"
    assert main(["list", "members"]) == 0
    assert "subnetwork_laplace" in capsys.readouterr().out


def test_a_spec_points_at_the_users_own_net_and_data(tmp_path, monkeypatch, capsys):
    (tmp_path / "mymodels.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn

        def make_net(in_dim, out_dim, width=8):
            return nn.Sequential(nn.Linear(in_dim, width), nn.Tanh(), nn.Linear(width, out_dim))

        def make_data(rows=60):
            gen = torch.Generator().manual_seed(0)
            x = torch.randn(rows, 2, generator=gen)
            y = (x[:, 0] * x[:, 1] > 0).long()
            return (x[:40], y[:40]), (x[40:], y[40:])
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = {"data": {"name": "python", "target": "mymodels:make_data"},
            "net": {"name": "python", "target": "mymodels:make_net", "kwargs": {"width": 6}},
            "inference": {"num_steps": 20, "predictive_samples": 3}, "device": "cpu"}
    import yaml

    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    assert main(["train", str(tmp_path / "spec.yaml"), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    assert main(["eval", str(tmp_path / "run")]) == 0
    spec["net"]["target"] = "mymodels:make_nett"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(spec))
    assert main(["train", str(tmp_path / "bad.yaml"), "--out", str(tmp_path / "bad"), "--no-progress"]) == 2
    assert "module 'mymodels' has no attribute 'make_nett'" in capsys.readouterr().err
    spec["net"]["target"] = "notamodule:make_net"
    (tmp_path / "bad2.yaml").write_text(yaml.safe_dump(spec))
    assert main(["train", str(tmp_path / "bad2.yaml"), "--out", str(tmp_path / "bad2"), "--no-progress"]) == 2
    assert "module 'notamodule' does not import" in capsys.readouterr().err


def test_a_saved_run_of_a_users_net_names_the_import_path_when_the_class_is_gone(tmp_path, monkeypatch):
    (tmp_path / "gone.py").write_text("from torch import nn\n\nclass Tiny(nn.Linear):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import gone

    bnn = zoo.BNN(gone.Tiny(2, 1)).fit((torch.randn(20, 2), torch.randn(20)), num_steps=5, progress=False)
    bnn.save(tmp_path / "run")
    monkeypatch.delitem(sys.modules, "gone")
    (tmp_path / "gone.py").unlink()
    with pytest.raises(ZooInputError, match="instance of gone:Tiny, which must be importable"):
        zoo.load(tmp_path / "run")


def test_the_readme_quick_start_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # it saves to runs/mine
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = readme.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(block.strip().splitlines()) <= 20
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(block.replace("epochs=50", "epochs=1"), "README", "exec"), {"__name__": "readme"})


@pytest.mark.slow
def test_the_readme_quick_start_as_written_meets_the_bar_and_says_its_figures(tmp_path, monkeypatch):
    """Run as written (its seed and epochs), the quick start's member is at least as good as the same net trained
    plainly on the same loader (benchmarks/defaults.py's recipe and bar), and its comment states the figures."""
    import re

    from tests.conftest import load_benchmark

    defaults = load_benchmark("defaults")
    monkeypatch.chdir(tmp_path)
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = readme.split("```python\n", 1)[1].split("```", 1)[0]
    scope = {"__name__": "readme"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(block, "README", "exec"), scope)
    x, y, zoo_figures = scope["x"], scope["y"], scope["bnn"].metrics
    epochs = int(re.search(r"epochs=(\d+)", block).group(1))
    plain = []
    for lr in defaults.PLAIN_LRS:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.LayerNorm(32), torch.nn.ReLU(),
                                  torch.nn.Linear(32, 2))
        defaults.train_plainly(net, scope["train"], "classification", lr, epochs)
        with torch.no_grad():
            plain.append(defaults.scores(defaults.CASES["twoclass"], net(x[400:]), y[400:], None, 1.0))
    best = min(plain, key=lambda m: m["nll"])  # picked on the rows it is scored on: the plain net's best case
    ok, why = defaults.meets_bar(defaults.CASES["twoclass"], zoo_figures, best)
    assert ok, why
    said = re.search(r"here: accuracy ([\d.]+), NLL ([\d.]+)", block)
    assert said, "the quick start's comment no longer states its figures"
    assert float(said.group(1)) == pytest.approx(zoo_figures["accuracy"], abs=0.01)
    assert float(said.group(2)) == pytest.approx(zoo_figures["nll"], abs=0.01)


# ------------------------------------------------------------------------------------------ streamed data
def _linear_rows(rows: int = 60):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(rows, 3, generator=gen)
    return x, x @ torch.tensor([0.5, -1.0, 2.0]) + 0.1 * torch.randn(rows, generator=gen)


def test_a_streamed_minibatchs_likelihood_is_scaled_to_the_data_sets_rows_not_the_batchs():
    """The same rows give the same ELBO whether they come as indices into rows in memory or as a loader's batch."""
    from zoo.data import dataset_from
    from zoo.inference.elbo import ELBOS
    from zoo.inference.svi import SVIStep, make_optimizer
    from zoo.spec import SVISpec

    x, y = _linear_rows()
    bnn = zoo.BNN(nn.Linear(3, 1), guide="delta", likelihood={"name": "gaussian", "noise": 0.3}, device="cpu")
    bnn.fit((x, y), num_steps=1, progress=False)
    family, guide = bnn.family, bnn.guide
    step = SVIStep(family.model, guide, ELBOS["trace_mean_field"](1), make_optimizer(list(guide.parameters()),
                                                                                     SVISpec()))
    rows = torch.tensor([3, 17, 41, 8, 25])
    in_memory = step.loss(x, y, rows)
    streamed = dataset_from(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=5))
    assert streamed.streamed and streamed.n_train == 60 and len(streamed.x_train) == 2  # examples only
    from zoo.distributed import ObservationScale

    with ObservationScale(60 / 5):
        batch = step.loss(x[rows], y[rows], None)
    torch.testing.assert_close(batch, in_memory)
    full = step.loss(x, y, None)
    assert not torch.allclose(full, in_memory)  # a different estimate: the scaling, not the rows, makes them agree


def test_a_fit_streamed_from_a_loader_with_workers_resumes_exactly_after_an_interrupt(tmp_path, monkeypatch):
    x, y = _linear_rows(64)
    data = torch.utils.data.TensorDataset(x, y)

    def fit(out, **extra):
        loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True, num_workers=1)
        torch.manual_seed(0)  # the same net to start from
        bnn = zoo.BNN(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)), guide="mean_field", seed=2,
                      device="cpu")
        return bnn.fit(loader, out=out, num_steps=12, checkpoint_every=4, progress=False, **extra)

    straight = fit(tmp_path / "straight")
    from zoo import bnn as bnn_module

    real_build, calls = bnn_module.build, []

    def build(*args, **kwargs):
        family, guide = real_build(*args, **kwargs)

        def hook(*_):
            calls.append(1)
            if len(calls) == 7:  # inside step 6, after its batch was drawn
                raise KeyboardInterrupt

        guide.register_forward_hook(hook)
        return family, guide

    monkeypatch.setattr(bnn_module, "build", build)
    with pytest.raises(KeyboardInterrupt):
        fit(tmp_path / "cut")
    monkeypatch.undo()
    resumed = fit(tmp_path / "cut", resume=True)
    for name, value in straight.guide.state_dict().items():
        assert torch.equal(value, resumed.guide.state_dict()[name]), name


def test_a_tensor_dataset_loader_is_read_a_batch_at_a_time_exactly_as_the_loader_gives_it():
    from zoo.data.base import tensor_batches

    x, y = torch.randn(50, 3), torch.arange(50)
    rows = torch.utils.data.TensorDataset(x, y)
    data = torch.utils.data

    def same_batches(make_loader, n_batches, last_rows):
        def seeded():  # each read from a fresh loader whose shuffle is seeded alike
            loader = make_loader()
            if isinstance(loader.sampler, data.RandomSampler):
                loader.sampler.generator = torch.Generator().manual_seed(5)
            return loader

        fast, plain = list(tensor_batches(seeded())), list(seeded())
        assert len(fast) == len(plain) == n_batches and fast[-1][0].shape == (last_rows, 3)
        for (fx, fy), (px, py) in zip(fast, plain, strict=True):
            assert torch.equal(fx, px) and torch.equal(fy, py) and fy.dtype == py.dtype

    same_batches(lambda: data.DataLoader(rows, batch_size=16, shuffle=True), 4, 2)
    same_batches(lambda: data.DataLoader(rows, batch_size=16, shuffle=True, drop_last=True), 3, 16)
    same_batches(lambda: data.DataLoader(rows, batch_size=16), 4, 2)  # sequential
    same_batches(lambda: data.DataLoader(rows, batch_size=16, sampler=data.SubsetRandomSampler(range(0, 50, 2),
                                         generator=torch.Generator().manual_seed(1))), 2, 9)  # a sampler of its own
    unseeded = data.DataLoader(rows, batch_size=16, shuffle=True)  # the sampler's own lists, each row once
    assert torch.equal(torch.cat([b[1] for b in tensor_batches(unseeded)]).sort().values, y)
    own_collation = data.DataLoader(rows, batch_size=16, collate_fn=lambda rows: rows)
    assert tensor_batches(own_collation) is None and tensor_batches([(x, y)]) is None


def test_a_torch_dataset_is_streamed_through_the_users_own_transform(tmp_path):
    class Noisy(torch.utils.data.Dataset):  # a map-style data set whose items are made on the fly (augmentation)
        def __init__(self) -> None:
            self.x, self.y = _linear_rows(40)

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, i: int):
            return self.x[i] + 0.01 * torch.randn(3), self.y[i]

    bnn = zoo.BNN(nn.Linear(3, 1), guide="mean_field", inference={"batch_size": 8}, device="cpu")
    bnn.fit(Noisy(), val=_linear_rows(10), epochs=3, progress=False)
    assert bnn.data.streamed and bnn.data.n_train == 40 and bnn.metrics["rmse"] > 0


@pytest.mark.vision
def test_a_torchvision_model_as_it_comes_is_made_bayesian_by_rank1_and_post_hoc_laplace(tmp_path):
    models = pytest.importorskip("torchvision.models", reason="the vision extra (make test-vision) runs this")
    torch.manual_seed(0)
    x, y = torch.rand(8, 3, 32, 32), torch.arange(8) % 3
    rank1 = zoo.BNN(models.resnet18(num_classes=3), member="rank1_normal", family={"members": 2}, device="cpu")
    rank1.fit((x, y), val=(x[:4], y[:4]), out=tmp_path / "rank1", num_steps=2, batch_size=4, predictive_samples=2,
              progress=False)
    factored = {name.rpartition(".")[0] for name in rank1.family.factor_names}
    assert "conv1" in factored and "layer4.1.conv2" in factored and "fc" in factored  # every conv and the head
    assert rank1.predict(x[:2]).probs.shape == (2, 3)
    trained = models.resnet18(num_classes=3).eval()  # post hoc at its own weights and BatchNorm statistics
    laplace = zoo.BNN(trained, member="subnetwork_laplace", device="cpu",
                      family={"family": "subnetwork", "map_from": "net",
                              "selection": {"strategy": "largest_magnitude", "size": 30}},
                      inference={"tune_iterations": 2, "predictive_samples": 4})
    laplace.fit((x, y), val=(x[:4], y[:4]), out=tmp_path / "laplace", progress=False)
    assert 0.0 <= laplace.metrics["accuracy"] <= 1.0
    again = zoo.load(tmp_path / "laplace").evaluate((x[:4], y[:4]))
    assert again == pytest.approx({k: laplace.metrics[k] for k in again}, rel=1e-5)
