"""The potential every sampler and minibatch method shares: a family's model as U(z) = -log p(w, y | x) - log|det J|
at C stacked points ``z [C, D]`` of unconstrained coordinates, and the chains' starting points.

:class:`Coordinates` packs a family's latent sites into one unconstrained vector (and back, with the Jacobian's
log-determinant); :class:`LogJoint` evaluates the log joint of C points as one tensor computation (the prior terms
from one trace of the model, the likelihood from the family's batched ``log_likelihood``), checked against the model
itself; :class:`Potential` is the full-data potential with its gradient (compiled where asked), and
:class:`MinibatchPotential` its unbiased minibatch estimate (SG-MCMC, SWAG). :func:`initial_points` draws the chains'
starts: from the prior, the net's own initialisation, or the posterior of a run.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pyro
import torch
from pyro import poutine
from pyro.poutine.util import site_is_subsample
from torch.distributions import biject_to
from torch.distributions.transforms import identity_transform
from torch.func import vmap

from zoo.data.base import Dataset
from zoo.errors import ZooInputError
from zoo.inference.base import copy_point_parameters
from zoo.inference.compiled import TracedCompile, exp_tanh
from zoo.models.base import ModelFamily
from zoo.nets import batch_dependent, reinitialise, run_batched
from zoo.posterior import Posterior


# ------------------------------------------------------------------------------------------ the potential
class Coordinates:
    """The flat unconstrained layout of a model's latent sites: ``z [C, D]`` <-> ``{site: [C, *shape]}``."""

    def __init__(self, family: ModelFamily) -> None:
        self.sites = family.latent_sites()
        self.names = list(self.sites)
        self.shapes = [self.sites[n].shape for n in self.names]
        self.sizes = [max(1, s.numel()) for s in self.shapes]
        self.transforms = {n: biject_to(s.support) for n, s in self.sites.items()}
        self.dim = sum(self.sizes)

    def unpack(self, z: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Constrained site values from ``z [C, D]``, and log|det dvalues/dz| per point ``[C]``."""
        values, log_det = {}, z.new_zeros(z.shape[0])
        for name, part, shape in zip(self.names, z.split(self.sizes, dim=-1), self.shapes, strict=True):
            raw = part.reshape(z.shape[0], *shape)
            transform = self.transforms[name]
            values[name] = transform(raw)
            if transform is not identity_transform:
                log_det = log_det + transform.log_abs_det_jacobian(raw, values[name]).reshape(z.shape[0], -1).sum(-1)
        return values, log_det

    def pack(self, values: dict[str, torch.Tensor]) -> torch.Tensor:
        """``z [C, D]`` from constrained values ``{site: [C, *shape]}``."""
        missing = [n for n in self.names if n not in values]
        if missing:
            raise ZooInputError("inference.init", ", ".join(missing), "these latent sites have no starting value")
        parts = []
        for name, shape in zip(self.names, self.shapes, strict=True):
            value = values[name]
            if tuple(value.shape[1:]) != tuple(shape):
                raise ZooInputError("inference.init", name, f"has shape {tuple(value.shape[1:])}, the model "
                                    f"needs {tuple(shape)}: start from a run of the same net")
            parts.append(self.transforms[name].inv(value).reshape(value.shape[0], -1))
        return torch.cat(parts, dim=-1)


class LogJoint:
    """log p(w, y | x) of ``family.model`` on all of (x, y), at C stacked draws ``{site: [C, *shape]}``: ``[C]``."""

    def __init__(self, family: ModelFamily, x: torch.Tensor, y: torch.Tensor) -> None:
        self.family, self.x, self.y = family, x, y
        with torch.no_grad(), pyro.validation_enabled(False):
            trace = poutine.trace(family.model).get_trace(x, y)
        latent = set(family.latent_sites())
        self.priors, self.constant, self.obs_scale = [], 0.0, 1.0
        for name, site in trace.nodes.items():
            if site["type"] != "sample" or site_is_subsample(site):
                continue
            fn = site["fn"]
            if getattr(fn, "has_enumerate_support", False) and not site["is_observed"]:
                raise ZooInputError("model", name, "is a discrete latent site; HMC/NUTS need continuous ones: "
                                    "marginalise it or use inference.method: svi")
            if not site["is_observed"]:
                if name not in latent:
                    raise ZooInputError("model", name, "is a latent site the family does not declare in "
                                        "latent_sites(), so MCMC cannot place it; add it there")
                self.priors.append((name, fn, site["scale"]))
            elif name == "obs":
                self.obs_scale = site["scale"]
            else:  # a factor of point parameters only (e.g. weight decay on rank-1's W): a constant here
                self.constant += float((site["scale"] * fn.log_prob(site["value"])).sum())
        self.exact_only = False

    def fast(self, values: dict[str, torch.Tensor]) -> torch.Tensor:
        """The log joint as one batched computation: prior terms per site, then the family's log-likelihood."""
        return self.on_rows(values, self.x, self.y, 1.0)

    def on_rows(self, values: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                scale: float) -> torch.Tensor:
        """The log joint with the likelihood of rows (x, y) weighted by ``scale`` (N/B for a minibatch of B rows:
        an unbiased estimate of the full-data log joint, as SG-MCMC needs)."""
        total = (self.obs_scale * scale) * self.family.log_likelihood(values, x, y).sum(-1)
        for name, fn, site_scale in self.priors:
            value = values[name]
            total = total + site_scale * fn.log_prob(value).reshape(value.shape[0], -1).sum(-1)
        return total + self.constant

    def exact(self, values: dict[str, torch.Tensor]) -> torch.Tensor:
        """The log joint of the model traced at every draw (vmapped): the definition ``fast`` is checked against."""

        def one(draw: dict[str, torch.Tensor]) -> torch.Tensor:
            model = poutine.condition(self.family.model, data=draw)
            return poutine.trace(model).get_trace(self.x, self.y).log_prob_sum()

        def one_at_a_time() -> torch.Tensor:  # a net vmap cannot batch (a GRU, an LSTM): draw after draw
            count = next(iter(values.values())).shape[0]
            return torch.stack([one({n: v[c] for n, v in values.items()}) for c in range(count)])

        with pyro.validation_enabled(False):
            return run_batched(self.family.net, lambda: vmap(one)(values), one_at_a_time)

    def verify(self, values: dict[str, torch.Tensor], log=None) -> None:
        """Use the exact evaluation from now on if the fast one disagrees with it at ``values``."""
        with torch.no_grad():
            fast, exact = self.fast(values), self.exact(values)
        tolerance = 1e-4 * exact.abs().clamp(min=1.0) + (1e-2 if exact.dtype == torch.float32 else 1e-6)
        if ((fast - exact).abs() > tolerance).any():
            self.exact_only = True
            if log is not None:
                log(f"batched log joint differs from the model's trace by {(fast - exact).abs().max():.3g}; "
                    "using the traced model at every point (exact, slower)")

    def __call__(self, values: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.exact(values) if self.exact_only else self.fast(values)


class Potential:
    """U(z) = -log p(w(z), y | x) - log|det J(z)| at C points ``z [C, D]``, with its gradient.

    With ``compile=True`` the value and the gradient are one compiled graph per batch shape: the potential is
    traced together with its reverse pass (``torch.func.grad_and_value``, see :class:`TracedCompile`), so a
    call runs a few fused kernels with no autograd engine, and on CPU tanh is rewritten in terms of exp (see
    :func:`exp_tanh`). On a GPU the compiled graph is also captured as a CUDA graph, so a call is one replay.
    """

    def __init__(self, family: ModelFamily, data: Dataset, compile: bool = False, temperature: float = 1.0,
                 chain_chunk: int | None = None) -> None:
        self.chain_chunk = chain_chunk  # evaluate at most this many points per call (None: all at once)
        self.coords = Coordinates(family)
        self.log_joint = LogJoint(family, data.x_train, data.y_train)
        self.temperature = temperature  # the target is p(w | D)^(1/T); the Jacobian term is not tempered
        self.evaluations = 0
        rewrite = exp_tanh if data.x_train.device.type == "cpu" else None
        self._fused = (TracedCompile(self._traced_value_and_grad, "the potential", rewrite, cuda_graphs=True)
                       if compile else None)

    @property
    def compiled(self) -> bool:
        """Whether calls run the compiled graph (asked for, and tracing and compiling have not failed)."""
        return self._fused is not None and self._fused.active

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        """U at every row of ``z``: ``[C]``."""
        values, log_det = self.coords.unpack(z)
        log_joint = self.log_joint(values)
        if self.temperature != 1.0:
            log_joint = log_joint / self.temperature
        return -(log_joint + log_det)

    def value_and_grad(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """U ``[C]`` and dU/dz ``[C, D]`` (rows are independent chains, so one reverse pass serves all).

        With ``chain_chunk``, the rows go through in chunks of that many: on a net whose activations for all chains
        outgrow the CPU's caches, smaller calls are faster per chain (``benchmarks/hmc_chain_chunk.py``).
        """
        self.evaluations += 1
        z = z.detach()
        if self.chain_chunk is not None and len(z) > self.chain_chunk:
            parts = [self._value_and_grad(piece) for piece in z.split(self.chain_chunk)]
            return torch.cat([e for e, _ in parts]), torch.cat([g for _, g in parts])
        return self._value_and_grad(z)

    def _value_and_grad(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        fused = self._fused(z) if self.compiled else None
        if fused is not None:
            return fused
        with torch.enable_grad():
            z = z.requires_grad_(True)
            energy = self(z)
            (grad,) = torch.autograd.grad(energy.sum(), z)
        return energy.detach(), grad

    def pointwise(self, z: torch.Tensor,
                  velocity: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Each training row's log-likelihood at every point ``z [C, D]``: ``[C, N]``, a permutation-invariant
        picture of the function each chain is at; with ``velocity`` ``[C, D]``, also its time derivative along it."""
        log_joint = self.log_joint

        def rows(z: torch.Tensor) -> torch.Tensor:
            return log_joint.family.log_likelihood(self.coords.unpack(z)[0], log_joint.x, log_joint.y)

        with torch.no_grad(), pyro.validation_enabled(False):
            if velocity is None:
                return rows(z.detach())
            try:
                return torch.func.jvp(rows, (z.detach(),), (velocity.detach(),))
            except NotImplementedError as err:  # oneDNN's and cuDNN's LSTM kernels have no forward AD; torch's own do
                if "forward AD" not in str(err):
                    raise
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # oneDNN's flags warn of TF32 on Intel GPUs
                    with torch.backends.mkldnn.flags(enabled=False), torch.backends.cudnn.flags(enabled=False):
                        return torch.func.jvp(rows, (z.detach(),), (velocity.detach(),))

    def energy(self, z: torch.Tensor) -> torch.Tensor:
        """U at every row of ``z``, differentiable in ``z`` (for Pyro's NUTS, which takes its own gradient).

        Value and gradient both come from :meth:`value_and_grad`; ``(z - z.detach()) @ grad`` is zero but
        carries that gradient back to ``z``.
        """
        energy, grad = self.value_and_grad(z)
        return energy + ((z - z.detach()) * grad).sum(-1)

    def _traced_value_and_grad(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def total(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            energy = self(z)
            return energy.sum(), energy

        with pyro.validation_enabled(False), torch.enable_grad():
            grad, (_, energy) = torch.func.grad_and_value(total, has_aux=True)(z)
        return energy, grad


class MinibatchPotential:
    """U_B(z) = -(log prior + N/B sum over B rows of log p(y | x, w)) / T - log|det J| at C points ``z [C, D]``.

    With ``compile=True`` a minibatch method's whole update (:meth:`update`: the potential, its gradient and the
    method's move) is one compiled graph per minibatch size (:class:`TracedCompile`; on a GPU also a CUDA graph),
    the move's random draws passed in as inputs.
    """

    def __init__(self, family: ModelFamily, data: Dataset, temperature: float = 1.0, compile: bool = False) -> None:
        self.coords = Coordinates(family)
        self.log_joint = LogJoint(family, data.x_train, data.y_train)
        self.n, self.temperature = data.n_train, temperature
        with torch.no_grad():
            probe = self.coords.pack({n: s.init.unsqueeze(0).to(device=data.device, dtype=data.dtype)
                                      for n, s in self.coords.sites.items()})
        self.log_joint.verify(self.coords.unpack(probe)[0])
        if self.log_joint.exact_only:
            raise ZooInputError("model.family", type(family).__name__, "its batched log-likelihood differs from its "
                                "model, and minibatch methods evaluate minibatches only through the batched one; use "
                                "inference.method: hmc or nuts")
        rewrite = exp_tanh if data.x_train.device.type == "cpu" else None
        self._fused = (TracedCompile(self._traced_update, "the minibatch update", rewrite, cuda_graphs=True)
                       if compile else None)

    @property
    def compiled(self) -> bool:
        """Whether updates run the compiled graph (asked for, and tracing and compiling have not failed)."""
        return self._fused is not None and self._fused.active

    def value_and_grad(self, z: torch.Tensor, rows: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """U_B ``[C]`` and its gradient ``[C, D]`` on a minibatch.

        :param z: the chains' points ``[C, D]``.
        :param rows: indices of training rows in memory (None: all of them), or a streamed ``(x, y)`` batch.
        :returns: the minibatch potential and its gradient.
        """
        return self.update(z, rows, _no_move)

    def update(self, z: torch.Tensor, rows: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None,
               move: Callable[..., tuple[torch.Tensor, ...]], *state: torch.Tensor, **settings: Any
               ) -> tuple[torch.Tensor, ...]:
        """U_B and its gradient at ``z`` on a minibatch, then ``move(z, energy, grad, *state, **settings)``.

        :param z: the chains' points ``[C, D]``.
        :param rows: indices of training rows in memory (None: all of them), or a streamed ``(x, y)`` batch.
        :param move: a function of tensors (no host reads, no random draws) returning the method's new state.
        :param state: the move's tensor inputs (momenta, step size, the step's noise).
        :param settings: the move's fixed settings (hashable: part of the compiled graph, as shapes are).
        :returns: ``(energy [C], grad [C, D], *move's outputs)``.
        """
        x, y = self.log_joint.x, self.log_joint.y
        if isinstance(rows, tuple):  # a batch streamed from a loader, moved to where the model computes
            x = rows[0].to(device=x.device, dtype=z.dtype if rows[0].is_floating_point() else rows[0].dtype)
            y = rows[1].to(device=x.device, dtype=z.dtype if rows[1].is_floating_point() else rows[1].dtype)
        elif rows is not None:
            x, y = x.index_select(0, rows), y.index_select(0, rows)
        z = z.detach()
        fused = self._fused(z, x, y, *state, static={"move": move, **settings}) if self.compiled else None
        if fused is not None:
            return fused
        with torch.enable_grad():
            z = z.requires_grad_(True)
            energy = self._energy(z, x, y)
            (grad,) = torch.autograd.grad(energy.sum(), z)
        energy = energy.detach()
        return energy, grad, *move(z.detach(), energy, grad, *state, **settings)

    def _energy(self, z: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        values, log_det = self.coords.unpack(z)
        log_joint = self.log_joint.on_rows(values, x, y, self.n / len(x))
        return -(log_joint / self.temperature + log_det)

    def _traced_update(self, z: torch.Tensor, x: torch.Tensor, y: torch.Tensor, *state: torch.Tensor,
                       move: Callable[..., tuple[torch.Tensor, ...]], **settings: Any) -> tuple[torch.Tensor, ...]:
        def total(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            energy = self._energy(z, x, y)
            return energy.sum(), energy

        with pyro.validation_enabled(False), torch.enable_grad():
            grad, (_, energy) = torch.func.grad_and_value(total, has_aux=True)(z)
        return energy, grad, *move(z, energy, grad, *state, **settings)


def _no_move(z: torch.Tensor, energy: torch.Tensor, grad: torch.Tensor) -> tuple[()]:
    """The move of a plain evaluation: none."""
    return ()


# ------------------------------------------------------------------------------------------ starting points
def initial_points(family: ModelFamily, coords: Coordinates, chains: int, data: Dataset, log,
                   start: Posterior | None = None, fresh: str = "prior") -> torch.Tensor:
    """``z [C, D]`` for C chains: draws of ``start`` (the posterior of the run ``inference.init`` names), else
    ``fresh`` ones: prior draws, (``net``) the net's own initialisation redrawn for every chain, or (``weights``)
    every chain at the net's weights as they are (a trained net's)."""
    if start is not None:
        copy_point_parameters(family, start, "inference.init")
        values = {n: v.to(device=data.device, dtype=data.dtype) for n, v in start.sample(chains).items()}
        if next(iter(values.values())).shape[0] < chains:  # a Delta guide or a short run: repeat its draws
            values = {n: v[torch.arange(chains) % v.shape[0]] for n, v in values.items()}
        log(f"chains start at {chains} draws of the posterior inference.init names")
        return coords.pack(values)
    if family.point_parameters():
        raise ZooInputError("inference.init", fresh, "this family has point-estimated weights that this method "
                            "does not fit: train it with SVI first and set inference.init to that run directory")
    if fresh == "net":  # a likelihood's own sites (a learned noise) start on the host: to the data's device
        return coords.pack({n: v.to(device=data.device, dtype=data.dtype)
                            for n, v in _net_initialisations(family, chains).items()})
    if fresh == "weights":
        log(f"{chains} chain(s) start at the net's own weights")
        return coords.pack({n: s.init.unsqueeze(0).expand(chains, *s.shape).to(device=data.device, dtype=data.dtype)
                            for n, s in family.latent_sites().items()})
    draws: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad(), pyro.validation_enabled(False):
        for _ in range(chains):
            trace = poutine.trace(family.model).get_trace(data.x_train, data.y_train)
            for name in coords.names:
                draws.setdefault(name, []).append(trace.nodes[name]["value"])
    return coords.pack({n: torch.stack(v) for n, v in draws.items()})


def _net_initialisations(family: ModelFamily, chains: int) -> dict[str, torch.Tensor]:
    """Each latent site's initial value ``[C, ...]`` with the net re-initialised (``reset_parameters`` of every
    layer, from the current random stream) for each chain; the net's own values are put back afterwards."""
    net = family.net
    kept = {k: v.clone() for k, v in net.state_dict().items()}
    values: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad():
        for _ in range(chains):
            reinitialise(net)
            for name, site in family.latent_sites().items():
                values.setdefault(name, []).append(site.init.clone())
        net.load_state_dict(kept)
    return {n: torch.stack(v) for n, v in values.items()}


def refuse_batch_dependent(family: ModelFamily, what: str) -> None:
    """Refuse a net whose output for a row depends on its batch (BatchNorm): ``what`` needs a fixed potential."""
    net = family.net
    if batch_dependent(net):
        raise ZooInputError("net.name", type(net).__name__, f"{what} samples a fixed function of the weights, and "
                            "this net's BatchNorm layers normalise by the statistics of the rows in a batch; use a "
                            "net without BatchNorm (mlp, cnn, lenet5), model.family: subnetwork (whose MAP net "
                            "keeps its running statistics fixed), or, for a trained net of your own, put it in eval "
                            "mode (net.eval()) so that BatchNorm keeps the running statistics it was trained with")


