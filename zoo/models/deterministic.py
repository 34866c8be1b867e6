"""Deep ensembles (Lakshminarayanan et al. 2017): K independently initialised copies of a deterministic net.

Every parameter of the net becomes one latent site holding all K members' values (``[K, *shape]``, in a plate of
K members), so the family is an ordinary Pyro model that the Delta guide fits by MAP: each member under the
spec's prior (weight decay) and its own likelihood. The K nets of an MLP run as one vectorised computation
(``torch.func.vmap`` of ``functional_call`` over the stacked member parameters: one batched matmul per layer). The
members of a convolutional net run one after another: vmap turns their convolutions into one grouped convolution,
which on the CPU cost more than K plain ones (ResNet-20, K = 4, B = 128, one thread: a step of 2.6 s against 1.9 s
eager, and Inductor compiled the vmapped BatchNorm into code slower still, 4.1 s against 1.7 s).
"""

from __future__ import annotations

import copy
from typing import Literal

import pyro
import pyro.distributions as dist
import torch
from pydantic import Field, PositiveInt
from pyro import poutine
from torch import nn
from torch.func import functional_call, vmap

from zoo.likelihoods import Likelihood, PredictiveDraws, draw_latents, observation, observe_rows
from zoo.models.base import FamilySection, ModelFamily, WidensPriors, per_device
from zoo.nets import has_batch_norm, has_convolutions, prediction_mode, reinitialise, run_batched
from zoo.priors import PriorSection, prior_distribution
from zoo.sites import WEIGHT_MATRICES, LatentSite

MEMBERS = "members"
MEMBER_LIKELIHOOD = "average"  # each member fits its own likelihood: the model averages the members' log p(y | w_k)


def member_inits(net: nn.Module, members: int) -> dict[str, torch.Tensor]:
    """K fresh initialisations of ``net``'s parameters, each drawn by the layers' own ``reset_parameters`` from
    torch's global generator (seeded by the pipeline), so members start apart.

    :param net: the deterministic net (left as it is: a copy is reset).
    :param members: K.
    :returns: ``{name: [K, *shape]}``.
    """
    draws: dict[str, list[torch.Tensor]] = {name: [] for name, _ in net.named_parameters()}
    fresh = copy.deepcopy(net)
    for _ in range(members):
        reinitialise(fresh)
        for name, p in fresh.named_parameters():
            draws[name].append(p.detach().clone())
    return {name: torch.stack(values) for name, values in draws.items()}


