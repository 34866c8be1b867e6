"""The one Posterior interface: S weight draws ``{site: [S, ...]}`` and the predictive distributions they induce.

Every inference method ends here, so prediction, metrics, pruning, ArviZ conversion and comparisons are
written once, against :class:`Posterior`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from pyro import poutine
from pyro.poutine.util import site_is_subsample

from zoo.likelihoods import PredictiveDraws
from zoo.models.base import ModelFamily


class Posterior(ABC):
    """Draws of every latent site of ``family``'s model, and predictions from them."""

    def __init__(self, family: ModelFamily) -> None:
        self.family = family

    @abstractmethod
    def sample(self, num_samples: int) -> dict[str, torch.Tensor]:
        """``num_samples`` joint draws of the latent sites, each ``[S, *site_shape]``."""

    def predict(
        self, x: torch.Tensor, num_samples: int | None = None, draws: dict[str, torch.Tensor] | None = None,
        chunk_size: int = 4096,
    ) -> PredictiveDraws:
        """Per-draw predictive distributions at inputs ``x`` (pass ``draws`` to reuse the same weight draws)."""
        if draws is None:
            if num_samples is None:
                raise ValueError("predict needs num_samples or draws")
            draws = self.sample(num_samples)
        with torch.no_grad():
            return PredictiveDraws.concat([self.family.predict(draws, xc) for xc in x.split(chunk_size)])


class GuidePosterior(Posterior):
    """The posterior approximation of a fitted guide (mean-field, Delta, and any guide to come)."""

    def __init__(self, family: ModelFamily, guide: torch.nn.Module) -> None:
        super().__init__(family)
        self.guide = guide

    def sample(self, num_samples: int) -> dict[str, torch.Tensor]:
        """Run the guide ``num_samples`` times and stack each latent site's values (not a guide's auxiliary draws,
        such as Pyro's AutoNormal's ``<site>_unconstrained``, of which the sites are functions)."""
        runs: dict[str, list[torch.Tensor]] = {}
        with torch.no_grad():
            for _ in range(num_samples):
                trace = poutine.trace(self.guide).get_trace()
                for name, site in trace.nodes.items():
                    if (site["type"] == "sample" and not site["is_observed"] and not site_is_subsample(site)
                            and not site["infer"].get("is_auxiliary")):
                        runs.setdefault(name, []).append(site["value"])
        return {name: torch.stack(values) for name, values in runs.items()}


class SamplePosterior(Posterior):
    """A posterior held as stored draws (e.g. MCMC): ``sample(S)`` returns S of them, evenly thinned."""

    def __init__(self, family: ModelFamily, draws: dict[str, torch.Tensor]) -> None:
        super().__init__(family)
        self.draws = draws

    def sample(self, num_samples: int) -> dict[str, torch.Tensor]:
        """Up to ``num_samples`` stored draws, evenly spaced."""
        total = next(iter(self.draws.values())).shape[0]
        index = torch.linspace(0, total - 1, min(num_samples, total)).round().long()
        return {name: value[index] for name, value in self.draws.items()}


class ChainPosterior(SamplePosterior):
    """Draws stored chain by chain (MCMC, SG-MCMC): ``chains {site: [C, S, ...]}`` with per-draw sampler statistics
    ``stats {name: [C, S]}``, so that convergence across chains can be checked (R-hat, ESS, divergences)."""

    def __init__(self, family: ModelFamily, chains: dict[str, torch.Tensor],
                 stats: dict[str, torch.Tensor] | None = None) -> None:
        super().__init__(family, {name: value.flatten(0, 1) for name, value in chains.items()})
        self.chains, self.stats = chains, stats or {}


class MaskedPosterior(Posterior):
    """Another posterior with some weights fixed at zero (pruning): draws are multiplied by 0/1 masks."""

    def __init__(self, base: Posterior, masks: dict[str, torch.Tensor]) -> None:
        super().__init__(base.family)
        self.base, self.masks = base, masks

    def sample(self, num_samples: int) -> dict[str, torch.Tensor]:
        """The base posterior's draws with masked weights set to zero."""
        draws = self.base.sample(num_samples)
        return {n: v * self.masks[n].to(v) if n in self.masks else v for n, v in draws.items()}
