"""Triton programs of the one-scan LightNet attention (docs/spec.md 1.1-1.2), non-causal, key softmax over tokens.

Per (batch b, head h), with q, k in R^{N x d}, v, o in R^{N x e} (e = d_v), rotation tables C = cos(Theta),
Sn = sin(Theta) in R^{N x d} (prefix rows: C = 1, Sn = 0):

    q^ = SiLU(q)                      k^[n, f] = exp(k[n, f] - lse[f]),  lse[f] = log sum_n exp(k[n, f])
    q~ = [q^ C, q^ Sn]  (N x 2d)       k~ = [k^ C, k^ Sn]
    S  = k~^T v = [S_c; S_s]  (2d x e)  o = q~ S = (q^ C) S_c + (q^ Sn) S_s

Without MD-LRPE (LRPE = False) the tables are absent, S = k^^T v (d x e) and o = q^ S; every formula below
holds with C = 1 and the sin half dropped.

Two launch plans (``op._plan`` picks one):
- fused, one program per (b, h) over all N tokens: ``_fwd_fused_kernel`` (reduce, then the output pass with
  S in registers) and ``_bwd_fused_kernel`` (dq pass building dS, then the dk / dv pass with dS in
  registers). One launch each way, no S / dS round trip between passes.
- split, for few (b, h): every program owns one (b, h) and a contiguous chunk of ``tiles_per_split``
  tiles of ``BN`` tokens (axis 1 of the launch grid enumerates the chunks); the reductions over N write
  one partial per split, merged by a combine kernel over (b, h) x blocks of feature rows.
The loops over tokens are shared ``@triton.jit`` helpers, so both plans run the same arithmetic.
Statistics and accumulators are fp32; matrix products take their operands in the input dtype (LOWP) or
in fp32 at IEEE precision. The token loops' exponentials and reciprocals are single MUFU instructions (``_exp2``,
``_rcp``: PTX approximations with subnormals flushed to zero), since the loops are bound by instruction issue.

Inputs q, k, v, dO and outputs o, dq, dk, dv are addressed through (batch, head, token) strides with unit
feature stride, so strided views such as the slices of a fused qkv projection are read in place, and the
outputs can be written straight into the [B, N, H, e] / [B, N, 3, H, d] layouts of the surrounding matmuls.
On a packed qkv, small heads run G to a program as one head of width G * d (``op.head_group``): the
programs then keep S and dS block-diagonal (``_head_blocks``: constexprs HD, HDV = the real head's widths).
Workspaces (partials, lse, dS, c) are contiguous fp32, S contiguous in the input dtype (the precision its
products use), all indexed by ``pid_bh = b * H + h``.
"""

import triton
import triton.language as tl

from .._launch import interpreting

LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * LOG2E)
INTERPRETED = tl.constexpr(interpreting())  # the CPU interpreter runs no PTX: _exp2 / _rcp fall back to tl ops


@triton.jit
def _dot(a, b, LOWP: tl.constexpr, DT: tl.constexpr):
    """a @ b with fp32 accumulation; operands cast to DT (input dtype) when LOWP, else IEEE fp32."""
    if LOWP:
        return tl.dot(a.to(DT), b.to(DT))
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")


@triton.jit
def _exp2(x):
    """2^x for fp32 x as one MUFU.EX2 (PTX ex2.approx.ftz: 2 ulp, subnormal inputs and results flush to 0).
    ``tl.exp2`` lowers to ex2.approx without ftz, which adds a range test and two scalings per element."""
    if INTERPRETED:
        return tl.exp2(x)
    else:
        return tl.inline_asm_elementwise(
            "ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1
        )


@triton.jit
def _rcp(x):
    """1 / x for fp32 x as one MUFU.RCP (PTX rcp.approx.ftz: 1 ulp; 1 / inf = 0)."""
    if INTERPRETED:
        return 1.0 / x
    else:
        return tl.inline_asm_elementwise(
            "rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1
        )


@triton.jit
def _sigmoid(x):
    """sigma(x) = 1 / (1 + exp(-x)) in two MUFU operations and no range tests (``_exp2``, ``_rcp``): exact limits
    0 and 1 for large |x| (exp(-x) = inf or 0). ``tl.sigmoid`` adds range tests and scalings around both."""
    return _rcp(1.0 + _exp2(-x * LOG2E))


