"""What every model family shares: the description of a latent site and the family interface."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

import pyro
import torch
from torch import nn

from zoo.sites import LatentSite

if TYPE_CHECKING:
    from zoo.likelihoods import Likelihood, PredictiveDraws

T = TypeVar("T")


def per_device(cache: dict, ref: torch.Tensor, build: Callable[[torch.device, torch.dtype], T]) -> T:
    """``build(device, dtype)`` once per device and dtype of ``ref`` (e.g. a family's priors); then reused.

    Built without argument validation: a cached distribution is evaluated at every step, its parameters come
    from the validated spec, and a validating instance would re-check every sample against its support (a
    data-dependent branch that also keeps the SVI step from being traced and compiled).
    """
    key = (ref.device, ref.dtype)
    if key not in cache:
        with pyro.validation_enabled(False):
            cache[key] = build(*key)
    return cache[key]


class ModelFamily(Protocol):
    """The interface guides, inference methods and the Posterior rely on; families know nothing else of them."""

    likelihood: Likelihood

    def latent_sites(self) -> dict[str, LatentSite]:
        """Every latent sample site of :meth:`model`, with shape, support and an initial value."""

    def point_parameters(self) -> list[nn.Parameter]:
        """Parameters fitted as point estimates beside the guide (may be empty)."""

    def buffers(self) -> list[torch.Tensor]:
        """State the fit changes that is neither random nor fitted by gradient (BatchNorm running statistics),
        saved with every checkpoint and restored by :func:`restore_buffers`; may be empty."""

    def model(self, x: torch.Tensor, y: torch.Tensor | None = None, batch: torch.Tensor | None = None) -> None:
        """The Pyro model: observe ``y`` on rows ``batch`` of ``x``, scaled to all ``len(x)`` rows."""

    def predict(self, draws: dict[str, torch.Tensor], x: torch.Tensor) -> PredictiveDraws:
        """Per-draw predictive distributions at ``x`` under S joint draws ``{site: [S, ...]}``."""

    def log_likelihood(self, draws: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Pointwise log-density of the model's observation site at ``(x, y)`` under S draws: ``[S, B]``."""

    def to(self, device: torch.device | str, dtype: torch.dtype = torch.float32) -> ModelFamily:
        """Move the family's tensors to ``device``/``dtype``."""


def restore_buffers(family: ModelFamily, saved: list[torch.Tensor] | None) -> None:
    """Copy checkpointed :meth:`ModelFamily.buffers` back (a checkpoint from before buffers were saved has none)."""
    mine = family.buffers()
    if saved is None and not mine:
        return
    if saved is None or len(saved) != len(mine):
        raise ValueError(f"the checkpoint holds {0 if saved is None else len(saved)} buffers (BatchNorm statistics), "
                         f"the model {len(mine)}: it was written for another net")
    with torch.no_grad():
        for buffer, value in zip(mine, saved, strict=True):
            buffer.copy_(value)
