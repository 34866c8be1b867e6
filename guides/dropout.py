"""Dropout as variational inference: q(W) = M diag(mask) with a random mask per input unit (``guide.dropout``).

* ``bernoulli``: MC dropout (Gal & Ghahramani 2016), mask z/(1-p) with z ~ Bernoulli(1-p);
* ``gaussian``: Gaussian dropout (Srivastava et al. 2014), mask 1 + sqrt(p/(1-p)) eps, eps ~ N(0, 1): the same
  mean and variance as the Bernoulli mask;
* ``concrete``: concrete dropout (Gal, Hron & Kendall 2017), a rate p learned per layer through the relaxed
  Bernoulli (temperature 0.1) mask (1 - z)/(1 - p), z = sigmoid((logit p + log u - log(1 - u)) / 0.1); its
  ELBO gains each layer's mask entropy K H(p) (K input units), carried as the draw's log density, which is
  what keeps p from collapsing to 0.

For every weight matrix W = M ∘ mask but the first layer's, each *input* unit j is dropped (column j of
``[out, in]`` zeroed; a Conv2d drops whole input channels) with probability p and kept units are scaled by
1/(1-p); the first layer's weights, the biases and constrained sites (a learned noise scale) are point values.
``drop_inputs=True`` drops the first layer's input units too, i.e. the data's features, as in Gal & Ghahramani's
UCI networks (dropout before every weight layer).
Each draw is a Delta at the masked value, so the ELBO that SVI maximises is

    E_q[log p(y | W) + log p(W)]     (q has no entropy term that depends on M)

i.e. dropout training with L2 weight decay supplied by the prior (a Normal(0, s) prior is the penalty
||W||² / 2s²), plus, for concrete dropout, the masks' entropy. ``Posterior.sample(T)`` then gives T masked weight
sets and the ordinary GuidePosterior prediction is the standard T-pass MC-dropout predictive;
:meth:`point_estimate` is the unmasked M.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import pyro.distributions as dist
import torch
from pydantic import Field
from torch import nn
from torch.distributions import biject_to

from guides.base import GuideSection, SettingChoice, SiteGuide, param_key
from zoo.errors import ZooInputError
from zoo.sites import WEIGHT_MATRICES, LatentSite

EXTRA_STATE_KEY = "_extra_state"  # where torch.nn.Module's state dict keeps get_extra_state()


def dropped_sites(sites: dict[str, LatentSite], drop_inputs: bool = False) -> list[str]:
    """The sites whose input units are dropped: every plain weight matrix (2+ dims) after the first, in model
    order, and the first as well with ``drop_inputs``. Refuses sites in an ensemble plate and site sets without a
    second weight matrix (without ``drop_inputs``) or without any."""
    plated = [n for n, s in sites.items() if s.plate is not None]
    if plated:
        raise ZooInputError("guide.name", "dropout", f"needs plain weight sites, but {', '.join(plated)} lie in an "
                            "ensemble plate; use model.family: all_weights with guide.name: dropout")
    matrices = [n for n, s in sites.items() if s.is_weight and len(s.shape) >= 2]
    if drop_inputs:
        if not matrices:
            raise ZooInputError("guide.name", "dropout", "drops input units of weight matrices, and this model has "
                                "none: use model.family: all_weights")
        return matrices
    if len(matrices) < 2:
        raise ZooInputError("guide.name", "dropout", f"drops the input units of every weight matrix after the first "
                            f"layer, and this model has {len(matrices)} weight matrix site(s) "
                            f"({', '.join(matrices) or 'none'}): use a net with a hidden layer (net.hidden) and "
                            "model.family: all_weights, or guide.drop_inputs: true to drop the inputs")
    return matrices[1:]


CONCRETE_TEMPERATURE = 0.1  # Gal, Hron & Kendall 2017
DEFAULT_DROPOUT_RATE = 0.1  # p where none is set and none is chosen (concrete: its initial p)
# a null rate is chosen from these on the fit's calibration rows: Gal & Ghahramani's (2016) UCI grid
DROPOUT_RATE_CANDIDATES = (0.005, 0.01, 0.05, 0.1)
# and from these below it, each run only while the lowest rate run so far scores best (the 1-D toy's rows chose the
# grid's lowest on every seed, and at 0.001 MC dropout keeps the plain net's RMSE and NLL there; docs/results/
# defaults.md, "MC dropout's rate reaches below Gal & Ghahramani's grid")
DROPOUT_RATES_BELOW = (0.002, 0.001)


def _keep_the_rate_where_the_state_has_none(guide: DropoutGuide, state_dict: dict[str, Any], prefix: str,
                                            *_: Any) -> None:
    """A state saved before the rate was in it (a checkpoint from before the rate could be chosen) loads with the
    guide's own rate, the section's; a pre-hook of :meth:`torch.nn.Module.load_state_dict`, so it holds where the
    guide is loaded inside another module too."""
    state_dict.setdefault(prefix + EXTRA_STATE_KEY, guide.get_extra_state())


class DropoutGuide(SiteGuide):
    """Dropout VI: Delta draws at M ∘ (input-unit mask) for every weight matrix but the first (MC, Gaussian or
    concrete dropout).

    :param sites: the family's latent sites (plain weight matrices, no ensemble plate).
    :param dropout_rate: p, the probability of dropping an input unit (concrete: its initial value); None: left
        for the fit to choose from :data:`DROPOUT_RATE_CANDIDATES` and below (:data:`DROPOUT_RATES_BELOW`;
        :meth:`open_setting`; concrete: where its learned rate starts), meanwhile :data:`DEFAULT_DROPOUT_RATE`.
    :param mask: ``bernoulli``, ``gaussian`` or ``concrete``.
    :param drop_inputs: also drop the first layer's input units.
    """

    prior_scale_open = True  # its draws are Deltas at M ∘ mask: the prior is dropout training's L2 penalty

    def __init__(self, sites: dict[str, LatentSite], dropout_rate: float | None = DEFAULT_DROPOUT_RATE,
                 mask: str = "bernoulli", drop_inputs: bool = False) -> None:
        if dropout_rate is not None and not 0.0 < dropout_rate < 1.0:
            raise ZooInputError("guide.dropout_rate", dropout_rate, "must lie strictly between 0 and 1")
        if mask not in ("bernoulli", "gaussian", "concrete"):
            raise ZooInputError("guide.dropout", mask, "use bernoulli (MC dropout), gaussian or concrete")
        super().__init__(sites)
        self.rate_open = dropout_rate is None
        if dropout_rate is None:
            dropout_rate = DEFAULT_DROPOUT_RATE
        self.dropout_rate, self.mask = float(dropout_rate), mask
        self.dropped = dropped_sites(sites, drop_inputs)
        if mask == "concrete":  # one learned rate per dropped layer, as its logit
            logit = math.log(dropout_rate) - math.log1p(-dropout_rate)
            self.rate_logit = nn.ParameterDict({param_key(n): nn.Parameter(torch.tensor(logit)) for n in self.dropped})
        self.register_load_state_dict_pre_hook(_keep_the_rate_where_the_state_has_none)

    def open_setting(self) -> SettingChoice | None:
        """The rate where the section left it null (concrete: where its learned rate starts), reaching below the
        candidates while the lowest run scores best."""
        if not self.rate_open:
            return None
        return SettingChoice("guide.dropout_rate", self.dropout_rate, DROPOUT_RATE_CANDIDATES, DROPOUT_RATES_BELOW)

    def take_setting(self, value: float) -> None:
        """Drop with rate ``value`` from now on (concrete: every layer's learned rate starts again from it)."""
        self.dropout_rate = float(value)
        if self.mask == "concrete":
            with torch.no_grad():
                for logit in self.rate_logit.values():
                    logit.fill_(math.log(value) - math.log1p(-value))

    def get_extra_state(self) -> dict[str, float]:
        """The rate, in the state dict: a checkpoint keeps the rate its fit chose."""
        return {"dropout_rate": self.dropout_rate}

    def set_extra_state(self, state: dict[str, float]) -> None:
        self.dropout_rate = float(state["dropout_rate"])

    def learned_rate(self, name: str) -> torch.Tensor:
        """Concrete dropout's rate p of site ``name``, learned as its logit."""
        return torch.sigmoid(self.rate_logit[param_key(name)])

    def rates(self) -> dict[str, float]:
        """Every dropped site's rate p."""
        if self.mask != "concrete":
            return dict.fromkeys(self.dropped, self.dropout_rate)
        return {name: float(self.learned_rate(name).detach()) for name in self.dropped}

    def unit_mask(self, name: str) -> torch.Tensor:
        """A fresh mask for site ``name``, one factor per input unit (dim 1), broadcasting over the rest."""
        loc = self.unconstrained_loc(name)
        shape = [1] * loc.dim()
        shape[1] = loc.shape[1]
        p = self.dropout_rate
        if self.mask == "bernoulli":
            keep = torch.rand(shape, device=loc.device, dtype=loc.dtype) >= p
            return keep.to(loc.dtype) / (1.0 - p)
        if self.mask == "gaussian":
            return 1.0 + math.sqrt(p / (1.0 - p)) * torch.randn(shape, device=loc.device, dtype=loc.dtype)
        p = self.learned_rate(name).to(loc)
        eps = torch.finfo(loc.dtype).eps
        u = torch.rand(shape, device=loc.device, dtype=loc.dtype).clamp(eps, 1.0 - eps)
        drop = torch.sigmoid((torch.logit(p) + torch.log(u) - torch.log1p(-u)) / CONCRETE_TEMPERATURE)
        return (1.0 - drop) / (1.0 - p)

    def distribution(self, name: str) -> dist.TorchDistribution:
        """A Delta at the masked weights (dropped sites) or at the point value (every other site); a concrete
        site's Delta carries -K H(p), so that the ELBO counts the masks' entropy."""
        site = self.sites[name]
        value = biject_to(site.support)(self.unconstrained_loc(name))
        if name not in self.dropped:
            return dist.Delta(value, event_dim=site.event_dim)
        value = value * self.unit_mask(name)
        if self.mask != "concrete":
            return dist.Delta(value, event_dim=site.event_dim)
        p = self.learned_rate(name).to(value)
        entropy = -(p * torch.log(p) + (1.0 - p) * torch.log1p(-p)) * value.shape[1]
        return dist.Delta(value, log_density=-entropy, event_dim=site.event_dim)


class DropoutGuideSpec(GuideSection):
    """Dropout as variational inference: MC (Bernoulli), Gaussian or concrete dropout masks on the weights."""

    needs = frozenset({WEIGHT_MATRICES})
    former_defaults: ClassVar[dict[str, tuple[Any, ...]]] = {"dropout_rate": (0.05,)}  # until 2026-12-03

    name: Literal["dropout"] = Field(description="dropout")
    dropout_rate: float | None = Field(
        None, gt=0.0, lt=1.0, description="probability p of dropping an input unit of every weight matrix but the "
        "first layer's (the initial p for concrete); null: chosen from "
        f"{', '.join(f'{p:g}' for p in DROPOUT_RATE_CANDIDATES)} (Gal & Ghahramani's UCI grid, a whole run at each, "
        f"at the fit's lr; then {', '.join(f'{p:g}' for p in DROPOUT_RATES_BELOW)} in turn while the lowest run "
        "scores best) on the fit's calibration rows where it has them (fit(val=...) or "
        f"data.calibration_fraction), else {DEFAULT_DROPOUT_RATE:g}; concrete learns its rate from there")
    dropout: Literal["bernoulli", "gaussian", "concrete"] = Field(
        "bernoulli", description="the mask, bernoulli (MC dropout), gaussian (1 + sqrt(p/(1-p)) N(0, 1)) or concrete "
        "(a rate learned per layer through a relaxed Bernoulli mask)")
    drop_inputs: bool = Field(False, description="also drop the first layer's input units (the data's features), as "
                              "Gal & Ghahramani's UCI networks did")

    def build(self, sites: dict[str, LatentSite]) -> DropoutGuide:
        return DropoutGuide(sites, self.dropout_rate, self.dropout, self.drop_inputs)
