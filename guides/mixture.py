"""Guides for ensemble families: a K-component mixture over per-member factors, and BatchEnsemble (Diracs).

Component k of the mixture is the factorised distribution of member k's factors, so the mixture runs
vectorised as the members plate of the model; sites outside the plate (e.g. a noise scale) stay mean-field.
Factor means start at random signs ±1 (P(+1) configurable), as in Dusenberry et al. 2020; a hierarchical (gsm)
factor's standardised z at ±init_z, so that its members start apart too (at 1 ± tau init_z).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal

import pyro.distributions as dist
import torch
from pydantic import Field, NonNegativeFloat, PositiveFloat
from torch.distributions import biject_to

from guides.base import GuideSection, InitRho, SettingChoice, SiteGuide, param_key
from guides.mean_field import MeanFieldNormalGuide
from zoo.sites import MEMBER_FACTORS, LatentSite


def _random_signs(sites: dict[str, LatentSite], guide: SiteGuide, prob_plus: float, init_z: float) -> None:
    """Start every member-factor mean at its init times a random sign (+1 with probability ``prob_plus``); a
    standardised site's init is 0, so it starts at ``init_z`` times the sign."""
    with torch.no_grad():
        for name, site in sites.items():
            if site.plate is not None:
                signs = torch.where(torch.rand(site.shape) < prob_plus, 1.0, -1.0)
                start = init_z if site.standardised else site.init
                guide.unconstrained_loc(name).copy_(start * signs)


# the factors' initial spread: Dusenberry et al.'s (their code's sqrt(p / (1 - p)) at p = 0.001), and near the Dirac
# (BatchEnsemble) limit. In the defaults suite's budgets the spread ends about where it starts, moved mostly by the
# optimiser's steps, not settled by the data (the toy: 0.03 stays 0.03; 0.0001 ends at 0.007), so the start is a
# setting the fit keeps; a null init_scale is chosen between them on the fit's calibration rows
# (docs/results/defaults.md)
DEFAULT_INIT_SCALE = 0.03
INIT_SCALE_CANDIDATES = (DEFAULT_INIT_SCALE, 1e-4)


class MixtureGuide(MeanFieldNormalGuide):
    """q(factors) = (1/K) sum_k prod_i q_k(factor_i): one Normal (or Cauchy) component per member.

    :param sites: the family's latent sites; those in the members plate are the components' factors.
    :param component: ``normal`` or ``cauchy``, the family of each component.
    :param init_sign_prob: P(+1) of the factor means' random-sign initialisation.
    :param init_scale: the factors' initial standard deviation; None: left for the fit to choose from
        :data:`INIT_SCALE_CANDIDATES` (:meth:`open_setting`), meanwhile :data:`DEFAULT_INIT_SCALE`.
    :param init_rho: the initial rho of the sites outside the plate.
    :param init_z: where a standardised (gsm) factor's means start, ± by the same random signs.
    """

    def __init__(self, sites: dict[str, LatentSite], component: str = "normal", init_sign_prob: float = 0.5,
                 init_scale: float | None = DEFAULT_INIT_SCALE, init_rho: float = -5.0, init_z: float = 1.0) -> None:
        super().__init__(sites, init_rho=init_rho)
        self.component = component
        self.scale_open = init_scale is None
        _random_signs(sites, self, init_sign_prob, init_z)
        self.take_setting(DEFAULT_INIT_SCALE if init_scale is None else init_scale)

    def open_setting(self) -> SettingChoice | None:
        """The factors' initial spread where the section left it null."""
        return SettingChoice("guide.init_scale", self.init_scale, INIT_SCALE_CANDIDATES) if self.scale_open else None

    def take_setting(self, value: float) -> None:
        """Start every factor's spread at ``value`` (softplus(rho) = value); the means keep their start."""
        self.init_scale = float(value)
        rho = math.log(math.expm1(value))
        with torch.no_grad():
            for name, site in self.sites.items():
                if site.plate is not None:
                    self.rho[param_key(name)].fill_(rho)

    def distribution(self, name: str) -> dist.TorchDistribution:
        """Component distributions of a factor site (batch = members), mean-field for the other sites."""
        site = self.sites[name]
        if site.plate is not None and self.component == "cauchy":
            return dist.Cauchy(self.loc[param_key(name)], self.scale(name)).to_event(site.event_dim)
        return super().distribution(name)


