"""A Linear layer whose input is a cheap elementwise function of another tensor, recomputed in the backward.

    out = Linear(act(h))         h [..., K_h] (a matmul's output), act(h) [..., K], weight [C, K] -> [..., C]

PyTorch's autograd keeps both h (for act's backward) and act(h) (for the weight gradient). Here only h is kept; the
backward recomputes act(h) (one elementwise pass) for the weight gradient, so an FFN keeps its hidden activation
once instead of twice: GLU drops SiLU(a) * b ([..., K], a third of what it kept), the GELU MLP drops GELU(h) (half).
Same values and gradients as ``F.linear(act(h), weight, bias)`` (autocast included); under ``torch.compile`` that
plain form runs, since the compiler's partitioner already recomputes elementwise ops instead of saving them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


class _RecomputedInputLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, bias, act):
        out = F.linear(act(h), weight, bias)  # autocast (when on) casts as it does for the plain form
        ctx.act, ctx.out_dtype = act, out.dtype
        ctx.save_for_backward(h, weight, bias)
        return out

    @staticmethod
    def backward(ctx, dout):
        h, weight, bias = ctx.saved_tensors
        with torch.enable_grad():
            h_in = h.detach().requires_grad_(ctx.needs_input_grad[0])
            y = ctx.act(h_in)
        dt = ctx.out_dtype  # the dtype the forward's matmul ran in
        d2 = dout.to(dt).reshape(-1, dout.shape[-1])
        dh = dw = db = None
        if ctx.needs_input_grad[1]:
            dw = (d2.t() @ y.detach().to(dt).reshape(-1, y.shape[-1])).to(weight.dtype)
        if bias is not None and ctx.needs_input_grad[2]:
            db = d2.sum(0).to(bias.dtype)
        if ctx.needs_input_grad[0]:
            dy = (dout.to(dt) @ weight.to(dt)).to(y.dtype)
            (dh,) = torch.autograd.grad(y, h_in, dy)
        return dh, dw, db, None


def recomputed_input_linear(
    act: Callable[[torch.Tensor], torch.Tensor], h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear(act(h), weight, bias)``, keeping only h for the backward (module docstring).

    Args:
        act: elementwise (per row) function of h, e.g. ``silu_mul`` (packed GLU) or a GELU.
        h: [..., K_h].
        weight: [C, K], K the width of act(h).
        bias: [C] or None.

    Returns:
        [..., C].

    Example:
        >>> from lightvision.ops import silu_mul
        >>> recomputed_input_linear(silu_mul, torch.randn(2, 5, 16), torch.randn(4, 8)).shape
        torch.Size([2, 5, 4])
    """
    if torch.compiler.is_compiling() or not torch.is_grad_enabled():
        return F.linear(act(h), weight, bias)
    return _RecomputedInputLinear.apply(h, weight, bias, act)
