"""What every guide is: the :class:`Guide` interface, the spec's :class:`GuideSection` that names a guide and declares
what it needs of a family, and :class:`SiteGuide`, one unconstrained parameter tensor per latent site.

A guide is one module holding its class and its section, registered once in :data:`guides.GUIDES`.
"""

from __future__ import annotations

import math
from abc import ABCMeta, abstractmethod
from collections.abc import Callable
from typing import Annotated, ClassVar, NamedTuple

import pyro
import pyro.distributions as dist
import torch
from pydantic import AfterValidator, Field
from pyro import poutine
from torch import nn
from torch.distributions import biject_to

from zoo.parts import Strict
from zoo.sites import LatentSite

# guide.init_rho bounds. Low: the Normal's density and its KL against a Normal prior use sigma^2 (and
# (sigma / prior scale)^2), which must stay a normal float32 number (>= 1.2e-38, i.e. sigma >= 1.1e-19,
# rho >= -43.6): below it the KL's gradient is -inf (checked: rho -45), below rho -55 sigma^2 is 0 and the KL
# inf, below rho -104 sigma itself is 0 and Pyro refuses the scale. -30 (sigma 9.4e-14) keeps that
# true for prior scales up to ~1e5 and is already a point mass: use guide.name: delta for one. float64 could go
# lower, but gains nothing. High: weights live in standardised units under priors of scale ~1, so an initial
# sigma above ~5 prior scales drowns the means in noise: each layer's pre-activations grow ~sigma sqrt(fan_in),
# and rho 1e6 trained to an RMSE of 1e6. 5 gives sigma 5.007.
INIT_RHO_MIN, INIT_RHO_MAX = -30.0, 5.0


def softplus(rho: float) -> float:
    """log(1 + e^rho) without overflow (the guides' sigma for a given rho).

    :param rho: the unconstrained value.
    :returns: sigma.
    """
    return rho + math.log1p(math.exp(-rho)) if rho > 0 else math.log1p(math.exp(rho))


def _sane_rho(v: float) -> float:
    # inf/NaN reach it (allow_inf_nan on the field), to be refused with the range
    if INIT_RHO_MIN <= v <= INIT_RHO_MAX:
        return v
    if math.isnan(v):
        why = "rho must be a number"
    elif v < INIT_RHO_MIN:
        sigma = softplus(v)
        why = (f"sigma = softplus(rho) = {sigma:.3g}: " + (
            "its square is below float32's smallest normal number (1.2e-38), where the KL's gradient is already "
            "infinite" + (" and sigma itself rounds to 0, a scale Pyro refuses" if sigma < 1.4e-45 else "")
            if sigma < 1.1e-19
            else "so small that (sigma / prior scale)^2 nears float32's underflow; it is a point mass already "
            "(guide.name: delta is one)"))
    else:
        why = (f"sigma = softplus(rho) = {softplus(v):.3g}: an initial spread far wider than a prior of scale ~1 "
               "on standardised weights, which swamps the means")
    raise ValueError(f"{why}; use a rho in [{INIT_RHO_MIN:g}, "
                     f"{INIT_RHO_MAX:g}] (sigma {softplus(INIT_RHO_MIN):.1e} .. {softplus(INIT_RHO_MAX):.3g}), "
                     f"typically -5 (the default, sigma {softplus(-5.0):.4f})")


# Where a softplus-parameterised guide's sigma = softplus(rho) starts, and what a fit with calibration rows chooses
# between where the spec leaves guide.init_rho null (the mean-field guide, Pyro's Gaussian autoguides): -5 (sigma
# 0.0067) keeps mnist5k's conv net at the plain net's NLL, where -8 (sigma 0.00034) loses it, and -8 brings
# twoclass' and the 1-D toy's fits nearer the plain net's (docs/results/defaults.md, "The mean-field guide starts
# as narrow as the validation rows choose").
DEFAULT_INIT_RHO = -5.0
INIT_RHO_CANDIDATES = (DEFAULT_INIT_RHO, -8.0)

