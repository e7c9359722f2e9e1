"""RMSNorm (the Norm of the LightNet layer, docs/spec.md 1.4) and the modulated LayerNorm of adaLN (DiT)."""

from __future__ import annotations

import torch
from torch import nn

from ..ops import modulated_layer_norm, rms_norm


def matmul_input_dtype(x: torch.Tensor) -> torch.dtype | None:
    """Inside autocast, its dtype on x's device (a norm's output feeds a matmul that would cast to it anyway);
    None (keep x's dtype) outside."""
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2 over the last dim) + eps) * weight (* sigmoid(gate)); x [..., dim].

    Statistics in fp32; returns x's dtype, or the autocast dtype inside autocast (the next layer is a matmul
    that would cast to it anyway). The fused Triton kernel (``lightvision.ops.rms_norm``) on CUDA.

    Args:
        dim: the normalised (last) dim.
        eps: added to the mean square.

    Example:
        >>> RMSNorm(32)(torch.randn(2, 10, 32)).shape
        torch.Size([2, 10, 32])
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., dim], gate None or x's shape (the output gate's logits) -> [..., dim]."""
        return rms_norm(x, self.weight, gate, eps=self.eps, out_dtype=matmul_input_dtype(x))

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class ModulatedLayerNorm(nn.Module):
    """adaLN (DiT): LayerNorm without affine weights, then the per-sample modulation
    y = LN(x) (1 + scale) + shift; x [B, N, dim], shift / scale [B, dim] -> [B, N, dim]. No parameters (the
    vectors come from the conditioning). Returns x's dtype, or the autocast dtype inside autocast; one fused
    Triton kernel each way on CUDA (``lightvision.ops.modulated_layer_norm``).

    Args:
        eps: added to the variance.

    Example:
        >>> ModulatedLayerNorm()(torch.randn(2, 10, 32), torch.zeros(2, 32), torch.zeros(2, 32)).shape
        torch.Size([2, 10, 32])
    """

    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """x [B, N, dim], shift / scale [B, dim] -> [B, N, dim]."""
        return modulated_layer_norm(x, shift, scale, eps=self.eps, out_dtype=matmul_input_dtype(x))

    def extra_repr(self) -> str:
        return f"eps={self.eps}"
