"""Triton programs of the one-scan LightNet attention (SPEC 1.1-1.2), non-causal, key softmax over tokens.

Per (batch b, head h), with q, k in R^{N x d}, v, o in R^{N x e} (e = d_v), rotation tables C = cos(Theta),
Sn = sin(Theta) in R^{N x d} (prefix rows: C = 1, Sn = 0):

    q^ = SiLU(q)                      k^[n, f] = exp(k[n, f] - lse[f]),  lse[f] = log sum_n exp(k[n, f])
    q~ = [q^ C, q^ Sn]  (N x 2d)       k~ = [k^ C, k^ Sn]
    S  = k~^T v = [S_c; S_s]  (2d x e)  o = q~ S = (q^ C) S_c + (q^ Sn) S_s

Without MD-LRPE (LRPE = False) the tables are absent, S = k^^T v (d x e) and o = q^ S; every formula below
holds with C = 1 and the sin half dropped.

Every program owns one (b, h) and a contiguous chunk of token tiles (``tiles_per_split`` tiles of ``BN``
tokens); axis 1 of the launch grid enumerates the chunks ("splits"). Reductions over N write one partial
per split; a one-program-per-(b, h) combine kernel merges them. With a single split the reducing kernel
finalises directly (SINGLE) and the combine launch is skipped. Statistics and accumulators are fp32;
matrix products take their operands in the input dtype (LOWP) or in fp32 at IEEE precision.

Tensor arguments are addressed through (batch, head, token, feature) strides, so strided views such as
the slices of a fused qkv projection are read in place. Workspaces (partials, S, lse, dS, c) are
contiguous fp32 indexed by ``pid_bh = b * H + h``.
"""

import triton
import triton.language as tl


@triton.jit
def _dot(a, b, LOWP: tl.constexpr, DT: tl.constexpr):
    """a @ b with fp32 accumulation; operands cast to DT (input dtype) when LOWP, else IEEE fp32."""
    if LOWP:
        return tl.dot(a.to(DT), b.to(DT))
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")


@triton.jit
def _tile(ptr, rows, cols, s_n, s_f, rmask, cmask):
    """Load a [len(rows), len(cols)] tile as fp32, zero outside the masks."""
    return tl.load(ptr + rows[:, None] * s_n + cols[None, :] * s_f,
                   mask=rmask[:, None] & cmask[None, :], other=0.0).to(tl.float32)