@triton.jit
def _pin_layout(x, anchor, BD: tl.constexpr, BDV: tl.constexpr):
    """x + 0 * anchor: x (exactly, for a finite anchor) in the register layout of ``anchor``, a matrix-product
    result. In the dq loop q^ feeds both the dS product (through shared memory) and dq (beside the dq~ product);
    left to itself the compiler keeps q, the tables and the sigmoid in two register layouts and computes them twice
    (about a quarter of the dq loop's instructions). Only for feature blocks up to 64: with 128 (8 warps) the pinned
    loop spills registers and runs slower (docs/kernels_lightnet.md, "Launch rules and their measurements")."""
    if BD <= 64 and BDV <= 64:
        x = x + anchor * 0.0
    return x


@triton.jit
def _raw_tile(ptr, rows, cols, s_n, s_f, rmask, cmask):
    """Load a [len(rows), len(cols)] tile in its own dtype (a matrix-product operand only), zero outside the masks."""
    return tl.load(ptr + rows[:, None] * s_n + cols[None, :] * s_f, mask=rmask[:, None] & cmask[None, :], other=0.0)


@triton.jit
def _tile(ptr, rows, cols, s_n, s_f, rmask, cmask):
    """Load a [len(rows), len(cols)] tile as fp32, zero outside the masks."""
    return _raw_tile(ptr, rows, cols, s_n, s_f, rmask, cmask).to(tl.float32)


@triton.jit
def _load_pair(ptr, offs_r, D, DV, BDV: tl.constexpr, LRPE: tl.constexpr):
    """Rows ``offs_r`` (< d) of the two d x e halves (rows f and d + f) of one [R, e] matrix (S in the input
    dtype, dS in fp32), as stored; the second is the first again without LRPE. The split partials are read many
    splits at a time by ``_load_partials``."""
    offs_e = tl.arange(0, BDV)
    off = offs_r[:, None] * DV + offs_e[None, :]
    mask = (offs_r < D)[:, None] & (offs_e < DV)[None, :]
    a = tl.load(ptr + off, mask=mask, other=0.0)
    b = a
    if LRPE:
        b = tl.load(ptr + D * DV + off, mask=mask, other=0.0)
    return a, b


@triton.jit
def _store_pair(ptr, offs_r, a, b, D, DV, BDV: tl.constexpr, LRPE: tl.constexpr):
    """Store rows ``offs_r`` of the halves of an [R, e] matrix, cast to its dtype (see ``_load_pair``)."""
    offs_e = tl.arange(0, BDV)
    off = offs_r[:, None] * DV + offs_e[None, :]
    mask = (offs_r < D)[:, None] & (offs_e < DV)[None, :]
    tl.store(ptr + off, a, mask=mask)
    if LRPE:
        tl.store(ptr + D * DV + off, b, mask=mask)


@triton.jit
def _operand(x, LOWP: tl.constexpr, DT: tl.constexpr):
    """x as a matrix-product operand (cast once, outside the token loops)."""
    if LOWP:
        return x.to(DT)
    else:
        return x


@triton.jit
def _head_blocks(x, BD: tl.constexpr, BDV: tl.constexpr, HD: tl.constexpr, HDV: tl.constexpr):
    """x [BD, BDV] (a d x e half of S, dS or a partial) for a program that runs G heads side by side as one head
    of width d = G * HD (HD > 0): zero outside the diagonal HD x HDV blocks, so each head keeps its own
    k~^T v. HD = 0: one head per program, x unchanged."""
    if HD > 0:
        f = tl.arange(0, BD) // HD
        e = tl.arange(0, BDV) // HDV
        x = tl.where(f[:, None] == e[None, :], x, 0.0)
    return x


@triton.jit
def _col_max(k_base, lo, hi, D, s_kn, s_kd, BN: tl.constexpr, BD: tl.constexpr):
    """m[f] = max over tokens [lo, hi) of k[n, f]: an elementwise running max tile, reduced across threads once
    (0 for padded features)."""
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    dmask = offs_d < D
    mt = tl.full([BN, BD], float("-inf"), tl.float32)
    for n0 in tl.range(lo, hi, BN, num_stages=3):  # the loads pipelined (cp.async) as in the loops with products
        rows = n0 + offs_n
        nmask = rows < hi
        kt = _tile(k_base, rows, offs_d, s_kn, s_kd, nmask, dmask)
        mt = tl.maximum(mt, tl.where(nmask[:, None], kt, float("-inf")))
    return tl.max(mt, axis=0)


