"""Random-resized-crop resampling of a batch of differently sized images into one [N, C, S, S] tensor.

The reference (the spec) resizes each crop with ``F.interpolate(mode, antialias=True)`` (PyTorch's form of PIL's
antialiased filters) and mirrors the flipped ones. On CUDA, bicubic and bilinear crops run as one Triton program
over the whole batch (``_triton.resized_crops_kernel``, same equation) after one copy that packs the images into a
single buffer: two launches for the batch instead of two per image, since the per-image launches, not the
arithmetic, set the time of this stage (docs/classify_input.md). Boxes and flips may be drawn on the device: the
program reads them there, so nothing waits for the host.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from .._launch import empty, interpreting

MODES = ("bicubic", "bilinear", "nearest")
KERNEL_MODES = {"bicubic": 2, "bilinear": 1}  # filter radius of the antialiased modes the program implements
BY, BX = 16, 64


def resize(x: torch.Tensor, size: tuple[int, int], mode: str) -> torch.Tensor:
    """float [B, C, h, w] -> [B, C, *size] by ``F.interpolate``, antialiased when shrinking (as PIL resamples)."""
    kwargs = {} if mode == "nearest" else {"align_corners": False, "antialias": True}
    return F.interpolate(x, size=size, mode=mode, **kwargs)


def image_sizes(images: Sequence[torch.Tensor]) -> torch.Tensor:
    """int64 [N, 2] (H_i, W_i) of uint8 [C, H_i, W_i] images, or of one [N, C, H, W] tensor (no per-image work)."""
    if isinstance(images, torch.Tensor):
        return torch.tensor(images.shape[-2:]).expand(len(images), 2)
    return torch.tensor([img.shape[-2:] for img in images])


def resized_crops_reference(
    images: Sequence[torch.Tensor], boxes: torch.Tensor, flip: torch.Tensor, size: int, mode: str = "bicubic"
) -> torch.Tensor:
    """Each image's crop resized to size x size, mirrored where ``flip``.

    Args:
        images: uint8 [C, H_i, W_i] per image, on one device (or one uint8 [N, C, H, W] tensor).
        boxes: int [N, 4] crop (top, left, height, width) per image, inside the image.
        flip: bool [N], mirror the resized crop left-right.
        size: output side S; mode: "bicubic" or "bilinear" (antialiased when shrinking, as PIL) or "nearest".
    Returns:
        float32 [N, C, S, S], the resampled values before rounding (0..255 up to the filters' overshoot).
    """
    crops = [img[None, :, t : t + h, left : left + w].float() for img, (t, left, h, w) in zip(images, boxes.tolist())]
    out = torch.cat([resize(crop, (size, size), mode) for crop in crops])
    mirrored = torch.nonzero(flip.cpu()).flatten().to(out.device)
    if mirrored.numel():
        out[mirrored] = out[mirrored].flip(-1)
    return out


def resized_crops(
    images: Sequence[torch.Tensor],
    boxes: torch.Tensor,
    flip: torch.Tensor,
    size: int,
    mode: str = "bicubic",
    backend: str = "auto",
) -> torch.Tensor:
    """:func:`resized_crops_reference` in one Triton launch for the batch.

    ``backend``: "auto" runs the program on CUDA for bicubic / bilinear crops of images with one channel count and
    the reference otherwise; "triton" requires the program (CUDA, or Triton's interpreter); "torch" the reference.
    ``images`` as one [N, C, H, W] tensor (images of one size) is read in place, without a per-image packing step.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if backend not in ("auto", "triton", "torch"):
        raise ValueError(f"backend must be 'auto', 'triton' or 'torch', got {backend!r}")
    device = images[0].device
    covered = mode in KERNEL_MODES and (isinstance(images, torch.Tensor) or len({img.shape[0] for img in images}) == 1)
    runnable = device.type == "cuda" or (backend == "triton" and interpreting())
    if backend == "triton" and not (covered and runnable):
        raise ValueError(
            f"backend='triton' needs bicubic / bilinear crops of images with one channel count on CUDA (or under "
            f"TRITON_INTERPRET=1); got mode {mode!r} on {device.type}"
        )
    if backend == "torch" or not (covered and runnable):
        return resized_crops_reference(images, boxes, flip, size, mode)
    if isinstance(images, torch.Tensor):  # one size, already one buffer: no per-image host work
        n, channels, height, width = images.shape
        packed = images.contiguous().reshape(-1)
        offsets = torch.arange(n) * (channels * height * width)
    else:
        channels = images[0].shape[0]
        flat = [img.contiguous().reshape(-1) for img in images]
        packed = torch.cat(flat)
        offsets = torch.tensor([0] + [f.numel() for f in flat[:-1]]).cumsum(0)
    placed = torch.cat([offsets[:, None], image_sizes(images)], 1).to(device, non_blocking=True)
    params = torch.cat([placed, boxes.to(device).long(), flip.to(device).long()[:, None]], 1)  # no host round trip
    out = empty((len(images), channels, size, size), torch.float32, device)
    grid = (len(images) * channels, -(-size // BY), -(-size // BX))
    from ._triton import resized_crops_kernel  # Triton is imported when a kernel first runs

    resized_crops_kernel[grid](
        SRC=packed, PARAMS=params, OUT=out, C=channels, S=size,
        BICUBIC=mode == "bicubic", RADIUS=KERNEL_MODES[mode], BY=BY, BX=BX,
    )  # fmt: skip
    return out
