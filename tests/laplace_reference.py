"""Two independent references for subnetwork linearised (GLM) Laplace, for tests to compare against.

``laplace_torch_glm`` runs laplace-torch's ``SubnetLaplace`` (the optional ``peer`` extra); ``dense_glm`` is
the same approximation written out densely with plain torch. Both take the same arguments, treat the current
parameters of ``net`` as the MAP, and return a :class:`GLMPredictive` in float64:

``mean``  [B, O]     f(x*) at the MAP (the GLM predictive mean of f);
``var``   [B, O, O]  covariance of f(x*) under the linearised posterior, J* Σ J*ᵀ. It is the variance of the
                     *function*: for regression the observation noise is NOT included (add sigma_noise² · I
                     for the predictive of y); take ``var.diagonal(dim1=-2, dim2=-1)`` for [B, O];
``probs`` [B, O]     classification only (None for regression): the probit approximation of the predictive
                     class probabilities, softmax(mean / sqrt(1 + π/8 · diag var)).

The model both implement: parameters θ = ``parameters_to_vector(net.parameters())`` (named_parameters order,
each tensor flattened row-major); only θ[indices] is uncertain, the rest stays at its MAP value. With
J_n = ∂f(x_n)/∂θ[indices] at the MAP ([O, D]),

    GGN = Σ_n J_nᵀ Λ_n J_n,   Λ_n = I / sigma_noise² (Gaussian)  or  diag(p_n) − p_n p_nᵀ, p_n = softmax(f(x_n))
    Σ   = (GGN + diag(prior_precision))⁻¹          (prior N(0, diag(prior_precision)⁻¹) on θ[indices])

with prior_precision a float (the same for every subnet element) or a tensor [D] aligned with ``indices``.
The prior is fixed (no marginal-likelihood tuning) and so is sigma_noise, which must be 1 for classification
(laplace-torch refuses anything else there; ``dense_glm`` ignores it for classification).
"""

from __future__ import annotations

import copy
import math
from typing import NamedTuple

import pytest
import torch
from torch import Tensor, nn
from torch.func import functional_call, jacrev

_CHUNK = 256  # inputs per Jacobian computation; the results do not depend on it


class GLMPredictive(NamedTuple):
    mean: Tensor  # [B, O] f at the MAP
    var: Tensor  # [B, O, O] covariance of f (no observation noise)
    probs: Tensor | None  # [B, O] probit class probabilities (classification), else None


def _prepare(net: nn.Module, indices: Tensor, x_train: Tensor, y_train: Tensor, x_test: Tensor, likelihood: str,
             prior_precision: float | Tensor, sigma_noise: float):
    """Validate the shared arguments; return a float64 eval-mode copy of net and float64/long tensors."""
    if likelihood not in ("regression", "classification"):
        raise ValueError(f"likelihood must be 'regression' or 'classification', not {likelihood!r}")
    if likelihood == "classification" and float(sigma_noise) != 1.0:
        raise ValueError("sigma_noise must be 1 for classification (laplace-torch refuses anything else)")
    if any(not p.requires_grad for p in net.parameters()):
        # laplace-torch indexes only the parameters that require grad; the index spaces would then differ
        raise ValueError("every parameter of net must require grad: indices index parameters_to_vector(all)")
    n_params = sum(p.numel() for p in net.parameters())
    idx = torch.as_tensor(indices).detach().cpu().to(torch.long).reshape(-1)
    if idx.numel() == 0 or idx.min() < 0 or idx.max() >= n_params or idx.unique().numel() != idx.numel():
        raise ValueError(f"indices must be distinct and lie in [0, {n_params})")
    if isinstance(prior_precision, Tensor):
        prec = prior_precision.detach().cpu().to(torch.float64).reshape(-1)
        if prec.numel() == 1:
            prec = prec.expand(idx.numel()).clone()
        elif prec.numel() != idx.numel():
            raise ValueError(f"prior_precision has {prec.numel()} entries, the subnet {idx.numel()}")
    else:
        prec = torch.full((idx.numel(),), float(prior_precision), dtype=torch.float64)
    if (prec <= 0).any():
        raise ValueError("prior_precision must be positive")
    model = copy.deepcopy(net).cpu().to(torch.float64).eval()
    x_tr = x_train.detach().cpu().to(torch.float64)
    x_te = x_test.detach().cpu().to(torch.float64)
    if likelihood == "classification":
        y_tr = y_train.detach().cpu().to(torch.long).reshape(-1)
    else:
        y_tr = y_train.detach().cpu().to(torch.float64)
        if y_tr.ndim == 1:
            y_tr = y_tr[:, None]
    return model, idx, x_tr, y_tr, x_te, prec


