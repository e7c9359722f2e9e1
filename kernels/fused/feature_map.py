"""Fused LION feature map phi (LION Sec. 4; docs/spec.md 1.5): launchers, Triton programs, torch custom ops and
autograd.

Per row x [d] of q or k (fp32 inside):

    "silu_norm" (LION-D / S):  u = SiLU(x) + 0.5,  y = u / max(|u|, 1e-12)     (L2 over the head dim)
                               du = (dy - y (y . dy)) / |u|,  dx = du sigma(x) (1 + x (1 - sigma(x)))
    "elu" (LIT):               y = elu(x) + 1 = x + 1 (x > 0), exp(x) (x <= 0);  dx = dy (x > 0), dy exp(x)

Every element of u is at least 0.5 - 0.279 (the minimum of SiLU), so |u| >= 0.22 sqrt(d) and the 1e-12 clamp of
``F.normalize`` never binds on real rows; the programs keep it so that the masked rows past the end stay finite.
Traffic: the forward reads x and writes y, the backward reads x and dy and writes dx; nothing is saved but x.
``feature_map_bwd_inplace`` turns dy into dx in place in a tensor laid out as x (the packed LION core's dqkv).
The PyTorch form (fp32 casts, SiLU, add, norm, clamp, divide, cast back, and their gradients) takes about ten
passes each way in fp32. Inputs are read through the strides of a [B, H, N, d] view (the q / k slices of a fused
qkv projection, unit feature stride); outputs are contiguous [B, H, N, d].
Custom ops ``lightvision::lion_feature_map_fwd`` / ``_bwd`` carry fake implementations and autograd
(torch.compile without graph breaks); eager calls use a ``torch.autograd.Function`` over the same launchers.
"""

from __future__ import annotations

import torch
import triton

from .._autograd import autograd_ops
from .._launch import empty
from . import _triton as K
from .op import DTYPES, row_tile

MAX_D = 256  # widest head the programs hold in registers; wider heads run the reference


def _as_heads(x: torch.Tensor) -> torch.Tensor:
    """x as a [B, H, N, d] view with unit feature stride (a copy only when no such view exists)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.dim() == 4:
        return x
    return x.reshape(1, 1, -1, x.shape[-1])


def _run(kernel, x: torch.Tensor, kind: str, **tensors_and_meta) -> None:
    """Launch a feature-map program over the rows of x (as a [B, H, N, d] view) with the given tensors and
    compile-time parameters (keywords of the program)."""
    x4 = _as_heads(x)
    b, h, n, d = x4.shape
    tile = row_tile(d, max_rows=64)  # heads are short rows: 64 of them per program at d = 64 (the timed tile)
    kernel[(triton.cdiv(b * h * n, tile["BM"]),)](
        X=x4, R=b * h * n, H=h, N=n, D=d, s_b=x4.stride(0), s_h=x4.stride(1), s_n=x4.stride(2), **tensors_and_meta,
        BM=tile["BM"], BD=tile["BC"], SILU_NORM=kind == "silu_norm", num_warps=tile["warps"],
    )  # fmt: skip


def feature_map_fwd_launch(x: torch.Tensor, kind: str) -> torch.Tensor:
    """y = phi(x), contiguous, shaped like x, in x's dtype."""
    y = empty(x.shape, x.dtype, x.device)
    _run(K._feature_map_fwd_kernel, x, kind, Y=y)
    return y


def feature_map_bwd_launch(dy: torch.Tensor, x: torch.Tensor, kind: str) -> torch.Tensor:
    """dx (contiguous, shaped like x, x's dtype) from dy = dL/dphi(x)."""
    dx = empty(x.shape, x.dtype, x.device)
    _run(K._feature_map_bwd_kernel, x, kind, DY=dy.contiguous(), DX=dx, GRAD_STRIDED=False)
    return dx


def feature_map_bwd_inplace(x: torch.Tensor, grad: torch.Tensor, kind: str) -> None:
    """grad <- dL/dx from grad = dL/dphi(x), in place; x, grad: [B, H, N, d] views with the same strides (unit
    feature stride), e.g. the q / k slices of a qkv projection and of its gradient."""
    if x.dim() != 4 or x.stride() != grad.stride() or x.shape != grad.shape or x.stride(-1) != 1:
        raise ValueError(
            f"feature_map_bwd_inplace: x and grad must be [B, H, N, d] views with the same strides, got "
            f"{tuple(x.shape)} / {x.stride()} and {tuple(grad.shape)} / {grad.stride()}"
        )
    _run(K._feature_map_bwd_kernel, x, kind, DY=grad, DX=grad, GRAD_STRIDED=True)


def _fwd(x: torch.Tensor, kind: str) -> torch.Tensor:
    """phi(x); see the module docstring."""
    return feature_map_fwd_launch(x, kind)


def _bwd(dy: torch.Tensor, x: torch.Tensor, kind: str) -> torch.Tensor:
    """dL/dx of phi(x)."""
    return feature_map_bwd_launch(dy, x, kind)


def _fwd_fake(x, kind):
    return x.new_empty(x.shape)


def _bwd_fake(dy, x, kind):
    return x.new_empty(x.shape)


def _saved(inputs, output):
    x, kind = inputs
    return (x,), (kind,)


# custom ops lightvision::lion_feature_map_fwd / _bwd (torch.compile), the eager Function over the same launchers,
# and feature_map(x, kind): phi(x) [..., d] -> [..., d] with its gradient through either; x must be covered
# (:func:`covered`); the kernels call it directly (the LION scan path)
lion_feature_map_fwd, lion_feature_map_bwd, _, feature_map = autograd_ops(
    "lion_feature_map", _fwd, _fwd_fake, _bwd, _bwd_fake, _saved
)


def covered(x: torch.Tensor) -> bool:
    """Whether the programs take x: not empty, at least 2-D, heads up to MAX_D, fp32 / bf16 / fp16."""
    return x.numel() > 0 and x.dim() >= 2 and x.shape[-1] <= MAX_D and x.dtype in DTYPES


def lion_feature_map_triton(x: torch.Tensor, *, kind: str):
    """Kernel entry of ``lightvision.ops.lion_feature_map``; NotImplemented (the reference runs) for inputs the
    programs do not cover (:func:`covered`)."""
    return feature_map(x, kind) if covered(x) else NotImplemented
