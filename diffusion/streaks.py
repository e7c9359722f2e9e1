"""Streak share: how much of an image's fine detail is a plaid of whole-row and whole-column stripes.

Per image and channel, the high-pass residual r = x - box3x3(x) (3 x 3 mean over the pixels inside the image) is
split as in a two-way analysis of variance, r_ij = m + a_i + b_j + e_ij (m the mean, a_i = row mean - m,
b_j = column mean - m). The streak share is the energy of the additive row + column part over the energy of r - m,

    share = (W sum_i a_i^2 + H sum_j b_j^2) / sum_ij (r_ij - m)^2,

summed over channels before the ratio. White noise scores about 0.05 at 32 x 32, natural CIFAR-10 test images 0.16
(mean of 1000); samples whose generator adds row and column components (a plaid) score higher.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def streak_share(images: torch.Tensor | np.ndarray) -> np.ndarray:
    """Per-image streak share (module docstring).

    Args:
        images: uint8 [N, H, W, C] (the layout of sample arrays and ADM batches) or float [N, C, H, W].

    Returns:
        float64 [N], each in [0, 1].

    Example:
        >>> streak_share(torch.rand(4, 3, 32, 32)).shape
        (4,)
    """
    x = torch.as_tensor(np.array(images) if isinstance(images, np.ndarray) else images)
    if x.dim() != 4:
        raise ValueError(
            f"streak_share needs a batch of images [N, H, W, C] (uint8) or [N, C, H, W], got {tuple(x.shape)}"
        )
    x = x.permute(0, 3, 1, 2).double() if x.dtype == torch.uint8 else x.double()
    if min(x.shape[-2:]) < 3:
        raise ValueError(f"streak_share needs images of at least 3 x 3 pixels, got {tuple(x.shape[-2:])}")
    r = x - F.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False)
    r = r - r.mean((-2, -1), keepdim=True)
    h, w = r.shape[-2:]
    explained = w * r.mean(-1).square().sum(-1) + h * r.mean(-2).square().sum(-1)  # [N, C]
    total = r.square().sum((-2, -1))
    return (explained.sum(1) / total.sum(1).clamp_min(1e-30)).numpy()


def folder_streak_share(files: list, limit: int | None = None) -> np.ndarray:
    """Streak shares of image files (RGB), the first ``limit`` of them."""
    from PIL import Image

    files = list(files)[:limit]
    return np.concatenate([streak_share(np.asarray(Image.open(f).convert("RGB"))[None]) for f in files])
