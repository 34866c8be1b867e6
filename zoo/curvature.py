"""Curvature of a net's outputs for Laplace: Jacobians with respect to chosen weights, built layer by layer, and GGNs.

A weight w_ij of a Linear layer a = W h + b moves the outputs by ∂f/∂w_ij = (∂f/∂a_i) h_j. So the Jacobian of the
outputs with respect to any subset of a layer's weights is a product of two small factors: the layer's input h
and the outputs' Jacobian with respect to the layer's pre-activation a (one backward pass per output). Both
the subnetwork Jacobian and the full diagonal of the generalised Gauss-Newton matrix (GGN) are built from these
factors, so the cost grows with the subnet size and the layers' widths, never with a full Jacobian
``[B, outputs, all weights]``. Conv2d layers work the same way on unfolded input patches.

Any other layer with weights (an Embedding, a Conv1d/3d, a transposed or grouped convolution, a module of your own)
is selectable too: its weights' Jacobian is the per-example vector-Jacobian product of the layer with the same
``∂f/∂(layer output)`` factor, one ``torch.func`` vmap over rows and outputs, taken in chunks of rows so that it
never holds more than :data:`PER_EXAMPLE_FLOATS` numbers.

The Jacobian the linearised Laplace keeps is a linear map (:class:`OutputJacobian`): the tensor for any selection
(:class:`DenseJacobian`), or, for whole Linear layers, the two factors themselves (:class:`FactoredJacobian`), whose
products and GGN cost a fraction of the dense ones. The diagonal, Kronecker-factored and low-rank posteriors are
held as :class:`KroneckerBlock` and :class:`LowRankScale`, never as a D x D matrix.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from zoo.errors import ZooInputError
from zoo.nets import NORM_LAYERS, evaluation_mode

FIXED_LAYERS = NORM_LAYERS  # parameters held at their MAP values, never selected
PER_EXAMPLE_FLOATS = 2**24  # the most numbers a chunk of per-example weight gradients holds (64 MB in float32)


def factored(module: nn.Module) -> bool:
    """Whether a layer's weight Jacobians are built from its input and output factors (a Linear layer, an ungrouped
    zero-padded Conv2d); any other layer's come from per-example vector-Jacobian products.

    :param module: the layer.
    :returns: whether it has layer factors.
    """
    if isinstance(module, nn.Conv2d):
        return module.groups == 1 and module.padding_mode == "zeros"
    return isinstance(module, nn.Linear)


@dataclass(frozen=True)
class ParameterSlot:
    """One parameter tensor of the net and its place in the flat vector.

    :param name: its name in ``named_parameters`` (``features.0.weight``).
    :param module_name: the path of the module that owns it.
    :param module: that module.
    :param kind: its name within the module (``weight``, ``bias``, or a layer's own).
    :param shape: its shape.
    :param offset: where it starts in the flat vector.
    :param fixed: held at its MAP value whatever the selection (a normalisation layer, an excluded module).
    """

    name: str
    module_name: str
    module: nn.Module
    kind: str
    shape: torch.Size
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    fixed: bool = False  # held at its MAP value whatever the selection (a normalisation layer, an excluded module)

    @property
    def selectable(self) -> bool:
        """Whether a subnetwork may hold this parameter (normalisation layers' and excluded modules' stay at the
        MAP)."""
        return not self.fixed


class ParameterLayout:
    """The net's parameters in ``parameters_to_vector`` order; flat indices name single weights.

    :param net: the net.
    :param chosen: whether a module (by path) may be selected (None: every module); the others' parameters stay at
        the MAP, as normalisation layers' do.
    """

    def __init__(self, net: nn.Module, chosen: Callable[[str, nn.Module], bool] | None = None) -> None:
        modules = dict(net.named_modules())
        self.slots: list[ParameterSlot] = []
        offset = 0
        for name, param in net.named_parameters():
            module_name, _, kind = name.rpartition(".")
            module = modules[module_name]
            fixed = ((chosen is not None and not chosen(module_name, module)) or isinstance(module, FIXED_LAYERS)
                     or not param.requires_grad)  # a frozen parameter keeps its value
            self.slots.append(ParameterSlot(name, module_name, module, kind, param.shape, offset, fixed))
            offset += param.numel()
        self.size = offset
        self.module_names = list(dict.fromkeys(s.module_name for s in self.slots if s.selectable))

    def selectable(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """Which flat weights a subnetwork may hold (all but the fixed ones).

        :param device: where the mask goes.
        :returns: a boolean mask ``[size]``.
        """
        mask = torch.zeros(self.size, dtype=torch.bool, device=device)
        for slot in self.slots:
            mask[slot.offset:slot.offset + slot.numel] = slot.selectable
        return mask

    def slot_of(self, indices: torch.Tensor) -> torch.Tensor:
        """For each flat index, the position of its parameter in :attr:`slots`.

        :param indices: flat indices.
        :returns: slot positions, like ``indices``.
        """
        starts = torch.tensor([s.offset for s in self.slots], device=indices.device)
        return torch.searchsorted(starts, indices, right=True) - 1

    def split(self, indices: torch.Tensor) -> list[tuple[ParameterSlot, torch.Tensor, torch.Tensor]]:
        """The parameters touched by ``indices``, each with the entries of ``indices`` that fall in it and their flat
        offsets inside it.

        :param indices: flat indices.
        :returns: ``(slot, positions, local)`` per parameter touched.
        """
        which = self.slot_of(indices)
        parts = []
        for k, slot in enumerate(self.slots):
            positions = (which == k).nonzero().squeeze(-1)
            if len(positions):
                parts.append((slot, positions, indices[positions] - slot.offset))
        return parts

    def names_of(self, indices: torch.Tensor) -> list[str]:
        """The parameter name of each flat index.

        :param indices: flat indices.
        :returns: the names (e.g. ``hidden0.weight``), one per index.
        """
        return [self.slots[k].name for k in self.slot_of(indices).tolist()]


class KroneckerBlock(NamedTuple):
    """One parameter tensor's Gaussian with a Kronecker-factored covariance, in the eigenbases of its factors: for the
    tensor read as a matrix W [rows, cols] (row-major: a Linear weight [out, in], a Conv2d's [C_out, C_in kh kw], a
    bias [out, 1]), vec(W) - mean = (rows ⊗ cols) (scale ∘ z) with z standard normal. With KFAC's G ⊗ A curvature
    (G = Q_G diag(g) Q_Gᵀ over the outputs, A = Q_A diag(a) Q_Aᵀ over the inputs) and a prior precision δ,
    rows = Q_G, cols = Q_A and scale = (g aᵀ + δ)^-½.
    """

    rows: torch.Tensor  # the eigenvectors over the tensor's rows [rows, rows]
    cols: torch.Tensor  # the eigenvectors over its columns [cols, cols]
    scale: torch.Tensor  # the standard deviation along each product of eigenvectors [rows, cols]


class LowRankScale(NamedTuple):
    """The scale S (Σ = S Sᵀ) of a Gaussian whose precision is a diagonal prior precision Λ plus a rank-k curvature
    U E Uᵀ: with W = Λ^-½ U E^½ = Q R (thin QR) and R Rᵀ = V diag(s) Vᵀ,

        Σ = (Λ + U E Uᵀ)⁻¹ = Λ^-½ (I + W Wᵀ)⁻¹ Λ^-½,   S = diag(prior_scale) (I + basis diag(shrink) basisᵀ),

    prior_scale = Λ^-½, basis = Q V (orthonormal) and shrink = (1 + s)^-½ - 1: draws, densities and the outputs'
    covariance cost O(D k), never a D x D matrix.
    """

    prior_scale: torch.Tensor  # Λ^-½, the prior's standard deviations [D] (times √T for a tempered posterior)
    basis: torch.Tensor  # the directions the curvature narrows, orthonormal [D, k]
    shrink: torch.Tensor  # how much each narrows the prior's scale, in (-1, 0] [k]

    def covariance_weights(self) -> torch.Tensor:
        """b = (1 + shrink)² - 1: Σ = diag(prior_scale) (I + basis diag(b) basisᵀ) diag(prior_scale).

        :returns: ``[k]``.
        """
        return (1 + self.shrink).square() - 1


def _patches(module: nn.Conv2d, h: torch.Tensor) -> torch.Tensor:
    """The input patches a Conv2d multiplies with its kernel: ``[B, C_in * kh * kw, positions]``."""
    return F.unfold(h, module.kernel_size, dilation=module.dilation, padding=module.padding, stride=module.stride)


class LayerFactors:
    """Outputs ``f [B, O]`` of the net at ``x`` and, per layer, its input ``h`` and ``g = ∂f/∂(layer output)``.

    ``g`` is ``[B, O, out]`` for Linear layers and ``[B, O, C_out, positions]`` for Conv2d (and for a Linear layer
    applied at several positions, e.g. tokens); a Conv2d's ``h`` is its unfolded input patches. Any other layer
    keeps ``g`` in its output's shape ``[B, O, ...]`` and its inputs as it was called, for per-example
    vector-Jacobian products. The net runs in eval mode (BatchNorm at its running statistics), so examples are
    independent and one backward pass of ``f[:, o].sum()`` gives every example's ``∂f_o/∂a``.

    :param net: the net.
    :param layout: its parameters' layout (which modules are selectable).
    :param x: inputs ``[B, ...]``.
    :param modules: the selectable modules to take factors of (None: all; a last layer's backward passes then stop
        at the last layer).
    :raises ZooInputError: a selectable layer whose output is not one tensor.
    """

    def __init__(self, net: nn.Module, layout: ParameterLayout, x: torch.Tensor,
                 modules: set[str] | None = None) -> None:
        calls: dict[str, tuple[tuple, dict]] = {}
        outputs: dict[str, torch.Tensor] = {}
        self.modules = {s.module_name: s.module for s in layout.slots
                        if s.selectable and (modules is None or s.module_name in modules)}

        def recorder(name: str):
            def hook(module: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
                if not isinstance(out, torch.Tensor):
                    raise ZooInputError("model.exclude", name, f"subnetwork Laplace differentiates each selectable "
                                        f"layer's output, and {name!r} ({type(module).__name__}) returns a "
                                        f"{type(out).__name__}: keep it at the MAP with model.exclude: [{name}]")
                calls[name], outputs[name] = (_detached(args), _detached(kwargs)), out
            return hook

        handles = [m.register_forward_hook(recorder(n), with_kwargs=True) for n, m in self.modules.items()]
        try:
            with torch.enable_grad(), evaluation_mode(net):  # BatchNorm reads its running statistics
                f = net(x)
                if f.dim() != 2:
                    raise ValueError(f"the net's outputs must be [B, O], got {tuple(f.shape)}")
                names = list(outputs)
                grads: list[list[torch.Tensor]] = [[] for _ in names]
                for o in range(f.shape[1]):
                    for k, grad in enumerate(torch.autograd.grad(f[:, o].sum(), [outputs[n] for n in names],
                                                                 retain_graph=o < f.shape[1] - 1)):
                        grads[k].append(grad)
        finally:
            for handle in handles:
                handle.remove()
        self.f = f.detach()
        self.g: dict[str, torch.Tensor] = {}
        self.h: dict[str, torch.Tensor] = {}
        self.calls: dict[str, tuple[tuple, dict]] = {}  # the inputs of the layers without factors
        for name, per_output in zip(names, grads, strict=True):
            g, module, h = torch.stack(per_output, dim=1), self.modules[name], calls[name][0][0]
            if not factored(module):
                self.calls[name] = calls[name]
            elif isinstance(module, nn.Conv2d):
                g = g.flatten(3)
                self.h[name] = _patches(module, h)
            elif h.dim() > 2:  # a Linear layer over positions (tokens): as a 1x1 convolution
                g = g.movedim(-1, 2).flatten(3)  # [B, O, out, positions]
                self.h[name] = h.flatten(1, -2).transpose(1, 2)  # [B, in, positions]
            else:
                self.h[name] = h
            self.g[name] = g

    def per_example(self, name: str, cotangent: torch.Tensor,
                    reduce: Callable[[dict[str, torch.Tensor]], torch.Tensor]) -> list[torch.Tensor]:
        """Per-example weight gradients of a layer without factors, ``Σ <cotangent[b, k], ∂a_b/∂θ>`` for every row b
        and every k (``cotangent [B, K, *a.shape[1:]]``), handed to ``reduce`` chunk of rows by chunk of rows (as
        ``{parameter kind: [rows, K, *shape]}``).

        :param name: the layer's path.
        :param cotangent: what the layer's output is contracted with, per row and k.
        :param reduce: turns one chunk's gradients into what is kept of them.
        :returns: ``reduce``'s result per chunk.
        """
        module = self.modules[name]
        params = {k: p.detach() for k, p in module.named_parameters(recurse=False)}
        args, kwargs = self.calls[name]
        rows = cotangent.shape[0]
        batched = [0 if isinstance(a, torch.Tensor) and a.dim() and a.shape[0] == rows else None for a in args]

        def contribution(*example_and_cotangent):
            *example, c = example_and_cotangent
            example = [a[None] if dim == 0 else a for a, dim in zip(example, batched, strict=True)]
            return torch.func.grad(lambda th: (torch.func.functional_call(module, th, tuple(example), kwargs)[0]
                                               * c).sum())(params)

        per_k = torch.func.vmap(contribution, in_dims=(*[None] * len(args), 0))
        per_row = torch.func.vmap(per_k, in_dims=(*batched, 0))
        width = max(1, sum(p.numel() for p in params.values()) * cotangent.shape[1])
        chunk = max(1, PER_EXAMPLE_FLOATS // width)
        kept = []
        with torch.enable_grad():
            for start in range(0, rows, chunk):
                part = slice(start, start + chunk)
                kept.append(reduce(per_row(*[a[part] if dim == 0 else a for a, dim in zip(args, batched, strict=True)],
                                           cotangent[part])))
        return kept

    def jacobian(self, layout: ParameterLayout, indices: torch.Tensor) -> torch.Tensor:
        """The Jacobian of the outputs with respect to the weights at flat ``indices``, built from the layer factors
        (per-example vector-Jacobian products for a layer without factors).

        :param layout: the net's parameter layout.
        :param indices: the D flat indices.
        :returns: ``∂f/∂w [B, O, D]``.
        """
        J = self.f.new_zeros(*self.f.shape, len(indices))
        for slot, positions, local in layout.split(indices):
            g = self.g[slot.module_name]
            if slot.module_name in self.calls:
                cols = torch.cat(self.per_example(slot.module_name, g,
                                                  lambda grads, kind=slot.kind, local=local:
                                                  grads[kind].flatten(2)[:, :, local]))
                J[:, :, positions] = cols
                continue
            h = self.h[slot.module_name]
            if slot.kind == "bias":
                cols = g[:, :, local] if g.dim() == 3 else g[:, :, local].sum(-1)
            elif g.dim() == 3:  # Linear: w_ij -> g_i h_j
                fan_in = slot.shape[1]
                cols = g[:, :, local // fan_in] * h[:, None, local % fan_in]
            else:  # Conv2d: w[co, patch] -> sum over positions of g_co * patch
                per_out = math.prod(slot.shape[1:])
                cols = torch.einsum("bonl,bnl->bon", g[:, :, local // per_out], h[:, local % per_out])
            J[:, :, positions] = cols
        return J

    def output_jacobian(self, layout: ParameterLayout, indices: torch.Tensor,
                        whole: list[ParameterSlot] | None) -> OutputJacobian:
        """The Jacobian with respect to the weights at flat ``indices`` as a linear map: factored where they are
        whole tensors of Linear layers applied once per row (``whole``, in the indices' order), else dense
        (:meth:`jacobian`).

        :param layout: the net's parameter layout.
        :param indices: the D flat indices.
        :param whole: the tensors the indices cover whole and in order, or None.
        :returns: the Jacobian.
        """
        if whole is not None and all(s.module_name in self.h and self.g[s.module_name].dim() == 3 for s in whole):
            ones = self.f.new_ones(len(self.f), 1)
            return FactoredJacobian([(self.g[s.module_name], ones if s.kind == "bias" else self.h[s.module_name])
                                     for s in whole])
        return DenseJacobian(self.jacobian(layout, indices))

    def diagonal_ggn(self, layout: ParameterLayout, root: torch.Tensor) -> torch.Tensor:
        """The diagonal of the GGN Σ_b J_bᵀ Λ_b J_b over all weights, Λ_b = R_bᵀ R_b.

        :param layout: the net's parameter layout.
        :param root: the output Hessians' roots ``R [B, P, O]``.
        :returns: the diagonal, flat ``[P]`` (0 where not selectable).
        """
        out = self.f.new_zeros(layout.size)
        for slot in layout.slots:
            if slot.module_name not in self.g:
                continue  # no factors taken: not selectable (a BatchNorm parameter) or not asked for
            g = self.g[slot.module_name]
            rg = torch.einsum("bpo,bo...->bp...", root, g)  # R g: [B, O, out(, positions)]
            if slot.module_name in self.calls:  # Σ_b Σ_p ((R J_b)_p)^2, per-example products with R g
                diag = sum(self.per_example(slot.module_name, rg,
                                            lambda grads, kind=slot.kind: grads[kind].square().sum((0, 1))))
                out[slot.offset:slot.offset + slot.numel] = diag.flatten()
                continue
            h = self.h[slot.module_name]
            if slot.kind == "bias":
                diag = (rg if g.dim() == 3 else rg.sum(-1)).square().sum((0, 1))
            elif g.dim() == 3:  # Σ_b Σ_p (R g)_{bpi}^2 h_{bj}^2: one matmul
                diag = rg.square().sum(1).T @ h.square()
            else:  # Σ_l (R g)_pcl h_nl by batched matmuls, squared and summed over rows and p
                diag = (rg.flatten(1, 2) @ h.transpose(1, 2)).square().sum(0).unflatten(0, rg.shape[1:3]).sum(0)
            out[slot.offset:slot.offset + slot.numel] = diag.flatten()
        return out

    def output_covariance(self, layout: ParameterLayout, variance: torch.Tensor) -> torch.Tensor:
        """The outputs' covariance J diag(variance) Jᵀ under independent weights, from the layer factors (no
        Jacobian is formed: a Linear weight w_ij contributes g_oi g_pi h_j² v_ij).

        :param layout: the net's parameter layout.
        :param variance: each weight's variance, flat ``[P]`` (0 for weights held fixed).
        :returns: ``[B, O, O]``.
        """
        out = self.f.new_zeros(*self.f.shape, self.f.shape[1])
        for slot in layout.slots:
            v = variance[slot.offset:slot.offset + slot.numel]
            if not bool(v.any()):
                continue
            g = self.g[slot.module_name]
            if slot.module_name in self.calls:  # per-example Jacobian rows, chunk by chunk
                J = torch.cat(self.per_example(slot.module_name, g,
                                               lambda grads, kind=slot.kind: grads[kind].flatten(2)))
                out += torch.einsum("bod,bpd,d->bop", J, J, v)
                continue
            h = self.h[slot.module_name]
            if slot.kind == "bias":
                cols = g if g.dim() == 3 else g.sum(-1)  # [B, O, out]
                out += torch.einsum("boi,bpi,i->bop", cols, cols, v)
            elif g.dim() == 3:  # Linear: Σ_i g_oi g_pi Σ_j v_ij h_j²
                out += torch.einsum("boi,bpi,bi->bop", g, g, h.square() @ v.view(slot.shape).T)
            else:  # Conv2d: the Jacobian of w[c, n] is Σ_l g[c, l] patch[n, l], by batched matmuls
                J = (g.flatten(1, 2) @ h.transpose(1, 2)).unflatten(1, g.shape[1:3])
                scaled = (J * v.view(g.shape[2], -1).sqrt()).flatten(2)
                out += scaled @ scaled.transpose(1, 2)
        return out

    def _factored_parts(self, slot: ParameterSlot) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A factored layer's ``g`` as ``[B, O, out, positions]`` and its input ``h`` as ``[B, in, positions]``
        (None for a bias): one layout for Linear layers (one position), Linear layers over tokens and Conv2d."""
        if slot.module_name in self.calls or slot.module_name not in self.h:
            raise ZooInputError("guide.covariance", "kron", f"KFAC factors Linear and Conv2d layers, and "
                                f"{slot.module_name!r} ({type(slot.module).__name__}) is neither: keep it at the MAP "
                                f"with model.exclude: [{slot.module_name}], or use guide.covariance: diag")
        g, h = self.g[slot.module_name], self.h[slot.module_name]
        if g.dim() == 3:
            g, h = g[..., None], h[..., None]
        return g, (None if slot.kind == "bias" else h)

    def kronecker_factors(self, slots: list[ParameterSlot],
                          root: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
        """KFAC's sums over these rows for each parameter tensor, the "expand" form for weights shared over
        positions (Martens & Grosse 2015; Grosse & Martens 2016; Eschenhagen et al. 2023): every (row, position)
        counts as one example, so the GGN block is approximated by G ⊗ A with

            G = Σ_{b,l} (R_b g_bl)ᵀ (R_b g_bl)    and    A = Σ_{b,l} h_bl h_blᵀ / (rows × positions),

        what curvlinops (and so laplace-torch) computes. A bias's A is the number 1. Summed here are G, Σ h hᵀ and
        the count; divide the second by the count over every row.

        :param slots: the parameter tensors, each a Linear or Conv2d layer's weight or bias.
        :param root: the output Hessians' roots ``R [B, P, O]``.
        :returns: per slot, the sums G ``[out, out]``, Σ h hᵀ ``[cols, cols]`` and the count.
        :raises ZooInputError: a slot of a layer without factors (an Embedding, a module of your own).
        """
        found, output_factors = [], {}
        for slot in slots:
            g, h = self._factored_parts(slot)
            if slot.module_name not in output_factors:  # a layer's weight and bias share G
                rg = torch.einsum("bpo,bocl->cbpl", root, g).flatten(1)  # [out, rows x P x positions]
                output_factors[slot.module_name] = rg @ rg.T  # one matmul: an einsum took 4-10x longer here
            rows_sum, count = output_factors[slot.module_name], g.shape[0] * g.shape[-1]
            if h is None:
                cols_sum = rows_sum.new_full((1, 1), count)
            else:
                flat = h.transpose(0, 1).flatten(1)  # [in, rows x positions]
                cols_sum = flat @ flat.T
            found.append((rows_sum, cols_sum, count))
        return found

    def kronecker_output_covariance(self, slots: list[ParameterSlot],
                                    blocks: list[KroneckerBlock]) -> torch.Tensor:
        """The outputs' covariance J Σ Jᵀ under a Kronecker-factored Gaussian over the given parameter tensors,
        from the layer factors in each block's eigenbases (a Linear weight's Jacobian row g hᵀ becomes
        (Q_Gᵀ g)(Q_Aᵀ h)ᵀ, whose entries the block's variances weight).

        :param slots: the parameter tensors, in the blocks' order.
        :param blocks: their Gaussians.
        :returns: ``[B, O, O]``.
        """
        out = self.f.new_zeros(*self.f.shape, self.f.shape[1])
        for slot, block in zip(slots, blocks, strict=True):
            g, h = self._factored_parts(slot)
            variance = block.scale.square()
            if h is None:  # a bias: its Jacobian row is g summed over positions
                g_rot = g.sum(-1) @ block.rows
                out += torch.einsum("boc,bpc,c->bop", g_rot, g_rot, variance[:, 0])
            elif g.shape[-1] == 1:  # one position: Σ_c (Q_Gᵀ g)_oc (Q_Gᵀ g)_pc Σ_n v_cn (Q_Aᵀ h)_n²
                g_rot, h_rot = g[..., 0] @ block.rows, h[..., 0] @ block.cols
                out += torch.einsum("boc,bpc,bc->bop", g_rot, g_rot, h_rot.square() @ variance.T)
            else:  # over positions: the Jacobian Σ_l g_cl h_nl by batched matmuls (positions summed first), then
                # rotated into the eigenbases: Q_Gᵀ J Q_A
                J = (g.flatten(1, 2) @ (h.transpose(1, 2) @ block.cols)).unflatten(1, g.shape[1:3])
                scaled = (block.rows.T @ J * block.scale).flatten(2)  # [B, O, C x N]
                out += scaled @ scaled.transpose(1, 2)
        return out


def _detached(value: Any) -> Any:
    """A layer call's arguments with their tensors detached (the per-example products differentiate the weights
    only)."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, tuple | list):
        return type(value)(_detached(v) for v in value)
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value


def ggn(J: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
    """The GGN Σ_b J_bᵀ Λ_b J_b of a subnetwork.

    :param J: Jacobians ``[B, O, D]``.
    :param root: the output Hessians' roots ``R [B, O, O]`` (Λ_b = R_bᵀ R_b).
    :returns: ``[D, D]``.
    """
    return symmetric_gram(torch.bmm(root, J).flatten(0, 1))


def symmetric_gram(a: torch.Tensor, blocks: int = 4) -> torch.Tensor:
    """aᵀa, computing only the blocks on and below the diagonal and mirroring the rest: ~30% less time than one
    matmul on one CPU thread for the sizes of a subnet's GGN (measured at 14,370 x 1,010 rows and columns; BLAS has a
    symmetric rank-k update, torch does not expose it).

    :param a: ``[M, D]``.
    :param blocks: column blocks (small D takes one matmul).
    :returns: ``[D, D]``.
    """
    size = a.shape[1]
    if size < 256 or blocks < 2:
        return a.T @ a
    edges = [round(size * k / blocks) for k in range(blocks + 1)]
    out = a.new_empty(size, size)
    for i in range(blocks):
        rows = slice(edges[i], edges[i + 1])
        for j in range(i + 1):
            cols = slice(edges[j], edges[j + 1])
            block = a[:, rows].T @ a[:, cols]
            out[rows, cols] = block
            if i != j:
                out[cols, rows] = block.T
    return out


class OutputJacobian(ABC):
    """The Jacobian J ``[B, O, D]`` of a net's outputs with respect to D weights at B inputs, as the linear map the
    linearised Laplace uses: products J v and Jᵀ u, the GGN Σ_b J_bᵀ Λ_b J_b, and the tensor itself where it must
    be formed. :class:`DenseJacobian` holds the tensor; :class:`FactoredJacobian` holds whole Linear layers' factors,
    whose products and GGN cost a fraction of the dense ones."""

    @abstractmethod
    def __matmul__(self, v: torch.Tensor) -> torch.Tensor:
        """J v.

        :param v: ``[D]`` or ``[D, K]``.
        :returns: ``[B, O]`` or ``[B, O, K]``.
        """

    @abstractmethod
    def vjp(self, u: torch.Tensor) -> torch.Tensor:
        """Σ_b J_bᵀ u_b.

        :param u: ``[B, O]``.
        :returns: ``[D]``.
        """

    @abstractmethod
    def ggn(self, root: torch.Tensor) -> torch.Tensor:
        """Σ_b J_bᵀ R_bᵀ R_b J_b.

        :param root: the output Hessians' roots ``R [B, K, O]``.
        :returns: ``[D, D]``.
        """

    @abstractmethod
    def dense(self) -> torch.Tensor:
        """J as a tensor.

        :returns: ``[B, O, D]``.
        """

    @abstractmethod
    def numel(self) -> int:
        """The numbers it holds.

        :returns: their count.
        """

    @abstractmethod
    def to(self, dtype: torch.dtype) -> OutputJacobian:
        """The same Jacobian in another dtype.

        :param dtype: the dtype.
        :returns: the Jacobian.
        """

    @classmethod
    @abstractmethod
    def concat(cls, parts: list[OutputJacobian]) -> OutputJacobian:
        """The Jacobian over the rows of ``parts`` in turn.

        :param parts: Jacobians of this class over the same weights.
        :returns: their rows, one after another.
        """


@dataclass(frozen=True)
class DenseJacobian(OutputJacobian):
    """J held as its tensor (any selection of weights).

    :param tensor: J ``[B, O, D]``.
    """

    tensor: torch.Tensor

    def __matmul__(self, v: torch.Tensor) -> torch.Tensor:
        return self.tensor @ v

    def vjp(self, u: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bod,bo->d", self.tensor, u)

    def ggn(self, root: torch.Tensor) -> torch.Tensor:
        return ggn(self.tensor, root)

    def dense(self) -> torch.Tensor:
        return self.tensor

    def numel(self) -> int:
        return self.tensor.numel()

    def to(self, dtype: torch.dtype) -> DenseJacobian:
        return DenseJacobian(self.tensor.to(dtype))

    @classmethod
    def concat(cls, parts: list[OutputJacobian]) -> DenseJacobian:
        return cls(torch.cat([part.dense() for part in parts]))


@dataclass(frozen=True)
class FactoredJacobian(OutputJacobian):
    """J of whole Linear weight and bias tensors held as their layers' factors: the column of weight W_ci is
    g[:, :, c] h[:, i], of bias b_c g[:, :, c] (an input of ones). Nothing ``[B, O, D]`` is formed: J v costs
    B (D + O·out) per tensor instead of B·O·D, and the GGN Σ_b M_b ⊗ h_b h_bᵀ (M_b = (R_b g_b)ᵀ R_b g_b) costs about
    1/K of the dense Σ_b (R_b J_b)ᵀ R_b J_b for K rows of the root (10x less for a 10-class last layer).

    :param parts: per tensor in the weights' order, ``g [B, O, out]`` and ``h [B, in]`` (ones ``[B, 1]`` for a bias).
    """

    parts: list[tuple[torch.Tensor, torch.Tensor]]

    def _blocks(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """``flat [D, ...]`` cut into the tensors' ``[out, in, ...]`` blocks."""
        sizes = [g.shape[2] * h.shape[1] for g, h in self.parts]
        return [block.reshape(g.shape[2], h.shape[1], *flat.shape[1:])
                for block, (g, h) in zip(flat.split(sizes), self.parts, strict=True)]

    def __matmul__(self, v: torch.Tensor) -> torch.Tensor:
        out = 0
        for (g, h), block in zip(self.parts, self._blocks(v.reshape(v.shape[0], -1)), strict=True):
            moved = (h @ block.transpose(0, 1).reshape(h.shape[1], -1)).view(h.shape[0], g.shape[2], -1)
            out = out + g @ moved  # Σ_c g_oc Σ_i h_i V_ci: [B, O, K]
        return out.reshape(*self.parts[0][0].shape[:2], *v.shape[1:])

    def vjp(self, u: torch.Tensor) -> torch.Tensor:
        return torch.cat([((u[:, :, None] * g).sum(1).T @ h).flatten() for g, h in self.parts])

    def ggn(self, root: torch.Tensor) -> torch.Tensor:
        projected = [root @ g for g, _ in self.parts]  # R g: [B, K, out]
        sizes = [g.shape[2] * h.shape[1] for g, h in self.parts]
        starts = [sum(sizes[:k]) for k in range(len(sizes))]
        out = root.new_zeros(sum(sizes), sum(sizes))
        for s, (rg_s, (_, h_s)) in enumerate(zip(projected, self.parts, strict=True)):
            rows_s = slice(starts[s], starts[s] + sizes[s])
            for t in range(s + 1):
                rows_t = slice(starts[t], starts[t] + sizes[t])
                block = _weighted_gram(rg_s.transpose(1, 2) @ projected[t], h_s, self.parts[t][1], symmetric=s == t)
                out[rows_s, rows_t] = block
                if s != t:
                    out[rows_t, rows_s] = block.T
        return out

    def dense(self) -> torch.Tensor:
        return torch.cat([(g[:, :, :, None] * h[:, None, None, :]).flatten(2) for g, h in self.parts], dim=2)

    def numel(self) -> int:
        return sum(g.numel() + h.numel() for g, h in self.parts)

    def to(self, dtype: torch.dtype) -> FactoredJacobian:
        return FactoredJacobian([(g.to(dtype), h.to(dtype)) for g, h in self.parts])

    @classmethod
    def concat(cls, parts: list[OutputJacobian]) -> FactoredJacobian:
        return cls([(torch.cat([p.parts[k][0] for p in parts]), torch.cat([p.parts[k][1] for p in parts]))
                    for k in range(len(parts[0].parts))])


def _weighted_gram(m: torch.Tensor, h_s: torch.Tensor, h_t: torch.Tensor, symmetric: bool) -> torch.Tensor:
    """Σ_b m_b ⊗ h_s,b h_t,bᵀ, the GGN block of two factored tensors: ``[out_s x in_s, out_t x in_t]`` from
    ``m [B, out_s, out_t]``, ``h_s [B, in_s]`` and ``h_t [B, in_t]``. One matmul per output row c; ``symmetric``
    (a tensor with itself: m_b symmetric, h_s = h_t) computes the blocks c' ≥ c only and mirrors the rest."""
    rows, out_t, in_s, in_t = m.shape[0], m.shape[2], h_s.shape[1], h_t.shape[1]
    out = m.new_zeros(m.shape[1], in_s, out_t, in_t)
    for c in range(m.shape[1]):
        low = c if symmetric else 0
        weighted = (m[:, c, low:, None] * h_t[:, None, :]).reshape(rows, -1)  # [B, (out_t - low) in_t]
        out[c, :, low:] = (h_s.T @ weighted).view(in_s, out_t - low, in_t)
    out = out.view(m.shape[1] * in_s, out_t * in_t)
    if symmetric:
        block_of = torch.arange(out.shape[0], device=out.device) // in_s
        out = torch.where(block_of[:, None] > block_of[None, :], out.T, out)
    return out
