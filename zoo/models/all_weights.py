"""The all-weights family: every weight and bias of a plain ``nn.Module`` is a latent site under its prior.

The same Pyro model serves mean-field VI (Bayes by Backprop), MC dropout, MAP (a Delta guide), Pyro's autoguides,
HMC/NUTS, SG-MCMC and SWAG. It was called ``mean_field`` before; that name is still accepted.
"""

from __future__ import annotations

from typing import Literal

import pyro
import pyro.distributions as dist
import torch
from pydantic import Field
from torch import nn

from zoo.errors import ZooInputError
from zoo.likelihoods import Likelihood, PredictiveDraws, draw_latents, observation, observe_rows
from zoo.models.base import FamilySection, ModelFamily, ModuleChoice, WidensPriors, per_device
from zoo.nets import ParameterSwap, forward_stacked, has_batch_norm, prediction_mode
from zoo.priors import PriorSection, prior_distribution
from zoo.sites import WEIGHT_MATRICES, LatentSite


class AllWeightsBNN(WidensPriors, ModelFamily):
    """Pyro model p(w) p(y | f_w(x)) over the parameters of ``net`` (all of them, or those of the chosen modules);
    site names are the parameter names, and any parameter left out is a point estimate fitted beside the guide.

    :param net: the deterministic net.
    :param priors: the prior of every latent parameter, by name.
    :param likelihood: the observation model.
    :param latent: the names of the latent parameters (None: every parameter).
    """

    def __init__(self, net: nn.Module, priors: dict[str, PriorSection], likelihood: Likelihood,
                 latent: list[str] | None = None) -> None:
        self.net = net
        self.likelihood = likelihood
        self.prior_configs = priors
        self.weight_names = [name for name, _ in net.named_parameters() if latent is None or name in latent]
        if not self.weight_names:
            raise ZooInputError("model.include", latent, "no parameter of the net is left random: include a module "
                                "with weights, or exclude fewer")
        missing = set(self.weight_names) - set(priors)
        if missing:
            raise ValueError(f"no prior for sites {sorted(missing)}")
        self._priors: dict[tuple, dict[str, dist.TorchDistribution]] = {}
        self._swap = ParameterSwap(net)
        self.batch_norm = has_batch_norm(net)  # fit in training mode, predict in eval mode (running statistics)

    @staticmethod
    def prior_sites(net: nn.Module, choice: ModuleChoice | None = None) -> list[str]:
        """The sites the spec's priors are assigned to: every parameter of the net (of the chosen modules).

        :param net: the deterministic net.
        :param choice: which modules are random (None: all).
        :returns: the latent parameters' names.
        """
        modules = dict(net.named_modules())
        return [name for name, _ in net.named_parameters()
                if choice is None or choice.chosen(name.rpartition(".")[0], modules[name.rpartition(".")[0]])]

    # -- what the guides and inference methods see ------------------------------------------------------
    def latent_sites(self) -> dict[str, LatentSite]:
        """Every latent site with its shape and an initial value (the net's own initialisation for weights)."""
        sites = {name: LatentSite(p.shape, p.detach().clone()) for name, p in self.net.named_parameters()
                 if name in self.weight_names}
        sites.update(self.likelihood.latent_sites())
        return sites

    def point_parameters(self) -> list[nn.Parameter]:
        """Parameters fitted as point estimates beside the guide: those of the modules left out (none by default)."""
        return [p for name, p in self.net.named_parameters() if name not in self.weight_names]

    def buffers(self) -> list[torch.Tensor]:
        """The net's BatchNorm running statistics: updated by the fit, never random (saved with checkpoints)."""
        return list(self.net.buffers())

    def to(self, device: torch.device | str, dtype: torch.dtype = torch.float32) -> AllWeightsBNN:
        """Move the template net (and with it the priors) to ``device``/``dtype``."""
        self.net.to(device=device, dtype=dtype)
        return self

    def priors(self) -> dict[str, dist.TorchDistribution]:
        """The prior of every weight site on the net's device and dtype (built once, then reused)."""

        def build(device: torch.device, dtype: torch.dtype) -> dict[str, dist.TorchDistribution]:
            return {n: prior_distribution(self.prior_configs[n], p.shape, device, dtype)
                    for n, p in self.net.named_parameters() if n in self.weight_names}

        return per_device(self._priors, next(self.net.parameters()), build)

    # -- the Pyro model --------------------------------------------------------------------------------
    def model(self, x: torch.Tensor, y: torch.Tensor | None = None, batch: torch.Tensor | None = None) -> None:
        """Sample the weights, then observe ``y`` on the rows ``batch`` (scaled up to all ``len(x)`` rows)."""
        priors = self.priors()
        weights = {name: pyro.sample(name, priors[name]) for name in self.weight_names}
        observe_rows(self.likelihood, x, y, batch, lambda rows: self.forward(weights, rows))

    def forward(self, weights: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """The net's output under one set of weights ``[B, out]``."""
        return self._swap(weights, x)

    def predict(self, draws: dict[str, torch.Tensor], x: torch.Tensor) -> PredictiveDraws:
        """Per-draw predictive distributions at ``x`` under S joint draws ``{site: [S, ...]}`` (net in eval mode)."""
        with prediction_mode(self.net, self.batch_norm):
            return self.likelihood.predictive(self.forward_draws(draws, x), draws)

    def log_likelihood(self, draws: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Pointwise log p(y_i | x_i, w_s) of the model's ``obs`` site under S draws: ``[S, B]`` (net in eval mode)."""
        with prediction_mode(self.net, self.batch_norm):
            out = self.forward_draws(draws, x)
        fn = observation(self.likelihood, out, draw_latents(self.likelihood, draws, 1))
        return fn.log_prob(y)

    def forward_draws(self, draws: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """Outputs under S weight draws ``{name: [S, ...]}`` at once: ``[S, B, out]``."""
        weights = {name: draws[name] for name in self.weight_names}
        if next(iter(weights.values())).shape[0] == 1:  # one draw (e.g. a NUTS chain): no vmap overhead
            return self.forward({n: w[0] for n, w in weights.items()}, x).unsqueeze(0)
        return forward_stacked(self.net, weights, x)


class AllWeightsModelSpec(FamilySection, ModuleChoice):
    """Every weight and bias a latent site (mean-field VI, MC dropout, MAP, HMC, SG-MCMC, SWAG); with include or
    exclude, those of the chosen modules (the others point estimates: include [out] is a last-layer BNN)."""

    offers = frozenset({WEIGHT_MATRICES})

    family: Literal["all_weights"] = Field("all_weights", description=(
        "all_weights: every weight and bias a latent site (formerly mean_field)"))

    def prior_sites(self, net: nn.Module) -> list[str]:
        self.check_modules(net)
        return AllWeightsBNN.prior_sites(net, self)

    def build(self, net: nn.Module, priors: dict[str, PriorSection], likelihood: Likelihood) -> AllWeightsBNN:
        return AllWeightsBNN(net, priors, likelihood, AllWeightsBNN.prior_sites(net, self))
