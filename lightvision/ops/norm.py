"""Pointwise parts of the LightNet layer: RMSNorm with the sigmoid output gate (LightNet Eq. 9; docs/spec.md 1.4)
and the SiLU-gated product of the GLU channel mixer."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._checks import compute_dtype
from ._dispatch import dispatch


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    gate: torch.Tensor | None = None,
    *,
    eps: float = 1e-6,
    out_dtype: torch.dtype | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """y = x / sqrt(mean_c(x^2) + eps) * weight, times sigmoid(gate) when a gate is given.

    Statistics and products in fp32 (fp64 inputs stay fp64), rounded once at the end: an fp32 residual stream x
    with ``out_dtype=torch.bfloat16`` gives the bf16 input of the next matmul without a second cast.

    Args:
        x: [..., C].
        weight: [C].
        gate: None, or x's shape (the LightNet output gate's logits).
        eps: added to the mean square.
        out_dtype: dtype of y (default x's dtype).
        backend: "torch" | "auto" | "triton" (:mod:`lightvision.ops._dispatch`).

    Returns:
        y [..., C] in ``out_dtype``.

    Example:
        >>> rms_norm(torch.randn(2, 10, 32), torch.ones(32), torch.randn(2, 10, 32)).shape
        torch.Size([2, 10, 32])
    """
    if x.dim() == 0 or weight.shape != x.shape[-1:]:
        raise ValueError(
            f"rms_norm: weight must be [C] for x [..., C], got x {tuple(x.shape)}, weight {tuple(weight.shape)}"
        )
    if gate is not None and gate.shape != x.shape:
        raise ValueError(f"rms_norm: gate must have x's shape {tuple(x.shape)}, got {tuple(gate.shape)}")
    if not (x.device == weight.device and (gate is None or gate.device == x.device)):
        raise ValueError("rms_norm: x, weight and gate must be on one device")
    out_dtype = out_dtype or x.dtype
    out = dispatch("rms_norm", backend, x.device, (x, weight, gate), dict(eps=eps, out_dtype=out_dtype))
    if out is not NotImplemented:
        return out
    dt = compute_dtype(x, weight, *(() if gate is None else (gate,)))
    xf = x.to(dt)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.to(dt)
    if gate is not None:
        y = y * torch.sigmoid(gate.to(dt))
    return y.to(out_dtype)


def silu_mul(a: torch.Tensor, b: torch.Tensor | None = None, *, backend: str = "auto") -> torch.Tensor:
    """SiLU(a) * b, the gated product of GLU (docs/spec.md 1.4), computed in fp32, returned in a's dtype.

    In the packed form the kernel reads the two halves in place and its backward writes one [..., 2C] gradient,
    so there are no slice copies either way.

    Args:
        a: [..., C], or [..., 2C] holding [a | b] side by side when b is None (the output of GLU's one W_1 | W_2
            projection).
        b: [..., C] of a's shape, or None for the packed form.
        backend: "torch" | "auto" | "triton" (:mod:`lightvision.ops._dispatch`).

    Returns:
        [..., C] in a's dtype.

    Example:
        >>> silu_mul(torch.randn(4, 64)).shape
        torch.Size([4, 32])
    """
    if b is None:
        if a.dim() == 0 or a.shape[-1] % 2:
            raise ValueError(f"silu_mul: the packed input must be [..., 2C] (an even last dim), got {tuple(a.shape)}")
    elif a.shape != b.shape or a.device != b.device:
        raise ValueError(
            f"silu_mul: a and b must have one shape and device, got {tuple(a.shape)} on {a.device} "
            f"and {tuple(b.shape)} on {b.device}"
        )
    out = dispatch("silu_mul", backend, a.device, (a, b), {})
    if out is not NotImplemented:
        return out
    if b is None:
        a, b = a.chunk(2, dim=-1)
    dt = compute_dtype(a, b)
    return (F.silu(a.to(dt)) * b.to(dt)).to(a.dtype)
