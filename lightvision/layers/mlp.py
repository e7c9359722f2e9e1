"""GLU feed-forward of the LightNet block (SPEC 1.4)."""

from __future__ import annotations

import torch
from torch import nn

from ..ops import silu_mul


class GLU(nn.Module):
    """GLU(x) = W_3 (SiLU(x W_1) * (x W_2)), no biases; x [..., dim] -> [..., dim] (the gated product is
    ``lightvision.ops.silu_mul``: one fused Triton kernel each way on CUDA)."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(dim, hidden_dim, bias=False)
        self.w3 = nn.Linear(hidden_dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w3(silu_mul(self.w1(x), self.w2(x)))
