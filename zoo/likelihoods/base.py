"""What every likelihood is: the :class:`Likelihood` interface the families call, the spec's
:class:`LikelihoodSection` that names one, and what all of them share (the per-draw predictive, the ``obs`` site
over the data plate, ensemble members' mixture and average)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import pyro
import pyro.distributions as dist
import torch

from zoo.parts import Strict
from zoo.sites import LatentSite

if TYPE_CHECKING:
    from zoo.data.base import Dataset


@dataclass
class PredictiveDraws:
    """Predictive distributions at B inputs, one per posterior draw (S draws).

    Classification: ``log_probs [S, B, C]``. Regression: Gaussian ``loc [S, B]`` and ``scale [S, B]``
    (broadcastable) in standardised target units.

    :param log_probs: class log-probabilities ``[S, B, C]`` (classification).
    :param loc: predictive means ``[S, B]`` (regression).
    :param scale: predictive standard deviations, broadcastable to ``loc`` (regression).
    """

    log_probs: torch.Tensor | None = None
    loc: torch.Tensor | None = None
    scale: torch.Tensor | None = None

    @staticmethod
    def concat(parts: list[PredictiveDraws]) -> PredictiveDraws:
        """Join predictions made on consecutive chunks of the inputs (along the B dim).

        :param parts: the chunks' predictions, in input order.
        :returns: the predictions at every input.
        """

        def cat(field: str) -> torch.Tensor | None:
            values = [getattr(p, field) for p in parts]
            return None if values[0] is None else torch.cat(values, dim=1)

        return PredictiveDraws(log_probs=cat("log_probs"), loc=cat("loc"), scale=cat("scale"))

    def tiled(self, times: int) -> PredictiveDraws:
        """These draws repeated ``times`` times along the draw dim (the predictions of ``times`` copies of the weight
        draws they came from, in the same order); a field broadcast along the draw dim (leading size 1 where the
        others have more) stays as it is.

        :param times: how many copies.
        :returns: the tiled predictions.
        """
        fields = {f: getattr(self, f) for f in ("log_probs", "loc", "scale")}
        draws = max(v.shape[0] for v in fields.values() if v is not None and v.dim() > 0)

        def tile(value: torch.Tensor | None) -> torch.Tensor | None:
            if value is None or value.dim() == 0 or (value.shape[0] == 1 < draws):
                return value
            return value.repeat(times, *[1] * (value.dim() - 1))

        return PredictiveDraws(**{f: tile(v) for f, v in fields.items()})


class Likelihood(ABC):
    """An observation model p(y | f(x)) on the net's outputs f: what the families observe and predict with."""

    task: ClassVar[str]  # the kind of targets it models ("regression", "classification"; see zoo.tasks)
    gaussian: ClassVar[bool] = False  # Gaussian observations of one noise: the linearised evidence is closed-form
    fixed_noise: float | None = None  # a Gaussian likelihood's fixed noise (standardised units); None where learned
    # a learned noise's value for the predictive, set on calibration rows after the fit (zoo.inference.noise_choice;
    # standardised units); None: each draw predicts with its own noise, as the fit left it
    predictive_noise: float | None = None

    @property
    def learns_noise(self) -> bool:
        """Whether the observation noise is one learned latent (a homoscedastic Gaussian with no fixed sigma)."""
        return self.gaussian and self.fixed_noise is None

    @abstractmethod
    def net_outputs(self, targets: int) -> int:
        """The net's output width for ``targets`` (classes, or 1 for a scalar target).

        :param targets: the data's output width.
        :returns: outputs per input.
        """

    def latent_sites(self) -> dict[str, LatentSite]:
        """Its own latent variables (a learned noise scale); none by default.

        :returns: the sites by name.
        """
        return {}

    def sample_latents(self, like: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Sample its own latents in the model (outside the data plate); nothing by default.

        :param like: a tensor on the model's device and dtype.
        :returns: the sampled values by site.
        """
        return {}

    @abstractmethod
    def component(self, out: torch.Tensor, latents: dict[str, torch.Tensor]) -> dist.TorchDistribution:
        """p(y | f(x)) for net outputs ``out [..., O]``.

        :param out: the net's outputs.
        :param latents: its own latents' values, broadcastable against ``out.shape[:-1]``.
        :returns: a distribution with batch shape ``out.shape[:-1]``.
        """

    @abstractmethod
    def predictive(self, out: torch.Tensor, draws: dict[str, torch.Tensor]) -> PredictiveDraws:
        """Per-draw predictive distributions from outputs ``[S, B, O]``.

        :param out: the net's outputs under S draws.
        :param draws: the draws (its own latents among them).
        :returns: the predictive of every draw at every input.
        """

    def output_hessian_root(self, f: torch.Tensor, noise: torch.Tensor | float | None) -> torch.Tensor:
        """R ``[B, O, O]`` with RᵀR the Hessian of -log p(y | f) in f, so that the GGN is Σ_b (R_b J_b)ᵀ (R_b J_b).

        :param f: outputs ``[B, O]``.
        :param noise: a Gaussian likelihood's noise sigma (None otherwise).
        :returns: the roots.
        :raises NotImplementedError: a likelihood without a GGN (the default).
        """
        raise NotImplementedError(f"{type(self).__name__} has no Gauss-Newton curvature")

    def output_gradient_root(self, f: torch.Tensor, y: torch.Tensor,
                             noise: torch.Tensor | float | None) -> torch.Tensor:
        """R ``[B, 1, O]``, each row's gradient of -log p(y | f) in f as a one-row root, so that
        Σ_b (R_b J_b)ᵀ (R_b J_b) is the empirical Fisher (the GGN's stand-in that needs no second derivative).

        :param f: outputs ``[B, O]``.
        :param y: targets ``[B]``.
        :param noise: a Gaussian likelihood's noise sigma (None otherwise).
        :returns: the roots.
        :raises NotImplementedError: a likelihood without one (the default).
        """
        raise NotImplementedError(f"{type(self).__name__} has no empirical Fisher")

    def noise(self, values: dict[str, torch.Tensor]) -> torch.Tensor | float | None:
        """The observation noise sigma at given values of its latents: fixed, learned, or None where it has none.

        :param values: point values of its latents (e.g. a MAP's).
        :returns: sigma in standardised units, or None.
        """
        return None

    def open_start(self) -> tuple[str, str, float, tuple[float, ...]] | None:
        """A latent site whose starting value the spec left for the fit to choose on its calibration rows: the spec
        field, the site, the start it holds now and the candidates; None where there is none (the default).

        :returns: e.g. ``("likelihood.noise_prior.init", "noise_scale", 0.01, (0.01, 0.368))``.
        """
        return None


class LikelihoodSection(Strict):
    """The spec's ``likelihood`` section for one likelihood (``name: Literal[...]``)."""

    task: ClassVar[str]  # the task whose data it models (see zoo.tasks)

    @property
    def noise_from_net(self) -> bool:
        """Whether the net predicts the noise for every input (two outputs per target)."""
        return False

    @abstractmethod
    def build(self, data: Dataset, noise_start: float | None = None) -> Likelihood:
        """The likelihood for ``data`` with this section's settings.

        :param data: the data set (its target scale turns settings in original units into standardised ones).
        :param noise_start: where the inference method starts a learned noise that the section leaves open
            (:attr:`zoo.inference.base.InferenceMethod.noise_start`; None: the noise prior's median). Given one, the
            fit also tries the prior's median and keeps the better start on its calibration rows
            (:meth:`Likelihood.open_start`).
        :returns: the likelihood.
        """


class MemberAverage(dist.TorchDistribution):
    """Average over ensemble members of log p(y | w_k): the `average` objective of rank-1 BNNs.

    ``members`` has batch shape ``[..., K]``; ``log_prob(y)`` is (1/K) sum_k log p_k(y). It is a training
    objective, not a normalised density; its samples are those of the uniform mixture of the members.

    :param members: the members' distributions, batch shape ``[..., K]``.
    """

    arg_constraints: dict = {}

    def __init__(self, members: dist.TorchDistribution) -> None:
        self.members = members
        super().__init__(members.batch_shape[:-1], members.event_shape)

    @property
    def support(self):
        return self.members.support

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """Mean over members of the members' log densities.

        :param value: targets of the batch shape.
        :returns: the objective per target.
        """
        return self.members.log_prob(value.unsqueeze(-1)).mean(-1)

    def sample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:
        """A draw of a uniformly chosen member.

        :param sample_shape: leading dimensions of the draws.
        :returns: the draws.
        """
        with torch.no_grad():
            draws = self.members.sample(sample_shape)  # [..., K]
            pick = torch.randint(draws.shape[-1], draws.shape[:-1] + (1,), device=draws.device)
            return draws.gather(-1, pick).squeeze(-1)


def uniform_member_mixture(members: dist.TorchDistribution, like: torch.Tensor) -> dist.MixtureSameFamily:
    """(1/K) sum_k p_k(y) over the last batch dim of ``members``: the `mixture` objective of rank-1 BNNs.

    :param members: the members' distributions, batch shape ``[..., K]``.
    :param like: a tensor on the device and dtype of the mixture weights.
    :returns: the mixture.
    """
    logits = torch.zeros(members.batch_shape, device=like.device, dtype=like.dtype)
    return dist.MixtureSameFamily(dist.Categorical(logits=logits), members)


def observation(likelihood: Likelihood, out: torch.Tensor, latents: dict[str, torch.Tensor],
                members: str | None = None) -> dist.TorchDistribution:
    """p(y | outputs) as the model observes it, for outputs ``out [..., B, O]`` or, with members, ``[..., K, B, O]``.

    Leading dims (e.g. S posterior draws) pass through, so the model's ``obs`` site and the pointwise
    log-likelihood of many draws share this one definition; latents must broadcast against the batch shape
    (scalars in the model, ``[S, 1]`` / ``[S, 1, 1]`` for S draws).

    :param likelihood: the observation model.
    :param out: the net's outputs.
    :param latents: the likelihood's own latents.
    :param members: None (one net), ``"mixture"`` (log of the members' average likelihood) or ``"average"``
        (average of the members' log-likelihoods).
    :returns: the distribution of the targets.
    """
    out = out.to(torch.promote_types(out.dtype, torch.float32))  # a bf16 net (autocast): the density in float32
    if members is None:
        return likelihood.component(out, latents)
    per_member = likelihood.component(out.movedim(-3, -2), latents)  # batch [..., B, K]
    return uniform_member_mixture(per_member, out) if members == "mixture" else MemberAverage(per_member)


def observe(likelihood: Likelihood, out: torch.Tensor, y: torch.Tensor | None,
            latents: dict[str, torch.Tensor], members: str | None = None) -> None:
    """The ``obs`` site, inside the data plate: :func:`observation` of ``out`` with value ``y``.

    :param likelihood: the observation model.
    :param out: the net's outputs on the plate's rows.
    :param y: their targets (None: sampled).
    :param latents: the likelihood's own latents.
    :param members: as for :func:`observation`.
    """
    pyro.sample("obs", observation(likelihood, out, latents, members), obs=y)


def observe_rows(likelihood: Likelihood, x: torch.Tensor, y: torch.Tensor | None, batch: torch.Tensor | None,
                 outputs: Callable[[torch.Tensor], torch.Tensor], members: str | None = None) -> None:
    """The end of every family's model: the likelihood's own latents, then the data plate over all ``len(x)`` rows
    with ``y`` observed on rows ``batch`` (all when None), scaled up to all rows by Pyro's subsampling.

    :param likelihood: the observation model.
    :param x: the inputs ``[N, D]``.
    :param y: the targets ``[N]`` (None: sampled).
    :param batch: the rows observed (None: all).
    :param outputs: maps the selected rows' inputs to the net's outputs (``[B, O]``, or ``[K, B, O]`` with members).
    :param members: as for :func:`observation`.
    """
    # the likelihood's latents in the run's floating-point type (inputs may be integers: tokens)
    latents = likelihood.sample_latents(x if x.is_floating_point() else
                                        torch.zeros((), device=x.device, dtype=torch.get_default_dtype()))
    with pyro.plate("data", x.shape[0], subsample=batch):
        # index_select, not x[batch]: advanced indexing is ~100x slower on multi-threaded CPU torch
        xb = x if batch is None else x.index_select(0, batch)
        yb = y if (y is None or batch is None) else y.index_select(0, batch)
        observe(likelihood, outputs(xb), yb, latents, members)


def draw_latents(likelihood: Likelihood, draws: dict[str, torch.Tensor], trailing: int) -> dict[str, torch.Tensor]:
    """The likelihood's own latents from S draws ``{site: [S]}``, shaped ``[S, 1 * trailing]`` to broadcast.

    :param likelihood: the observation model.
    :param draws: S joint draws.
    :param trailing: dims to broadcast over.
    :returns: the reshaped latents.
    """
    return {n: draws[n].reshape(-1, *([1] * trailing)) for n in likelihood.latent_sites()}
