"""Point-estimate guide: a Delta per site, so SVI on it is MAP estimation under the model's prior."""

from __future__ import annotations

import pyro.distributions as dist
from torch.distributions import biject_to

from guides.base import SiteGuide


class DeltaGuide(SiteGuide):
    """q(w) = delta(w - w_hat); the ELBO reduces to log p(y | w_hat) + log p(w_hat)."""

    def distribution(self, name: str) -> dist.TorchDistribution:
        """A Delta at the site's current point value."""
        site = self.sites[name]
        value = biject_to(site.support)(self.unconstrained_loc(name))
        return dist.Delta(value, event_dim=site.event_dim)
