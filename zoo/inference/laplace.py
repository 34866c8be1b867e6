"""Linearised Laplace over a family's random weights: a full or diagonal Gaussian with an evidence-tuned prior.

For a family that can linearise its net around the MAP (``family.linearise(x) -> f, J``: the subnetwork family),
the posterior over its vector weight site θ is N(θ_MAP, (G + Λ)⁻¹), with G = Σ_n J_nᵀ Λ_n J_n the generalised
Gauss-Newton matrix (GGN) and Λ the diagonal prior precision. Λ (one value per group: all, per layer, or per
parameter tensor) and, for regression with a learned noise, the noise σ maximise the marginal likelihood of the
linearised model f_lin(θ) = f + J (θ - θ_MAP), evaluated at that model's own mode θ* (Antorán et al. 2022):

    log Z = log p(y | f_lin(θ*)) - ½ θ*ᵀ Λ θ* + ½ log|Λ| - ½ log|G + Λ|

with G the GGN at the linearisation point, the posterior's own curvature. For a Gaussian likelihood G does not
depend on θ, and θ* and log Z are closed-form functions of (Λ, σ), maximised jointly by L-BFGS; for a categorical
one θ* is found by Newton's method (conjugate gradients on GGN-vector products, no GGN formed) and Λ by Newton's
method on the few groups, in turn: a minorise-maximise scheme whose evidence never decreases
(:func:`tune_classification`). (The curvature at θ* itself, G(θ*), would make log Z depend on θ* through the
determinant too, and the alternation would no longer be guaranteed to climb.)

With a diagonal covariance (``guide.covariance: diag``) only the GGN's diagonal is summed, from the layer factors
(no Jacobian, no D x D matrix: every weight of a large net), the posterior is N(θ_MAP, diag(1 / (diag G + Λ))) and
the evidence is evaluated at the MAP (MacKay; laplace-torch's ``hessian_structure='diag'``). With a Kronecker-factored
one (``guide.covariance: kron``, KFAC) each weight tensor's GGN block is G ⊗ A, an output and an input factor summed
from the same layer factors; their eigen-decompositions give the posterior (G ⊗ A + δ I)⁻¹ per tensor and the
evidence at the MAP in closed form (laplace-torch's ``hessian_structure='kron'``). With a low-rank one
(``guide.covariance: lowrank``) the GGN's leading eigenpairs come from a randomised eigensolver on GGN-vector
products (forward- and reverse-mode, no Jacobian), the posterior precision is Λ + U E Uᵀ, and the evidence at the
MAP costs a k x k determinant (laplace-torch's ``hessian_structure='lowrank'``).

Predictions use the linearised net (GLM: closed form for regression, probit, Laplace
bridge or Monte Carlo for classification) or the net itself at posterior draws; every score of a run uses the one
its spec names.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveFloat, PositiveInt

from guides.laplace import FULL_COVARIANCE_MAX, LaplaceGuide
from zoo import metrics
from zoo.curvature import KroneckerBlock, LowRankScale, OutputJacobian
from zoo.errors import TrainingDiverged, ZooInputError
from zoo.evaluate import evaluate
from zoo.inference.base import FitContext, InferenceMethod, guide_fit_record, load_guide_checkpoint
from zoo.inference.noise_choice import log_noise_window
from zoo.likelihoods import PredictiveDraws, categorical_hessian_root, gaussian
from zoo.models import FAMILIES
from zoo.models.base import ModelFamily
from zoo.posterior import GuidePosterior
from zoo.runs import CHECKPOINT_FILE, check_size_fits, checkpoint_exists, load_checkpoint, save_checkpoint
from zoo.sections import Tempered
from zoo.tasks import task_of

MAX_STORED_JACOBIAN = 200_000_000  # elements of J [N, O, D] kept in memory for classification's Newton steps
# The evidence is maximised over log prior precisions and log σ inside these bounds: a group the evidence would
# switch off entirely (precision -> infinity) stops at prior sd e^-7.5 ~ 5e-4, and the line search never tries
# values whose GGN + Λ is numerically singular.
LOG_PRECISION_RANGE = (-15.0, 15.0)
LOG_NOISE_RANGE = (-10.0, 5.0)
NEWTON_STEPS = 50  # Newton steps of the search for the linearised mode
CG_STEPS = 200  # conjugate-gradient steps that solve one Newton step
OUTER_ROUNDS = 20  # linearised-mode rounds, each one search for θ* (three on the digits MLP's last layer)
EVIDENCE_TOLERANCE = 1e-2  # nats (a Bayes factor of 1.01): the linearised-mode rounds stop when one gains less
MODE_TOLERANCE = 1e-10  # the linearised mode is found when a step moves no weight by more than this (relative)
DECREMENT_TOLERANCE = 1e-12  # ... or when the log joint is within this (relative) of its maximum
OVERSAMPLING = 10  # lowrank: the sketch's columns beyond the rank kept
POWER_ITERATIONS = 2  # lowrank: passes of subspace iteration before the Nyström step
GRID_LOG_PRECISIONS = torch.linspace(math.log(1e-4), math.log(1e4), 21).tolist()  # tune_by: calibration
LINKS = ("bridge", "probit", "mc")  # classification GLM links link_by: calibration chooses from (ties: the first)
# Where calibration rows reject the evidence's prior (precision_scale unset), the factors on its precisions tried
# besides 1: 10^0.5 to 10^4, the last all but the MAP's own predictive.
PRECISION_SCALES = tuple(10 ** (k / 2) for k in range(1, 9))
# The rows reject the evidence's posterior when its likeliest link's NLL exceeds the MAP net's by more than this
# many standard errors of the rows' paired differences: a one-sided test at 5 % that the predictive is worse than
# the net it linearises (a difference within noise keeps the evidence's spread).
REJECTION_STANDARD_ERRORS = 1.645
NO_CALIBRATION_ROWS = ("needs rows held out of training: pass val= to fit or set data.calibration_fraction (e.g. "
                       "0.1), or use tune_by: evidence")
NO_LINK_ROWS = ("chooses a classification GLM's link on rows held out of training: pass val= to fit or set "
                "data.calibration_fraction (e.g. 0.1), with predictive: glm on a classification task; or use "
                "link_by: fixed")


class LaplaceSpec(Tempered):
    """Linearised Laplace over the subnetwork family's random weights (Daxberger et al. 2021; Antorán et al. 2022).

    The posterior is N(MAP, (GGN + prior precision)^-1) with the generalised Gauss-Newton matrix of the subnet
    taken at the MAP. The prior precision (and a learned Gaussian noise) is tuned by maximising the linearised
    model's marginal likelihood, evaluated at the linearised model's own mode.
    """

    method: Literal["laplace"] = Field(description="laplace (needs model.family: subnetwork)")
    prior_structure: Literal["scalar", "layer", "parameter", "weight"] = Field(
        "layer", description="one prior precision for all, one per layer (module), one per parameter tensor "
        "(e.g. hidden0.weight and hidden0.bias apart), or one per weight (automatic relevance determination; "
        "guide.covariance full or diag)")
    tune: bool = Field(True, description="tune the prior precision (and a learned noise) by the evidence")
    tune_by: Literal["evidence", "calibration"] = Field(
        "evidence", description="evidence: maximise the marginal likelihood (at evidence_at); calibration: the one "
        "prior precision of a grid of 21 from 1e-4 to 1e4 whose predictive (this section's predictive and link) "
        "scores best on the calibration rows held out of training (NLL, or test LL for regression; "
        "data.calibration_fraction > 0 and prior_structure: scalar; laplace-torch's gridsearch)")
    tune_iterations: PositiveInt = Field(100, description="L-BFGS iterations of the evidence maximisation")
    evidence_at: Literal["linearised_mode", "map"] | None = Field(
        None, description="where the evidence is evaluated: the linearised model's own mode for each prior (Antorán "
        "et al. 2022; with the GGN of the MAP, the posterior's curvature), or the MAP of the net (MacKay; Immer et "
        "al. 2021); unset: linearised_mode for a full "
        "covariance, map for a diagonal, Kronecker-factored or low-rank one (the only place their GGN gives it)")
    curvature: Literal["ggn", "ef"] = Field(
        "ggn", description="the likelihood's curvature: ggn, the generalised Gauss-Newton matrix; ef, the empirical "
        "Fisher (each row's loss gradient squared: no second derivative; guide.covariance diag or kron)")
    predictive: Literal["glm", "nn"] = Field(
        "glm", description="glm: the linearised net (closed form for regression); nn: the net itself at draws")
    link: Literal["probit", "bridge", "mc"] = Field(
        "probit", description="classification glm: the probit approximation, the Laplace bridge (a Dirichlet) or "
        "Monte Carlo over the linearised logits; predict, evaluate, metrics.json and the shift report all use it "
        "(the one link_by chose, where it chose)")
    link_by: Literal["calibration", "fixed"] | None = Field(
        None, description="classification glm: calibration, use the link (of probit, bridge and mc) whose predictive "
        "is likeliest on the calibration rows; fixed, always link; unset: calibration where the fit has calibration "
        "rows (fit(val=...) or data.calibration_fraction), fixed otherwise")
    precision_scale: PositiveFloat | None = Field(
        None, description="a factor on the tuned prior precisions (every group's alike), which narrows the "
        "posterior (above 1) or widens it; unset: 1, except where a classification fit chooses its link on "
        "calibration rows (link_by), tunes its prior by the evidence, and those rows reject its predictive against "
        f"the MAP net alone (an NLL higher by more than {REJECTION_STANDARD_ERRORS:g} standard errors of the rows' "
        "paired differences: a one-sided test at 5 %): then the factor of 1 and 10^0.5 to 10^4 whose predictive, "
        "at its likeliest link, scores best there")
    noise_by: Literal["evidence", "calibration"] | None = Field(
        None, description="a learned Gaussian noise σ: evidence, tuned with the prior by the evidence on the "
        "training rows; calibration, then set to the σ whose GLM predictive is likeliest on the calibration rows, "
        "the evidence's prior precision kept and the posterior recomputed at each σ tried (what a MAP that fits "
        "its training rows closer than new ones needs); unset: calibration where the fit has calibration rows "
        "(fit(val=...) or data.calibration_fraction) and predictive glm, evidence otherwise")
    chunk_size: PositiveInt = Field(256, description="rows per Jacobian batch (memory vs speed)")
    predictive_samples: PositiveInt = Field(200, description="draws used for test metrics")


@dataclass
class LaplaceResult:
    """What the Laplace fit leaves besides the guide: the tuned prior and noise, the evidence and the cost.

    :param seconds: the fit's wall time.
    :param log_evidence: log Z of the linearised model at the tuned prior (and noise), before the noise is set on
        calibration rows.
    :param prior_precision: the tuned prior precision of each group (``all``, a layer or a parameter tensor).
    :param noise: the Gaussian noise σ in standardised units (tuned where learned); None for classification.
    :param posterior: the fitted posterior.
    :param link: the classification link the fit chose on calibration rows (``inference.link_by``); None where it
        chose none (the spec's ``link`` stands).
    :param precision_scale: the factor on the evidence's prior precisions the fit chose with its link, where the
        calibration rows rejected the evidence's predictive against the MAP net alone (``inference.precision_scale``);
        None where it chose none (``prior_precision`` is then the evidence's, or the spec's factor on it).
    """

    seconds: float = 0.0
    log_evidence: float = float("nan")
    prior_precision: dict[str, float] = field(default_factory=dict)
    noise: float | None = None
    posterior: LaplacePosterior | None = None
    link: str | None = None
    precision_scale: float | None = None

    @property
    def chosen(self) -> dict[str, Any]:
        """What the fit chose on its calibration rows, by spec field: the link, and the factor on the prior
        precisions, where it chose them."""
        return ({} if self.link is None else {"inference.link": self.link}) | (
            {} if self.precision_scale is None else {"inference.precision_scale": self.precision_scale})


# ------------------------------------------------------------------------------------------ the posterior
class LaplacePosterior(GuidePosterior):
    """The Laplace posterior: draws from the Gaussian guide; predictions from the linearised net (GLM) or the net.

    :param family: the linearisable family the guide was fitted to.
    :param guide: the fitted Laplace guide.
    :param predictive: ``glm`` (the linearised net) or ``nn`` (the net itself at draws).
    :param link: the classification GLM's ``probit`` approximation, ``bridge`` (the Laplace bridge) or ``mc`` (Monte
        Carlo over the linearised logits).
    :param chunk_size: rows per Jacobian batch of the GLM.
    :raises ZooInputError: when the guide does not hold exactly one Gaussian site.
    """

    def __init__(self, family: ModelFamily, guide: LaplaceGuide, predictive: str = "glm", link: str = "probit",
                 chunk_size: int = 256) -> None:
        super().__init__(family, guide)
        self.predictive, self.link, self.chunk_size = predictive, link, chunk_size
        self.site = gaussian_site(guide)

    @classmethod
    def from_spec(cls, family: ModelFamily, guide: LaplaceGuide, spec: LaplaceSpec,
                  chosen_link: str | None = None) -> LaplacePosterior:
        """The posterior with the spec's predictive settings.

        :param family: the linearisable family the guide was fitted to.
        :param guide: the fitted Laplace guide.
        :param spec: the run's ``inference`` section (its ``predictive``, ``link`` and ``chunk_size``).
        :param chosen_link: the link the fit chose on calibration rows, in place of the spec's (``link_by``).
        :returns: the posterior.
        """
        return cls(family, guide, spec.predictive, chosen_link or spec.link, spec.chunk_size)

    def scoring_draws(self, num_samples: int) -> dict[str, torch.Tensor] | None:
        """The draws a set of scores shares: none for the GLM predictive, which scores every set of inputs from its
        outputs' Gaussian (closed forms, or draws of the logits for ``link: mc``).

        :param num_samples: how many draws to take where the predictive needs them.
        :returns: None for the GLM, else ``num_samples`` draws of the Gaussian site.
        """
        return None if self.predictive == "glm" else super().scoring_draws(num_samples)

    def _noise(self) -> torch.Tensor | float:
        return self.family.likelihood.noise(self.guide.point_estimate())

    def glm_moments(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and covariance of the linearised net's outputs f (no observation noise), :attr:`chunk_size` rows
        at a time.

        :param x: inputs ``[B, D]``, standardised like the training rows.
        :returns: the mean ``[B, O]`` and the covariance ``[B, O, O]``.
        """
        means, covs = [], []
        with torch.no_grad():
            if self.guide.factored:  # from the layer factors (and forward-mode products), without J
                covariance = {"kron": self.guide.kronecker_blocks, "lowrank": self.guide.low_rank_scale}.get(
                    self.guide.covariance, self.guide.variance)(self.site)
                for xc in x.split(self.chunk_size):
                    f, cov = self.family.linearised_covariance(xc, covariance)
                    means.append(f)
                    covs.append(cov)
                return torch.cat(means), torch.cat(covs)
            scale_tril = self.guide.scale_tril[self.site.replace(".", "/")]
        for xc in x.split(self.chunk_size):
            f, J = self.family.linearise(xc)
            root = J @ scale_tril  # J L: [B, O, D]
            means.append(f)
            covs.append(root @ root.transpose(-1, -2))
        return torch.cat(means), torch.cat(covs)

    def predict(self, x: torch.Tensor, num_samples: int | None = None, draws: dict[str, torch.Tensor] | None = None,
                chunk_size: int | None = None) -> PredictiveDraws:
        """GLM: from the linearised net's Gaussian outputs when no draws are given (the closed form for regression,
        probit or the Laplace bridge; for ``link: mc``, ``num_samples`` draws of the logits), else the linearised net
        at each draw; NN: the net itself at each draw.

        :param x: inputs ``[B, D]``, standardised like the training rows.
        :param num_samples: how many weight draws to take where draws are used; ignored when ``draws`` is given and
            by the closed forms.
        :param draws: weight draws ``{site: [S, ...]}`` to predict with.
        :param chunk_size: inputs scored at a time by the net (``nn``); the GLM's Jacobians take :attr:`chunk_size`.
        :returns: one predictive distribution per draw at the ``B`` inputs; the closed forms give one
            (``loc``/``scale [1, B]`` or ``log_probs [1, B, C]``), ``link: mc`` one per draw of the logits.
        :raises ValueError: when draws are needed and neither ``num_samples`` nor ``draws`` is given.
        """
        if self.predictive == "nn":
            return super().predict(x, num_samples, draws, chunk_size)
        if draws is None and self.predictive == "glm":
            if self.link == "mc" and not self.family.likelihood.gaussian and num_samples is None:
                raise ValueError("predict needs num_samples or draws")
            mean, cov = self.glm_moments(x)
            if self.family.likelihood.gaussian:
                noise = torch.as_tensor(self._noise(), dtype=mean.dtype, device=mean.device)
                return PredictiveDraws(loc=mean[None, :, 0], scale=(noise**2 + cov[:, 0, 0]).sqrt()[None])
            return PredictiveDraws(log_probs=link_log_probs(self.link, mean, cov, num_samples))
        if draws is None:
            if num_samples is None:
                raise ValueError("predict needs num_samples or draws")
            draws = self.sample(num_samples)
        with torch.no_grad():
            centre = self.guide.point_estimate()[self.site]
            shift = draws[self.site] - centre  # [S, D]
            parts = []
            for xc in x.split(self.chunk_size):
                if self.guide.factored:  # forward-mode products: no [B, O, D] Jacobian over every weight
                    outputs = self.family.linearised_outputs(xc, shift)
                else:
                    f, J = self.family.linearise(xc)
                    outputs = f + (J @ shift.T).movedim(-1, 0)
                parts.append(self.family.likelihood.predictive(outputs, draws))
            return PredictiveDraws.concat(parts)