@triton.jit
def _reduce_loop(
    k_base, v_base, cos_ptr, sin_ptr, lo, hi, D, DV,
    s_kn, s_kd, s_vn, s_vd,
    BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, LRPE: tl.constexpr, LOWP: tl.constexpr, DT: tl.constexpr,
    HD: tl.constexpr, HDV: tl.constexpr,
):  # fmt: skip
    """Tokens [lo, hi): per-feature softmax statistics of k, m[f] = max_n k, z[f] = sum_n exp(k - m), and the
    exp(k - m)-weighted rotated k^T v, A = [exp(k - m) C, exp(k - m) Sn]^T v as two d x e halves.

    m comes from a first pass over k (``_col_max``; the chunk's k is then re-read from L2), so the main pass
    has no running rescale and no reduction across threads per tile. The products accumulate A^T = v^T [p C]
    (e x d), so v is a transposed shared-memory operand as loaded and p C goes to shared memory once, with no
    layout conversion for a transposed register operand (measured on an H100: docs/kernels_lightnet.md)."""
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    offs_e = tl.arange(0, BDV)
    dmask = offs_d < D
    emask = offs_e < DV
    m = _col_max(k_base, lo, hi, D, s_kn, s_kd, BN, BD)
    mlog = m * LOG2E
    zt = tl.zeros([BN, BD], tl.float32)
    acc_c = tl.zeros([BDV, BD], tl.float32)
    acc_s = tl.zeros([BDV, BD], tl.float32)
    for n0 in range(lo, hi, BN):
        rows = n0 + offs_n
        nmask = rows < hi
        kt = _tile(k_base, rows, offs_d, s_kn, s_kd, nmask, dmask)
        p = tl.where(nmask[:, None], _exp2(kt * LOG2E - mlog[None, :]), 0.0)
        zt += p
        vt = _raw_tile(v_base, rows, offs_e, s_vn, s_vd, nmask, emask)
        if LRPE:
            ct = _tile(cos_ptr, rows, offs_d, D, 1, nmask, dmask)
            st = _tile(sin_ptr, rows, offs_d, D, 1, nmask, dmask)
            acc_c += _dot(tl.trans(vt), p * ct, LOWP, DT)
            acc_s += _dot(tl.trans(vt), p * st, LOWP, DT)
        else:
            acc_c += _dot(tl.trans(vt), p, LOWP, DT)
    acc_c = _head_blocks(tl.trans(acc_c), BD, BDV, HD, HDV)
    acc_s = _head_blocks(tl.trans(acc_s), BD, BDV, HD, HDV)
    return m, tl.sum(zt, axis=0), acc_c, acc_s


@triton.jit
def _out_loop(
    q_base, o_base, cos_ptr, sin_ptr,
    s_c, s_s,
    lo, hi, D, DV,
    s_qn, s_qd, s_on,
    BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, LRPE: tl.constexpr, LOWP: tl.constexpr, DT: tl.constexpr,
):  # fmt: skip
    """Tokens [lo, hi): o = (q^ C) S_c + (q^ Sn) S_s with q^ = SiLU(q), rotated on the fly; o rows s_on apart."""
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    offs_e = tl.arange(0, BDV)
    dmask = offs_d < D
    emask = offs_e < DV
    for n0 in range(lo, hi, BN):
        rows = n0 + offs_n
        nmask = rows < hi
        qt = _tile(q_base, rows, offs_d, s_qn, s_qd, nmask, dmask)
        qh = qt * _sigmoid(qt)
        if LRPE:
            ct = _tile(cos_ptr, rows, offs_d, D, 1, nmask, dmask)
            st = _tile(sin_ptr, rows, offs_d, D, 1, nmask, dmask)
            ot = _dot(qh * ct, s_c, LOWP, DT) + _dot(qh * st, s_s, LOWP, DT)
        else:
            ot = _dot(qh, s_c, LOWP, DT)
        tl.store(
            o_base + rows[:, None] * s_on + offs_e[None, :],
            ot.to(o_base.dtype.element_ty),
            mask=nmask[:, None] & emask[None, :],
        )


