"""Random-resized-crop resampling of a batch of differently sized images into one [N, C, S, S] tensor.

The reference (the spec) resizes each crop with ``F.interpolate(mode, antialias=True)`` (PyTorch's form of PIL's
antialiased filters) and mirrors the flipped ones. On CUDA, bicubic and bilinear crops run as one Triton program over
the whole batch (``_triton.resized_crops_kernel``, same equation) after one copy that packs the images into a single
buffer (an image given for several samples packed once): two launches for the batch instead of two per image, since the
per-image launches, not the arithmetic, set the time of this stage (docs/classify_input.md); images that arrive packed
already (:class:`PackedImages`) are read in place. Boxes and flips may be drawn on the device: the program reads them
there, so nothing waits for the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .._launch import empty, program_runs

MODES = ("bicubic", "bilinear", "nearest")
KERNEL_MODES = {"bicubic": 2, "bilinear": 1}  # filter radius of the antialiased modes the program implements
# the program's output tile (rows, columns) by its horizontal taps, the fastest of 3 x 3 tiles on an H200 for 128
# bicubic crops to 224 px: at 16 taps (images 448 to 895 px wide, e.g. ~500 x 375) 16 x 32, 0.59 ms against 0.65 at
# 16 x 64; at 8 taps (224 to 447 px wide, e.g. shrunk to a 256 px shorter side) 8 x 128, 0.28 ms against 0.33 at
# 16 x 64 (benchmarks/results/input_gpu_augment_profile_fused_h200x1_20261129.json, ..._taps8_256px_...)
TILES = {8: (8, 128), 16: (16, 32)}
DEFAULT_TILE = (16, 64)


@dataclass
class PackedImages:
    """Images of several sizes back to back in one buffer: ``data`` uint8 [sum of C * H_j * W_j] (on any device),
    ``sizes`` int64 [M, 2] (H_j, W_j of each stored image, on the host), ``channels`` C, and ``index`` int64 [N] (on
    the host; None: ``arange(M)``): the stored image each of the N samples reads, so the repeats of an image (DeiT's
    repeated augmentation) are stored once. Indexing gives sample i as a [C, H, W] view. Having no ``.to``, a batch
    holding it stays on the host when accelerate moves the rest (:meth:`on` copies it); not a ``Sequence``
    subclass, so the DataLoader page-locks it through :meth:`pin_memory` whole."""

    data: torch.Tensor
    sizes: torch.Tensor
    channels: int = 3
    index: torch.Tensor | None = None
    offsets: torch.Tensor = field(init=False, repr=False)  # int64 [M]: where each stored image starts in ``data``

    def __post_init__(self) -> None:
        areas = self.channels * self.sizes[:, 0] * self.sizes[:, 1]
        self.offsets = torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]])
        if int(areas.sum()) != self.data.numel():
            raise ValueError(f"PackedImages: {self.data.numel()} values for images of {int(areas.sum())}")
        if (
            self.index is not None
            and len(self.index)
            and not 0 <= int(self.index.min()) <= int(self.index.max()) < len(self.sizes)
        ):
            raise ValueError(f"PackedImages: index outside the {len(self.sizes)} stored images")

    @classmethod
    def pack(cls, images: Sequence[torch.Tensor]) -> PackedImages:
        """uint8 [C, H_i, W_i] per sample (one C) -> one buffer; a tensor given for several samples (the same
        object) is stored once."""
        stored: dict[int, int] = {}
        index = [stored.setdefault(id(img), len(stored)) for img in images]
        distinct = list({id(img): img for img in images}.values())
        sizes = torch.tensor([img.shape[-2:] for img in distinct], dtype=torch.int64).view(-1, 2)
        repeated = len(distinct) < len(images)
        data = torch.cat([img.reshape(-1) for img in distinct])
        return cls(data, sizes, images[0].shape[0], torch.tensor(index) if repeated else None)

    def sample_offsets(self) -> torch.Tensor:
        """int64 [N]: where each sample's image starts in ``data``."""
        return self.offsets if self.index is None else self.offsets[self.index]

    def sample_sizes(self) -> torch.Tensor:
        """int64 [N, 2]: (H, W) of each sample's image."""
        return self.sizes if self.index is None else self.sizes[self.index]

    def __len__(self) -> int:
        return len(self.sizes) if self.index is None else len(self.index)

    def __getitem__(self, i: int) -> torch.Tensor:
        if not -len(self) <= i < len(self):
            raise IndexError(f"image {i} of {len(self)}")
        j = i if self.index is None else int(self.index[i])
        height, width = self.sizes[j].tolist()
        start = int(self.offsets[j])
        return self.data[start : start + self.channels * height * width].view(self.channels, height, width)

    def pin_memory(self) -> PackedImages:
        """The buffer page-locked (the DataLoader's ``pin_memory`` calls this)."""
        return PackedImages(self.data.pin_memory(), self.sizes, self.channels, self.index)

    def on(self, device: torch.device) -> PackedImages:
        """The buffer on ``device``: one copy, asynchronous from page-locked memory on the current stream."""
        return PackedImages(self.data.to(device, non_blocking=True), self.sizes, self.channels, self.index)


def resize(x: torch.Tensor, size: tuple[int, int], mode: str) -> torch.Tensor:
    """float [B, C, h, w] -> [B, C, *size] by ``F.interpolate``, antialiased when shrinking (as PIL resamples)."""
    kwargs = {} if mode == "nearest" else {"align_corners": False, "antialias": True}
    return F.interpolate(x, size=size, mode=mode, **kwargs)


