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

Images stay uint8 (rounded after each resampling, as PIL keeps them) until normalisation. A batch's draws are one
tensor of uniforms drawn on the batch's device from :func:`~lightvision.engine.batch_random` (keyed by seed, step and
micro-batch, so a resumed run draws the same); every per-image parameter is computed from them on the device, and
every step issues the same operations with no host synchronisation. On CUDA the crops' boxes are read by the resize
program on the device (bicubic and bilinear; "nearest" crops image by image, reading the boxes back); the crops' and
the erasing boxes' draws are one program each there (:func:`~lightvision.kernels.augment.crop_boxes`,
:func:`~lightvision.kernels.augment.erase_boxes_program`; the functions here are their spec), the erasing noise is
drawn by the normalisation's program from a seed per image (elsewhere: a noise tensor from the same draws), and the
boxes' draw (:meth:`DeviceTrainTransform.boxes`) and the rest (:meth:`DeviceTrainTransform.augment`) are replayed as
CUDA graphs captured once per batch shape (:class:`~lightvision.classify.graphed.GraphedCall`). Given the recipe's
:class:`~lightvision.classify.device_mixup.DeviceMixup`, :meth:`DeviceTrainTransform.batch` mixes the batch in that
same program and graph.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from lightvision.classify.device_mixup import DeviceMixup
from lightvision.classify.graphed import DeviceConstants, GraphedCall
from lightvision.classify.rand_augment import GRID_MODES, BatchRandAugment, apply_op
from lightvision.engine import batch_random
from lightvision.kernels.augment import crop_boxes, erase_boxes_program
from lightvision.kernels.erase import normalize_erase
from lightvision.kernels.resize import image_sizes, resize, resized_crops
from lightvision.ops._checks import check_choice

__all__ = [
    "CROP_COLUMNS",
    "DeviceEvalTransform",
    "DeviceTrainTransform",
    "ERASE_COLUMNS",
    "erase_boxes",
    "resized_crop_params",
]

RRC_RATIO = (3.0 / 4.0, 4.0 / 3.0)
ERASE_AREA = (0.02, 1.0 / 3.0)
ERASE_RATIO = (0.3, 1.0 / 0.3)
ATTEMPTS = 10
JITTER_OPS = ("Brightness", "Contrast", "Color")  # torchvision ColorJitter's b, c, s on PIL = PIL's enhancers


def _draws_by_program(t: torch.Tensor) -> bool:
    """Whether the boxes of a batch on ``t``'s device are drawn by the Triton programs (CUDA) or the functions here."""
    return t.is_cuda


def _uniform(u: torch.Tensor, low: float, high: float) -> torch.Tensor:
    return low + (high - low) * u


