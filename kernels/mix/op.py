"""timm's batch-mode Mixup / CutMix mix (``Mixup._mix_batch``): each image with the batch's reverse.

    out[n] = x[n] lam + x[N-1-n] (1 - lam)                                   (mixup)
    out[n, :, y, x] = x[N-1-n, :, y, x] inside the box, x[n, :, y, x] outside  (cutmix)

with lam, the box (top, bottom, left right: rows top..bottom-1, columns left..right-1) and the choice drawn once for
the batch, as device tensors (nothing is read back to the host). The reference (the spec) computes the reversed
batch, both mixes and a select; on CUDA one Triton program (``_triton``) reads each image and its mirror once and
writes the chosen mix, with the reference's float32 roundings (lam and 1 - lam rounded to float32 from float64, a
product each, then their sum; no fused multiply-add).
"""

from __future__ import annotations

import torch

from .._launch import empty, program_runs

BLOCK = 1024  # values per program
NUM_WARPS = 4


def mix_reversed_reference(x: torch.Tensor, lam: torch.Tensor, cut: torch.Tensor, box: torch.Tensor) -> torch.Tensor:
    """float [N, C, H, W] mixed with ``x.flip(0)``.

    Args:
        lam: float64 [] the mixup weight of each image itself; cut: bool [] CutMix (box) instead of the blend;
        box: [4] (top, bottom, left, right), integral values (any dtype).
    """
    height, width = x.shape[-2:]
    top, bottom, left, right = box.unbind()
    rows = torch.arange(height, device=x.device)
    cols = torch.arange(width, device=x.device)
    inside = ((rows >= top) & (rows < bottom))[:, None] & ((cols >= left) & (cols < right))[None, :]
    flipped = x.flip(0)
    blended = x * lam.to(x.dtype) + flipped * (1 - lam).to(x.dtype)
    return torch.where(cut, torch.where(inside, flipped, x), blended)


def mix_reversed(
    x: torch.Tensor, lam: torch.Tensor, cut: torch.Tensor, box: torch.Tensor, backend: str = "auto"
) -> torch.Tensor:
    """:func:`mix_reversed_reference` (same arguments) in one Triton launch for float32 batches.

    ``backend``: "auto" runs the program on CUDA and the reference elsewhere; "triton" requires the program (CUDA,
    or Triton's interpreter); "torch" the reference.
    """
    if not program_runs(x, backend, x.dtype == torch.float32 and x.dim() == 4, "a float32 [N, C, H, W] batch"):
        return mix_reversed_reference(x, lam, cut, box)
    n, c, height, width = x.shape
    x = x.contiguous()
    out = empty(x.shape, torch.float32, x.device)
    from ._triton import mix_reversed_kernel  # Triton is imported when a kernel first runs

    mix_reversed_kernel[(n, -(-c * height * width // BLOCK))](
        X=x, OUT=out, **mix_arguments(lam, cut, box), N=n, H=height, W=width, C=c, BLOCK=BLOCK, num_warps=NUM_WARPS,
        enable_fp_fusion=False,
    )  # fmt: skip
    return out


def mix_arguments(lam: torch.Tensor, cut: torch.Tensor, box: torch.Tensor) -> dict[str, torch.Tensor]:
    """The mix's launch arguments of a program that mixes (``_triton.mix_terms``): WEIGHTS float32 [2] (lam and 1 - lam,
    each rounded from float64, as the reference does), CUT int32 [1], BOX int64 [4]."""
    weights = torch.stack([lam, 1 - lam]).to(torch.float32)
    return {"WEIGHTS": weights, "CUT": cut.to(torch.int32).reshape(1), "BOX": box.to(torch.int64).contiguous()}
