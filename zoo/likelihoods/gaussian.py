"""Gaussian likelihoods for regression: one noise (fixed, or a latent under a LogNormal prior), or a noise the net
predicts for every input (heteroscedastic)."""

from __future__ import annotations

import math
from typing import Annotated, Literal

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pydantic import AfterValidator, Field, PositiveFloat
from torch.distributions import constraints

from zoo.likelihoods.base import Likelihood, LikelihoodSection, PredictiveDraws
from zoo.parts import Strict
from zoo.sites import LatentSite

# Where a fit stepped by Adam (SVI; Laplace's MAP phase) starts a learned noise sigma, in standardised target units,
# when its validation rows set the predictive's sigma afterwards: small, so the data term leads the first steps and
# sigma then grows to what the residuals ask. Started at the noise prior's median (0.37), a low-noise set's fit
# explained its rows as noise while the KL widened the weights (UCI energy: mean-field RMSE 0.88 against the plain
# net's 0.59, 0.59 from 0.01). A low start also lets a mean fit its rows closer than their noise (the 1-D toy: the
# MAP's RMSE 0.34 -> 0.63), so the fit runs the prior's median as well and keeps the start its validation rows
# score better (Gaussian.open_start); docs/results/defaults.md
LOW_NOISE_START = 0.01


