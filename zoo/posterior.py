"""The one Posterior interface: S weight draws ``{site: [S, ...]}`` and the predictive distributions they induce.

Every inference method ends here, so prediction, metrics, pruning, ArviZ conversion and comparisons are
written once, against :class:`Posterior`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

import torch
from pyro import poutine
from pyro.poutine.util import site_is_subsample

from zoo.likelihoods import PredictiveDraws
from zoo.models.base import ModelFamily

MAX_PREDICT_ROWS = 4096  # inputs one predict call scores at a time, at most
PREDICT_DRAW_ROWS = 2**20  # ... and at most this many draws x inputs (the activations grow with both)


class Density(Protocol):
    """What scores a posterior approximation's own draws (for PSIS k-hat): a guide, or a posterior with a density
    of its own (SWAG)."""

    @property
    def density_unavailable(self) -> str | None:
        """Why log q cannot be evaluated at given draws, or None where it can."""

    def log_density(self, draws: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """log q at S draws.

        :param draws: ``{site: [S, ...]}``.
        :returns: ``[S]``, or None where a guide's trace scores them site by site.
        """


def all_one_point(draws: dict[str, torch.Tensor]) -> bool:
    """Whether every draw ``{site: [S, ...]}`` equals the first, site by site (a point estimate's draws).

    :param draws: the draws.
    :returns: True when all S draws are the same point.
    """
    return all(torch.equal(value, value[:1].expand_as(value)) for value in draws.values())


class Posterior(ABC):
    """Draws of every latent site of ``family``'s model, and predictions from them.

    :param family: the model family whose latent sites are drawn and which predicts from the draws.
    """

    def __init__(self, family: ModelFamily) -> None:
        self.family = family

    @abstractmethod
    def sample(self, num_samples: int) -> dict[str, torch.Tensor]:
        """``num_samples`` joint draws of the latent sites.

        :param num_samples: how many draws ``S`` to take.
        :returns: every latent site's draws ``{site: [S, *site_shape]}``.
        """

    def density(self) -> Density | None:
        """What scores this posterior's draws: its guide, itself where it has a density (SWAG), or None for draws
        without one (MCMC's, a pruned posterior's).

        :returns: the density, or None.
        """
        return None

    def scoring_draws(self, num_samples: int) -> dict[str, torch.Tensor] | None:
        """The weight draws that several sets of inputs are scored with (the test and OOD inputs, every shifted
        set), so that they all see one posterior; pass them to :meth:`predict` with ``num_samples`` too.

        :param num_samples: how many draws to take.
        :returns: the draws, or None where this posterior's predictive is a closed form that needs none (a Laplace
            GLM's probit or Gaussian predictive), so that every score uses the predictive its spec names.
        """
        return self.sample(num_samples)

    def predict(
        self, x: torch.Tensor, num_samples: int | None = None, draws: dict[str, torch.Tensor] | None = None,
        chunk_size: int | None = None,
    ) -> PredictiveDraws:
        """Per-draw predictive distributions at inputs ``x`` (pass ``draws`` to reuse the same weight draws).

        Draws that are all one point (a MAP net, a deep ensemble, BatchEnsemble: every draw of a point-estimate
        guide) are scored once and the predictions repeated, which gives the same result S times faster.

        The inputs are scored ``chunk_size`` rows at a time, without gradients. By default as many rows as keep
        draws x rows at most 2^20 (at most 4,096 rows): the net's activations for all draws at once grow with both,
        and a grown MCMC reference has 10^5 draws (bostonHousing's, 100,000 draws on the 455 training rows, peaked
        at 19 GB in one call).

        :param x: inputs ``[B, ...]``, standardised like the training rows.
        :param num_samples: how many new weight draws to take; ignored when ``draws`` is given.
        :param draws: weight draws ``{site: [S, ...]}`` to predict with, e.g. those of :meth:`sample` for another
            set of inputs.
        :param chunk_size: inputs scored at a time (None: the default above).
        :returns: one predictive distribution per draw at the ``B`` inputs (``log_probs [S, B, C]``, or ``loc`` and
            ``scale [S, B]``).
        :raises ValueError: when neither ``num_samples`` nor ``draws`` is given.
        """
        if draws is None:
            if num_samples is None:
                raise ValueError("predict needs num_samples or draws")
            draws = self.sample(num_samples)
        count = next(iter(draws.values())).shape[0]
        if count > 1 and all_one_point(draws):
            return self.predict(x, draws={name: value[:1] for name, value in draws.items()},
                                chunk_size=chunk_size).tiled(count)
        if chunk_size is None:
            chunk_size = max(1, min(MAX_PREDICT_ROWS, PREDICT_DRAW_ROWS // count))
        with torch.no_grad():
            return PredictiveDraws.concat([self.family.predict(draws, xc) for xc in x.split(chunk_size)])


class GuidePosterior(Posterior):
    """The posterior approximation of a fitted guide (mean-field, Delta, and any guide to come).

    :param family: the model family the guide was fitted to.
    :param guide: the fitted guide, run once per draw.
    """

    def __init__(self, family: ModelFamily, guide: torch.nn.Module) -> None:
        super().__init__(family)
        self.guide = guide

    def density(self) -> Density:
        """The fitted guide, which scores its own draws.

        :returns: the guide.
        """
        return self.guide

    def sample(self, num_samples: int) -> dict[str, torch.Tensor]:
        """Run the guide ``num_samples`` times and stack each latent site's values (not a guide's auxiliary draws,
        such as Pyro's AutoNormal's ``<site>_unconstrained``, of which the sites are functions).

        :param num_samples: how many times ``S`` to run the guide.
        :returns: every latent site's draws ``{site: [S, *site_shape]}``.
        """
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
    """A posterior held as stored draws (e.g. MCMC): ``sample(S)`` returns S of them, evenly thinned.

    :param family: the model family the draws belong to.
    :param draws: the stored draws ``{site: [N, *site_shape]}``.
    """

    def __init__(self, family: ModelFamily, draws: dict[str, torch.Tensor]) -> None:
        super().__init__(family)
        self.draws = draws

    def sample(self, num_samples: int) -> dict[str, torch.Tensor]:
        """Up to ``num_samples`` stored draws, evenly spaced.

        :param num_samples: how many draws to return; all ``N`` stored ones when it is ``N`` or more.
        :returns: the chosen draws ``{site: [min(S, N), *site_shape]}``.
        """
        total = next(iter(self.draws.values())).shape[0]
        index = torch.linspace(0, total - 1, min(num_samples, total)).round().long()
        return {name: value[index] for name, value in self.draws.items()}


class ChainPosterior(SamplePosterior):
    """Draws stored chain by chain (MCMC, SG-MCMC), so that convergence across chains can be checked (R-hat, ESS,
    divergences); :meth:`sample` draws from the chains pooled.

    :param family: the model family the draws belong to.
    :param chains: the draws of each chain ``{site: [C, S, ...]}``.
    :param stats: per-draw sampler statistics ``{name: [C, S]}`` (e.g. ``diverging``, ``energy``); none by default.
    :param settings: the sampler's adapted settings (e.g. ``step_size``), which its convergence advice reads.
    """

    def __init__(self, family: ModelFamily, chains: dict[str, torch.Tensor],
                 stats: dict[str, torch.Tensor] | None = None, settings: dict[str, float] | None = None) -> None:
        super().__init__(family, {name: value.flatten(0, 1) for name, value in chains.items()})
        self.chains, self.stats, self.settings = chains, stats or {}, settings or {}


class MaskedPosterior(Posterior):
    """Another posterior with some weights fixed at zero (pruning): draws are multiplied by 0/1 masks.

    :param base: the posterior whose draws are masked.
    :param masks: 0/1 masks by site name, each shaped like one draw of its site; sites without one are kept whole.
    """

    def __init__(self, base: Posterior, masks: dict[str, torch.Tensor]) -> None:
        super().__init__(base.family)
        self.base, self.masks = base, masks

    def sample(self, num_samples: int) -> dict[str, torch.Tensor]:
        """The base posterior's draws with masked weights set to zero.

        :param num_samples: how many draws ``S`` to take from the base posterior.
        :returns: the masked draws ``{site: [S, *site_shape]}``.
        """
        draws = self.base.sample(num_samples)
        return {n: v * self.masks[n].to(v) if n in self.masks else v for n, v in draws.items()}
