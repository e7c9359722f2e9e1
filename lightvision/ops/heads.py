"""Head layouts between a fused qkv projection and the [B, H, N, d] attention cores (views, no copies)."""

from __future__ import annotations

import torch


def split_heads(qkv: torch.Tensor, num_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv [B, N, 3 * H * d] (the output of one fused Linear) -> strided views q, k, v [B, H, N, d]."""
    if qkv.dim() != 3 or qkv.shape[-1] % (3 * num_heads):
        raise ValueError(f"qkv must be [B, N, 3 * num_heads * d] with num_heads={num_heads}, got {tuple(qkv.shape)}")
    b, n, c3 = qkv.shape
    q, k, v = qkv.view(b, n, 3, num_heads, c3 // (3 * num_heads)).unbind(2)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def merge_heads(o: torch.Tensor) -> torch.Tensor:
    """[B, H, N, d] -> [B, N, H * d] (a copy unless o is a transposed view of a [B, N, H, d] tensor)."""
    b, h, n, d = o.shape
    return o.transpose(1, 2).reshape(b, n, h * d)