class Gaussian(Likelihood):
    """Homoscedastic Gaussian likelihood; the noise is fixed, or a latent ``noise_scale`` under a LogNormal prior.

    Everything here is in standardised target units: a fixed noise given in original units is divided by the
    training targets' standard deviation before it gets here.

    :param noise: the fixed noise sigma, or None to learn it.
    :param prior_loc: mean of log sigma under its prior (learned noise).
    :param prior_scale: standard deviation of log sigma under its prior.
    :param init: where a fit starts sigma (None: the prior's median, ``exp(prior_loc)``).
    :param open_init: whether ``init`` is the inference method's start, which the spec left open: a fit with
        calibration rows then also runs the prior's median and keeps the start they score better (:meth:`open_start`).
    """

    task = "regression"
    gaussian = True
    noise_site = "noise_scale"

    def __init__(self, noise: float | None, prior_loc: float = -1.0, prior_scale: float = 1.0,
                 init: float | None = None, open_init: bool = False) -> None:
        self.fixed_noise = noise
        self.prior_loc, self.prior_scale = prior_loc, prior_scale
        self.init = init
        # the method's start, which the fit weighs against the prior's median (open_start); None: no choice
        self.method_start = init if open_init and init is not None and noise is None else None

    def net_outputs(self, targets: int) -> int:
        """The net's output width: the mean of the one target.

        :param targets: the data's output width (1).
        :returns: 1.
        """
        return 1

    def _noise_prior(self, like: torch.Tensor) -> dist.LogNormal:
        return dist.LogNormal(like.new_tensor(self.prior_loc), like.new_tensor(self.prior_scale))

    def latent_sites(self) -> dict[str, LatentSite]:
        """The learned noise scale, initialised at ``init`` (or its prior median).

        :returns: ``{noise_scale: ...}``, or nothing for a fixed noise.
        """
        if self.fixed_noise is not None:
            return {}
        init = torch.tensor(self.prior_median if self.init is None else self.init)
        return {self.noise_site: LatentSite(torch.Size(), init, constraints.positive)}

    def open_start(self) -> tuple[str, str, float, tuple[float, ...]] | None:
        """The learned sigma's start where the inference method set it and the spec left it open: the method's start
        or the prior's median, whichever the fit's calibration rows score better.

        :returns: ``("likelihood.noise_prior.init", "noise_scale", the method's start (the one held until the
            choice), (the method's, the median))``, or None.
        """
        if self.method_start is None:
            return None
        return ("likelihood.noise_prior.init", self.noise_site, float(self.method_start),
                (float(self.method_start), self.prior_median))

    @property
    def prior_median(self) -> float:
        """The noise prior's median, ``exp(prior_loc)``: where sigma starts unless told otherwise."""
        return math.exp(self.prior_loc)

    def sample_latents(self, like: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Sample the noise scale (if learned) outside the data plate.

        :param like: a tensor on the model's device and dtype.
        :returns: ``{noise_scale: sigma}``, or nothing for a fixed noise.
        """
        if self.fixed_noise is not None:
            return {}
        like = like if like is not None else torch.zeros(())
        return {self.noise_site: pyro.sample(self.noise_site, self._noise_prior(like))}

    def _scale(self, latents: dict[str, torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        if self.fixed_noise is not None:
            return like.new_tensor(self.fixed_noise)
        return latents[self.noise_site]

    def component(self, out: torch.Tensor, latents: dict[str, torch.Tensor]) -> dist.TorchDistribution:
        """p(y | f(x)) for net outputs ``out [..., 1]`` (the mean): batch shape ``out.shape[:-1]``.

        :param out: the predicted means.
        :param latents: the learned noise (if any).
        :returns: the Normal.
        """
        return dist.Normal(out[..., 0], self._scale(latents, out))

    def predictive(self, out: torch.Tensor, draws: dict[str, torch.Tensor]) -> PredictiveDraws:
        """Per-draw Gaussian predictive from outputs ``[S, B, 1]`` and noise draws ``[S]``: each draw with its own
        noise, or every draw with the fixed noise or the :attr:`predictive_noise` set on calibration rows.

        :param out: the predicted means.
        :param draws: the draws (the learned noise among them).
        :returns: ``loc`` and ``scale``.
        """
        loc = out[..., 0]
        one_noise = self.fixed_noise if self.fixed_noise is not None else self.predictive_noise
        if one_noise is not None:
            scale = loc.new_tensor(one_noise).expand_as(loc)
        else:
            scale = draws[self.noise_site].reshape(-1, 1).expand_as(loc)
        return PredictiveDraws(loc=loc, scale=scale)

    def output_hessian_root(self, f: torch.Tensor, noise: torch.Tensor | float | None) -> torch.Tensor:
        batch, outputs = f.shape
        eye = torch.eye(outputs, dtype=f.dtype, device=f.device)
        return (eye / noise).expand(batch, outputs, outputs)

    def output_gradient_root(self, f: torch.Tensor, y: torch.Tensor,
                             noise: torch.Tensor | float | None) -> torch.Tensor:
        return ((f - y.reshape(f.shape)) / noise**2).unsqueeze(1)

    def noise(self, values: dict[str, torch.Tensor]) -> torch.Tensor | float | None:
        return self.fixed_noise if self.fixed_noise is not None else values[self.noise_site]


class HeteroscedasticGaussian(Likelihood):
    """Gaussian likelihood whose mean and noise both come from the net: ``sigma(x) = softplus(raw(x)) + min_noise``.

    The net has two outputs per input, the mean and a raw scale (Nix & Weigend 1994; the members of deep ensembles,
    Lakshminarayanan et al. 2017). ``min_noise`` (standardised target units) keeps the density bounded where the net
    would drive sigma to 0 on a training point. No latent variable of its own.

    :param min_noise: the floor of sigma(x), in standardised target units.
    """

    task = "regression"

    def __init__(self, min_noise: float = 1e-3) -> None:
        self.min_noise = min_noise

    def net_outputs(self, targets: int) -> int:
        """The net's output width: the mean and the raw scale of the one target.

        :param targets: the data's output width (1).
        :returns: 2.
        """
        return 2

    def scale(self, out: torch.Tensor) -> torch.Tensor:
        """sigma(x) from outputs ``[..., 2]``.

        :param out: the net's outputs.
        :returns: the noise of every input.
        """
        return F.softplus(out[..., 1]) + self.min_noise

    def component(self, out: torch.Tensor, latents: dict[str, torch.Tensor]) -> dist.TorchDistribution:
        """p(y | f(x)) = N(out[..., 0], sigma(x)): batch shape ``out.shape[:-1]``.

        :param out: the net's outputs.
        :param latents: unused (it has none).
        :returns: the Normal.
        """
        return dist.Normal(out[..., 0], self.scale(out))

    def predictive(self, out: torch.Tensor, draws: dict[str, torch.Tensor]) -> PredictiveDraws:
        """Per-draw Gaussian predictive from outputs ``[S, B, 2]``.

        :param out: the net's outputs.
        :param draws: unused.
        :returns: ``loc`` and ``scale``.
        """
        return PredictiveDraws(loc=out[..., 0], scale=self.scale(out))


def _positive_noise(v: float | str) -> float | str:
    if not isinstance(v, str) and v <= 0:
        raise ValueError(f"a fixed noise must be > 0, got {v}")
    return v


class NoisePrior(Strict):
    """LogNormal(loc, scale) prior on the noise sigma, in standardised target units."""

    loc: float = Field(-1.0, description="mean of log sigma")
    scale: PositiveFloat = Field(1.0, description="standard deviation of log sigma")
    init: PositiveFloat | None = Field(None, description=(
        "where a fit starts sigma; null: the inference method's start (SVI and the MAP phase of Laplace, where the "
        "validation rows set the predictive's sigma: 0.01 and the prior's median, exp(loc), each by a whole run, the "
        "better on those rows kept; elsewhere, and for SWAG, SG-MCMC and MCMC: the prior's median)"),
        json_schema_extra={"task": "regression"})


class GaussianSpec(LikelihoodSection):
    """Gaussian likelihood for regression: a fixed, learned or heteroscedastic (net-predicted) noise."""

    task = "regression"

    name: Literal["gaussian"] = Field(description="gaussian")
    noise: Annotated[float | Literal["learned", "heteroscedastic"], AfterValidator(_positive_noise)] = Field(
        "learned", description="fixed sigma in ORIGINAL target units, 'learned' (a latent under noise_prior), or "
        "'heteroscedastic' (the net outputs a mean and sigma(x) = softplus(raw) + min_noise for every input)"
    )
    noise_prior: NoisePrior = Field(default_factory=NoisePrior, description=(
        "noise: learned: the LogNormal prior of sigma, in standardised target units"))
    min_noise: PositiveFloat = Field(1e-3, description="heteroscedastic: the floor of sigma(x), in standardised "
                                     "target units (keeps the density bounded)")

    @property
    def noise_from_net(self) -> bool:
        return self.noise == "heteroscedastic"

    def build(self, data, noise_start: float | None = None) -> Likelihood:
        if self.noise == "heteroscedastic":
            return HeteroscedasticGaussian(self.min_noise)
        noise = None if self.noise == "learned" else float(self.noise) / data.y_std
        given = self.noise_prior.init
        return Gaussian(noise, self.noise_prior.loc, self.noise_prior.scale,
                        given if given is not None else noise_start, open_init=given is None)
