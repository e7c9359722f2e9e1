"""A Linear layer whose input is a cheap elementwise function of another tensor, recomputed in the backward.

    out = Linear(act(h))         h [..., K_h] (a matmul's output), act(h) [..., K], weight [C, K] -> [..., C]

PyTorch's autograd keeps both h (for act's backward) and act(h) (for the weight gradient). Here only h is kept: the
Linear's saved input is packed as its layout (``torch.autograd.graph.saved_tensors_hooks``) and rebuilt in the
backward from h (one elementwise pass, no nested autograd), so an FFN keeps its hidden activation
once instead of twice: GLU drops SiLU(a) * b ([..., K], a third of what it kept), the GELU MLP drops GELU(h) (half).
Same values and gradients as ``F.linear(act(h), weight, bias)`` (autocast included); under ``torch.compile`` that
plain form runs, since the compiler's partitioner already recomputes elementwise ops instead of saving them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


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
    if torch.compiler.is_compiling() or not torch.is_grad_enabled():
        return F.linear(y, weight, bias)
    storage = y.untyped_storage().data_ptr()

    def pack(t: torch.Tensor):
        if t.untyped_storage().data_ptr() != storage:
            return t
        return (t.shape, t.stride(), t.storage_offset(), t.dtype)  # a view of act(h): rebuilt in the backward

    def unpack(saved):
        if isinstance(saved, torch.Tensor):
            return saved
        shape, stride, offset, dtype = saved
        return act(h.detach()).to(dtype).as_strided(shape, stride, offset)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        return F.linear(y, weight, bias)