@triton.jit
def _dq_loop(
    q_base, g_base, dq_base, cos_ptr, sin_ptr,
    s_c, s_s,
    lo, hi, D, DV,
    s_qn, s_qd, s_gn, s_gd, s_dqn,
    BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, LRPE: tl.constexpr, LOWP: tl.constexpr, DT: tl.constexpr,
    HD: tl.constexpr, HDV: tl.constexpr,
):  # fmt: skip
    """Tokens [lo, hi) of backward pass 1 (reads q, dO; writes dq, rows s_dqn apart); returns the halves of
    dS = q~^T dO = [(q^ C)^T dO; (q^ Sn)^T dO] over these tokens:

        dq~ = dO S^T,  dq^ = dq~_c C + dq~_s Sn,  dq = dq^ * sigma(q) (1 + q (1 - sigma(q)))   (SiLU')

    dS accumulates transposed, dS^T += dO^T (q^ C), so dO is a transposed shared-memory operand as loaded
    (faster than the untransposed form: docs/kernels_lightnet.md, "Launch rules and their measurements")."""
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    offs_e = tl.arange(0, BDV)
    dmask = offs_d < D
    emask = offs_e < DV
    ds_c = tl.zeros([BDV, BD], tl.float32)
    ds_s = tl.zeros([BDV, BD], tl.float32)
    for n0 in range(lo, hi, BN):
        rows = n0 + offs_n
        nmask = rows < hi
        qt = _tile(q_base, rows, offs_d, s_qn, s_qd, nmask, dmask)
        gt = _raw_tile(g_base, rows, offs_e, s_gn, s_gd, nmask, emask)
        sig = _sigmoid(qt)
        if LRPE:
            ct = _tile(cos_ptr, rows, offs_d, D, 1, nmask, dmask)
            st = _tile(sin_ptr, rows, offs_d, D, 1, nmask, dmask)
            dqh = _dot(gt, tl.trans(s_c), LOWP, DT) * ct + _dot(gt, tl.trans(s_s), LOWP, DT) * st
            qh = _pin_layout(qt * sig, dqh, BD, BDV)
            ds_c += _dot(tl.trans(gt), qh * ct, LOWP, DT)
            ds_s += _dot(tl.trans(gt), qh * st, LOWP, DT)
        else:
            dqh = _dot(gt, tl.trans(s_c), LOWP, DT)
            ds_c += _dot(tl.trans(gt), _pin_layout(qt * sig, dqh, BD, BDV), LOWP, DT)
        dq = dqh * sig * (1.0 + qt * (1.0 - sig))
        tl.store(
            dq_base + rows[:, None] * s_dqn + offs_d[None, :],
            dq.to(dq_base.dtype.element_ty),
            mask=nmask[:, None] & dmask[None, :],
        )
    return _head_blocks(tl.trans(ds_c), BD, BDV, HD, HDV), _head_blocks(tl.trans(ds_s), BD, BDV, HD, HDV)


@triton.jit
def _dkdv_loop(
    k_base, v_base, dk_base, dv_base, cos_ptr, sin_ptr, lse, corr, ds_c, ds_s, lo, hi, D, DV,
    s_kn, s_kd, s_vn, s_vd, s_dkn, s_dvn,
    BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, LRPE: tl.constexpr, LOWP: tl.constexpr, DT: tl.constexpr,
):  # fmt: skip
    """Tokens [lo, hi) of backward pass 2 (reads k, v; writes dk, dv, rows s_dkn / s_dvn apart), k^ = exp(k - lse):

    dv = k~ dS = (k^ C) dS_c + (k^ Sn) dS_s
    G  = (v dS_c^T) C + (v dS_s^T) Sn           (= dL/dk^)
    dk = k^ * (G - c[None, :])                  (softmax over tokens; c from ``_correction``)"""
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    offs_e = tl.arange(0, BDV)
    dmask = offs_d < D
    emask = offs_e < DV
    lse2 = lse * LOG2E
    for n0 in range(lo, hi, BN):
        rows = n0 + offs_n
        nmask = rows < hi
        kt = _tile(k_base, rows, offs_d, s_kn, s_kd, nmask, dmask)
        vt = _tile(v_base, rows, offs_e, s_vn, s_vd, nmask, emask)
        kh = _exp2(kt * LOG2E - lse2[None, :])
        if LRPE:
            ct = _tile(cos_ptr, rows, offs_d, D, 1, nmask, dmask)
            st = _tile(sin_ptr, rows, offs_d, D, 1, nmask, dmask)
            dvt = _dot(kh * ct, ds_c, LOWP, DT) + _dot(kh * st, ds_s, LOWP, DT)
            g = _dot(vt, tl.trans(ds_c), LOWP, DT) * ct + _dot(vt, tl.trans(ds_s), LOWP, DT) * st
        else:
            dvt = _dot(kh, ds_c, LOWP, DT)
            g = _dot(vt, tl.trans(ds_c), LOWP, DT)
        dkt = kh * (g - corr[None, :])
        tl.store(
            dk_base + rows[:, None] * s_dkn + offs_d[None, :],
            dkt.to(dk_base.dtype.element_ty),
            mask=nmask[:, None] & dmask[None, :],
        )
        tl.store(
            dv_base + rows[:, None] * s_dvn + offs_e[None, :],
            dvt.to(dv_base.dtype.element_ty),
            mask=nmask[:, None] & emask[None, :],
        )


