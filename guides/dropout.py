"""MC dropout (Gal & Ghahramani 2016) as a guide: q(W) = M diag(z)/(1-p) with Bernoulli unit masks z.

For every weight matrix W = M ∘ mask but the first layer's, each *input* unit j is dropped (column j of
``[out, in]`` zeroed; a Conv2d drops whole input channels) with probability p and kept units are scaled by
1/(1-p); the first layer's weights, the biases and constrained sites (a learned noise scale) are point values.
Each draw is a Delta at the masked value, so the ELBO that SVI maximises is

    E_q[log p(y | W) + log p(W)]     (q has no entropy term that depends on M)

i.e. dropout training with L2 weight decay supplied by the prior (a Normal(0, s) prior is the penalty
||W||² / 2s²). ``Posterior.sample(T)`` then gives T masked weight sets and the ordinary GuidePosterior
prediction is the standard T-pass MC-dropout predictive; :meth:`point_estimate` is the unmasked M.
"""

from __future__ import annotations

import pyro.distributions as dist
import torch
from torch.distributions import biject_to

from guides.base import SiteGuide
from zoo.errors import ZooInputError
from zoo.models.base import LatentSite
from zoo.spec import GuideSpec


def dropped_sites(sites: dict[str, LatentSite]) -> list[str]:
    """The sites whose input units are dropped: every plain weight matrix (2+ dims) after the first, in model
    order. Refuses sites in an ensemble plate and site sets without a second weight matrix."""
    plated = [n for n, s in sites.items() if s.plate is not None]
    if plated:
        raise ZooInputError("guide.name", "dropout", f"needs plain weight sites, but {', '.join(plated)} lie in an "
                            "ensemble plate; use model.family: mean_field with guide.name: dropout")
    matrices = [n for n, s in sites.items() if s.is_weight and len(s.shape) >= 2]
    if len(matrices) < 2:
        raise ZooInputError("guide.name", "dropout", f"drops the input units of every weight matrix after the first "
                            f"layer, and this model has {len(matrices)} weight matrix site(s) "
                            f"({', '.join(matrices) or 'none'}): use a net with a hidden layer (net.hidden) and "
                            "model.family: mean_field")
    return matrices[1:]


class DropoutGuide(SiteGuide):
    """MC dropout: Delta draws at M ∘ (input-unit Bernoulli mask)/(1-p) for every weight matrix but the first."""

    def __init__(self, sites: dict[str, LatentSite], dropout_rate: float = 0.05) -> None:
        if not 0.0 < dropout_rate < 1.0:
            raise ZooInputError("guide.dropout_rate", dropout_rate, "must lie strictly between 0 and 1")
        super().__init__(sites)
        self.dropout_rate = float(dropout_rate)
        self.dropped = dropped_sites(sites)

    @classmethod
    def from_spec(cls, sites: dict[str, LatentSite], spec: GuideSpec) -> DropoutGuide:
        """Build from the spec's guide section (``dropout_rate``)."""
        return cls(sites, spec.dropout_rate)

    def unit_mask(self, name: str) -> torch.Tensor:
        """A fresh mask for site ``name``: 0 or 1/(1-p) per input unit (dim 1), broadcasting over the rest."""
        loc = self.unconstrained_loc(name)
        shape = [1] * loc.dim()
        shape[1] = loc.shape[1]
        keep = torch.rand(shape, device=loc.device, dtype=loc.dtype) >= self.dropout_rate
        return keep.to(loc.dtype) / (1.0 - self.dropout_rate)

    def distribution(self, name: str) -> dist.TorchDistribution:
        """A Delta at the masked weights (dropped sites) or at the point value (every other site)."""
        site = self.sites[name]
        value = biject_to(site.support)(self.unconstrained_loc(name))
        if name in self.dropped:
            value = value * self.unit_mask(name)
        return dist.Delta(value, event_dim=site.event_dim)
