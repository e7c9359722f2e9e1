"""LION as a linear-time bidirectional chunked scan (O(N d^2) work, O(N) memory): forward and backward kernels.

Same function as the parallel form (see parallel.py for M, A, num, den, Y). The sequence is cut into chunks
of C tokens; inside a chunk the C x C block of A is formed explicitly with both triangles (the diagonal
counted once); across chunks the mask factorises through the chunk boundaries, so two decayed states carry
the rest (docs/spec.md 1.5, the one-position gate shift, written with in-chunk partial sums inc_i = sum_{m<=i} g_m,
exc_i = inc_i - g_i and the chunk total tot_t):

    forward state entering chunk t:  S_t = sum_{j < start_t} exp(sum_{m=j}^{start_t - 1} g_m) k_j [v_j, 1]^T
        S_{t+1} = exp(tot_t) S_t + U_t,   U_t = sum_{j in t} exp(tot_t - exc_j) k_j [v_j, 1]^T
        row i of chunk t reads exp(exc_i) q_i^T S_t
    backward state entering chunk t: R_t = sum_{j > end_t} exp(sum_{m=end_t + 1}^{j} g_m) k_j [v_j, 1]^T
        R_{t-1} = exp(tot_t) R_t + L_t,   L_t = sum_{j in t} exp(inc_j) k_j [v_j, 1]^T
        row i reads exp(tot_t - inc_i) q_i^T R_t

The "ones column" is the d-vector z of each state, stored after its d x d_v matrix. Three stages each way:
  1. _local_states_kernel, one program per (chunk, b, h): the chunk's own terms U_t and L_t;
  2. _chunk_scan_kernel, one program per (block of state elements, b, h, state): the linear recurrences over
     the chunks, a first-order affine scan (tl.associative_scan over TB chunks at a time, a carry between);
  3. _scan_out_kernel, one program per (chunk, b, h): the intra-chunk block plus q against both states.
Stages 1 and 2 are parallel over chunks, so they fill the GPU for few (b, h) pairs (long N); from
SEQUENTIAL_MIN_PAIRS pairs on, _sequential_states_kernel does both in one pass per (b, h, direction) instead.
Decays are fp32; states are stored in fp32 for fp32 inputs and in bf16 for 16-bit ones (the scan over chunks
accumulates in fp32), and enter the matmuls in the input dtype.

Backward (dnum = dY / Z, dden as in parallel.py, dA_ij = dnum_i . v_j + dden_i): dq_i = sum_j M_ij dA_ij k_j
reads the same states S, R with [dnum_i, dden_i] against [v, 1] (the forward keeps them for the backward: 2 W / C
values per token and head, 130 for d = d_v = C = 64, bf16 for 16-bit inputs); dk, dv read the mirror states of
the queries, P = sum_i M_ij q_i [dnum_i, dden_i]^T, run left to right for the upper triangle (local weight
exp(tot - inc_i), read by key j with exp(inc_j)) and right to left for the lower one (exp(exc_i), read with
exp(tot - exc_j)): dk_j = P [v_j, 1], dv_j = P^T k_j. The gate gradient needs the row / column sums of
W = dA * A split by triangle (parallel.py); for a state term they are q_i . dq_i(term) and k_j . dk_j(term).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._launch import empty
from .parallel import (
    EPS,
    _gate_ptr,
    _gate_tile,
    _load_rows,
    _meta,
    _strides,
    _tile_log_mask,
    gate_args,
    gate_grad,
    new_grads,
)

CHUNK = 64  # tokens per chunk (C)
SCAN_CHUNKS = 16  # chunks per step of the cross-chunk scan (TB)
SCAN_BLOCK = 512  # state elements per scan program
STATE_DTYPE_16 = torch.bfloat16  # stored states of 16-bit inputs
SEQUENTIAL_MIN_PAIRS = 96  # from this many (b, h) pairs, stages 1 and 2 run as one sequential pass per pair


@triton.jit
def _chunk_program(H, N, C: tl.constexpr):
    """Indices of a program over (chunk, b * h): (t, bh, B*H, T, b, h, rows [C], rows < N)."""
    it = tl.program_id(0)
    bh = tl.program_id(1)
    rows = it * C + tl.arange(0, C)
    return it, bh, tl.num_programs(1), tl.num_programs(0), bh // H, bh % H, rows, rows < N


@triton.jit
def _chunk_gates(G, sg, bh, h, rows, N, HAS_MASK: tl.constexpr, C: tl.constexpr):
    """The chunk's gate sums and the four per-row decay factors, fp32 [C] each (zeros / ones without a mask):
    (inc, exc, tot, exp(exc), exp(tot - inc), exp(tot - exc), exp(inc)). G, sg: gates and their token stride
    (parallel._gate_ptr)."""
    if HAS_MASK:
        inc, exc, tot = _gate_tile(_gate_ptr(G, bh, h, N, sg), rows, N, sg)
        return inc, exc, tot, tl.exp(exc), tl.exp(tot - inc), tl.exp(tot - exc), tl.exp(inc)
    else:
        zero = tl.zeros([C], tl.float32)
        one = tl.full([C], 1.0, tl.float32)
        return zero, zero, 0.0, one, one, one, one


@triton.jit
def _chunk_terms(
    X, Y, YS, YC, G, sg, b, h, bh, rows, rmask, N, D, DV, sxb, sxh, sxn, syb, syh, syn, fd, fv,
    HAS_MASK: tl.constexpr, QUERIES: tl.constexpr, C: tl.constexpr,
):  # fmt: skip
    """What one chunk adds to the states: (x [C, BD], y [C, BDV] in the input dtype, ones column yc [C], chunk
    total, left-to-right weights [C], right-to-left weights [C]).
    Keys (QUERIES=False): X = k, Y = v, ones column 1; weights exp(tot - exc), exp(inc).
    Queries (QUERIES=True): X = q, Y = dO * YS (the row scale 1 / Z), ones column YC = dden;
    weights exp(tot - inc), exp(exc)."""
    x = _load_rows(X + b * sxb + h * sxh, rows, N, fd, D, sxn)
    y = _load_rows(Y + b * syb + h * syh, rows, N, fv, DV, syn)
    if QUERIES:
        ys = tl.load(YS + bh * N + rows, mask=rmask, other=0.0)
        y = (y.to(tl.float32) * ys[:, None]).to(x.dtype)
        yc = tl.load(YC + bh * N + rows, mask=rmask, other=0.0)
    else:
        yc = rmask.to(tl.float32)
    _, _, tot, w_exc, w_tot_inc, w_tot_exc, w_inc = _chunk_gates(G, sg, bh, h, rows, N, HAS_MASK, C)
    if QUERIES:
        return x, y, yc, tot, w_tot_inc, w_exc
    else:
        return x, y, yc, tot, w_tot_exc, w_inc


@triton.jit
def _state_term(x, w, yc, y, PREC: tl.constexpr):
    """sum over rows of w x [y, yc]^T: the [BD, BDV] matrix and the BD-vector of the ones column, fp32."""
    xw = x.to(tl.float32) * w[:, None]
    return tl.dot(tl.trans(xw.to(x.dtype)), y, input_precision=PREC), tl.sum(xw * yc[:, None], 0)


@triton.jit
def _store_state(ptr, m, z, fd, fv, BD: tl.constexpr, BDV: tl.constexpr):
    """Write a state at ptr in its dtype: the [BD, BDV] matrix (row-major), then the BD-vector."""
    tl.store(ptr + fd[:, None] * BDV + fv[None, :], m.to(ptr.dtype.element_ty))
    tl.store(ptr + BD * BDV + fd, z.to(ptr.dtype.element_ty))


@triton.jit
def _local_states_kernel(
    X, Y, YS, YC, G, sg, U, TOT, N, D, DV, sxb, sxh, sxn, syb, syh, syn, H,
    HAS_MASK: tl.constexpr, QUERIES: tl.constexpr, PREC: tl.constexpr, C: tl.constexpr, BD: tl.constexpr,
    BDV: tl.constexpr,
):  # fmt: skip
    """U[s, bh, t] for s = 0 (left to right) and 1 (right to left) of chunk t (_chunk_terms), and
    TOT[bh, t] = tot_t."""
    it, bh, BH, T, b, h, rows, rmask = _chunk_program(H, N, C)
    fd = tl.arange(0, BD)
    fv = tl.arange(0, BDV)
    x, y, yc, tot, w_right, w_left = _chunk_terms(
        X, Y, YS, YC, G, sg, b, h, bh, rows, rmask, N, D, DV, sxb, sxh, sxn, syb, syh, syn, fd, fv, HAS_MASK, QUERIES, C
    )
    W: tl.constexpr = BD * BDV + BD
    m, z = _state_term(x, w_right, yc, y, PREC)
    _store_state(U + (bh * T + it) * W, m, z, fd, fv, BD, BDV)
    m, z = _state_term(x, w_left, yc, y, PREC)
    _store_state(U + ((BH + bh) * T + it) * W, m, z, fd, fv, BD, BDV)
    if HAS_MASK:
        tl.store(TOT + bh * T + it, tot)


@triton.jit
def _sequential_states_kernel(
    X, Y, YS, YC, G, sg, S, N, D, DV, sxb, sxh, sxn, syb, syh, syn, H, T,
    HAS_MASK: tl.constexpr, QUERIES: tl.constexpr, PREC: tl.constexpr, C: tl.constexpr, BD: tl.constexpr,
    BDV: tl.constexpr,
):  # fmt: skip
    """Stages 1 and 2 in one pass, for many (b, h) pairs: one program per (b * h, direction s) walks the chunks
    in order with the state in fp32 registers, writing the state entering each chunk, S[s, bh, t], then
    folding the chunk in (S <- exp(tot_t) S + its term, _chunk_terms). The local terms never reach memory."""
    bh = tl.program_id(0)
    s = tl.program_id(1)
    BH = tl.num_programs(0)
    b = bh // H
    h = bh % H
    fd = tl.arange(0, BD)
    fv = tl.arange(0, BDV)
    W: tl.constexpr = BD * BDV + BD
    acc = tl.zeros([BD, BDV], dtype=tl.float32)
    z = tl.zeros([BD], dtype=tl.float32)
    for step in range(0, T):
        it = step if s == 0 else T - 1 - step
        _store_state(S + ((s * BH + bh) * T + it) * W, acc, z, fd, fv, BD, BDV)
        rows = it * C + tl.arange(0, C)
        x, y, yc, tot, w_right, w_left = _chunk_terms(
            X, Y, YS, YC, G, sg, b, h, bh, rows, rows < N, N, D, DV, sxb, sxh, sxn, syb, syh, syn, fd, fv,
            HAS_MASK, QUERIES, C,
        )  # fmt: skip
        m, zt = _state_term(x, tl.where(s == 0, w_right, w_left), yc, y, PREC)
        decay = tl.exp(tot)
        acc = acc * decay + m
        z = z * decay + zt


@triton.jit
def _affine(a1, b1, a2, b2):
    """Composition of x -> a1 x + b1 then x -> a2 x + b2."""
    return a1 * a2, b1 * a2 + b2


@triton.jit
def _chunk_scan_kernel(
    U, S, TOT, T, BH, HAS_MASK: tl.constexpr, W: tl.constexpr, TB: tl.constexpr, BLOCK: tl.constexpr
):
    """Entering states S[s, bh, t] from the local terms U[s, bh, t] (both [2, BH, T, W], fp32 sums): s = 0 runs
    left to right (S_{t+1} = exp(tot_t) S_t + U_t, S_0 = 0), s = 1 right to left.
    Position p of the scan order holds S_p = d_{p-1} S_{p-1} + U_{p-1}: TB positions at a time form the affine
    maps (d_{p-1}, U_{p-1}), compose them with a prefix scan and apply the result to the carried state."""
    eb = tl.program_id(0)
    bh = tl.program_id(1)
    s = tl.program_id(2)
    e = eb * BLOCK + tl.arange(0, BLOCK)
    emask = e < W
    r = tl.arange(0, TB)
    base = (s * BH + bh) * T
    carry = tl.zeros([BLOCK], dtype=tl.float32)
    for p0 in range(0, T, TB):
        p = p0 + r
        prev = p - 1
        valid = (prev >= 0) & (prev < T)
        c_prev = prev if s == 0 else T - 1 - prev
        u = tl.load(U + (base + c_prev)[:, None] * W + e[None, :], mask=valid[:, None] & emask[None, :], other=0.0)
        u = u.to(tl.float32)
        if HAS_MASK:
            d = tl.exp(tl.load(TOT + bh * T + c_prev, mask=valid, other=0.0))
            a, acc = tl.associative_scan((tl.broadcast_to(d[:, None], (TB, BLOCK)), u), 0, _affine)
            state = a * carry[None, :] + acc
        else:
            state = carry[None, :] + tl.cumsum(u, 0)
        c = p if s == 0 else T - 1 - p
        tl.store(
            S + (base + c)[:, None] * W + e[None, :],
            state.to(S.dtype.element_ty),
            mask=(p < T)[:, None] & emask[None, :],
        )
        carry = tl.sum(tl.where(r[:, None] == TB - 1, state, 0.0), 0)


@triton.jit
def _load_state(ptr, dt, fd, BD: tl.constexpr, BDV: tl.constexpr):
    """One state at ptr: its [BD, BDV] matrix in the matmul dtype dt and its ones column [BD] in fp32."""
    fv = tl.arange(0, BDV)
    return tl.load(ptr + fd[:, None] * BDV + fv[None, :]).to(dt), tl.load(ptr + BD * BDV + fd).to(tl.float32)


@triton.jit
def _apply(x, st, z, w, PREC: tl.constexpr):
    """Rows w_i x_i^T [state matrix | ones column]: ([C, BDV], [C]) in fp32."""
    num = tl.dot(x, st, input_precision=PREC)
    return w[:, None] * num, w * tl.sum(x.to(tl.float32) * z[None, :], 1)


@triton.jit
def _apply_t(y, yc, st, z, w, PREC: tl.constexpr):
    """Rows w_i (state matrix y_i + yc_i ones column), the transposed use: [C, BD] in fp32."""
    return w[:, None] * (tl.dot(y, tl.trans(st), input_precision=PREC) + yc[:, None] * z[None, :])


@triton.jit
def _chunk_qkv(Q, K, V, b, h, rows, N, D, DV, sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, fd, fv):
    """q, k [C, BD] and v [C, BDV] of one chunk of (b, h), zeros past N and past the head dims."""
    return (
        _load_rows(Q + b * sqb + h * sqh, rows, N, fd, D, sqn),
        _load_rows(K + b * skb + h * skh, rows, N, fd, D, skn),
        _load_rows(V + b * svb + h * svh, rows, N, fv, DV, svn),
    )


@triton.jit
def _scan_out_kernel(
    Q, K, V, G, sg, S, OUT, DEN, N, D, DV, sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son, H,
    HAS_MASK: tl.constexpr, NORMALIZE: tl.constexpr, PREC: tl.constexpr, C: tl.constexpr, BD: tl.constexpr,
    BDV: tl.constexpr,
):  # fmt: skip
    """One chunk of one (b, h): num = intra-chunk block + exp(exc) q S_t + exp(tot - inc) q R_t (den alike)."""
    it, bh, BH, T, b, h, rows, rmask = _chunk_program(H, N, C)
    fd = tl.arange(0, BD)
    fv = tl.arange(0, BDV)
    ar = tl.arange(0, C)
    q, k, v = _chunk_qkv(Q, K, V, b, h, rows, N, D, DV, sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, fd, fv)
    inc, exc, _, w_exc, w_tot_inc, _, _ = _chunk_gates(G, sg, bh, h, rows, N, HAS_MASK, C)
    s = tl.dot(q, tl.trans(k), input_precision=PREC)
    if HAS_MASK:
        s = s * tl.exp(_tile_log_mask(inc, exc, ar))
    num = tl.dot(s.to(v.dtype), v, input_precision=PREC)
    den = tl.sum(s, 1)
    W: tl.constexpr = BD * BDV + BD
    st, z = _load_state(S + (bh * T + it) * W, q.dtype, fd, BD, BDV)
    n_f, d_f = _apply(q, st, z, w_exc, PREC)
    st, z = _load_state(S + ((BH + bh) * T + it) * W, q.dtype, fd, BD, BDV)
    n_b, d_b = _apply(q, st, z, w_tot_inc, PREC)
    num += n_f + n_b
    den += d_f + d_b
    if NORMALIZE:
        num = num / (den + EPS)[:, None]
    omask = rmask[:, None] & (fv[None, :] < DV)
    tl.store(OUT + b * sob + h * soh + rows[:, None] * son + fv[None, :], num.to(OUT.dtype.element_ty), mask=omask)
    tl.store(DEN + bh * N + rows, den, mask=rmask)


@triton.jit
def _scan_grad_kernel(
    Q, K, V, G, sg, DO, ZINV, DELTA, S, P, DQ, DK, DVO, SUMS, N, D, DV, sqb, sqh, sqn, skb, skh, skn, svb, svh, svn,
    sdb, sdh, sdn, sgb, sgh, sgn, skgb, skgh, skgn, svgb, svgh, svgn, H,
    HAS_MASK: tl.constexpr, PREC: tl.constexpr, C: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
):  # fmt: skip
    """dq, dk, dv of one chunk of one (b, h) and the row / column sums of W by triangle (SUMS: fp32
    [4, B*H, N] = rL, rU, cL, cU). Entering states [2, B*H, T, W]: S = the key states S (left to right), R (right
    to left); P = the query states P (left to right: upper triangle), P (right to left: lower triangle)."""
    it, bh, BH, T, b, h, rows, rmask = _chunk_program(H, N, C)
    fd = tl.arange(0, BD)
    fv = tl.arange(0, BDV)
    ar = tl.arange(0, C)
    q, k, v = _chunk_qkv(Q, K, V, b, h, rows, N, D, DV, sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, fd, fv)
    zinv = tl.load(ZINV + bh * N + rows, mask=rmask, other=0.0)
    dd = tl.load(DELTA + bh * N + rows, mask=rmask, other=0.0)
    dn = (_load_rows(DO + b * sdb + h * sdh, rows, N, fv, DV, sdn).to(tl.float32) * zinv[:, None]).to(q.dtype)
    ones = rmask.to(tl.float32)
    inc, exc, _, w_exc, w_tot_inc, w_tot_exc, w_inc = _chunk_gates(G, sg, bh, h, rows, N, HAS_MASK, C)
    # intra-chunk block, both triangles; its W sums first, so that only the 16-bit A and dP stay live
    s = tl.dot(q, tl.trans(k), input_precision=PREC)
    dp = tl.dot(dn, tl.trans(v), input_precision=PREC) + dd[:, None]
    if HAS_MASK:
        m = tl.exp(_tile_log_mask(inc, exc, ar))
        dp = dp * m
        w = dp * s
        s = s * m
        lower = ar[:, None] > ar[None, :]
        upper = ar[:, None] < ar[None, :]
        r_lo = tl.sum(tl.where(lower, w, 0.0), 1)
        r_up = tl.sum(tl.where(upper, w, 0.0), 1)
        c_lo = tl.sum(tl.where(lower, w, 0.0), 0)
        c_up = tl.sum(tl.where(upper, w, 0.0), 0)
    else:
        r_lo = ones  # the W sums are unused without a mask
        r_up = ones
        c_lo = ones
        c_up = ones
    a = s.to(dn.dtype)
    dp = dp.to(q.dtype)
    # dk, dv from the query states (upper from P left to right, lower from P right to left), then dq from the
    # key states (lower from S, upper from R)
    _grad_keys(
        P, DK + b * skgb + h * skgh, skgn, DVO + b * svgb + h * svgh, svgn, SUMS, q, k, v, dn, a, dp, c_lo, c_up, ones,
        w_inc, w_tot_exc, bh, BH, T, it, N, D, DV, rows, rmask, fd, fv,
        HAS_MASK, PREC, BD, BDV,
    )  # fmt: skip
    _grad_queries(
        S, DQ + b * sgb + h * sgh, sgn, SUMS, q, k, dn, dd, dp, r_lo, r_up, w_exc, w_tot_inc, bh, BH, T, it, N, D, rows,
        rmask, fd,
        HAS_MASK, PREC, BD, BDV,
    )  # fmt: skip


@triton.jit
def _grad_keys(
    P, DK, skgn, DVO, svgn, SUMS, q, k, v, dn, a, dp, c_lo, c_up, ones, w_inc, w_tot_exc, bh, BH, T, it, N, D, DV, rows,
    rmask, fd, fv,
    HAS_MASK: tl.constexpr, PREC: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
):  # fmt: skip
    """dk, dv of a chunk: its A^T dnum and dP^T q plus the two query states; stores them (DK, DVO: the (b, h) rows,
    row strides skgn, svgn) and cL, cU."""
    W: tl.constexpr = BD * BDV + BD
    BHN = BH * N
    dv = tl.dot(tl.trans(a), dn, input_precision=PREC)
    dk = tl.dot(tl.trans(dp), q, input_precision=PREC)
    st, z = _load_state(P + (bh * T + it) * W, q.dtype, fd, BD, BDV)
    dk_up = _apply_t(v, ones, st, z, w_inc, PREC)
    dv += w_inc[:, None] * tl.dot(k, st, input_precision=PREC)
    st, z = _load_state(P + ((BH + bh) * T + it) * W, q.dtype, fd, BD, BDV)
    dk_lo = _apply_t(v, ones, st, z, w_tot_exc, PREC)
    dv += w_tot_exc[:, None] * tl.dot(k, st, input_precision=PREC)
    tl.store(
        DVO + rows[:, None] * svgn + fv[None, :],
        dv.to(DVO.dtype.element_ty),
        mask=rmask[:, None] & (fv[None, :] < DV),
    )
    tl.store(
        DK + rows[:, None] * skgn + fd[None, :],
        (dk + dk_lo + dk_up).to(DK.dtype.element_ty),
        mask=rmask[:, None] & (fd[None, :] < D),
    )
    if HAS_MASK:
        kf = k.to(tl.float32)
        tl.store(SUMS + 2 * BHN + bh * N + rows, c_lo + tl.sum(kf * dk_lo, 1), mask=rmask)
        tl.store(SUMS + 3 * BHN + bh * N + rows, c_up + tl.sum(kf * dk_up, 1), mask=rmask)


@triton.jit
def _grad_queries(
    S, DQ, sgn, SUMS, q, k, dn, dd, dp, r_lo, r_up, w_exc, w_tot_inc, bh, BH, T, it, N, D, rows, rmask, fd,
    HAS_MASK: tl.constexpr, PREC: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
):  # fmt: skip
    """dq of a chunk: its dP k plus the two key states; stores it (DQ: the (b, h) rows, row stride sgn) and rL, rU."""
    W: tl.constexpr = BD * BDV + BD
    BHN = BH * N
    dq = tl.dot(dp, k, input_precision=PREC)
    st, z = _load_state(S + (bh * T + it) * W, q.dtype, fd, BD, BDV)
    dq_lo = _apply_t(dn, dd, st, z, w_exc, PREC)
    st, z = _load_state(S + ((BH + bh) * T + it) * W, q.dtype, fd, BD, BDV)
    dq_up = _apply_t(dn, dd, st, z, w_tot_inc, PREC)
    tl.store(
        DQ + rows[:, None] * sgn + fd[None, :],
        (dq + dq_lo + dq_up).to(DQ.dtype.element_ty),
        mask=rmask[:, None] & (fd[None, :] < D),
    )
    if HAS_MASK:
        qf = q.to(tl.float32)
        tl.store(SUMS + bh * N + rows, r_lo + tl.sum(qf * dq_lo, 1), mask=rmask)
        tl.store(SUMS + BHN + bh * N + rows, r_up + tl.sum(qf * dq_up, 1), mask=rmask)


def _entering_states(x, y, ys, yc, g, queries: bool, plan):
    """Stages 1 and 2 for one source: the states entering each chunk, [2, B*H, T, W] in plan's state dtype, left
    to right then right to left. Keys: x = k, y = v (ys, yc unused), the states S and R; queries: x = q, y = dO,
    ys = 1 / Z, yc = dden, the states P. One sequential pass from SEQUENTIAL_MIN_PAIRS (b, h) pairs on; else
    the local terms of every chunk (stage 1) and the affine scan over the chunks (stage 2), which fill the GPU
    for few pairs."""
    chunk, tb, block, state_dtype, sequential_pairs = plan
    B, H, N, D = x.shape
    DV = y.shape[-1]
    shape = _states_shape(x, y, chunk)
    _, _, T, width = shape
    meta = _meta(x, y)
    tot = empty((B * H, T), torch.float32, x.device)
    ys, yc = (ys, yc) if queries else (tot, tot)
    # the entering states themselves when sequential, else the local terms of stage 1
    terms = empty(shape, state_dtype, x.device)
    gate, sg = gate_args(g, tot)
    args = dict(X=x, Y=y, YS=ys, YC=yc, G=gate, sg=sg, N=N, D=D, DV=DV, H=H, **_strides(x=x, y=y))
    config = dict(HAS_MASK=g is not None, QUERIES=queries, C=chunk, num_warps=4, **meta)
    if B * H >= sequential_pairs:
        _sequential_states_kernel[(B * H, 2)](S=terms, T=T, **args, num_stages=3, **config)
        return terms
    _local_states_kernel[(T, B * H)](U=terms, TOT=tot, **args, **config)
    states = empty(shape, state_dtype, x.device)
    tb = min(tb, max(2, triton.next_power_of_2(T)))
    _chunk_scan_kernel[(triton.cdiv(width, block), B * H, 2)](
        U=terms, S=states, TOT=tot, T=T, BH=B * H, HAS_MASK=g is not None, W=width, TB=tb, BLOCK=block, num_warps=4
    )
    return states


def _plan(q, chunk, tb, block, state_dtype):
    """Launch sizes, state dtype and the sequential threshold: the arguments, or the module defaults (read at
    call time, so tests can change them); states are fp32 for fp32 inputs, else bf16 (the range of fp32, the
    matmul operand width)."""
    if state_dtype is None:
        state_dtype = torch.float32 if q.dtype == torch.float32 else STATE_DTYPE_16
    return chunk or CHUNK, tb or SCAN_CHUNKS, block or SCAN_BLOCK, state_dtype, SEQUENTIAL_MIN_PAIRS


def _states_shape(x: torch.Tensor, y: torch.Tensor, chunk: int) -> tuple[int, int, int, int]:
    """[2, B*H, T, W]: both directions' state entering each of the T chunks, W = BD * BDV + BD values each."""
    B, H, N, _ = x.shape
    meta = _meta(x, y)
    return 2, B * H, triton.cdiv(N, chunk), meta["BD"] * meta["BDV"] + meta["BD"]


