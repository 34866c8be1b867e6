"""The categorical likelihood on the net's logits, with a cross-entropy ``log_prob`` and its Gauss-Newton root."""

from __future__ import annotations

from typing import Literal

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pydantic import Field
from torch.distributions.utils import lazy_property

from zoo.likelihoods.base import Likelihood, LikelihoodSection, PredictiveDraws


class LogitsCategorical(dist.Categorical):
    """Categorical over unnormalised logits whose ``log_prob`` is one fused cross-entropy.

    Same distribution as ``dist.Categorical(logits=...)``; the normalised ``logits`` are only computed when
    asked for, so an SVI step's graph holds one node for the likelihood instead of five.

    :param logits: unnormalised logits ``[..., C]``.
    :param validate_args: torch's argument validation.
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
        """The same categorical over a larger batch shape.

        :param batch_shape: the new batch shape.
        :param _instance: torch's instance to fill in; unused, a new distribution is built.
        :returns: the expanded distribution.
        """
        return LogitsCategorical(self.raw_logits.expand(torch.Size(batch_shape) + (self._num_events,)))

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """log p(value) via ``F.cross_entropy`` on the raw logits.

        :param value: class labels.
        :returns: their log-probabilities.
        """
        if self._validate_args:
            self._validate_sample(value)
        shape = torch.broadcast_shapes(value.shape, self.batch_shape)
        logits = self.raw_logits.expand(shape + (self._num_events,))
        flat = F.cross_entropy(logits.reshape(-1, self._num_events), value.expand(shape).reshape(-1).long(),
                               reduction="none")
        return -flat.reshape(shape)


def categorical_hessian_root(logits: torch.Tensor) -> torch.Tensor:
    """R ``[B, C, C]`` with RᵀR = diag(p) - p pᵀ, the Hessian of the cross-entropy in the logits (p = softmax).

    :param logits: ``[B, C]``.
    :returns: the roots.
    """
    p = logits.softmax(-1)
    sqrt_p = p.sqrt()
    return torch.diag_embed(sqrt_p) - sqrt_p.unsqueeze(-1) * p.unsqueeze(-2)


class Categorical(Likelihood):
    """Categorical likelihood on the net's logits."""

    task = "classification"

    def net_outputs(self, targets: int) -> int:
        """The net's output width for ``targets`` classes: one logit per class.

        :param targets: classes.
        :returns: logits per input.
        """
        return targets

    def component(self, out: torch.Tensor, latents: dict[str, torch.Tensor]) -> dist.TorchDistribution:
        """p(y | f(x)) for net outputs ``out [..., C]``: batch shape ``out.shape[:-1]``.

        :param out: logits.
        :param latents: unused (it has none).
        :returns: the categorical.
        """
        return LogitsCategorical(out)

    def predictive(self, out: torch.Tensor, draws: dict[str, torch.Tensor]) -> PredictiveDraws:
        """Per-draw class log-probabilities from logits ``[S, B, C]``.

        :param out: logits.
        :param draws: unused.
        :returns: ``log_probs``.
        """
        return PredictiveDraws(log_probs=F.log_softmax(out, dim=-1))

    def output_hessian_root(self, f: torch.Tensor, noise: torch.Tensor | float | None) -> torch.Tensor:
        return categorical_hessian_root(f)

    def output_gradient_root(self, f: torch.Tensor, y: torch.Tensor,
                             noise: torch.Tensor | float | None) -> torch.Tensor:
        return (f.softmax(-1) - F.one_hot(y.long(), f.shape[-1]).to(f)).unsqueeze(1)


class CategoricalSpec(LikelihoodSection):
    """Categorical likelihood on the net's logits (classification)."""

    task = "classification"

    name: Literal["categorical"] = Field(description="categorical")

    def build(self, data, noise_start: float | None = None) -> Categorical:
        return Categorical()