Rho = Annotated[float, Field(allow_inf_nan=True), AfterValidator(_sane_rho)]  # a rho checked against the range
InitRho = Annotated[Rho, Field(DEFAULT_INIT_RHO, description=(
    f"initial rho of sigma = softplus(rho), in [{INIT_RHO_MIN:g}, {INIT_RHO_MAX:g}] (sigma "
    f"{softplus(INIT_RHO_MIN):.1e} .. {softplus(INIT_RHO_MAX):.3g}): below, sigma^2 leaves float32's normal range; "
    "above, the initial noise swamps the means"))]
OpenInitRho = Annotated[Rho | None, Field(None, description=(
    f"initial rho of sigma = softplus(rho), in [{INIT_RHO_MIN:g}, {INIT_RHO_MAX:g}]; null: chosen from "
    f"{', '.join(f'{v:g}' for v in INIT_RHO_CANDIDATES)} (sigma "
    f"{', '.join(f'{softplus(v):.2g}' for v in INIT_RHO_CANDIDATES)}; a whole run at each, at the fit's lr) on the "
    "fit's calibration rows where it has them (fit(val=...) or data.calibration_fraction), else "
    f"{DEFAULT_INIT_RHO:g}"))]


class SettingChoice(NamedTuple):
    """A setting a guide's section left null, for the fit to choose on its calibration rows by a whole run at each
    value (:meth:`Guide.open_setting`).

    :ivar name: the spec field (``guide.dropout_rate``).
    :ivar held: the value the guide holds now (until the choice, one of the candidates; after it, the chosen one).
    :ivar candidates: the values the choice runs.
    :ivar beyond: values past the candidates' nearest edge, nearest first, each run only while the value run last at
        that edge scores best: a choice on its grid's edge does not show that its best lies inside the grid.
    """

    name: str
    held: float
    candidates: tuple[float, ...]
    beyond: tuple[float, ...] = ()


