"""MD-TPE on a 2-D token grid (LightNet Eq. 10-11; docs/spec.md 1.3) in Triton: programs, launchers, custom ops,
autograd.

With the per-channel Toeplitz matrices T^0 [C, h, h] and T^1 [C, w, w] (``lightvision.ops.md_tpe.toeplitz_kernel``),
a grid x [B, h, w, C] (the tokens after ``num_prefix_tokens`` prefix tokens, row-major) maps to

    y[b, a, j, c]  = sum_i T^0[c, a, i] x[b, i, j, c] + sum_j' T^1[c, j, j'] x[b, a, j', c]
    dx             = the same with T^0, T^1 transposed
    dT^0[c, a, i]  = sum_{b, j} dy[b, a, j, c] x[b, i, j, c]
    dT^1[c, j, j'] = sum_{b, a} dy[b, a, j, c] x[b, a, j', c]

and the prefix rows of y (and dx) are 0. One program holds a whole grid for a block of channels in registers
([h, w, BC], fp32) and reads x in place in its [B, N, C] layout: no transposes. The PyTorch dense form runs the two
axes as channel-batched matmuls on a channel-first copy of x, whose copies, casts and small products cost a training
step of compiled LightNet-DeiT-S more than this one pass (docs/kernels_lightnet.md, "Launch rules and their
measurements").
Grids whose longer axis is at most MAX_AXIS (images up to 512 px at patch 16); larger ones run the reference.
The dT programs sum a slice of the batch each into fp32 partials [programs, L, L, C], summed by torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lightvision.ops.md_tpe import toeplitz_kernel

from .._autograd import autograd_ops
from .._launch import empty, num_sms
from .op import DTYPES

MAX_AXIS = 32  # longest grid axis the programs hold: [32, 32, 8] fp32 accumulators


@triton.jit
def _tpe2d_apply_kernel(
    X, T0, T1, Y, P, h, w, C, sxb, sxn, syb, syn, s0a, s0i, s1a, s1i,
    HP: tl.constexpr, WP: tl.constexpr, BC: tl.constexpr,
):  # fmt: skip
    """Y[b, P + a w + j, c] = sum_i T0[a, i, c] X[b, P + i w + j, c] + sum_j' T1[j, j', c] X[b, P + a w + j', c];
    Y[b, :P] = 0. T0 / T1 are read through the strides (s?a, s?i) of their two position axes (unit channel
    stride), so passing swapped strides applies the transposes (the backward's dx)."""
    pid_c = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    cc = pid_c * BC + tl.arange(0, BC)
    cm = cc < C
    ah = tl.arange(0, HP)
    aw = tl.arange(0, WP)
    hm = ah < h
    wm = aw < w
    xb = X + b * sxb + P * sxn
    acc = tl.zeros((HP, WP, BC), dtype=tl.float32)
    for i in range(h):  # axis 0: row i of the grid, spread over every output row a
        xi = tl.load(xb + (i * w + aw)[:, None] * sxn + cc[None, :], mask=wm[:, None] & cm[None, :], other=0.0)
        t = tl.load(T0 + ah[:, None] * s0a + i * s0i + cc[None, :], mask=hm[:, None] & cm[None, :], other=0.0)
        acc += t[:, None, :] * xi.to(tl.float32)[None, :, :]
    for j in range(w):  # axis 1: column j of the grid, spread over every output column
        xj = tl.load(xb + (ah * w + j)[:, None] * sxn + cc[None, :], mask=hm[:, None] & cm[None, :], other=0.0)
        t = tl.load(T1 + aw[:, None] * s1a + j * s1i + cc[None, :], mask=wm[:, None] & cm[None, :], other=0.0)
        acc += xj.to(tl.float32)[:, None, :] * t[None, :, :]
    yb = Y + b * syb
    for p in range(P):
        tl.store(yb + p * syn + cc, tl.zeros((BC,), dtype=tl.float32).to(Y.dtype.element_ty), mask=cm)
    rows = P + ah[:, None] * w + aw[None, :]
    tl.store(
        yb + rows[:, :, None] * syn + cc[None, None, :],
        acc.to(Y.dtype.element_ty),
        mask=(hm[:, None] & wm[None, :])[:, :, None] & cm[None, None, :],
    )


@triton.jit
def _tpe2d_grad_t_kernel(X, DY, DT, B, BPB, P, L, M, sl, sm, C, sxb, sxn, syb, syn, LP: tl.constexpr, BC: tl.constexpr):
    """Partial dT[pid_b, a, i, c] = sum over batches [pid_b * BPB, +BPB) and m < M of DY[b, tok(a, m), c] X[b, tok(i,
    m), c]
    with tok(l, m) = P + l sl + m sm: the axis of length L has token stride sl, the other axis (length M) sm."""
    pid_c = tl.program_id(0)
    pid_b = tl.program_id(1)
    cc = pid_c * BC + tl.arange(0, BC)
    cm = cc < C
    al = tl.arange(0, LP)
    lm = al < L
    acc = tl.zeros((LP, LP, BC), dtype=tl.float32)
    for bi in range(BPB):
        b = (pid_b * BPB + bi).to(tl.int64)
        msk = (lm & (b < B))[:, None] & cm[None, :]
        for m in range(M):
            tok = (P + al * sl + m * sm)[:, None]
            g = tl.load(DY + b * syb + tok * syn + cc[None, :], mask=msk, other=0.0).to(tl.float32)
            xv = tl.load(X + b * sxb + tok * sxn + cc[None, :], mask=msk, other=0.0).to(tl.float32)
            acc += g[:, None, :] * xv[None, :, :]
    out = DT + pid_b.to(tl.int64) * L * L * C + al[:, None, None] * (L * C) + al[None, :, None] * C + cc[None, None, :]
    tl.store(out, acc, mask=(lm[:, None] & lm[None, :])[:, :, None] & cm[None, None, :])


def _channel_block(cells: int, c: int) -> int:
    """Channels per program so that a [cells, BC] fp32 accumulator is about 8k elements."""
    return max(1, min(triton.next_power_of_2(c), 8192 // cells))


def _unit_channel_stride(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _apply(x: torch.Tensor, t0: torch.Tensor, t1: torch.Tensor, prefix: int, transpose: bool) -> torch.Tensor:
    """y [B, N, C] in x's dtype from x [B, N, C], t0 [C, h, h], t1 [C, w, w] (transposed when ``transpose``)."""
    x = _unit_channel_stride(x)
    b, n, c = x.shape
    h, w = t0.shape[-1], t1.shape[-1]
    t0c, t1c = (t.permute(1, 2, 0).contiguous().float() for t in (t0, t1))  # [L, L, C]: channels contiguous
    s0 = (t0c.stride(1), t0c.stride(0)) if transpose else t0c.stride()[:2]
    s1 = (t1c.stride(1), t1c.stride(0)) if transpose else t1c.stride()[:2]
    hp, wp = triton.next_power_of_2(h), triton.next_power_of_2(w)
    bc = _channel_block(hp * wp, c)
    y = empty((b, n, c), x.dtype, x.device)
    _tpe2d_apply_kernel[(triton.cdiv(c, bc), b)](
        X=x, T0=t0c, T1=t1c, Y=y, P=prefix, h=h, w=w, C=c,
        sxb=x.stride(0), sxn=x.stride(1), syb=y.stride(0), syn=y.stride(1), s0a=s0[0], s0i=s0[1], s1a=s1[0], s1i=s1[1],
        HP=hp, WP=wp, BC=bc, num_warps=4,
    )  # fmt: skip
    return y


def _grad_t(x: torch.Tensor, dy: torch.Tensor, prefix: int, h: int, w: int, axis: int) -> torch.Tensor:
    """dT of one axis, [C, L, L] fp32 (L = h for axis 0, w for axis 1)."""
    b, _, c = x.shape
    length, other = (h, w) if axis == 0 else (w, h)
    sl, sm = (w, 1) if axis == 0 else (1, w)
    lp = triton.next_power_of_2(length)
    bc = _channel_block(lp * lp, c)
    c_blocks = triton.cdiv(c, bc)
    splits = max(1, min(b, triton.cdiv(4 * num_sms(x.device), c_blocks)))
    per = triton.cdiv(b, splits)
    splits = triton.cdiv(b, per)
    part = empty((splits, length, length, c), torch.float32, x.device)
    _tpe2d_grad_t_kernel[(c_blocks, splits)](
        X=x, DY=dy, DT=part, B=b, BPB=per, P=prefix, L=length, M=other, sl=sl, sm=sm, C=c,
        sxb=x.stride(0), sxn=x.stride(1), syb=dy.stride(0), syn=dy.stride(1),
        LP=lp, BC=bc, num_warps=4,
    )  # fmt: skip
    return part.sum(0).permute(2, 0, 1).contiguous()


def _fwd(x: torch.Tensor, t0: torch.Tensor, t1: torch.Tensor, prefix: int) -> torch.Tensor:
    """y [B, N, C] (x's dtype, prefix rows 0) of x [B, N, C] on the (h, w) grid after ``prefix`` tokens."""
    return _apply(x, t0, t1, prefix, transpose=False)


def _fwd_fake(x, t0, t1, prefix):
    return x.new_empty(x.shape)


def _bwd(
    dy: torch.Tensor, x: torch.Tensor, t0: torch.Tensor, t1: torch.Tensor, prefix: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx [B, N, C] in x's dtype, dT^0 [C, h, h], dT^1 [C, w, w] in T's dtype)."""
    dy = _unit_channel_stride(dy)
    x = _unit_channel_stride(x)
    h, w = t0.shape[-1], t1.shape[-1]
    dx = _apply(dy, t0, t1, prefix, transpose=True).to(x.dtype)
    return dx, _grad_t(x, dy, prefix, h, w, 0).to(t0.dtype), _grad_t(x, dy, prefix, h, w, 1).to(t1.dtype)


def _bwd_fake(dy, x, t0, t1, prefix):
    return x.new_empty(x.shape), t0.new_empty(t0.shape), t1.new_empty(t1.shape)


def _saved(inputs, output):
    x, t0, t1, prefix = inputs
    return (x, t0, t1), (prefix,)


# custom ops lightvision::md_tpe2d_fwd / _bwd (torch.compile) and the eager Function over the same launchers
md_tpe2d_fwd, md_tpe2d_bwd, _, _md_tpe2d = autograd_ops("md_tpe2d", _fwd, _fwd_fake, _bwd, _bwd_fake, _saved)


def md_tpe_triton(
    x: torch.Tensor,
    coeffs: torch.Tensor,
    log_lambda: torch.Tensor,
    *,
    grid,
    num_prefix_tokens: int,
    causal: bool,
    impl: str,
    combine: str,
):
    """Kernel entry of ``lightvision.ops.md_tpe``: the dense sum on 2-D grids up to MAX_AXIS per axis, fp32 / bf16 /
    fp16; NotImplemented (the reference runs) otherwise."""
    if (
        impl != "dense"
        or combine != "sum"
        or len(grid) != 2
        or max(grid) > MAX_AXIS
        or x.dtype not in DTYPES
        or coeffs.dtype == torch.float64
        or x.numel() == 0
    ):
        return NotImplemented
    with torch.autocast(x.device.type, enabled=False):  # the einsum of the tables stays fp32
        t0, t1 = (
            toeplitz_kernel(coeffs[j].float(), log_lambda[j].float(), length, causal) for j, length in enumerate(grid)
        )
    return _md_tpe2d(x, t0, t1, num_prefix_tokens)
