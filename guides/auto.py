"""Pyro's own autoguides (``pyro.infer.autoguide``) on a family's model: ``guide.name: auto`` with ``guide.auto``.

The adapter builds the autoguide on the family's model once it is bound to it (:meth:`AutoGuide.bind`, called by
the pipeline with two example rows), so its parameters exist before a fit or a checkpoint load. The Laplace
approximation is fitted as a MAP point and completed after the fit (:meth:`AutoGuide.finish`, on every training
row): Pyro's ``laplace_approximation`` turns the Hessian at that point into a full-covariance Gaussian, which the
adapter keeps in a multivariate-normal autoguide of its own, so that the checkpoint holds it. Parameters stay
local to the module (Pyro's ``module_local_params``), never in Pyro's global parameter store: two runs in one
process cannot share or overwrite each other's guide.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import pyro
import torch
from pydantic import Field, PositiveInt
from pyro import poutine
from pyro.infer import autoguide
from pyro.infer.autoguide.initialization import init_to_value
from pyro.poutine.util import site_is_subsample
from torch import nn
from torch.distributions import Normal, biject_to

from guides.base import (
    DEFAULT_INIT_RHO,
    INIT_RHO_CANDIDATES,
    ExactDrawMultivariateNormal,
    Guide,
    GuideSection,
    OpenInitRho,
    SettingChoice,
    softplus,
)
from zoo.errors import ZooInputError
from zoo.likelihoods.gaussian import Gaussian
from zoo.runs import check_covariance_fits
from zoo.sites import LatentSite

LBFGS_MAX_ITER = 2000  # laplace_approximation: the most L-BFGS iterations polishing the MAP point into the mode

LOG_Q_ROUNDOFF_MAX = 0.1  # nats: the most round-off may move log q at given draws before it is refused


def log_q_roundoff(posterior: ExactDrawMultivariateNormal, num_draws: int = 16) -> float:
    """The largest error, in nats, that scoring a draw of ``posterior`` by a triangular solve makes against its
    exact log q (from the noise that made it), over ``num_draws`` draws (torch's random state is left as it was).

    Given draws (a diagnostic's) can only be scored by the solve, and an ill-conditioned factor amplifies their
    round-off: measured at 0.003 nats on the toy's fit, 0.06 on a bostonHousing fit, over 1e23 on a diverging one.
    """
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        draws = posterior.rsample(torch.Size([num_draws]))
        return float((posterior.log_prob(draws) - posterior.log_prob(draws.clone())).abs().max())


class AutoMultivariateNormal(autoguide.AutoMultivariateNormal):
    """Pyro's AutoMultivariateNormal, its posterior scoring its own draws without a triangular solve.

    Same parameters, same ELBO; only log q at the guide's draw is computed from the noise that made it
    (:class:`~guides.base.ExactDrawMultivariateNormal`): its unit-triangular factor is free to become so
    ill-conditioned that float32 round-off makes Pyro's log q meaningless and the fit diverge.
    """

    def get_posterior(self, *args, **kwargs) -> ExactDrawMultivariateNormal:
        return ExactDrawMultivariateNormal(self.loc, scale_tril=self.scale[..., None] * self.scale_tril)


# guide.auto -> (Pyro's autoguide, what it is)
KINDS = {
    "normal": (autoguide.AutoNormal, "AutoNormal: a diagonal Gaussian per site (mean-field, no local "
               "reparameterisation)"),
    "low_rank_mvn": (autoguide.AutoLowRankMultivariateNormal, "AutoLowRankMultivariateNormal: diagonal + rank "
                     "guide.rank covariance over all latents"),
    "mvn": (AutoMultivariateNormal, "AutoMultivariateNormal: a full-covariance Gaussian over all latents "
            "(D^2 parameters)"),
    "iaf": (autoguide.AutoIAFNormal, "AutoIAFNormal: a normalising flow of guide.flows inverse autoregressive "
            "transforms (Pyro's default 3 D + 1 hidden units each)"),
    "laplace_approximation": (autoguide.AutoLaplaceApproximation, "AutoLaplaceApproximation: a MAP fit of all "
                              "latents, then a Gaussian with the inverse Hessian of -log p(y, w) there as covariance "
                              "(D^2 entries, D second-derivative passes over the training rows)"),
}


def latent_dim(trace: poutine.Trace) -> int:
    """Dimensions of the unconstrained latent that an autoguide over ``trace``'s latent sites covers."""
    return sum(biject_to(site["fn"].support).inv(site["value"]).numel() for site in trace.nodes.values()
               if site["type"] == "sample" and not site["is_observed"] and not site_is_subsample(site))


def check_rank(rank: int, dim: int) -> None:
    """Refuse a low-rank covariance part with more columns than the latent has dimensions (before any allocation:
    its D x rank factor and its rank x rank capacitance grow with the rank for no gain beyond D)."""
    if rank > dim:
        raise ZooInputError("guide.rank", rank, f"this model's latent has {dim} dimensions, which bounds the rank of "
                            f"the covariance's low-rank part: use guide.rank: {dim} or less (guide.auto: mvn is the "
                            "full covariance)")


# the D x D matrices held at once: mvn's scale_tril, its gradient and Adam's two moments; laplace_approximation's
# Hessian, its Cholesky factor, the covariance and the completed Gaussian's scale_tril
FULL_COVARIANCE = {"mvn": 4, "laplace_approximation": 4}
GAUSSIAN = ("normal", "low_rank_mvn", "mvn")  # the autoguides whose spread starts at init_scale = softplus(init_rho)


class AutoGuide(Guide):
    """One of Pyro's autoguides (``guide.auto``) over the family's own model; :meth:`bind` builds it on the model.

    :param sites: the family's latent sites (their initial values start the autoguide).
    :param spec: the guide section (which autoguide, its rank or flows, its initial scale).
    """

    # laplace_approximation's refusal blames a learned noise the polish shrank below this share of its start (it
    # words the refusal and changes no fit, so it is not among the module's constants that key the defaults suite)
    noise_collapse: ClassVar[float] = 0.1

    def __init__(self, sites: dict[str, LatentSite], spec: AutoGuideSpec) -> None:
        super().__init__()
        self.sites, self.spec = dict(sites), spec
        # a Gaussian autoguide's start is its init_scale = softplus(rho); the others have no spread to start
        self.rho_open = spec.init_rho is None and spec.auto in GAUSSIAN
        self.prior_scale_open = spec.auto in GAUSSIAN  # as the mean-field guide's (docs: the defaults page)
        self.init_rho = DEFAULT_INIT_RHO if spec.init_rho is None else spec.init_rho
        self.auto: nn.Module | None = None
        self.laplace: AutoMultivariateNormal | None = None  # laplace_approximation: the completed Gaussian
        self.register_buffer("laplace_ready", torch.tensor(False))  # whether finish() has filled it
        self._model: Callable | None = None
        self._example: tuple = ()

    def bind(self, model: Callable, *example: torch.Tensor, init: dict[str, torch.Tensor] | None = None) -> None:
        """Build the autoguide on ``model`` (traced once at ``example`` arguments), starting at the sites' initial
        values or at ``init``; a discrete latent site is refused by name.

        :param model: the family's Pyro model.
        :param example: model arguments of a few rows.
        :param init: values to start at instead of the sites' initial values.
        :raises ZooInputError: a discrete latent site, or a rank above the latent's dimensions.
        """
        self._model, self._example = model, example
        with torch.no_grad(), pyro.validation_enabled(False):
            trace = poutine.trace(model).get_trace(*example)
        for name, site in trace.nodes.items():
            if (site["type"] == "sample" and not site["is_observed"] and not site_is_subsample(site)
                    and getattr(site["fn"], "has_enumerate_support", False)):
                raise ZooInputError("guide.auto", self.spec.auto, f"site {name!r} is discrete, and Pyro's autoguides "
                                    "need continuous latents: use the zoo's own guides for this family")
        if self.spec.auto == "low_rank_mvn":
            check_rank(self.spec.rank, latent_dim(trace))
        if self.spec.auto in FULL_COVARIANCE:  # D x D: refused before Pyro allocates it
            check_covariance_fits("guide.auto", self.spec.auto, latent_dim(trace), example[0].element_size()
                                  if example and example[0].is_floating_point() else 4, FULL_COVARIANCE[self.spec.auto],
                                  lambda dim: f"a full covariance fits up to about {dim:,} latent dimensions here; use "
                                  "guide.auto: low_rank_mvn (D x rank) or normal, or a smaller net")
        values = {n: s.init for n, s in self.sites.items()} | dict(init or {})
        if example:  # a likelihood's own sites (a learned noise) start on the host; AutoContinuous concatenates all
            values = {n: v.to(example[0].device) for n, v in values.items()}
        options: dict = {"init_loc_fn": init_to_value(values=values)}
        if self.spec.auto in GAUSSIAN:
            options["init_scale"] = softplus(self.init_rho)
        if self.spec.auto == "low_rank_mvn":
            options["rank"] = self.spec.rank
        if self.spec.auto == "iaf":
            options["num_transforms"] = self.spec.flows
        builder = KINDS[self.spec.auto][0]
        with pyro.settings.context(module_local_params=True), pyro.validation_enabled(False):
            auto = builder(model, **options)
            auto(*example)  # creates the parameters now, so that a checkpoint can be loaded into them
            laplace = None
            if self.spec.auto == "laplace_approximation":  # its shape now (checkpoint keys), its values at finish()
                laplace = AutoMultivariateNormal(model, init_loc_fn=init_to_value(values=values))
                laplace(*example)
        device = next(iter(values.values())).device
        self.auto = auto.to(device)
        if self.spec.auto in GAUSSIAN:  # where Pyro started the scales, per unit of init_scale (take_setting's start)
            first = next(iter(self._scales().values())).detach().flatten()[0]
            self._scale_per_init_scale = float(biject_to(self.auto.scale_constraint)(first)) / options["init_scale"]
        self.laplace = laplace.to(device) if laplace is not None else None
        self.laplace_ready.fill_(False)

    def open_setting(self) -> SettingChoice | None:
        """Where a Gaussian autoguide's spread starts, where the section left ``init_rho`` null."""
        return SettingChoice("guide.init_rho", self.init_rho, INIT_RHO_CANDIDATES) if self.rho_open else None

    def take_setting(self, value: float) -> None:
        """Start the autoguide's spread at init_scale = softplus(``value``): its scale parameters (softplus-positive)
        where Pyro starts them for that init_scale (AutoLowRankMultivariateNormal's at sqrt(1/2) of it), so the guide
        is the one built at ``value``, whatever they hold now; its means, and a low-rank or full covariance's shape,
        keep their start."""
        self.init_rho = float(value)
        if self.auto is None:
            return  # bind() starts it there
        to_scale = biject_to(self.auto.scale_constraint)
        with torch.no_grad():
            for parameter in self._scales().values():
                start = torch.tensor(self._scale_per_init_scale * softplus(value), dtype=parameter.dtype)
                parameter.fill_(float(to_scale.inv(start)))

    def _scales(self) -> dict[str, nn.Parameter]:
        """The Gaussian autoguide's scale parameters (unconstrained), by name."""
        return {n: p for n, p in self.auto.named_parameters() if n.startswith("scales.") or n == "scale_unconstrained"}

    @property
    def active(self) -> nn.Module:
        """The autoguide that stands for the posterior: the completed Laplace Gaussian once there is one."""
        if self.auto is None:
            raise RuntimeError("the autoguide is not bound to a model: call bind(model, *example_args) first")
        return self.laplace if self.laplace is not None and bool(self.laplace_ready) else self.auto

    def finish(self, *args: torch.Tensor) -> str | None:
        """Complete the Laplace approximation with the model's arguments ``args`` (every training row; a caller that
        tempers the likelihood wraps this call in its handler); a no-op for the other autoguides. Returns what it
        did, for the run's log.

        A stochastic-gradient MAP fit stops near the mode, not at it, and there the Hessian of -log p(y, w) has
        negative eigenvalues (on the toy's 1-50-1 net after 3,000 Adam steps: 21 of 151). So the point is first
        polished by full-batch L-BFGS on the same objective (Pyro's ``Trace_ELBO`` of the MAP guide), then Pyro's
        ``laplace_approximation`` inverts the Hessian there. Where it is still not positive definite, this says so.
        """
        if self.laplace is None:
            return None
        started = time.perf_counter()
        objective = pyro.infer.Trace_ELBO().differentiable_loss
        with pyro.settings.context(module_local_params=True), pyro.validation_enabled(False):
            before = float(objective(self._model, self.auto, *args).detach())
            noise_before = self._learned_noise()
            polish = torch.optim.LBFGS([self.auto.loc], max_iter=LBFGS_MAX_ITER, history_size=50,
                                       tolerance_grad=1e-7, tolerance_change=1e-12, line_search_fn="strong_wolfe")

            def loss() -> torch.Tensor:
                polish.zero_grad()
                value = objective(self._model, self.auto, *args)
                value.backward()
                return value

            polish.step(loss)
            at_end = objective(self._model, self.auto, *args)
            after = float(at_end.detach())
            gradient = float(torch.autograd.grad(at_end, self.auto.loc)[0].norm())
            try:
                fitted = self.auto.laplace_approximation(*args)
                definite = bool(torch.isfinite(fitted.scale).all() and torch.isfinite(fitted.scale_tril).all())
            except torch.linalg.LinAlgError:
                definite = False
            if not definite:
                noise_after = self._learned_noise()
                if noise_before is not None and noise_after < noise_before * self.noise_collapse:
                    remedy = (f"the learned noise σ fell from {noise_before:.3g} to {noise_after:.3g} in the polish: "
                              "with a net that can fit its rows, -log p falls without bound as σ shrinks, so there "
                              "is no mode; fix likelihood.noise")
                elif gradient > 1e-2:
                    remedy = ("L-BFGS ended away from a stationary point; a longer full-batch MAP fit "
                              "(inference.num_steps, batch_size: null) may help, though on a ReLU net L-BFGS often "
                              "stalls at the kinks of -log p")
                elif self.auto.loc.dtype != torch.float64:
                    remedy = "in float32 the polish stops short of the mode: set dtype: float64"
                else:
                    remedy = ("a saddle or a kink (ReLU) of -log p, or a learned noise whose MAP collapses onto "
                              "the training residuals: fix likelihood.noise")
                raise ZooInputError("guide.auto", self.spec.auto, "the Hessian of -log p(y, w) at the MAP point "
                                    f"(polished by L-BFGS from {before:.6g} to {after:.6g}, gradient norm "
                                    f"{gradient:.2g} there) is not positive definite, so the point is not a mode "
                                    f"({remedy}); the zoo's Laplace members use the GGN, which is positive "
                                    "definite at any point: member: kfac_laplace or diagonal_laplace (every "
                                    "weight), last_layer_laplace or subnetwork_laplace")
            with torch.no_grad():
                self.laplace.loc.copy_(fitted.loc)
                self.laplace.scale = fitted.scale
                self.laplace.scale_tril = fitted.scale_tril
        self.laplace_ready.fill_(True)
        return (f"laplace_approximation: MAP point polished by L-BFGS (-log p {before:.6g} -> {after:.6g}), Hessian "
                f"over {self.laplace.loc.numel()} latent dimensions inverted; {time.perf_counter() - started:.1f} s")

    def _learned_noise(self) -> float | None:
        """The autoguide's point value of a Gaussian likelihood's learned noise σ (None where the model has none)."""
        site = Gaussian.noise_site
        location = self._location(site) if site in self.sites else None
        if location is None:
            return None
        with torch.no_grad():
            return float(biject_to(self.sites[site].support)(location))

    def forward(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        """Sample every latent site from the autoguide (with the model's arguments, as Pyro's SVI passes them)."""
        guide = self.active
        with pyro.settings.context(module_local_params=True):
            return guide(*args, **kwargs)

    def point_estimate(self) -> dict[str, torch.Tensor]:
        """The autoguide's median of every site in constrained space (a flow has none in closed form: there, the
        mean of 256 draws)."""
        with torch.no_grad(), pyro.settings.context(module_local_params=True):
            try:
                values = self.active.median(*self._example)
            except NotImplementedError:
                draws = [self.active(*self._example) for _ in range(256)]
                values = {n: torch.stack([d[n] for d in draws]).mean(0) for n in self.sites}
            return {n: v.detach().clone() for n, v in values.items() if n in self.sites}

    @property
    def density_unavailable(self) -> str | None:
        """Why log q cannot be evaluated at given draws, or None: a flow's density there needs its inverse, an
        iteration over every latent dimension that float32 round-off makes diverge (measured: log q of -4e15 at
        the flow's own draws on the toy); a full-covariance Gaussian's needs a triangular solve that can amplify
        the draws' round-off beyond use (:func:`log_q_roundoff`)."""
        if self.spec.auto == "iaf":
            return ("an inverse autoregressive flow's density at given draws needs the flow's inverse, which is "
                    "numerically unstable in float32")
        active = self.active
        if isinstance(active, AutoMultivariateNormal):
            with pyro.settings.context(module_local_params=True):
                error = log_q_roundoff(active.get_posterior())
            if error > LOG_Q_ROUNDOFF_MAX:
                return (f"the Cholesky factor is so ill-conditioned that round-off in a draw moves log q by up to "
                        f"{error:.3g} nats when it is scored by a triangular solve (refit in float64)")
        return None

    def log_density(self, draws: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """log q(w) at S draws ``{site: [S, ...]}`` ``[S]``: the autoguide's density over the unconstrained latent
        u(w), with each site's log|det du/dw|. AutoNormal's Gaussian is per site; the others' (mvn, low_rank_mvn,
        iaf, laplace) is one joint latent. AutoNormal emits each site as the image of an auxiliary draw
        ``<site>_unconstrained``, so a trace conditioned on the sites' values alone would draw that auxiliary
        afresh (and take the site for a point mass): its density is computed here from the values instead."""
        guide = self.active
        if not isinstance(guide, autoguide.AutoNormal | autoguide.AutoContinuous):
            return None
        total = next(iter(draws.values())).shape[0]
        raws, log_det = {}, 0.0
        with torch.no_grad(), pyro.settings.context(module_local_params=True):
            for name, site in guide.prototype_trace.iter_stochastic_nodes():
                transform = biject_to(site["fn"].support)
                raws[name] = raw = transform.inv(draws[name])
                log_det = log_det + transform.inv.log_abs_det_jacobian(draws[name], raw).reshape(total, -1).sum(-1)
            if isinstance(guide, autoguide.AutoNormal):
                density = sum(Normal(*guide._get_loc_and_scale(name)).log_prob(raw).reshape(total, -1).sum(-1)
                              for name, raw in raws.items())
            else:
                joint = torch.cat([raws[name].reshape(total, -1) for name in guide._unconstrained_shapes], dim=-1)
                density = guide.get_posterior().log_prob(joint)
            return density + log_det

    def init_from(self, values: dict[str, torch.Tensor]) -> list[str]:
        """Move the autoguide's location to point values (e.g. a MAP fit) in place, its parameters kept (an optimiser
        over them stays valid); AutoIAFNormal, whose flows have no location, matches none.

        :param values: ``{site: value}`` in constrained space.
        :returns: the sites that were matched.
        """
        matched = {n: v.to(self.sites[n].init) for n, v in values.items()
                   if n in self.sites and v.shape == self.sites[n].shape and self.locates(n)}
        with torch.no_grad():
            for name, value in matched.items():
                location = self._location(name)
                location.copy_(biject_to(self.sites[name].support).inv(value).reshape(location.shape))
        return list(matched)

    def locates(self, site: str) -> bool:
        """Whether :meth:`init_from` moves ``site``: AutoNormal's own location, or its place in an AutoContinuous
        location vector; not AutoIAFNormal's flows."""
        return self.auto is not None and site in self.sites and self._location(site) is not None

    def _location(self, site: str) -> torch.Tensor | None:
        """The unconstrained location of ``site`` in the autoguide's parameters (a view: writing to it moves the
        guide), or None where the autoguide has none."""
        if isinstance(self.auto, autoguide.AutoNormal):
            return dict(self.auto.named_parameters())[f"locs.{site}_unconstrained"]
        shapes = getattr(self.auto, "_unconstrained_shapes", {})
        if not hasattr(self.auto, "loc") or site not in shapes:
            return None
        before = list(shapes)[:list(shapes).index(site)]  # AutoContinuous packs the sites' locations in this order
        begin = sum(math.prod(shapes[name]) for name in before)
        return self.auto.loc[begin:begin + math.prod(shapes[site])]


class AutoGuideSpec(GuideSection):
    """One of Pyro's autoguides (pyro.infer.autoguide) wrapping the family's model."""

    former_defaults: ClassVar[dict[str, tuple[Any, ...]]] = {"init_rho": (DEFAULT_INIT_RHO,)}  # until 2026-12-06

    name: Literal["auto"] = Field(description="auto")
    auto: Literal["normal", "low_rank_mvn", "mvn", "iaf", "laplace_approximation"] = Field(
        "normal", description="which of Pyro's autoguides (AutoNormal, AutoLowRankMultivariateNormal, "
        "AutoMultivariateNormal, AutoIAFNormal, AutoLaplaceApproximation: a MAP fit, then the inverse Hessian "
        "there as covariance) wraps the family's model")
    rank: PositiveInt = Field(10, description="low_rank_mvn: the rank of the covariance's low-rank part")
    flows: PositiveInt = Field(2, description="iaf: number of inverse autoregressive transforms")
    init_rho: OpenInitRho  # read by the Gaussian autoguides (normal, low_rank_mvn, mvn)

    @property
    def label(self) -> str:
        return f"auto:{self.auto}"

    @property
    def chosen_by(self) -> tuple[str, str]:
        return "guide.auto", self.auto

    @property
    def needs_every_row(self) -> bool:
        return self.auto == "laplace_approximation"  # its Hessian is taken over every training row at once

    def build(self, sites: dict[str, LatentSite]) -> AutoGuide:
        return AutoGuide(sites, self)
