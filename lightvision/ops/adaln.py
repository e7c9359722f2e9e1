"""Pointwise parts of the DiT block's adaLN-Zero conditioning (Peebles & Xie, Sec. 3.2), with per-sample
shift / scale / gate vectors: the modulated LayerNorm and the gated residual."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._checks import compute_dtype
from ._dispatch import dispatch


def _check_per_sample(x: torch.Tensor, vectors: dict[str, torch.Tensor], op: str) -> None:
    """x [B, N, C] and each vector [B, C] on x's device."""
    if x.dim() != 3:
        raise ValueError(f"{op}: x must be [B, N, C], got shape {tuple(x.shape)}")
    b, _, c = x.shape
    for name, t in vectors.items():
        if t.shape != (b, c):
            raise ValueError(f"{op}: {name} must be [B, C] = {(b, c)} (one vector per sample), got {tuple(t.shape)}")
        if t.device != x.device:
            raise ValueError(f"{op}: {name} is on {t.device}, x on {x.device}")


def modulated_layer_norm(
    x: torch.Tensor,
    shift: torch.Tensor,
    scale: torch.Tensor,
    *,
    eps: float = 1e-6,
    out_dtype: torch.dtype | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """y[b, n] = (x[b, n] - mu) / sqrt(sigma^2 + eps) * (1 + scale[b]) + shift[b]  (LayerNorm without affine
    weights, mean and biased variance over C, then adaLN's per-sample modulation).

    Statistics and products in fp32 (fp64 inputs stay fp64), rounded once: inside autocast pass the autocast
    dtype, the input of the next matmul.

    Args:
        x: [B, N, C].
        shift, scale: [B, C], one vector per sample.
        eps: added to the variance.
        out_dtype: dtype of y (default x's dtype).
        backend: "torch" | "auto" | "triton" (:mod:`lightvision.ops._dispatch`).

    Returns:
        y [B, N, C] in ``out_dtype``.

    Example:
        >>> modulated_layer_norm(torch.randn(2, 16, 8), torch.zeros(2, 8), torch.zeros(2, 8)).shape
        torch.Size([2, 16, 8])
    """
    _check_per_sample(x, {"shift": shift, "scale": scale}, "modulated_layer_norm")
    out_dtype = out_dtype or x.dtype
    out = dispatch("modulated_layer_norm", backend, x.device, (x, shift, scale), dict(eps=eps, out_dtype=out_dtype))
    if out is not NotImplemented:
        return out
    dt = compute_dtype(x, shift, scale)
    y = F.layer_norm(x.to(dt), x.shape[-1:], eps=eps) * (1 + scale.to(dt)[:, None]) + shift.to(dt)[:, None]
    return y.to(out_dtype)


def gated_residual(x: torch.Tensor, gate: torch.Tensor, y: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """x + gate[b] * y, computed in fp32.

    Args:
        x: [B, N, C] residual stream.
        gate: [B, C], one vector per sample.
        y: [B, N, C] branch output.
        backend: "torch" | "auto" | "triton" (:mod:`lightvision.ops._dispatch`).

    Returns:
        [B, N, C] in the dtype PyTorch's promotion gives the three (what ``x + gate[:, None] * y`` returns, under
        autocast too).

    Example:
        >>> x = torch.randn(2, 16, 8)
        >>> torch.equal(gated_residual(x, torch.zeros(2, 8), torch.randn(2, 16, 8)), x)
        True
    """
    _check_per_sample(x, {"gate": gate}, "gated_residual")
    if y.shape != x.shape or y.device != x.device:
        raise ValueError(
            f"gated_residual: y must be x's shape {tuple(x.shape)} on {x.device}, got {tuple(y.shape)} on {y.device}"
        )
    out = dispatch("gated_residual", backend, x.device, (x, gate, y), {})
    if out is not NotImplemented:
        return out
    out_dtype = torch.promote_types(x.dtype, torch.promote_types(gate.dtype, y.dtype))
    dt = compute_dtype(x, gate, y)
    return (x.to(dt) + gate.to(dt)[:, None] * y.to(dt)).to(out_dtype)
