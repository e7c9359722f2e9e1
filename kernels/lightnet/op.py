"""Fused one-scan LightNet attention: launchers, torch custom ops and autograd (docs/spec.md 1.1-1.2).

Forward, per (batch, head); q, k: [N, d], v: [N, e] (e = d_v); angles Theta [N, d] from
``lightvision.ops.lrpe_angles`` (C = cos Theta, Sn = sin Theta, prefix rows C = 1, Sn = 0):

    q^ = SiLU(q),  k^[n, f] = exp(k[n, f] - lse[f]),  lse[f] = log sum_n exp(k[n, f])     (fp32 stats)
    S  = [k^ C, k^ Sn]^T v = [S_c; S_s]  (2d x e)        o = (q^ C) S_c + (q^ Sn) S_s  (N x e)

Backward, with dO = dL/do and no N x d intermediate in memory:

    dS   = [(q^ C)^T dO; (q^ Sn)^T dO]                              (reduction over N)
    dq^  = (dO S_c^T) C + (dO S_s^T) Sn,   dq = dq^ * SiLU'(q),   SiLU'(x) = sigma(x) (1 + x (1 - sigma(x)))
    dv   = (k^ C) dS_c + (k^ Sn) dS_s
    G    = dL/dk^ = (v dS_c^T) C + (v dS_s^T) Sn
    dk   = k^ * (G - c),   c[f] = sum_n k^[n, f] G[n, f]

Softmax over tokens: dk^[m, f]/dk[n, f] = k^[m, f] (delta_mn - k^[n, f]), so
    dk[n, f] = sum_m G[m, f] k^[m, f] (delta_mn - k^[n, f]) = k^[n, f] (G[n, f] - c[f]).
The correction never needs G summed over N: substituting G,
    c[f] = sum_j dS_c[f, j] sum_n k^[n, f] C[n, f] v[n, j] + dS_s[f, j] sum_n k^[n, f] Sn[n, f] v[n, j]
         = sum_j dS_c[f, j] S_c[f, j] + dS_s[f, j] S_s[f, j],
a per-feature row sum of dS * S over both halves, computed from the two small saved matrices.
SiLU: d/dx [x sigma(x)] = sigma(x) + x sigma(x) (1 - sigma(x)).

Passes (tensor traffic in units of one [B, H, N, d] tensor): forward reads k, v then q, writes o (4);
backward reads q, dO, writes dq (3), then reads k, v, writes dk, dv (4): 11 in all, the memory floor.
Beside those: the per-head S (R x e) and dS, their split partials, and the cos / sin tables ([N, d],
shared by every batch and head, so read mostly from L2). Saved for backward: S ([B, H, R, e] in the input
dtype, R = 2d, or d without LRPE) and lse (fp32 [B, H, d]).
Numerics: statistics, accumulators, split partials and dS in fp32; matrix-product operands in the input
dtype for bf16 / fp16 (fp16: dS is cast to fp16 for the dk / dv products, so |dS| must stay under 65504),
IEEE fp32 for fp32 inputs; outputs in the input dtype. S is stored in the input dtype: the products use it
at that precision anyway, only the softmax correction c reads it back (16-bit S: relative error ~2^-9 per
term of c), and at ViT sizes an fp32 S was a third of the forward's bytes (50 MB at N = 196, B = 256).

The custom ops ``lightvision::lightnet_attn_fwd`` / ``lightvision::lightnet_attn_bwd`` carry fake
(meta) implementations and an autograd formula, so models using them compile without graph breaks.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import triton

from lightvision.ops._checks import check_grid
from lightvision.ops.heads import split_heads
from lightvision.ops.md_lrpe import lrpe_angles

from .._autograd import autograd_ops
from .._launch import empty, interpreting, num_sms, strides
from . import _triton as K

HEAD_DIMS = tuple(range(16, 129, 8))  # multiples of 8 up to 128: 72 is LightNet-DiT-XL/2's (1152 / 16 heads)
COMBINE_ROWS = 16  # most feature rows per combine program (split plan; ``_combine_blocks``)
COMBINE_SPLITS = 16  # most split partials a combine program reads at once, as one tile
COMBINE_PROGRAMS_PER_SM = 4  # the combine grid's rows shrink until it has this many programs per SM
# token tiles' worth of time per extra split (``_split_cost``; fitted to the H100 sweep, docs/kernels_lightnet.md)
SPLIT_COST = 4
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def rotation_tables(
    grid: tuple[int, ...] | None,
    num_prefix_tokens: int,
    d: int,
    group: int,
    dtype: torch.dtype,
    device: torch.device,
    variant: str = "per_axis",
    pos_scale: tuple[float, ...] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos Theta, sin Theta) for the kernels, each [N, group * d] contiguous: a program's ``group`` heads of d
    features side by side (``head_group``); angles from ``lrpe_angles`` (any of its variants and position scales).
    fp32 for fp32 inputs, fp16 for 16-bit inputs (|cos|, |sin| <= 1: rounding 2^-11, under the inputs' own). ``grid``
    None (no MD-LRPE): a 1-element stand-in that the programs never read."""
    if grid is None:
        return (torch.zeros(1, device=device),) * 2
    ang = lrpe_angles(grid, d, num_prefix_tokens, device=device, variant=variant, pos_scale=pos_scale)
    table_dtype = torch.float32 if dtype == torch.float32 else torch.float16
    return torch.cos(ang).to(table_dtype).repeat(1, group), torch.sin(ang).to(table_dtype).repeat(1, group)


