"""Point-estimate guide: a Delta per site, so SVI on it is MAP estimation under the model's prior."""

from __future__ import annotations

from typing import Literal

import pyro.distributions as dist
from pydantic import Field
from torch.distributions import biject_to

from guides.base import GuideSection, SiteGuide
from zoo.sites import LatentSite


class DeltaGuide(SiteGuide):
    """q(w) = delta(w - w_hat); the ELBO reduces to log p(y | w_hat) + log p(w_hat)."""

    prior_scale_open = True  # the prior meets the ELBO as a weight decay on w_hat

    def distribution(self, name: str) -> dist.TorchDistribution:
        """A Delta at the site's current point value.

        :param name: the site.
        :returns: its Delta.
        """
        site = self.sites[name]
        value = biject_to(site.support)(self.unconstrained_loc(name))
        return dist.Delta(value, event_dim=site.event_dim)


class DeltaGuideSpec(GuideSection):
    """A point estimate per site: SVI on it is MAP estimation under the model's prior."""

    point_estimate = True

    name: Literal["delta"] = Field(description="delta")

    def build(self, sites: dict[str, LatentSite]) -> DeltaGuide:
        return DeltaGuide(sites)
