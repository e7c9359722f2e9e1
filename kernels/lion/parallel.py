"""LION masked attention, FlashAttention-style (parallel form, O(N) memory): forward and backward kernels.

Per (batch, head), with q, k: [N, d] (positive feature maps), v: [N, d_v], per-token log-gates g: [N]:

    M_ij = exp(sum_{m=j}^{i-1} g_m)   (i > j),   exp(sum_{m=i+1}^{j} g_m)   (i < j),   1   (i = j)
    A    = (q k^T) * M,     num = A v,     den = A 1,     Y = num / (den + 1e-6)

LION-S passes g = log a (prefix / cls gates 0); LION-D passes log lambda per head, [H], read as g_m at every
m through a zero token stride (_gate_ptr; then M_ij = lambda^|i-j|); LIT runs with HAS_MASK=False (M = 1).

Tiles of T query rows meet tiles of T key rows; the mask is built on the fly from the gates of the two tiles
and one running scalar: each program walks the key tiles outward from its own diagonal tile, so the log-mask
of a tile is  near(row) + seg + far(col)  where near/far are in-tile partial sums and seg is the sum of the
whole tiles in between, accumulated outward (a sum of non-positive numbers: no cancellation; the trap of
global cumsum differences, docs/spec.md 2, does not arise). Because log-gates are <= 0, once seg < -110 every later tile
has exp(log M) == 0 exactly in fp32, so those tiles are skipped (exact; a large speed-up for strong decay);
how many tiles each side has before that is counted from prefix sums of the tile totals, from SKIP_MIN_TILES
tiles on (shorter sequences visit every tile).
The in-tile cumsums, tile totals and prefix sums come from one small launch per forward (gate_table), which the
backward reuses: the kernels load them rather than summing the gates of every tile they meet (tl.cumsum and its
layout changes on every tile are slower). The forward walks both sides in one loop and scales each tile by both
halves of its rank-one mask (no side accumulators: fewer registers, faster); the backward kernels keep two walks.
Timings: docs/kernels_lion.md, "Launch rules and their measurements".

Backward (Z = den + 1e-6, upstream dY, or dnum / dden directly when normalize=False):
    dnum_i = dY_i / Z_i,   dden_i = -(dY_i . Y_i) / Z_i,   dA_ij = dnum_i . v_j + dden_i
    dq = (dA * M) k,   dk = (dA * M)^T q,   dv = A^T dnum
Gate gradient: with W_ij = dA_ij * A_ij (= dL/d log M_ij), log M_ij is a sum of g over a segment, so
dg_m = sum of W over the pairs whose segment contains m:
    lower (i > j, m in [j, i-1]):  dg_m^L = sum_{i > m >= j} W_ij = cumsum(cL)_m - cumsum(rL)_m
    upper (i < j, m in [i+1, j]):  dg_m^U = sum_{i < m <= j} W_ij = excl_cumsum(rU)_m - excl_cumsum(cU)_m
where rL_i / rU_i are the row sums of W strictly below / above the diagonal and cL_j / cU_j the column sums.
The dq kernel produces rL, rU, the dk/dv kernel cL, cU; _gate_grad_kernel (fp64 running sums) finishes dg.
The sums come from the fp32 tiles (the dq kernel forms q k^T for them, a third matmul per tile), not from
q_i . dq_i(side) and k_j . dk_j(side): dq and dk are sums of the bf16-rounded dP, and the gate gradient
(differences of prefix sums) amplifies that rounding to bf16 errors of 1-1.5e-2 at N >= 1024 (2-3e-3 with the
fp32 tiles; tests/kernels/test_lion_kernel.py checks it).
LION-D's gate is one log lambda per head (log M_ij = |i - j| log lambda), so dlog lambda = sum_ij W_ij |i - j|: the
dk/dv kernel alone sums each key's W column weighted by the distance, and the dq kernel skips W (no q k^T there).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._launch import empty, strides

EPS = tl.constexpr(1e-6)
TILE = 64  # query / key rows per tile (read at call time, so tests can shrink it)
# The kernels pipeline 3 key / query tiles from this N on, 2 below it (3 stages are slower for short sequences and
# faster for long ones, both ways: docs/kernels_lion.md, "Launch rules and their measurements").
STAGES_3_MIN_N = 512
# Below this segment sum of whole tiles, exp(log M) underflows to exactly 0 in fp32 (exp(-104) < 2^-149).
SKIP_LOG = tl.constexpr(-110.0)
# From this many tiles on, the kernels count the tiles they can skip (the gate table's prefix sums, _span); below
# it they visit every tile (exact too: a skipped tile's mask is 0). Short sequences gain little from skipping and
# pay the count's dependent loads.
SKIP_MIN_TILES = 5


@triton.jit
def _load_rows(ptr, rows, n, cols, ncols, stride_n):
    """Load rows[:, None] x cols[None, :] of a row-major [n, ncols] slab (zeros outside)."""
    return tl.load(
        ptr + rows[:, None] * stride_n + cols[None, :], mask=(rows[:, None] < n) & (cols[None, :] < ncols), other=0.0
    )


@triton.jit
def _gate_ptr(G, bh, h, N, sg):
    """The gates of (b, h): per-token gates [B*H, N] (sg = 1), or one per head [H] (sg = 0: LION-D, read at every
    token through the zero token stride sg, so no [B, H, N] copy is made)."""
    return G + sg * bh * N + (1 - sg) * h


@triton.jit
def _gate_tile(g_ptr, rows, n, sg):
    """Gates of one tile: (inclusive local cumsum, exclusive local cumsum, tile total), fp32, zeros past n;
    sg: token stride (_gate_ptr)."""
    g = tl.load(g_ptr + rows * sg, mask=rows < n, other=0.0)
    inc = tl.cumsum(g, 0)
    return inc, inc - g, tl.sum(g, 0)


@triton.jit
def _tile_gates(tab, tile, NP, ar, T: tl.constexpr):
    """Gates of one tile from its (b, h)'s gate table (gate_table): (inclusive local cumsum, exclusive local
    cumsum, tile total), fp32 (zeros past n: the cumsums stay at the total there)."""
    p = tab + tile * T + ar
    return tl.load(p), tl.load(p + NP), tl.load(tab + 2 * NP + tile)


@triton.jit
def _tile_log_mask(inc, exc, ar):
    """Log of the LION mask within one tile from its local gate cumsums (docs/spec.md 1.5): exc_i - exc_j below the
    diagonal (sum of log a over j..i-1), inc_j - inc_i above it (sum over i+1..j), 0 on the diagonal."""
    return tl.where(
        ar[:, None] > ar[None, :],
        exc[:, None] - exc[None, :],
        tl.where(ar[:, None] < ar[None, :], inc[None, :] - inc[:, None], 0.0),
    )


@triton.jit
def _log_sigmoid(z):
    """logsigmoid(z) = min(z, 0) - log1p(exp(-|z|)) in fp32; log1p(u) as log(w) u / (w - 1), w = 1 + u (exact
    where w rounds to 1), so gates near 1 keep their relative precision."""
    u = tl.exp(-tl.abs(z))
    w = 1.0 + u
    exact = w == 1.0
    return tl.minimum(z, 0.0) - tl.where(exact, u, tl.log(w) * (u / tl.where(exact, 1.0, w - 1.0)))


@triton.jit
def _gate_table_kernel(
    G, sgb, sgh, sgn, TAB, N, H, NT, W, PREFIX, LOGITS: tl.constexpr, T: tl.constexpr, TILES: tl.constexpr
):
    """One (b, h)'s row of TAB [B*H, W]: the inclusive and exclusive in-tile cumsums of the gates (two sections of
    NT * T, zero gates past N), the tile totals (NT) and CS, the negated prefix sums of the totals (NT + 1: CS_u =
    -(sum of tiles 0 .. u-1), fp64 running sum stored fp32, non-decreasing as gates are <= 0). The gate of token n
    is read at G + b sgb + h sgh + n sgn (gate_source); with LOGITS it is logsigmoid of that value in fp32, and 0
    for the first PREFIX tokens."""
    bh = tl.program_id(0)
    r = tl.arange(0, TILES)
    col = tl.arange(0, T)
    NP = NT * T
    tab = TAB + bh * W
    gb = G + (bh // H) * sgb + (bh % H) * sgh
    carry = tl.zeros([1], dtype=tl.float64)
    tl.store(tab + 2 * NP + NT + r, tl.zeros([TILES], dtype=tl.float32), mask=r == 0)
    for t0 in range(0, NT, TILES):
        tok = (t0 + r)[:, None] * T + col[None, :]
        g = tl.load(gb + tok * sgn, mask=tok < N, other=0.0).to(tl.float32)
        if LOGITS:
            g = tl.where((tok >= PREFIX) & (tok < N), _log_sigmoid(g), 0.0)
        inc = tl.cumsum(g, 1)
        ok = (t0 + r)[:, None] < NT
        tl.store(tab + tok, inc, mask=ok)
        tl.store(tab + NP + tok, inc - g, mask=ok)
        tot = tl.sum(g, 1)
        tl.store(tab + 2 * NP + t0 + r, tot, mask=t0 + r < NT)
        tot = tot.to(tl.float64)
        tl.store(tab + 2 * NP + NT + 1 + t0 + r, (-(carry + tl.cumsum(tot, 0))).to(tl.float32), mask=t0 + r < NT)
        carry += tl.sum(tot, 0)


@triton.jit
def _span(CS, tile, side: tl.constexpr, n_tiles, SKIP: tl.constexpr):
    """Off-diagonal tiles to visit from `tile` on `side` (0: left, 1: right), or every tile on that side without
    SKIP (no mask, or fewer than SKIP_MIN_TILES tiles). A tile is visited while the whole tiles strictly in
    between sum to more than SKIP_LOG: with c = CS (the gate table's prefix sums of one (b, h)) that is
    c_{t+1} > c_tile + SKIP_LOG on the left, c_t < c_{tile+1} - SKIP_LOG on the right, so the count is a vector
    comparison over the side's tiles (an fp32 difference of prefix sums decides only; SKIP_LOG keeps 6 units of
    margin over the fp32 underflow)."""
    if SKIP:
        if side == 0:
            lo = 1
            hi = tile + 1
            ref = tl.load(CS + tile) + SKIP_LOG
        else:
            lo = tile + 1
            hi = n_tiles
            ref = tl.load(CS + tile + 1) - SKIP_LOG
        count = 0
        for u0 in range(lo, hi, 128):
            u = u0 + tl.arange(0, 128)
            c = tl.load(CS + u, mask=u < hi, other=0.0)
            hit = (c > ref) if side == 0 else (c < ref)
            count += tl.sum((hit & (u < hi)).to(tl.int32), 0)
        return count
    else:
        return tile if side == 0 else n_tiles - 1 - tile


@triton.jit
def _row_grad_tile(do, out_ptr, den_ptr, rows, n, fv, dv, son):
    """1 / Z and dL/d den = -(dY . Y) / Z of Y = num / Z, Z = den + 1e-6, for one tile of rows; do: the tile's
    fp32 dY; out_ptr, den_ptr: Y and den of its (b, h)."""
    y = _load_rows(out_ptr, rows, n, fv, dv, son).to(tl.float32)
    zinv = 1.0 / (tl.load(den_ptr + rows, mask=rows < n, other=0.0) + EPS)
    return zinv, -tl.sum(do * y, 1) * zinv


@triton.jit
def _gate_row(TAB, stab, bh, N, T: tl.constexpr):
    """(this (b, h)'s gate table row, the offset NP of its exclusive cumsums, the pointer to its prefix sums CS);
    stab: the table's row stride (table_width)."""
    nt = tl.cdiv(N, T)
    NP = nt * T
    tab = TAB + bh * stab
    return tab, NP, tab + 2 * NP + nt


@triton.jit
def _walk(tile, step, n_lo):
    """The off-diagonal tile of one step of a program's walk: first n_lo tiles leftward from `tile`, then rightward;
    (the tile, whether it is on the left). The log-mask's segment sum restarts when the walk turns."""
    lo = step < n_lo
    return tl.where(lo, tile - 1 - step, tile + 1 + step - n_lo), lo


@triton.jit
def _fwd_kernel(
    Q, K, V, TAB, stab, NUM, DEN, N, D, DV, sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son, H,
    HAS_MASK: tl.constexpr, SKIP: tl.constexpr, NORMALIZE: tl.constexpr, PREC: tl.constexpr, T: tl.constexpr,
    BD: tl.constexpr, BDV: tl.constexpr,
):  # fmt: skip
    """One program = one query tile of one (b, h): num/den (or Y) for T rows."""
    it = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    q_ptr = Q + b * sqb + h * sqh
    k_ptr = K + b * skb + h * skh
    v_ptr = V + b * svb + h * svh
    tab, NP, cs = _gate_row(TAB, stab, bh, N, T)
    rows = it * T + tl.arange(0, T)
    fd = tl.arange(0, BD)
    fv = tl.arange(0, BDV)
    ar = tl.arange(0, T)
    q = _load_rows(q_ptr, rows, N, fd, D, sqn)
    # diagonal tile: both triangles, invalid side zeroed before exp
    k = _load_rows(k_ptr, rows, N, fd, D, skn)
    v = _load_rows(v_ptr, rows, N, fv, DV, svn)
    s = tl.dot(q, tl.trans(k), input_precision=PREC)
    if HAS_MASK:
        q_inc, q_exc, q_tot = _tile_gates(tab, it, NP, ar, T)
        s = s * tl.exp(_tile_log_mask(q_inc, q_exc, ar))
        row_lo = tl.exp(q_exc)
        row_hi = tl.exp(q_tot - q_inc)
    den = tl.sum(s, 1)
    acc = tl.dot(s.to(v.dtype), v, input_precision=PREC)
    # off-diagonal tiles, one walk outward on each side (_walk): the mask is rank one there,
    # exp(row part) * exp(seg + column part), with seg the sum of the whole tiles in between
    n_tiles = tl.cdiv(N, T)
    n_lo = _span(cs, it, 0, n_tiles, SKIP)
    seg = 0.0
    for step in range(0, n_lo + _span(cs, it, 1, n_tiles, SKIP)):
        jt, lo = _walk(it, step, n_lo)
        cols = jt * T + ar
        k = _load_rows(k_ptr, cols, N, fd, D, skn)
        v = _load_rows(v_ptr, cols, N, fv, DV, svn)
        s = tl.dot(q, tl.trans(k), input_precision=PREC)
        if HAS_MASK:
            seg = tl.where(step == n_lo, 0.0, seg)
            k_inc, k_exc, k_tot = _tile_gates(tab, jt, NP, ar, T)
            col = tl.exp(seg + tl.where(lo, k_tot - k_exc, k_inc))
            s = s * (tl.where(lo, row_lo, row_hi)[:, None] * col[None, :])
            seg += k_tot
        den += tl.sum(s, 1)
        acc += tl.dot(s.to(v.dtype), v, input_precision=PREC)
    out_ptr = NUM + b * sob + h * soh + rows[:, None] * son + fv[None, :]
    out_mask = (rows[:, None] < N) & (fv[None, :] < DV)
    if NORMALIZE:
        acc = acc / (den + EPS)[:, None]
    tl.store(out_ptr, acc.to(NUM.dtype.element_ty), mask=out_mask)
    tl.store(DEN + bh * N + rows, den, mask=rows < N)


@triton.jit
def _bwd_dq_kernel(
    Q, K, V, TAB, stab, DO, OUT, DEN, ZINV, DELTA, DQ, RL, RU, N, D, DV, sqb, sqh, sqn, skb, skh, skn, svb, svh, svn,
    sdb, sdh, sdn, sob, soh, son, sgb, sgh, sgn, H,
    HAS_MASK: tl.constexpr, SKIP: tl.constexpr, PER_HEAD: tl.constexpr, ROW_GRADS: tl.constexpr, PREC: tl.constexpr,
    T: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
):  # fmt: skip
    """One program = one query tile: dq = (dA * M) k and the row sums rL / rU of W = dA * A (per-token gates
    only: PER_HEAD gates take their gradient from the dk/dv kernel alone). ROW_GRADS: the tile's 1 / Z and
    dL/d den come from Y (OUT) and DEN here and are stored in ZINV / DELTA for the dk/dv kernel (_row_grad_kernel's
    work); else they are read from there. DO, OUT and DQ go through their strides."""
    it = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    q_ptr = Q + b * sqb + h * sqh
    k_ptr = K + b * skb + h * skh
    v_ptr = V + b * svb + h * svh
    tab, NP, cs = _gate_row(TAB, stab, bh, N, T)
    rows = it * T + tl.arange(0, T)
    fd = tl.arange(0, BD)
    fv = tl.arange(0, BDV)
    ar = tl.arange(0, T)
    q = _load_rows(q_ptr, rows, N, fd, D, sqn)
    do = _load_rows(DO + b * sdb + h * sdh, rows, N, fv, DV, sdn).to(tl.float32)
    if ROW_GRADS:
        zinv, delta = _row_grad_tile(do, OUT + b * sob + h * soh, DEN + bh * N, rows, N, fv, DV, son)
        tl.store(ZINV + bh * N + rows, zinv, mask=rows < N)
        tl.store(DELTA + bh * N + rows, delta, mask=rows < N)
    else:
        zinv = tl.load(ZINV + bh * N + rows, mask=rows < N, other=0.0)
        delta = tl.load(DELTA + bh * N + rows, mask=rows < N, other=0.0)
    do = (do * zinv[:, None]).to(q.dtype)
    dq = tl.zeros([T, BD], dtype=tl.float32)
    r_lo = tl.zeros([T], dtype=tl.float32)
    r_up = tl.zeros([T], dtype=tl.float32)
    if HAS_MASK:
        q_inc, q_exc, q_tot = _tile_gates(tab, it, NP, ar, T)
    k = _load_rows(k_ptr, rows, N, fd, D, skn)
    v = _load_rows(v_ptr, rows, N, fv, DV, svn)
    s = tl.dot(q, tl.trans(k), input_precision=PREC)
    da = tl.dot(do, tl.trans(v), input_precision=PREC) + delta[:, None]
    if HAS_MASK:
        lm = _tile_log_mask(q_inc, q_exc, ar)
        m = tl.exp(lm)
        dp = da * m
        if not PER_HEAD:
            w = dp * s
            r_lo += tl.sum(tl.where(ar[:, None] > ar[None, :], w, 0.0), 1)
            r_up += tl.sum(tl.where(ar[:, None] < ar[None, :], w, 0.0), 1)
    else:
        dp = da
    dq += tl.dot(dp.to(k.dtype), k, input_precision=PREC)
    n_tiles = tl.cdiv(N, T)
    # the forward's walk as two loops, left (lower triangle) then right (upper), with side accumulators scaled by
    # the row half of the mask once per side: with this kernel's W row sums, one loop that scales every tile by
    # both halves was slower for S gates (benchmarks/results/lion_bwd_walks_h100_20261123.json)
    for side in tl.static_range(2):
        n_side = _span(cs, it, side, n_tiles, SKIP)
        dq_s = tl.zeros([T, BD], dtype=tl.float32)
        r_s = tl.zeros([T], dtype=tl.float32)
        seg = 0.0
        for step in range(0, n_side):
            jt = it - 1 - step if side == 0 else it + 1 + step
            cols = jt * T + ar
            k = _load_rows(k_ptr, cols, N, fd, D, skn)
            v = _load_rows(v_ptr, cols, N, fv, DV, svn)
            dp = tl.dot(do, tl.trans(v), input_precision=PREC) + delta[:, None]
            if HAS_MASK:
                k_inc, k_exc, k_tot = _tile_gates(tab, jt, NP, ar, T)
                dp = dp * tl.exp(seg + (k_tot - k_exc if side == 0 else k_inc))[None, :]
                seg += k_tot
                if not PER_HEAD:
                    r_s += tl.sum(dp * tl.dot(q, tl.trans(k), input_precision=PREC), 1)
            dq_s += tl.dot(dp.to(k.dtype), k, input_precision=PREC)
        if HAS_MASK:  # the side's W row sums, from the fp32 tiles (see the module docstring)
            row = tl.exp(q_exc if side == 0 else q_tot - q_inc)
            dq_s = dq_s * row[:, None]
            if not PER_HEAD:
                if side == 0:
                    r_lo += r_s * row
                else:
                    r_up += r_s * row
        dq += dq_s
    tl.store(
        DQ + b * sgb + h * sgh + rows[:, None] * sgn + fd[None, :],
        dq.to(DQ.dtype.element_ty),
        mask=(rows[:, None] < N) & (fd[None, :] < D),
    )
    if HAS_MASK and not PER_HEAD:
        tl.store(RL + bh * N + rows, r_lo, mask=rows < N)
        tl.store(RU + bh * N + rows, r_up, mask=rows < N)


@triton.jit
def _bwd_dkdv_kernel(
    Q, K, V, TAB, stab, DO, ZINV, DELTA, DK, DV_OUT, CL, CU, N, D, DV, sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb,
    sdh, sdn, skgb, skgh, skgn, svgb, svgh, svgn, H,
    HAS_MASK: tl.constexpr, SKIP: tl.constexpr, PER_HEAD: tl.constexpr, PREC: tl.constexpr, T: tl.constexpr,
    BD: tl.constexpr, BDV: tl.constexpr,
):  # fmt: skip
    """One program = one key tile: dk = (dA * M)^T q, dv = A^T dnum and the column sums cL / cU of W, or with
    PER_HEAD gates the distance-weighted sums sum_i W_ij |i - j| in CL. Works on transposed tiles [keys, queries].
    DO, DK, DV_OUT go through their strides."""
    jt = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    q_ptr = Q + b * sqb + h * sqh
    k_ptr = K + b * skb + h * skh
    v_ptr = V + b * svb + h * svh
    tab, NP, cs = _gate_row(TAB, stab, bh, N, T)
    do_ptr = DO + b * sdb + h * sdh
    cols = jt * T + tl.arange(0, T)
    fd = tl.arange(0, BD)
    fv = tl.arange(0, BDV)
    ar = tl.arange(0, T)
    k = _load_rows(k_ptr, cols, N, fd, D, skn)
    v = _load_rows(v_ptr, cols, N, fv, DV, svn)
    dk = tl.zeros([T, BD], dtype=tl.float32)
    dv = tl.zeros([T, BDV], dtype=tl.float32)
    c_lo = tl.zeros([T], dtype=tl.float32)
    c_up = tl.zeros([T], dtype=tl.float32)
    if HAS_MASK:
        k_inc, k_exc, k_tot = _tile_gates(tab, jt, NP, ar, T)
    # diagonal tile; transposed index: row a = key, column c = query
    q = _load_rows(q_ptr, cols, N, fd, D, sqn)
    zinv = tl.load(ZINV + bh * N + cols, mask=cols < N, other=0.0)
    delta = tl.load(DELTA + bh * N + cols, mask=cols < N, other=0.0)
    do = (_load_rows(do_ptr, cols, N, fv, DV, sdn).to(tl.float32) * zinv[:, None]).to(k.dtype)
    st = tl.dot(k, tl.trans(q), input_precision=PREC)
    dat = tl.dot(v, tl.trans(do), input_precision=PREC) + delta[None, :]
    if HAS_MASK:
        lm = tl.where(
            ar[None, :] > ar[:, None],
            k_exc[None, :] - k_exc[:, None],
            tl.where(ar[None, :] < ar[:, None], k_inc[:, None] - k_inc[None, :], 0.0),
        )
        m = tl.exp(lm)
        at = st * m
        dpt = dat * m
        w = dpt * st
        if PER_HEAD:
            c_lo += tl.sum(w * tl.abs(ar[None, :] - ar[:, None]).to(tl.float32), 1)
        else:
            c_lo += tl.sum(tl.where(ar[None, :] > ar[:, None], w, 0.0), 1)
            c_up += tl.sum(tl.where(ar[None, :] < ar[:, None], w, 0.0), 1)
    else:
        at = st
        dpt = dat
    dv += tl.dot(at.to(do.dtype), do, input_precision=PREC)
    dk += tl.dot(dpt.to(q.dtype), q, input_precision=PREC)
    n_tiles = tl.cdiv(N, T)
    # side 0: query tiles after the key tile (lower triangle i > j), walking right;
    # side 1: query tiles before it (upper triangle i < j), walking left. The mask of a tile is rank one,
    # col(key) * wq(query): both scale the fp32 tiles, so dk, dv need no side accumulators (fewer live registers).
    for side in tl.static_range(2):
        n_side = _span(cs, jt, 1 - side, n_tiles, SKIP)
        seg = 0.0
        if HAS_MASK:
            col = tl.exp(k_tot - k_exc if side == 0 else k_inc)[:, None]
        if PER_HEAD:
            # |i - j| = (step + 1) T - sgn a + sgn c, sgn = 1 below the diagonal (side 0), -1 above it:
            # sum_c W_ac |i - j| from the row sums of W and of W c (no [T, T] distance tile is kept live)
            sgn = 1.0 if side == 0 else -1.0
            off = ar.to(tl.float32)
        for step in range(0, n_side):
            it = jt + 1 + step if side == 0 else jt - 1 - step
            rows = it * T + ar
            q = _load_rows(q_ptr, rows, N, fd, D, sqn)
            zinv = tl.load(ZINV + bh * N + rows, mask=rows < N, other=0.0)
            delta = tl.load(DELTA + bh * N + rows, mask=rows < N, other=0.0)
            do = (_load_rows(do_ptr, rows, N, fv, DV, sdn).to(tl.float32) * zinv[:, None]).to(k.dtype)
            at = tl.dot(k, tl.trans(q), input_precision=PREC)
            dpt = tl.dot(v, tl.trans(do), input_precision=PREC) + delta[None, :]
            if HAS_MASK:
                q_inc, q_exc, q_tot = _tile_gates(tab, it, NP, ar, T)
                m = col * tl.exp(seg + (q_exc if side == 0 else q_tot - q_inc))[None, :]
                seg += q_tot
                dpt = dpt * m
                w = dpt * at  # W, from the fp32 tiles (module docstring)
                if PER_HEAD:
                    c_lo += ((step + 1) * T - sgn * off) * tl.sum(w, 1) + sgn * tl.sum(w * off[None, :], 1)
                elif side == 0:
                    c_lo += tl.sum(w, 1)
                else:
                    c_up += tl.sum(w, 1)
                at = at * m
            dv += tl.dot(at.to(do.dtype), do, input_precision=PREC)
            dk += tl.dot(dpt.to(q.dtype), q, input_precision=PREC)
    cmask = cols < N
    tl.store(
        DK + b * skgb + h * skgh + cols[:, None] * skgn + fd[None, :],
        dk.to(DK.dtype.element_ty),
        mask=cmask[:, None] & (fd[None, :] < D),
    )
    tl.store(
        DV_OUT + b * svgb + h * svgh + cols[:, None] * svgn + fv[None, :],
        dv.to(DV_OUT.dtype.element_ty),
        mask=cmask[:, None] & (fv[None, :] < DV),
    )
    if HAS_MASK:
        tl.store(CL + bh * N + cols, c_lo, mask=cmask)
        if not PER_HEAD:
            tl.store(CU + bh * N + cols, c_up, mask=cmask)


def _meta(q: torch.Tensor, v: torch.Tensor) -> dict:
    """Compile-time parameters shared by the three kernels: feature blocks, dot precision (fp32 -> IEEE)."""
    return dict(
        PREC="ieee" if q.dtype == torch.float32 else "tf32",
        BD=max(16, triton.next_power_of_2(q.shape[-1])),
        BDV=max(16, triton.next_power_of_2(v.shape[-1])),
    )


def _strides(**tensors: torch.Tensor) -> dict[str, int]:
    """Launch keywords s<name>b, s<name>h, s<name>n: the (batch, head, row) strides of each named [B, H, N, d] tensor
    (feature stride must be 1)."""
    return strides("bhn", prefix="s", **tensors)


def gate_stride(g: torch.Tensor) -> int:
    """The kernels' gate token stride (_gate_ptr): 1 for per-token gates [B, H, N], 0 for per-head ones [H]."""
    return 1 if g.dim() == 3 else 0


def new_grads(q: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk (q's shape) and dv (v's), new and contiguous, for the backward kernels to write."""
    return empty(q.shape, q.dtype, q.device), empty(q.shape, q.dtype, q.device), empty(v.shape, v.dtype, q.device)


def gate_args(g: torch.Tensor | None, fill: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The kernels' (G, sg) arguments: the gates and their token stride, or an unread placeholder for LIT."""
    return (g, gate_stride(g)) if g is not None else (fill, 1)


def table_columns(n: int, tile: int) -> int:
    """Columns of a gate-table row (gate_table) that hold data for n tokens in tiles of `tile`: two cumsum sections
    of n_tiles * tile, n_tiles totals, n_tiles + 1 prefix sums."""
    nt = triton.cdiv(n, tile)
    return 2 * nt * tile + 2 * nt + 1


def table_width(n: int, tile: int) -> int:
    """Row stride of the gate table: table_columns padded to 16 floats, so that the kernels' loads of the cumsums
    stay vectorised (the padding is not written)."""
    return triton.cdiv(table_columns(n, tile), 16) * 16


def gate_table(g: torch.Tensor, shape: torch.Size, tile: int, *, logits_prefix: int | None = None) -> torch.Tensor:
    """The masked kernels' gate table, fp32 [B*H, table_width]: per (b, h) the in-tile inclusive and exclusive
    gate cumsums (n_tiles * tile each, zero gates past N), the tile totals (n_tiles) and their negated prefix sums
    (n_tiles + 1, from which the kernels count the tiles they visit, _span). One launch per forward; the forward
    and backward kernels load these instead of summing every tile they meet. shape: q's [B, H, N, d].
    g: fp32 log-gates [B, H, N] or [H]; or, with logits_prefix = P, gate logits z [B, N, H] in any float dtype
    and layout (e.g. columns of a qkv projection): log a = logsigmoid(z), 0 on the first P tokens."""
    B, H, N, _ = shape
    nt = triton.cdiv(N, tile)
    tab = empty((B * H, table_width(N, tile)), torch.float32, g.device)
    if logits_prefix is not None:
        sgb, sgh, sgn = g.stride(0), g.stride(2), g.stride(1)
    else:
        sgb, sgh, sgn = g.stride() if g.dim() == 3 else (0, g.stride(0), 0)
    _gate_table_kernel[(B * H,)](
        G=g, sgb=sgb, sgh=sgh, sgn=sgn, TAB=tab, N=N, H=H, NT=nt, W=tab.shape[1], PREFIX=logits_prefix or 0,
        LOGITS=logits_prefix is not None, T=tile, TILES=max(2, min(64 * 64 // tile, triton.next_power_of_2(nt))),
    )  # fmt: skip
    return tab


def _skips(has_mask: bool, n: int, tile: int) -> bool:
    """Whether the kernels count skippable tiles (SKIP_MIN_TILES; only a decaying mask has any)."""
    return has_mask and triton.cdiv(n, tile) >= SKIP_MIN_TILES


def gate_table_like(q: torch.Tensor, has_mask: bool) -> torch.Tensor:
    """An empty tensor shaped as parallel_forward's gate table under the default tile (for fake tensors)."""
    B, H, N, _ = q.shape
    return q.new_empty(B * H, table_width(N, TILE), dtype=torch.float32) if has_mask else q.new_empty(0)


def _table_args(tab: torch.Tensor, fill: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The kernels' (TAB, stab) arguments: the gate table and its row stride, or an unread placeholder for LIT."""
    return (tab, tab.stride(0)) if tab.numel() else (fill, 0)


def parallel_forward(
    q,
    k,
    v,
    g,
    normalize: bool,
    tile: int | None = None,
    num_warps: int = 4,
    num_stages: int | None = None,
    *,
    out: torch.Tensor | None = None,
    logits_prefix: int | None = None,
):
    """Launch the forward kernel. q, k: [B, H, N, d], v: [B, H, N, d_v], g: fp32 log-gates [B, H, N] (per token),
    [H] (per head) or None (LIT); with logits_prefix, gate logits [B, N, H] (gate_table). Returns (out
    [B, H, N, d_v]: Y in q.dtype if normalize else num in fp32, den [B, H, N] fp32, the gate table that
    parallel_backward reuses (gate_table; empty for LIT)).
    out: where to write Y, any [B, H, N, d_v] view with unit feature stride (e.g. of a [B, N, H, d_v] tensor);
    num_stages: by default 2 below N = STAGES_3_MIN_N, 3 from there."""
    B, H, N, D = q.shape
    DV = v.shape[-1]
    tile = tile or TILE
    num_stages = num_stages or (3 if N >= STAGES_3_MIN_N else 2)
    if out is None:
        out = empty((B, H, N, DV), q.dtype if normalize else torch.float32, q.device)
    den = empty((B, H, N), torch.float32, q.device)
    tab = den.new_empty(0) if g is None else gate_table(g, q.shape, tile, logits_prefix=logits_prefix)
    table, stab = _table_args(tab, den)
    _fwd_kernel[(triton.cdiv(N, tile), B * H)](
        Q=q, K=k, V=v, TAB=table, stab=stab, NUM=out, DEN=den, N=N, D=D, DV=DV, H=H,
        **_strides(q=q, k=k, v=v, o=out),
        HAS_MASK=g is not None, SKIP=_skips(g is not None, N, tile), NORMALIZE=normalize, T=tile, num_warps=num_warps,
        num_stages=num_stages, **_meta(q, v),
    )  # fmt: skip
    return out, den, tab


def parallel_backward(
    q,
    k,
    v,
    g,
    do,
    zinv,
    delta,
    tab,
    tile: int | None = None,
    num_warps: int = 4,
    num_stages: int | None = None,
    *,
    grads: tuple | None = None,
    out_den: tuple | None = None,
    logits_prefix: int | None = None,
    dlogits: torch.Tensor | None = None,
):
    """Launch the two backward kernels. do: [B, H, N, d_v] upstream gradient of num (unit feature stride) after
    scaling by zinv [B, H, N] (1 / Z, or ones when the op returned num itself); delta [B, H, N] = dL/d den; tab: the
    forward's gate table (same tile; empty for LIT);
    num_stages: by default 2 below N = STAGES_3_MIN_N, 3 from there.
    out_den: (Y [B, H, N, d_v], den) of a normalised forward, with zinv = delta = None: the dq kernel then derives
    them from dY = do (row_grads' work, without its launch).
    grads: (dq, dk, dv) views to write into (e.g. of one [B, N, 3, H, d] tensor), else new contiguous tensors.
    logits_prefix, dlogits: g holds the forward's gate logits z [B, N, H] (parallel_forward's logits_prefix); the
    gate gradient goes into dlogits as dL/dz (gate_grad's dlogits: [B, N, G >= H], zeros past column H).
    Returns dq, dk, dv and dg fp32 of g's shape (None for LIT and with dlogits)."""
    B, H, N, D = q.shape
    DV = v.shape[-1]
    tile = tile or TILE
    has_mask = g is not None
    if has_mask and tab.shape != (B * H, table_width(N, tile)):
        raise ValueError(f"gate table of shape {tuple(tab.shape)} does not fit N = {N} in tiles of {tile}")
    num_stages = num_stages or (3 if N >= STAGES_3_MIN_N else 2)
    dq, dk, dv = grads if grads is not None else new_grads(q, v)
    if out_den is not None:
        out, den = out_den
        zinv, delta = empty((B, H, N), torch.float32, q.device), empty((B, H, N), torch.float32, q.device)
    else:
        out, den = do, zinv  # unread
    per_head = has_mask and g.dim() == 1
    if per_head:  # one distance-weighted W sum per key, in cL (the kernels write no rL, rU, cU)
        sums = empty((1, B, H, N), torch.float32, q.device)
        r_lo = r_up = c_lo = c_up = sums[0]
    else:  # the W row / column sums rL, rU, cL, cU of gate_grad (unread placeholders for LIT)
        sums = empty((4, B, H, N), torch.float32, q.device) if has_mask else zinv.new_empty(4, 1)
        r_lo, r_up, c_lo, c_up = sums
    grid = (triton.cdiv(N, tile), B * H)
    meta = dict(
        HAS_MASK=has_mask,
        SKIP=_skips(has_mask, N, tile),
        PER_HEAD=per_head,
        T=tile,
        num_warps=num_warps,
        num_stages=num_stages,
        **_meta(q, v),
    )
    table, stab = _table_args(tab, zinv)
    _bwd_dq_kernel[grid](
        Q=q, K=k, V=v, TAB=table, stab=stab, DO=do, OUT=out, DEN=den, ZINV=zinv, DELTA=delta, DQ=dq, RL=r_lo, RU=r_up,
        N=N, D=D, DV=DV, H=H,
        **_strides(q=q, k=k, v=v, d=do, o=out, g=dq),
        ROW_GRADS=out_den is not None, **meta,
    )  # fmt: skip
    _bwd_dkdv_kernel[grid](
        Q=q, K=k, V=v, TAB=table, stab=stab, DO=do, ZINV=zinv, DELTA=delta, DK=dk, DV_OUT=dv, CL=c_lo, CU=c_up,
        N=N, D=D, DV=DV, H=H,
        **_strides(q=q, k=k, v=v, d=do, kg=dk, vg=dv),
        **meta,
    )  # fmt: skip
    if per_head:  # dlog lambda_h = sum over (b, i, j) of W_ij |i - j|
        dg = c_lo.sum((0, 2), dtype=torch.float64).float()
    elif dlogits is not None:
        gate_grad(sums, logits=(g, logits_prefix, dlogits))
        dg = None
    else:
        dg = gate_grad(sums) if has_mask else None
    return dq, dk, dv, dg


@triton.jit
def _row_grad_kernel(
    DO, OUT, DEN, ZINV, DELTA, N, DV, sdb, sdh, sdn, sob, soh, son, H, BN: tl.constexpr, BDV: tl.constexpr
):
    """Rows of one (b, h): ZINV = 1 / (den + 1e-6) and DELTA = dL/d den = -(dY . Y) / Z (fp32 [B*H, N]);
    DO, OUT: [B, H, N, DV] read through their (batch, head, row) strides."""
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    fv = tl.arange(0, BDV)
    ok = rows < N
    do = _load_rows(DO + b * sdb + h * sdh, rows, N, fv, DV, sdn).to(tl.float32)
    zinv, delta = _row_grad_tile(do, OUT + b * sob + h * soh, DEN + bh * N, rows, N, fv, DV, son)
    tl.store(ZINV + bh * N + rows, zinv, mask=ok)
    tl.store(DELTA + bh * N + rows, delta, mask=ok)


def row_grads(dout: torch.Tensor, out: torch.Tensor, den: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(1 / Z, dL/d den) [B, H, N] fp32 of Y = num / Z, Z = den + 1e-6, from dY and Y [B, H, N, d_v] (any strides
    with a unit feature stride)."""
    B, H, N, DV = out.shape
    zinv = empty((B, H, N), torch.float32, out.device)
    delta = empty((B, H, N), torch.float32, out.device)
    bdv = max(16, triton.next_power_of_2(DV))
    bn = max(16, min(128, 8192 // bdv))
    _row_grad_kernel[(triton.cdiv(N, bn), B * H)](
        DO=dout, OUT=out, DEN=den, ZINV=zinv, DELTA=delta, N=N, DV=DV, H=H, **_strides(d=dout, o=out), BN=bn, BDV=bdv
    )
    return zinv, delta


@triton.jit
def _gate_grad_kernel(
    SUMS, DG, N, BHN, Z, szb, szh, szn, H, PREFIX,
    PER_HEAD: tl.constexpr, LOGITS: tl.constexpr,
    PAD,
    PADB: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One (b, h): dg = cumsum(cL - rL + rU - cU) - (rU - cU) over the sequence, fp64 running sums; with PER_HEAD
    only its sum over the sequence, DG[bh] (the gradient of a gate shared by every token). With LOGITS the gates
    were logsigmoid(z) (0 on the first PREFIX tokens): DG, laid out as Z (strides szb, szh, szn), gets
    dL/dz = dg sigmoid(-z), and the (b, H - 1) program writes zeros into the PAD columns after the H gates
    (PADB: PAD's next power of two)."""
    bh = tl.program_id(0)
    carry = tl.zeros([1], dtype=tl.float64)
    total = tl.zeros([1], dtype=tl.float64)
    for n0 in range(0, N, BLOCK):
        cols = n0 + tl.arange(0, BLOCK)
        ok = cols < N
        ptr = SUMS + bh * N + cols
        r_lo = tl.load(ptr, mask=ok, other=0.0).to(tl.float64)
        r_up = tl.load(ptr + BHN, mask=ok, other=0.0).to(tl.float64)
        c_lo = tl.load(ptr + 2 * BHN, mask=ok, other=0.0).to(tl.float64)
        c_up = tl.load(ptr + 3 * BHN, mask=ok, other=0.0).to(tl.float64)
        up = r_up - c_up
        x = c_lo - r_lo + up
        dg = carry + tl.cumsum(x, 0) - up
        if PER_HEAD:
            total += tl.sum(tl.where(ok, dg, 0.0), 0)
        elif LOGITS:
            b = bh // H
            h = bh % H
            row = b * szb + cols * szn
            z = tl.load(Z + row + h * szh, mask=ok, other=0.0).to(tl.float32)
            e = tl.exp(-tl.abs(z))
            sig_neg = tl.where(z >= 0, e, 1.0) / (1.0 + e)  # sigmoid(-z) = d logsigmoid(z) / dz
            dz = tl.where(cols >= PREFIX, dg.to(tl.float32) * sig_neg, 0.0)
            tl.store(DG + row + h * szh, dz.to(DG.dtype.element_ty), mask=ok)
            if h == H - 1:
                pc = tl.arange(0, PADB)
                tl.store(
                    DG + row[:, None] + (H + pc)[None, :] * szh,
                    tl.zeros([BLOCK, PADB], dtype=DG.dtype.element_ty),
                    mask=ok[:, None] & (pc[None, :] < PAD),
                )
        else:
            tl.store(DG + bh * N + cols, dg.to(tl.float32), mask=ok)
        carry += tl.sum(x, 0)
    if PER_HEAD:
        tl.store(DG + bh + tl.arange(0, 1), total.to(tl.float32))


def gate_grad(sums: torch.Tensor, per_head: bool = False, logits: tuple | None = None) -> torch.Tensor | None:
    """dg_m = cumsum(cL - rL)_m + excl_cumsum(rU - cU)_m over the sequence (fp64 prefix sums), as fp32 [B, H, N];
    per_head: summed over the batch and the sequence instead, [H]. sums: fp32 [4, B, H, N] = rL, rU, cL, cU.
    logits: (z [B, N, H], prefix, dz [B, N, G]) when the gates were logsigmoid(z), 0 on the first `prefix` tokens:
    dz (laid out as z, e.g. columns of a dqkv tensor) gets dL/dz in its first H columns and zeros in the other
    G - H; returns None."""
    _, B, H, N = sums.shape
    block = min(1024, max(16, triton.next_power_of_2(N)))
    if logits is not None:
        z, prefix, dz = logits
        if dz.shape[:2] != z.shape[:2] or dz.shape[2] < H or dz.stride() != z.stride():
            raise ValueError(
                f"gate_grad: dz {tuple(dz.shape)} / {dz.stride()} must be laid out as the logits z "
                f"{tuple(z.shape)} / {z.stride()}, with at least H = {H} columns"
            )
        _gate_grad_kernel[(B * H,)](
            SUMS=sums, DG=dz, N=N, BHN=B * H * N, Z=z, szb=z.stride(0), szh=z.stride(2), szn=z.stride(1), H=H,
            PREFIX=prefix, PAD=dz.shape[2] - H,
            PER_HEAD=False, LOGITS=True, PADB=max(2, triton.next_power_of_2(dz.shape[2] - H)), BLOCK=block,
        )  # fmt: skip
        return None
    dg = empty((B, H) if per_head else (B, H, N), torch.float32, sums.device)
    _gate_grad_kernel[(B * H,)](
        SUMS=sums, DG=dg, N=N, BHN=B * H * N, Z=sums, szb=0, szh=0, szn=0, H=H, PREFIX=0, PAD=0,
        PER_HEAD=per_head, LOGITS=False, PADB=2, BLOCK=block,
    )  # fmt: skip
    return dg.sum(0) if per_head else dg
