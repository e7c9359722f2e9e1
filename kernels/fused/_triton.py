"""Triton programs of the fused pointwise ops (math in ``op``, ``adaln`` and ``feature_map``). Tensors are
contiguous: rows of C for the norms, rows of C or the two halves of rows of 2C for SiLU x mul; the LION feature
map reads [B, H, N, d] views through their strides. Offsets are int64 so that tensors past 2^31 elements stay
addressable."""

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
def _rms_norm_bwd_kernel(
    DY, X, W, G, RSTD, DX, DG, DW, M, C, per, BM: tl.constexpr, BC: tl.constexpr, GATE: tl.constexpr
):
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
def _silu_mul_offsets(C, s_in, BLOCK: tl.constexpr):
    """Elements pid*BLOCK ... of the [rows, C] output: (flat output offsets, input offsets with row stride s_in)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    return offs, (offs // C) * s_in + offs % C


@triton.jit
def _silu_mul_fwd_kernel(A, B, Y, numel, C, s_in, BLOCK: tl.constexpr):
    """y = SiLU(a) * b; a and b rows s_in apart (C apart, or 2C for the halves of one packed tensor)."""
    offs, offs_in = _silu_mul_offsets(C, s_in, BLOCK)
    mask = offs < numel
    a = tl.load(A + offs_in, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs_in, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + offs, (a * tl.sigmoid(a) * b).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul_bwd_kernel(DY, A, B, DA, DB, numel, C, s_in, BLOCK: tl.constexpr):
    """da, db laid out as a, b (rows s_in apart)."""
    offs, offs_in = _silu_mul_offsets(C, s_in, BLOCK)
    mask = offs < numel
    dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(A + offs_in, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs_in, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(a)
    tl.store(DB + offs_in, (dy * a * s).to(DB.dtype.element_ty), mask=mask)
    tl.store(DA + offs_in, (dy * b * s * (1.0 + a * (1.0 - s))).to(DA.dtype.element_ty), mask=mask)


# ---- adaLN (DiT): [B*N, C] rows, per-sample vectors [B, C] with row stride ``sv``; program (b, p) owns the row
# tiles p*per ... p*per + per - 1 of sample b, so its vectors load once and its sums over tokens stay [C] ----


@triton.jit
def _sample_tile(b, tile, N, C, BM: tl.constexpr, BC: tl.constexpr):
    """Tokens tile*BM ... tile*BM + BM - 1 of sample b: (row indices into [B*N], row mask, element offsets, mask)."""
    n = tile * BM + tl.arange(0, BM)
    rmask = n < N
    rows = b.to(tl.int64) * N + n
    cols = tl.arange(0, BC)
    return rows, rmask, rows[:, None] * C + cols[None, :], rmask[:, None] & (cols < C)[None, :]


@triton.jit
def _sample_vector(V, b, sv, C, BC: tl.constexpr):
    cols = tl.arange(0, BC)
    return tl.load(V + b.to(tl.int64) * sv + cols, mask=cols < C, other=0.0).to(tl.float32)


@triton.jit
def _adaln_fwd_kernel(
    X, SHIFT, SCALE, Y, MEAN, RSTD, N, C, sv_shift, sv_scale, eps, per, BM: tl.constexpr, BC: tl.constexpr
):
    """y = (x - mean) * rstd * (1 + scale[b]) + shift[b]; mean and rstd saved per row."""
    b, p = tl.program_id(0), tl.program_id(1)
    shift = _sample_vector(SHIFT, b, sv_shift, C, BC)
    scale1 = 1.0 + _sample_vector(SCALE, b, sv_scale, C, BC)
    for t in range(per):
        rows, rmask, offs, mask = _sample_tile(b, p * per + t, N, C, BM, BC)
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=1) / C
        xc = tl.where(mask, x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / C + eps)
        y = xc * rstd[:, None] * scale1[None, :] + shift[None, :]
        tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)
        tl.store(MEAN + rows, mean, mask=rmask)
        tl.store(RSTD + rows, rstd, mask=rmask)


@triton.jit
def _adaln_bwd_kernel(
    DY, X, SCALE, MEAN, RSTD, DX, DSHIFT, DSCALE, N, C, sv_scale, per, BM: tl.constexpr, BC: tl.constexpr
):
    """dx for the program's rows; its sums over them of dy (dshift) and dy * x^ (dscale) go to row (b, p) of the
    [B, P, C] partials."""
    b, p = tl.program_id(0), tl.program_id(1)
    cols = tl.arange(0, BC)
    scale1 = 1.0 + _sample_vector(SCALE, b, sv_scale, C, BC)
    dshift = tl.zeros([BC], dtype=tl.float32)
    dscale = tl.zeros([BC], dtype=tl.float32)
    for t in range(per):
        rows, rmask, offs, mask = _sample_tile(b, p * per + t, N, C, BM, BC)
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(MEAN + rows, mask=rmask, other=0.0)
        rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        dshift += tl.sum(dy, axis=0)
        dscale += tl.sum(dy * xhat, axis=0)
        g = dy * scale1[None, :]
        g_mean = tl.sum(g, axis=1) / C
        gx_mean = tl.sum(g * xhat, axis=1) / C
        dx = (g - g_mean[:, None] - xhat * gx_mean[:, None]) * rstd[:, None]
        tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
    part = (b * tl.num_programs(1) + p).to(tl.int64) * C + cols
    tl.store(DSHIFT + part, dshift, mask=cols < C)
    tl.store(DSCALE + part, dscale, mask=cols < C)


@triton.jit
def _gated_residual_fwd_kernel(X, GATE, Y, OUT, N, C, sv_gate, per, BM: tl.constexpr, BC: tl.constexpr):
    """out = x + gate[b] * y."""
    b, p = tl.program_id(0), tl.program_id(1)
    gate = _sample_vector(GATE, b, sv_gate, C, BC)
    for t in range(per):
        _, _, offs, mask = _sample_tile(b, p * per + t, N, C, BM, BC)
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(Y + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(OUT + offs, (x + gate[None, :] * y).to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _gated_residual_bwd_kernel(DOUT, GATE, Y, DY, DGATE, N, C, sv_gate, per, BM: tl.constexpr, BC: tl.constexpr):
    """dy = dout * gate[b]; the sum over the program's rows of dout * y (dgate) goes to row (b, p) of [B, P, C]."""
    b, p = tl.program_id(0), tl.program_id(1)
    cols = tl.arange(0, BC)
    gate = _sample_vector(GATE, b, sv_gate, C, BC)
    dgate = tl.zeros([BC], dtype=tl.float32)
    for t in range(per):
        _, _, offs, mask = _sample_tile(b, p * per + t, N, C, BM, BC)
        dout = tl.load(DOUT + offs, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(Y + offs, mask=mask, other=0.0).to(tl.float32)
        dgate += tl.sum(dout * y, axis=0)
        tl.store(DY + offs, (dout * gate[None, :]).to(DY.dtype.element_ty), mask=mask)
    tl.store(DGATE + (b * tl.num_programs(1) + p).to(tl.int64) * C + cols, dgate, mask=cols < C)


@triton.jit
def _head_rows_tile(pid, R, H, N, D, s_b, s_h, s_n, BM: tl.constexpr, BD: tl.constexpr):
    """Rows pid*BM ... of the [B, H, N] row space: (input offsets through the strides, contiguous offsets, mask)."""
    rows = pid.to(tl.int64) * BM + tl.arange(0, BM)
    cols = tl.arange(0, BD)
    b = rows // (H * N)
    h = (rows // N) % H
    n = rows % N
    strided = (b * s_b + h * s_h + n * s_n)[:, None] + cols[None, :]
    mask = (rows < R)[:, None] & (cols < D)[None, :]
    return strided, rows[:, None] * D + cols[None, :], mask


@triton.jit
def _feature_map_fwd_kernel(
    X, Y, R, H, N, D, s_b, s_h, s_n, BM: tl.constexpr, BD: tl.constexpr, SILU_NORM: tl.constexpr
):
    strided, dense, mask = _head_rows_tile(tl.program_id(0), R, H, N, D, s_b, s_h, s_n, BM, BD)
    x = tl.load(X + strided, mask=mask, other=0.0).to(tl.float32)
    if SILU_NORM:
        u = tl.where(mask, x * tl.sigmoid(x) + 0.5, 0.0)
        y = u / tl.maximum(tl.sqrt(tl.sum(u * u, axis=1)), 1e-12)[:, None]
    else:
        y = tl.where(x > 0, x + 1.0, tl.exp(x))
    tl.store(Y + dense, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _feature_map_bwd_kernel(
    X, DY, DX, R, H, N, D,
    s_b, s_h, s_n,
    BM: tl.constexpr, BD: tl.constexpr, SILU_NORM: tl.constexpr, GRAD_STRIDED: tl.constexpr,
):  # fmt: skip
    """dx from x and dy; DY, DX contiguous, or with GRAD_STRIDED laid out as X (the same strides: DX may be DY)."""
    strided, dense, mask = _head_rows_tile(tl.program_id(0), R, H, N, D, s_b, s_h, s_n, BM, BD)
    if GRAD_STRIDED:
        dense = strided
    x = tl.load(X + strided, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + dense, mask=mask, other=0.0).to(tl.float32)
    if SILU_NORM:
        s = tl.sigmoid(x)
        u = tl.where(mask, x * s + 0.5, 0.0)
        inv = 1.0 / tl.maximum(tl.sqrt(tl.sum(u * u, axis=1)), 1e-12)
        y = u * inv[:, None]
        du = (dy - y * tl.sum(y * dy, axis=1)[:, None]) * inv[:, None]
        dx = du * s * (1.0 + x * (1.0 - s))
    else:
        dx = tl.where(x > 0, dy, dy * tl.exp(x))
    tl.store(DX + dense, dx.to(DX.dtype.element_ty), mask=mask)
