"""LightNet attention: the one-scan additive-decay linear attention (LightNet Eq. 7-9; docs/spec.md 1.1).

Per batch and head, on raw projections q, k [N, d], v [N, d_v]:

    q^ = SiLU(q),   k^ = softmax of k over the N tokens, per feature        (Eq. 8-9)
    q~, k~ = MD-LRPE(q^), MD-LRPE(k^)   when an ``lrpe`` variant and a grid are given (docs/spec.md 1.2), else q^, k^
    O = q~ (k~^T v)

No 1/N or other normaliser: the softmax over tokens is the normaliser. Prefix tokens take part in the softmax
and get LRPE angle 0. The causal form (Eq. 7) is s_t = s_{t-1} + exp(k_t),
kv_t = diag(1 - exp(k_t) / s_t) kv_{t-1} + exp(k_t) / s_t v_t^T, o_t = q~_t^T kv_t; unrolled,
kv_t = sum_{j<=t} exp(k_j - L_t) v_j^T with L = logcumsumexp(k) (fp32), evaluated in chunks with every exponent
<= 0; its final state is the non-causal k~^T v. ``key_softmax=False`` is the "no decay" ablation: k^ = SiLU(k)
(causal: plain causal linear attention). Statistics are fp32 (fp64 inputs stay fp64).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ._checks import check_grid, check_pos_scale, check_qkv, compute_dtype
from ._dispatch import dispatch
from .heads import merge_heads, split_heads
from .md_lrpe import lrpe_angles, lrpe_variant

_CAUSAL_CHUNK = 32


def lightnet_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    grid: Sequence[int] | None = None,
    num_prefix_tokens: int = 0,
    lrpe: bool | str | None = "per_axis",
    pos_scale: Sequence[float] | None = None,
    causal: bool = False,
    key_softmax: bool = True,
    backend: str = "auto",
) -> torch.Tensor:
    """LightNet attention core (module docstring) on raw projections.

    Args:
        q, k: [B, H, N, d] query and key projections (before SiLU / the key softmax).
        v: [B, H, N, d_v] values.
        grid: token grid (h, w) or any number of axes; prod(grid) + num_prefix_tokens == N. None: no MD-LRPE.
        num_prefix_tokens: leading tokens (cls, registers, conditions) without a grid position.
        lrpe: an MD-LRPE variant of ``lightvision.ops.md_lrpe.LRPE_VARIANTS``, True (= "per_axis"), or
            False / None (off).
        pos_scale: MD-LRPE's per-axis factors on the grid coordinates (training grid / grid for image units;
            ``lightvision.ops.md_lrpe``); None: token units.
        causal: the causal form (Eq. 7) instead of the non-causal one.
        key_softmax: False for the "no decay" ablation (SiLU on k).
        backend: "torch" | "auto" | "triton" (:mod:`lightvision.ops._dispatch`).

    Returns:
        O [B, H, N, d_v] in q's dtype.

    Example:
        >>> q, k, v = (torch.randn(2, 6, 1 + 14 * 14, 64) for _ in range(3))
        >>> lightnet_attention(q, k, v, grid=(14, 14), num_prefix_tokens=1).shape
        torch.Size([2, 6, 197, 64])
    """
    check_qkv(q, k, v, "lightnet_attention")
    grid = check_grid(grid, q.shape[2], num_prefix_tokens)
    lrpe = lrpe_variant(lrpe)
    pos_scale = check_pos_scale(pos_scale, grid)
    kwargs = dict(
        grid=grid,
        num_prefix_tokens=num_prefix_tokens,
        lrpe=lrpe,
        pos_scale=pos_scale,
        causal=causal,
        key_softmax=key_softmax,
    )
    out = dispatch("lightnet_attention", backend, q.device, (q, k, v), kwargs)
    if out is not NotImplemented:
        return out
    dt = compute_dtype(q, k, v)
    qf, kf, vf = q.to(dt), k.to(dt), v.to(dt)
    rot = None
    if lrpe is not None and grid is not None:
        ang = lrpe_angles(
            grid, q.shape[-1], num_prefix_tokens, device=q.device, dtype=dt, variant=lrpe, pos_scale=pos_scale
        )
        rot = torch.cat([torch.cos(ang), torch.sin(ang)], -1)  # [N, 2d]
    qt = _rotate(F.silu(qf), rot)
    if causal and key_softmax:
        logk = kf if rot is None else torch.cat([kf, kf], -1)
        o = _causal_softmax_scan(qt, logk, rot, vf)
    else:
        kt = _rotate(torch.softmax(kf, dim=-2) if key_softmax else F.silu(kf), rot)
        if causal:
            n = q.shape[2]
            causal_mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
            o = (qt @ kt.transpose(-1, -2)).masked_fill(~causal_mask, 0.0) @ vf
        else:
            o = qt @ (kt.transpose(-1, -2) @ vf)
    return o.to(q.dtype)


def lightnet_attention_qkvpacked(
    qkv: torch.Tensor,
    num_heads: int,
    *,
    grid: Sequence[int] | None = None,
    num_prefix_tokens: int = 0,
    lrpe: bool | str | None = "per_axis",
    pos_scale: Sequence[float] | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Non-causal LightNet attention on a fused projection.

    The same math as ``lightnet_attention(*split_heads(qkv, num_heads), ...)`` followed by ``merge_heads``; the
    Triton kernel reads q, k, v in place, writes o in the [B, N, H, d] layout of the output projection and the
    gradient straight into one [B, N, 3 * H * d] tensor (no stack of dq, dk, dv, no transposing copies).

    Args:
        qkv: [B, N, 3 * H * d], the output of one fused q / k / v Linear.
        num_heads: H.
        grid, num_prefix_tokens, lrpe, pos_scale, backend: as in :func:`lightnet_attention`.

    Returns:
        o [B, N, H * d] in qkv's dtype.

    Example:
        >>> lightnet_attention_qkvpacked(torch.randn(2, 1 + 7 * 9, 3 * 384), 6, grid=(7, 9), num_prefix_tokens=1).shape
        torch.Size([2, 64, 384])
    """
    if not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    q, k, v = split_heads(qkv, num_heads)
    grid = check_grid(grid, q.shape[2], num_prefix_tokens)
    pos_scale = check_pos_scale(pos_scale, grid)
    kwargs = dict(grid=grid, num_prefix_tokens=num_prefix_tokens, lrpe=lrpe_variant(lrpe), pos_scale=pos_scale)
    out = dispatch("lightnet_attention_qkvpacked", backend, qkv.device, (qkv, num_heads), kwargs)
    if out is not NotImplemented:
        return out
    return merge_heads(lightnet_attention(q, k, v, backend="torch", **kwargs))


