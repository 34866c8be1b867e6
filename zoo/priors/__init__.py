"""Weight priors: each is one module holding its spec section and its distribution, registered here once.

:data:`PRIORS` is the registry: the spec's ``prior`` section (a default and overrides by site-name glob) takes any
registered prior, ``zoo list`` lists them. Adding a prior is its module (a :class:`~zoo.priors.base.PriorSection`
with a ``name: Literal[...]`` field, its settings and its :meth:`~zoo.priors.base.PriorSection.element`) and one
entry below.
"""

from __future__ import annotations

import fnmatch
from typing import Any

import pyro.distributions as dist
import torch
from pydantic import Field, model_validator

from zoo.errors import ZooInputError
from zoo.parts import Catalogue, Strict
from zoo.priors.base import PriorSection
from zoo.priors.cauchy import CauchyPrior
from zoo.priors.gsm import GaussianScaleMixturePrior
from zoo.priors.laplace import LaplacePrior
from zoo.priors.normal import NormalPrior, ScalarNormal
from zoo.priors.scale_mixture import ScaleMixtureNormal, ScaleMixturePrior

__all__ = ["PRIORS", "CauchyPrior", "GaussianScaleMixturePrior", "LaplacePrior", "NormalPrior", "PriorConfig",
           "PriorSection", "PriorSpec", "ScalarNormal", "ScaleMixtureNormal", "ScaleMixturePrior", "assign_priors",
           "prior_distribution"]

PRIORS = Catalogue("prior", NormalPrior, LaplacePrior, CauchyPrior, ScaleMixturePrior, GaussianScaleMixturePrior)
PriorConfig = PRIORS.union()


class PriorSpec(Strict):
    """A default prior for every weight site plus overrides by site-name glob (first match wins).

    Written flat in YAML (``prior: {name: normal, scale: 1.0, sites: {"*.bias": {...}}}``).
    """

    default: PriorConfig = Field(default_factory=NormalPrior, description=(
        "the prior of every weight site no glob of sites matches (written flat: prior: {name: normal, ...})"))
    sites: dict[str, PriorConfig] = Field(default_factory=dict, description=(
        "overrides by site-name glob, e.g. {'*.bias': {name: normal, scale: 10}}; the first match wins"))

    @model_validator(mode="before")
    @classmethod
    def _flat_form(cls, v: Any) -> Any:
        return nested_prior(v)

    def every_prior(self) -> list[PriorSection]:
        """The default and every override.

        :returns: the priors this section names.
        """
        return [self.default, *self.sites.values()]


def nested_prior(v: Any, name: str | None = "normal") -> Any:
    """A prior section in its nested form ``{default: {...}, sites: {...}}``, from the flat YAML form too
    (``prior: {name: normal, scale: 1.0, sites: {...}}``); a prior written without a name is a Normal.

    :param v: the section as written.
    :param name: the name a prior written without one takes (None: leave it out, for a merge with another).
    :returns: the nested form (anything but a mapping as it is).
    """
    if not isinstance(v, dict):
        return v
    v = dict(v)
    if "default" not in v:
        sites = v.pop("sites", {})
        v = {"default": v, "sites": sites}
    named = {"name": name} if name is not None else {}
    if isinstance(v["default"], dict):
        v["default"] = {**named, **v["default"]}
    if isinstance(v.get("sites"), dict):
        v["sites"] = {k: {**named, **c} if isinstance(c, dict) else c for k, c in v["sites"].items()}
    return v


def prior_distribution(config: PriorSection, shape: torch.Size, device: torch.device | str = "cpu",
                       dtype: torch.dtype = torch.float32) -> dist.TorchDistribution:
    """The prior of one site: ``config`` on every element of ``shape``, as one event of ``len(shape)`` dims.

    :param config: a registered prior's section.
    :param shape: the site's shape.
    :param device: where its parameters live.
    :param dtype: their floating-point type.
    :returns: the site's prior.
    """
    return config.distribution(shape, device, dtype)


def assign_priors(spec: PriorSpec, site_names: list[str]) -> dict[str, PriorSection]:
    """Map every site to its prior: the first matching ``sites`` glob, else the default.

    A glob that matches no site is almost always a typo, so it is refused with the list of site names.

    :param spec: the spec's prior section.
    :param site_names: the sites of the family that takes the priors.
    :returns: each site's prior.
    :raises ZooInputError: a glob that matches no site.
    """
    for pattern in spec.sites:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in site_names):
            raise ZooInputError(f"prior.sites.{pattern}", pattern,
                                f"matches no weight site; the sites are: {', '.join(site_names)}")
    assigned = {}
    for name in site_names:
        match = next((cfg for pat, cfg in spec.sites.items() if fnmatch.fnmatchcase(name, pat)), None)
        assigned[name] = match if match is not None else spec.default
    return assigned