@functools.lru_cache(maxsize=64)
def _cached_rotation_tables(*key) -> tuple[torch.Tensor, torch.Tensor]:
    """``rotation_tables(*key)``, built outside inference mode: tables first built under ``torch.inference_mode()``
    (an evaluation before training) would be inference tensors, which a later training step cannot save for its
    backward."""
    with torch.inference_mode(False):
        return rotation_tables(*key)


def _tables(
    grid: tuple[int, ...] | None,
    num_prefix_tokens: int,
    d: int,
    group: int,
    dtype: torch.dtype,
    device: torch.device,
    variant: str,
    pos_scale: tuple[float, ...] | None,
):
    """``rotation_tables`` for a checked grid (``_rotation_grid``): cached per shape in eager mode; recomputed by the
    graph under torch.compile, so that they are the graph's own tensors (tables cached during a CUDA-graph warm-up
    would stay in the graph's memory pool, owned by no output, and ``mode="reduce-overhead"`` refuses that)."""
    build = rotation_tables if torch.compiler.is_compiling() else _cached_rotation_tables
    return build(grid, num_prefix_tokens, d, group, dtype, device, variant, pos_scale)


def _tiles_per_split(tiles: int, splits: int) -> tuple[int, int]:
    """(tiles per split, the split count that remains once every split holds that many whole tiles)."""
    per = triton.cdiv(tiles, splits)
    return per, triton.cdiv(tiles, per)


def _split_cost(tiles: int, splits: int, bh: int, resident: int) -> float:
    """Predicted time of splitting ``tiles`` token tiles ``splits`` ways (``_tiles_per_split``), in units of one
    program's tile: the tiles plus SPLIT_COST per split (per-program setup, the partials and their combine),
    divided by how full the launch's waves are (B*H*splits programs, ``resident`` at a time)."""
    _, splits = _tiles_per_split(tiles, splits)
    waves = bh * splits / resident
    return (tiles + SPLIT_COST * splits) * math.ceil(waves) / waves


