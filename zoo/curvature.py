"""Curvature of a net's outputs for Laplace: Jacobians with respect to chosen weights, built layer by layer, and GGNs.

A weight w_ij of a Linear layer a = W h + b moves the outputs by ∂f/∂w_ij = (∂f/∂a_i) h_j. So the Jacobian of the
outputs with respect to any subset of a layer's weights is a product of two small factors: the layer's input h
and the outputs' Jacobian with respect to the layer's pre-activation a (one backward pass per output). Both
the subnetwork Jacobian and the full diagonal of the generalised Gauss-Newton matrix (GGN) are built from these
factors, so the cost grows with the subnet size and the layers' widths, never with a full Jacobian
``[B, outputs, all weights]``. Conv2d layers work the same way on unfolded input patches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from zoo.errors import ZooInputError
from zoo.nets import NORMALISATION_LAYERS, evaluation_mode

LAYERS = (nn.Linear, nn.Conv2d)  # whose weights can be selected (their Jacobians are built from layer factors)
FIXED_LAYERS = NORMALISATION_LAYERS  # parameters held at their MAP values, never selected


@dataclass(frozen=True)
class ParameterSlot:
    """One parameter tensor of the net: its name, module, kind (weight/bias) and place in the flat vector."""

    name: str
    module_name: str
    module: nn.Module
    kind: str
    shape: torch.Size
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def selectable(self) -> bool:
        """Whether a subnetwork may hold this parameter (BatchNorm's scale and shift stay at the MAP)."""
        return isinstance(self.module, LAYERS)


class ParameterLayout:
    """The net's parameters in ``parameters_to_vector`` order; flat indices name single weights."""

    def __init__(self, net: nn.Module) -> None:
        modules = dict(net.named_modules())
        self.slots: list[ParameterSlot] = []
        offset = 0
        for name, param in net.named_parameters():
            module_name, _, kind = name.rpartition(".")
            module = modules[module_name]
            if not isinstance(module, LAYERS + FIXED_LAYERS) or kind not in ("weight", "bias"):
                raise ZooInputError("net", type(module).__name__, f"subnetwork Laplace handles the weights and biases "
                                    f"of Linear and Conv2d layers (BatchNorm's stay at the MAP); {name} belongs to "
                                    f"a {type(module).__name__}")
            if isinstance(module, nn.Conv2d) and (module.groups != 1 or module.padding_mode != "zeros"):
                raise ZooInputError("net", name, "grouped or non-zero-padded convolutions are not supported")
            self.slots.append(ParameterSlot(name, module_name, module, kind, param.shape, offset))
            offset += param.numel()
        self.size = offset
        self.module_names = list(dict.fromkeys(s.module_name for s in self.slots if s.selectable))

    def selectable(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """A boolean mask ``[size]``: which flat weights a subnetwork may hold (Linear and Conv2d parameters)."""
        mask = torch.zeros(self.size, dtype=torch.bool, device=device)
        for slot in self.slots:
            mask[slot.offset:slot.offset + slot.numel] = slot.selectable
        return mask

    def slot_of(self, indices: torch.Tensor) -> torch.Tensor:
        """For each flat index, the position of its parameter in :attr:`slots`."""
        starts = torch.tensor([s.offset for s in self.slots], device=indices.device)
        return torch.searchsorted(starts, indices, right=True) - 1

    def split(self, indices: torch.Tensor) -> list[tuple[ParameterSlot, torch.Tensor, torch.Tensor]]:
        """``(slot, positions, local)`` per parameter touched by ``indices``: which entries of ``indices`` fall in
        it (``positions``) and their flat offsets inside the parameter (``local``)."""
        which = self.slot_of(indices)
        parts = []
        for k, slot in enumerate(self.slots):
            positions = (which == k).nonzero().squeeze(-1)
            if len(positions):
                parts.append((slot, positions, indices[positions] - slot.offset))
        return parts

    def names_of(self, indices: torch.Tensor) -> list[str]:
        """The parameter name of each flat index (e.g. ``hidden0.weight``)."""
        return [self.slots[k].name for k in self.slot_of(indices).tolist()]


def _patches(module: nn.Conv2d, h: torch.Tensor) -> torch.Tensor:
    """The input patches a Conv2d multiplies with its kernel: ``[B, C_in * kh * kw, positions]``."""
    return F.unfold(h, module.kernel_size, dilation=module.dilation, padding=module.padding, stride=module.stride)


class LayerFactors:
    """Outputs ``f [B, O]`` of the net at ``x`` and, per layer, its input ``h`` and ``g = ∂f/∂(pre-activation)``.

    ``g`` is ``[B, O, out]`` for Linear layers and ``[B, O, C_out, positions]`` for Conv2d; a Conv2d's ``h`` is
    its unfolded input patches. The net runs in eval mode (BatchNorm at its running statistics), so examples are
    independent and one backward pass of ``f[:, o].sum()`` gives every example's ``∂f_o/∂a``.
    """

    def __init__(self, net: nn.Module, layout: ParameterLayout, x: torch.Tensor) -> None:
        inputs: dict[str, torch.Tensor] = {}
        outputs: dict[str, torch.Tensor] = {}
        modules = {s.module_name: s.module for s in layout.slots if s.selectable}

        def recorder(name: str):
            def hook(module: nn.Module, args: tuple, out: torch.Tensor) -> None:
                inputs[name], outputs[name] = args[0].detach(), out
            return hook

        handles = [m.register_forward_hook(recorder(n)) for n, m in modules.items()]
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
        for name, per_output in zip(names, grads, strict=True):
            g = torch.stack(per_output, dim=1)
            if isinstance(modules[name], nn.Conv2d):
                g = g.flatten(3)
                self.h[name] = _patches(modules[name], inputs[name])
            else:
                self.h[name] = inputs[name]
            self.g[name] = g

    def jacobian(self, layout: ParameterLayout, indices: torch.Tensor) -> torch.Tensor:
        """``∂f/∂w [B, O, D]`` for the D weights at flat ``indices``, built from the layer factors only."""
        J = self.f.new_zeros(*self.f.shape, len(indices))
        for slot, positions, local in layout.split(indices):
            g, h = self.g[slot.module_name], self.h[slot.module_name]
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

    def diagonal_ggn(self, layout: ParameterLayout, root: torch.Tensor) -> torch.Tensor:
        """The diagonal of Σ_b J_bᵀ Λ_b J_b over all weights (flat, ``[P]``; 0 where not selectable), Λ_b = R_bᵀ R_b."""
        out = self.f.new_zeros(layout.size)
        for slot in layout.slots:
            if not slot.selectable:
                continue  # no Jacobian factors: a BatchNorm parameter is never selected
            g, h = self.g[slot.module_name], self.h[slot.module_name]
            rg = torch.einsum("bpo,bo...->bp...", root, g)  # R g: [B, O, out(, positions)]
            if slot.kind == "bias":
                diag = (rg if g.dim() == 3 else rg.sum(-1)).square().sum((0, 1))
            elif g.dim() == 3:  # Σ_b Σ_p (R g)_{bpi}^2 h_{bj}^2: one matmul
                diag = rg.square().sum(1).T @ h.square()
            else:
                diag = torch.einsum("bpcl,bnl->bpcn", rg, h).square().sum((0, 1)).flatten()
            out[slot.offset:slot.offset + slot.numel] = diag.flatten()
        return out


def ggn(J: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
    """Σ_b J_bᵀ Λ_b J_b ``[D, D]`` for Jacobians ``J [B, O, D]`` and Hessian roots ``R [B, O, O]``."""
    rj = torch.bmm(root, J).flatten(0, 1)
    return rj.T @ rj
