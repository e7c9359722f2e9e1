"""Normalisation and random erasing (timm's ``Normalize`` then ``RandomErasing``) of a uint8 batch, optionally mixed
with its reverse (timm's batch Mixup / CutMix, :func:`lightvision.kernels.mix.mix_reversed_reference`).

    z[n, c, y, x] = noise[n, c, y, x]                     where (y, x) lies in one of image n's boxes,
                    (x[n, c, y, x] / 255 - mean[c]) / std[c]  elsewhere;
    out = z, or mix_reversed(z, lam, cut, box).

The reference (the spec) is those PyTorch ops on the batch; on CUDA one Triton program (``_triton``) reads each
uint8 pixel once (twice when mixing: for its image and for the mirrored one) and writes its float once, instead of a
float copy, the normalisation's three passes, the boxes' mask, a select over the batch and the mix's pass. It computes
in float32 with IEEE division and no fused multiply-add, which is the reference's arithmetic on the CPU (the
interpreter's result equals it exactly); PyTorch's CUDA kernels divide by the scalar 255 as a product with its
reciprocal, so on CUDA the two may differ in the last bit of a value.

The program can also draw the fill itself from per-image seeds (``seeds``: Triton's Philox normal draws, only in the
blocks that hold an erased pixel) instead of reading a noise tensor: no batch-sized noise is drawn, stored or read.
"""

from __future__ import annotations

import torch

from .._launch import empty, program_runs
from ..mix.op import mix_arguments, mix_reversed_reference

BLOCK = 1024  # pixels (every channel) per program
NUM_WARPS = 8  # four pixels per thread: the fastest on an H200 with and without the mix


def _mask(boxes: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """bool [N, 1, H, W]: the pixels inside any of each image's boxes (int [N, K, 4] top, left, height, width)."""
    top, left, bh, bw = (boxes[..., i, None] for i in range(4))  # [N, K, 1]
    rows = torch.arange(height, device=boxes.device)
    cols = torch.arange(width, device=boxes.device)
    in_rows = (rows >= top) & (rows < top + bh)  # [N, K, H]
    in_cols = (cols >= left) & (cols < left + bw)  # [N, K, W]
    return (in_rows[..., :, None] & in_cols[..., None, :]).any(1)[:, None]


def normalize_erase_reference(
    x: torch.Tensor,
    mean: torch.Tensor,
    std: torch.Tensor,
    boxes: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
    mix: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """uint8 [N, C, H, W] -> float32 [N, C, H, W] normalised, erased where ``boxes`` say, mixed if ``mix`` is given.

    Args:
        mean, std: float32 per channel, any shape of C values (0..1 scale).
        boxes: int [N, K, 4] (top, left, height, width) per image; height 0: no box. None: nothing erased.
        noise: the fill, broadcastable to [N, C, H, W] (per pixel, per image and channel, or zeros).
        mix: (lam, cut, box) of :func:`~lightvision.kernels.mix.mix_reversed_reference`: the result mixed with its
            reverse.
    """
    shape = (1, -1, 1, 1)
    z = (x.float() / 255.0 - mean.reshape(shape)) / std.reshape(shape)
    if boxes is not None:
        z = torch.where(_mask(boxes, *x.shape[-2:]), noise.to(z.dtype), z)
    return z if mix is None else mix_reversed_reference(z, *mix)


def normalize_erase(
    x: torch.Tensor,
    mean: torch.Tensor,
    std: torch.Tensor,
    boxes: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
    mix: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    seeds: torch.Tensor | None = None,
    per_pixel: bool = True,
    backend: str = "auto",
) -> torch.Tensor:
    """:func:`normalize_erase_reference` (same arguments) in one Triton launch.

    ``seeds``: int64 [N], instead of ``noise``: the program draws the fill, standard normal (Triton's Philox) keyed
    by seeds[n]: for each pixel i = y W + x of channel c the (i mod 4)-th of the four normals of counter
    c ceil(H W / 4) + i // 4 (``tl.randn4x``), or for each image and channel when not ``per_pixel`` the normal of
    counter c (``tl.randn``); it needs the program (a ValueError on the reference's path).
    ``backend``: "auto" runs the program on CUDA and the reference elsewhere; "triton" requires the program (CUDA,
    or Triton's interpreter); "torch" the reference.
    """
    if not program_runs(x, backend, x.dtype == torch.uint8 and x.dim() == 4, "uint8 [N, C, H, W] images"):
        if seeds is not None:
            raise ValueError("normalize_erase draws the fill from seeds in its Triton program only: pass noise")
        return normalize_erase_reference(x, mean, std, boxes, noise, mix)
    n, c, height, width = x.shape
    x = x.contiguous()
    if boxes is None:  # no box: an empty one per image, the fill never read
        boxes, noise, seeds = torch.zeros((n, 1, 4), dtype=torch.int64, device=x.device), None, None
    if noise is None:  # drawn from the seeds, or never read
        noise = torch.zeros((), dtype=torch.float32, device=x.device)
    fill = noise.float().expand(n, c, height, width)  # strides of the broadcast dims are 0: nothing copied
    mixing = mix_arguments(*mix) if mix is not None else {"WEIGHTS": fill, "CUT": fill, "BOX": fill}  # unread
    out = empty((n, c, height, width), torch.float32, x.device)
    from ._triton import normalize_erase_kernel  # Triton is imported when a kernel first runs

    images = -(-n // 2) if mix is not None else n  # mixing: a program writes an image and its mirror
    normalize_erase_kernel[(images, -(-height * width // BLOCK))](
        X=x, MEAN=mean.float().reshape(-1).contiguous(), STD=std.float().reshape(-1).contiguous(),
        BOXES=boxes.long().contiguous(), NOISE=fill, SEEDS=fill if seeds is None else seeds.long().contiguous(),
        **mixing, OUT=out, N=n, H=height, W=width,
        s_nn=fill.stride(0), s_nc=fill.stride(1), s_nh=fill.stride(2), s_nw=fill.stride(3),
        C=c, K=boxes.shape[1], SEEDED=seeds is not None, PER_PIXEL=per_pixel, MIX=mix is not None, BLOCK=BLOCK,
        num_warps=NUM_WARPS, enable_fp_fusion=False,
    )  # fmt: skip
    return out
