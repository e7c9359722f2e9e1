"""torch.library custom ops around the LION kernels, with autograd, so models torch.compile without graph breaks.

    torch.ops.lightvision.lion_fwd(q, k, v, g, normalize, form) -> (out, den, saved)
        out: Y [B, H, N, d_v] in q.dtype (normalize) or num in fp32; den: A 1 [B, H, N] fp32;
        saved: what the backward reuses: the masked form's tile prefix sums (parallel.tile_prefix; empty for
        LIT) or the scan's key states (scan.scan_forward)
    torch.ops.lightvision.lion_bwd(q, k, v, g, out, den, saved, dout, dden, normalize, form) -> (dq, dk, dv, dg)
        dg: fp32 of g's shape, empty when g is None (LIT)
g: fp32 log-gates, per token [B, H, N] (S) or per head [H] (D), or None; form: "parallel" (parallel.py) or
"scan" (scan.py).
:func:`lion_core` is the differentiable entry point used by op.py.
"""

from __future__ import annotations

import torch

from .parallel import parallel_backward, parallel_forward, row_grads, tile_prefix_like
from .scan import key_states_like, scan_backward, scan_forward


def _unit_stride(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


@torch.library.custom_op("lightvision::lion_fwd", mutates_args=())
def lion_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None, normalize: bool,
             form: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    fwd = parallel_forward if form == "parallel" else scan_forward
    return fwd(_unit_stride(q), _unit_stride(k), _unit_stride(v), g, normalize)


@lion_fwd.register_fake
def _lion_fwd_fake(q, k, v, g, normalize, form):
    b, h, n, _ = q.shape
    out = q.new_empty(b, h, n, v.shape[-1], dtype=q.dtype if normalize else torch.float32)
    saved = tile_prefix_like(q, g) if form == "parallel" else key_states_like(q, v)
    return out, q.new_empty(b, h, n, dtype=torch.float32), saved


@torch.library.custom_op("lightvision::lion_bwd", mutates_args=())
def lion_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None, out: torch.Tensor,
             den: torch.Tensor, saved: torch.Tensor, dout: torch.Tensor, dden: torch.Tensor | None, normalize: bool,
             form: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dout = dout.contiguous()
    if normalize:
        zinv, delta = row_grads(dout, out, den)
    else:
        zinv = torch.ones_like(den)
        delta = torch.zeros_like(den) if dden is None else dden.float()
    args = (_unit_stride(q), _unit_stride(k), _unit_stride(v), g, dout, zinv.contiguous(), delta.contiguous())
    bwd = parallel_backward if form == "parallel" else scan_backward
    dq, dk, dv, dg = bwd(*args, saved)
    return dq, dk, dv, den.new_empty(0) if dg is None else dg


@lion_bwd.register_fake
def _lion_bwd_fake(q, k, v, g, out, den, saved, dout, dden, normalize, form):
    # contiguous, as the kernels allocate them, whatever the strides of q, k, v, g (views of a qkv projection)
    dg = den.new_empty(0) if g is None else g.new_empty(g.shape)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dg


def _setup_context(ctx, inputs, output):
    q, k, v, g, normalize, form = inputs
    ctx.save_for_backward(q, k, v, g, *output)
    ctx.normalize = normalize
    ctx.form = form


def _backward(ctx, dout, dden, _):
    q, k, v, g, out, den, saved = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv, dg = lion_bwd(q, k, v, g, out, den, saved, dout, None if ctx.normalize else dden, ctx.normalize,
                              ctx.form)
    return dq, dk, dv, (dg if g is not None else None), None, None


lion_fwd.register_autograd(_backward, setup_context=_setup_context)


def lion_core(q, k, v, g, normalize: bool, form: str):
    """Differentiable LION core: Y (normalize) or the fp32 pair (num, den); g, form as lion_fwd."""
    out, den, _ = lion_fwd(q, k, v, g, normalize, form)
    return out if normalize else (out, den)
