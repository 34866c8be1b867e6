"""Image architectures (LeNet-5, CIFAR ResNet, Wide ResNet) and every family on them: BatchNorm statistics are
buffers (fitted in training mode, read in eval mode, checkpointed), never latent sites."""

from __future__ import annotations

import math
import sys

import pyro
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.conftest import compiled_step, different_entries, interrupt_at
from zoo.curvature import LayerFactors, ParameterLayout
from zoo.data import load_dataset
from zoo.data.augment import crop_flip
from zoo.errors import ZooInputError
from zoo.inference.elbo import LazyTraceMeanField_ELBO
from zoo.inference.local_reparam import LocalReparameterization
from zoo.inference.svi import SVIStep
from zoo.nets import build_net, evaluation_mode, has_batch_norm
from zoo.pipeline import build, load_run, train
from zoo.runs import CHECKPOINT_FILE, load_torch
from zoo.spec import load_spec, net_section

RESNET8 = {"name": "resnet", "depth": 8}  # 6n + 2 with n = 1: the smallest CIFAR ResNet, same blocks as ResNet-20
BASE = {
    "data": {"name": "digits"},
    "net": RESNET8,
    "inference": {"num_steps": 4, "batch_size": 32, "lr": 0.01, "checkpoint_every": 2, "predictive_samples": 2},
    "device": "cpu",
    "seed": 0,
}
FAMILIES = {
    "map": {"model": {"family": "all_weights"}, "guide": {"name": "delta"}},
    "mean_field": {"model": {"family": "all_weights"}, "guide": {"name": "mean_field"},
                   "inference": {"local_reparam": True}},
    "mc_dropout": {"model": {"family": "all_weights"}, "guide": {"name": "dropout", "dropout_rate": 0.1}},
    "deep_ensemble": {"model": {"family": "deep_ensemble", "members": 2}, "guide": {"name": "delta"}},
    "rank1": {"model": {"family": "rank1", "members": 2}, "guide": {"name": "mixture"},
              "prior": {"name": "normal", "loc": 1.0, "scale": 0.5}},
    "batch_ensemble": {"model": {"family": "rank1", "members": 2}, "guide": {"name": "batch_ensemble"},
                       "prior": {"name": "normal", "loc": 1.0, "scale": 0.5}},
    "subnet_laplace": {"model": {"family": "subnetwork", "selection": {"strategy": "largest_magnitude", "size": 64},
                                 "map": {"num_steps": 4, "batch_size": 32, "checkpoint_every": 2}},
                       "guide": {"name": "laplace"}, "inference": {"method": "laplace", "predictive_samples": 2}},
}


def spec_of(family: str, *overrides: str):
    raw = {**BASE, **FAMILIES[family]}
    own = FAMILIES[family].get("inference", {})
    raw["inference"] = own if own.get("method") == "laplace" else {**BASE["inference"], **own}
    return load_spec(raw, list(overrides))