@triton.jit
def _correction(ds_c, ds_s, s_ptr, offs_r, D, DV, BDV: tl.constexpr, LRPE: tl.constexpr):
    """Softmax correction c[f] = sum_j dS_c[f, j] S_c[f, j] + dS_s[f, j] S_s[f, j] for the rows f in ``offs_r``
    (fp32 products with the stored S; see ``lightvision.kernels.lightnet.op`` for the derivation)."""
    s_c, s_s = _load_pair(s_ptr, offs_r, D, DV, BDV, LRPE)
    corr = tl.sum(ds_c * s_c, axis=1)
    if LRPE:
        corr += tl.sum(ds_s * s_s, axis=1)
    return corr


@triton.jit
def _fwd_fused_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, s_ptr, lse_ptr, o_ptr, H, N,
    D: tl.constexpr, DV: tl.constexpr,
    s_qb, s_qh, s_qn, s_qd, s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd, s_ob, s_oh, s_on,
    BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, LRPE: tl.constexpr, LOWP: tl.constexpr, HD: tl.constexpr,
    HDV: tl.constexpr,
):  # fmt: skip
    """Whole forward of one (b, h): reduce k, v to S = A / z and lse = m + log z (both stored for the
    backward), then o = q~ S with S kept in registers."""
    pid_bh = tl.program_id(0)
    b = pid_bh // H
    h = pid_bh % H
    DT = v_ptr.dtype.element_ty
    m, z, acc_c, acc_s = _reduce_loop(
        k_ptr + b * s_kb + h * s_kh, v_ptr + b * s_vb + h * s_vh, cos_ptr, sin_ptr, 0, N, D, DV,
        s_kn, s_kd, s_vn, s_vd,
        BN, BD, BDV, LRPE, LOWP, DT, HD, HDV,
    )  # fmt: skip
    offs_d = tl.arange(0, BD)
    inv = 1.0 / z
    tl.store(lse_ptr + pid_bh * D + offs_d, m + tl.log(z), mask=offs_d < D)
    s_c = acc_c * inv[:, None]
    s_s = acc_s * inv[:, None]
    R = 2 * D if LRPE else D
    _store_pair(s_ptr + pid_bh * R * DV, tl.arange(0, BD), s_c, s_s, D, DV, BDV, LRPE)
    _out_loop(
        q_ptr + b * s_qb + h * s_qh, o_ptr + b * s_ob + h * s_oh, cos_ptr, sin_ptr,
        _operand(s_c, LOWP, DT), _operand(s_s, LOWP, DT),
        0, N, D, DV,
        s_qn, s_qd, s_on,
        BN, BD, BDV, LRPE, LOWP, DT,
    )  # fmt: skip


@triton.jit
def _fwd_reduce_kernel(
    k_ptr, v_ptr, cos_ptr, sin_ptr, pm_ptr, pz_ptr, ps_ptr, H, N,
    D: tl.constexpr, DV: tl.constexpr,
    tiles_per_split,
    s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd,
    BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, LRPE: tl.constexpr, LOWP: tl.constexpr, HD: tl.constexpr,
    HDV: tl.constexpr,
):  # fmt: skip
    """Split plan, forward pass 1 over one chunk: the partials m, z -> pm / pz [BH, splits, d] and
    A -> ps [BH, splits, R, e] (R = 2d with LRPE, else d)."""
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    lo = pid_s * tiles_per_split * BN
    hi = tl.minimum(N, lo + tiles_per_split * BN)
    m, z, acc_c, acc_s = _reduce_loop(
        k_ptr + b * s_kb + h * s_kh, v_ptr + b * s_vb + h * s_vh, cos_ptr, sin_ptr, lo, hi, D, DV,
        s_kn, s_kd, s_vn, s_vd,
        BN, BD, BDV, LRPE, LOWP, v_ptr.dtype.element_ty, HD, HDV,
    )  # fmt: skip
    row = pid_bh * tl.num_programs(1) + pid_s
    offs_d = tl.arange(0, BD)
    tl.store(pm_ptr + row * D + offs_d, m, mask=offs_d < D)
    tl.store(pz_ptr + row * D + offs_d, z, mask=offs_d < D)
    R = 2 * D if LRPE else D
    _store_pair(ps_ptr + row * R * DV, tl.arange(0, BD), acc_c, acc_s, D, DV, BDV, LRPE)


