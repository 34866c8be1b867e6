"""What a model family declares about each latent sample site: the one description guides, priors, likelihoods,
samplers and the Posterior share."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributions import constraints


@dataclass(frozen=True)
class LatentSite:
    """A latent sample site of a model: its shape, support, and a sensible initial value for guides."""

    shape: torch.Size
    init: torch.Tensor
    support: constraints.Constraint = constraints.real
    plate: tuple[str, int] | None = None  # the leading dim of `shape` is this plate; its terms are averaged
    # a vector site made of whole weight tensors: each one's (rows, cols) as a row-major matrix, in site order (what a
    # Kronecker-factored covariance is built on); None where the site holds parts of tensors
    blocks: tuple[tuple[int, int], ...] | None = None
    # a non-centred factor's standardised value (prior N(0, 1), init 0): a guide's random-sign start puts its mean
    # at +-init_z prior standard deviations, where it puts another factor's at +-init
    standardised: bool = False

    @property
    def event_dim(self) -> int:
        """Dims of ``shape`` that form one event (all but a leading plate dim)."""
        return len(self.shape) - (self.plate is not None)

    @property
    def is_weight(self) -> bool:
        """Real-valued sites are weights (or weight-like factors); constrained ones are e.g. noise scales."""
        return self.support is constraints.real


# The kinds of latent structure a family offers and a guide needs (FamilySection.offers, GuideSection.needs)
WEIGHT_MATRICES = "weight matrices"  # every weight and bias of the net its own site, in the net's shapes
MEMBER_FACTORS = "rank-1 factors of ensemble members"  # per-member multiplicative factors in a members plate
WEIGHT_VECTOR = "one vector of weights"  # the latent weights as one vector site (a full covariance fits it)
