"""The DeiT train and eval transforms of ``data.pipeline: gpu``, on decoded batches on any device.

Same steps and parameters as timm's ``create_transform`` (what ``data.pipeline: cpu`` runs per image in the loader
workers), per sample on the batch's device:

train: random resized crop (timm's draw: 10 tries of area in ``aug.scale`` x the image and log-uniform aspect
in [3/4, 4/3], else the centre crop) resized to ``img_size`` (antialiased, like PIL), horizontal flip (p 0.5),
RandAugment (:class:`~lightvision.classify.rand_augment.BatchRandAugment`), colour jitter when timm would apply
it (``aug.color_jitter`` set and no RandAugment/AutoAugment, as timm disables it there), normalisation, random
erasing (timm's ``RandomErasing``: per image with ``aug.reprob``, ``aug.recount`` boxes of 2%..1/3 of the area
and aspect in [0.3, 1/0.3], filled per ``aug.remode``). ``aug.no_aug``: resize + centre crop only.
eval: resize the short side to ``floor(img_size / crop_pct)``, centre crop ``img_size``, normalise.

Images stay uint8 (rounded after each resampling, as PIL keeps them) until normalisation. Every draw comes from
:func:`~lightvision.engine.batch_random` on the CPU (so a CUDA batch never waits for them, and a CPU run makes
the same draws as a GPU run).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from lightvision.classify.rand_augment import GRID_MODES, BatchRandAugment, apply_op
from lightvision.engine import batch_random
from lightvision.kernels.resize import image_sizes, resize, resized_crops
from lightvision.ops._checks import check_choice

__all__ = ["DeviceEvalTransform", "DeviceTrainTransform", "erase_boxes", "resized_crop_params"]

RRC_RATIO = (3.0 / 4.0, 4.0 / 3.0)
ERASE_AREA = (0.02, 1.0 / 3.0)
ERASE_RATIO = (0.3, 1.0 / 0.3)
ATTEMPTS = 10
JITTER_OPS = ("Brightness", "Contrast", "Color")  # torchvision ColorJitter's b, c, s on PIL = PIL's enhancers


def _uniform(br: Any, shape: tuple[int, ...], low: float, high: float) -> torch.Tensor:
    return low + (high - low) * br.rand(shape, device="cpu", dtype=torch.float64)


def _first_fit(ok: torch.Tensor, *values: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per row, the values of the first attempt where ``ok`` holds; ok [N, T], values [N, T] -> [N] each."""
    first = ok.to(torch.uint8).argmax(1, keepdim=True)
    return tuple(v.gather(1, first)[:, 0] for v in values)


def resized_crop_params(
    sizes: torch.Tensor, scale: Sequence[float], ratio: Sequence[float] = RRC_RATIO
) -> torch.Tensor:
    """timm's ``RandomResizedCropAndInterpolation.get_params`` for a batch.

    Args:
        sizes: int64 [N, 2], (height, width) of each image.
        scale, ratio: ranges of the crop's area fraction and aspect ratio (width / height).
    Returns:
        int64 [N, 4]: (top, left, height, width) of each crop.
    """
    br, n = batch_random(), sizes.shape[0]
    h, w = sizes[:, 0:1].double(), sizes[:, 1:2].double()
    area = _uniform(br, (n, ATTEMPTS), *scale) * h * w
    aspect = _uniform(br, (n, ATTEMPTS), math.log(ratio[0]), math.log(ratio[1])).exp()
    tw, th = (area * aspect).sqrt().round(), (area / aspect).sqrt().round()
    ok = (tw <= w) & (th <= h)
    cw, ch = _first_fit(ok, tw, th)
    h, w = h[:, 0], w[:, 0]
    in_ratio = w / h  # no attempt fits: the centre crop of the closest allowed aspect ratio
    fw = torch.where(in_ratio > max(ratio), (h * max(ratio)).round(), w)
    fh = torch.where(in_ratio < min(ratio), (w / min(ratio)).round(), h)
    fits = ok.any(1)
    ch, cw = torch.where(fits, ch, fh), torch.where(fits, cw, fw)
    u = br.rand((n, 2), device="cpu", dtype=torch.float64)
    top = torch.where(fits, (u[:, 0] * (h - ch + 1)).floor(), ((h - ch) / 2).floor())
    left = torch.where(fits, (u[:, 1] * (w - cw + 1)).floor(), ((w - cw) / 2).floor())
    return torch.stack([top, left, ch, cw], 1).long()