@triton.jit
def _load_partials(ptr, rows, smask, offs_r, D, DV, BDV: tl.constexpr, LRPE: tl.constexpr):
    """Feature rows ``offs_r`` (< d) of the two halves of the [R, e] partials (fp32) of the splits whose rows in the
    partial buffers are ``rows`` (``smask``: real splits), as two [len(rows), len(offs_r), BDV] tiles (0 outside)."""
    offs_e = tl.arange(0, BDV)
    R = 2 * D if LRPE else D
    off = rows[:, None, None] * R * DV + offs_r[None, :, None] * DV + offs_e[None, None, :]
    mask = smask[:, None, None] & (offs_r < D)[None, :, None] & (offs_e < DV)[None, None, :]
    a = tl.load(ptr + off, mask=mask, other=0.0)
    b = a
    if LRPE:
        b = tl.load(ptr + D * DV + off, mask=mask, other=0.0)
    return a, b


@triton.jit
def _fwd_combine_kernel(
    pm_ptr, pz_ptr, ps_ptr, s_ptr, lse_ptr,
    D: tl.constexpr, DV: tl.constexpr,
    nsplit,
    BR: tl.constexpr, BDV: tl.constexpr, LRPE: tl.constexpr, SB: tl.constexpr,
):  # fmt: skip
    """Merge the split partials of one (b, h), feature rows [BR * program_id(1), + BR): M = max_s m_s,
    w_s = exp(m_s - M), Z = sum_s w_s z_s, S = sum_s w_s A_s / Z (per feature row f, both halves),
    lse = M + log Z. Rows are independent, so the (b, h) is spread over d / BR programs; the splits are read SB at
    a time, as one tile each (a loop of one split per step waits on each load in turn)."""
    pid_bh = tl.program_id(0)
    offs_r = tl.program_id(1) * BR + tl.arange(0, BR)
    offs_s = tl.arange(0, SB)
    rmask = offs_r < D
    R = 2 * D if LRPE else D
    m = tl.full([BR], float("-inf"), tl.float32)
    z = tl.zeros([BR], tl.float32)
    acc_c = tl.zeros([BR, BDV], tl.float32)
    acc_s = tl.zeros([BR, BDV], tl.float32)
    for s0 in range(0, nsplit, SB):
        smask = s0 + offs_s < nsplit
        rows = pid_bh * nsplit + s0 + offs_s
        off = rows[:, None] * D + offs_r[None, :]
        mask = smask[:, None] & rmask[None, :]
        m_s = tl.where(smask[:, None], tl.load(pm_ptr + off, mask=mask, other=0.0), float("-inf"))
        z_s = tl.load(pz_ptr + off, mask=mask, other=1.0)  # padded rows: z = 1, not 1 / 0 (masked splits: w = 0)
        m_new = tl.maximum(m, tl.max(m_s, axis=0))
        alpha = tl.exp(m - m_new)
        w = tl.exp(m_s - m_new[None, :])
        z = z * alpha + tl.sum(w * z_s, axis=0)
        part_c, part_s = _load_partials(ps_ptr, rows, smask, offs_r, D, DV, BDV, LRPE)
        acc_c = acc_c * alpha[:, None] + tl.sum(w[:, :, None] * part_c, axis=0)
        acc_s = acc_s * alpha[:, None] + tl.sum(w[:, :, None] * part_s, axis=0)
        m = m_new
    inv = 1.0 / z
    tl.store(lse_ptr + pid_bh * D + offs_r, m + tl.log(z), mask=rmask)
    _store_pair(s_ptr + pid_bh * R * DV, offs_r, acc_c * inv[:, None], acc_s * inv[:, None], D, DV, BDV, LRPE)


