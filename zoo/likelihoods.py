"""Observation models p(y | f(x)) and the per-draw predictive distributions they induce."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from torch.distributions import constraints
from torch.distributions.utils import lazy_property

from zoo.sites import LatentSite


@dataclass
class PredictiveDraws:
    """Predictive distributions at B inputs, one per posterior draw (S draws).

    Classification: ``log_probs [S, B, C]``. Regression: Gaussian ``loc [S, B]`` and ``scale [S, B]``
    (broadcastable) in standardised target units.
    """

    log_probs: torch.Tensor | None = None
    loc: torch.Tensor | None = None
    scale: torch.Tensor | None = None

    @staticmethod
    def concat(parts: list[PredictiveDraws]) -> PredictiveDraws:
        """Join predictions made on consecutive chunks of the inputs (along the B dim)."""

        def cat(field: str) -> torch.Tensor | None:
            values = [getattr(p, field) for p in parts]
            return None if values[0] is None else torch.cat(values, dim=1)

        return PredictiveDraws(log_probs=cat("log_probs"), loc=cat("loc"), scale=cat("scale"))


class LogitsCategorical(dist.Categorical):
    """Categorical over unnormalised logits whose ``log_prob`` is one fused cross-entropy.

    Same distribution as ``dist.Categorical(logits=...)``; the normalised ``logits`` are only computed when
    asked for, so an SVI step's graph holds one node for the likelihood instead of five.
    """

    def __init__(self, logits: torch.Tensor, validate_args: bool | None = None) -> None:
        self.raw_logits = logits
        self._param = logits
        self._num_events = logits.shape[-1]
        torch.distributions.Distribution.__init__(self, logits.shape[:-1], validate_args=validate_args)

    @lazy_property
    def logits(self) -> torch.Tensor:
        """Normalised log-probabilities."""
        return self.raw_logits - self.raw_logits.logsumexp(dim=-1, keepdim=True)

    def expand(self, batch_shape: torch.Size, _instance=None) -> LogitsCategorical:
        """The same categorical over a larger batch shape."""
        return LogitsCategorical(self.raw_logits.expand(torch.Size(batch_shape) + (self._num_events,)))

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """log p(value) via ``F.cross_entropy`` on the raw logits."""
        if self._validate_args:
            self._validate_sample(value)
        shape = torch.broadcast_shapes(value.shape, self.batch_shape)
        logits = self.raw_logits.expand(shape + (self._num_events,))
        flat = F.cross_entropy(logits.reshape(-1, self._num_events), value.expand(shape).reshape(-1).long(),
                               reduction="none")
        return -flat.reshape(shape)


class Categorical:
    """Categorical likelihood on the net's logits."""

    task = "classification"

    def net_outputs(self, targets: int) -> int:
        """The net's output width for ``targets`` classes: one logit per class."""
        return targets

    def latent_sites(self) -> dict[str, LatentSite]:
        """No latent variables of its own."""
        return {}

    def sample_latents(self, like: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Nothing to sample."""
        return {}

    def component(self, out: torch.Tensor, latents: dict[str, torch.Tensor]) -> dist.TorchDistribution:
        """p(y | f(x)) for net outputs ``out [..., C]``: batch shape ``out.shape[:-1]``."""
        return LogitsCategorical(out)

    def predictive(self, out: torch.Tensor, draws: dict[str, torch.Tensor]) -> PredictiveDraws:
        """Per-draw class log-probabilities from logits ``[S, B, C]``."""
        return PredictiveDraws(log_probs=F.log_softmax(out, dim=-1))


class Gaussian:
    """Homoscedastic Gaussian likelihood; the noise is fixed, or a latent ``noise_scale`` under a LogNormal prior.

    Everything here is in standardised target units: a fixed noise given in original units is divided by the
    training targets' standard deviation before it gets here.
    """

    task = "regression"
    noise_site = "noise_scale"

    def __init__(self, noise: float | None, prior_loc: float = -1.0, prior_scale: float = 1.0) -> None:
        self.fixed_noise = noise
        self.prior_loc, self.prior_scale = prior_loc, prior_scale

    def net_outputs(self, targets: int) -> int:
        """The net's output width: the mean of the one target."""
        return 1

    def _noise_prior(self, like: torch.Tensor) -> dist.LogNormal:
        return dist.LogNormal(like.new_tensor(self.prior_loc), like.new_tensor(self.prior_scale))

    def latent_sites(self) -> dict[str, LatentSite]:
        """The learned noise scale, initialised at its prior median."""
        if self.fixed_noise is not None:
            return {}
        init = torch.tensor(self.prior_loc).exp()
        return {self.noise_site: LatentSite(torch.Size(), init, constraints.positive)}

    def sample_latents(self, like: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Sample the noise scale (if learned) outside the data plate."""
        if self.fixed_noise is not None:
            return {}
        like = like if like is not None else torch.zeros(())
        return {self.noise_site: pyro.sample(self.noise_site, self._noise_prior(like))}

    def _scale(self, latents: dict[str, torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        if self.fixed_noise is not None:
            return like.new_tensor(self.fixed_noise)
        return latents[self.noise_site]

    def component(self, out: torch.Tensor, latents: dict[str, torch.Tensor]) -> dist.TorchDistribution:
        """p(y | f(x)) for net outputs ``out [..., 1]`` (the mean): batch shape ``out.shape[:-1]``."""
        return dist.Normal(out[..., 0], self._scale(latents, out))

    def predictive(self, out: torch.Tensor, draws: dict[str, torch.Tensor]) -> PredictiveDraws:
        """Per-draw Gaussian predictive from outputs ``[S, B, 1]`` and noise draws ``[S]``."""
        loc = out[..., 0]
        if self.fixed_noise is not None:
            scale = loc.new_tensor(self.fixed_noise).expand_as(loc)
        else:
            scale = draws[self.noise_site].reshape(-1, 1).expand_as(loc)
        return PredictiveDraws(loc=loc, scale=scale)


class HeteroscedasticGaussian:
    """Gaussian likelihood whose mean and noise both come from the net: ``sigma(x) = softplus(raw(x)) + min_noise``.

    The net has two outputs per input, the mean and a raw scale (Nix & Weigend 1994; the members of deep ensembles,
    Lakshminarayanan et al. 2017). ``min_noise`` (standardised target units) keeps the density bounded where the net
    would drive sigma to 0 on a training point. No latent variable of its own.
    """

    task = "regression"
    fixed_noise = None

    def __init__(self, min_noise: float = 1e-3) -> None:
        self.min_noise = min_noise

    def net_outputs(self, targets: int) -> int:
        """The net's output width: the mean and the raw scale of the one target."""
        return 2

    def latent_sites(self) -> dict[str, LatentSite]:
        """No latent variables of its own: the noise is an output of the net."""
        return {}

    def sample_latents(self, like: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Nothing to sample."""
        return {}

    def scale(self, out: torch.Tensor) -> torch.Tensor:
        """sigma(x) from outputs ``[..., 2]``."""
        return F.softplus(out[..., 1]) + self.min_noise

    def component(self, out: torch.Tensor, latents: dict[str, torch.Tensor]) -> dist.TorchDistribution:
        """p(y | f(x)) = N(out[..., 0], sigma(x)): batch shape ``out.shape[:-1]``."""
        return dist.Normal(out[..., 0], self.scale(out))

    def predictive(self, out: torch.Tensor, draws: dict[str, torch.Tensor]) -> PredictiveDraws:
        """Per-draw Gaussian predictive from outputs ``[S, B, 2]``."""
        return PredictiveDraws(loc=out[..., 0], scale=self.scale(out))


class MemberAverage(dist.TorchDistribution):
    """Average over ensemble members of log p(y | w_k): the `average` objective of rank-1 BNNs.

    ``members`` has batch shape ``[..., K]``; ``log_prob(y)`` is (1/K) sum_k log p_k(y). It is a training
    objective, not a normalised density; its samples are those of the uniform mixture of the members.
    """

    arg_constraints: dict = {}

    def __init__(self, members: dist.TorchDistribution) -> None:
        self.members = members
        super().__init__(members.batch_shape[:-1], members.event_shape)

    @property
    def support(self):
        return self.members.support

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """Mean over members of the members' log densities."""
        return self.members.log_prob(value.unsqueeze(-1)).mean(-1)

    def sample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:
        """A draw of a uniformly chosen member."""
        with torch.no_grad():
            draws = self.members.sample(sample_shape)  # [..., K]
            pick = torch.randint(draws.shape[-1], draws.shape[:-1] + (1,), device=draws.device)
            return draws.gather(-1, pick).squeeze(-1)


def uniform_member_mixture(members: dist.TorchDistribution, like: torch.Tensor) -> dist.MixtureSameFamily:
    """(1/K) sum_k p_k(y) over the last batch dim of ``members``: the `mixture` objective of rank-1 BNNs."""
    logits = torch.zeros(members.batch_shape, device=like.device, dtype=like.dtype)
    return dist.MixtureSameFamily(dist.Categorical(logits=logits), members)


def observation(likelihood: Likelihood, out: torch.Tensor, latents: dict[str, torch.Tensor],
                members: str | None = None) -> dist.TorchDistribution:
    """p(y | outputs) as the model observes it, for outputs ``out [..., B, O]`` or, with members, ``[..., K, B, O]``.

    ``members`` is None (one net), ``"mixture"`` (log of the members' average likelihood) or ``"average"``
    (average of the members' log-likelihoods). Leading dims (e.g. S posterior draws) pass through, so the
    model's ``obs`` site and the pointwise log-likelihood of many draws share this one definition; latents must
    broadcast against the batch shape (scalars in the model, ``[S, 1]`` / ``[S, 1, 1]`` for S draws).
    """
    out = out.to(torch.promote_types(out.dtype, torch.float32))  # a bf16 net (autocast): the density in float32
    if members is None:
        return likelihood.component(out, latents)
    per_member = likelihood.component(out.movedim(-3, -2), latents)  # batch [..., B, K]
    return uniform_member_mixture(per_member, out) if members == "mixture" else MemberAverage(per_member)


def observe(likelihood: Likelihood, out: torch.Tensor, y: torch.Tensor | None,
            latents: dict[str, torch.Tensor], members: str | None = None) -> None:
    """The ``obs`` site, inside the data plate: :func:`observation` of ``out`` with value ``y``."""
    pyro.sample("obs", observation(likelihood, out, latents, members), obs=y)


def observe_rows(likelihood: Likelihood, x: torch.Tensor, y: torch.Tensor | None, batch: torch.Tensor | None,
                 outputs: Callable[[torch.Tensor], torch.Tensor], members: str | None = None) -> None:
    """The end of every family's model: the likelihood's own latents, then the data plate over all ``len(x)`` rows
    with ``y`` observed on rows ``batch`` (all when None), scaled up to all rows by Pyro's subsampling.
    ``outputs`` maps the selected rows' inputs to the net's outputs (``[B, O]``, or ``[K, B, O]`` with members)."""
    latents = likelihood.sample_latents(x)
    with pyro.plate("data", x.shape[0], subsample=batch):
        # index_select, not x[batch]: advanced indexing is ~100x slower on multi-threaded CPU torch
        xb = x if batch is None else x.index_select(0, batch)
        yb = y if (y is None or batch is None) else y.index_select(0, batch)
        observe(likelihood, outputs(xb), yb, latents, members)


def draw_latents(likelihood: Likelihood, draws: dict[str, torch.Tensor], trailing: int) -> dict[str, torch.Tensor]:
    """The likelihood's own latents from S draws ``{site: [S]}``, shaped ``[S, 1 * trailing]`` to broadcast."""
    return {n: draws[n].reshape(-1, *([1] * trailing)) for n in likelihood.latent_sites()}


Likelihood = Categorical | Gaussian | HeteroscedasticGaussian
LIKELIHOODS = {"categorical": Categorical, "gaussian": Gaussian}