def key_states_like(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """An empty tensor of the key states' shape and dtype under the defaults (for fake tensors)."""
    chunk, _, _, state_dtype, _ = _plan(q, None, None, None, None)
    return q.new_empty(_states_shape(q, v, chunk), dtype=state_dtype)


def scan_forward(
    q,
    k,
    v,
    g,
    normalize: bool,
    chunk: int | None = None,
    tb: int | None = None,
    block: int | None = None,
    num_warps: int = 4,
    state_dtype: torch.dtype | None = None,
    *,
    out: torch.Tensor | None = None,
):
    """Launch the scan forward. Shapes as parallel.parallel_forward; returns (out, den, key states), the states
    [2, B*H, T, W] kept for scan_backward (it reuses them instead of a second pass over k and v).
    out: where to write Y (normalize, 16-bit inputs) or num (fp32, then Y in place), any [B, H, N, d_v] view with
    unit feature stride (e.g. of a [B, N, H, d_v] tensor)."""
    plan = _plan(q, chunk, tb, block, state_dtype)
    B, H, N, D = q.shape
    DV = v.shape[-1]
    states = _entering_states(k, v, None, None, g, False, plan)
    # fp32 inputs normalise outside the kernel: on an H100 (Triton 3.6) the NORMALIZE=True build with fp32 states
    # gives wrong Y for H = 1 (scripts/lion_check.py catches it; the fp32 num / den it returns are right)
    in_kernel = normalize and q.dtype != torch.float32
    if out is None:
        out = empty((B, H, N, DV), q.dtype if in_kernel else torch.float32, q.device)
    den = empty((B, H, N), torch.float32, q.device)
    gate, sg = gate_args(g, den)
    _scan_out_kernel[(triton.cdiv(N, plan[0]), B * H)](
        Q=q, K=k, V=v, G=gate, sg=sg, S=states, OUT=out, DEN=den, N=N, D=D, DV=DV, H=H,
        **_strides(q=q, k=k, v=v, o=out),
        HAS_MASK=g is not None, NORMALIZE=in_kernel, C=plan[0], num_warps=num_warps, **_meta(q, v),
    )  # fmt: skip
    if normalize and not in_kernel:
        out.div_((den + EPS.value)[..., None])
    return out, den, states


def scan_backward(
    q,
    k,
    v,
    g,
    do,
    zinv,
    delta,
    key_states,
    chunk: int | None = None,
    tb: int | None = None,
    block: int | None = None,
    num_warps: int = 4,
    state_dtype: torch.dtype | None = None,
    *,
    grads: tuple | None = None,
    logits: tuple | None = None,
):
    """Launch the scan backward. Arguments as parallel.parallel_backward, with the forward's key states (same chunk
    and state dtype) in place of its prefix sums; returns dq, dk, dv, dg (None for LIT and with logits).
    do: any [B, H, N, d_v] view with unit feature stride; grads: (dq, dk, dv) views to write into (e.g. of one
    [B, N, 3, H, d] tensor), else new contiguous tensors; logits: gate_grad's (z, prefix, dz) when g = logsigmoid(z)
    (0 on the first prefix tokens): dL/dz goes into dz."""
    plan = _plan(q, chunk, tb, block, state_dtype)
    B, H, N, D = q.shape
    DV = v.shape[-1]
    has_mask = g is not None
    query_states = _entering_states(q, do, zinv, delta, g, True, plan)
    dq, dk, dv = grads if grads is not None else new_grads(q, v)
    sums = empty((4, B, H, N), torch.float32, q.device) if has_mask else zinv.new_empty(4, 1)
    gate, sg = gate_args(g, zinv)
    _scan_grad_kernel[(triton.cdiv(N, plan[0]), B * H)](
        Q=q, K=k, V=v, G=gate, sg=sg, DO=do, ZINV=zinv, DELTA=delta, S=key_states, P=query_states,
        DQ=dq, DK=dk, DVO=dv, SUMS=sums, N=N, D=D, DV=DV, H=H,
        **_strides(q=q, k=k, v=v, d=do, g=dq, kg=dk, vg=dv),
        HAS_MASK=has_mask, C=plan[0], num_warps=num_warps, **_meta(q, v),
    )  # fmt: skip
    if logits is not None:
        gate_grad(sums, logits=logits)
        return dq, dk, dv, None
    dg = gate_grad(sums, g.dim() == 1) if has_mask else None
    return dq, dk, dv, dg