@triton.jit
def _fwd_reduce_kernel(
    k_ptr, v_ptr, cos_ptr, sin_ptr,
    pm_ptr, pz_ptr, ps_ptr, s_ptr, lse_ptr,
    H, N, D, DV, tiles_per_split,
    s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd,
    BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
    LRPE: tl.constexpr, SINGLE: tl.constexpr, LOWP: tl.constexpr,
):
    """Pass 1 of the forward over one chunk of tokens: online per-feature softmax statistics of k and
    the exp(k - m)-weighted, rotated k^T v.

    Partials of split s (m[f] = max_n k, z[f] = sum_n exp(k - m), A = sum_n [exp(k - m) C, exp(k - m) Sn]^T v)
    go to pm/pz [BH, splits, d] and ps [BH, splits, R, e] (R = 2d with LRPE, else d). With SINGLE the
    program writes S = A / z (rows f and d + f divided by z[f]) to s [BH, R, e] and lse = m + log z."""
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    nsplit = tl.num_programs(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    offs_e = tl.arange(0, BDV)
    dmask = offs_d < D
    emask = offs_e < DV
    k_base = k_ptr + b * s_kb + h * s_kh
    v_base = v_ptr + b * s_vb + h * s_vh
    DT = v_ptr.dtype.element_ty

    m = tl.full([BD], float("-inf"), tl.float32)
    z = tl.zeros([BD], tl.float32)
    acc_c = tl.zeros([BD, BDV], tl.float32)
    acc_s = tl.zeros([BD, BDV], tl.float32)
    lo = pid_s * tiles_per_split * BN
    hi = tl.minimum(N, lo + tiles_per_split * BN)
    for n0 in range(lo, hi, BN):
        rows = n0 + offs_n
        nmask = rows < N
        kt = _tile(k_base, rows, offs_d, s_kn, s_kd, nmask, dmask)
        kt = tl.where(nmask[:, None], kt, float("-inf"))
        vt = _tile(v_base, rows, offs_e, s_vn, s_vd, nmask, emask)
        m_new = tl.maximum(m, tl.max(kt, axis=0))
        alpha = tl.exp(m - m_new)
        p = tl.exp(kt - m_new[None, :])
        z = z * alpha + tl.sum(p, axis=0)
        if LRPE:
            ct = _tile(cos_ptr, rows, offs_d, D, 1, nmask, dmask)
            st = _tile(sin_ptr, rows, offs_d, D, 1, nmask, dmask)
            acc_c = acc_c * alpha[:, None] + _dot(tl.trans(p * ct), vt, LOWP, DT)
            acc_s = acc_s * alpha[:, None] + _dot(tl.trans(p * st), vt, LOWP, DT)
        else:
            acc_c = acc_c * alpha[:, None] + _dot(tl.trans(p), vt, LOWP, DT)
        m = m_new

    R = 2 * D if LRPE else D
    tile_off = offs_d[:, None] * DV + offs_e[None, :]
    tile_mask = dmask[:, None] & emask[None, :]
    if SINGLE:
        inv = 1.0 / z
        tl.store(lse_ptr + pid_bh * D + offs_d, m + tl.log(z), mask=dmask)
        out = s_ptr + pid_bh * R * DV
        tl.store(out + tile_off, acc_c * inv[:, None], mask=tile_mask)
        if LRPE:
            tl.store(out + D * DV + tile_off, acc_s * inv[:, None], mask=tile_mask)
    else:
        row = pid_bh * nsplit + pid_s
        tl.store(pm_ptr + row * D + offs_d, m, mask=dmask)
        tl.store(pz_ptr + row * D + offs_d, z, mask=dmask)
        out = ps_ptr + row * R * DV
        tl.store(out + tile_off, acc_c, mask=tile_mask)
        if LRPE:
            tl.store(out + D * DV + tile_off, acc_s, mask=tile_mask)


@triton.jit
def _fwd_combine_kernel(
    pm_ptr, pz_ptr, ps_ptr, s_ptr, lse_ptr, D, DV, nsplit,
    BD: tl.constexpr, BDV: tl.constexpr, LRPE: tl.constexpr,
):
    """Merge the split partials of one (b, h): M = max_s m_s, w_s = exp(m_s - M), Z = sum_s w_s z_s,
    S = sum_s w_s A_s / Z (per feature row f, both halves), lse = M + log Z."""
    pid_bh = tl.program_id(0)
    offs_d = tl.arange(0, BD)
    offs_e = tl.arange(0, BDV)
    dmask = offs_d < D
    tile_off = offs_d[:, None] * DV + offs_e[None, :]
    tile_mask = dmask[:, None] & (offs_e < DV)[None, :]
    R = 2 * D if LRPE else D
    m = tl.full([BD], float("-inf"), tl.float32)
    z = tl.zeros([BD], tl.float32)
    acc_c = tl.zeros([BD, BDV], tl.float32)
    acc_s = tl.zeros([BD, BDV], tl.float32)
    for s in range(0, nsplit):
        row = pid_bh * nsplit + s
        m_s = tl.load(pm_ptr + row * D + offs_d, mask=dmask, other=0.0)
        z_s = tl.load(pz_ptr + row * D + offs_d, mask=dmask, other=1.0)
        m_new = tl.maximum(m, m_s)
        alpha = tl.exp(m - m_new)
        w = tl.exp(m_s - m_new)
        z = z * alpha + z_s * w
        part = ps_ptr + row * R * DV
        acc_c = acc_c * alpha[:, None] + tl.load(part + tile_off, mask=tile_mask, other=0.0) * w[:, None]
        if LRPE:
            acc_s = acc_s * alpha[:, None] + tl.load(part + D * DV + tile_off, mask=tile_mask,
                                                     other=0.0) * w[:, None]
        m = m_new
    inv = 1.0 / z
    tl.store(lse_ptr + pid_bh * D + offs_d, m + tl.log(z), mask=dmask)
    out = s_ptr + pid_bh * R * DV
    tl.store(out + tile_off, acc_c * inv[:, None], mask=tile_mask)
    if LRPE:
        tl.store(out + D * DV + tile_off, acc_s * inv[:, None], mask=tile_mask)


@triton.jit
def _fwd_out_kernel(
    q_ptr, cos_ptr, sin_ptr, s_ptr, o_ptr,
    H, N, D, DV, tiles_per_split,
    s_qb, s_qh, s_qn, s_qd, s_ob, s_oh, s_on, s_od,
    BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
    LRPE: tl.constexpr, LOWP: tl.constexpr,
):
    """Pass 2 of the forward: o = (q^ C) S_c + (q^ Sn) S_s with q^ = SiLU(q), rotated on the fly."""
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    offs_e = tl.arange(0, BDV)
    dmask = offs_d < D
    emask = offs_e < DV
    q_base = q_ptr + b * s_qb + h * s_qh
    o_base = o_ptr + b * s_ob + h * s_oh
    DT = q_ptr.dtype.element_ty
    R = 2 * D if LRPE else D
    s_base = s_ptr + pid_bh * R * DV
    tile_off = offs_d[:, None] * DV + offs_e[None, :]
    tile_mask = dmask[:, None] & emask[None, :]
    s_c = tl.load(s_base + tile_off, mask=tile_mask, other=0.0)
    s_s = s_c
    if LRPE:
        s_s = tl.load(s_base + D * DV + tile_off, mask=tile_mask, other=0.0)
    lo = pid_s * tiles_per_split * BN
    hi = tl.minimum(N, lo + tiles_per_split * BN)
    for n0 in range(lo, hi, BN):
        rows = n0 + offs_n
        nmask = rows < N
        qt = _tile(q_base, rows, offs_d, s_qn, s_qd, nmask, dmask)
        qh = qt * tl.sigmoid(qt)
        if LRPE:
            ct = _tile(cos_ptr, rows, offs_d, D, 1, nmask, dmask)
            st = _tile(sin_ptr, rows, offs_d, D, 1, nmask, dmask)
            ot = _dot(qh * ct, s_c, LOWP, DT) + _dot(qh * st, s_s, LOWP, DT)
        else:
            ot = _dot(qh, s_c, LOWP, DT)
        tl.store(o_base + rows[:, None] * s_on + offs_e[None, :] * s_od, ot.to(o_ptr.dtype.element_ty),
                 mask=nmask[:, None] & emask[None, :])


@triton.jit
def _bwd_dq_kernel(
    q_ptr, do_ptr, cos_ptr, sin_ptr, s_ptr, dq_ptr, pds_ptr, ds_ptr, c_ptr,
    H, N, D, DV, tiles_per_split,
    s_qb, s_qh, s_qn, s_qd, s_gb, s_gh, s_gn, s_gd, s_db, s_dh, s_dn, s_dd,
    BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
    LRPE: tl.constexpr, SINGLE: tl.constexpr, LOWP: tl.constexpr,
):
    """Backward pass 1 over one chunk of tokens (reads q, dO; writes dq):

        dq~ = dO S^T,  dq^ = dq~_c C + dq~_s Sn,  dq = dq^ * sigma(q) (1 + q (1 - sigma(q)))   (SiLU')
        dS  = q~^T dO = [(q^ C)^T dO; (q^ Sn)^T dO]   accumulated over the chunk

    The partial dS of split s goes to pds [BH, splits, R, e]. With SINGLE the program writes dS to
    ds [BH, R, e] and the softmax correction c[f] = sum_j dS_c[f, j] S_c[f, j] + dS_s[f, j] S_s[f, j]
    to c [BH, d] (see ``lightvision.kernels.lightnet.op`` for the derivation)."""
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    nsplit = tl.num_programs(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    offs_e = tl.arange(0, BDV)
    dmask = offs_d < D
    emask = offs_e < DV
    q_base = q_ptr + b * s_qb + h * s_qh
    g_base = do_ptr + b * s_gb + h * s_gh
    dq_base = dq_ptr + b * s_db + h * s_dh
    DT = do_ptr.dtype.element_ty
    R = 2 * D if LRPE else D
    tile_off = offs_d[:, None] * DV + offs_e[None, :]
    tile_mask = dmask[:, None] & emask[None, :]
    s_base = s_ptr + pid_bh * R * DV
    s_c = tl.load(s_base + tile_off, mask=tile_mask, other=0.0)
    s_s = s_c
    if LRPE:
        s_s = tl.load(s_base + D * DV + tile_off, mask=tile_mask, other=0.0)
    ds_c = tl.zeros([BD, BDV], tl.float32)
    ds_s = tl.zeros([BD, BDV], tl.float32)
    lo = pid_s * tiles_per_split * BN
    hi = tl.minimum(N, lo + tiles_per_split * BN)
    for n0 in range(lo, hi, BN):
        rows = n0 + offs_n
        nmask = rows < N
        qt = _tile(q_base, rows, offs_d, s_qn, s_qd, nmask, dmask)
        gt = _tile(g_base, rows, offs_e, s_gn, s_gd, nmask, emask)
        sig = tl.sigmoid(qt)
        qh = qt * sig
        if LRPE:
            ct = _tile(cos_ptr, rows, offs_d, D, 1, nmask, dmask)
            st = _tile(sin_ptr, rows, offs_d, D, 1, nmask, dmask)
            dqh = _dot(gt, tl.trans(s_c), LOWP, DT) * ct + _dot(gt, tl.trans(s_s), LOWP, DT) * st
            ds_c += _dot(tl.trans(qh * ct), gt, LOWP, DT)
            ds_s += _dot(tl.trans(qh * st), gt, LOWP, DT)
        else:
            dqh = _dot(gt, tl.trans(s_c), LOWP, DT)
            ds_c += _dot(tl.trans(qh), gt, LOWP, DT)
        dq = dqh * sig * (1.0 + qt * (1.0 - sig))
        tl.store(dq_base + rows[:, None] * s_dn + offs_d[None, :] * s_dd, dq.to(dq_ptr.dtype.element_ty),
                 mask=nmask[:, None] & dmask[None, :])

    if SINGLE:
        out = ds_ptr + pid_bh * R * DV
        tl.store(out + tile_off, ds_c, mask=tile_mask)
        corr = tl.sum(ds_c * s_c, axis=1)
        if LRPE:
            tl.store(out + D * DV + tile_off, ds_s, mask=tile_mask)
            corr += tl.sum(ds_s * s_s, axis=1)
        tl.store(c_ptr + pid_bh * D + offs_d, corr, mask=dmask)
    else:
        out = pds_ptr + (pid_bh * nsplit + pid_s) * R * DV
        tl.store(out + tile_off, ds_c, mask=tile_mask)
        if LRPE:
            tl.store(out + D * DV + tile_off, ds_s, mask=tile_mask)


@triton.jit
def _bwd_combine_kernel(
    pds_ptr, s_ptr, ds_ptr, c_ptr, D, DV, nsplit,
    BD: tl.constexpr, BDV: tl.constexpr, LRPE: tl.constexpr,
):
    """dS = sum_s dS_s over the splits of one (b, h); c[f] = sum_j (dS * S)[f, j] + (dS * S)[d + f, j]."""
    pid_bh = tl.program_id(0)
    offs_d = tl.arange(0, BD)
    offs_e = tl.arange(0, BDV)
    dmask = offs_d < D
    tile_off = offs_d[:, None] * DV + offs_e[None, :]
    tile_mask = dmask[:, None] & (offs_e < DV)[None, :]
    R = 2 * D if LRPE else D
    ds_c = tl.zeros([BD, BDV], tl.float32)
    ds_s = tl.zeros([BD, BDV], tl.float32)
    for s in range(0, nsplit):
        part = pds_ptr + (pid_bh * nsplit + s) * R * DV
        ds_c += tl.load(part + tile_off, mask=tile_mask, other=0.0)
        if LRPE:
            ds_s += tl.load(part + D * DV + tile_off, mask=tile_mask, other=0.0)
    s_base = s_ptr + pid_bh * R * DV
    out = ds_ptr + pid_bh * R * DV
    tl.store(out + tile_off, ds_c, mask=tile_mask)
    corr = tl.sum(ds_c * tl.load(s_base + tile_off, mask=tile_mask, other=0.0), axis=1)
    if LRPE:
        tl.store(out + D * DV + tile_off, ds_s, mask=tile_mask)
        corr += tl.sum(ds_s * tl.load(s_base + D * DV + tile_off, mask=tile_mask, other=0.0), axis=1)
    tl.store(c_ptr + pid_bh * D + offs_d, corr, mask=dmask)


@triton.jit
def _bwd_dkdv_kernel(
    k_ptr, v_ptr, cos_ptr, sin_ptr, lse_ptr, ds_ptr, c_ptr, dk_ptr, dv_ptr,
    H, N, D, DV, tiles_per_split,
    s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd,
    s_dkb, s_dkh, s_dkn, s_dkd, s_dvb, s_dvh, s_dvn, s_dvd,
    BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
    LRPE: tl.constexpr, LOWP: tl.constexpr,
):
    """Backward pass 2 over one chunk of tokens (reads k, v; writes dk, dv), with k^ = exp(k - lse):

        dv = k~ dS = (k^ C) dS_c + (k^ Sn) dS_s
        G  = (v dS_c^T) C + (v dS_s^T) Sn           (= dL/dk^)
        dk = k^ * (G - c[None, :])                  (softmax over tokens, c from the combine step)"""
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    offs_e = tl.arange(0, BDV)
    dmask = offs_d < D
    emask = offs_e < DV
    k_base = k_ptr + b * s_kb + h * s_kh
    v_base = v_ptr + b * s_vb + h * s_vh
    dk_base = dk_ptr + b * s_dkb + h * s_dkh
    dv_base = dv_ptr + b * s_dvb + h * s_dvh
    DT = v_ptr.dtype.element_ty
    R = 2 * D if LRPE else D
    tile_off = offs_d[:, None] * DV + offs_e[None, :]
    tile_mask = dmask[:, None] & emask[None, :]
    ds_base = ds_ptr + pid_bh * R * DV
    ds_c = tl.load(ds_base + tile_off, mask=tile_mask, other=0.0)
    ds_s = ds_c
    if LRPE:
        ds_s = tl.load(ds_base + D * DV + tile_off, mask=tile_mask, other=0.0)
    lse = tl.load(lse_ptr + pid_bh * D + offs_d, mask=dmask, other=0.0)
    corr = tl.load(c_ptr + pid_bh * D + offs_d, mask=dmask, other=0.0)
    lo = pid_s * tiles_per_split * BN
    hi = tl.minimum(N, lo + tiles_per_split * BN)
    for n0 in range(lo, hi, BN):
        rows = n0 + offs_n
        nmask = rows < N
        kt = _tile(k_base, rows, offs_d, s_kn, s_kd, nmask, dmask)
        vt = _tile(v_base, rows, offs_e, s_vn, s_vd, nmask, emask)
        kh = tl.exp(kt - lse[None, :])
        if LRPE:
            ct = _tile(cos_ptr, rows, offs_d, D, 1, nmask, dmask)
            st = _tile(sin_ptr, rows, offs_d, D, 1, nmask, dmask)
            dvt = _dot(kh * ct, ds_c, LOWP, DT) + _dot(kh * st, ds_s, LOWP, DT)
            g = _dot(vt, tl.trans(ds_c), LOWP, DT) * ct + _dot(vt, tl.trans(ds_s), LOWP, DT) * st
        else:
            dvt = _dot(kh, ds_c, LOWP, DT)
            g = _dot(vt, tl.trans(ds_c), LOWP, DT)
        dkt = kh * (g - corr[None, :])
        tl.store(dk_base + rows[:, None] * s_dkn + offs_d[None, :] * s_dkd, dkt.to(dk_ptr.dtype.element_ty),
                 mask=nmask[:, None] & dmask[None, :])
        tl.store(dv_base + rows[:, None] * s_dvn + offs_e[None, :] * s_dvd, dvt.to(dv_ptr.dtype.element_ty),
                 mask=nmask[:, None] & emask[None, :])