def dense_jacobian(model: nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
    """Full Jacobian [B, O, P] of model(x) w.r.t. all parameters (parameters_to_vector order), and f [B, O]."""
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}

    def f(p: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        out = functional_call(model, (p, buffers), (x,))
        return out, out

    jac, out = jacrev(f, has_aux=True)(params)
    if out.ndim != 2:
        raise ValueError(f"net must map [B, ...] to [B, O]; got an output of shape {tuple(out.shape)}")
    return torch.cat([jac[k].flatten(start_dim=2) for k in params], dim=2), out.detach()


def dense_glm(net: nn.Module, indices: Tensor, x_train: Tensor, y_train: Tensor, x_test: Tensor, likelihood: str,
              prior_precision: float | Tensor, sigma_noise: float) -> GLMPredictive:
    """Dense plain-torch subnetwork GLM Laplace predictive (see the module docstring), computed in float64.

    Jacobians of all parameters by ``torch.func.jacrev`` over ``functional_call``, sliced to ``indices``;
    GGN summed over the training inputs (``y_train`` is not used: the GGN and the predictive depend only on
    f at the MAP); Σ by a Cholesky inverse.
    """
    model, idx, x_tr, _, x_te, prec = _prepare(net, indices, x_train, y_train, x_test, likelihood, prior_precision,
                                               sigma_noise)
    d = idx.numel()
    ggn = torch.zeros(d, d, dtype=torch.float64)
    for start in range(0, x_tr.shape[0], _CHUNK):
        jac, out = dense_jacobian(model, x_tr[start:start + _CHUNK])
        js = jac[:, :, idx]  # [n, O, D]
        if likelihood == "regression":
            ggn += torch.einsum("nop,noq->pq", js, js) / float(sigma_noise) ** 2
        else:
            p = torch.softmax(out, dim=-1)
            lam = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]  # [n, O, O]
            ggn += torch.einsum("nop,nok,nkq->pq", js, lam, js)
    precision = ggn + torch.diag(prec)
    sigma = torch.cholesky_inverse(torch.linalg.cholesky(precision))
    means, covs = [], []
    for start in range(0, x_te.shape[0], _CHUNK):
        jac, out = dense_jacobian(model, x_te[start:start + _CHUNK])
        js = jac[:, :, idx]
        means.append(out)
        covs.append(torch.einsum("nop,pq,nkq->nok", js, sigma, js))
    mean, var = torch.cat(means), torch.cat(covs)
    var = 0.5 * (var + var.transpose(-1, -2))
    probs = None
    if likelihood == "classification":
        probs = torch.softmax(mean / torch.sqrt(1.0 + math.pi / 8.0 * var.diagonal(dim1=-2, dim2=-1)), dim=-1)
    return GLMPredictive(mean, var, probs)


