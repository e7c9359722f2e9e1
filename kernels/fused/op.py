"""Fused RMSNorm (x sigmoid gate) and SiLU x mul: launchers, torch custom ops and autograd.

RMSNorm with gate, per row x [C] (fp32 inside), r = 1 / sqrt(mean(x^2) + eps), x^ = x r, s = sigmoid(g):

    y   = x^ * w * s
    dg  = dy * x^ * w * s (1 - s)              dn = dy * s   (dn = dy without a gate)
    dw  = sum over rows of dn * x^             dx = r (dn w - x^ mean_c(dn w x^))

SiLU x mul, elementwise, sigma = sigmoid(a): y = a sigma b, db = dy a sigma, da = dy b sigma (1 + a (1 - sigma));
in the packed form a and b are the halves of one [..., 2C] tensor (GLU's fused W_1 | W_2 output), and da, db are
written into the halves of one [..., 2C] gradient.

Traffic: the norm reads x (and g) and writes y forward, reads dy, x (g) and writes dx (dg) backward, with
only rstd (fp32, one per row) saved between; SiLU x mul reads a, b and writes y, then reads dy, a, b and
writes da, db. The unfused PyTorch forms take 3-5x the passes and save fp32 intermediates.
The custom ops ``lightvision::rms_norm_fwd`` / ``_bwd`` and ``lightvision::silu_mul_fwd`` / ``_bwd`` carry fake
implementations and autograd, so models using them compile without graph breaks; eager calls go through
``torch.autograd.Function`` wrappers over the same launchers (less host time per call).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import triton

from .._autograd import autograd_ops
from .._launch import empty, interpreting, num_sms
from . import _triton as K

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_C = 8192  # widest row the norm programs hold in registers; wider rows run the reference
_SILU_BLOCK = 1024


@functools.lru_cache(maxsize=64)
def _norm_plan(m: int, c: int, device: torch.device) -> dict:
    """Row tile BM x BC (about 4k elements), warps, and the backward's programs (a few per SM, each looping
    over consecutive tiles, so the dw partials stay [programs, C])."""
    tile = row_tile(c)
    tiles = triton.cdiv(m, tile["BM"])
    progs = min(tiles, 4 * num_sms(device))
    per = triton.cdiv(tiles, progs)
    return dict(**tile, tiles=tiles, bwd_progs=triton.cdiv(tiles, per), bwd_per=per)


def row_tile(c: int, max_rows: int = 16) -> dict:
    """Tile of rows of width c for the row-wise programs: BM x BC (BC = c padded to a power of two, about 4k
    elements in all, at most ``max_rows`` rows) and the warps that hold it."""
    bc = triton.next_power_of_2(c)
    bm = max(1, min(max_rows, 4096 // bc)) if not interpreting() else 4
    return dict(BM=bm, BC=bc, warps=4 if bc <= 1024 else 8)


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1, t.shape[-1])


def rms_norm_fwd_launch(x, weight, gate, eps: float, out_dtype: torch.dtype):
    """(y shaped like x in ``out_dtype``, rstd fp32 [rows])."""
    x2 = _rows(x)
    m, c = x2.shape
    p = _norm_plan(m, c, x.device)
    y = empty(x2.shape, out_dtype, x.device)
    rstd = empty((m,), torch.float32, x.device)
    g2 = _rows(gate) if gate is not None else x2
    K._rms_norm_fwd_kernel[(p["tiles"],)](
        X=x2, W=weight, G=g2, Y=y, RSTD=rstd, M=m, C=c, eps=eps, per=1,
        BM=p["BM"], BC=p["BC"], GATE=gate is not None, num_warps=p["warps"],
    )  # fmt: skip
    return y.view(x.shape), rstd


def rms_norm_bwd_launch(dy, x, weight, gate, rstd):
    """(dx like x, dw like weight, dg like gate or an empty tensor without a gate)."""
    x2 = _rows(x)
    m, c = x2.shape
    p = _norm_plan(m, c, x.device)
    dx = empty(x2.shape, x.dtype, x.device)
    dg = empty(x2.shape, gate.dtype, x.device) if gate is not None else x.new_empty(0)
    dw = empty((p["bwd_progs"], c), torch.float32, x.device)
    g2 = _rows(gate) if gate is not None else x2
    K._rms_norm_bwd_kernel[(p["bwd_progs"],)](
        DY=_rows(dy), X=x2, W=weight, G=g2, RSTD=rstd, DX=dx, DG=dg if gate is not None else dx, DW=dw, M=m, C=c,
        per=p["bwd_per"],
        BM=p["BM"], BC=p["BC"], GATE=gate is not None, num_warps=p["warps"],
    )  # fmt: skip
    return dx.view(x.shape), dw.sum(0).to(weight.dtype), dg.view(gate.shape) if gate is not None else dg


def _silu_mul_operands(a, b):
    """(a, b, C, row stride) for the programs: two contiguous [..., C] tensors (rows C apart), or, with b None,
    the halves of one contiguous packed [..., 2C] tensor read in place (rows 2C apart)."""
    if b is not None:
        a, b = a.contiguous(), b.contiguous()
        return a, b, a.shape[-1], a.shape[-1]
    a = a.contiguous()
    c = a.shape[-1] // 2
    return a, a[..., c:], c, 2 * c


def silu_mul_fwd_launch(a, b):
    """SiLU(a) * b, or of the halves of a packed [..., 2C] a when b is None: [..., C] in a's dtype."""
    a, b, c, s_in = _silu_mul_operands(a, b)
    y = empty((*a.shape[:-1], c), a.dtype, a.device)
    K._silu_mul_fwd_kernel[(triton.cdiv(y.numel(), _SILU_BLOCK),)](
        A=a, B=b, Y=y, numel=y.numel(), C=c, s_in=s_in, BLOCK=_SILU_BLOCK
    )
    return y


