"""The ELBO used by SVI: Pyro's TraceMeanField_ELBO estimator, with the per-step bookkeeping cut down.

Pyro's ``TraceMeanField_ELBO`` traces the guide, replays and traces the model, copies both traces, and
computes the log-density of every site before it knows which terms are analytic KLs; for a small BNN that
bookkeeping costs more than the maths. This subclass keeps the estimator — analytic KL where one is
registered, ``log q - log p`` at the guide's sample otherwise, the plate-scaled log-likelihood of observed
sites — but records sites with one lean messenger per run and evaluates each density only where it is used.
A test checks it against Pyro's own class, value and gradients. It also reports which sites used which KL,
keeps the per-site terms of the last evaluation for diagnosis, and has a KL weight for annealing.
"""

from __future__ import annotations

import pyro.distributions as dist
import torch
from pyro.distributions.util import scale_and_mask
from pyro.infer import TraceMeanField_ELBO
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample
from torch.distributions import kl_divergence

ANALYTIC, MONTE_CARLO = "analytic", "monte_carlo"


def _sum(term: torch.Tensor) -> torch.Tensor:
    # Independent(...) already sums its event dims: skip the no-op sum (one graph node fewer per site and step).
    return term if term.dim() == 0 else term.sum()


class SiteRecorder(Messenger):
    """Records the sample sites of one run (name -> final message); with ``replay``, reuses their values.

    A lean stand-in for ``poutine.trace`` (+ ``poutine.replay``) inside the ELBO: no trace graph, no copies.
    """

    def __init__(self, replay: dict[str, dict] | None = None) -> None:
        super().__init__()
        self.replay = replay
        self.sites: dict[str, dict] = {}

    def _pyro_sample(self, msg: dict) -> None:
        if self.replay is None or msg["is_observed"]:
            return
        guide_site = self.replay.get(msg["name"])
        if guide_site is not None:
            msg["value"] = guide_site["value"]
            msg["done"] = True

    def _pyro_post_sample(self, msg: dict) -> None:
        if not site_is_subsample(msg):
            self.sites[msg["name"]] = msg


class LazyTraceMeanField_ELBO(TraceMeanField_ELBO):  # noqa: N801 - Pyro's naming convention for ELBOs
    """``TraceMeanField_ELBO`` with lean tracing, lazy densities, a KL weight, and a record of KL methods per site.

    ``analytic_kl=False`` gives the plain Monte Carlo KL everywhere (the ``Trace_ELBO`` estimator).
    """

    def __init__(self, num_particles: int = 1, analytic_kl: bool = True) -> None:
        super().__init__(num_particles=num_particles)
        self.analytic_kl = analytic_kl
        self.kl_weight: float | torch.Tensor = 1.0
        self.temperature = 1.0  # posterior tempering: T * (negative ELBO of p^(1/T)) adds (1 - T) H[q]
        self.kl_methods: dict[str, str] = {}
        self.last_terms: dict[str, torch.Tensor] = {}

    def _run(self, model, guide, args, kwargs) -> tuple[dict[str, dict], dict[str, dict]]:
        with SiteRecorder() as guide_run:
            guide(*args, **kwargs)
        with SiteRecorder(replay=guide_run.sites) as model_run:
            model(*args, **kwargs)
        return model_run.sites, guide_run.sites

    def _kl(self, name: str, guide_site: dict, model_site: dict) -> torch.Tensor:
        q, p = guide_site["fn"], model_site["fn"]
        kl = None
        # a Delta carrying a log density (the sites of Pyro's joint autoguides, deterministic functions of their
        # latent) has no analytic KL: Pyro's KL(Delta || p) would drop that density
        if (self.analytic_kl and self.kl_methods.get(name) != MONTE_CARLO
                and not isinstance(getattr(q, "base_dist", q), dist.Delta)):
            try:
                kl = kl_divergence(q, p)
                self.kl_methods[name] = ANALYTIC
            except NotImplementedError:
                pass
        if kl is None:
            self.kl_methods[name] = MONTE_CARLO
            value = guide_site["value"]
            kl = q.log_prob(value) - p.log_prob(value)
        return _sum(scale_and_mask(kl, guide_site["scale"], guide_site["mask"]))

    def _entropy(self, guide_site: dict) -> torch.Tensor:
        """H[q] of one guide site (analytic where the distribution has it, else -log q at the draw), plate-scaled."""
        q = guide_site["fn"]
        try:
            entropy = q.entropy()
        except NotImplementedError:
            entropy = -q.log_prob(guide_site["value"])
        return _sum(scale_and_mask(entropy, guide_site["scale"], guide_site["mask"]))

    def _particle(self, model_sites: dict[str, dict], guide_sites: dict[str, dict]) -> torch.Tensor:
        log_lik, kl, entropy = 0.0, 0.0, 0.0
        terms = {}
        for name, site in model_sites.items():
            if site["is_observed"]:
                term = _sum(scale_and_mask(site["fn"].log_prob(site["value"]), site["scale"], site["mask"]))
                log_lik = log_lik + term
            else:
                if name not in guide_sites:
                    raise ValueError(f"latent site '{name}' of the model has no counterpart in the guide")
                term = self._kl(name, guide_sites[name], site)
                kl = kl + term
                if self.temperature != 1.0:
                    entropy = entropy + self._entropy(guide_sites[name])
            terms[name] = term
        for name, site in guide_sites.items():  # guide-only latents (an autoguide's joint latent): their log q
            if name not in model_sites and not site["is_observed"]:
                kl = kl + _sum(scale_and_mask(site["fn"].log_prob(site["value"]), site["scale"], site["mask"]))
                if self.temperature != 1.0:
                    entropy = entropy + self._entropy(site)
        self.last_terms = terms
        if isinstance(self.kl_weight, torch.Tensor) or self.kl_weight != 1.0:  # a tensor while being compiled
            kl = self.kl_weight * kl
        loss = kl - log_lik
        if self.temperature != 1.0:  # T x the negative ELBO of p^(1/T): -E_q log p(y | w) + KL(q || p) + (1 - T) H[q]
            loss = loss + (1.0 - self.temperature) * entropy
        return loss

    def differentiable_loss(self, model, guide, *args, **kwargs) -> torch.Tensor:
        """Negative ELBO averaged over particles, differentiable with respect to every parameter used."""
        if self.num_particles == 1:
            return self._particle(*self._run(model, guide, args, kwargs))
        loss = 0.0
        for _ in range(self.num_particles):
            loss = loss + self._particle(*self._run(model, guide, args, kwargs))
        return loss / self.num_particles

    def loss(self, model, guide, *args, **kwargs) -> float:
        """Negative ELBO estimate as a float."""
        with torch.no_grad():
            return float(self.differentiable_loss(model, guide, *args, **kwargs))

    def loss_and_grads(self, model, guide, *args, **kwargs) -> float:
        """Negative ELBO as a float, with its gradients accumulated into the parameters' ``.grad``."""
        loss = self.differentiable_loss(model, guide, *args, **kwargs)
        loss.backward()
        return float(loss.detach())


ELBOS = {
    "trace_mean_field": lambda num_particles: LazyTraceMeanField_ELBO(num_particles, analytic_kl=True),
    "trace": lambda num_particles: LazyTraceMeanField_ELBO(num_particles, analytic_kl=False),
}