@triton.jit
def _fwd_out_kernel(
    q_ptr, cos_ptr, sin_ptr, s_ptr, o_ptr, H, N,
    D: tl.constexpr, DV: tl.constexpr,
    tiles_per_split,
    s_qb, s_qh, s_qn, s_qd, s_ob, s_oh, s_on,
    BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, LRPE: tl.constexpr, LOWP: tl.constexpr, HD: tl.constexpr,
    HDV: tl.constexpr,
):  # fmt: skip
    """Split plan, forward pass 2 over one chunk: o = q~ S."""
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    DT = q_ptr.dtype.element_ty
    R = 2 * D if LRPE else D
    s_c, s_s = _load_pair(s_ptr + pid_bh * R * DV, tl.arange(0, BD), D, DV, BDV, LRPE)
    lo = pid_s * tiles_per_split * BN
    hi = tl.minimum(N, lo + tiles_per_split * BN)
    _out_loop(
        q_ptr + b * s_qb + h * s_qh, o_ptr + b * s_ob + h * s_oh, cos_ptr, sin_ptr,
        _operand(s_c, LOWP, DT), _operand(s_s, LOWP, DT),
        lo, hi, D, DV,
        s_qn, s_qd, s_on,
        BN, BD, BDV, LRPE, LOWP, DT,
    )  # fmt: skip


@triton.jit
def _bwd_fused_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, cos_ptr, sin_ptr, s_ptr, lse_ptr, dq_ptr, dk_ptr, dv_ptr, H, N,
    D: tl.constexpr, DV: tl.constexpr,
    s_qb, s_qh, s_qn, s_qd, s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd, s_gb, s_gh, s_gn, s_gd, s_dqb, s_dqh, s_dqn,
    s_dkb, s_dkh, s_dkn, s_dvb, s_dvh, s_dvn,
    BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, LRPE: tl.constexpr, LOWP: tl.constexpr, HD: tl.constexpr,
    HDV: tl.constexpr,
):  # fmt: skip
    """Whole backward of one (b, h): the dq pass over q, dO builds dS, then c = rowsum(dS * S), then the
    dk / dv pass over k, v with dS and c in registers."""
    pid_bh = tl.program_id(0)
    b = pid_bh // H
    h = pid_bh % H
    DT = do_ptr.dtype.element_ty
    R = 2 * D if LRPE else D
    s_base = s_ptr + pid_bh * R * DV
    s_c, s_s = _load_pair(s_base, tl.arange(0, BD), D, DV, BDV, LRPE)
    ds_c, ds_s = _dq_loop(
        q_ptr + b * s_qb + h * s_qh, do_ptr + b * s_gb + h * s_gh, dq_ptr + b * s_dqb + h * s_dqh, cos_ptr, sin_ptr,
        _operand(s_c, LOWP, DT), _operand(s_s, LOWP, DT),
        0, N, D, DV,
        s_qn, s_qd, s_gn, s_gd, s_dqn,
        BN, BD, BDV, LRPE, LOWP, DT, HD, HDV,
    )  # fmt: skip
    corr = _correction(ds_c, ds_s, s_base, tl.arange(0, BD), D, DV, BDV, LRPE)
    offs_d = tl.arange(0, BD)
    lse = tl.load(lse_ptr + pid_bh * D + offs_d, mask=offs_d < D, other=0.0)
    _dkdv_loop(
        k_ptr + b * s_kb + h * s_kh, v_ptr + b * s_vb + h * s_vh, dk_ptr + b * s_dkb + h * s_dkh,
        dv_ptr + b * s_dvb + h * s_dvh, cos_ptr, sin_ptr, lse, corr, _operand(ds_c, LOWP, DT), _operand(ds_s, LOWP, DT),
        0, N, D, DV,
        s_kn, s_kd, s_vn, s_vd, s_dkn, s_dvn,
        BN, BD, BDV, LRPE, LOWP, DT,
    )  # fmt: skip


