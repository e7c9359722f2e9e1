"""Softmax attention (SDPA), the DeiT / DiT baseline."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._checks import check_qkv


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v with q, k [B, H, N, d], v [B, H, N, d_v] -> [B, H, N, d_v]; scale defaults to d^-1/2.

    Runs torch's scaled_dot_product_attention (flash / memory-efficient kernels where available).
    """
    check_qkv(q, k, v, "softmax_attention")
    return F.scaled_dot_product_attention(q, k, v, scale=scale)
