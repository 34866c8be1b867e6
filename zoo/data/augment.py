"""Training-time image augmentation on minibatches of flat rows, on the rows' device: the CIFAR standard of a
random crop after zero padding and a random horizontal flip (He et al. 2016; the rank-1 and subnetwork papers).

Rows are standardised images flattened channel-major (C, H, W); padding with zeros pads with the training mean
pixel. Random numbers come from torch's generator, so a checkpoint's saved random state replays them exactly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from zoo.errors import ZooInputError


def crop_flip(rows: torch.Tensor, shape: tuple[int, int, int], padding: int = 4) -> torch.Tensor:
    """Each row's image shifted by a random offset in ``[-padding, padding]`` on both axes (what a random crop of the
    zero-padded image is) and mirrored left-right with probability 1/2; rows ``[B, C*H*W]`` in, same shape out."""
    c, h, w = shape
    images = rows.reshape(-1, c, h, w)
    b = images.shape[0]
    padded = F.pad(images, (padding, padding, padding, padding))
    top = torch.randint(0, 2 * padding + 1, (b, 1), device=rows.device)
    left = torch.randint(0, 2 * padding + 1, (b, 1), device=rows.device)
    flip = torch.rand(b, 1, device=rows.device) < 0.5
    ys = top + torch.arange(h, device=rows.device)  # [B, H]: the rows of the padded image each output row reads
    cols = torch.arange(w, device=rows.device)
    xs = left + torch.where(flip, cols.flip(0), cols)  # [B, W]: mirrored columns where flipped
    batch = torch.arange(b, device=rows.device)[:, None, None]
    out = padded[batch, :, ys[:, :, None], xs[:, None, :]]  # [B, H, W, C]
    return out.permute(0, 3, 1, 2).reshape(rows.shape)


def build_augmentation(name: str, shape: tuple[int, int, int] | None) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The row transform ``inference.augment`` names for images of ``shape`` (None: no augmentation)."""
    if name == "none":
        return None
    if shape is None:
        raise ZooInputError("inference.augment", name, "augments images: use an image net (net.name: cnn, lenet5, "
                            "resnet, wrn or torchvision), which says how its rows are images")
    return lambda rows: crop_flip(rows, shape)
