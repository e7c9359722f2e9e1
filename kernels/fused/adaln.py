"""Fused adaLN-Zero pointwise ops of the DiT block: launchers, torch custom ops and autograd.

Modulated LayerNorm, per row x [C] of sample b (fp32 inside), mu / r = mean / 1 / sqrt(biased var + eps),
x^ = (x - mu) r, s = 1 + scale[b]:

    y = x^ s + shift[b]
    dshift[b] = sum_n dy           dscale[b] = sum_n dy x^          g = dy s
    dx = r (g - mean_c(g) - x^ mean_c(g x^))

Gated residual: out = x + gate[b] y;  dx = dout,  dy = dout gate[b],  dgate[b] = sum_n dout y.

Traffic: one read of each [B, N, C] input and one write of each output per direction; only mean and rstd
(fp32, one per row) are saved between. PyTorch's own form (layer_norm, then a multiply and an add per vector, a
cast for the next matmul; two broadcast ops for the residual) takes four to six passes each way, plus the
reductions of the broadcast vectors' gradients. The sums over tokens come from programs that each own a run of
one sample's rows (``_sample_plan``) as [B, P, C] partials, summed on the host.
Custom ops ``lightvision::adaln_fwd`` / ``_bwd`` and ``lightvision::gated_residual_fwd`` / ``_bwd`` carry fake
implementations and autograd (torch.compile without graph breaks); eager calls use ``torch.autograd.Function``
wrappers over the same launchers (both from ``kernels/_autograd.py``).
"""

from __future__ import annotations

import functools

import torch
import triton

from .._autograd import autograd_ops
from .._launch import empty, num_sms
from . import _triton as K
from .op import DTYPES, row_tile, rows_supported


@functools.lru_cache(maxsize=64)
def _sample_plan(b: int, n: int, c: int, device: torch.device) -> dict:
    """Row tile, and the grid (B, P): each sample's row tiles split into P runs of ``per`` tiles, with P such that
    B * P is about four programs per SM."""
    tile = row_tile(c)
    tiles = triton.cdiv(n, tile["BM"])
    parts = max(1, min(tiles, triton.cdiv(4 * num_sms(device), b)))
    per = triton.cdiv(tiles, parts)
    return dict(**tile, grid=(b, triton.cdiv(tiles, per)), per=per)


def _vector(t: torch.Tensor) -> torch.Tensor:
    """A per-sample [B, C] vector whose rows are contiguous (row stride free: chunks of one modulation output)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _partials(p: dict, c: int, device) -> torch.Tensor:
    return empty((p["grid"][0], p["grid"][1], c), torch.float32, device)


def adaln_fwd_launch(x, shift, scale, eps: float, out_dtype: torch.dtype):
    """(y like x in ``out_dtype``, mean and rstd fp32 [B * N])."""
    b, n, c = x.shape
    p = _sample_plan(b, n, c, x.device)
    shift, scale = _vector(shift), _vector(scale)
    y = empty(x.shape, out_dtype, x.device)
    mean = empty((b * n,), torch.float32, x.device)
    rstd = empty((b * n,), torch.float32, x.device)
    K._adaln_fwd_kernel[p["grid"]](
        X=x.contiguous(), SHIFT=shift, SCALE=scale, Y=y, MEAN=mean, RSTD=rstd, N=n, C=c, sv_shift=shift.stride(0),
        sv_scale=scale.stride(0), eps=eps, per=p["per"],
        BM=p["BM"], BC=p["BC"], num_warps=p["warps"],
    )  # fmt: skip
    return y, mean, rstd


def adaln_bwd_launch(dy, x, scale, mean, rstd, shift_dtype: torch.dtype):
    """(dx like x, dshift [B, C] in ``shift_dtype``, dscale like scale)."""
    b, n, c = x.shape
    p = _sample_plan(b, n, c, x.device)
    scale_v = _vector(scale)
    dx = empty(x.shape, x.dtype, x.device)
    dshift, dscale = _partials(p, c, x.device), _partials(p, c, x.device)
    K._adaln_bwd_kernel[p["grid"]](
        DY=dy.contiguous(), X=x.contiguous(), SCALE=scale_v, MEAN=mean, RSTD=rstd, DX=dx, DSHIFT=dshift, DSCALE=dscale,
        N=n, C=c, sv_scale=scale_v.stride(0), per=p["per"],
        BM=p["BM"], BC=p["BC"], num_warps=p["warps"],
    )  # fmt: skip
    return dx, dshift.sum(1).to(shift_dtype), dscale.sum(1).to(scale.dtype)


def _residual_dtype(x, gate, y) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.promote_types(gate.dtype, y.dtype))


def gated_residual_fwd_launch(x, gate, y):
    b, n, c = x.shape
    p = _sample_plan(b, n, c, x.device)
    gate = _vector(gate)
    out = empty(x.shape, _residual_dtype(x, gate, y), x.device)
    K._gated_residual_fwd_kernel[p["grid"]](
        X=x.contiguous(), GATE=gate, Y=y.contiguous(), OUT=out, N=n, C=c, sv_gate=gate.stride(0), per=p["per"],
        BM=p["BM"], BC=p["BC"], num_warps=p["warps"],
    )  # fmt: skip
    return out


def gated_residual_bwd_launch(dout, gate, y):
    """(dgate like gate, dy like y); dx is dout itself."""
    b, n, c = y.shape
    p = _sample_plan(b, n, c, y.device)
    gate_v = _vector(gate)
    dy = empty(y.shape, y.dtype, y.device)
    dgate = _partials(p, c, y.device)
    K._gated_residual_bwd_kernel[p["grid"]](
        DOUT=dout.contiguous(), GATE=gate_v, Y=y.contiguous(), DY=dy, DGATE=dgate, N=n, C=c, sv_gate=gate_v.stride(0),
        per=p["per"],
        BM=p["BM"], BC=p["BC"], num_warps=p["warps"],
    )  # fmt: skip
    return dgate.sum(1).to(gate.dtype), dy


# ---- custom ops (torch.compile) and eager Functions over the same launchers ----


def _adaln_fwd(
    x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float, out_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, mean, rstd) of the modulated LayerNorm; see the module docstring."""
    return adaln_fwd_launch(x, shift, scale, eps, out_dtype)


