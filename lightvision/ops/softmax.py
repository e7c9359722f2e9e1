"""Softmax attention (SDPA), the DeiT / DiT baseline."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._checks import check_qkv


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v through torch's ``scaled_dot_product_attention`` (its fastest available backend).

    Args:
        q, k: [B, H, N, d]; v: [B, H, N, d_v].
        scale: the logit scale; None for d^-1/2.

    Returns:
        [B, H, N, d_v] in q's dtype.

    Example:
        >>> q, k, v = (torch.randn(2, 3, 10, 16) for _ in range(3))
        >>> softmax_attention(q, k, v).shape
        torch.Size([2, 3, 10, 16])
    """
    check_qkv(q, k, v, "softmax_attention")
    return F.scaled_dot_product_attention(q, k, v, scale=scale)
