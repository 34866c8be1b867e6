"""Rank-1 BNNs (Dusenberry et al. 2020): shared point-estimated weights, distributions only on rank-1 factors.

Member k of layer W uses the weights W ∘ (r_k s_kᵀ), i.e. y = φ(((x ∘ s_k) Wᵀ) ∘ r_k + b_k). The K members run
as one batch: the input is tiled K times, every Linear layer does one matmul for all members, every convolution
(transposed or not) one convolution per member with that member's weights, and an Embedding scales the row it
looks up, E[i] ∘ r_k, by s_k[i] (:class:`MemberLayers`). The net stays a plain ``nn.Module``: a handler swaps
its ``F.linear``, ``F.conv*``, ``F.conv_transpose*`` and ``F.embedding`` calls for the member-wise versions, the
same way local reparameterisation is applied.
"""

from __future__ import annotations

from typing import Any, Literal

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pydantic import Field, PositiveFloat, PositiveInt
from pyro import poutine
from torch import nn
from torch.distributions import constraints

from zoo.errors import ZooInputError
from zoo.likelihoods import Likelihood, PredictiveDraws, draw_latents, observation, observe_rows
from zoo.models.base import FamilySection, ModelFamily, ModuleChoice, per_device
from zoo.nets import evaluation_mode, has_batch_norm, has_convolutions, prediction_mode
from zoo.priors import PRIORS, PriorSection, prior_distribution
from zoo.runs import check_size_fits
from zoo.sites import MEMBER_FACTORS, LatentSite

MEMBERS = "members"
SCALE, RAW = "_scale", "_z"  # a GSM factor f is held as sites f_scale (per neuron) and f_z (per member)
CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
TRANSPOSED_CONVOLUTIONS = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
FACTORED_LAYERS = (nn.Linear, *CONVOLUTIONS, *TRANSPOSED_CONVOLUTIONS, nn.Embedding)


def _widths(layer: nn.Module) -> tuple[int, int]:
    """(outputs, inputs) of a layer: features of a Linear layer, channels of a convolution, and an Embedding's
    vector width and rows (its input is the one-hot row index)."""
    if isinstance(layer, nn.Linear):
        return layer.out_features, layer.in_features
    if isinstance(layer, nn.Embedding):
        return layer.embedding_dim, layer.num_embeddings
    return layer.out_channels, layer.in_channels


def _has_bias(layer: nn.Module) -> bool:
    """Whether a layer gets per-member biases: every factored layer but an Embedding (a lookup, with no bias)."""
    return not isinstance(layer, nn.Embedding)


def factored_layers(net: nn.Module, choice: ModuleChoice | None = None) -> dict[str, nn.Module]:
    """The layers that get rank-1 factors: the chosen Linear, convolution (transposed or not) and Embedding layers,
    by path.

    :param net: the deterministic net.
    :param choice: which modules are random (None: every supported one).
    :returns: the layers.
    """
    layers = {name: m for name, m in net.named_modules()
              if isinstance(m, FACTORED_LAYERS) and (choice is None or choice.chosen(name, m))}
    _refuse_tied(net, layers)
    return layers


def _refuse_tied(net: nn.Module, layers: dict[str, nn.Module]) -> None:
    """Refuse a factored layer whose weight another module holds too (tied weights, ``head.weight =
    embed.weight``): the members' factors are looked up by the weight tensor, so both modules would read one layer's
    factors, of the other's widths."""
    holders: dict[int, dict[int, str]] = {}  # parameter -> the distinct modules holding it, by path
    modules = dict(net.named_modules(remove_duplicate=False))
    for name, param in net.named_parameters(remove_duplicate=False):
        owner = modules[name.rpartition(".")[0]]
        holders.setdefault(id(param), {}).setdefault(id(owner), name.rpartition(".")[0])
    for layer, m in layers.items():
        paths = list(holders.get(id(m.weight), {}).values())
        if len(paths) > 1:
            others = ", ".join(repr(p) for p in paths if p != layer)
            untie = f"{paths[-1]}.weight = nn.Parameter({paths[0]}.weight.detach().clone())"
            raise ZooInputError("model.family", "rank1", f"modules {layer!r} and {others} share one weight tensor "
                                "(tied weights), and the rank-1 family gives each layer's weight its own per-member "
                                f"factors: untie them (e.g. {untie}), or use a family that keeps the shared tensor "
                                "one site (member mean_field or map)")