@triton.jit
def _bwd_dq_kernel(
    q_ptr, do_ptr, cos_ptr, sin_ptr, s_ptr, dq_ptr, pds_ptr, H, N,
    D: tl.constexpr, DV: tl.constexpr,
    tiles_per_split,
    s_qb, s_qh, s_qn, s_qd, s_gb, s_gh, s_gn, s_gd, s_dqb, s_dqh, s_dqn,
    BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, LRPE: tl.constexpr, LOWP: tl.constexpr, HD: tl.constexpr,
    HDV: tl.constexpr,
):  # fmt: skip
    """Split plan, backward pass 1 over one chunk: dq, and the partial dS -> pds [BH, splits, R, e]."""
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    DT = do_ptr.dtype.element_ty
    R = 2 * D if LRPE else D
    s_c, s_s = _load_pair(s_ptr + pid_bh * R * DV, tl.arange(0, BD), D, DV, BDV, LRPE)
    lo = pid_s * tiles_per_split * BN
    hi = tl.minimum(N, lo + tiles_per_split * BN)
    ds_c, ds_s = _dq_loop(
        q_ptr + b * s_qb + h * s_qh, do_ptr + b * s_gb + h * s_gh, dq_ptr + b * s_dqb + h * s_dqh, cos_ptr, sin_ptr,
        _operand(s_c, LOWP, DT), _operand(s_s, LOWP, DT),
        lo, hi, D, DV,
        s_qn, s_qd, s_gn, s_gd, s_dqn,
        BN, BD, BDV, LRPE, LOWP, DT, HD, HDV,
    )  # fmt: skip
    _store_pair(
        pds_ptr + (pid_bh * tl.num_programs(1) + pid_s) * R * DV, tl.arange(0, BD), ds_c, ds_s, D, DV, BDV, LRPE
    )


@triton.jit
def _bwd_combine_kernel(
    pds_ptr, s_ptr, ds_ptr, c_ptr,
    D: tl.constexpr, DV: tl.constexpr,
    nsplit,
    BR: tl.constexpr, BDV: tl.constexpr, LRPE: tl.constexpr, SB: tl.constexpr,
):  # fmt: skip
    """dS = sum_s dS_s over the splits of one (b, h) (SB at a time, as in ``_fwd_combine_kernel``) and the
    correction c (``_correction``), feature rows [BR * program_id(1), + BR)."""
    pid_bh = tl.program_id(0)
    offs_r = tl.program_id(1) * BR + tl.arange(0, BR)
    offs_s = tl.arange(0, SB)
    R = 2 * D if LRPE else D
    ds_c = tl.zeros([BR, BDV], tl.float32)
    ds_s = tl.zeros([BR, BDV], tl.float32)
    for s0 in range(0, nsplit, SB):
        part_c, part_s = _load_partials(
            pds_ptr, pid_bh * nsplit + s0 + offs_s, s0 + offs_s < nsplit, offs_r, D, DV, BDV, LRPE
        )
        ds_c += tl.sum(part_c, axis=0)
        ds_s += tl.sum(part_s, axis=0)
    _store_pair(ds_ptr + pid_bh * R * DV, offs_r, ds_c, ds_s, D, DV, BDV, LRPE)
    corr = _correction(ds_c, ds_s, s_ptr + pid_bh * R * DV, offs_r, D, DV, BDV, LRPE)
    tl.store(c_ptr + pid_bh * D + offs_r, corr, mask=offs_r < D)


@triton.jit
def _bwd_dkdv_kernel(
    k_ptr, v_ptr, cos_ptr, sin_ptr, lse_ptr, ds_ptr, c_ptr, dk_ptr, dv_ptr, H, N,
    D: tl.constexpr, DV: tl.constexpr,
    tiles_per_split,
    s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd, s_dkb, s_dkh, s_dkn, s_dvb, s_dvh, s_dvn,
    BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, LRPE: tl.constexpr, LOWP: tl.constexpr, HD: tl.constexpr,
    HDV: tl.constexpr,
):  # fmt: skip
    """Split plan, backward pass 2 over one chunk: dk, dv from the combined dS and c."""
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    DT = v_ptr.dtype.element_ty
    R = 2 * D if LRPE else D
    ds_c, ds_s = _load_pair(ds_ptr + pid_bh * R * DV, tl.arange(0, BD), D, DV, BDV, LRPE)
    offs_d = tl.arange(0, BD)
    lse = tl.load(lse_ptr + pid_bh * D + offs_d, mask=offs_d < D, other=0.0)
    corr = tl.load(c_ptr + pid_bh * D + offs_d, mask=offs_d < D, other=0.0)
    lo = pid_s * tiles_per_split * BN
    hi = tl.minimum(N, lo + tiles_per_split * BN)
    _dkdv_loop(
        k_ptr + b * s_kb + h * s_kh, v_ptr + b * s_vb + h * s_vh, dk_ptr + b * s_dkb + h * s_dkh,
        dv_ptr + b * s_dvb + h * s_dvh, cos_ptr, sin_ptr, lse, corr, _operand(ds_c, LOWP, DT), _operand(ds_s, LOWP, DT),
        lo, hi, D, DV,
        s_kn, s_kd, s_vn, s_vd, s_dkn, s_dvn,
        BN, BD, BDV, LRPE, LOWP, DT,
    )  # fmt: skip
