"""RMSNorm (the Norm of the LightNet layer, SPEC 1.4)."""

from __future__ import annotations

import torch
from torch import nn

from ..ops import rms_norm


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2 over the last dim) + eps) * weight (* sigmoid(gate)); x [..., dim].

    Statistics in fp32; returns x's dtype, or the autocast dtype inside autocast (the next layer is a matmul
    that would cast to it anyway). The fused Triton kernel (``lightvision.ops.rms_norm``) on CUDA."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        kind = x.device.type
        out_dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None
        return rms_norm(x, self.weight, gate, eps=self.eps, out_dtype=out_dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