def image_sizes(images: Sequence[torch.Tensor]) -> torch.Tensor:
    """int64 [N, 2] (H_i, W_i) of uint8 [C, H_i, W_i] images, of one [N, C, H, W] tensor or of :class:`PackedImages`
    (no per-image work for those two)."""
    if isinstance(images, PackedImages):
        return images.sample_sizes()
    if isinstance(images, torch.Tensor):
        return torch.tensor(images.shape[-2:]).expand(len(images), 2)
    return torch.tensor([img.shape[-2:] for img in images])


def horizontal_taps(sizes: torch.Tensor, size: int, mode: str) -> int:
    """The least power of two at least the most input columns one output column of any crop of these images (int64
    [N, 2] (H, W)) resized to ``size`` reads: floor(2 R max(w / S, 1)) + 1 for a crop w <= W wide, filter radius R
    (the program's window [int(c - R s + 0.5), int(c + R s + 0.5)) holds at most that many)."""
    stretch = max(int(sizes[:, 1].max()) / size, 1.0) if len(sizes) else 1.0
    most = int(2 * KERNEL_MODES[mode] * stretch) + 1
    return 1 << (most - 1).bit_length()


def resized_crops_reference(
    images: Sequence[torch.Tensor],
    boxes: torch.Tensor,
    flip: torch.Tensor,
    size: int,
    mode: str = "bicubic",
    rounded: bool = False,
) -> torch.Tensor:
    """Each image's crop resized to size x size, mirrored where ``flip``.

    Args:
        images: uint8 [C, H_i, W_i] per image, on one device (or one uint8 [N, C, H, W] tensor).
        boxes: int [N, 4] crop (top, left, height, width) per image, inside the image.
        flip: bool [N], mirror the resized crop left-right.
        size: output side S; mode: "bicubic" or "bilinear" (antialiased when shrinking, as PIL) or "nearest".
        rounded: return the values as PIL keeps them: rounded half to even, clipped, uint8.
    Returns:
        float32 [N, C, S, S], the resampled values before rounding (0..255 up to the filters' overshoot); uint8 with
        ``rounded``.
    """
    crops = [img[None, :, t : t + h, left : left + w].float() for img, (t, left, h, w) in zip(images, boxes.tolist())]
    out = torch.cat([resize(crop, (size, size), mode) for crop in crops])
    mirrored = torch.nonzero(flip.cpu()).flatten().to(out.device)
    if mirrored.numel():
        out[mirrored] = out[mirrored].flip(-1)
    return out.round_().clamp_(0, 255).to(torch.uint8) if rounded else out


def resized_crops(
    images: Sequence[torch.Tensor],
    boxes: torch.Tensor,
    flip: torch.Tensor,
    size: int,
    mode: str = "bicubic",
    backend: str = "auto",
    rounded: bool = False,
    tile: tuple[int, int] | None = None,
) -> torch.Tensor:
    """:func:`resized_crops_reference` in one Triton launch for the batch (with ``rounded`` the program stores the
    rounded uint8 values itself: no float batch is written and read back). ``tile``: the program's output tile (rows,
    columns); None: the one :data:`TILES` names for the images' taps.

    ``backend``: "auto" runs the program on CUDA for bicubic / bilinear crops of images with one channel count and
    the reference otherwise; "triton" requires the program (CUDA, or Triton's interpreter); "torch" the reference.
    ``images`` as one [N, C, H, W] tensor (images of one size) or as :class:`PackedImages` is read in place, without a
    per-image packing step.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    device = images[0].device
    one_layout = isinstance(images, (torch.Tensor, PackedImages)) or len({img.shape[0] for img in images}) == 1
    covered = mode in KERNEL_MODES and one_layout
    needs = "bicubic / bilinear crops of images with one channel count"
    if not program_runs(images[0], backend, covered, needs, f"mode {mode!r} on {device.type}"):
        return resized_crops_reference(images, boxes, flip, size, mode, rounded)
    if isinstance(images, torch.Tensor):  # one size, already one buffer: no per-image host work
        n, channels, height, width = images.shape
        packed = images.contiguous().reshape(-1)
        offsets = torch.arange(n) * (channels * height * width)
    else:
        if not isinstance(images, PackedImages):
            images = PackedImages.pack(images)
        packed, offsets, channels = images.data, images.sample_offsets(), images.channels
    sizes = image_sizes(images)
    placed = torch.cat([offsets[:, None], sizes], 1).to(device, non_blocking=True)
    params = torch.cat([placed, boxes.to(device).long(), flip.to(device).long()[:, None]], 1)  # no host round trip
    out = empty((len(images), channels, size, size), torch.uint8 if rounded else torch.float32, device)
    taps = horizontal_taps(sizes, size, mode)
    rows, cols = tile or TILES.get(taps, DEFAULT_TILE)
    grid = (len(images) * channels, -(-size // rows), -(-size // cols))
    from ._triton import resized_crops_kernel  # Triton is imported when a kernel first runs

    resized_crops_kernel[grid](
        SRC=packed, PARAMS=params, OUT=out, C=channels, S=size,
        BICUBIC=mode == "bicubic", RADIUS=KERNEL_MODES[mode], BY=rows, BX=cols, TAPS=taps,
        ROUNDED=rounded,
    )  # fmt: skip
    return out