def silu_mul_bwd_launch(dy, a, b):
    """(da, db) shaped like a and b; packed (b None): (the [..., 2C] gradient of a, an empty tensor)."""
    packed = b is None
    a, b, c, s_in = _silu_mul_operands(a, b)
    da = empty(a.shape, a.dtype, a.device)
    db = da[..., c:] if packed else empty(b.shape, b.dtype, b.device)
    K._silu_mul_bwd_kernel[(triton.cdiv(dy.numel(), _SILU_BLOCK),)](
        DY=dy.contiguous(), A=a, B=b, DA=da, DB=db, numel=dy.numel(), C=c, s_in=s_in, BLOCK=_SILU_BLOCK
    )
    return da, a.new_empty(0) if packed else db


# ---- custom ops (torch.compile) ----


def _norm_fwd(
    x: torch.Tensor, weight: torch.Tensor, gate: Optional[torch.Tensor], eps: float, out_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, rstd) of the fused RMSNorm; see the module docstring."""
    return rms_norm_fwd_launch(x, weight, gate, eps, out_dtype)


def _norm_fwd_fake(x, weight, gate, eps, out_dtype):
    return x.new_empty(x.shape, dtype=out_dtype), x.new_empty((x.numel() // x.shape[-1],), dtype=torch.float32)


def _norm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, gate: Optional[torch.Tensor], rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dw, dg) of the fused RMSNorm; dg is empty without a gate."""
    return rms_norm_bwd_launch(dy, x, weight, gate, rstd)


def _norm_bwd_fake(dy, x, weight, gate, rstd):
    return (
        x.new_empty(x.shape),
        weight.new_empty(weight.shape),
        gate.new_empty(gate.shape) if gate is not None else x.new_empty(0),
    )


def _norm_saved(inputs, output):
    x, weight, gate, _eps, _out_dtype = inputs
    return (x, weight, gate, output[1]), ()


def _silu_fwd(a: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
    """SiLU(a) * b, or of the halves of a packed a when b is None."""
    return silu_mul_fwd_launch(a, b)


def _silu_fwd_fake(a, b):
    return a.new_empty(a.shape if b is not None else (*a.shape[:-1], a.shape[-1] // 2))


def _silu_bwd(dy: torch.Tensor, a: torch.Tensor, b: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(da, db) of SiLU(a) * b; packed (b None): (da of the packed a, an empty tensor)."""
    return silu_mul_bwd_launch(dy, a, b)


def _silu_bwd_fake(dy, a, b):
    return a.new_empty(a.shape), b.new_empty(b.shape) if b is not None else a.new_empty(0)


def _silu_saved(inputs, output):
    return tuple(inputs), ()


# custom ops lightvision::rms_norm_fwd / _bwd and silu_mul_fwd / _bwd (torch.compile), and the eager Functions over
# the same launchers (no custom-op dispatch)
rms_norm_fwd, rms_norm_bwd, _, _rms_norm = autograd_ops(
    "rms_norm", _norm_fwd, _norm_fwd_fake, _norm_bwd, _norm_bwd_fake, _norm_saved
)
silu_mul_fwd, silu_mul_bwd, _, _silu_mul = autograd_ops(
    "silu_mul", _silu_fwd, _silu_fwd_fake, _silu_bwd, _silu_bwd_fake, _silu_saved
)


# ---- dispatch entries ----


def rows_supported(x: torch.Tensor, *others: torch.Tensor) -> bool:
    """Whether the row-wise programs cover x (non-empty, rows at most MAX_C wide) with these tensors' dtypes."""
    return 0 < x.numel() and x.shape[-1] <= MAX_C and all(t.dtype in DTYPES for t in (x, *others))


def rms_norm_triton(x, weight, gate, *, eps, out_dtype):
    """Kernel entry of ``lightvision.ops.rms_norm``; NotImplemented (the reference runs) for rows wider than
    MAX_C, an empty x, or dtypes outside fp32 / bf16 / fp16."""
    tensors = (x, weight) if gate is None else (x, weight, gate)
    if not rows_supported(x, *tensors[1:]) or out_dtype not in DTYPES:
        return NotImplemented
    return _rms_norm(x, weight, gate, float(eps), out_dtype)


def silu_mul_triton(a, b):
    """Kernel entry of ``lightvision.ops.silu_mul``; NotImplemented for mixed or unsupported dtypes, empty inputs."""
    if a.dtype not in DTYPES or (b is not None and a.dtype != b.dtype) or a.numel() == 0:
        return NotImplemented
    return _silu_mul(a, b)
