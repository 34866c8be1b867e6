"""Rank-1 BNNs (Dusenberry et al. 2020): shared point-estimated weights, distributions only on rank-1 factors.

Member k of layer W uses the weights W ∘ (r_k s_kᵀ), i.e. y = φ(((x ∘ s_k) Wᵀ) ∘ r_k + b_k). The K members run
as one batch: the input is tiled K times and every Linear layer does one matmul for all members (no loop).
The net stays a plain ``nn.Module``: a handler swaps its ``F.linear`` calls for the member-wise version, the
same way local reparameterisation is applied.
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro import poutine
from torch import nn

from zoo.errors import ZooInputError
from zoo.likelihoods import Likelihood, PredictiveDraws, observe
from zoo.models.base import LatentSite
from zoo.priors import prior_distribution
from zoo.spec import ModelSpec, PriorConfig

MEMBERS = "members"


class MemberLinear:
    """Within this context, ``F.linear`` on a registered weight W computes ((x ∘ s) Wᵀ) ∘ r + b for all members.

    ``layers`` maps each weight tensor to its factors ``r [M, out]``, ``s [M, in]`` and biases ``b [M, out]``;
    inputs are ``[M, B, in]`` (the batch tiled once per member).
    """

    def __init__(self, layers: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
        self.layers = layers

    def __enter__(self) -> MemberLinear:
        self._linear = F.linear
        F.linear = self._member_linear
        return self

    def __exit__(self, *exc) -> None:
        F.linear = self._linear

    def _member_linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
        entry = self.layers.get(id(weight))
        if entry is None or entry[0] is not weight:
            return self._linear(x, weight, bias)
        _, r, s, b = entry
        return torch.addcmul(b.unsqueeze(-2), self._linear(x * s.unsqueeze(-2), weight), r.unsqueeze(-2))


class Rank1BNN:
    """Pyro model with point-estimated W and per-member biases, and rank-1 factors ``<layer>.r``, ``<layer>.s``
    as latent sites in a plate of K members (their KL terms are averaged over the members)."""

    def __init__(self, net: nn.Module, priors: dict[str, PriorConfig], likelihood: Likelihood, members: int = 4,
                 member_likelihood: str = "average", weight_decay: float | None = None) -> None:
        self.net, self.likelihood = net, likelihood
        self.members, self.member_likelihood, self.weight_decay = members, member_likelihood, weight_decay
        self.layers = {name: m for name, m in net.named_modules() if isinstance(m, nn.Linear)}
        if not self.layers:
            raise ZooInputError("net", type(net).__name__, "the rank-1 family needs a net with Linear layers")
        self.factor_names = [f"{layer}.{side}" for layer in self.layers for side in ("r", "s")]
        missing = set(self.factor_names) - set(priors)
        if missing:
            raise ValueError(f"no prior for sites {sorted(missing)}")
        self.prior_configs = priors
        self.member_bias = nn.ParameterDict({
            layer.replace(".", "/"): nn.Parameter(
                (m.bias.detach() if m.bias is not None else torch.zeros(m.out_features)).expand(members, -1).clone())
            for layer, m in self.layers.items()
        })
        self._priors: dict[tuple, dict[str, dist.TorchDistribution]] = {}

    @staticmethod
    def prior_sites(net: nn.Module) -> list[str]:
        """The sites the spec's priors are assigned to: ``<layer>.r`` and ``<layer>.s`` for every Linear layer."""
        return [f"{n}.{side}" for n, m in net.named_modules() if isinstance(m, nn.Linear) for side in ("r", "s")]

    @classmethod
    def from_spec(cls, net: nn.Module, priors: dict[str, PriorConfig], likelihood: Likelihood,
                  spec: ModelSpec) -> Rank1BNN:
        """Build from the spec's model section; factor priors must be centred at 1 (factors multiply W)."""
        for site, config in priors.items():
            if getattr(config, "loc", 0.0) != 1.0:
                raise ZooInputError(f"prior for {site}", config.name + (f"(loc={config.loc})" if hasattr(
                    config, "loc") else ""), "rank-1 factors multiply the shared weights: use a normal, cauchy or "
                    "laplace prior centred at 1 (prior.loc: 1.0)")
        return cls(net, priors, likelihood, spec.members, spec.member_likelihood, spec.weight_decay)

    # -- what the guides and inference methods see ------------------------------------------------------
    def latent_sites(self) -> dict[str, LatentSite]:
        """r [K, out] and s [K, in] per layer (in the members plate, initialised at 1), then likelihood latents."""
        sites = {}
        for layer, m in self.layers.items():
            for side, width in (("r", m.out_features), ("s", m.in_features)):
                shape = torch.Size([self.members, width])
                sites[f"{layer}.{side}"] = LatentSite(shape, torch.ones(shape), plate=(MEMBERS, self.members))
        sites.update(self.likelihood.latent_sites())
        return sites

    def point_parameters(self) -> list[nn.Parameter]:
        """The shared weights W of every Linear layer and the per-member biases."""
        return [m.weight for m in self.layers.values()] + list(self.member_bias.values())

    def to(self, device: torch.device | str, dtype: torch.dtype = torch.float32) -> Rank1BNN:
        """Move the net, the member biases and (lazily) the priors."""
        self.net.to(device=device, dtype=dtype)
        self.member_bias.to(device=device, dtype=dtype)
        return self

    def priors(self) -> dict[str, dist.TorchDistribution]:
        """The prior of every factor site: one event per member (the members plate adds the K dim)."""
        ref = next(self.net.parameters())
        key = (ref.device, ref.dtype)
        if key not in self._priors:
            sites = self.latent_sites()
            self._priors[key] = {n: prior_distribution(self.prior_configs[n], sites[n].shape[1:], ref.device,
                                                       ref.dtype) for n in self.factor_names}
        return self._priors[key]

    # -- the Pyro model --------------------------------------------------------------------------------
    def model(self, x: torch.Tensor, y: torch.Tensor | None = None, batch: torch.Tensor | None = None) -> None:
        """Factors per member, then ``y`` observed on rows ``batch`` under the members' mixture or average."""
        if self.weight_decay is not None:
            weight_prior = dist.Normal(0.0, self.weight_decay)
            pyro.factor("weight_prior", sum(weight_prior.log_prob(m.weight).sum() for m in self.layers.values()))
        priors = self.priors()
        with pyro.plate(MEMBERS, self.members, dim=-1), poutine.scale(scale=1.0 / self.members):
            factors = {name: pyro.sample(name, priors[name]) for name in self.factor_names}
        latents = self.likelihood.sample_latents(x)
        with pyro.plate("data", x.shape[0], subsample=batch):
            xb = x if batch is None else x.index_select(0, batch)
            yb = y if (y is None or batch is None) else y.index_select(0, batch)
            out = self.forward_members(factors, [b for b in self.member_bias.values()], xb)
            observe(self.likelihood, out, yb, latents, members=self.member_likelihood)

    def forward_members(self, factors: dict[str, torch.Tensor], biases: list[torch.Tensor],
                        x: torch.Tensor) -> torch.Tensor:
        """Outputs ``[M, B, out]`` of M members with factors ``{site: [M, width]}`` and biases ``[M, out]``."""
        n_members = factors[self.factor_names[0]].shape[0]
        layers = {id(m.weight): (m.weight, factors[f"{name}.r"], factors[f"{name}.s"], bias)
                  for (name, m), bias in zip(self.layers.items(), biases, strict=True)}
        with MemberLinear(layers):
            return self.net(x.expand(n_members, *x.shape))

    def predict(self, draws: dict[str, torch.Tensor], x: torch.Tensor) -> PredictiveDraws:
        """S draws of the K components become S*K predictive draws (the mixture over components and samples)."""
        n_draws = draws[self.factor_names[0]].shape[0]
        flat = {name: draws[name].reshape(-1, *draws[name].shape[2:]) for name in self.factor_names}
        biases = [b.repeat(n_draws, 1) for b in self.member_bias.values()]
        others = {n: v.repeat_interleave(self.members, dim=0) for n, v in draws.items() if n not in flat}
        return self.likelihood.predictive(self.forward_members(flat, biases, x), others)
