"""A Linear layer whose input is a cheap elementwise function of another tensor, recomputed in the backward.

    out = Linear(act(h))         h [..., K_h] (a matmul's output), act(h) [..., K], weight [C, K] -> [..., C]

PyTorch's autograd keeps both h (for act's backward) and act(h) (for the weight gradient). Here only h is kept: the
Linear's saved input is packed as its layout (``rebuilt_in_backward``: ``torch.autograd.graph.saved_tensors_hooks``)
and rebuilt in the backward from h (one elementwise pass, no nested autograd), so an FFN keeps its hidden activation
once instead of twice: GLU drops SiLU(a) * b ([..., K], a third of what it kept), the GELU MLP drops GELU(h) (half).
Same values and gradients as ``F.linear(act(h), weight, bias)`` (autocast included); under ``torch.compile`` that
plain form runs, since the compiler's partitioner already recomputes elementwise ops instead of saving them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F


def rebuilt_in_backward(y: torch.Tensor, fn: Callable[..., torch.Tensor], *args) -> contextlib.AbstractContextManager:
    """Inside, autograd keeps no tensor that shares y's storage: it keeps its layout, and the backward rebuilds y as
    ``fn(*args)`` (tensors detached; y's values again, from tensors kept anyway; once per backward however many ops
    saved it). The arguments are bound now: rebinding a name afterwards does not change what is rebuilt. Hooks do not
    nest: inside an inner context, a tensor that an outer one would rebuild is kept as it is.
    Nothing changes without grad or while torch.compile traces (its partitioner decides what to keep).

    Example:
        >>> x, w = torch.randn(3, 4, requires_grad=True), torch.randn(5, 4, requires_grad=True)
        >>> y = F.gelu(x)  # GELU keeps x
        >>> with rebuilt_in_backward(y, F.gelu, x):
        ...     out = y @ w.t()  # the matmul keeps y's layout; the backward rebuilds y from x
        >>> out.sum().backward()
    """
    if torch.compiler.is_compiling() or not torch.is_grad_enabled():
        return contextlib.nullcontext()
    storage, rebuilt = y.untyped_storage().data_ptr(), []

    def pack(t: torch.Tensor):
        if t.untyped_storage().data_ptr() != storage:
            return t
        return (t.shape, t.stride(), t.storage_offset(), t.dtype)  # a view of y

    def unpack(saved):
        if isinstance(saved, torch.Tensor):
            return saved
        shape, stride, offset, dtype = saved
        if not rebuilt:
            rebuilt.append(fn(*(a.detach() if isinstance(a, torch.Tensor) else a for a in args)).detach())
        return rebuilt[0].to(dtype).as_strided(shape, stride, offset)

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


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
    y = act(h)
    with rebuilt_in_backward(y, act, h):
        return F.linear(y, weight, bias)