def erase_boxes(n: int, height: int, width: int, prob: float, max_count: int) -> torch.Tensor:
    """timm ``RandomErasing`` boxes: per image with ``prob``, 1..``max_count`` boxes (uniform), each the first of 10
    attempts that fits.

    Returns:
        int64 [N, max_count, 4]: (top, left, height, width); height 0 where nothing is erased.
    """
    br = batch_random()
    count = br.randint(1, max_count + 1, (n, 1), device="cpu") if max_count > 1 else torch.ones(n, 1, dtype=torch.long)
    shape = (n, max_count, ATTEMPTS)
    area = _uniform(br, shape, *ERASE_AREA) * height * width / count[..., None]
    aspect = _uniform(br, shape, math.log(ERASE_RATIO[0]), math.log(ERASE_RATIO[1])).exp()
    bh, bw = (area * aspect).sqrt().round(), (area / aspect).sqrt().round()
    ok = ((bw < width) & (bh < height)).view(n * max_count, ATTEMPTS)
    bh, bw = _first_fit(ok, bh.view(n * max_count, ATTEMPTS), bw.view(n * max_count, ATTEMPTS))
    u = br.rand((n * max_count, 2), device="cpu", dtype=torch.float64)
    top, left = (u[:, 0] * (height - bh + 1)).floor(), (u[:, 1] * (width - bw + 1)).floor()
    chosen = (br.rand((n, 1), device="cpu") < prob) & (torch.arange(max_count) < count)  # [N, max_count]
    erased = chosen.reshape(-1) & ok.any(1)
    return torch.stack([top, left, bh * erased, bw], 1).long().view(n, max_count, 4)


def _resize(img: torch.Tensor, size: tuple[int, int], mode: str) -> torch.Tensor:
    """uint8 [3, h, w] -> uint8 [3, *size], antialiased when shrinking (as PIL resamples)."""
    return resize(img[None].float(), size, mode)[0].round().clamp(0, 255).to(torch.uint8)


