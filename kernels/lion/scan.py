"""LION as a linear-time bidirectional chunked scan (O(N d^2) work, O(N) memory): forward and backward kernels.

Same function as the parallel form (see parallel.py for M, A, num, den, Y). The sequence is cut into chunks
of C tokens; inside a chunk the C x C block of A is formed explicitly with both triangles (the diagonal
counted once); across chunks the mask factorises through the chunk boundaries, so two decayed states carry
the rest (SPEC 1.5, the one-position gate shift, written with in-chunk partial sums inc_i = sum_{m<=i} g_m,
exc_i = inc_i - g_i and the chunk total tot):

    forward state entering chunk t:  S_t = sum_{j < start_t} exp(sum_{m=j}^{start_t - 1} g_m) k_j [v_j, 1]^T
        row i of chunk t reads exp(exc_i) q_i^T S_t;   S_{t+1} = exp(tot) S_t + sum_j exp(tot - exc_j) k_j [v_j, 1]^T
    backward state entering chunk t: R_t = sum_{j > end_t} exp(sum_{m=end_t + 1}^{j} g_m) k_j [v_j, 1]^T
        row i reads exp(tot - inc_i) q_i^T R_t;         R_{t-1} = exp(tot) R_t + sum_j exp(inc_j) k_j [v_j, 1]^T

The "ones column" is the d-vector z of each state (its last column). One program per (b, h) runs the left
sweep (intra-chunk block + forward state, partial num/den to an fp32 scratch), a barrier, then the right
sweep (backward state, normalisation, final store). Decays are fp32; states stay fp32 and are rounded to
the input dtype only as matmul operands.

Backward (dnum = dY / Z, dden as in parallel.py, dA_ij = dnum_i . v_j + dden_i): the same two sweeps carry
four states, each the transpose of a forward one: left sweep S (k v^T, k) for dq of the lower triangle and
P = sum_i decayed q_i [dnum_i, dden_i]^T for dk, dv of the upper triangle; right sweep the mirror images.
The gate gradient needs the row / column sums of W = dA * A split by triangle (parallel.py); for a state
term they are q_i . dq_i(term) and k_j . dk_j(term), so they come for free.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._launch import empty
from .parallel import EPS, _gate_tile, _load_rows, _meta, _strides, _tile_log_mask, gate_grad


@triton.jit
def _intra(q, k, v, dt, inc, exc, HAS_MASK: tl.constexpr, PREC: tl.constexpr, C: tl.constexpr):
    """Diagonal C x C block: returns (A v, A 1) with both triangles and the diagonal once."""
    s = tl.dot(q, tl.trans(k), input_precision=PREC)
    if HAS_MASK:
        ar = tl.arange(0, C)
        lm = _tile_log_mask(inc, exc, ar)
        s = s * tl.exp(lm)
    return tl.dot(s.to(dt), v, input_precision=PREC), tl.sum(s, 1)


@triton.jit
def _scan_fwd_kernel(Q, K, V, G, OUT, DEN, SCR, N, D, DV,
                     sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, H,
                     HAS_MASK: tl.constexpr, NORMALIZE: tl.constexpr, PREC: tl.constexpr,
                     C: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr):
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    q_ptr = Q + b * sqb + h * sqh
    k_ptr = K + b * skb + h * skh
    v_ptr = V + b * svb + h * svh
    g_ptr = G + bh * N
    scr_ptr = SCR + bh * N * DV
    fd = tl.arange(0, BD)
    fv = tl.arange(0, BDV)
    ar = tl.arange(0, C)
    n_chunks = tl.cdiv(N, C)
    state = tl.zeros([BD, BDV], dtype=tl.float32)
    z = tl.zeros([BD], dtype=tl.float32)
    inc = tl.zeros([C], dtype=tl.float32)
    exc = inc
    for t in range(0, n_chunks):
        rows = t * C + ar
        q = _load_rows(q_ptr, rows, N, fd, D, sqn)
        k = _load_rows(k_ptr, rows, N, fd, D, skn)
        v = _load_rows(v_ptr, rows, N, fv, DV, svn)
        if HAS_MASK:
            inc, exc, tot = _gate_tile(g_ptr, rows, N)
        num, den = _intra(q, k, v, v.dtype, inc, exc, HAS_MASK, PREC, C)
        num += tl.exp(exc)[:, None] * tl.dot(q, state.to(q.dtype), input_precision=PREC)
        den += tl.exp(exc) * tl.sum(q.to(tl.float32) * z[None, :], 1)
        tl.store(scr_ptr + rows[:, None] * DV + fv[None, :], num, mask=(rows[:, None] < N) & (fv[None, :] < DV))
        tl.store(DEN + bh * N + rows, den, mask=rows < N)
        if HAS_MASK:
            kw = k.to(tl.float32) * tl.exp(tot - exc)[:, None]
            state = state * tl.exp(tot) + tl.dot(tl.trans(kw.to(k.dtype)), v, input_precision=PREC)
            z = z * tl.exp(tot) + tl.sum(kw, 0)
        else:
            state += tl.dot(tl.trans(k), v, input_precision=PREC)
            z += tl.sum(k.to(tl.float32), 0)
    tl.debug_barrier()
    state = tl.zeros([BD, BDV], dtype=tl.float32)
    z = tl.zeros([BD], dtype=tl.float32)
    for tt in range(0, n_chunks):
        t = n_chunks - 1 - tt
        rows = t * C + ar
        rmask = rows < N
        q = _load_rows(q_ptr, rows, N, fd, D, sqn)
        k = _load_rows(k_ptr, rows, N, fd, D, skn)
        v = _load_rows(v_ptr, rows, N, fv, DV, svn)
        omask = (rows[:, None] < N) & (fv[None, :] < DV)
        num = tl.load(scr_ptr + rows[:, None] * DV + fv[None, :], mask=omask, other=0.0)
        den = tl.load(DEN + bh * N + rows, mask=rmask, other=0.0)
        if HAS_MASK:
            inc, exc, tot = _gate_tile(g_ptr, rows, N)
            wq = tl.exp(tot - inc)
        else:
            wq = tl.full([C], 1.0, tl.float32)
        num += wq[:, None] * tl.dot(q, state.to(q.dtype), input_precision=PREC)
        den += wq * tl.sum(q.to(tl.float32) * z[None, :], 1)
        if NORMALIZE:
            num = num / (den + EPS)[:, None]
        tl.store(OUT + bh * N * DV + rows[:, None] * DV + fv[None, :], num.to(OUT.dtype.element_ty), mask=omask)
        tl.store(DEN + bh * N + rows, den, mask=rmask)
        if HAS_MASK:
            kw = k.to(tl.float32) * tl.exp(inc)[:, None]
            state = state * tl.exp(tot) + tl.dot(tl.trans(kw.to(k.dtype)), v, input_precision=PREC)
            z = z * tl.exp(tot) + tl.sum(kw, 0)
        else:
            state += tl.dot(tl.trans(k), v, input_precision=PREC)
            z += tl.sum(k.to(tl.float32), 0)


@triton.jit
def _scan_bwd_kernel(Q, K, V, G, DO, ZINV, DELTA, DQ, DK, DVO, SUMS, SCR, N, D, DV,
                     sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, H,
                     HAS_MASK: tl.constexpr, PREC: tl.constexpr,
                     C: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr):
    """SCR: fp32 [B*H, N, BD + BD + BDV] holding the left sweep's dq | dk | dv; SUMS: fp32 [4, B*H, N]
    = rL, rU, cL, cU."""
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    q_ptr = Q + b * sqb + h * sqh
    k_ptr = K + b * skb + h * skh
    v_ptr = V + b * svb + h * svh
    g_ptr = G + bh * N
    do_ptr = DO + bh * N * DV
    W: tl.constexpr = BD + BD + BDV
    scr_ptr = SCR + bh * N * W
    BHN = tl.num_programs(0) * N
    fd = tl.arange(0, BD)
    fv = tl.arange(0, BDV)
    ar = tl.arange(0, C)
    n_chunks = tl.cdiv(N, C)
    kv = tl.zeros([BD, BDV], dtype=tl.float32)   # decayed sum k v^T of the keys already passed
    kz = tl.zeros([BD], dtype=tl.float32)        # decayed sum k
    qd = tl.zeros([BD, BDV], dtype=tl.float32)   # decayed sum q dnum^T of the queries already passed
    qz = tl.zeros([BD], dtype=tl.float32)        # decayed sum q dden
    inc = tl.zeros([C], dtype=tl.float32)
    exc = inc
    ones = tl.full([C], 1.0, tl.float32)
    for sweep in tl.static_range(2):
        for tt in range(0, n_chunks):
            t = tt if sweep == 0 else n_chunks - 1 - tt
            rows = t * C + ar
            rmask = rows < N
            q = _load_rows(q_ptr, rows, N, fd, D, sqn)
            k = _load_rows(k_ptr, rows, N, fd, D, skn)
            v = _load_rows(v_ptr, rows, N, fv, DV, svn)
            zinv = tl.load(ZINV + bh * N + rows, mask=rmask, other=0.0)
            dd = tl.load(DELTA + bh * N + rows, mask=rmask, other=0.0)
            dn = (_load_rows(do_ptr, rows, N, fv, DV, DV).to(tl.float32) * zinv[:, None]).to(q.dtype)
            if HAS_MASK:
                inc, exc, tot = _gate_tile(g_ptr, rows, N)
                decay = tl.exp(tot)
                if sweep == 0:
                    wq_in = tl.exp(exc)          # query reads the forward state
                    wk_in = tl.exp(inc)          # key reads the earlier queries (upper triangle)
                    w_out = tl.exp(tot - exc)    # key / query enters the forward-running states
                    wq_out = tl.exp(tot - inc)
                else:
                    wq_in = tl.exp(tot - inc)
                    wk_in = tl.exp(tot - exc)
                    w_out = tl.exp(inc)
                    wq_out = tl.exp(exc)
            else:
                decay = 1.0
                wq_in = ones
                wk_in = ones
                w_out = ones
                wq_out = ones
            # state terms: dq from the keys passed, dk / dv from the queries passed
            dq = wq_in[:, None] * (tl.dot(dn, tl.trans(kv.to(q.dtype)), input_precision=PREC) + dd[:, None] * kz[None, :])
            dv = wk_in[:, None] * tl.dot(k, qd.to(q.dtype), input_precision=PREC)
            dk = wk_in[:, None] * (tl.dot(v, tl.trans(qd.to(q.dtype)), input_precision=PREC) + qz[None, :])
            r_state = tl.sum(q.to(tl.float32) * dq, 1)
            c_state = tl.sum(k.to(tl.float32) * dk, 1)
            smask = (rows[:, None] < N)
            if sweep == 0:
                # intra-chunk block, both triangles
                s = tl.dot(q, tl.trans(k), input_precision=PREC)
                da = tl.dot(dn, tl.trans(v), input_precision=PREC) + dd[:, None]
                if HAS_MASK:
                    lm = _tile_log_mask(inc, exc, ar)
                    m = tl.exp(lm)
                    a = s * m
                    dp = da * m
                    w = dp * s
                    lower = ar[:, None] > ar[None, :]
                    upper = ar[:, None] < ar[None, :]
                    tl.store(SUMS + bh * N + rows, r_state + tl.sum(tl.where(lower, w, 0.0), 1), mask=rmask)
                    tl.store(SUMS + BHN + bh * N + rows, tl.sum(tl.where(upper, w, 0.0), 1), mask=rmask)
                    tl.store(SUMS + 2 * BHN + bh * N + rows, tl.sum(tl.where(lower, w, 0.0), 0), mask=rmask)
                    tl.store(SUMS + 3 * BHN + bh * N + rows, c_state + tl.sum(tl.where(upper, w, 0.0), 0), mask=rmask)
                else:
                    a = s
                    dp = da
                dq += tl.dot(dp.to(k.dtype), k, input_precision=PREC)
                dk += tl.dot(tl.trans(dp.to(q.dtype)), q, input_precision=PREC)
                dv += tl.dot(tl.trans(a.to(dn.dtype)), dn, input_precision=PREC)
                tl.store(scr_ptr + rows[:, None] * W + fd[None, :], dq, mask=smask)
                tl.store(scr_ptr + rows[:, None] * W + BD + fd[None, :], dk, mask=smask)
                tl.store(scr_ptr + rows[:, None] * W + 2 * BD + fv[None, :], dv, mask=smask)
            else:
                dq += tl.load(scr_ptr + rows[:, None] * W + fd[None, :], mask=smask, other=0.0)
                dk += tl.load(scr_ptr + rows[:, None] * W + BD + fd[None, :], mask=smask, other=0.0)
                dv += tl.load(scr_ptr + rows[:, None] * W + 2 * BD + fv[None, :], mask=smask, other=0.0)
                dmask = smask & (fd[None, :] < D)
                tl.store(DQ + bh * N * D + rows[:, None] * D + fd[None, :], dq.to(DQ.dtype.element_ty), mask=dmask)
                tl.store(DK + bh * N * D + rows[:, None] * D + fd[None, :], dk.to(DK.dtype.element_ty), mask=dmask)
                tl.store(DVO + bh * N * DV + rows[:, None] * DV + fv[None, :], dv.to(DVO.dtype.element_ty),
                         mask=smask & (fv[None, :] < DV))
                if HAS_MASK:
                    ru = tl.load(SUMS + BHN + bh * N + rows, mask=rmask, other=0.0)
                    cl = tl.load(SUMS + 2 * BHN + bh * N + rows, mask=rmask, other=0.0)
                    tl.store(SUMS + BHN + bh * N + rows, ru + r_state, mask=rmask)
                    tl.store(SUMS + 2 * BHN + bh * N + rows, cl + c_state, mask=rmask)
            # the chunk enters the running states
            kw = k.to(tl.float32) * w_out[:, None]
            qw = q.to(tl.float32) * wq_out[:, None]
            kv = kv * decay + tl.dot(tl.trans(kw.to(k.dtype)), v, input_precision=PREC)
            kz = kz * decay + tl.sum(kw, 0)
            qd = qd * decay + tl.dot(tl.trans(qw.to(q.dtype)), dn, input_precision=PREC)
            qz = qz * decay + tl.sum(qw * dd[:, None], 0)
        if sweep == 0:
            tl.debug_barrier()
            kv = tl.zeros([BD, BDV], dtype=tl.float32)
            kz = tl.zeros([BD], dtype=tl.float32)
            qd = tl.zeros([BD, BDV], dtype=tl.float32)
            qz = tl.zeros([BD], dtype=tl.float32)


def scan_forward(q, k, v, g, normalize: bool, chunk: int = 64, num_warps: int = 4):
    """Launch the scan forward. Shapes and returns as parallel.parallel_forward."""
    B, H, N, D = q.shape
    DV = v.shape[-1]
    out = empty((B, H, N, DV), q.dtype if normalize else torch.float32, q.device)
    den = empty((B, H, N), torch.float32, q.device)
    scratch = empty((B, H, N, DV), torch.float32, q.device)
    _scan_fwd_kernel[(B * H,)](q, k, v, g if g is not None else den, out, den, scratch, N, D, DV,
                               *_strides(q, k, v), H, HAS_MASK=g is not None, NORMALIZE=normalize, C=chunk,
                               num_warps=num_warps, **_meta(q, v))
    return out, den


def scan_backward(q, k, v, g, do, zinv, delta, chunk: int = 64, num_warps: int = 8):
    """Launch the scan backward. Arguments as parallel.parallel_backward; returns dq, dk, dv, dg (None for LIT)."""
    B, H, N, D = q.shape
    DV = v.shape[-1]
    meta = _meta(q, v)
    dq = empty((B, H, N, D), q.dtype, q.device)
    dk = empty(dq.shape, q.dtype, q.device)
    dv = empty((B, H, N, DV), v.dtype, q.device)
    sums = empty((4, B, H, N), torch.float32, q.device)
    scratch = empty((B, H, N, 2 * meta["BD"] + meta["BDV"]), torch.float32, q.device)
    _scan_bwd_kernel[(B * H,)](q, k, v, g if g is not None else zinv, do, zinv, delta, dq, dk, dv, sums, scratch,
                               N, D, DV, *_strides(q, k, v), H, HAS_MASK=g is not None, C=chunk,
                               num_warps=num_warps, **meta)
    dg = gate_grad(*sums) if g is not None else None
    return dq, dk, dv, dg