class Guide(nn.Module, metaclass=ABCMeta):
    """A guide over a model family's latent sites: what SVI fits, the Posterior draws from, and checkpoints hold.

    The hooks below have defaults for the guides that do not need them; a guide overrides what it has. It has no
    constructor of its own: a subclass's takes the guide's arguments (e.g. :class:`SiteGuide`'s ``sites``).
    """

    init_rho: float | None = None  # the initial rho of a softplus-parameterised guide (read by the NaN diagnosis)
    # the fit may choose its priors' scale on its calibration rows (SVI's prior scale factor): a guide whose draws are
    # point values (a MAP, dropout VI) meets its prior as a weight decay, which the plain-net recipe tunes on held-out
    # rows; a Gaussian guide fits its spread against a prior that can be too narrow for the net (the toy's tanh MLP)
    prior_scale_open: bool = False  # (a guide may set it per instance: an autoguide, by which it is)
    sites: dict[str, LatentSite]  # the family's latent sites it is a guide over

    @abstractmethod
    def forward(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        """Sample every latent site (Pyro's guide call; the model's arguments are passed through).

        :param args: the model's positional arguments (e.g. ``x``, ``y``).
        :param kwargs: the model's keyword arguments.
        :returns: the sampled value of every site.
        """

    @abstractmethod
    def point_estimate(self) -> dict[str, torch.Tensor]:
        """One representative value per site in constrained space.

        :returns: ``{site: value}``.
        """

    @abstractmethod
    def init_from(self, values: dict[str, torch.Tensor]) -> list[str]:
        """Centre the guide at point values (e.g. a MAP fit).

        :param values: ``{site: value}`` in constrained space.
        :returns: the sites whose name and shape matched.
        """

    def locates(self, site: str) -> bool:
        """Whether :meth:`init_from` can move ``site``'s location in place (a fit can then choose where it starts).

        :param site: a latent site of the family.
        :returns: whether the guide has a location for it.
        """
        return site in getattr(self, "sites", {})

    def bind(self, model: Callable, *example: torch.Tensor) -> None:
        """Build what the guide builds from the model itself (Pyro's autoguides trace it); nothing by default.

        :param model: the family's Pyro model.
        :param example: model arguments of a few rows.
        """
        return None

    def finish(self, *args: torch.Tensor) -> str | None:
        """Complete the guide after its fit (the Laplace autoguide's Hessian); nothing by default.

        :param args: the model's arguments on every training row.
        :returns: what it did, for the run's log, or None where it did nothing.
        """
        return None

    def open_setting(self) -> SettingChoice | None:
        """A setting its section left null for the fit to choose on its calibration rows; None where there is none (the
        default).

        :returns: e.g. ``SettingChoice("guide.dropout_rate", 0.1, (0.005, 0.01, 0.05, 0.1), beyond=(0.002, 0.001))``.
        """
        return None

    def take_setting(self, value: float) -> None:
        """Hold ``value`` for the setting :meth:`open_setting` names; the guide's state dict carries it, so that a
        checkpoint keeps what the fit chose.

        :param value: one of its candidates.
        """
        raise NotImplementedError(f"{type(self).__name__} has no setting to choose")

    def signal_to_noise(self) -> dict[str, torch.Tensor] | None:
        """|mu| / sigma per weight, for signal-to-noise pruning (Blundell et al. 2015).

        :returns: per weight site, or None for a guide without per-weight means and scales.
        """
        return None

    @property
    def density_unavailable(self) -> str | None:
        """Why log q cannot be evaluated at given draws, or None where it can (the default)."""
        return None

    def log_density(self, draws: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """log q at S draws where the guide scores them itself (a guide over one joint latent).

        :param draws: ``{site: [S, ...]}``.
        :returns: ``[S]``, or None where the guide's trace scores them site by site (the default).
        """
        return None


class GuideSection(Strict):
    """The spec's ``guide`` section for one guide (``name: Literal[...]``), and what the guide needs of a family.

    The declarations are class-level (or properties of the section's settings); the spec's rules read them.
    """

    needs: ClassVar[frozenset[str]] = frozenset()  # the kinds of latent sites it needs (see zoo.models.base)
    point_estimate: ClassVar[bool] = False  # every draw is one point (fits a family of point estimates only)

    init_from: str | None = Field(None, description="run directory or checkpoint whose weights become the means")

    @property
    def label(self) -> str:
        """How a run names its guide: ``mean_field``; an autoguide adds which (``auto:low_rank_mvn``)."""
        return self.name

    @property
    def chosen_by(self) -> tuple[str, str]:
        """The spec field that picks this guide and its value (for messages): ``("guide.name", "mean_field")``."""
        return "guide.name", self.name

    @property
    def needs_every_row(self) -> bool:
        """Whether completing the guide takes every training row at once on the device (a Hessian over all rows)."""
        return False

    @property
    def dense_matrices(self) -> int:
        """How many D x D matrices over a D-weight vector site the guide (and the method that fits it) keeps at
        once: what a family with a sized weight vector (the subnetwork) checks against memory before its fit."""
        return 0

    @property
    def factored_layers_only(self) -> bool:
        """Whether the guide's covariance covers only layers with input and output factors (Linear, Conv2d: KFAC),
        so that a selection of every weight keeps the others at their MAP."""
        return False

    @abstractmethod
    def build(self, sites: dict[str, LatentSite]) -> Guide:
        """The guide over a family's latent sites with this section's settings.

        :param sites: the family's latent sites.
        :returns: the guide.
        """


class ExactDrawMultivariateNormal(dist.MultivariateNormal):
    """N(loc, L Lᵀ) that scores its own reparameterised draw from the noise that made it, not by solving L.

    The ELBO's Monte Carlo KL needs log q at the draw z = loc + L ε. Solving L for ε again is exact in theory,
    but a trained Cholesky factor can be so ill-conditioned that float32 round-off in z, amplified by L⁻¹,
    swamps the answer: Pyro's AutoMultivariateNormal on bostonHousing reached entries of 4.6e9 in L⁻¹ after
    2,000 steps, the negative ELBO came out between -2.5e8 and -5e5 where float64 gives about 3,400, and the
    run diverged six steps later. Scored from ε the value is log N(ε; 0, I) - log|det L|: the same function of
    the parameters, so the same ELBO and gradient, with no solve. Any other value is scored as usual.

    Its constructor is :class:`torch.distributions.MultivariateNormal`'s: ``loc`` and one of the three matrices,
    each then an attribute.

    :ivar loc: the mean ``[..., D]``.
    :ivar covariance_matrix: the covariance ``[..., D, D]``.
    :ivar precision_matrix: the precision ``[..., D, D]``.
    :ivar scale_tril: the lower Cholesky factor L of the covariance ``[..., D, D]`` (what the guides pass).
    :ivar validate_args: the constructor's switch of torch's argument validation (None: torch's default).
    """

    _draw: tuple[torch.Tensor, torch.Tensor] | None = None  # (the last rsample's value, its standard-normal noise)

    def rsample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:
        # the same draw as torch's rsample (same random stream), keeping its noise
        noise = torch.empty(self._extended_shape(sample_shape), dtype=self.loc.dtype, device=self.loc.device).normal_()
        value = self.loc + (self._unbroadcasted_scale_tril @ noise.unsqueeze(-1)).squeeze(-1)
        self._draw = (value, noise)
        return value

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if self._draw is None or value is not self._draw[0]:
            return super().log_prob(value)
        noise = self._draw[1]
        half_log_det = self._unbroadcasted_scale_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        return -0.5 * (self.event_shape[0] * math.log(2 * math.pi) + noise.pow(2).sum(-1)) - half_log_det


def param_key(site: str) -> str:
    """The key of a site's parameters in a guide's ``nn.ParameterDict``: ``nn.Module`` attribute names may not contain
    dots, and site names (``hidden0.weight``) do.

    :param site: the site's name.
    :returns: the name with every ``.`` written ``/``.
    """
    return site.replace(".", "/")


class SiteGuide(Guide):
    """A guide over a model's latent sites, each sampled from ``self.distribution(name)`` in model order.

    :param sites: the family's latent sites; every site's location starts at its initial value.
    """

    plated_terms = True  # whether sites inside a plate (ensemble members) contribute their KL terms

    def __init__(self, sites: dict[str, LatentSite]) -> None:
        super().__init__()
        self.sites = dict(sites)
        self.loc = nn.ParameterDict(
            {param_key(n): nn.Parameter(biject_to(s.support).inv(s.init.detach().clone())) for n, s in sites.items()}
        )

    def unconstrained_loc(self, name: str) -> torch.Tensor:
        """The location parameter of site ``name`` in unconstrained space.

        :param name: the site.
        :returns: the parameter itself (shaped like the site; writing to it moves the guide).
        """
        return self.loc[param_key(name)]

    def forward(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        """Sample every latent site (the model's arguments are accepted and ignored).

        A site inside a plate (e.g. ensemble members) is sampled in that plate with its terms averaged over it,
        exactly as the model declares it.

        :param args: the model's positional arguments, ignored.
        :param kwargs: the model's keyword arguments, ignored.
        :returns: the sampled value of every site.
        """
        values, plates = {}, {}
        for name, site in self.sites.items():
            if site.plate is None:
                values[name] = pyro.sample(name, self.distribution(name))
                continue
            plate_name, size = site.plate
            if plate_name not in plates:  # one plate object per run: Pyro records its site once
                plates[plate_name] = pyro.plate(plate_name, size, dim=-1)
            with plates[plate_name], poutine.scale(scale=1.0 / size), poutine.mask(mask=self.plated_terms):
                values[name] = pyro.sample(name, self.distribution(name))
        return values

    @abstractmethod
    def distribution(self, name: str) -> pyro.distributions.TorchDistribution:
        """q(site) as a distribution whose event is the whole site.

        :param name: the site.
        :returns: its distribution under the guide.
        """

    def point_estimate(self) -> dict[str, torch.Tensor]:
        """One representative value per site in constrained space (the mean of q in unconstrained space).

        :returns: ``{site: value}``, copies detached from the parameters.
        """
        with torch.no_grad():
            return {n: biject_to(s.support)(self.unconstrained_loc(n)).clone() for n, s in self.sites.items()}

    def init_from(self, values: dict[str, torch.Tensor]) -> list[str]:
        """Set locations from point values (e.g. a MAP fit); a value whose shape differs from its site's is skipped.

        :param values: ``{site: value}`` in constrained space.
        :returns: the sites that were matched.
        """
        matched = []
        with torch.no_grad():
            for name, site in self.sites.items():
                if name in values and values[name].shape == site.shape:
                    self.unconstrained_loc(name).copy_(biject_to(site.support).inv(values[name].to(site.init)))
                    matched.append(name)
        return matched