def _normalize(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    mean, std = mean.to(x.device).view(1, -1, 1, 1), std.to(x.device).view(1, -1, 1, 1)
    return (x.float() / 255.0 - mean) / std


class DeviceEvalTransform:
    """timm's eval transform on decoded images: short side to ``floor(img_size / crop_pct)``, centre crop, normalise.

    Args:
        img_size: output size S; crop_pct: resize fraction; interpolation: "bicubic", "bilinear" or "nearest";
        mean, std: per-channel normalisation (0..1 scale).
    """

    def __init__(self, img_size: int, crop_pct: float, interpolation: str, mean: Sequence[float], std: Sequence[float]):
        check_choice(interpolation, GRID_MODES, "aug.interpolation for data.pipeline=gpu")
        if not 0 < crop_pct <= 1:
            raise ValueError(f"data.crop_pct must be in (0, 1] for data.pipeline=gpu (no padding), got {crop_pct}")
        self.img_size, self.short = img_size, math.floor(img_size / crop_pct)
        self.interpolation = interpolation
        self.mean, self.std = torch.tensor(mean), torch.tensor(std)

    def crop(self, img: torch.Tensor) -> torch.Tensor:
        """uint8 [3, h, w] -> uint8 [3, S, S] (torchvision ``Resize(int)`` + ``CenterCrop``)."""
        h, w = img.shape[-2:]
        short, long = (h, w) if h <= w else (w, h)
        new_long = int(self.short * long / short)
        size = (self.short, new_long) if h <= w else (new_long, self.short)
        img = _resize(img, size, self.interpolation)
        top, left = round((size[0] - self.img_size) / 2), round((size[1] - self.img_size) / 2)
        return img[:, top : top + self.img_size, left : left + self.img_size]

    def __call__(self, images: Sequence[torch.Tensor]) -> torch.Tensor:
        """uint8 [3, H_i, W_i] per image -> float [N, 3, S, S] normalised, on the images' device."""
        return _normalize(torch.stack([self.crop(img) for img in images]), self.mean, self.std)


class DeviceTrainTransform:
    """The DeiT train transform (timm ``create_transform(is_training=True)``) on decoded images.

    Args:
        aug: the recipe's ``aug`` section (scale, auto_augment, color_jitter, interpolation, reprob, remode, recount,
            no_aug).
        img_size: output size S; mean, std: per-channel normalisation (0..1 scale).
    """

    def __init__(self, aug: dict[str, Any], img_size: int, mean: Sequence[float], std: Sequence[float]):
        self.img_size, self.mean, self.std = img_size, torch.tensor(mean), torch.tensor(std)
        self.interpolation = aug.get("interpolation", "bicubic")
        check_choice(self.interpolation, GRID_MODES, "aug.interpolation for data.pipeline=gpu")
        check_choice(aug.get("remode", "pixel"), ("pixel", "rand", "const"), "aug.remode")
        self.no_aug = bool(aug.get("no_aug", False))
        self.eval = DeviceEvalTransform(img_size, 1.0, self.interpolation, mean, std)  # timm's no_aug transform
        self.scale = tuple(aug.get("scale", (0.08, 1.0)))
        auto = aug.get("auto_augment") or None
        self.rand_augment = BatchRandAugment(auto, img_size, mean, self.interpolation) if auto else None
        jitter = aug.get("color_jitter")
        self.jitter = None
        if jitter and not (auto and "3a" not in auto):  # timm: RandAugment / AutoAugment switch jitter off
            jitter = [float(jitter)] * 3 if isinstance(jitter, (int, float)) else [float(j) for j in jitter]
            if len(jitter) != 3:
                raise ValueError(
                    f"aug.color_jitter for data.pipeline=gpu is one value or [brightness, contrast, "
                    f"saturation], got {aug.get('color_jitter')!r}"
                )
            self.jitter = jitter
        self.reprob, self.remode = float(aug.get("reprob", 0.0)), aug.get("remode", "pixel")
        self.recount = int(aug.get("recount", 1))

    def crop_flip(self, images: Sequence[torch.Tensor]) -> torch.Tensor:
        """Random resized crop to S and horizontal flip: uint8 [3, H_i, W_i] per image (or uint8 [N, 3, H, W]) ->
        uint8 [N, 3, S, S] (``lightvision.kernels.resize``: one launch for the batch on CUDA)."""
        boxes = resized_crop_params(image_sizes(images), self.scale)
        flip = batch_random().rand(len(images), device="cpu") < 0.5
        x = resized_crops(images, boxes, flip, self.img_size, self.interpolation)
        return x.round_().clamp_(0, 255).to(torch.uint8)

    def color_jitter(self, x: torch.Tensor) -> torch.Tensor:
        """torchvision ``ColorJitter(b, c, s)``: factors uniform in [max(0, 1 - j), 1 + j], in a random order per
        image; uint8 [N, 3, S, S]."""
        br, n = batch_random(), x.shape[0]
        factors = torch.stack([_uniform(br, (n,), max(0.0, 1 - j), 1 + j).float() for j in self.jitter], 1)
        order = br.rand((n, len(JITTER_OPS)), device="cpu").argsort(1)  # order[:, p]: the op applied p-th
        for p in range(len(JITTER_OPS)):
            for k, name in enumerate(JITTER_OPS):
                rows = torch.nonzero((order[:, p] == k) & (self.jitter[k] > 0)).flatten()
                if rows.numel():
                    idx = rows.to(x.device, non_blocking=True)
                    x[idx] = apply_op(x[idx], name, factors[rows, k].to(x.device), torch.zeros(3, device=x.device))
        return x

    def erase(self, x: torch.Tensor) -> torch.Tensor:
        """timm ``RandomErasing`` on the normalised batch float [N, 3, S, S]."""
        n, c, h, w = x.shape
        boxes = erase_boxes(n, h, w, self.reprob, self.recount).to(x.device, non_blocking=True)
        top, left, bh, bw = (boxes[..., i, None] for i in range(4))  # [N, count, 1]
        rows, cols = torch.arange(h, device=x.device), torch.arange(w, device=x.device)
        in_rows = (rows >= top) & (rows < top + bh)  # [N, count, H]
        in_cols = (cols >= left) & (cols < left + bw)  # [N, count, W]
        mask = (in_rows[..., :, None] & in_cols[..., None, :]).any(1)[:, None]  # [N, 1, H, W]
        br = batch_random()
        if self.remode == "pixel":
            fill = br.randn((n, c, h, w), device=x.device, dtype=x.dtype)
        elif self.remode == "rand":
            fill = br.randn((n, c, 1, 1), device=x.device, dtype=x.dtype)
        else:
            fill = torch.zeros((), device=x.device, dtype=x.dtype)
        return torch.where(mask, fill, x)

    def __call__(self, images: Sequence[torch.Tensor]) -> torch.Tensor:
        """uint8 [3, H_i, W_i] per image -> float [N, 3, S, S] augmented and normalised, on the images' device."""
        if self.no_aug:
            return self.eval(images)
        x = self.crop_flip(images)
        if self.rand_augment is not None:
            x = self.rand_augment(x)
        if self.jitter is not None:
            x = self.color_jitter(x)
        x = _normalize(x, self.mean, self.std)
        return self.erase(x) if self.reprob > 0 else x