def _adaln_fwd_fake(x, shift, scale, eps, out_dtype):
    rows = x.shape[0] * x.shape[1]
    return (
        x.new_empty(x.shape, dtype=out_dtype),
        x.new_empty((rows,), dtype=torch.float32),
        x.new_empty((rows,), dtype=torch.float32),
    )


def _adaln_bwd(
    dy: torch.Tensor,
    x: torch.Tensor,
    scale: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    shift_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dshift, dscale) of the modulated LayerNorm."""
    return adaln_bwd_launch(dy, x, scale, mean, rstd, shift_dtype)


def _adaln_bwd_fake(dy, x, scale, mean, rstd, shift_dtype):
    return x.new_empty(x.shape), scale.new_empty(scale.shape, dtype=shift_dtype), scale.new_empty(scale.shape)


def _adaln_saved(inputs, output):
    x, shift, scale, _eps, _out_dtype = inputs
    return (x, scale, output[1], output[2]), (shift.dtype,)


def _residual_fwd(x: torch.Tensor, gate: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + gate[b] * y."""
    return gated_residual_fwd_launch(x, gate, y)


def _residual_fwd_fake(x, gate, y):
    return x.new_empty(x.shape, dtype=_residual_dtype(x, gate, y))


def _residual_bwd(dout: torch.Tensor, gate: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dgate, dy) of the gated residual (dx is dout: the builder's pass-through input)."""
    return gated_residual_bwd_launch(dout, gate, y)


def _residual_bwd_fake(dout, gate, y):
    return gate.new_empty(gate.shape), y.new_empty(y.shape)


def _residual_saved(inputs, output):
    _x, gate, y = inputs
    return (gate, y), ()


# custom ops lightvision::adaln_fwd / _bwd and gated_residual_fwd / _bwd (torch.compile), and the eager Functions
# over the same launchers (no custom-op dispatch); x of the gated residual passes its gradient through
adaln_fwd, adaln_bwd, _, _adaln = autograd_ops(
    "adaln", _adaln_fwd, _adaln_fwd_fake, _adaln_bwd, _adaln_bwd_fake, _adaln_saved
)
gated_residual_fwd, gated_residual_bwd, _, _gated_residual = autograd_ops(
    "gated_residual",
    _residual_fwd,
    _residual_fwd_fake,
    _residual_bwd,
    _residual_bwd_fake,
    _residual_saved,
    passthrough=1,
)


# ---- dispatch entries ----


def modulated_layer_norm_triton(x, shift, scale, *, eps, out_dtype):
    """Kernel entry of ``lightvision.ops.modulated_layer_norm``; NotImplemented (the reference runs) for rows wider
    than MAX_C, an empty x, or dtypes outside fp32 / bf16 / fp16."""
    if not rows_supported(x, shift, scale) or out_dtype not in DTYPES:
        return NotImplemented
    return _adaln(x, shift, scale, float(eps), out_dtype)


def gated_residual_triton(x, gate, y):
    """Kernel entry of ``lightvision.ops.gated_residual``; NotImplemented as for the modulated LayerNorm."""
    if not rows_supported(x, gate, y):
        return NotImplemented
    return _gated_residual(x, gate, y)