@functools.lru_cache(maxsize=256)
def _plan(
    n: int,
    bh: int,
    d: int,
    dv: int,
    device: torch.device,
    fp32: bool,
    block_n: int | None = None,
    num_warps: int | None = None,
    splits: int | None = None,
) -> dict:
    """Launch plan: token tile BN, padded feature blocks, warps / pipeline stages, and the split of N.

    The split count minimises ``_split_cost`` over 1 .. tiles / 2 (each program keeps at least two tiles, so the
    small fp32 S / dS partials stay cheap next to the token traffic), with 2 programs resident per SM (255
    registers; taken as 1 for head dim 128, 8 warps). Waves count: a launch that leaves most SMs idle in its last
    wave pays for a whole one. One split and d, d_v <= 64 runs the fused plan (one program per (b, h), one launch
    each way). Head dim 128 holds two 128 x d_v matrices per program: 8 warps, fewer stages, 16-token tiles for fp32
    (the matrix-product operands stay inside shared memory), 64-token tiles for 16-bit inputs, and always the split
    plan (the fused backward would hold S and dS, four such matrices, at once). d <= 64: 64-token tiles, 4 warps
    (d = 24 too). Pipeline stages: 3, except the fused backward (2). The keyword knobs override the defaults
    (``splits`` forces the split count; ``scripts/bench_attention.py --sweep`` times them). The timings behind each
    choice: docs/kernels_lightnet.md, "Launch rules and their measurements"."""
    bd, bdv = triton.next_power_of_2(d), triton.next_power_of_2(dv)
    wide = max(bd, bdv) >= 128
    if block_n is not None:
        bn = block_n
    elif interpreting():
        bn = 16
    else:
        bn = 16 if wide and fp32 else 64
    tiles = triton.cdiv(n, bn)
    if splits is None:
        resident = num_sms(device) * (1 if wide else 2)
        most = max(1, tiles // 2 if device.type == "cuda" else tiles)
        splits = min(range(1, most + 1), key=lambda s: _split_cost(tiles, s, bh, resident))
    per, splits = _tiles_per_split(tiles, splits)
    warps = num_warps or (8 if wide else 4)
    fused = splits == 1 and not wide
    stages = (1 if fp32 else 2) if wide else 3
    return dict(
        BN=bn,
        BD=bd,
        BDV=bdv,
        per=per,
        splits=splits,
        fused=fused,
        warps=warps,
        stages=stages,
        stages_bwd=2 if fused else stages,
    )


def _lowp(dtype: torch.dtype) -> bool:
    # The Triton CPU interpreter multiplies bf16 tl.dot operands as raw bits (tests/conftest.py
    # repairs it for the tests); elsewhere under the interpreter the products run in fp32.
    return dtype != torch.float32 and not interpreting()


class _Config(NamedTuple):
    """Everything a call needs besides the tensors, built once per shape (``_config``)."""

    R: int  # rows of S / dS: 2d with LRPE, else d
    fused: bool
    splits: int
    per: int  # token tiles per split
    grid_bh: tuple  # launch grid of the fused programs
    grid_rows: tuple  # launch grid of the combine programs: (b, h) x blocks of feature rows (``_combine_blocks``)
    grid_split: tuple  # launch grid of the split programs
    tiled: dict  # constexprs and launch options of the forward token-loop programs
    tiled_bwd: dict  # those of the backward token-loop programs
    small: dict  # those of the combine programs


def head_group(num_heads: int, d: int) -> int:
    """Heads per program on a packed qkv: small heads (d <= 32) run G = 2, 4 side by side as one head of width
    G * d <= 64 (S and dS kept block-diagonal, ``_triton._head_blocks``), so that the token tiles are wide rows
    instead of 24- or 16-feature slivers padded to a power of two."""
    g = 1
    while d <= 32 and num_heads % (2 * g) == 0 and 2 * g * d <= 64:
        g *= 2
    return g


def _combine_blocks(bh: int, d: int, splits: int, device: torch.device) -> tuple[int, int]:
    """(feature rows BR, splits per step SB) of the combine programs. BR halves from COMBINE_ROWS down to 2 until
    the (b, h) x row-block grid has COMBINE_PROGRAMS_PER_SM programs per SM; SB * BR <= 32 keeps a step's
    [SB, BR, e] tiles small; many splits over few heads want small row blocks and many splits per step, few splits
    over many heads the full 16 rows (timings: docs/kernels_lightnet.md, "Launch rules and their measurements")."""
    rows = COMBINE_ROWS
    while rows > 2 and bh * triton.cdiv(d, rows) < COMBINE_PROGRAMS_PER_SM * num_sms(device):
        rows //= 2
    return rows, min(COMBINE_SPLITS, 32 // rows, triton.next_power_of_2(splits))


@functools.lru_cache(maxsize=256)
def _config(n, bh, d, dv, device, dtype, lrpe, group=1) -> _Config:
    """Launch configuration for B*H = bh programs' heads of width d / dv; ``group`` heads of d / group features
    side by side per program (``head_group``)."""
    p = _plan(n, bh, d, dv, device, dtype == torch.float32)
    blocks = dict(HD=d // group, HDV=dv // group) if group > 1 else dict(HD=0, HDV=0)
    rows, per_step = _combine_blocks(bh, d, p["splits"], device)
    tiled = dict(
        BN=p["BN"],
        BD=p["BD"],
        BDV=p["BDV"],
        LRPE=lrpe,
        LOWP=_lowp(dtype),
        num_warps=p["warps"],
        num_stages=p["stages"],
        **blocks,
    )
    return _Config(
        R=2 * d if lrpe else d,
        fused=p["fused"],
        splits=p["splits"],
        per=p["per"],
        grid_bh=(bh,),
        grid_rows=(bh, triton.cdiv(d, rows)),
        grid_split=(bh, p["splits"]),
        tiled=tiled,
        tiled_bwd=dict(tiled, num_stages=p["stages_bwd"]),
        small=dict(BR=rows, BDV=p["BDV"], LRPE=lrpe, SB=per_step, num_warps=4),
    )


def lightnet_fwd(q, k, v, cos, sin, lrpe: bool, o: torch.Tensor | None = None, group: int = 1):
    """Launch the forward. q, k [B, H, N, d], v [B, H, N, e] (any strides), cos / sin ``rotation_tables``
    -> o [B, H, N, e] in q's dtype
    (contiguous, or written into the given ``o`` view with unit feature stride), S [B, H, R, e] in q's dtype
    (normalised, R = 2d with LRPE else d), lse fp32 [B, H, d]. ``group`` > 1: each of these H heads is that many
    real heads side by side (``head_group``)."""
    B, H, N, D = q.shape
    DV = v.shape[3]
    dev = q.device
    c = _config(N, B * H, D, DV, dev, q.dtype, lrpe, group)
    o = empty((B, H, N, DV), q.dtype, dev) if o is None else o
    s = empty((B, H, c.R, DV), q.dtype, dev)
    lse = empty((B, H, D), torch.float32, dev)
    if c.fused:
        K._fwd_fused_kernel[c.grid_bh](
            q_ptr=q, k_ptr=k, v_ptr=v, cos_ptr=cos, sin_ptr=sin, s_ptr=s, lse_ptr=lse, o_ptr=o, H=H, N=N, D=D, DV=DV,
            **strides("bhnd", q=q, k=k, v=v), **strides("bhn", o=o), **c.tiled,
        )  # fmt: skip
        return o, s, lse
    pm = empty((B * H, c.splits, D), torch.float32, dev)
    pz = empty((B * H, c.splits, D), torch.float32, dev)
    ps = empty((B * H, c.splits, c.R, DV), torch.float32, dev)
    K._fwd_reduce_kernel[c.grid_split](
        k_ptr=k, v_ptr=v, cos_ptr=cos, sin_ptr=sin, pm_ptr=pm, pz_ptr=pz, ps_ptr=ps, H=H, N=N, D=D, DV=DV,
        tiles_per_split=c.per, **strides("bhnd", k=k, v=v), **c.tiled,
    )  # fmt: skip
    K._fwd_combine_kernel[c.grid_rows](
        pm_ptr=pm, pz_ptr=pz, ps_ptr=ps, s_ptr=s, lse_ptr=lse, D=D, DV=DV, nsplit=c.splits, **c.small
    )
    K._fwd_out_kernel[c.grid_split](
        q_ptr=q, cos_ptr=cos, sin_ptr=sin, s_ptr=s, o_ptr=o, H=H, N=N, D=D, DV=DV, tiles_per_split=c.per,
        **strides("bhnd", q=q), **strides("bhn", o=o), **c.tiled,
    )  # fmt: skip
    return o, s, lse


def lightnet_bwd(do, q, k, v, s, lse, cos, sin, lrpe: bool, grads: tuple | None = None, group: int = 1):
    """Launch the backward: (dq, dk, dv) shaped like q, k, v in the input dtype: contiguous, or written into
    the given ``grads`` views (unit feature stride); ``group`` as in ``lightnet_fwd``."""
    B, H, N, D = q.shape
    DV = v.shape[3]
    dev = q.device
    c = _config(N, B * H, D, DV, dev, q.dtype, lrpe, group)
    if grads is None:
        grads = (
            empty((B, H, N, D), q.dtype, dev),
            empty((B, H, N, D), q.dtype, dev),
            empty((B, H, N, DV), q.dtype, dev),
        )
    dq, dk, dv = grads
    if c.fused:
        K._bwd_fused_kernel[c.grid_bh](
            q_ptr=q, k_ptr=k, v_ptr=v, do_ptr=do, cos_ptr=cos, sin_ptr=sin, s_ptr=s, lse_ptr=lse,
            dq_ptr=dq, dk_ptr=dk, dv_ptr=dv, H=H, N=N, D=D, DV=DV,
            **strides("bhnd", q=q, k=k, v=v, g=do), **strides("bhn", dq=dq, dk=dk, dv=dv), **c.tiled_bwd,
        )  # fmt: skip
        return dq, dk, dv
    pds = empty((B * H, c.splits, c.R, DV), torch.float32, dev)
    ds = empty((B * H, c.R, DV), torch.float32, dev)
    corr = empty((B * H, D), torch.float32, dev)
    K._bwd_dq_kernel[c.grid_split](
        q_ptr=q, do_ptr=do, cos_ptr=cos, sin_ptr=sin, s_ptr=s, dq_ptr=dq, pds_ptr=pds, H=H, N=N, D=D, DV=DV,
        tiles_per_split=c.per, **strides("bhnd", q=q, g=do), **strides("bhn", dq=dq), **c.tiled_bwd,
    )  # fmt: skip
    K._bwd_combine_kernel[c.grid_rows](
        pds_ptr=pds, s_ptr=s, ds_ptr=ds, c_ptr=corr, D=D, DV=DV, nsplit=c.splits, **c.small
    )
    K._bwd_dkdv_kernel[c.grid_split](
        k_ptr=k, v_ptr=v, cos_ptr=cos, sin_ptr=sin, lse_ptr=lse, ds_ptr=ds, c_ptr=corr, dk_ptr=dk, dv_ptr=dv,
        H=H, N=N, D=D, DV=DV, tiles_per_split=c.per,
        **strides("bhnd", k=k, v=v), **strides("bhn", dk=dk, dv=dv), **c.tiled_bwd,
    )  # fmt: skip
    return dq, dk, dv


def _fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lrpe: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(o, S, lse) of the one-scan forward; see the module docstring."""
    return lightnet_fwd(q, k, v, cos, sin, lrpe)


def _fwd_fake(q, k, v, cos, sin, lrpe):
    B, H, N, D = q.shape
    DV = v.shape[-1]
    return (
        q.new_empty((B, H, N, DV)),
        q.new_empty((B, H, 2 * D if lrpe else D, DV)),
        q.new_empty((B, H, D), dtype=torch.float32),
    )


def _bwd(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    s: torch.Tensor,
    lse: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    lrpe: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of the one-scan attention; see the module docstring."""
    return lightnet_bwd(do, q, k, v, s, lse, cos, sin, lrpe)


def _bwd_fake(do, q, k, v, s, lse, cos, sin, lrpe):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _saved(inputs, output):
    q, k, v, cos, sin, lrpe = inputs
    _, s, lse = output
    return (q, k, v, s, lse, cos, sin), (lrpe,)


# custom ops lightvision::lightnet_attn_fwd / _bwd (torch.compile) and the eager Function over the same launchers
lightnet_attn_fwd, lightnet_attn_bwd, _, _lightnet_attn = autograd_ops(
    "lightnet_attn", _fwd, _fwd_fake, _bwd, _bwd_fake, _saved
)


def _packed_heads(qkv, num_heads: int):
    """(G, and q, k, v as H / G heads of G * d features): in the packed layout G adjacent heads are one row."""
    group = head_group(num_heads, qkv.shape[-1] // (3 * num_heads))
    return group, split_heads(qkv, num_heads // group)


def lightnet_packed_fwd(qkv, num_heads: int, cos, sin, lrpe: bool):
    """qkv [B, N, 3 * H * d] -> (o [B, N, H * d] written in that layout, S, lse) (see ``lightnet_fwd``; S and lse
    per program head: [B, H / G, 2 G d, G d], [B, H / G, G d] with G = ``head_group``)."""
    group, (q, k, v) = _packed_heads(qkv, num_heads)
    B, H, N, D = q.shape
    o = empty((B, N, H, D), qkv.dtype, qkv.device)
    _, s, lse = lightnet_fwd(q, k, v, cos, sin, lrpe, o=o.transpose(1, 2), group=group)
    return o.view(B, N, H * D), s, lse


def lightnet_packed_bwd(do, qkv, s, lse, cos, sin, num_heads: int, lrpe: bool):
    """dqkv [B, N, 3 * H * d], written by the backward programs in place (see ``lightnet_bwd``)."""
    group, (q, k, v) = _packed_heads(qkv, num_heads)
    B, H, N, D = q.shape
    dqkv = empty(qkv.shape, qkv.dtype, qkv.device)
    lightnet_bwd(
        do.reshape(B, N, H, D).transpose(1, 2), q, k, v, s, lse, cos, sin, lrpe, grads=split_heads(dqkv, H), group=group
    )
    return dqkv


def _packed_fwd(
    qkv: torch.Tensor, num_heads: int, cos: torch.Tensor, sin: torch.Tensor, lrpe: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(o [B, N, H * d], S, lse) of the one-scan forward on a packed qkv."""
    return lightnet_packed_fwd(qkv, num_heads, cos, sin, lrpe)


def _packed_fwd_fake(qkv, num_heads, cos, sin, lrpe):
    B, N, C3 = qkv.shape
    g = head_group(num_heads, C3 // (3 * num_heads))
    H, D = num_heads // g, C3 // (3 * num_heads) * g
    return (
        qkv.new_empty((B, N, H * D)),
        qkv.new_empty((B, H, 2 * D if lrpe else D, D)),
        qkv.new_empty((B, H, D), dtype=torch.float32),
    )


def _packed_bwd(
    do: torch.Tensor,
    qkv: torch.Tensor,
    s: torch.Tensor,
    lse: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_heads: int,
    lrpe: bool,
) -> torch.Tensor:
    """dqkv of the one-scan attention on a packed qkv."""
    return lightnet_packed_bwd(do, qkv, s, lse, cos, sin, num_heads, lrpe)


def _packed_bwd_fake(do, qkv, s, lse, cos, sin, num_heads, lrpe):
    return qkv.new_empty(qkv.shape)


def _packed_saved(inputs, output):
    qkv, num_heads, cos, sin, lrpe = inputs
    _, s, lse = output
    return (qkv, s, lse, cos, sin), (num_heads, lrpe)


# custom ops lightvision::lightnet_attn_packed_fwd / _bwd and the eager Function
lightnet_attn_packed_fwd, lightnet_attn_packed_bwd, _, _lightnet_attn_packed = autograd_ops(
    "lightnet_attn_packed", _packed_fwd, _packed_fwd_fake, _packed_bwd, _packed_bwd_fake, _packed_saved
)


def supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the kernel covers these inputs: non-empty [B, H, N, d] with d, d_v in HEAD_DIMS, one float dtype."""
    return (
        q.dim() == 4
        and q.shape == k.shape
        and v.shape[:3] == q.shape[:3]
        and q.shape[-1] in HEAD_DIMS
        and v.shape[-1] in HEAD_DIMS
        and q.dtype in DTYPES
        and q.dtype == k.dtype == v.dtype
        and q.device == k.device == v.device
        and q.numel() > 0
    )


def _rotation_grid(grid, n: int, num_prefix_tokens: int, lrpe: str | None):
    """The checked token grid when MD-LRPE applies (a variant and a grid given, as in the reference), else None."""
    grid = check_grid(grid, n, num_prefix_tokens)
    return grid if lrpe is not None and grid is not None else None


def lightnet_attention_triton(
    q, k, v, *, grid=None, num_prefix_tokens=0, lrpe="per_axis", pos_scale=None, causal=False, key_softmax=True
):
    """Kernel entry of ``lightvision.ops.lightnet_attention`` (registered with the ops dispatch).

    q, k [B, H, N, d], v [B, H, N, d_v] -> o [B, H, N, d_v] in the input dtype. As in the reference,
    MD-LRPE (``lrpe``: a variant name or None, normalised by the op; ``pos_scale`` its coordinate factors, checked by
    the op) applies when it and a ``grid`` are given.
    Returns NotImplemented (the reference then runs) for causal=True, key_softmax=False, or inputs outside
    ``supports``. Under torch.compile the call goes through the custom op ``lightvision::lightnet_attn_fwd``; in
    eager mode through the same launchers directly."""
    if causal or not key_softmax or not supports(q, k, v):
        return NotImplemented
    grid = _rotation_grid(grid, q.shape[2], num_prefix_tokens, lrpe)
    cos, sin = _tables(grid, num_prefix_tokens, q.shape[3], 1, q.dtype, q.device, lrpe, pos_scale)
    return _lightnet_attn(q, k, v, cos, sin, grid is not None)


def lightnet_attention_qkvpacked_triton(
    qkv, num_heads, *, grid=None, num_prefix_tokens=0, lrpe="per_axis", pos_scale=None
):
    """Kernel entry of ``lightvision.ops.lightnet_attention_qkvpacked``: qkv [B, N, 3 * H * d] -> o [B, N, H * d];
    NotImplemented (the reference runs) for inputs outside ``supports``."""
    q, k, v = split_heads(qkv, num_heads)
    if not supports(q, k, v):
        return NotImplemented
    grid = _rotation_grid(grid, q.shape[2], num_prefix_tokens, lrpe)
    group = head_group(num_heads, q.shape[3])
    cos, sin = _tables(grid, num_prefix_tokens, q.shape[3], group, q.dtype, q.device, lrpe, pos_scale)
    return _lightnet_attn_packed(qkv, num_heads, cos, sin, grid is not None)


__all__ = [
    "HEAD_DIMS",
    "lightnet_attention_qkvpacked_triton",
    "lightnet_attention_triton",
    "lightnet_attn_bwd",
    "lightnet_attn_fwd",
    "lightnet_attn_packed_bwd",
    "lightnet_attn_packed_fwd",
    "rotation_tables",
    "supports",
]