class BatchEnsembleGuide(SiteGuide):
    """BatchEnsemble (Wen et al. 2020): every component a Dirac delta, so the factors carry no KL term.

    :param sites: the family's latent sites.
    :param init_sign_prob: P(+1) of the factors' random-sign initialisation.
    :param init_z: where a standardised (gsm) factor's values start, ± by the same random signs.
    """

    plated_terms = False  # a Dirac has no density against the prior: its sites are masked out of the ELBO

    def __init__(self, sites: dict[str, LatentSite], init_sign_prob: float = 0.5, init_z: float = 1.0) -> None:
        super().__init__(sites)
        _random_signs(sites, self, init_sign_prob, init_z)

    def distribution(self, name: str) -> dist.TorchDistribution:
        """A Dirac at the site's current value."""
        site = self.sites[name]
        return dist.Delta(biject_to(site.support)(self.unconstrained_loc(name)), event_dim=site.event_dim)


INIT_SIGN_PROB_DOC = "P(+1) of the factor means' random-sign initialisation (a gsm factor's z: +init_z, not -init_z)"
INIT_Z_MAX = 5.0  # z's prior is N(0, 1): a start further out has almost no prior mass
InitZ = Annotated[NonNegativeFloat, Field(1.0, le=INIT_Z_MAX, description=(
    "a gsm factor's standardised z starts at +-init_z (random signs): its members init_z prior standard deviations "
    "either side of the factor's centre, 1 +- tau init_z; 0 starts every member at the centre (at most "
    f"{INIT_Z_MAX:g}, beyond which the N(0, 1) prior of z has almost no mass; docs/results/defaults.md)"))]


class MixtureGuideSpec(GuideSection):
    """A K-component mixture over the rank-1 factors, one component per ensemble member (Dusenberry et al. 2020)."""

    needs = frozenset({MEMBER_FACTORS})

    former_defaults: ClassVar[dict[str, tuple[Any, ...]]] = {"init_scale": (DEFAULT_INIT_SCALE,)}  # until 2026-12-06

    name: Literal["mixture"] = Field(description="mixture")
    component: Literal["normal", "cauchy"] = Field("normal", description="the family of each component")
    init_sign_prob: float = Field(0.5, ge=0.0, le=1.0, description=INIT_SIGN_PROB_DOC)
    init_scale: PositiveFloat | None = Field(None, description=(
        "initial standard deviation of the factors; null: chosen from "
        f"{', '.join(f'{v:g}' for v in INIT_SCALE_CANDIDATES)} (Dusenberry et al.'s, and near BatchEnsemble's Dirac "
        "limit; a whole run at each, at the fit's lr) on the fit's calibration rows where it has them (fit(val=...) or "
        f"data.calibration_fraction), else {DEFAULT_INIT_SCALE:g}"))
    init_rho: InitRho
    init_z: InitZ

    def build(self, sites: dict[str, LatentSite]) -> MixtureGuide:
        return MixtureGuide(sites, self.component, self.init_sign_prob, self.init_scale, self.init_rho, self.init_z)


class BatchEnsembleGuideSpec(GuideSection):
    """BatchEnsemble: the mixture's special case of Dirac components (Wen et al. 2020)."""

    needs = frozenset({MEMBER_FACTORS})
    point_estimate = True

    name: Literal["batch_ensemble"] = Field(description="batch_ensemble")
    init_sign_prob: float = Field(0.5, ge=0.0, le=1.0, description=INIT_SIGN_PROB_DOC)
    init_z: InitZ

    def build(self, sites: dict[str, LatentSite]) -> BatchEnsembleGuide:
        return BatchEnsembleGuide(sites, self.init_sign_prob, self.init_z)