def link_log_probs(link: str, mean: torch.Tensor, covariance: torch.Tensor, num_samples: int | None = None,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """Class log-probabilities of linearised logits N(mean, covariance) under a classification link.

    Drawing the logits from their Gaussian is the same distribution as drawing the weights and linearising (the
    logits are linear in them), at the cost of one K x K eigendecomposition a row instead of a Jacobian product a
    draw.

    :param link: ``probit`` (each logit's mean over √(1 + π v / 8)), ``bridge`` (:func:`laplace_bridge`) or ``mc``.
    :param mean: the logits' means ``[B, K]``.
    :param covariance: their covariance per row ``[B, K, K]``.
    :param num_samples: ``mc``'s draws of the logits.
    :param generator: ``mc``'s random numbers (None: torch's global generator, which Pyro's seed sets).
    :returns: log p ``[1, B, K]`` for a closed form, ``[S, B, K]`` for ``mc``'s S draws.
    """
    variance = covariance.diagonal(dim1=-2, dim2=-1)
    if link == "bridge":
        return laplace_bridge(mean, variance)[None]
    if link == "probit":
        return F.log_softmax(mean / (1 + math.pi / 8 * variance).sqrt(), -1)[None]
    eigenvalues, eigenvectors = torch.linalg.eigh(covariance)
    root = eigenvectors * eigenvalues.clamp_min(0).sqrt()[..., None, :]
    noise = torch.randn(num_samples, *mean.shape, generator=generator, dtype=mean.dtype, device=mean.device)
    return F.log_softmax(mean + torch.einsum("bij,sbj->sbi", root, noise), -1)


def laplace_bridge(mean: torch.Tensor, variance: torch.Tensor) -> torch.Tensor:
    """The Laplace bridge's class log-probabilities: the mean of the Dirichlet that matches N(mean, diag(variance))
    over the logits (Hobbhahn, Kristiadi & Hennig 2022, eq. 11),

        α_k = (1 - 2/K + e^{m_k} Σ_l e^{-m_l} / K²) / v_k,    p_k = α_k / Σ_l α_l,

    with the logit means first centred per row (a shift that leaves softmax unchanged), as in the bridge's derivation.

    :param mean: the logits' means ``[B, K]``.
    :param variance: their variances ``[B, K]``.
    :returns: log p ``[B, K]``.
    """
    classes = mean.shape[-1]
    mean = mean - mean.mean(-1, keepdim=True)
    log_sum = torch.logsumexp(-mean, -1, keepdim=True)
    # log α in log space: a confident net's logits spread over more than float32's exp range
    log_alpha = (torch.logaddexp(torch.as_tensor(math.log(1 - 2 / classes) if classes > 2 else -math.inf).to(mean),
                                 mean + log_sum - 2 * math.log(classes))
                 - variance.clamp_min(torch.finfo(mean.dtype).tiny).log())
    return log_alpha - torch.logsumexp(log_alpha, -1, keepdim=True)


def precision_to_scale_tril(precision: torch.Tensor) -> torch.Tensor:
    """The lower Cholesky factor of P⁻¹ from a precision matrix P (Cholesky, inverse, Cholesky; the flipped-
    Cholesky shortcut with a triangular solve measured no faster here at D = 3,000).

    :param precision: a symmetric positive-definite ``[D, D]``.
    :returns: the lower-triangular ``L [D, D]`` with ``L Lᵀ = P⁻¹``.
    """
    return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(precision)))


def gaussian_site(guide: LaplaceGuide) -> str:
    """The one site the Laplace guide holds a Gaussian on.

    :param guide: a Laplace guide.
    :returns: the site's name.
    :raises ZooInputError: when the guide has no such site, or several.
    """
    names = [n for n in guide.sites if guide.is_gaussian(n)]
    if len(names) != 1:
        raise ZooInputError("guide.name", "laplace", f"needs exactly one vector weight site, found {names}")
    return names[0]


# ------------------------------------------------------------------------------------------ prior groups
def prior_groups(parameter_names: list[str], structure: str) -> tuple[torch.Tensor, list[str]]:
    """Group index ``[D]`` of each subnet element and the group labels, for a scalar/per-layer/per-parameter prior.

    :param parameter_names: the parameter tensor each subnet element belongs to, one per element (``hidden0.weight``).
    :param structure: ``scalar`` (one group, ``all``), ``layer`` (the name up to its last dot), ``parameter`` or
        ``weight`` (each element its own group, labelled by its parameter and its position in the subnet).
    :returns: the group index ``[D]`` and the group labels, in order of first appearance.
    """
    if structure == "scalar":
        keys = ["all"] * len(parameter_names)
    elif structure == "layer":
        keys = [n.rpartition(".")[0] for n in parameter_names]
    elif structure == "weight":
        keys = [f"{n}[{k}]" for k, n in enumerate(parameter_names)]
    else:
        keys = list(parameter_names)
    labels = list(dict.fromkeys(keys))
    position = {label: g for g, label in enumerate(labels)}
    index = torch.tensor([position[k] for k in keys], dtype=torch.long)
    return index, labels


# ------------------------------------------------------------------------------------------ evidence
def _logdet_from_cholesky(chol: torch.Tensor) -> torch.Tensor:
    return 2 * chol.diagonal().log().sum()