def laplace_torch_glm(net: nn.Module, indices: Tensor, x_train: Tensor, y_train: Tensor, x_test: Tensor,
                      likelihood: str, prior_precision: float | Tensor, sigma_noise: float) -> GLMPredictive:
    """laplace-torch's subnetwork Laplace GLM predictive (see the module docstring), run in float64.

    ``Laplace(net, likelihood, subset_of_weights="subnetwork", hessian_structure="full", subnetwork_indices=...,
    sigma_noise=..., prior_precision=...)`` (a ``FullSubnetLaplace`` with its default backend, CurvlinopsGGN,
    which for subnetworks falls back to torch.func Jacobians and the exact GGN), ``fit`` on the training set,
    no prior tuning. On a float64 copy of ``net``, so ``net`` itself is untouched.

    What laplace-torch 0.3 returns, and how it is mapped here:
      * regression, ``la(x, pred_type="glm")`` -> ``(f_mu [B, O], f_var [B, O, O])``: the linearised function
        mean and covariance J* P⁻¹ J*ᵀ, WITHOUT sigma_noise² (it never adds the noise); returned as mean, var.
      * classification, ``la(x, pred_type="glm", link_approx="probit")`` -> probabilities [B, O],
        softmax(f_mu / sqrt(1 + π/8 · diag f_var)); returned as probs. The functional moments come from its
        public ``la.backend.jacobians(x)`` (J*, f_mu, sliced to the subnet) and ``la.functional_variance(J*)``.
      * posterior precision P = (1 / sigma_noise²) · H + diag(prior_precision_diag), H = Σ J_nᵀ Λ_n J_n
        (for regression: MSELoss(sum) GGN times its factor 0.5, i.e. Σ J_nᵀ J_n; temperature 1).
      * prior_precision: its setter accepts a 1-d tensor only of length 1, n_layers or n_params (the FULL
        net), while SubnetLaplace then needs length 1 or len(indices). A per-subnet-element tensor [D] is
        therefore written to ``la._prior_precision`` directly (the setter would raise "Length of prior
        precision does not align with architecture.").
    """
    from laplace import Laplace  # the optional peer extra; imported here so that the dense side never needs it

    model, idx, x_tr, y_tr, x_te, prec = _prepare(net, indices, x_train, y_train, x_test, likelihood,
                                                  prior_precision, sigma_noise)
    la = Laplace(model, likelihood, subset_of_weights="subnetwork", hessian_structure="full",
                 subnetwork_indices=idx, sigma_noise=float(sigma_noise), prior_precision=1.0)
    if bool((prec == prec[0]).all()):
        la.prior_precision = float(prec[0])
    else:
        la._prior_precision = prec.clone()  # see the docstring: the public setter refuses length D
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_tr, y_tr), batch_size=_CHUNK)
    la.fit(loader)
    if la.H.shape != (idx.numel(), idx.numel()):
        raise RuntimeError(f"laplace-torch built a {tuple(la.H.shape)} Hessian for a subnet of {idx.numel()}")
    means, covs, probs = [], [], []
    for start in range(0, x_te.shape[0], _CHUNK):
        xb = x_te[start:start + _CHUNK]
        if likelihood == "regression":
            f_mu, f_var = la(xb, pred_type="glm")
        else:
            js, f_mu = la.backend.jacobians(xb)
            f_var = la.functional_variance(js)
            probs.append(la(xb, pred_type="glm", link_approx="probit").detach())
        means.append(f_mu.detach())
        covs.append(f_var.detach())
    return GLMPredictive(torch.cat(means), torch.cat(covs), torch.cat(probs) if probs else None)


def relative_difference(a: Tensor, b: Tensor) -> float:
    """Largest absolute difference relative to the largest reference entry."""
    return float((a - b).abs().max() / b.abs().max())


def require_laplace() -> None:
    """Skip the calling test when laplace-torch (the optional 'peer' extra) does not import."""
    try:
        import laplace  # noqa: F401
    except Exception as err:  # ImportError, or e.g. RuntimeError from a CUDA-only torchvision that torchmetrics imports
        pytest.skip(f"laplace-torch (optional 'peer' extra: pip install -e '.[peer]') does not import: "
                    f"{type(err).__name__}: {err}")


def assert_agrees_with_laplace_torch(posterior, data, run_dir, subset: str, structure: str, backend=None,
                                     tolerance: float = 1e-6) -> None:
    """Fit laplace-torch's ``Laplace(net, task, subset_of_weights=subset, hessian_structure=structure)`` on the zoo
    posterior's MAP net, at its prior precision and noise, on every training row in one batch, and assert the same
    log evidence (the run's ``checkpoint.pt``) and GLM predictive (the moments for regression, probit for
    classification) to ``tolerance`` relative.

    :param posterior: a fitted zoo Laplace posterior (one prior precision for every weight).
    :param data: its data set.
    :param run_dir: its run directory.
    :param subset: ``all`` or ``last_layer``.
    :param structure: ``diag``, ``kron`` or ``full``.
    :param backend: laplace-torch's curvature backend (None: its default GGN).
    :param tolerance: the largest relative difference allowed.
    """
    from laplace import Laplace

    family = posterior.family
    task = "regression" if data.task == "regression" else "classification"
    noise = float(family.likelihood.fixed_noise) if task == "regression" else 1.0
    targets = data.y_train[:, None] if task == "regression" else data.y_train
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data.x_train, targets),
                                         batch_size=data.n_train)
    la = Laplace(family.net, task, subset_of_weights=subset, hessian_structure=structure,
                 prior_precision=float(family.prior_precision[0]), sigma_noise=noise,
                 **({} if backend is None else {"backend": backend}))
    la.fit(loader)
    record = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert relative_difference(torch.as_tensor(record["log_evidence"]),
                               la.log_marginal_likelihood().detach().double()) < tolerance
    if task == "regression":
        mean, var = la(data.x_test, pred_type="glm")
        ours_mean, ours_cov = posterior.glm_moments(data.x_test)
        assert relative_difference(ours_mean, mean) < tolerance
        assert relative_difference(ours_cov, var) < tolerance
    else:
        probs = la(data.x_test, pred_type="glm", link_approx="probit")
        assert relative_difference(posterior.predict(data.x_test).log_probs[0].exp(), probs) < tolerance