class DeepEnsemble(WidensPriors, ModelFamily):
    """Deep ensemble: K copies of the net's parameters as latent sites in a members plate, each under the prior.

    With the Delta guide the ELBO is (1/K) sum_k [log p(y | w_k) + log p(w_k)] (plus the likelihood's own
    latents): K independent MAP problems, each member's gradient that of its own problem scaled by 1/K. A learned
    Gaussian noise scale is one site shared by the members. Predictions are the uniform mixture over members.

    :param net: the deterministic net, copied K times.
    :param priors: the prior of every parameter, by name (each member's own).
    :param likelihood: the observation model.
    :param members: K.
    """

    def __init__(self, net: nn.Module, priors: dict[str, PriorSection], likelihood: Likelihood,
                 members: int = 5) -> None:
        if members < 1:
            raise ValueError(f"a deep ensemble needs at least one member, got {members}")
        self.net, self.likelihood, self.members = net, likelihood, members
        self.weight_names = [name for name, _ in net.named_parameters()]
        missing = set(self.weight_names) - set(priors)
        if missing:
            raise ValueError(f"no prior for sites {sorted(missing)}")
        self.prior_configs = priors
        self.init = member_inits(net, members)
        # each member's own BatchNorm running statistics [K, *shape], updated in place by that member's pass
        self.member_buffers = {name: b.detach().expand(members, *b.shape).clone() for name, b in net.named_buffers()}
        self.batch_norm = has_batch_norm(net)  # fit in training mode, predict in eval mode (running statistics)
        self.one_member_at_a_time = has_convolutions(net)  # see the module docstring
        self._priors: dict[tuple, dict[str, dist.TorchDistribution]] = {}

    @staticmethod
    def prior_sites(net: nn.Module) -> list[str]:
        """The sites the spec's priors are assigned to: every parameter of the net (shared by the members).

        :param net: the deterministic net.
        :returns: its parameter names.
        """
        return [name for name, _ in net.named_parameters()]

    # -- what the guides and inference methods see ------------------------------------------------------
    def latent_sites(self) -> dict[str, LatentSite]:
        """One site per net parameter, ``[K, *shape]`` in the members plate (each member's own random init),
        then the likelihood's latents."""
        sites = {name: LatentSite(value.shape, value.clone(), plate=(MEMBERS, self.members))
                 for name, value in self.init.items()}
        sites.update(self.likelihood.latent_sites())
        return sites

    def point_parameters(self) -> list[nn.Parameter]:
        """Parameters fitted beside the guide: none, every member's weights are sites of the model."""
        return []

    def buffers(self) -> list[torch.Tensor]:
        """Every member's BatchNorm running statistics ``[K, *shape]`` (saved with checkpoints)."""
        return list(self.member_buffers.values())

    def to(self, device: torch.device | str, dtype: torch.dtype = torch.float32) -> DeepEnsemble:
        """Move the template net, the members' initial values and (lazily) the priors."""
        self.net.to(device=device, dtype=dtype)
        self.init = {name: value.to(device=device, dtype=dtype) for name, value in self.init.items()}
        self.member_buffers = {name: value.to(device=device, dtype=dtype if value.is_floating_point() else None)
                               for name, value in self.member_buffers.items()}
        return self

    def priors(self) -> dict[str, dist.TorchDistribution]:
        """One member's prior of every parameter, expanded over the K members (built once per device/dtype)."""

        def build(device: torch.device, dtype: torch.dtype) -> dict[str, dist.TorchDistribution]:
            return {n: prior_distribution(self.prior_configs[n], p.shape, device, dtype).expand(
                torch.Size([self.members])) for n, p in self.net.named_parameters()}

        return per_device(self._priors, next(self.net.parameters()), build)

    # -- the Pyro model --------------------------------------------------------------------------------
    def model(self, x: torch.Tensor, y: torch.Tensor | None = None, batch: torch.Tensor | None = None) -> None:
        """Every member's weights under the prior, then ``y`` on rows ``batch`` under the members' average
        log-likelihood (scaled up to all ``len(x)`` rows)."""
        priors = self.priors()
        with pyro.plate(MEMBERS, self.members, dim=-1), poutine.scale(scale=1.0 / self.members):
            weights = {name: pyro.sample(name, priors[name]) for name in self.weight_names}
        observe_rows(self.likelihood, x, y, batch, lambda rows: self.forward_members(weights, rows),
                     members=MEMBER_LIKELIHOOD)

    def forward_members(self, weights: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """Outputs ``[M, B, out]`` of M nets whose parameters are stacked ``{name: [M, *shape]}``: one vmap for an
        MLP, one member after another for a convolutional net (module docstring).

        Each member reads (in eval mode) or updates (in training mode) its own running statistics; M may be a
        multiple of K (S draws of the K members, draw-major), which then reuse the K members' statistics.
        """
        state = {n: weights[n] for n in self.weight_names}
        n_nets = next(iter(state.values())).shape[0]

        def one_at_a_time() -> torch.Tensor:
            # member m's statistics are those of member m mod K: views, so training updates them in place
            return torch.stack([functional_call(self.net, {**{n: v[m] for n, v in state.items()},
                                                           **{n: b[m % self.members]
                                                              for n, b in self.member_buffers.items()}}, (x,))
                                for m in range(n_nets)])

        if self.one_member_at_a_time:
            return one_at_a_time()
        batched = dict(state)
        if self.member_buffers:
            copies = n_nets // self.members
            # the buffers themselves when M == K (training updates them in place), else repeated read-only copies
            batched.update({n: b if copies == 1 else b.repeat(copies, *[1] * (b.dim() - 1))
                            for n, b in self.member_buffers.items()})
        # a net vmap cannot batch (a GRU, an LSTM) runs its members one after another
        return run_batched(self.net, lambda: vmap(lambda w: functional_call(self.net, w, (x,)))(batched),
                           one_at_a_time)

    def _member_draws(self, draws: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """S draws of every site as S*K member values (draw-major); unplated sites repeated K times."""
        return {n: v.flatten(0, 1) if n in self.init else v.repeat_interleave(self.members, dim=0)
                for n, v in draws.items()}

    def predict(self, draws: dict[str, torch.Tensor], x: torch.Tensor) -> PredictiveDraws:
        """S draws of the K members become S*K predictive draws: the uniform mixture over members (and draws)."""
        members = self._member_draws(draws)
        with prediction_mode(self.net, self.batch_norm):
            return self.likelihood.predictive(self.forward_members(members, x), members)

    def log_likelihood(self, draws: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Pointwise log-density of the model's ``obs`` site (the members' average log-likelihood): ``[S, B]``."""
        with prediction_mode(self.net, self.batch_norm):
            out = self.forward_members(self._member_draws(draws), x).unflatten(0, (-1, self.members))  # [S, K, B, O]
        return observation(self.likelihood, out, draw_latents(self.likelihood, draws, 2),
                           MEMBER_LIKELIHOOD).log_prob(y)


class DeepEnsembleModelSpec(FamilySection):
    """Deep ensemble: K independently initialised copies of the net, each a MAP fit under the prior."""

    offers = frozenset({WEIGHT_MATRICES})
    point_estimates_only = True  # K MAP fits: a distribution over each member would be another member
    supports_autocast = False  # measured on torch 2.13: under vmap, a linear layer with a bias stays float32

    family: Literal["deep_ensemble"] = Field(description="deep_ensemble: K independent MAP nets")
    members: PositiveInt = Field(5, description="ensemble members K (each a full copy of the net)")

    def prior_sites(self, net: nn.Module) -> list[str]:
        return DeepEnsemble.prior_sites(net)

    def build(self, net: nn.Module, priors: dict[str, PriorSection], likelihood: Likelihood) -> DeepEnsemble:
        return DeepEnsemble(net, priors, likelihood, self.members)