@dataclass
class GaussianStatistics:
    """Sufficient statistics of the linearised Gaussian model ỹ ≈ J θ with ỹ = y - f + J θ_MAP (one output).

    :param gram: Σ Jᵀ J ``[D, D]``.
    :param cross: Σ Jᵀ ỹ ``[D]``.
    :param sum_squares: Σ ỹ².
    :param n: rows summed over.
    :param at: where the evidence is evaluated (e.g. the MAP ``[D]``) instead of at the linearised mode; None for
        the mode.
    """

    gram: torch.Tensor  # Σ Jᵀ J  [D, D]
    cross: torch.Tensor  # Σ Jᵀ ỹ  [D]
    sum_squares: torch.Tensor  # Σ ỹ²
    n: int
    at: torch.Tensor | None = None  # evaluate the evidence here (e.g. the MAP) instead of at the linearised mode

    def mode_and_evidence(self, precision: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """θ* (or the fixed point ``at``) and log Z for prior precisions ``[D]`` and noise σ (differentiable).

        :param precision: the prior precision of each element ``[D]``.
        :param noise: the noise σ.
        :returns: θ ``[D]`` and log Z.
        """
        s2 = noise**2
        chol = torch.linalg.cholesky(self.gram / s2 + torch.diag(precision))
        if self.at is None:
            theta = torch.cholesky_solve((self.cross / s2).unsqueeze(-1), chol).squeeze(-1)
        else:
            theta = self.at
        residual = self.sum_squares - 2 * theta @ self.cross + theta @ self.gram @ theta
        log_z = (-0.5 * self.n * torch.log(2 * math.pi * s2) - 0.5 * residual / s2
                 - 0.5 * (precision * theta**2).sum() + 0.5 * precision.log().sum() - 0.5 * _logdet_from_cholesky(chol))
        return theta, log_z


def _lbfgs(params: list[torch.Tensor], objective, iterations: int) -> None:
    optimizer = torch.optim.LBFGS(params, lr=1.0, max_iter=iterations, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = objective()
        loss.backward()
        return loss

    optimizer.step(closure)


def maximise_evidence(evidence: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor],
                      group_index: torch.Tensor, log_precision: torch.Tensor, log_noise: torch.Tensor | None,
                      tune_noise: bool, iterations: int) -> None:
    """Maximise a closed-form log Z over the group precisions (and σ) by L-BFGS, in place, within
    :data:`LOG_PRECISION_RANGE` and :data:`LOG_NOISE_RANGE`.

    :param evidence: (each element's precision ``[D]``, σ or None) -> log Z, differentiable.
    :param group_index: each element's group ``[D]``.
    :param log_precision: the log precision of each group ``[G]``; tuned in place.
    :param log_noise: log σ (None: no noise, a categorical likelihood); tuned in place where ``tune_noise``.
    :param tune_noise: whether σ is tuned too (a learned noise) or held.
    :param iterations: L-BFGS iterations.
    """
    tuned = [log_precision.requires_grad_(True)] + ([log_noise.requires_grad_(True)] if tune_noise else [])

    def noise() -> torch.Tensor | None:
        return None if log_noise is None else _bounded(log_noise, LOG_NOISE_RANGE)

    _lbfgs(tuned, lambda: -evidence(_bounded(log_precision, LOG_PRECISION_RANGE)[group_index], noise()), iterations)
    with torch.no_grad():
        log_precision.requires_grad_(False).clamp_(*LOG_PRECISION_RANGE)
        if log_noise is not None:
            log_noise.requires_grad_(False).clamp_(*LOG_NOISE_RANGE)


def tune_regression(stats: GaussianStatistics, group_index: torch.Tensor, log_precision: torch.Tensor,
                    log_noise: torch.Tensor, tune_noise: bool, iterations: int) -> torch.Tensor:
    """Maximise the closed-form evidence over the group precisions (and σ) by L-BFGS (:func:`maximise_evidence`).

    :param stats: the linearised model's sufficient statistics.
    :param group_index: each element's group ``[D]``.
    :param log_precision: the log precision of each group ``[G]``; tuned in place, clamped to
        :data:`LOG_PRECISION_RANGE`.
    :param log_noise: log σ; tuned in place where ``tune_noise``, clamped to :data:`LOG_NOISE_RANGE`.
    :param tune_noise: whether σ is tuned too (a learned noise) or held.
    :param iterations: L-BFGS iterations.
    :returns: the final log Z.
    """
    maximise_evidence(lambda precision, noise: stats.mode_and_evidence(precision, noise)[1], group_index,
                      log_precision, log_noise, tune_noise, iterations)
    with torch.no_grad():
        return stats.mode_and_evidence(log_precision.exp()[group_index], log_noise.exp())[1]


def _bounded(log_value: torch.Tensor, bounds: tuple[float, float]) -> torch.Tensor:
    """exp of ``log_value`` clamped to ``bounds`` (no gradient pushes it further out)."""
    return log_value.clamp(*bounds).exp()


def _categorical_log_joint(f: torch.Tensor, J: OutputJacobian, y: torch.Tensor, centre: torch.Tensor,
                           theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = f + J @ (theta - centre)
    return -F.cross_entropy(logits, y.long(), reduction="sum"), logits


def _categorical_ggn(f: torch.Tensor, J: OutputJacobian) -> torch.Tensor:
    """The categorical GGN at the MAP's logits ``f`` ``[D, D]``."""
    return J.ggn(categorical_hessian_root(f))


def _preconditioned_cg(apply: Callable[[torch.Tensor], torch.Tensor], b: torch.Tensor, chol: torch.Tensor,
                       tolerance: float = 1e-12) -> torch.Tensor:
    """Solve A x = b for a symmetric positive definite A given as a product, by conjugate gradients preconditioned
    with the Cholesky factor of a nearby matrix (at most :data:`CG_STEPS` steps).

    :param apply: v -> A v.
    :param b: the right-hand side ``[D]``.
    :param chol: the lower Cholesky factor of the preconditioner M ≈ A.
    :param tolerance: stop when the residual is this small relative to ``b``.
    :returns: x ``[D]``.
    """
    x = torch.cholesky_solve(b[:, None], chol)[:, 0]  # exact where A = M
    r = b - apply(x)
    z = torch.cholesky_solve(r[:, None], chol)[:, 0]
    d, rz, limit = z.clone(), r @ z, tolerance * float(b.norm())
    for _ in range(CG_STEPS):
        if float(r.norm()) <= limit:
            break
        ad = apply(d)
        alpha = rz / (d @ ad)
        x, r = x + alpha * d, r - alpha * ad
        z = torch.cholesky_solve(r[:, None], chol)[:, 0]
        rz, previous = r @ z, rz
        d = z + (rz / previous) * d
    return x


def linearised_mode(f: torch.Tensor, J: OutputJacobian, y: torch.Tensor, centre: torch.Tensor,
                    precision: torch.Tensor, start: torch.Tensor | None = None,
                    preconditioner: torch.Tensor | None = None) -> torch.Tensor:
    """θ* = argmax log p(y | f + J (θ - centre)) - ½ θᵀ Λ θ of the linearised categorical model.

    Newton's method whose steps are solved by conjugate gradients on GGN-vector products (N C D each, where forming a
    GGN costs N C D²), preconditioned by the GGN at the MAP + Λ, as roughly as the gradient is large (inexact
    Newton, Eisenstat & Walker 1996), with a backtracking line search: no GGN is formed. It stops when a step moves no
    weight by more than :data:`MODE_TOLERANCE` (relative), or once the Newton decrement says the log joint is within
    :data:`DECREMENT_TOLERANCE` (relative) of its maximum (that last step taken whole), after at most
    :data:`NEWTON_STEPS` steps.

    :param f: the net's logits at the MAP ``[N, C]``.
    :param J: their Jacobian ``[N, C, D]``.
    :param y: class labels ``[N]``.
    :param centre: the MAP θ ``[D]``.
    :param precision: the prior precision of each element ``[D]``.
    :param start: where the steps start (None: ``centre``).
    :param preconditioner: the lower Cholesky factor of a matrix near the Hessian G(θ) + Λ (None: of the GGN at
        the MAP + Λ, built).
    :returns: θ* ``[D]``.
    """
    theta = (centre if start is None else start).clone()
    chol = preconditioner
    if chol is None:
        chol = torch.linalg.cholesky(_categorical_ggn(f, J) + torch.diag(precision))
    onehot = F.one_hot(y.long(), f.shape[1]).to(f)

    def loss(value: torch.Tensor) -> tuple[float, torch.Tensor]:
        """The negative log joint at ``value`` and the logits there."""
        log_joint, logits = _categorical_log_joint(f, J, y, centre, value)
        return float(-log_joint + 0.5 * (precision * value**2).sum()), logits

    (current, logits), first = loss(theta), None
    for _ in range(NEWTON_STEPS):
        p = logits.softmax(-1)
        gradient = J.vjp(p - onehot) + precision * theta
        norm = float(gradient.norm())
        first = norm if first is None else first
        forcing = min(0.5, math.sqrt(norm / max(first, 1e-300)))  # inexact Newton: rough steps while far

        def hessian_times(v: torch.Tensor, p: torch.Tensor = p) -> torch.Tensor:
            u = J @ v
            return J.vjp(p * u - p * (p * u).sum(-1, keepdim=True)) + precision * v

        step = _preconditioned_cg(hessian_times, gradient, chol, max(forcing, 1e-12))
        slope, size = float(gradient @ step), 1.0
        if slope < 2 * DECREMENT_TOLERANCE * (1 + abs(current)):  # ½ gᵀH⁻¹g: what the mode would still gain
            theta = theta - step
            break
        while size > 1e-10:
            trial = theta - size * step
            value, trial_logits = loss(trial)
            if value <= current - 1e-4 * size * slope + 1e-13 * abs(current):  # (rounding, near the mode)
                break
            size /= 2
        theta, current, logits = trial, value, trial_logits
        if size * float(step.abs().max()) < MODE_TOLERANCE * (1 + float(theta.abs().max())):
            break
    return theta


def _occam(precision: torch.Tensor, theta: torch.Tensor, curvature: torch.Tensor,
           eigenvalues: torch.Tensor | None = None) -> torch.Tensor:
    """The prior's part of log Z: -½ θᵀΛθ + ½ log|Λ| - ½ log|G + Λ| (with G's ``eigenvalues``, for a precision
    shared by every weight, without a Cholesky factorisation)."""
    if eigenvalues is None:
        return _occam_from_cholesky(precision, theta, torch.linalg.cholesky(curvature + torch.diag(precision)))
    shared = precision[0]
    return (-0.5 * shared * theta @ theta + 0.5 * len(theta) * shared.log()
            - 0.5 * (eigenvalues + shared).log().sum())


def _occam_from_cholesky(precision: torch.Tensor, theta: torch.Tensor, chol: torch.Tensor) -> torch.Tensor:
    """:func:`_occam` with the Cholesky factor of G + Λ already at hand."""
    return -0.5 * (precision * theta**2).sum() + 0.5 * precision.log().sum() - 0.5 * _logdet_from_cholesky(chol)


def occam_derivatives(log_precision: torch.Tensor, group_index: torch.Tensor, theta: torch.Tensor,
                      curvature: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Occam factor φ = -½ θᵀΛθ + ½ log|Λ| - ½ log|G + Λ| with its gradient and Hessian in the groups' log
    precisions ℓ (λ_i = exp ℓ_{g(i)}, S = (G + Λ)⁻¹):

        ∂φ/∂ℓ_g = ½ Σ_{i∈g} (1 - λ_i θ_i² - λ_i S_ii),
        ∂²φ/∂ℓ_g∂ℓ_h = ½ Σ_{i∈g} Σ_{j∈h} λ_i λ_j S_ij² - δ_gh ½ Σ_{i∈g} λ_i (θ_i² + S_ii).

    :param log_precision: ℓ ``[G]``.
    :param group_index: each element's group ``[D]``.
    :param theta: θ ``[D]``.
    :param curvature: G ``[D, D]``.
    :returns: φ, its gradient ``[G]`` and Hessian ``[G, G]``.
    """
    precision = log_precision.exp()[group_index]
    chol = torch.linalg.cholesky(curvature + torch.diag(precision))
    value = _occam_from_cholesky(precision, theta, chol)
    inverse = torch.cholesky_inverse(chol)
    groups = F.one_hot(group_index, len(log_precision)).to(theta)  # [D, G]
    own = precision * (theta**2 + inverse.diagonal())
    gradient = 0.5 * groups.T @ (1 - own)
    scaled = inverse * precision[:, None] * precision[None, :] * inverse
    hessian = 0.5 * groups.T @ scaled @ groups - torch.diag(0.5 * groups.T @ own)
    return value, gradient, hessian


def _occam_of(group_index: torch.Tensor, theta: torch.Tensor, curvature: torch.Tensor, groups: int,
              eigenvalues: torch.Tensor | None = None
              ) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """ℓ -> the Occam factor with its gradient and Hessian at fixed θ and G (:func:`occam_derivatives`). One
    precision λ over every weight needs only G's eigenvalues e (one ``eigvalsh``, then O(D) per ℓ, where each
    :func:`occam_derivatives` takes a Cholesky factorisation and an inverse):

        φ = -½ λ θᵀθ + ½ D log λ - ½ Σ log(e_i + λ),
        ∂φ/∂ℓ = ½ (D - λ θᵀθ - λ Σ 1/(e_i + λ)),
        ∂²φ/∂ℓ² = ½ λ² Σ 1/(e_i + λ)² - ½ λ (θᵀθ + Σ 1/(e_i + λ)).
    """
    if groups > 1:
        return lambda log_precision: occam_derivatives(log_precision, group_index, theta, curvature)
    if eigenvalues is None:
        eigenvalues = torch.linalg.eigvalsh(curvature).clamp_min(0)
    squares, size = theta @ theta, len(theta)

    def derivatives(log_precision: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        precision = log_precision.exp()
        inverse = 1 / (eigenvalues + precision)
        value = -0.5 * precision * squares + 0.5 * size * log_precision - 0.5 * (eigenvalues + precision).log().sum()
        trace = inverse.sum()
        gradient = 0.5 * (size - precision * squares - precision * trace)
        hessian = 0.5 * precision**2 * inverse.square().sum() - 0.5 * precision * (squares + trace)
        return value[0], gradient, hessian[:, None]

    return derivatives


def maximise_occam(log_precision: torch.Tensor, group_index: torch.Tensor, theta: torch.Tensor,
                   curvature: torch.Tensor, iterations: int, eigenvalues: torch.Tensor | None = None) -> None:
    """Maximise the Occam factor over the groups' log precisions at fixed θ and G, in place: Newton's method on the
    few groups (one Cholesky and one inverse of G + Λ per step, where a quasi-Newton search takes several
    Cholesky factorisations and their backward passes; one eigen-decomposition in all for a single precision), with
    a backtracking line search and a gradient step where the Hessian is not negative definite; the log precisions
    stay in :data:`LOG_PRECISION_RANGE`.

    :param log_precision: ℓ ``[G]``, updated in place.
    :param group_index: each element's group ``[D]``.
    :param theta: θ ``[D]``.
    :param curvature: G ``[D, D]``.
    :param iterations: the most Newton steps.
    :param eigenvalues: G's eigenvalues, when known (used for a single precision; None: computed).
    """
    occam = _occam_of(group_index, theta, curvature, len(log_precision), eigenvalues)
    value, gradient, hessian = occam(log_precision)
    for _ in range(iterations):
        try:
            direction = -torch.linalg.solve(hessian, gradient)
        except torch.linalg.LinAlgError:
            direction = gradient
        if float(direction @ gradient) <= 0:  # not an ascent direction: the Hessian is not negative definite
            direction = gradient
        step = 1.0
        while step > 1e-6:
            trial = (log_precision + step * direction).clamp(*LOG_PRECISION_RANGE)
            moved = trial - log_precision
            found = occam(trial)
            if float(found[0]) >= float(value) + 1e-4 * float(gradient @ moved):
                break
            step /= 2
        else:
            return
        log_precision.copy_(trial)
        value, gradient, hessian = found
        if float(moved.abs().max()) < 1e-8:
            return


def categorical_evidence(f: torch.Tensor, J: OutputJacobian, y: torch.Tensor, centre: torch.Tensor,
                         precision: torch.Tensor, at_map: bool, curvature: torch.Tensor,
                         start: torch.Tensor | None = None, preconditioner: torch.Tensor | None = None,
                         eigenvalues: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """log Z of the linearised categorical model at its mode θ* (or at the MAP), with the GGN of the linearisation
    point (the MAP's, the posterior's curvature), and θ.

    :param f: the net's logits at the MAP ``[N, C]``.
    :param J: their Jacobian ``[N, C, D]``.
    :param y: class labels ``[N]``.
    :param centre: the MAP θ ``[D]``.
    :param precision: the prior precision of each element ``[D]``.
    :param at_map: evaluate at the MAP instead of at the linearised mode.
    :param curvature: the GGN at the MAP ``[D, D]``.
    :param start: where the search for θ* starts (None: ``centre``); unused at the MAP.
    :param preconditioner: for the search (:func:`linearised_mode`; None: built from ``curvature``).
    :param eigenvalues: ``curvature``'s, for a precision shared by every weight (None: a Cholesky factorisation).
    :returns: log Z and θ ``[D]``.
    """
    if at_map:
        theta = centre
    else:
        if preconditioner is None:
            preconditioner = torch.linalg.cholesky(curvature + torch.diag(precision))
        theta = linearised_mode(f, J, y, centre, precision, start, preconditioner)
    log_lik, _ = _categorical_log_joint(f, J, y, centre, theta)
    return log_lik + _occam(precision, theta, curvature, eigenvalues), theta


def tune_classification(f: torch.Tensor, J: OutputJacobian, y: torch.Tensor, centre: torch.Tensor,
                        group_index: torch.Tensor, log_precision: torch.Tensor, iterations: int,
                        at_map: bool, curvature: torch.Tensor | None = None) -> torch.Tensor:
    """Maximise log Z over the group precisions: at the MAP, :func:`maximise_occam` at θ = MAP; at the linearised
    mode, rounds that alternate θ* and the precisions.

    The linearised mode's log Z(Λ) = max_θ [log p(y | f_lin(θ)) - ½ θᵀΛθ] + ½ log|Λ| - ½ log|G + Λ| (G at the
    linearisation point) is bounded below by the same expression at any fixed θ, with equality at θ*(Λ). So each
    round maximises that bound at the last θ* over the precisions (:func:`maximise_occam`, exact: the bound's
    gradient is log Z's there) and then finds the new θ*: a minorise-maximise scheme whose log Z never decreases
    (Hunter & Lange 2004), with no GGN beyond the MAP's. The rounds start from the precisions that maximise the
    evidence at the MAP and end when one gains less than :data:`EVIDENCE_TOLERANCE`, after at most
    :data:`OUTER_ROUNDS`.

    :param f: the net's logits at the MAP ``[N, C]``.
    :param J: their Jacobian ``[N, C, D]``.
    :param y: class labels ``[N]``.
    :param centre: the MAP θ ``[D]``.
    :param group_index: each element's group ``[D]``.
    :param log_precision: the log precision of each group ``[G]``; tuned in place, within
        :data:`LOG_PRECISION_RANGE`.
    :param iterations: the most Newton steps on the precisions per round.
    :param at_map: evaluate the evidence at the MAP instead of at the linearised mode.
    :param curvature: the GGN at the MAP, when known (None: built).
    :returns: the best log Z, whose precisions ``log_precision`` holds.
    """
    if curvature is None:
        curvature = _categorical_ggn(f, J)
    eigenvalues = torch.linalg.eigvalsh(curvature).clamp_min(0) if len(log_precision) == 1 else None
    maximise_occam(log_precision, group_index, centre, curvature, iterations, eigenvalues)
    precision = log_precision.exp()[group_index]
    # one preconditioner for every round's search: G + Λ at the first precisions
    chol = None if at_map else torch.linalg.cholesky(curvature + torch.diag(precision))
    log_z, theta = categorical_evidence(f, J, y, centre, precision, at_map, curvature, None, chol, eigenvalues)
    if at_map:
        return log_z
    best = (log_z, log_precision.clone())
    for _ in range(OUTER_ROUNDS):
        proposal = log_precision.clone()
        maximise_occam(proposal, group_index, theta, curvature, iterations, eigenvalues)
        log_z, theta = categorical_evidence(f, J, y, centre, proposal.exp()[group_index], False, curvature, theta,
                                            chol, eigenvalues)
        gain = float(log_z - best[0])
        log_precision.copy_(proposal)
        if gain > 0:
            best = (log_z, proposal)
        if gain < EVIDENCE_TOLERANCE:
            break
    log_precision.copy_(best[1])
    return best[0]


@dataclass(kw_only=True)
class MapStatistics:
    """What a diagonal or Kronecker-factored Laplace sums over the training rows at the MAP besides its curvature.

    :param log_likelihood: Σ log p(y | f) at the MAP (categorical), else None.
    :param sum_squares: Σ (y - f)² at the MAP (Gaussian), else None.
    :param n: rows summed over.
    :param noise_power: how the curvature scales with a Gaussian noise σ: 1/σ² for the GGN, 1/σ⁴ for the empirical
        Fisher (whose loss gradients scale as 1/σ²).
    """

    log_likelihood: torch.Tensor | None
    sum_squares: torch.Tensor | None
    n: int
    noise_power: int = 2
    what: ClassVar[str] = "curvature"  # what the curvature is, in the fit's log and its diagnosis

    def curvature_tensors(self) -> list[torch.Tensor]:
        """The curvature's tensors as summed (at σ = 1), for the finiteness check.

        :returns: the tensors.
        """
        raise NotImplementedError

    @property
    def finite(self) -> bool:
        """Whether the fit term and every curvature tensor are finite (a net whose outputs overflow or are NaN on
        some row makes them not)."""
        fit_term = self.log_likelihood if self.sum_squares is None else self.sum_squares
        return bool(torch.isfinite(fit_term)) and all(bool(torch.isfinite(c).all()) for c in self.curvature_tensors())

    def map_log_likelihood(self, noise: torch.Tensor | None) -> torch.Tensor:
        """log p(y | f_MAP): the categorical log-likelihood, or the Gaussian's at σ.

        :param noise: the Gaussian noise σ (None: categorical).
        :returns: the log-likelihood.
        """
        if noise is None:
            return self.log_likelihood
        return -0.5 * self.n * torch.log(2 * math.pi * noise**2) - 0.5 * self.sum_squares / noise**2


@dataclass
class DiagonalStatistics(MapStatistics):
    """The diagonal Laplace's sums over the training rows at the MAP (and :class:`MapStatistics`'s).

    :param diagonal: the GGN's diagonal ``[D]`` (a Gaussian likelihood's at σ = 1: it scales as 1/σ^noise_power).
    :param log_likelihood: as in :class:`MapStatistics`.
    :param sum_squares: as in :class:`MapStatistics`.
    :param n: as in :class:`MapStatistics`.
    :param noise_power: as in :class:`MapStatistics`.
    """

    diagonal: torch.Tensor
    what: ClassVar[str] = "GGN diagonal"

    def curvature_tensors(self) -> list[torch.Tensor]:
        return [self.diagonal]

    def curvature(self, noise: torch.Tensor | None) -> torch.Tensor:
        """The GGN's diagonal at a noise level.

        :param noise: the Gaussian noise σ (None: categorical).
        :returns: ``[D]``.
        """
        return self.diagonal if noise is None else self.diagonal / noise**self.noise_power

    def evidence(self, precision: torch.Tensor, centre: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        """log Z at the MAP under a diagonal GGN (differentiable in the precisions ``[D]`` and σ):

            log p(y | f_MAP) - ½ θᵀΛθ + ½ Σ log λ_i - ½ Σ log(G_ii + λ_i).

        :param precision: each element's prior precision ``[D]``.
        :param centre: the MAP θ ``[D]``.
        :param noise: the Gaussian noise σ (None: categorical).
        :returns: log Z.
        """
        return (self.map_log_likelihood(noise) - 0.5 * (precision * centre**2).sum() + 0.5 * precision.log().sum()
                - 0.5 * (self.curvature(noise) + precision).log().sum())

    def posterior_scale(self, precision: torch.Tensor, noise: torch.Tensor | None,
                        temperature: float) -> torch.Tensor:
        """The posterior's standard deviations (T / (diag G + λ))^½, what the diagonal guide holds.

        :param precision: each element's prior precision ``[D]``.
        :param noise: the Gaussian noise σ (None: categorical).
        :param temperature: T of the tempered posterior (its covariance times T).
        :returns: ``[D]``.
        """
        return (temperature / (self.curvature(noise) + precision)).sqrt()


def _fit_term(f: torch.Tensor, y: torch.Tensor, gaussian: bool) -> torch.Tensor:
    """One chunk's part of the MAP's fit term: Σ (y - f)² (Gaussian) or Σ log p(y | f) (categorical), float64."""
    if gaussian:
        return (y.double() - f[:, 0].double()).square().sum()
    return -F.cross_entropy(f.double(), y.long(), reduction="sum")


@dataclass
class KroneckerStatistics(MapStatistics):
    """KFAC's factors of every weight tensor, summed over the training rows at the MAP and eigen-decomposed (and
    :class:`MapStatistics`'s sums).

    :param output_eigenvalues: per tensor, the eigenvalues g of its output factor G ``[rows]`` (a Gaussian
        likelihood's at σ = 1: G scales as 1/σ^noise_power).
    :param output_bases: their eigenvectors Q_G ``[rows, rows]``.
    :param input_eigenvalues: per tensor, the eigenvalues a of its input factor A ``[cols]``.
    :param input_bases: their eigenvectors Q_A ``[cols, cols]``.
    :param starts: where each tensor starts in the site (its prior precision is the one of that element).
    :param log_likelihood: as in :class:`MapStatistics`.
    :param sum_squares: as in :class:`MapStatistics`.
    :param n: as in :class:`MapStatistics`.
    :param noise_power: as in :class:`MapStatistics`.
    """

    output_eigenvalues: list[torch.Tensor]
    output_bases: list[torch.Tensor]
    input_eigenvalues: list[torch.Tensor]
    input_bases: list[torch.Tensor]
    starts: list[int]
    what: ClassVar[str] = "KFAC factors"

    def curvature_tensors(self) -> list[torch.Tensor]:
        return self.output_eigenvalues + self.input_eigenvalues

    def curvature_eigenvalues(self, noise: torch.Tensor | None) -> list[torch.Tensor]:
        """Each tensor's eigenvalues of G ⊗ A at a noise level.

        :param noise: the Gaussian noise σ (None: categorical).
        :returns: per tensor, g aᵀ ``[rows, cols]``.
        """
        scale = 1.0 if noise is None else noise**-self.noise_power
        return [torch.outer(g, a) * scale for g, a in zip(self.output_eigenvalues, self.input_eigenvalues,
                                                             strict=True)]

    def evidence(self, precision: torch.Tensor, centre: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        """log Z at the MAP under the KFAC GGN (differentiable in the precisions ``[D]`` and σ):

            log p(y | f_MAP) - ½ θᵀΛθ + ½ Σ log λ_i - ½ Σ_tensors Σ_ij log(g_i a_j + δ_tensor).

        :param precision: each element's prior precision ``[D]`` (one value per tensor).
        :param centre: the MAP θ ``[D]``.
        :param noise: the Gaussian noise σ (None: categorical).
        :returns: log Z.
        """
        log_det = sum((eig + precision[start]).log().sum()
                      for eig, start in zip(self.curvature_eigenvalues(noise), self.starts, strict=True))
        return (self.map_log_likelihood(noise) - 0.5 * (precision * centre**2).sum() + 0.5 * precision.log().sum()
                - 0.5 * log_det)

    def posterior_scale(self, precision: torch.Tensor, noise: torch.Tensor | None,
                        temperature: float) -> list[KroneckerBlock]:
        """The posterior (G ⊗ A + δ I)⁻¹ of each tensor, tempered, in its factors' eigenbases.

        :param precision: each element's prior precision ``[D]``.
        :param noise: the Gaussian noise σ (None: categorical).
        :param temperature: T of the tempered posterior (its covariance times T).
        :returns: one block per tensor.
        """
        return [KroneckerBlock(q_g, q_a, (temperature / (eig + precision[start])).sqrt())
                for eig, q_g, q_a, start in zip(self.curvature_eigenvalues(noise), self.output_bases,
                                                  self.input_bases, self.starts, strict=True)]


@dataclass
class LowRankStatistics(MapStatistics):
    """The GGN's k leading eigenpairs over every training row at the MAP (and :class:`MapStatistics`'s sums): the
    posterior precision is Λ + U E Uᵀ (laplace-torch's ``hessian_structure='lowrank'``).

    :param eigenvalues: E ``[k]`` (a Gaussian likelihood's at σ = 1: they scale as 1/σ^noise_power).
    :param basis: U, orthonormal ``[D, k]``.
    :param log_likelihood: as in :class:`MapStatistics`.
    :param sum_squares: as in :class:`MapStatistics`.
    :param n: as in :class:`MapStatistics`.
    :param noise_power: as in :class:`MapStatistics`.
    """

    eigenvalues: torch.Tensor
    basis: torch.Tensor
    what: ClassVar[str] = "GGN's leading eigenpairs"

    def curvature_tensors(self) -> list[torch.Tensor]:
        return [self.eigenvalues, self.basis]

    def _root(self, precision: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        """W = Λ^-½ U E^½ at a noise level ``[D, k]``: Λ + U E Uᵀ = Λ^½ (I + W Wᵀ) Λ^½."""
        scale = 1.0 if noise is None else noise**-self.noise_power
        return self.basis * (self.eigenvalues * scale).sqrt() / precision.sqrt()[:, None]

    def evidence(self, precision: torch.Tensor, centre: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        """log Z at the MAP under the low-rank GGN (differentiable in the precisions ``[D]`` and σ); by the matrix
        determinant lemma, log|Λ + U E Uᵀ| = log|Λ| + log|I_k + Wᵀ W|:

            log p(y | f_MAP) - ½ θᵀΛθ - ½ log|I_k + Wᵀ W|.

        :param precision: each element's prior precision ``[D]``.
        :param centre: the MAP θ ``[D]``.
        :param noise: the Gaussian noise σ (None: categorical).
        :returns: log Z.
        """
        root = self._root(precision, noise)
        inner = torch.eye(root.shape[1], dtype=root.dtype, device=root.device) + root.T @ root
        return (self.map_log_likelihood(noise) - 0.5 * (precision * centre**2).sum()
                - 0.5 * _logdet_from_cholesky(torch.linalg.cholesky(inner)))

    def posterior_scale(self, precision: torch.Tensor, noise: torch.Tensor | None,
                        temperature: float) -> LowRankScale:
        """The posterior (Λ + U E Uᵀ)⁻¹, tempered, as the guide holds it.

        :param precision: each element's prior precision ``[D]``.
        :param noise: the Gaussian noise σ (None: categorical).
        :param temperature: T of the tempered posterior (its covariance times T).
        :returns: its scale.
        """
        q, r = torch.linalg.qr(self._root(precision, noise))
        spread, rotation = torch.linalg.eigh(r @ r.T)
        return LowRankScale((temperature / precision).sqrt(), q @ rotation, (1 + spread.clamp_min(0)).rsqrt() - 1)


# ------------------------------------------------------------------------------------------ the fit
@dataclass
class _Prior:
    """What the evidence tunes, from where: the MAP θ, each element's prior group, the groups' log precisions and
    log σ (None for classification); ``learned_noise`` says whether σ is tuned too."""

    centre: torch.Tensor  # θ_MAP [D], float64
    group_index: torch.Tensor  # [D]
    labels: list[str]
    log_precision: torch.Tensor  # [G], tuned in place
    log_noise: torch.Tensor | None  # tuned in place where learned
    learned_noise: bool


@dataclass
class _Rows:
    """The training rows linearised at the MAP, as the evidence needs them: a Gaussian likelihood's sums over rows
    (``stats``), or every row's logits and Jacobian for a categorical one (Newton steps need them all)."""

    stats: GaussianStatistics | None
    fs: list[torch.Tensor]
    Js: list[OutputJacobian]
    targets: torch.Tensor  # every row's, in the order their Jacobians were stored


def _resume_finished(fit: FitContext, path: Path) -> LaplaceResult:
    """Load a finished fit's checkpoint into the guide and family instead of refitting."""
    state = load_checkpoint(path, fit.data.x_train.device, set_aside=True)
    fit.guide.load_state_dict(state["guide"])
    fit.family.set_hyperparameters(state["hyperparameters"])
    fit.log("the Laplace fit had finished; loaded it")
    result = LaplaceResult(state["seconds"], state["log_evidence"], state["prior_precision"], state["noise"],
                           link=state.get("link"), precision_scale=state.get("precision_scale"))
    result.posterior = LaplacePosterior.from_spec(fit.family, fit.guide, fit.spec, result.link)
    return result


def _initial_prior(fit: FitContext, site: str) -> _Prior:
    """The MAP, the spec's prior groups at the family's mean precision in each, and the MAP's noise."""
    family = fit.family
    centre = fit.guide.point_estimate()[site].double()
    group_index, labels = prior_groups(family.parameter_names(), fit.spec.prior_structure)
    group_index = group_index.to(centre.device)
    initial = family.prior_precision.double()
    counts = torch.bincount(group_index, minlength=len(labels)).to(initial)
    log_precision = (initial.new_zeros(len(labels)).index_add_(0, group_index, initial) / counts).log()
    noise = family.map_noise()
    learned_noise = family.likelihood.gaussian and family.likelihood.fixed_noise is None
    log_noise = torch.as_tensor(noise, dtype=torch.float64, device=centre.device).log() if noise is not None else None
    return _Prior(centre, group_index, labels, log_precision, log_noise, learned_noise)


def _linearise_rows(fit: FitContext, centre: torch.Tensor) -> _Rows:
    """Linearise the net at the MAP over every training row, ``chunk_size`` rows at a time (streamed from a loader
    where the rows are): sums over rows for a Gaussian likelihood, every row's f and J otherwise.

    :raises ZooInputError: when a classification Jacobian would exceed :data:`MAX_STORED_JACOBIAN` numbers (from
        the first chunk's, before the rest are built).
    """
    data = fit.data
    D, n = len(centre), data.n_train
    store = not fit.family.likelihood.gaussian  # Newton steps need every row's J; a Gaussian needs only sums
    fs, Js, ys = [], [], []
    stats = None
    if not store:
        stats = GaussianStatistics(centre.new_zeros(D, D), centre.new_zeros(D), centre.new_zeros(()), n,
                                   at=centre if fit.spec.evidence_at == "map" else None)
    for xc, yc in data.train_chunks(fit.spec.chunk_size):
        f, J = fit.family.linearise(xc)
        f, J = f.double(), J.to(torch.float64)
        if store and not Js and J.numel() * n // len(f) > MAX_STORED_JACOBIAN:  # checked on the first chunk
            raise ZooInputError("model.selection.size", D, f"the classification Laplace keeps the Jacobian of all "
                                f"{n:,} rows in memory, {J.numel() * n // len(f):,} numbers here (at most "
                                f"{MAX_STORED_JACOBIAN:,}): select fewer weights, or whole Linear layers (their "
                                "Jacobian is kept as the layers' factors)")
        if store:
            fs.append(f)
            Js.append(J)
            ys.append(yc)
        else:
            pseudo = yc.double() - f[:, 0] + (J @ centre)[:, 0]
            stats.gram += J.ggn(f.new_ones(len(f), 1, 1))  # Jᵀ J of the one output
            stats.cross += J.vjp(pseudo[:, None])
            stats.sum_squares += pseudo @ pseudo
    return _Rows(stats, fs, Js, torch.cat(ys) if ys else data.y_train)


def _tune_prior(spec: LaplaceSpec, prior: _Prior, rows: _Rows,
                grid: Callable[[torch.Tensor], None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Tune ``prior``'s log precisions (and log σ) in place by the evidence (or by ``grid``, given the GGN at the
    MAP; or only evaluate it, without ``spec.tune``); returns log Z and the GGN at the MAP.

    A Gaussian likelihood's linearised model is a Gaussian linear model (closed-form evidence from sums over the
    rows); any other is categorical here (Newton's method to the linearised mode, on every row's Jacobian)."""
    by_evidence = spec.tune and grid is None
    if rows.stats is not None:
        if grid is not None:
            grid(rows.stats.gram / prior.log_noise.exp() ** 2)
        if by_evidence:
            log_z = tune_regression(rows.stats, prior.group_index, prior.log_precision, prior.log_noise,
                                    prior.learned_noise, spec.tune_iterations)
        else:
            log_z = rows.stats.mode_and_evidence(prior.log_precision.exp()[prior.group_index], prior.log_noise.exp())[1]
        return log_z, rows.stats.gram / prior.log_noise.exp() ** 2
    at_map = spec.evidence_at == "map"
    f_all, J_all = torch.cat(rows.fs), type(rows.Js[0]).concat(rows.Js)
    rows.fs.clear()  # one copy of the stored Jacobian, not two
    rows.Js.clear()
    at_centre = _categorical_ggn(f_all, J_all)  # the GGN at the MAP: the posterior's and the evidence's
    if grid is not None:
        grid(at_centre)
    if by_evidence:
        log_z = tune_classification(f_all, J_all, rows.targets, prior.centre, prior.group_index, prior.log_precision,
                                    spec.tune_iterations, at_map, at_centre)
    else:
        log_z = categorical_evidence(f_all, J_all, rows.targets, prior.centre,
                                     prior.log_precision.exp()[prior.group_index], at_map, curvature=at_centre)[0]
    return log_z, at_centre


def _grid_search(fit: FitContext, prior: _Prior,
                 scale_at: Callable[[torch.Tensor], torch.Tensor | list[KroneckerBlock]]) -> None:
    """Set ``prior``'s one log precision to the value of :data:`GRID_LOG_PRECISIONS` whose posterior predictive
    (the spec's predictive and link) scores best on the calibration rows (``inference.tune_by: calibration``).

    :param fit: the fit (its data's calibration rows; its guide is set to each candidate in turn).
    :param prior: the prior; its log precision is set in place.
    :param scale_at: each element's precision ``[D]`` -> the guide's scale of the posterior there.
    :raises ZooInputError: a data set without calibration rows.
    """
    data = fit.data
    if data.x_calibration is None:
        raise ZooInputError("inference.tune_by", "calibration", NO_CALIBRATION_ROWS)
    rows = dataclasses.replace(data, x_test=data.x_calibration, y_test=data.y_calibration, x_ood={})
    metric, direction = next(iter(task_of(data).metrics.items()))
    site, losses = gaussian_site(fit.guide), []
    for log_precision in GRID_LOG_PRECISIONS:
        prior.log_precision.fill_(log_precision)
        precision = prior.log_precision.exp()[prior.group_index]
        _set_posterior(fit, site, prior, precision, scale_at(precision))
        score = evaluate(LaplacePosterior.from_spec(fit.family, fit.guide, fit.spec), rows,
                         fit.spec.predictive_samples, fit.seed)[metric]
        loss = score if direction == "minimize" else -score
        losses.append(loss if math.isfinite(loss) else math.inf)
    best = min(range(len(losses)), key=losses.__getitem__)
    prior.log_precision.fill_(GRID_LOG_PRECISIONS[best])
    fit.log(f"laplace: prior precision {math.exp(GRID_LOG_PRECISIONS[best]):.3g} of {len(losses)} from 1e-4 to "
            f"1e4, by the {metric} of {len(rows.y_test):,} calibration rows ({abs(losses[best]):.4g})")


def _diagonal_statistics(fit: FitContext, prior: _Prior) -> DiagonalStatistics:
    """Sum the GGN's diagonal (from the layer factors) and the MAP's log-likelihood over every training row,
    ``chunk_size`` rows at a time."""
    gaussian = fit.family.likelihood.gaussian
    diagonal, fit_term = prior.centre.new_zeros(len(prior.centre)), prior.centre.new_zeros(())
    for xc, yc in fit.data.train_chunks(fit.spec.chunk_size):
        with torch.no_grad():
            f, chunk = fit.family.diagonal_ggn(xc, 1.0, yc if fit.spec.curvature == "ef" else None)
        diagonal += chunk.double()
        fit_term += _fit_term(f, yc, gaussian)
    return DiagonalStatistics(diagonal=diagonal, **_fit_sums(fit, fit_term))


def _kronecker_statistics(fit: FitContext, prior: _Prior) -> KroneckerStatistics:
    """Sum KFAC's factors of every weight tensor (from the layer factors) and the MAP's log-likelihood over every
    training row, ``chunk_size`` rows at a time, then eigen-decompose the factors (float64)."""
    family, gaussian = fit.family, fit.family.likelihood.gaussian
    shapes = fit.guide.sites[gaussian_site(fit.guide)].blocks
    check_size_fits("guide.covariance", "kron", 8 * 4 * sum(r * r + c * c for r, c in shapes),
                    "use guide.covariance: diag, or keep the widest layers at the MAP (model.exclude)",
                    f"KFAC's factors of {len(shapes)} weight tensors (the widest {max(max(s) for s in shapes):,} "
                    "wide)")
    sums: list[tuple[torch.Tensor, torch.Tensor, int]] | None = None  # per tensor: G, Σ h hᵀ and their count
    fit_term = prior.centre.new_zeros(())
    for xc, yc in fit.data.train_chunks(fit.spec.chunk_size):
        with torch.no_grad():
            f, factors = family.kronecker_factors(xc, 1.0, yc if fit.spec.curvature == "ef" else None)
        chunk = [(g.double(), a.double(), count) for g, a, count in factors]
        sums = chunk if sums is None else [(g0 + g, a0 + a, c0 + c)
                                           for (g0, a0, c0), (g, a, c) in zip(sums, chunk, strict=True)]
        fit_term += _fit_term(f, yc, gaussian)
    decomposed = [(torch.linalg.eigh(g), torch.linalg.eigh(a / count)) for g, a, count in sums]
    outputs, inputs = zip(*decomposed, strict=True)
    return KroneckerStatistics(output_eigenvalues=[g.eigenvalues.clamp_min(0) for g in outputs],
                               output_bases=[g.eigenvectors for g in outputs],
                               input_eigenvalues=[a.eigenvalues.clamp_min(0) for a in inputs],
                               input_bases=[a.eigenvectors for a in inputs], starts=_block_starts(fit),
                               **_fit_sums(fit, fit_term))


def _low_rank_statistics(fit: FitContext, prior: _Prior) -> LowRankStatistics:
    """The GGN's leading eigenpairs over every training row by a randomised Nyström approximation (Halko, Martinsson
    & Tropp 2011; Tropp et al. 2017): a Gaussian sketch of width rank + :data:`OVERSAMPLING`, refined by
    :data:`POWER_ITERATIONS` passes of subspace iteration, then the stable Nyström factorisation of G on it. Each
    pass is one GGN-matrix product over the rows, by forward- and reverse-mode products (``chunk_size`` rows at a
    time; no Jacobian, no D x D matrix); the first also sums the MAP's log-likelihood. The sketch is drawn from the
    run's seed, so a fit is reproducible."""
    family, data, centre = fit.family, fit.data, prior.centre
    rank = fit.guide.low_rank_scale(gaussian_site(fit.guide)).basis.shape[1]
    width = min(len(centre), rank + OVERSAMPLING)
    check_size_fits("guide.rank", rank, 8 * 6 * len(centre) * width, "give a lower guide.rank, or use "
                    "guide.covariance: diag or kron", f"a sketch of {width} directions over {len(centre):,} weights "
                    "and its products")
    generator = torch.Generator().manual_seed(fit.seed)
    sketch = torch.linalg.qr(torch.randn(len(centre), width, generator=generator, dtype=torch.float64)).Q
    fit_term = centre.new_zeros(())

    def times(block: torch.Tensor, first: bool = False) -> torch.Tensor:
        nonlocal fit_term
        out = torch.zeros_like(block)
        for xc, yc in data.train_chunks(fit.spec.chunk_size):
            f, product = family.curvature_times(xc, block.T.to(device=xc.device, dtype=xc.dtype).contiguous(), 1.0,
                                                yc if fit.spec.curvature == "ef" else None)
            out += product.T.to(out)
            if first:
                fit_term = fit_term + _fit_term(f, yc, family.likelihood.gaussian).to(fit_term)
        return out

    for step in range(POWER_ITERATIONS):
        sketch = torch.linalg.qr(times(sketch, first=step == 0)).Q
    product = times(sketch, first=POWER_ITERATIONS == 0)
    # Nyström: G ≈ Y (Ωᵀ Y)⁺ Yᵀ for Y = G Ω. The products are as precise as the net's dtype, so the core's
    # directions below that precision (G's null space: e.g. a shift common to every logit) are dropped.
    core = sketch.T @ product
    spread, rotation = torch.linalg.eigh(0.5 * (core + core.T))
    kept = spread > width * torch.finfo(data.dtype).eps * float(spread.abs().max())
    factor = product @ (rotation[:, kept] * spread[kept].rsqrt())  # G ≈ factor factorᵀ
    basis, singular, _ = torch.linalg.svd(factor, full_matrices=False)
    eigenvalues, basis = singular.square()[:rank], basis[:, :rank]
    if len(eigenvalues) < rank:  # G has fewer directions than the rank: the rest add nothing to the prior
        eigenvalues = torch.cat([eigenvalues, eigenvalues.new_zeros(rank - len(eigenvalues))])
        basis = torch.linalg.qr(torch.cat([basis, sketch], 1)).Q[:, :rank]
    return LowRankStatistics(eigenvalues=eigenvalues, basis=basis, **_fit_sums(fit, fit_term))


def _fit_sums(fit: FitContext, fit_term: torch.Tensor) -> dict:
    """:class:`MapStatistics`'s fields from the summed fit term: where it goes for the likelihood, the rows, and how
    the curvature scales with σ (1/σ² for the GGN, 1/σ⁴ for the empirical Fisher)."""
    gaussian = fit.family.likelihood.gaussian
    return {"log_likelihood": None if gaussian else fit_term, "sum_squares": fit_term if gaussian else None,
            "n": fit.data.n_train, "noise_power": 4 if fit.spec.curvature == "ef" else 2}


def _posterior_covariance(curvature: torch.Tensor, prior: _Prior,
                          temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each element's tuned prior precision Λ and the scale_tril of (G + Λ)⁻¹, tempered; ``curvature`` (G) becomes
    G + Λ in place."""
    precision = prior.log_precision.exp()[prior.group_index]
    curvature.diagonal().add_(precision)  # now the posterior precision G + Λ
    # a tempered posterior p(w | D)^(1/T) has the same mode and precision (G + Λ) / T
    return precision, precision_to_scale_tril(curvature) * math.sqrt(temperature)


def _full_laplace(fit: FitContext, prior: _Prior,
                  started: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The full-covariance fit: the GGN (or every row's Jacobian) at the MAP, the tuned prior (and noise), and
    log Z, each element's prior precision and the posterior's scale_tril."""
    rows = _linearise_rows(fit, prior.centre)
    fit.log(f"laplace: GGN over {len(prior.centre):,} weights from {fit.data.n_train:,} rows in "
            f"{time.perf_counter() - started:.1f} s")
    grid = None
    if fit.spec.tune_by == "calibration":
        def grid(curvature: torch.Tensor) -> None:
            _grid_search(fit, prior, lambda precision: precision_to_scale_tril(curvature + torch.diag(precision))
                         * math.sqrt(fit.spec.temperature))
    try:
        log_z, curvature = _tune_prior(fit.spec, prior, rows, grid)
        precision, scale_tril = _posterior_covariance(curvature, prior, fit.spec.temperature)
        tuned_noise = _noise(prior)

        def scale_at(other: torch.Tensor) -> torch.Tensor:  # at the prior's current noise: the GGN over σ² scales
            ggn = curvature - torch.diag(precision)
            if tuned_noise is not None:  # regression's
                ggn = ggn * (tuned_noise / _noise(prior)) ** 2
            return precision_to_scale_tril(ggn + torch.diag(other)) * math.sqrt(fit.spec.temperature)

    except torch.linalg.LinAlgError as exc:
        raise TrainingDiverged(f"laplace: GGN + prior precision is not positive definite ({exc}). The MAP net may "
                               "not have converged (raise model.map.num_steps), or the evidence was maximised at "
                               "an extreme: try inference.tune: false, another prior_structure, or "
                               "guide.covariance: diag") from None
    return log_z, precision, scale_tril, scale_at


def _factored_laplace(fit: FitContext, prior: _Prior,
                      started: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | list[KroneckerBlock]]:
    """The diagonal or Kronecker-factored fit: its curvature summed at the MAP (no D x D matrix), the prior (and
    noise) tuned by the closed-form evidence at the MAP or by the calibration rows' grid, and log Z, each element's
    prior precision and the posterior's scale as the guide holds it (tempered)."""
    summed = {"kron": _kronecker_statistics, "lowrank": _low_rank_statistics}.get(fit.guide.covariance,
                                                                                  _diagonal_statistics)
    stats = summed(fit, prior)
    if not stats.finite:
        raise TrainingDiverged(f"laplace: the {stats.what} or the MAP's log-likelihood are not finite: the MAP net's "
                               "outputs overflow or are NaN on some training rows; check the net's weights and inputs")
    fit.log(f"laplace: {stats.what} over {len(prior.centre):,} weights from {fit.data.n_train:,} rows in "
            f"{time.perf_counter() - started:.1f} s")

    def scale_at(precision: torch.Tensor) -> torch.Tensor | list[KroneckerBlock]:
        return stats.posterior_scale(precision, _noise(prior), fit.spec.temperature)

    if fit.spec.tune_by == "calibration":
        _grid_search(fit, prior, scale_at)
    elif fit.spec.tune:
        maximise_evidence(lambda precision, noise: stats.evidence(precision, prior.centre, noise), prior.group_index,
                          prior.log_precision, prior.log_noise, prior.learned_noise, fit.spec.tune_iterations)
    precision = prior.log_precision.exp()[prior.group_index]
    return stats.evidence(precision, prior.centre, _noise(prior)), precision, scale_at(precision), scale_at


def noise_source(spec: LaplaceSpec, has_calibration_rows: bool, learned_noise: bool) -> str:
    """Where a fit's Gaussian noise comes from: ``inference.noise_by``, or where unset, the calibration rows where
    the fit has them, its noise is learned and its predictive is the GLM's (whose variance the search reads), the
    evidence otherwise (a categorical likelihood has no noise: evidence).

    :param spec: the ``inference`` section.
    :param has_calibration_rows: whether the fit has rows held out of training.
    :param learned_noise: whether the likelihood learns a Gaussian noise.
    :returns: ``calibration`` or ``evidence``.
    """
    if spec.noise_by is not None:
        return spec.noise_by
    return "calibration" if has_calibration_rows and learned_noise and spec.predictive == "glm" else "evidence"


def _noise_source(fit: FitContext, prior: _Prior) -> str:
    """:func:`noise_source` of a fit, refusing ``noise_by: calibration`` where it cannot be done.

    :raises ZooInputError: ``noise_by: calibration`` without calibration rows, or on a fixed noise.
    """
    has_rows = fit.data.x_calibration is not None
    if fit.spec.noise_by == "calibration" and not (has_rows and prior.learned_noise):
        raise ZooInputError("inference.noise_by", "calibration", "needs rows held out of training and a learned "
                            "Gaussian noise: pass val= to fit, set data.calibration_fraction (e.g. 0.1), or use "
                            "noise_by: evidence")
    return noise_source(fit.spec, has_rows, prior.learned_noise)


def _calibrate_noise(fit: FitContext, site: str, prior: _Prior, precision: torch.Tensor,
                     scale_at: Callable[[torch.Tensor], torch.Tensor | list[KroneckerBlock] | LowRankScale],
                     ) -> torch.Tensor | list[KroneckerBlock] | LowRankScale:
    """Set ``prior``'s noise σ (in place) to the one whose GLM predictive N(f, σ² + v_σ) is likeliest on the
    calibration rows, the prior precision kept and the posterior recomputed at each σ tried (v_σ its outputs'
    variance: the GGN over σ² plus the prior precision, inverted); a bounded search of log σ in the rows' window
    (:func:`~zoo.inference.noise_choice.log_noise_window`: v_σ grows with σ, so above the largest residual the
    likelihood only falls), not around the evidence's σ, which a MAP that fits its rows closely leaves far below
    the calibration rows' errors.

    :returns: the posterior's scale at the σ found.
    """
    from scipy.optimize import minimize_scalar

    x, y = fit.data.x_calibration, fit.data.y_calibration.double()
    start = float(prior.log_noise)
    posterior = LaplacePosterior.from_spec(fit.family, fit.guide, fit.spec)

    def nll(log_noise: float) -> float:
        prior.log_noise.fill_(log_noise)
        _set_posterior(fit, site, prior, precision, scale_at(precision))
        mean, covariance = posterior.glm_moments(x)
        variance = prior.log_noise.exp() ** 2 + covariance[:, 0, 0].double()
        return float(0.5 * ((y - mean[:, 0].double()) ** 2 / variance + variance.log()).mean())

    mean, _ = posterior.glm_moments(x)  # the GLM's mean is the MAP net's outputs, whatever σ
    low, high = log_noise_window(y - mean[:, 0].double())
    low = max(low, LOG_NOISE_RANGE[0])
    high = max(min(high, LOG_NOISE_RANGE[1]), low + 1e-3)  # rows fitted to within e^-10: the range's floor
    found = minimize_scalar(nll, bounds=(low, high), method="bounded", options={"xatol": 1e-3})
    prior.log_noise.fill_(found.x)
    fit.log(f"laplace: noise {math.exp(start):.4g} -> {math.exp(found.x):.4g}, the likeliest on "
            f"{len(y):,} calibration rows (the evidence's prior precision kept)")
    return scale_at(precision)


def _link_source(fit: FitContext) -> str:
    """Whether a fit chooses its classification link on calibration rows (``calibration``) or keeps the spec's
    (``fixed``): ``inference.link_by``, or where unset, ``calibration`` where the fit has calibration rows, a
    categorical likelihood and the GLM predictive.

    :raises ZooInputError: ``link_by: calibration`` without calibration rows, for regression or the NN predictive.
    """
    asked = fit.spec.link_by
    can = (fit.data.x_calibration is not None and not fit.family.likelihood.gaussian
           and fit.spec.predictive == "glm")
    if asked == "calibration" and not can:
        raise ZooInputError("inference.link_by", "calibration", NO_LINK_ROWS)
    return asked or ("calibration" if can else "fixed")


def _row_nlls(log_probs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each row's NLL ``[N]`` under the predictive mixture of per-draw log-probabilities ``[S, N, C]`` (every row
    infinite where any is NaN: such a link is never chosen)."""
    if log_probs.isnan().any():
        return torch.full(y.shape, math.inf, dtype=torch.float64, device=y.device)
    return -metrics.predictive_log_probs(log_probs.double()).gather(-1, y[:, None]).squeeze(-1)


def _link_nlls(fit: FitContext, posterior: LaplacePosterior) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Each link's (:data:`LINKS`) per-row NLL of the GLM predictive on the calibration rows, and the MAP net's own
    (the GLM's mean is its logits); ``mc`` takes ``predictive_samples`` draws of the logits, seeded by the fit's
    seed (the same draws of N(0, 1) for every posterior scored)."""
    y = fit.data.y_calibration.long()
    mean, covariance = posterior.glm_moments(fit.data.x_calibration)
    generator = torch.Generator(device=mean.device).manual_seed(fit.seed)
    nll = {link: _row_nlls(link_log_probs(link, mean.double(), covariance.double(), fit.spec.predictive_samples,
                                          generator), y) for link in LINKS}
    return nll, _row_nlls(torch.log_softmax(mean.double(), -1)[None], y)


def _likeliest(nll: dict[str, torch.Tensor], map_nll: torch.Tensor) -> tuple[str, bool]:
    """The link of least mean NLL (ties: the first of :data:`LINKS`), and whether the rows reject it: its NLL above
    the MAP net's by more than :data:`REJECTION_STANDARD_ERRORS` standard errors of the rows' paired differences."""
    best = min(LINKS, key=lambda link: float(nll[link].mean()))
    excess = nll[best] - map_nll
    if not bool(excess.isfinite().all()):
        return best, True
    margin = REJECTION_STANDARD_ERRORS * float(excess.std()) / math.sqrt(len(excess)) if len(excess) > 1 else 0.0
    return best, float(excess.mean()) > margin


def _shown(nll: dict[str, torch.Tensor]) -> str:
    return ", ".join(f"{link} {float(value.mean()):.4f}" for link, value in nll.items())


def _choose_link(fit: FitContext, site: str, prior: _Prior, precision: torch.Tensor,
                 scale_at: Callable[[torch.Tensor], Any]) -> tuple[str, float | None]:
    """The link (of :data:`LINKS`) whose GLM predictive has the least NLL on the calibration rows, with a log line of
    each one's NLL. Where the prior was tuned by the evidence with no factor given (``inference.precision_scale``)
    and the rows reject that posterior against the MAP net alone (:func:`_likeliest`), the evidence is no guide to
    the prior's scale there: its precisions are scaled by the factor, of 1 and :data:`PRECISION_SCALES`, whose
    likeliest link scores best on the rows (ties: the smaller factor), set in ``prior`` and the guide.

    :returns: the link, and the factor chosen (None where the rows chose none).
    """
    posterior = LaplacePosterior.from_spec(fit.family, fit.guide, fit.spec)
    nll, map_nll = _link_nlls(fit, posterior)
    best, rejected = _likeliest(nll, map_nll)
    rows = len(map_nll)
    fit.log(f"laplace: link {best}, the likeliest on {rows:,} calibration rows (NLL {_shown(nll)})")
    if not (rejected and fit.spec.precision_scale is None and fit.spec.tune and fit.spec.tune_by == "evidence"):
        return best, None
    fit.log(f"laplace: the {rows:,} calibration rows score the MAP net alone likelier (NLL {float(map_nll.mean()):.4f} "
            f"against {float(nll[best].mean()):.4f}, by more than {REJECTION_STANDARD_ERRORS:g} standard errors): "
            "the evidence's prior precision spreads the predictive more than they support; scaling it by the "
            "likeliest factor there of 1 and 10^0.5 to 10^4 (inference.precision_scale sets one)")
    scores = {1.0: (float(nll[best].mean()), best)}
    for factor in PRECISION_SCALES:
        scaled = precision * factor
        _set_posterior(fit, site, prior, scaled, scale_at(scaled))
        nll, _ = _link_nlls(fit, posterior)
        link, _ = _likeliest(nll, map_nll)
        scores[factor] = (float(nll[link].mean()), link)
    factor = min(scores, key=lambda each: scores[each][0])  # ties: the smaller factor
    prior.log_precision += math.log(factor)
    chosen = prior.log_precision.exp()[prior.group_index]
    _set_posterior(fit, site, prior, chosen, scale_at(chosen))
    fit.log(f"laplace: prior precision x {factor:.3g} and link {scores[factor][1]}, the likeliest on the calibration "
            "rows (NLL " + ", ".join(f"x {each:.3g} {value:.4f}" for each, (value, _) in scores.items()) + ")")
    return scores[factor][1], factor


def _noise(prior: _Prior) -> torch.Tensor | None:
    """The prior's current Gaussian noise σ (None: categorical)."""
    return None if prior.log_noise is None else prior.log_noise.exp()


def _block_starts(fit: FitContext) -> list[int]:
    """Where each weight tensor of a kron site starts in the site."""
    sizes = [r * c for r, c in fit.guide.sites[gaussian_site(fit.guide)].blocks]
    return [sum(sizes[:k]) for k in range(len(sizes))]


def _set_posterior(fit: FitContext, site: str, prior: _Prior, precision: torch.Tensor,
                   scale: torch.Tensor | list[KroneckerBlock]) -> None:
    """Set the guide's Gaussian (its scale_tril, its standard deviations for a diagonal one, or its blocks for a
    Kronecker-factored one), a learned noise and the family's prior precision, in the data's dtype."""
    dtype = fit.data.dtype
    if isinstance(scale, LowRankScale):
        scale = LowRankScale(*(part.to(dtype) for part in scale))
    elif isinstance(scale, list):
        scale = [KroneckerBlock(*(part.to(dtype) for part in block)) for block in scale]
    else:
        scale = scale.to(dtype)
    fit.guide.set_gaussian(site, prior.centre.to(dtype), scale)
    fit.family.set_hyperparameters({"prior_precision": precision.to(dtype)})
    if prior.learned_noise:
        fit.guide.set_point(fit.family.likelihood.noise_site, prior.log_noise.exp().to(dtype))


def _summary(result: LaplaceResult) -> str:
    """The log line of the tuned evidence, prior precisions and noise."""
    values = list(result.prior_precision.values())
    described = (", ".join(f"{k} {v:.3g}" for k, v in result.prior_precision.items()) if len(values) <= 12 else
                 f"{len(values):,} values from {min(values):.3g} to {max(values):.3g}, median "
                 f"{sorted(values)[len(values) // 2]:.3g}")
    return (f"laplace: log evidence {result.log_evidence:.2f}; prior precision {described}"
            + (f"; noise {result.noise:.3g} (standardised)" if result.noise is not None else ""))


def _save(fit: FitContext, path: Path, result: LaplaceResult) -> None:
    """Write the finished fit (guide, hyperparameters, evidence) to ``path``, marked done."""
    save_checkpoint(path, {"guide": fit.guide.state_dict(), "point_parameters": [], "buffers": fit.family.buffers(),
                           "hyperparameters": fit.family.hyperparameters(), "seconds": result.seconds,
                           "log_evidence": result.log_evidence, "prior_precision": result.prior_precision,
                           "noise": result.noise, "link": result.link, "precision_scale": result.precision_scale,
                           "done": True})


def fit_laplace(fit: FitContext) -> LaplaceResult:
    """Fit the Laplace guide at the family's MAP: GGN over its weight site, prior (and noise) tuned by evidence.

    The result is saved atomically to ``run_dir/checkpoint.pt`` (guide, tuned prior precision); ``resume=True``
    with a finished checkpoint there loads it instead of refitting.

    :param fit: the fit's :class:`~zoo.inference.base.FitContext`, read as follows. ``family``: the linearisable family,
        its net at the MAP; its prior precision is set to the tuned one; ``guide``: the Laplace guide, its point
        estimate at the MAP; its Gaussian (and a learned noise) is set in place; ``data``: the data set; the GGN is
        summed over every training row; ``spec``: the run's ``inference`` section; ``seed``: draws a low-rank fit's
        sketch (the other fits are deterministic); ``run_dir``: where ``checkpoint.pt`` is written; None writes
        nothing; ``resume``: load a checkpoint ``run_dir`` already holds instead of refitting; ``log``: the run's log
        (None: no messages);
        ``progress``: unused (no progress bar); ``monitor``: scores the posterior once, at the end (None: no
        scoring).
    :returns: the tuned prior precision and noise, the evidence, the wall time and the posterior.
    :raises ZooInputError: when the guide has not exactly one Gaussian site, or a classification Jacobian over every
        row would exceed :data:`MAX_STORED_JACOBIAN` numbers.
    :raises TrainingDiverged: when GGN + prior precision is not positive definite.
    """
    site = gaussian_site(fit.guide)
    if fit.guide.asked_covariance == "auto":
        fit.log(f"laplace: guide.covariance auto is {fit.guide.covariance} over "
                f"{fit.guide.sites[site].shape[0]:,} weights (full up to {FULL_COVARIANCE_MAX:,})")
    if fit.spec.evidence_at is None:  # guide.covariance auto: the structure's own, now that the guide has chosen
        fit = dataclasses.replace(fit, spec=fit.spec.model_copy(update={"evidence_at": _own_evidence_at(
            fit.guide.covariance)}))
    path = fit.file(CHECKPOINT_FILE)
    if fit.resume and path is not None and checkpoint_exists(path):
        return _resume_finished(fit, path)

    started = time.perf_counter()
    prior = _initial_prior(fit, site)
    fit_covariance = _factored_laplace if fit.guide.factored else _full_laplace
    log_z, precision, scale, scale_at = fit_covariance(fit, prior, started)
    if fit.spec.precision_scale not in (None, 1.0):  # a factor given (a chosen one handed back, say)
        prior.log_precision += math.log(fit.spec.precision_scale)
        precision = prior.log_precision.exp()[prior.group_index]
        scale = scale_at(precision)
    if _noise_source(fit, prior) == "calibration":
        scale = _calibrate_noise(fit, site, prior, precision, scale_at)
    _set_posterior(fit, site, prior, precision, scale)
    link, precision_scale = (_choose_link(fit, site, prior, precision, scale_at)
                             if _link_source(fit) == "calibration" else (None, None))
    result = LaplaceResult(
        seconds=time.perf_counter() - started, log_evidence=float(log_z),
        prior_precision={label: float(prior.log_precision[g].exp()) for g, label in enumerate(prior.labels)},
        noise=float(prior.log_noise.exp()) if prior.log_noise is not None else None,
        link=link, precision_scale=precision_scale,
    )
    fit.log(_summary(result))
    if path is not None:
        _save(fit, path, result)
    result.posterior = LaplacePosterior.from_spec(fit.family, fit.guide, fit.spec, result.link)
    if fit.monitor is not None:  # no intermediate posterior: scored once, at the end
        fit.monitor.final(result.posterior, fit.data)
    return result


_STRUCTURE_NAMES = {"diag": "diagonal", "kron": "Kronecker-factored", "lowrank": "low-rank"}


def _own_evidence_at(covariance: str) -> str:
    """Where a covariance structure takes the evidence when ``evidence_at`` is unset: the linearised mode for a full
    covariance, the MAP for the others (the only place their GGN gives it).

    :param covariance: the guide's covariance (``auto`` resolved).
    :returns: ``linearised_mode`` or ``map``.
    """
    return "linearised_mode" if covariance == "full" else "map"


class Laplace(InferenceMethod):
    """Linearised Laplace of the subnetwork family at its MAP (:func:`fit_laplace`)."""

    streams_rows = True
    names = ("laplace",)
    spec = LaplaceSpec
    budget_section = "model.map"  # the MAP net's training is the fit's budget; the Laplace step takes none
    fitter = staticmethod(fit_laplace)
    files = (CHECKPOINT_FILE,)
    summary = "linearised Laplace at the MAP (subnetwork family), prior tuned by the evidence"
    own_guide = "laplace"
    fits_guide = False

    def noise_start(self, spec: LaplaceSpec, has_calibration_rows: bool, likelihood: Any) -> float | None:
        """Low for the MAP phase (:data:`~zoo.likelihoods.gaussian.LOW_NOISE_START`) where the calibration rows
        set the noise (:meth:`map_noise_by`), as SVI's; the prior's median otherwise.

        :param spec: the run's ``inference`` section.
        :param has_calibration_rows: whether the fit has rows held out of training.
        :param likelihood: the likelihood as the spec builds it.
        :returns: σ, or None (the prior's median).
        """
        by_rows = self.map_noise_by(spec, has_calibration_rows, likelihood) == "calibration"
        return gaussian.LOW_NOISE_START if by_rows else None

    def map_noise_by(self, spec: LaplaceSpec, has_calibration_rows: bool, likelihood: Any) -> str:
        """``calibration`` where the calibration rows set the GLM predictive's σ (:func:`noise_source`) of a learned
        noise: the MAP phase's candidates are then scored as the MAP member's are, so that the two are one fit.

        :param spec: the run's ``inference`` section.
        :param has_calibration_rows: whether the fit has rows held out of training.
        :param likelihood: the likelihood as the spec builds it.
        :returns: ``calibration`` or ``fit``.
        """
        by_rows = noise_source(spec, has_calibration_rows, likelihood.learns_noise) == "calibration"
        return "calibration" if by_rows and likelihood.learns_noise else "fit"

    def describe(self, spec: LaplaceSpec) -> str:
        return f"laplace ({spec.predictive} predictive)"

    def most_weights(self, run_spec, likelihood, rows: int, outputs: int) -> tuple[int, str] | None:
        # a full covariance (auto is full over a selection) on a classification keeps every row's Jacobian for its
        # Newton steps (_linearise_rows); a Gaussian likelihood keeps only sums over the rows
        if likelihood.gaussian or getattr(run_spec.guide, "covariance", "full") not in ("full", "auto"):
            return None
        return (MAX_STORED_JACOBIAN // (rows * outputs),
                f"a classification Laplace keeps the Jacobian of every row, {rows:,} rows x {outputs} outputs x the "
                f"weights, at most {MAX_STORED_JACOBIAN:,} numbers")

    def check(self, run_spec) -> list[ZooInputError]:
        inference, covariance = run_spec.inference, getattr(run_spec.guide, "covariance", "full")
        strategy = getattr(getattr(run_spec.model, "selection", None), "strategy", None)
        problems = []

        def refuse(when: bool, field: str, value, fix: str) -> None:
            if when:
                problems.append(ZooInputError(field, value, fix))

        refuse(covariance == "auto" and (inference.evidence_at == "linearised_mode" or inference.curvature == "ef"
                                         or inference.prior_structure == "weight"), "guide.covariance", "auto",
               f"auto (full, or kron over more than {FULL_COVARIANCE_MAX:,} weights) takes only what both take: "
               "evidence_at map or unset, curvature ggn, prior_structure scalar, layer or parameter; set "
               "guide.covariance: full or kron for the setting you gave")
        refuse(covariance not in ("full", "auto") and inference.evidence_at == "linearised_mode",
               "inference.evidence_at", "linearised_mode",
               f"a {_STRUCTURE_NAMES.get(covariance)} Laplace (guide.covariance: {covariance}) "
               "evaluates the evidence at the MAP only: use inference.evidence_at: map (or leave it out), or "
               "guide.covariance: full")
        refuse(covariance == "full" and inference.curvature == "ef", "inference.curvature", "ef",
               "the empirical Fisher is offered with guide.covariance: diag, kron or lowrank; a full covariance "
               "takes the GGN "
               "(its evidence at the linearised mode is the GGN's): use inference.curvature: ggn")
        no_rows = run_spec.data.brings_calibration_rows() is False
        refuse(inference.tune_by == "calibration" and no_rows, "inference.tune_by", "calibration", NO_CALIBRATION_ROWS)
        refuse(inference.link_by == "calibration" and no_rows, "inference.link_by", "calibration", NO_LINK_ROWS)
        refuse(inference.tune_by == "calibration" and inference.prior_structure != "scalar",
               "inference.prior_structure", inference.prior_structure, "tune_by: calibration searches a grid of one "
               "prior precision for every weight: use prior_structure: scalar, or tune_by: evidence")
        refuse(covariance == "kron" and inference.prior_structure == "weight", "inference.prior_structure", "weight",
               "a Kronecker-factored covariance takes one prior precision per weight tensor: use scalar, layer or "
               "parameter, or guide.covariance: diag or full for one per weight")
        refuse(covariance == "kron" and strategy not in (None, "all", "last_layer", "modules"),
               "model.selection.strategy", strategy, "a Kronecker-factored covariance (guide.covariance: kron) factors "
               "whole layers: use strategy all, last_layer or modules, or guide.covariance: full or diag for a "
               "selection of weights")
        takes = [name for name, family in FAMILIES.items() if family.linearisable]
        refuse(not run_spec.model.linearisable, "model.family", run_spec.model.family, "inference.method: laplace "
               f"linearises a MAP net around its latent weights, and family '{run_spec.model.family}' does not "
               f"linearise: use model.family: {' or '.join(takes)} (for the subnetwork family, selection size 1.0 "
               "gives the whole net)")
        return problems

    def complete(self, tree: dict) -> dict:
        """``evidence_at`` left out (or null) becomes the structure's own: the linearised mode for a full covariance,
        the MAP for a diagonal, Kronecker-factored or low-rank one (the only place their GGN gives it).

        :param tree: the spec as a dict, before validation.
        :returns: the tree with ``inference.evidence_at`` written out.
        """
        inference, guide = tree.get("inference"), tree.get("guide")
        if not isinstance(inference, dict) or inference.get("evidence_at") is not None:
            return tree
        covariance = guide.get("covariance", "full") if isinstance(guide, dict) else "full"
        if covariance == "auto":  # known once the guide sees the weights: fit_laplace writes it out then
            return tree
        return {**tree, "inference": {**inference, "evidence_at": _own_evidence_at(covariance)}}

    def fit_record(self, result) -> dict:
        return guide_fit_record(result)

    def load(self, family, guide, spec, run_dir, device, start=None) -> LaplacePosterior:
        state = load_guide_checkpoint(family, guide, run_dir, device)
        return LaplacePosterior.from_spec(family, guide, spec, state.get("link"))

