"""Triton device function shared by the kernel families: PyTorch's rounding of float32 values."""

import triton
import triton.language as tl


@triton.jit
def rint(v):
    """Round half to even (torch.round) of float32 values below 2^22 in magnitude."""
    r = tl.floor(v + 0.5)
    odd = (r.to(tl.int32) & 1) == 1
    return tl.where((r - v == 0.5) & odd, r - 1.0, r)