class MemberLayers:
    """Within this context, the layers with registered weights W run all M members at once.

    ``layers`` maps each weight tensor to its factors ``r [M, out]``, ``s [M, in]`` and biases ``b [M, out]`` (None
    for an Embedding).
    The net sees one batch of M * B rows, member-major (the batch tiled once per member), so every other layer
    (pooling, BatchNorm with statistics shared by the members, as in the rank-1 and BatchEnsemble ResNets) runs
    unchanged. ``F.linear`` computes ((x ∘ s) Wᵀ) ∘ r + b in one matmul of all rows. ``F.conv2d`` convolves each
    member's B rows with its own weights W ∘ (r_k s_kᵀ): a convolution's weights are far smaller than its
    activations, so scaling them costs less than scaling every activation and its gradient on the way in and out
    (ResNet-20, K = 4, B = 128, one CPU thread: 2.9 s per step that way against 2.3 s this way); a transposed
    convolution likewise (its weights are ``[in, out / groups, ...]``). ``F.embedding`` looks the rows up once for
    all members and scales row i of member k's lookups by s_k[i] r_k.
    """

    def __init__(self, layers: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]],
                 members: int) -> None:
        self.layers, self.members = layers, members

    def __enter__(self) -> MemberLayers:
        self._linear, self._embedding = F.linear, F.embedding
        self._convs = (F.conv1d, F.conv2d, F.conv3d)
        self._transposed = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)
        F.linear, F.embedding = self._member_linear, self._member_embedding
        F.conv1d, F.conv2d, F.conv3d = (self._member_conv(conv) for conv in self._convs)
        F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d = (
            self._member_conv(conv, transposed=True) for conv in self._transposed)
        return self

    def __exit__(self, *exc) -> None:
        F.linear, F.embedding = self._linear, self._embedding
        F.conv1d, F.conv2d, F.conv3d = self._convs
        F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d = self._transposed

    def _lookup(self, weight: torch.Tensor):
        entry = self.layers.get(id(weight))
        return entry[1:] if entry is not None and entry[0] is weight else None

    def _by_member(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(0, (self.members, -1))  # [M * B, ...] -> [M, B, ...]

    def _member_linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
        factors = self._lookup(weight)
        if factors is None:
            return self._linear(x, weight, bias)
        xm = self._by_member(x)  # [M, B, ..., in]
        r, s, b = (v.view(v.shape[0], *[1] * (xm.dim() - 2), v.shape[-1]) for v in factors)
        return torch.addcmul(b, self._linear(xm * s, weight), r).flatten(0, 1)

    def _member_embedding(self, ids: torch.Tensor, weight: torch.Tensor, *args, **kwargs):
        factors = self._lookup(weight)
        if factors is None:
            return self._embedding(ids, weight, *args, **kwargs)
        r, s, _ = factors  # [M, dim], [M, rows]
        by_member = self._by_member(ids)  # [M, B, ...]
        picked = s.gather(1, by_member.flatten(1)).view(by_member.shape)  # s_k[i] of every id: [M, B, ...]
        looked_up = self._embedding(by_member, weight, *args, **kwargs)  # [M, B, ..., dim]
        r = r.view(r.shape[0], *[1] * (by_member.dim() - 1), r.shape[-1])
        return (looked_up * picked[..., None] * r).flatten(0, 1)

    def _member_conv(self, conv, transposed: bool = False):
        """``conv`` (``F.conv1d/2d/3d`` or ``F.conv_transpose1d/2d/3d``), each member's rows convolved with its own
        weights."""

        def member_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *args, **kwargs):
            factors = self._lookup(weight)
            if factors is None:
                return conv(x, weight, bias, *args, **kwargs)
            r, s, b = factors  # [M, out], [M, in], [M, out]
            groups = kwargs.get("groups", args[3] if len(args) > 3 else 1)  # 4th after bias in both signatures
            rows, per_group = weight.shape[:2]  # [out, in / groups] (transposed: [in, out / groups])
            # the factor of the channels along weight's first dim, times the other side's per group read
            first, second = (s, r) if transposed else (r, s)
            second_read = second.view(self.members, groups, 1, per_group).expand(
                -1, -1, rows // groups, -1).reshape(self.members, rows, per_group)
            kernel = [1] * (weight.dim() - 2)
            member_weights = weight * (first[:, :, None] * second_read).view(*second_read.shape, *kernel)
            return torch.cat([conv(member_rows, w, b_k, *args, **kwargs)
                              for member_rows, w, b_k in zip(self._by_member(x), member_weights, b, strict=True)])

        return member_conv


class Rank1BNN(ModelFamily):
    """Pyro model with point-estimated W and per-member biases, and rank-1 factors ``<layer>.r``, ``<layer>.s``
    as latent sites in a plate of K members (their KL terms are averaged over the members).

    A factor under a hierarchical prior (``gsm``) is held as two sites, its per-neuron scales ``<factor>_scale``
    and its standardised value ``<factor>_z`` (non-centred form).

    :param net: the deterministic net; its Linear, convolution and Embedding layers get factors (those ``layers``
        names).
    :param priors: the prior of every factor site (``<layer>.r``, ``<layer>.s``).
    :param likelihood: the observation model.
    :param members: ensemble members K.
    :param member_likelihood: ``average`` (mean of the members' log-likelihoods) or ``mixture``.
    :param weight_decay: scale of a Normal prior on the shared W (None: none).
    """

    def __init__(self, net: nn.Module, priors: dict[str, PriorSection], likelihood: Likelihood, members: int = 4,
                 member_likelihood: str = "average", weight_decay: float | None = None,
                 layers: dict[str, nn.Module] | None = None) -> None:
        self.net, self.likelihood = net, likelihood
        self.members, self.member_likelihood, self.weight_decay = members, member_likelihood, weight_decay
        self.layers = layers if layers is not None else factored_layers(net)
        self.batch_norm = has_batch_norm(net)  # fit in training mode, predict in eval mode (running statistics)
        if not self.layers:
            raise ZooInputError("net", type(net).__name__, "the rank-1 family needs a Linear, convolution or "
                                "Embedding layer to factor; none is chosen")
        self.factor_names = [f"{layer}.{side}" for layer in self.layers for side in ("r", "s")]
        missing = set(self.factor_names) - set(priors)
        if missing:
            raise ValueError(f"no prior for sites {sorted(missing)}")
        self.prior_configs = priors
        # (key, value) pairs, not a dict: ParameterDict sorts a plain dict's keys, and the biases pair with
        # self.layers by position
        self.member_bias = nn.ParameterDict([
            (layer.replace(".", "/"), nn.Parameter(
                (m.bias.detach() if m.bias is not None else torch.zeros(_widths(m)[0])).expand(members, -1).clone()))
            for layer, m in self.layers.items() if _has_bias(m)
        ])
        self._priors: dict[tuple, dict[str, dist.TorchDistribution]] = {}

    @staticmethod
    def prior_sites(net: nn.Module, choice: ModuleChoice | None = None) -> list[str]:
        """The sites the spec's priors are assigned to: ``<layer>.r`` and ``<layer>.s`` for every factored layer.

        :param net: the deterministic net.
        :param choice: which modules are random (None: every supported one).
        :returns: the factor site names.
        """
        return [f"{n}.{side}" for n in factored_layers(net, choice) for side in ("r", "s")]

    # -- what the guides and inference methods see ------------------------------------------------------
    def latent_sites(self) -> dict[str, LatentSite]:
        """Per-neuron GSM scales (global), then the factors r [K, out], s [K, in] in the members plate
        (initialised at 1; a GSM factor is held as its standardised z [K, width], initialised at 0, a site marked
        ``standardised``: a mixture guide starts its members at z = +-init_z),
        then the likelihood's latents."""
        scales, plated = {}, {}
        for layer, m in self.layers.items():
            for side, width in zip(("r", "s"), _widths(m), strict=True):
                name, shape = f"{layer}.{side}", torch.Size([self.members, width])
                config = self.prior_configs[name]
                if config.hierarchical:
                    scales[name + SCALE] = LatentSite(torch.Size([width]), torch.full((width,), config.scale),
                                                      constraints.positive)
                    plated[name + RAW] = LatentSite(shape, torch.zeros(shape), plate=(MEMBERS, self.members),
                                                      standardised=True)
                else:
                    plated[name] = LatentSite(shape, torch.ones(shape), plate=(MEMBERS, self.members))
        return {**scales, **plated, **self.likelihood.latent_sites()}

    def point_parameters(self) -> list[nn.Parameter]:
        """Every parameter of the net (the shared W, BatchNorm's scale and shift) but the factored layers' own
        biases, which the per-member biases replace; then the per-member biases."""
        replaced = {id(m.bias) for m in self.layers.values() if _has_bias(m) and m.bias is not None}
        return [p for p in self.net.parameters() if id(p) not in replaced] + list(self.member_bias.values())

    def buffers(self) -> list[torch.Tensor]:
        """The net's BatchNorm running statistics, shared by the members (saved with checkpoints)."""
        return list(self.net.buffers())

    def to(self, device: torch.device | str, dtype: torch.dtype = torch.float32) -> Rank1BNN:
        """Move the net, the member biases and (lazily) the priors."""
        self.net.to(device=device, dtype=dtype)
        self.member_bias.to(device=device, dtype=dtype)
        return self

    def priors(self) -> dict[str, dist.TorchDistribution]:
        """The prior of every factor-related site; a plated site's prior is one member's event."""

        def build(device: torch.device, dtype: torch.dtype) -> dict[str, dist.TorchDistribution]:
            table = {}
            for name, site in self.latent_sites().items():
                factor = name.removesuffix(SCALE).removesuffix(RAW)
                if factor not in self.prior_configs:
                    continue  # the likelihood's own latents
                config, width = self.prior_configs[factor], site.shape[-1]
                if name.endswith(SCALE):
                    table[name] = config.scale_distribution(width, device, dtype)
                    continue
                if name.endswith(RAW):
                    one_member = config.standardised(width, device, dtype)
                else:
                    one_member = prior_distribution(config, torch.Size([width]), device, dtype)
                # expanded over the members once here, so the members plate need not expand it every step
                table[name] = one_member.expand(torch.Size([self.members]))
            return table

        return per_device(self._priors, next(self.net.parameters()), build)

    def factors(self, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Factor values ``{<layer>.r|s: [M, width]}`` from site values (GSM: loc + tau * z, non-centred)."""
        out = {}
        for name in self.factor_names:
            config = self.prior_configs[name]
            if config.hierarchical:
                out[name] = config.factor(values[name + RAW], values[name + SCALE])
            else:
                out[name] = values[name]
        return out

    # -- the Pyro model --------------------------------------------------------------------------------
    def model(self, x: torch.Tensor, y: torch.Tensor | None = None, batch: torch.Tensor | None = None) -> None:
        """Factors per member, then ``y`` observed on rows ``batch`` under the members' mixture or average."""
        if self.weight_decay is not None:
            weight_prior = dist.Normal(0.0, self.weight_decay)
            pyro.factor("weight_prior", sum(weight_prior.log_prob(m.weight).sum() for m in self.layers.values()))
        priors = self.priors()
        values = {name: pyro.sample(name, fn) for name, fn in priors.items() if name.endswith(SCALE)}
        with pyro.plate(MEMBERS, self.members, dim=-1), poutine.scale(scale=1.0 / self.members):
            values.update({name: pyro.sample(name, fn) for name, fn in priors.items() if not name.endswith(SCALE)})
        factors = self.factors(values)
        biases = list(self.member_bias.values())
        observe_rows(self.likelihood, x, y, batch, lambda rows: self.forward_members(factors, biases, rows),
                     members=self.member_likelihood)

    def forward_members(self, factors: dict[str, torch.Tensor], biases: list[torch.Tensor],
                        x: torch.Tensor) -> torch.Tensor:
        """Outputs ``[M, B, out]`` of M members with factors ``{site: [M, width]}`` and biases ``[M, out]`` (one
        per layer with a bias, in :attr:`member_bias`'s order)."""
        n_members = factors[self.factor_names[0]].shape[0]
        bias_of = dict(zip((n for n, m in self.layers.items() if _has_bias(m)), biases, strict=True))
        layers = {id(m.weight): (m.weight, factors[f"{name}.r"], factors[f"{name}.s"], bias_of.get(name))
                  for name, m in self.layers.items()}
        with MemberLayers(layers, n_members):
            return self.net(x.expand(n_members, *x.shape).flatten(0, 1)).unflatten(0, (n_members, -1))

    def _member_draws(self, draws: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
        """S draws of every site as S*K member values (draw-major), with the member biases repeated S times."""
        sites = self.latent_sites()
        members = {n: v.flatten(0, 1) if sites[n].plate is not None else v.repeat_interleave(self.members, dim=0)
                   for n, v in draws.items()}
        n_draws = next(iter(draws.values())).shape[0]
        return members, [b.repeat(n_draws, 1) for b in self.member_bias.values()]

    def predict(self, draws: dict[str, torch.Tensor], x: torch.Tensor) -> PredictiveDraws:
        """S draws of the K components become S*K predictive draws (the mixture over components and samples).

        A net with convolutions runs one draw's K members per pass (as :func:`zoo.nets.forward_stacked` runs a
        conv net's draws one after another): all S*K in one pass hold S*K copies of every activation at once
        (LeNet-5, 32 x 4 members x 1,000 images: 2.4 GB in its first layer alone)."""
        members, biases = self._member_draws(draws)
        factors = self.factors(members)
        total = next(iter(factors.values())).shape[0]  # S*K
        step = self.members if has_convolutions(self.net) else total
        with prediction_mode(self.net, self.batch_norm):
            out = torch.cat([self.forward_members({n: v[i:i + step] for n, v in factors.items()},
                                                  [b[i:i + step] for b in biases], x) for i in range(0, total, step)])
            return self.likelihood.predictive(out, members)

    def log_likelihood(self, draws: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Pointwise log-likelihood of the model's ``obs`` site (members' mixture or average), per draw: ``[S, B]``."""
        members, biases = self._member_draws(draws)
        with prediction_mode(self.net, self.batch_norm):
            out = self.forward_members(self.factors(members), biases, x)  # [S*K, B, O]
        out = out.unflatten(0, (-1, self.members))
        return observation(self.likelihood, out, draw_latents(self.likelihood, draws, 2),
                           self.member_likelihood).log_prob(y)


class Rank1ModelSpec(FamilySection, ModuleChoice):
    """Rank-1 BNN: shared point-estimated weights, rank-1 factors per ensemble member."""

    offers = frozenset({MEMBER_FACTORS})
    hierarchical_priors = True
    # measured (benchmarks/conv_speed.py, ResNet-20, K = 4, B = 128, one thread): 2.8 s per compiled step against
    # 2.3 s eager; Inductor fuses each batch norm badly with the concatenated members' convolutions
    compiles_convolutions = False

    family: Literal["rank1"] = Field(description="rank1: shared point-estimated W, rank-1 factors r, s per member")
    members: PositiveInt = Field(4, description="ensemble members K")
    member_likelihood: Literal["mixture", "average"] = Field(
        "average", description="mean of the members' log-likelihoods (average), or log of their mean "
        "likelihood (mixture; lets members specialise on parts of the data)")
    weight_decay: PositiveFloat | None = Field(None, description="scale of a Normal prior on the shared W")

    def prior_sites(self, net: nn.Module) -> list[str]:
        self.refuse_unsupported(net, FACTORED_LAYERS, "the rank-1 family")
        return Rank1BNN.prior_sites(net, self)

    def refusals(self, priors: list[PriorSection]) -> list[tuple[str, Any, str]]:
        """Factor priors must be centred at 1: the factors multiply the shared weights."""
        located = ", ".join(name for name, section in PRIORS.items() if "loc" in section.model_fields)
        return [("prior.loc" if "loc" in type(p).model_fields else "prior.name", p.centre if "loc" in type(
            p).model_fields else p.name, f"rank-1 factors multiply the shared weights, so their prior is centred at 1, "
            f"and this {p.name} prior's centre is {p.centre:g}: use a prior with a loc ({located}) and set "
            "prior.loc: 1.0") for p in priors if p.centre != 1.0]

    def check_size(self, net: nn.Module, rows: torch.Tensor, batch: int) -> None:
        """Refuse ``members`` whose factors (r, s and biases per member; with the guide's two parameters and their
        gradients, four copies) and K-times tiled activations of one step's ``batch`` rows (each factored layer's
        input and output and their gradients: four copies; 2-layer MLP, K = 5,000, 64 rows: 110 kB a member
        estimated, 91 kB measured at the peak) would not fit in memory."""
        layers = factored_layers(net, self)
        factors = sum(2 * _widths(m)[0] + _widths(m)[1] for m in layers.values())
        seen = [0]

        def count(module: nn.Module, inputs: tuple, output: Any) -> None:
            seen[0] += sum(t.numel() for t in (*inputs, output)
                           if isinstance(t, torch.Tensor) and t.is_floating_point())

        hooks = [m.register_forward_hook(count) for m in layers.values()]
        try:
            with torch.no_grad(), evaluation_mode(net):
                net(rows)
        except (RuntimeError, TypeError, ValueError):
            return  # the dry run of check_outputs names what the net cannot read
        finally:
            for hook in hooks:
                hook.remove()
        per_row = seen[0] / max(len(rows), 1)
        member = int((4 * factors + 4 * batch * per_row) * rows.element_size())  # one member's bytes
        check_size_fits("model.members", self.members, self.members * member,
                        lambda allowed: (f"use model.members: {int(allowed // member):,} or fewer" if allowed >= member
                                         else "use fewer rows a step (inference.batch_size)")
                        + f" ({member:,} bytes a member at {batch:,} rows a step)",
                        f"{self.members:,} members (their factors and {batch:,} rows a step tiled {self.members:,} "
                        "times)")

    def build(self, net: nn.Module, priors: dict[str, PriorSection], likelihood: Likelihood) -> Rank1BNN:
        self.check_priors(priors)
        return Rank1BNN(net, priors, likelihood, self.members, self.member_likelihood, self.weight_decay,
                        factored_layers(net, self))
