"""Local reparameterisation (Kingma et al. 2015) as a Pyro effect handler, not as new layers.

Inside the handler, a weight drawn from a Normal guide is remembered by identity; when the net then calls
``F.linear`` with it, the pre-activations are sampled from their exact Gaussian marginal
N(x mu^T + mu_b, x^2 sigma^2^T + sigma_b^2) instead of being computed from the shared weight sample. ``F.conv2d``
is treated alike: a convolution is linear in its kernel, so its outputs are N(conv(x, mu) + mu_b,
conv(x^2, sigma^2) + sigma_b^2), with independent noise per example, channel and position.
The expected ELBO is unchanged; the gradient variance falls because each example gets its own noise.
"""

from __future__ import annotations

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.poutine.messenger import Messenger

_FRESH = "_zoo_local_reparam_fresh"


def _normal_base(fn: dist.TorchDistribution) -> dist.Normal | None:
    while isinstance(fn, dist.Independent | torch.distributions.Independent):
        fn = fn.base_dist
    return fn if isinstance(fn, torch.distributions.Normal) else None


class LocalReparameterization(Messenger):
    """Sample Linear and Conv2d pre-activations instead of weights for every weight drawn from a Normal guide.

    ``rows = (start, stop, total)`` says that the batch is rows start:stop of a ``total``-row minibatch split
    across processes: the noise is then drawn for all ``total`` rows and these rows' share kept, so that every
    row gets the noise it would get in one process (the ranks share one random stream).
    """

    rows: tuple[int, int, int] | None = None

    def __enter__(self):
        self._normals: dict[int, tuple[torch.Tensor, torch.distributions.Normal]] = {}
        self._linear, self._conv2d = F.linear, F.conv2d
        F.linear, F.conv2d = self._sampled_linear, self._sampled_conv2d
        return super().__enter__()

    def __exit__(self, *exc):
        F.linear, F.conv2d = self._linear, self._conv2d
        self._normals = {}
        return super().__exit__(*exc)

    def _pyro_sample(self, msg: dict) -> None:
        # A value already set here was replayed from the guide (the model's run): only fresh draws count.
        if msg["value"] is None and not msg["is_observed"]:
            msg["infer"] = {**msg["infer"], _FRESH: True}

    def _pyro_post_sample(self, msg: dict) -> None:
        if msg["infer"].pop(_FRESH, False):  # pop: replay hands the guide's infer dict to the model site
            normal = _normal_base(msg["fn"])
            if normal is not None:
                self._normals[id(msg["value"])] = (msg["value"], normal)

    def _lookup(self, tensor: torch.Tensor | None) -> torch.distributions.Normal | None:
        entry = self._normals.get(id(tensor)) if tensor is not None else None
        return entry[1] if entry is not None and entry[0] is tensor else None

    def _sampled_linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
        q_weight = self._lookup(weight)
        if q_weight is None:
            return self._linear(x, weight, bias)
        mean = self._linear(x, q_weight.loc)
        var = self._linear(x * x, q_weight.scale**2)
        q_bias = self._lookup(bias)
        if q_bias is not None:
            mean, var = mean + q_bias.loc, var + q_bias.scale**2
        elif bias is not None:
            mean = mean + bias
        return mean + var.clamp_min(1e-16).sqrt() * self._noise(mean, row_dim=-2)

    def _sampled_conv2d(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *args):
        q_weight = self._lookup(weight)
        if q_weight is None:
            return self._conv2d(x, weight, bias, *args)
        mean = self._conv2d(x, q_weight.loc, None, *args)
        var = self._conv2d(x * x, q_weight.scale**2, None, *args)
        q_bias = self._lookup(bias)
        if q_bias is not None:
            mean, var = mean + q_bias.loc[:, None, None], var + (q_bias.scale**2)[:, None, None]
        elif bias is not None:
            mean = mean + bias[:, None, None]
        return mean + var.clamp_min(1e-16).sqrt() * self._noise(mean, row_dim=-4)

    def _noise(self, mean: torch.Tensor, row_dim: int) -> torch.Tensor:
        """Standard normal noise of ``mean``'s shape, whose examples lie along ``row_dim``. Drawn contiguous, never
        in ``mean``'s memory layout: a compiled conv net hands over channels-last outputs, where ``randn_like`` fills
        in another order than eager's (other draws) and took 7x longer on CPU (normal_ on a strided tensor)."""
        if self.rows is None:
            return torch.randn(mean.shape, dtype=mean.dtype, device=mean.device)
        start, stop, total = self.rows
        shape = list(mean.shape)
        shape[row_dim] = total
        return torch.randn(shape, dtype=mean.dtype, device=mean.device).narrow(row_dim, start, stop - start)
