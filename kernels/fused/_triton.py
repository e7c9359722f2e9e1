"""Triton programs of the fused pointwise ops (math in ``op``). Tensors are contiguous: rows of C for the
norm, flat for SiLU x mul. Offsets are int64 so that tensors past 2^31 elements stay addressable."""

import triton
import triton.language as tl


@triton.jit
def _row_tile(tile, M, C, BM: tl.constexpr, BC: tl.constexpr):
    """Rows tile*BM ... tile*BM + BM - 1 of an [M, C] tensor: (row indices, their mask, element offsets, mask)."""
    rows = tile.to(tl.int64) * BM + tl.arange(0, BM)
    cols = tl.arange(0, BC)
    rmask = rows < M
    return rows, rmask, rows[:, None] * C + cols[None, :], rmask[:, None] & (cols < C)[None, :]


@triton.jit
def _rms_norm_fwd_kernel(X, W, G, Y, RSTD, M, C, eps, per, BM: tl.constexpr, BC: tl.constexpr, GATE: tl.constexpr):
    """Rows of tiles pid*per ... pid*per + per - 1 (BM rows each): y = x * rstd * w (* sigmoid(g)), rstd saved."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BC)
    cmask = cols < C
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    for t in range(per):
        rows, rmask, offs, mask = _row_tile(pid * per + t, M, C, BM, BC)
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / C + eps)
        y = x * rstd[:, None] * w[None, :]
        if GATE:
            y = y * tl.sigmoid(tl.load(G + offs, mask=mask, other=0.0).to(tl.float32))
        tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)
        tl.store(RSTD + rows, rstd, mask=rmask)


@triton.jit
def _rms_norm_bwd_kernel(DY, X, W, G, RSTD, DX, DG, DW, M, C, per,
                         BM: tl.constexpr, BC: tl.constexpr, GATE: tl.constexpr):
    """dx (and dg) for the program's rows; its partial sum of dw over them goes to row pid of DW [P, C]."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BC)
    cmask = cols < C
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    dw = tl.zeros([BC], dtype=tl.float32)
    for t in range(per):
        rows, rmask, offs, mask = _row_tile(pid * per + t, M, C, BM, BC)
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
        xhat = x * rstd[:, None]
        if GATE:
            s = tl.sigmoid(tl.load(G + offs, mask=mask, other=0.0).to(tl.float32))
            dg = dy * xhat * w[None, :] * s * (1.0 - s)
            tl.store(DG + offs, dg.to(DG.dtype.element_ty), mask=mask)
            dy = dy * s
        dw += tl.sum(dy * xhat, axis=0)
        dxhat = dy * w[None, :]
        corr = tl.sum(dxhat * xhat, axis=1) / C
        dx = (dxhat - xhat * corr[:, None]) * rstd[:, None]
        tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
    tl.store(DW + pid * C + cols, dw, mask=cmask)


@triton.jit
def _silu_mul_fwd_kernel(A, B, Y, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    a = tl.load(A + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + offs, (a * tl.sigmoid(a) * b).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul_bwd_kernel(DY, A, B, DA, DB, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(A + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(a)
    tl.store(DB + offs, (dy * a * s).to(DB.dtype.element_ty), mask=mask)
    tl.store(DA + offs, (dy * b * s * (1.0 + a * (1.0 - s))).to(DA.dtype.element_ty), mask=mask)