def _first_fit(ok: torch.Tensor, *values: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per row, the values of the first attempt where ``ok`` holds; ok [N, T], values [N, T] -> [N] each."""
    first = ok.to(torch.uint8).argmax(1, keepdim=True)
    return tuple(v.gather(1, first)[:, 0] for v in values)


CROP_COLUMNS = 2 * ATTEMPTS + 2  # uniforms per image of a resized-crop draw: area and aspect per attempt, place
ERASE_COLUMNS = 2 * ATTEMPTS + 2  # ... of one erasing box
SEED_SCALE = 2.0**53  # a uniform's float64 mantissa as an int64 seed of the erasing noise's program


def resized_crop_params(
    sizes: torch.Tensor, scale: Sequence[float], u: torch.Tensor, ratio: Sequence[float] = RRC_RATIO
) -> torch.Tensor:
    """timm's ``RandomResizedCropAndInterpolation.get_params`` for a batch, from uniforms (no host work).

    Args:
        sizes: int64 [N, 2], (height, width) of each image, on u's device.
        scale, ratio: ranges of the crop's area fraction and aspect ratio (width / height).
        u: float64 [N, ``CROP_COLUMNS``] uniforms in [0, 1).
    Returns:
        int64 [N, 4]: (top, left, height, width) of each crop.
    """
    h, w = sizes[:, 0:1].double(), sizes[:, 1:2].double()
    area = _uniform(u[:, :ATTEMPTS], *scale) * h * w
    aspect = _uniform(u[:, ATTEMPTS : 2 * ATTEMPTS], math.log(ratio[0]), math.log(ratio[1])).exp()
    tw, th = (area * aspect).sqrt().round(), (area / aspect).sqrt().round()
    ok = (tw <= w) & (th <= h)
    cw, ch = _first_fit(ok, tw, th)
    h, w = h[:, 0], w[:, 0]
    in_ratio = w / h  # no attempt fits: the centre crop of the closest allowed aspect ratio
    fw = torch.where(in_ratio > max(ratio), (h * max(ratio)).round(), w)
    fh = torch.where(in_ratio < min(ratio), (w / min(ratio)).round(), h)
    fits = ok.any(1)
    ch, cw = torch.where(fits, ch, fh), torch.where(fits, cw, fw)
    place = u[:, 2 * ATTEMPTS :]
    top = torch.where(fits, (place[:, 0] * (h - ch + 1)).floor(), ((h - ch) / 2).floor())
    left = torch.where(fits, (place[:, 1] * (w - cw + 1)).floor(), ((w - cw) / 2).floor())
    return torch.stack([top, left, ch, cw], 1).long()


def crop_constants(scale: Sequence[float], ratio: Sequence[float] = RRC_RATIO) -> torch.Tensor:
    """:func:`resized_crop_params`' ranges as the float64 constants of its program
    (:func:`~lightvision.kernels.augment.crop_boxes`), host tensor."""
    low, high = math.log(ratio[0]), math.log(ratio[1])
    values = (scale[0], scale[1] - scale[0], low, high - low, min(ratio), max(ratio))
    return torch.tensor(values, dtype=torch.float64)


def erase_constants(prob: float) -> torch.Tensor:
    """:func:`erase_boxes`' ranges and probability as the float64 constants of its program
    (:func:`~lightvision.kernels.augment.erase_boxes_program`), host tensor."""
    low, high = math.log(ERASE_RATIO[0]), math.log(ERASE_RATIO[1])
    values = (ERASE_AREA[0], ERASE_AREA[1] - ERASE_AREA[0], low, high - low, prob)
    return torch.tensor(values, dtype=torch.float64)


def erase_boxes(height: int, width: int, prob: float, max_count: int, u: torch.Tensor) -> torch.Tensor:
    """timm ``RandomErasing`` boxes, from uniforms (no host work): per image with ``prob``, 1..``max_count`` boxes
    (uniform), each the first of 10 attempts that fits.

    Args:
        u: float64 [N, 2 + max_count * ``ERASE_COLUMNS``] uniforms in [0, 1).
    Returns:
        int64 [N, max_count, 4]: (top, left, height, width); height 0 where nothing is erased.
    """
    n = u.shape[0]
    count = (u[:, :1] * max_count).floor().clamp(max=max_count - 1) + 1  # [N, 1]
    erased = u[:, 1:2] < prob
    u = u[:, 2:].reshape(n, max_count, ERASE_COLUMNS)
    area = _uniform(u[..., :ATTEMPTS], *ERASE_AREA) * height * width / count[..., None]
    aspect = _uniform(u[..., ATTEMPTS : 2 * ATTEMPTS], math.log(ERASE_RATIO[0]), math.log(ERASE_RATIO[1])).exp()
    bh, bw = (area * aspect).sqrt().round(), (area / aspect).sqrt().round()
    ok = ((bw < width) & (bh < height)).view(n * max_count, ATTEMPTS)
    bh, bw = _first_fit(ok, bh.view(n * max_count, ATTEMPTS), bw.view(n * max_count, ATTEMPTS))
    place = u[..., 2 * ATTEMPTS :].reshape(n * max_count, 2)
    top, left = (place[:, 0] * (height - bh + 1)).floor(), (place[:, 1] * (width - bw + 1)).floor()
    chosen = erased & (torch.arange(max_count, device=u.device) < count)  # [N, max_count]
    kept = chosen.reshape(-1) & ok.any(1)
    return torch.stack([top, left, bh * kept, bw], 1).long().view(n, max_count, 4)


def _resize(img: torch.Tensor, size: tuple[int, int], mode: str) -> torch.Tensor:
    """uint8 [3, h, w] -> uint8 [3, *size], antialiased when shrinking (as PIL resamples)."""
    return resize(img[None].float(), size, mode)[0].round().clamp(0, 255).to(torch.uint8)


def _placed_stats(mean: Sequence[float], std: Sequence[float]) -> DeviceConstants:
    """Per-channel mean and std as float [C], kept on each device (for
    :func:`~lightvision.kernels.erase.normalize_erase`)."""
    return DeviceConstants(torch.tensor(mean, dtype=torch.float32), torch.tensor(std, dtype=torch.float32))


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
        self.placed = _placed_stats(mean, std)

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
        x = torch.stack([self.crop(img) for img in images])
        return normalize_erase(x, *self.placed.get(x.device))

    def batch(self, images: Sequence[torch.Tensor], labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(images, labels) -> (:meth:`__call__`'s batch, labels)."""
        return self(images), labels


class DeviceTrainTransform:
    """The DeiT train transform (timm ``create_transform(is_training=True)``) on decoded images.

    Args:
        aug: the recipe's ``aug`` section (scale, auto_augment, color_jitter, interpolation, reprob, remode, recount,
            no_aug).
        img_size: output size S; mean, std: per-channel normalisation (0..1 scale).
        graph: on CUDA, capture :meth:`augment` and the crops' draw (:meth:`boxes`) once per batch shape as CUDA
            graphs and replay them (:class:`~lightvision.classify.graphed.GraphedCall`); False runs them op by op.
        cropped: the images come cropped and flipped (``data.pipeline: hybrid``: the loader workers ran timm's
            random resized crop and flip, see :func:`~lightvision.classify.cropped.crop_transform`), as one uint8
            [N, 3, S, S] batch; the transform draws and runs only what follows (``aug.no_aug``: normalisation).
        mixup: the recipe's Mixup / CutMix, applied by :meth:`batch` (in the normalisation's pass unless
            ``aug.no_aug``).
    """

    def __init__(
        self,
        aug: dict[str, Any],
        img_size: int,
        mean: Sequence[float],
        std: Sequence[float],
        graph: bool = True,
        cropped: bool = False,
        mixup: DeviceMixup | None = None,
    ):
        self.img_size, self.cropped, self.mixup = img_size, cropped, mixup
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
        widths = {
            "crop": 0 if cropped else CROP_COLUMNS,
            "flip": 0 if cropped else 1,
            "rand_augment": self.rand_augment.columns if self.rand_augment else 0,
            "jitter": 2 * len(JITTER_OPS) if self.jitter else 0,
            "erase": 2 + self.recount * ERASE_COLUMNS if self.reprob > 0 else 0,
            "noise": 1 if self.reprob > 0 and self.remode != "const" else 0,  # the erasing noise's seed
        }
        self.columns = {name: width for name, width in widths.items() if width}
        self.placed = _placed_stats(mean, std)
        self.run_augment = GraphedCall(self.augment) if graph else self.augment
        self.run_boxes = GraphedCall(self.boxes) if graph else self.boxes
        # the boxes' draws on CUDA: one program each (the spec's functions elsewhere)
        self.crop_constants = DeviceConstants(crop_constants(self.scale))
        self.erase_constants = DeviceConstants(erase_constants(self.reprob))

    def draw(self, n: int, device: torch.device) -> torch.Tensor:
        """The draws of a batch of ``n`` on ``device``, from the current :func:`~lightvision.engine.batch_random`
        (keyed by seed, step and micro-batch: a resumed run draws the same): float64 uniforms u [n, columns]
        (:meth:`split` names them). One launch, no host work; off CUDA the erasing noise follows from the same
        generator (:meth:`erase_fill`)."""
        return batch_random().rand((n, sum(self.columns.values())), device=device, dtype=torch.float64)

    def split(self, u: torch.Tensor) -> dict[str, torch.Tensor]:
        """:meth:`draw`'s uniforms [N, columns] by step (views): crop, flip, rand_augment, jitter, erase, noise."""
        return dict(zip(self.columns, u.split(list(self.columns.values()), 1), strict=True))

    def crop_flip(self, images: Sequence[torch.Tensor], u: torch.Tensor) -> torch.Tensor:
        """Random resized crop to S and horizontal flip: uint8 [3, H_i, W_i] per image (or uint8 [N, 3, H, W]) ->
        uint8 [N, 3, S, S] (``lightvision.kernels.resize``: one launch for the batch on CUDA, boxes drawn and read
        on the device); ``u``: :meth:`draw`'s uniforms [N, columns]."""
        return resized_crops(images, *self.crop_boxes(images, u), self.img_size, self.interpolation, rounded=True)

    def crop_boxes(self, images: Sequence[torch.Tensor], u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The crops (int64 [N, 4]: top, left, height, width) and flips (bool [N]) of :meth:`crop_flip`, on u's
        device."""
        return self.run_boxes(image_sizes(images).to(u.device, non_blocking=True), u)

    def boxes(self, sizes: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`crop_boxes` of images of ``sizes`` (int64 [N, 2], on u's device): the same launches whatever the
        draws, so it is replayed as a CUDA graph with ``graph``."""
        u = self.split(u)
        if _draws_by_program(sizes):
            (constants,) = self.crop_constants.get(sizes.device)
            return crop_boxes(sizes, u["crop"], constants, ATTEMPTS), u["flip"][:, 0] < 0.5
        return resized_crop_params(sizes, self.scale, u["crop"]), u["flip"][:, 0] < 0.5

    def color_jitter(self, x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """torchvision ``ColorJitter(b, c, s)``: factors uniform in [max(0, 1 - j), 1 + j], in a random order per
        image; uint8 [N, 3, S, S]; u float64 [N, 6]: factor and order draws. Every op runs on the whole batch at
        every place of the order, each image keeping the one its order puts there."""
        k = len(JITTER_OPS)
        factors = torch.stack([_uniform(u[:, i], max(0.0, 1 - j), 1 + j) for i, j in enumerate(self.jitter)], 1)
        order = u[:, k:].argsort(1)  # order[:, p]: the op applied p-th
        fill = torch.zeros(3, device=x.device)
        for p in range(k):
            for i, name in enumerate(JITTER_OPS):
                if self.jitter[i] > 0:
                    picked = (order[:, p] == i).view(-1, 1, 1, 1)
                    x = torch.where(picked, apply_op(x, name, factors[:, i].float(), fill), x)
        return x

    def erasing_boxes(self, x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """timm ``RandomErasing``'s boxes (int64 [N, recount, 4]: top, left, height, width; height 0: none) for the
        batch [N, 3, S, S]; u float64 [N, 2 + recount * ``ERASE_COLUMNS``]: their draws."""
        h, w = x.shape[-2:]
        if _draws_by_program(x):
            (constants,) = self.erase_constants.get(x.device)
            return erase_boxes_program(h, w, self.recount, u, constants, ATTEMPTS)
        return erase_boxes(h, w, self.reprob, self.recount, u)

    def erase_fill(self, x: torch.Tensor, u: torch.Tensor | None) -> dict[str, Any]:
        """The erasing fill of the batch x [N, 3, S, S] as :func:`~lightvision.kernels.erase.normalize_erase`'s
        keywords: on CUDA a seed per image (from u float64 [N, 1], the noise column; None for const) for its program
        to draw the noise (per pixel for ``aug.remode`` pixel, per image and channel for rand); elsewhere the noise
        itself, drawn from :func:`~lightvision.engine.batch_random` after :meth:`draw`; zeros for const."""
        if self.remode == "const":
            return {"noise": torch.zeros((1, 1, 1, 1), device=x.device)}
        per_pixel = self.remode == "pixel"
        if _draws_by_program(x):
            return {"seeds": (u[:, 0] * SEED_SCALE).long(), "per_pixel": per_pixel}
        shape = (len(x), 3, *x.shape[-2:]) if per_pixel else (len(x), 3, 1, 1)
        return {"noise": batch_random().randn(shape, device=x.device)}

    def augment(self, x: torch.Tensor, u: torch.Tensor, *mix: torch.Tensor) -> Any:
        """RandAugment, colour jitter, normalisation and erasing of the cropped batch uint8 [N, 3, S, S] -> float
        [N, 3, S, S]; ``u``: all of :meth:`draw`'s uniforms [N, columns]. With ``mix`` (labels int64 [N] and
        ``mixup``'s :meth:`~lightvision.classify.device_mixup.DeviceMixup.draw`), the batch is mixed in the
        normalisation's pass -> (mixed [N, 3, S, S], soft targets [N, classes]). The same launches whatever was
        drawn and no host synchronisation, so it can be captured as one CUDA graph."""
        named = self.split(u)
        if self.rand_augment is not None:
            x = self.rand_augment(x, named["rand_augment"])
        if self.jitter is not None:
            x = self.color_jitter(x, named["jitter"])
        boxes = self.erasing_boxes(x, named["erase"]) if self.reprob > 0 else None
        fill = self.erase_fill(x, named.get("noise")) if boxes is not None else {}
        mixing = self.mixup.params(*x.shape[-2:], *mix[1:]) if mix else None  # (lam, cut, box)
        out = normalize_erase(x, *self.placed.get(x.device), boxes, mix=mixing, **fill)  # one program on CUDA
        return (out, self.mixup.targets(mix[0], mixing[0])) if mix else out

    def _augmented(self, images: Sequence[torch.Tensor], *mix: torch.Tensor) -> Any:
        """:meth:`augment` (replayed as a graph) of the images cropped and flipped unless ``cropped``."""
        u = self.draw(len(images), images[0].device)
        x = images if self.cropped else self.crop_flip(images, u)
        return self.run_augment(x, u, *mix)

    def __call__(self, images: Sequence[torch.Tensor]) -> torch.Tensor:
        """uint8 [3, H_i, W_i] per image (``cropped``: uint8 [N, 3, S, S]) -> float [N, 3, S, S] augmented and
        normalised, on the images' device."""
        if self.no_aug:
            return normalize_erase(images, *self.placed.get(images.device)) if self.cropped else self.eval(images)
        return self._augmented(images)

    def batch(self, images: Sequence[torch.Tensor], labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(images as :meth:`__call__` takes them, labels int64 [N] on their device) -> (inputs float [N, 3, S, S],
        targets): the augmented images and the labels, or with ``mixup`` the images mixed (in the normalisation's
        pass, except with ``aug.no_aug``) and the soft targets."""
        if self.mixup is None:
            return self(images), labels
        if self.no_aug:
            return self.mixup(self(images), labels)
        return self._augmented(images, labels, *self.mixup.draw(labels.device))