# ------------------------------------------------------------------------------------------------ the nets
def n_parameters(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


def test_published_sizes_and_output_shapes():
    # LeNet-5 on 28x28: 61,706 weights; ResNet-20: 0.27M (He et al. 2016); WRN-16-2: 0.69M
    lenet = build_net(net_section(name="lenet5"), 784, 10)
    resnet20 = build_net(net_section(name="resnet", in_channels=3), 3 * 32 * 32, 10)
    wrn = build_net(net_section(name="wrn", depth=16, widen=2, in_channels=3), 3 * 32 * 32, 10)
    assert n_parameters(lenet) == 61_706
    assert n_parameters(resnet20) == 272_474
    assert n_parameters(wrn) == 691_674
    for net, width in ((lenet, 784), (resnet20, 3072), (wrn, 3072)):
        assert net(torch.randn(5, width)).shape == (5, 10)
    # 20 = 1 stem conv + 3 stages x 3 blocks x 2 convs + the output layer (shortcut projections not counted)
    convs = [n for n, m in resnet20.named_modules() if isinstance(m, nn.Conv2d) and "shortcut" not in n]
    assert len(convs) + 1 == 20


def test_batch_norm_statistics_are_buffers_not_sites():
    spec = spec_of("mean_field")
    family, _ = build(spec, load_dataset(spec.data, 0))
    sites = family.latent_sites()
    buffers = dict(family.net.named_buffers())
    assert buffers and has_batch_norm(family.net)
    assert not set(buffers) & set(sites)
    assert "stem_bn.weight" in sites and "stem_bn.running_mean" in buffers  # BN's scale is a weight like any other


@pytest.mark.parametrize("net, message", [
    ({"name": "resnet", "depth": 21}, "6n \\+ 2"),
    ({"name": "wrn", "depth": 20}, "6n \\+ 4"),
    ({"name": "resnet", "in_channels": 3}, "not 3 x side x side"),
    ({"name": "mlp", "depth": 20}, "net.depth.*unknown setting here; it belongs to: resnet, wrn"),
])
def test_impossible_architectures_are_refused_naming_the_setting(net, message):
    with pytest.raises(ZooInputError, match=message):
        build_net(net_section(**net), 64, 10)


def test_a_spec_setting_the_net_does_not_take_is_refused_at_validation():
    with pytest.raises(ZooInputError, match="net.hidden.*unknown setting here; it belongs to: cnn, mlp"):
        load_spec({**BASE, "net": {"name": "lenet5", "hidden": [100]}})
    assert load_spec({**BASE, "net": {"name": "lenet5", "hidden": [50]}}).net.name == "lenet5"  # the default


def test_torchvision_without_the_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.models", None)
    with pytest.raises(ZooInputError, match="optional torchvision extra"):
        build_net(net_section(name="torchvision", arch="resnet18"), 3 * 32 * 32, 10)


@pytest.mark.vision
def test_torchvision_architectures_by_name_and_their_close_names(tmp_path):
    pytest.importorskip("torchvision.models", reason="the vision extra (make test-vision) runs this")
    with pytest.raises(ZooInputError, match="did you mean resnet18"):
        build_net(net_section(name="torchvision", arch="resnet17"), 3 * 32 * 32, 10)
    net = build_net(net_section(name="torchvision", arch="resnet18"), 28 * 28, 10)  # grey images repeated to RGB
    assert net(torch.randn(2, 784)).shape == (2, 10)
    # a family trains on it end to end (BatchNorm handled as for the zoo's own ResNets)
    spec = load_spec({**BASE, "net": {"name": "torchvision", "arch": "resnet18", "in_channels": 1},
                      "model": {"family": "rank1", "members": 2}, "guide": {"name": "batch_ensemble"},
                      "prior": {"name": "normal", "loc": 1.0, "scale": 0.5},
                      "inference": {"num_steps": 2, "batch_size": 8, "predictive_samples": 1}})
    summary = train(spec, tmp_path / "run", progress=False, echo=None)
    assert 0.0 <= summary.metrics["accuracy"] <= 1.0


def test_evaluation_mode_reads_running_statistics_and_restores_the_mode():
    net = build_net(net_section(**RESNET8), 64, 3)
    x = torch.randn(16, 64)
    with evaluation_mode(net):
        assert not net.training
        alone = net(x[:1])
    assert net.training
    with evaluation_mode(net):  # eval mode: a row's output does not depend on the rest of its batch
        assert torch.allclose(net(x)[:1], alone, atol=1e-5)
    assert not torch.allclose(net(x)[:1], net(x[:4])[:1], atol=1e-4)  # training mode: it does


# ------------------------------------------------------------------------------ local reparameterisation
def test_conv_local_reparameterisation_samples_the_exact_marginal():
    torch.manual_seed(0)
    conv = nn.Conv2d(2, 3, 3, padding=1)
    loc, scale = torch.randn(3, 2, 3, 3), torch.rand(3, 2, 3, 3) * 0.3 + 0.05
    b_loc, b_scale = torch.randn(3), torch.rand(3) * 0.2 + 0.05
    x = torch.randn(4, 2, 5, 5)
    handler = LocalReparameterization()
    draws = []
    with handler:
        for _ in range(4000):
            weight = pyro.sample("w", pyro.distributions.Normal(loc, scale).to_event(4))
            bias = pyro.sample("b", pyro.distributions.Normal(b_loc, b_scale).to_event(1))
            draws.append(conv._conv_forward(x, weight, bias))
    out = torch.stack(draws)
    mean = F.conv2d(x, loc, b_loc, padding=1)
    var = F.conv2d(x * x, scale**2, padding=1) + (b_scale**2)[:, None, None]
    assert torch.allclose(out.mean(0), mean, atol=4 * (var.max() / 4000) ** 0.5)
    assert torch.allclose(out.var(0) / var, torch.ones_like(var), atol=0.12)
    # each example, channel and position draws its own noise: outputs are uncorrelated across examples
    z = (out - mean) / var.sqrt()
    assert abs(float((z[:, 0] * z[:, 1]).mean())) < 0.06


# ------------------------------------------------------------------------------------ every family on it
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_trains_on_a_resnet_and_resumes_exactly(family, tmp_path, monkeypatch):
    spec = spec_of(family)
    straight = train(spec, tmp_path / "straight", progress=False, echo=None)
    assert 0.0 <= straight.metrics["accuracy"] <= 1.0 and math.isfinite(straight.metrics["nll"])
    interrupt_at(monkeypatch, 3, exc=RuntimeError)
    with pytest.raises(RuntimeError, match="simulated"):
        train(spec, tmp_path / "crashed", progress=False, echo=None)
    monkeypatch.undo()
    resumed = train(spec, tmp_path / "crashed", resume=True, progress=False, echo=None)
    a, b = load_torch(straight.run_dir / CHECKPOINT_FILE), load_torch(resumed.run_dir / CHECKPOINT_FILE)
    assert different_entries(a["guide"], b["guide"]) == []
    assert a["buffers"] and len(a["buffers"]) == len(b["buffers"])  # every checkpoint holds the BN statistics
    for x, y in zip(a["point_parameters"] + a["buffers"], b["point_parameters"] + b["buffers"], strict=True):
        assert torch.equal(x, y)
    assert {k: v for k, v in resumed.metrics.items() if k != "train_seconds"} == \
        {k: v for k, v in straight.metrics.items() if k != "train_seconds"}
    # a reloaded run predicts with the fitted running statistics, not the initial ones
    _, data, posterior = load_run(straight.run_dir)
    assert all(torch.equal(mine, saved)
               for mine, saved in zip(posterior.family.buffers(), b["buffers"], strict=True))
    moved = [buf for buf in posterior.family.buffers() if buf.is_floating_point()]
    assert any(not torch.equal(buf, torch.zeros_like(buf)) and not torch.equal(buf, torch.ones_like(buf))
               for buf in moved)


@pytest.mark.parametrize("family", ["map", "mean_field", "mc_dropout", "deep_ensemble", "rank1"])
def test_minibatch_likelihood_is_the_batchs_own_scaled_to_the_data_set(family):
    # In training mode BatchNorm normalises by the batch, so the obs term of rows `batch` out of N is N/B times
    # that of the same rows fitted as the whole data set (the same draws: same seed).
    spec = spec_of(family)
    data = load_dataset(spec.data, 0)
    fam, guide = build(spec, data)
    x, y, n = data.x_train, data.y_train, data.n_train
    batch = torch.tensor([3, 50, 7, 400, 11, 1000, 2, 64])
    elbo = LazyTraceMeanField_ELBO()
    handler = LocalReparameterization if spec.inference.local_reparam else None
    terms = []
    for args in ((x, y, batch), (x[batch], y[batch], None)):
        pyro.set_rng_seed(5)
        if handler is not None:
            with handler():
                elbo.differentiable_loss(fam.model, guide, *args)
        else:
            elbo.differentiable_loss(fam.model, guide, *args)
        terms.append(dict(elbo.last_terms))
    assert torch.allclose(terms[0]["obs"], n / len(batch) * terms[1]["obs"], rtol=1e-4)
    for site in terms[0]:
        if site != "obs":
            assert torch.allclose(terms[0][site], terms[1][site], rtol=1e-5), site


def test_deep_ensemble_members_keep_their_own_batch_norm_statistics():
    spec = spec_of("deep_ensemble", "inference.num_steps=3")
    data = load_dataset(spec.data, 0)
    family, guide = build(spec, data)
    from zoo.inference.svi import SVI

    SVI().fit(family, guide, data, spec.inference, 0, progress=False)
    running = family.member_buffers["stem_bn.running_mean"]
    assert running.shape[0] == 2 and not torch.allclose(running[0], running[1])
    # member k in eval mode is the plain net with member k's weights and member k's statistics
    weights = guide.point_estimate()
    net = family.net
    k = 1
    with torch.no_grad(), evaluation_mode(net):
        together = family.forward_members({n: weights[n] for n in family.weight_names}, data.x_test[:6])[k]
        for name, p in net.named_parameters():
            p.copy_(weights[name][k])
        for name, b in net.named_buffers():
            b.copy_(family.member_buffers[name][k])
        alone = net(data.x_test[:6])
    assert torch.allclose(together, alone, atol=1e-5)


def test_deep_ensemble_conv_members_one_at_a_time_equal_the_vmap_in_training_and_eval_mode():
    # conv nets run the members one after another (faster on the CPU); the vmap is the reference: same outputs
    # with batch statistics, same running statistics afterwards, same outputs in eval mode
    torch.manual_seed(0)
    spec = spec_of("deep_ensemble")
    data = load_dataset(spec.data, 0)
    family, _ = build(spec, data)
    assert family.one_member_at_a_time
    weights = {n: v + 0.1 * torch.randn_like(v) for n, v in family.init.items()}
    x = data.x_train[:9]
    start = {n: b.clone() for n, b in family.member_buffers.items()}
    outputs, buffers = {}, {}
    for one_at_a_time in (True, False):
        family.one_member_at_a_time = one_at_a_time
        for name, b in family.member_buffers.items():
            b.copy_(start[name])
        with torch.no_grad():
            trained = family.forward_members(weights, x)
            with evaluation_mode(family.net):
                evaluated = family.forward_members({n: v.repeat(3, *[1] * (v.dim() - 1)) for n, v in weights.items()},
                                                   x)  # 3 draws of the members: each reuses its member's statistics
        outputs[one_at_a_time] = (trained, evaluated)
        buffers[one_at_a_time] = {n: b.clone() for n, b in family.member_buffers.items()}
    assert outputs[True][0].shape == (2, 9, 10) and outputs[True][1].shape == (6, 9, 10)
    for a, b in zip(outputs[True], outputs[False], strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    assert not torch.equal(buffers[True]["stem_bn.running_mean"], start["stem_bn.running_mean"])
    for name in start:
        assert torch.allclose(buffers[True][name], buffers[False][name], atol=1e-6), name


def test_rank1_conv_members_equal_the_plain_net_with_factored_kernels():
    # member k of a conv layer with kernel W is the layer with kernel W * r_k s_k^T (over channels) and bias b_k;
    # BatchNorm is shared by the members (its statistics in eval mode)
    torch.manual_seed(0)
    spec = spec_of("rank1")
    data = load_dataset(spec.data, 0)
    family, _ = build(spec, data)
    factors = {n: 1 + 0.3 * torch.randn(2, v.shape[-1]) for n, v in family.latent_sites().items()}
    biases = [torch.randn_like(b) for b in family.member_bias.values()]
    x = data.x_test[:5]
    with torch.no_grad(), evaluation_mode(family.net):
        together = family.forward_members(factors, biases, x)
        k = 1
        for (name, layer), bias in zip(family.layers.items(), biases, strict=True):
            r, s = factors[f"{name}.r"][k], factors[f"{name}.s"][k]
            spatial = (1, 1) if isinstance(layer, nn.Conv2d) else ()
            layer.weight.mul_(r.view(-1, 1, *spatial) * s.view(1, -1, *spatial))
            layer.bias = nn.Parameter(bias[k].clone())
        alone = family.net(x)
    assert torch.allclose(together[k], alone, atol=1e-4)


# ------------------------------------------------------------------------------------------- subnetwork
def test_subnetwork_jacobian_through_conv_and_batch_norm_matches_autograd():
    torch.manual_seed(0)
    net = build_net(net_section(**RESNET8), 64, 3).double()
    with torch.no_grad():  # non-trivial running statistics
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    layout = ParameterLayout(net)
    selectable = layout.selectable().nonzero().squeeze(-1)
    indices = selectable[torch.randperm(len(selectable))[:40]].sort().values
    x = torch.randn(6, 64, dtype=torch.float64)
    factors = LayerFactors(net, layout, x)
    flat = nn.utils.parameters_to_vector(net.parameters()).detach()
    names = [n for n, _ in net.named_parameters()]

    def f(sub: torch.Tensor) -> torch.Tensor:
        full = flat.index_copy(0, indices, sub)
        params, offset = {}, 0
        for name, p in net.named_parameters():
            params[name] = full[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        return torch.func.functional_call(net, params, (x,))

    with evaluation_mode(net):
        expected = torch.func.jacrev(f)(flat[indices])
    assert names and torch.allclose(factors.jacobian(layout, indices), expected, atol=1e-9)
    assert net.training  # the factors ran the net in eval mode and gave it back in training mode


def test_subnetwork_never_selects_batch_norm_parameters():
    net = build_net(net_section(**RESNET8), 64, 3)
    layout = ParameterLayout(net)
    mask = layout.selectable()
    bn = [s for s in layout.slots if isinstance(s.module, nn.BatchNorm2d)]
    assert bn and all(not mask[s.offset:s.offset + s.numel].any() for s in bn)
    assert "stem_bn" not in layout.module_names and "stem" in layout.module_names
    spec = spec_of("subnet_laplace", "model.selection.strategy=modules", "model.selection.modules=[stem_bn]")
    with pytest.raises(ZooInputError, match="name modules of this net"):
        build(spec, load_dataset(spec.data, 0))


def test_mcmc_on_a_batch_norm_net_is_refused_naming_the_way_out(tmp_path):
    spec = load_spec({**BASE, "model": {"family": "all_weights"}, "guide": {"name": "delta"},
                      "inference": {"method": "hmc", "num_chains": 2, "warmup_steps": 2, "num_samples": 2}})
    with pytest.raises(ZooInputError, match="without BatchNorm"):
        train(spec, tmp_path / "hmc", progress=False, echo=None)


# ------------------------------------------------------------------------------------------ augmentation
def test_crop_flip_shifts_with_zero_fill_and_mirrors():
    shape = (2, 5, 6)
    image = torch.arange(2 * 5 * 6, dtype=torch.float32).reshape(shape) + 1  # no zeros inside the image
    candidates = {}  # every (flip, top, left) crop of the zero-padded (mirrored) image
    for flip in (False, True):
        padded = F.pad(image.flip(-1) if flip else image, (2, 2, 2, 2))
        for top in range(5):
            for left in range(5):
                candidates[(flip, top, left)] = padded[:, top:top + 5, left:left + 6]
    torch.manual_seed(0)
    out = crop_flip(image.reshape(1, -1).expand(400, -1), shape, padding=2).reshape(400, *shape)
    seen = set()
    for augmented in out:
        matches = [key for key, crop in candidates.items() if torch.equal(augmented, crop)]
        assert matches, "every output is a shifted, possibly mirrored copy of the input with zeros shifted in"
        seen.update(matches)
    assert len(seen) > 40 and {flip for flip, _, _ in seen} == {False, True}  # offsets and flips both vary
    unpadded = crop_flip(image.reshape(1, -1), shape, padding=0).reshape(shape)
    assert torch.equal(unpadded, image) or torch.equal(unpadded, image.flip(-1))


def test_augmented_minibatch_likelihood_is_scaled_to_the_data_set():
    # with augmentation the model sees the B transformed rows as its data; their likelihood is scaled by N / B
    spec = spec_of("map")
    data = load_dataset(spec.data, 0)
    family, guide = build(spec, data)
    optimizer = torch.optim.SGD(list(guide.parameters()), lr=0.0)
    batch = torch.tensor([3, 50, 7, 400, 11, 1000, 2, 64])
    step = SVIStep(family.model, guide, LazyTraceMeanField_ELBO(), optimizer, augment=lambda rows: -rows)
    step(data.x_train, data.y_train, batch)
    augmented = step.elbo.last_terms["obs"]
    plain = LazyTraceMeanField_ELBO()
    plain.differentiable_loss(family.model, guide, -data.x_train[batch], data.y_train[batch], None)
    assert torch.allclose(augmented, data.n_train / len(batch) * plain.last_terms["obs"], rtol=1e-4)


def test_an_augmented_run_resumes_exactly(tmp_path, monkeypatch):
    spec = spec_of("map", "inference.augment=crop_flip")
    straight = train(spec, tmp_path / "straight", progress=False, echo=None)
    interrupt_at(monkeypatch, 3, exc=RuntimeError)
    with pytest.raises(RuntimeError, match="simulated"):
        train(spec, tmp_path / "crashed", progress=False, echo=None)
    monkeypatch.undo()
    train(spec, tmp_path / "crashed", resume=True, progress=False, echo=None)
    a, b = load_torch(straight.run_dir / CHECKPOINT_FILE), load_torch(tmp_path / "crashed" / CHECKPOINT_FILE)
    assert different_entries(a["guide"], b["guide"]) == []
    plain = load_torch(train(spec_of("map"), tmp_path / "plain", progress=False, echo=None).run_dir / CHECKPOINT_FILE)
    assert not torch.equal(plain["guide"]["loc.out/weight"], a["guide"]["loc.out/weight"])  # it did augment


@pytest.mark.slow  # compiles a ResNet-8 step: ~60 s (make test-slow)
@compiled_step
def test_a_batch_norm_nets_compiled_step_leaves_its_reverse_pass_to_aot_and_follows_the_eager_steps():
    """On a net with BatchNorm the compiled graph is the ELBO alone (AOTAutograd compiles the reverse pass: measured
    1.19x faster on ResNet-20 than the reverse pass inside the graph); its steps follow the eager ones, running
    statistics included."""
    runs = []
    for compile in (False, True):
        spec = spec_of("map", f"inference.compile={str(compile).lower()}")
        data = load_dataset(spec.data, spec.seed)
        family, guide = build(spec, data)
        params = list(guide.parameters()) + family.point_parameters()
        step = SVIStep(family.model, guide, LazyTraceMeanField_ELBO(), torch.optim.Adam(params, lr=1e-3),
                       compile=compile)
        assert not step.reverse_in_graph
        batch = torch.arange(32)
        runs.append([float(step(data.x_train, data.y_train, batch)) for _ in range(4)])
        assert step.compiled == compile
        runs[-1].append({k: v.clone() for k, v in family.net.state_dict().items()})
    assert runs[1][:4] == pytest.approx(runs[0][:4], rel=1e-4)
    for key, value in runs[0][4].items():
        torch.testing.assert_close(runs[1][4][key], value, rtol=1e-3, atol=1e-4)


def test_compiled_rank1_on_a_conv_net_is_refused_and_on_an_mlp_accepted():
    # compiled, the rank-1 conv step is slower than eager (benchmarks/conv_speed.py): compile must never be slower
    raw = {**BASE, **FAMILIES["rank1"], "inference": {**BASE["inference"], "compile": True}}
    with pytest.raises(ZooInputError, match="inference.compile.*slower compiled than eager"):
        load_spec(raw)
    assert load_spec({**raw, "net": {"hidden": [8]}}).inference.compile


@pytest.mark.parametrize("overrides, message", [
    ({"net": {"hidden": [8]}}, "augments images: use an image net"),
    ({"inference": {"compile": True}}, "not supported with inference.augment"),
])
def test_augmentation_refuses_what_it_cannot_do(overrides, message, tmp_path):
    raw = {**BASE, **FAMILIES["map"], **{k: v for k, v in overrides.items() if k != "inference"}}
    raw["inference"] = {**BASE["inference"], "augment": "crop_flip", **overrides.get("inference", {})}
    with pytest.raises(ZooInputError, match=message):
        train(load_spec(raw), tmp_path / "run", progress=False, echo=None)


def test_local_reparameterisation_noise_is_drawn_contiguous_whatever_the_layout_of_the_output():
    """A compiled conv net hands the handler its outputs in Inductor's channels-last layout, where ``randn_like``
    filled a strided tensor: on CPU that made the compiled local-reparameterisation step slower than eager (normal_
    7x slower; benchmarks/conv_speed.py). The noise is drawn contiguous, and the same values as for a contiguous
    output."""
    mean = torch.zeros(4, 3, 5, 5).to(memory_format=torch.channels_last)
    assert not mean.is_contiguous()
    torch.manual_seed(0)
    noise = LocalReparameterization()._noise(mean, row_dim=-4)
    torch.manual_seed(0)
    assert noise.is_contiguous() and torch.equal(noise, torch.randn(4, 3, 5, 5))