def _rotate(x: torch.Tensor, rot: torch.Tensor | None) -> torch.Tensor:
    """MD-LRPE with precomputed rot = [cos Theta, sin Theta] [N, 2d]: x [..., N, d] -> [x cos, x sin] (or x)."""
    return x if rot is None else torch.cat([x, x], -1) * rot


def _causal_softmax_scan(
    qt: torch.Tensor, logk: torch.Tensor, rot: torch.Tensor | None, v: torch.Tensor
) -> torch.Tensor:
    """o_t = sum_{j<=t} sum_f qt[t,f] exp(logk[j,f] - L[t,f]) rot[j,f] v_j, L = logcumsumexp(logk) over tokens.

    qt, logk: [B, H, N, F]; rot: [N, F] or None (= 1); v: [B, H, N, d_v]. Chunked over tokens: intra-chunk
    weights are materialised ([chunk, chunk, F] per head), the state kv (F x d_v) is carried across chunks
    and rescaled by exp(L_prev - L_end); every exponent is <= 0, so nothing overflows.
    """
    n = qt.shape[2]
    big_l = torch.logcumsumexp(logk, dim=2)
    state = qt.new_zeros(*qt.shape[:2], qt.shape[-1], v.shape[-1])
    l_prev = None
    outs = []
    for s in range(0, n, _CAUSAL_CHUNK):
        e = min(s + _CAUSAL_CHUNK, n)
        lk, lc, qc, vc = logk[:, :, s:e], big_l[:, :, s:e], qt[:, :, s:e], v[:, :, s:e]
        rc = 1.0 if rot is None else rot[s:e]
        tri = torch.ones(e - s, e - s, dtype=torch.bool, device=qt.device).tril()[:, :, None]  # [t, j, 1]
        expo = (lk[:, :, None, :, :] - lc[:, :, :, None, :]).masked_fill(~tri, float("-inf"))
        w = torch.exp(expo) * rc  # [B, H, t, j, F]
        o = torch.einsum("bhtf,bhtjf->bhtj", qc, w) @ vc
        l_end = lc[:, :, -1]  # [B, H, F]
        upd = (torch.exp(lk - l_end[:, :, None, :]) * rc).transpose(-1, -2) @ vc  # [B, H, F, d_v]
        if l_prev is not None:
            o = o + (qc * torch.exp(l_prev[:, :, None, :] - lc)) @ state
            state = torch.exp(l_prev - l_end)[..., None] * state + upd
        else:
            state = upd
        outs.append(o)
        l_prev = l_end
    return torch.cat(outs, 2)
