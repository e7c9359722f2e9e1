"""RandAugment on a batch of uint8 images on any device, with timm's ops, levels and draws.

timm parses the recipe string (``rand-m9-mstd0.5-inc1``: magnitude 9, magnitude noise std 0.5, the "increasing"
op set; see ``timm.data.auto_augment.rand_augment_transform``); :class:`BatchRandAugment` keeps its op names,
probability, magnitude and layer count and applies them to a whole batch: every image draws its own op per
layer (uniform, with replacement), applies it with the op's probability, at magnitude N(m, std) clipped to
[0, mmax], with a random sign where timm negates. The ops follow PIL's (what timm calls) on uint8 values:
colour ops blend with PIL's degenerate images and truncate like ``Image.blend``; geometric ops sample the
output through the same affine maps as PIL (rotation about the centre, shear about the top-left corner,
translation by a fraction of the size) with the recipe's interpolation, and fill with the mean colour.
Draws come from :func:`~lightvision.engine.batch_random` (on the CPU, so the device never waits for them).
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
import torchvision.transforms.v2.functional as TF
from timm.data.auto_augment import rand_augment_transform

from lightvision.engine import batch_random
from lightvision.ops._checks import check_choice

__all__ = ["BatchRandAugment", "GEOMETRIC_OPS", "OPS", "affine_theta", "apply_op", "level_to_arg"]

LEVEL_DENOM = 10.0
GEOMETRIC_OPS = ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
GRID_MODES = ("bilinear", "bicubic", "nearest")
OPS = (
    *GEOMETRIC_OPS,
    "AutoContrast",
    "Equalize",
    "Invert",
    "Posterize",
    "PosterizeIncreasing",
    "PosterizeOriginal",
    "Solarize",
    "SolarizeIncreasing",
    "SolarizeAdd",
    "Color",
    "ColorIncreasing",
    "Contrast",
    "ContrastIncreasing",
    "Brightness",
    "BrightnessIncreasing",
    "Sharpness",
    "SharpnessIncreasing",
)


def level_to_arg(name: str, level: torch.Tensor, negate: torch.Tensor, translate_pct: float = 0.45) -> torch.Tensor:
    """timm's ``LEVEL_TO_ARG[name]`` for a batch of magnitudes.

    Args:
        level: float [N], magnitudes already clipped to [0, mmax].
        negate: bool [N], where timm's ``_randomly_negate`` flips the sign (ignored by unsigned ops).
    Returns:
        float [N], the op argument (degrees, blend factor, shear, fraction, bits, threshold, offset; 0 when the op
        takes none).
    """
    x = level / LEVEL_DENOM
    sign = torch.where(negate, -1.0, 1.0)
    if name == "Rotate":
        return x * 30.0 * sign
    if name in ("ShearX", "ShearY"):
        return x * 0.3 * sign
    if name in ("TranslateXRel", "TranslateYRel"):
        return x * translate_pct * sign
    if name.endswith("Increasing") and name[: -len("Increasing")] in ("Color", "Contrast", "Brightness", "Sharpness"):
        return (1.0 + x * 0.9 * sign).clamp(min=0.1)
    if name in ("Color", "Contrast", "Brightness", "Sharpness"):
        return x * 1.8 + 0.1
    if name == "Posterize":
        return (x * 4).floor()
    if name == "PosterizeIncreasing":
        return 4 - (x * 4).floor()
    if name == "PosterizeOriginal":
        return (x * 4).floor() + 4
    if name == "Solarize":
        return (x * 256).floor().clamp(max=256)
    if name == "SolarizeIncreasing":
        return 256 - (x * 256).floor().clamp(max=256)
    if name == "SolarizeAdd":
        return (x * 110).floor().clamp(max=128)
    return torch.zeros_like(level)


def _luma(x: torch.Tensor) -> torch.Tensor:
    """PIL's ``convert("L")`` (ITU-R 601-2, fixed point): uint8 [N, 3, H, W] -> int32 [N, 1, H, W]."""
    r, g, b = x.int().unbind(1)
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16)[:, None]


def _blend(degenerate: torch.Tensor, x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL ``Image.blend(degenerate, x, factor)``: interpolate or extrapolate, clip, truncate to uint8."""
    d = degenerate.float()
    return (d + factor.view(-1, 1, 1, 1) * (x.float() - d)).clamp(0, 255).to(torch.uint8)


def _smooth(x: torch.Tensor) -> torch.Tensor:
    """PIL's ``ImageFilter.SMOOTH`` (3x3, centre 5, others 1, / 13, rounded); the border keeps its pixels."""
    kernel = torch.ones(3, 1, 3, 3, device=x.device)
    kernel[:, :, 1, 1] = 5.0
    inner = (F.conv2d(x.float(), kernel, groups=3) / 13.0).round().to(torch.uint8)
    out = x.clone()
    out[..., 1:-1, 1:-1] = inner
    return out


def affine_theta(name: str, arg: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The geometric op's sampling map for ``F.affine_grid``: float [N, 2, 3] on ``arg``'s device.

    PIL's ``Image.transform(AFFINE)`` / ``rotate`` samples each output pixel centre (u, v) at
    (a u + b v + c, d u + e v + f) in pixels from the top-left corner; with x_n = 2 x / W - 1, y_n = 2 y / H - 1
    that is the map [[a, b H/W, a + b H/W + 2c/W - 1], [d W/H, e, d W/H + e + 2f/H - 1]] of normalised coordinates.
    """
    one, zero = torch.ones_like(arg), torch.zeros_like(arg)
    h, w = float(height), float(width)
    if name == "Rotate":  # counter-clockwise by arg degrees about the centre (PIL rotate)
        rad = -arg * math.pi / 180.0
        cos, sin = rad.cos(), rad.sin()
        cx, cy = w / 2.0, h / 2.0
        a, b, c, d, e, f = cos, sin, cx - cos * cx - sin * cy, -sin, cos, cy + sin * cx - cos * cy
    elif name == "ShearX":
        a, b, c, d, e, f = one, arg, zero, zero, one, zero
    elif name == "ShearY":
        a, b, c, d, e, f = one, zero, zero, arg, one, zero
    elif name == "TranslateXRel":
        a, b, c, d, e, f = one, zero, arg * w, zero, one, zero
    else:  # TranslateYRel
        a, b, c, d, e, f = one, zero, zero, zero, one, arg * h
    rows = (a, b * h / w, a + b * h / w + 2 * c / w - 1, d * w / h, e, d * w / h + e + 2 * f / h - 1)
    return torch.stack(rows, 1).view(-1, 2, 3)


def _warp(x: torch.Tensor, theta: torch.Tensor, fill: torch.Tensor, mode: str) -> torch.Tensor:
    """Each uint8 [N, 3, H, W] image resampled through its own ``theta`` [N, 2, 3] (:func:`affine_theta`), outside
    the image filled with ``fill`` [3] (0..255); rounded back to uint8."""
    grid = F.affine_grid(theta.float(), list(x.shape), align_corners=False)
    fill = fill.view(1, -1, 1, 1)
    out = F.grid_sample(x.float() - fill, grid, mode=mode, padding_mode="zeros", align_corners=False) + fill
    return out.round().clamp(0, 255).to(torch.uint8)


def apply_op(x: torch.Tensor, name: str, arg: torch.Tensor, fill: torch.Tensor, mode: str = "bicubic") -> torch.Tensor:
    """One timm RandAugment op on a batch, each image with its own argument.

    Args:
        x: uint8 [N, 3, H, W].
        name: one of ``OPS`` (timm's ``NAME_TO_OP`` keys but the blur / desaturate / absolute-translate ones).
        arg: float [N] on x's device, the op's argument (:func:`level_to_arg`).
        fill: float [3], the colour geometric ops fill with (0..255).
        mode: grid_sample interpolation of the geometric ops.
    Returns:
        uint8 [N, 3, H, W].
    """
    base = name[: -len("Increasing")] if name.endswith("Increasing") else name
    if name in GEOMETRIC_OPS:
        return _warp(x, affine_theta(name, arg, x.shape[-2], x.shape[-1]), fill, mode)
    if base == "AutoContrast":
        return TF.autocontrast(x)
    if base == "Equalize":
        return TF.equalize(x)
    if base == "Invert":
        return 255 - x
    if base in ("Posterize", "PosterizeOriginal"):
        bits = arg.long().clamp(0, 8)
        mask = ((0xFF << (8 - bits)) & 0xFF).to(torch.uint8)
        return x & mask.view(-1, 1, 1, 1)
    if base == "Solarize":
        return torch.where(x.int() >= arg.view(-1, 1, 1, 1), 255 - x, x)
    if base == "SolarizeAdd":
        added = (x.int() + arg.view(-1, 1, 1, 1).int()).clamp(max=255).to(torch.uint8)
        return torch.where(x < 128, added, x)
    if base == "Color":
        return _blend(_luma(x).expand_as(x), x, arg)
    if base == "Contrast":
        mean = (_luma(x).float().mean((1, 2, 3)) + 0.5).floor()
        return _blend(mean.view(-1, 1, 1, 1).expand_as(x), x, arg)
    if base == "Brightness":
        return _blend(torch.zeros_like(x), x, arg)
    if base == "Sharpness":
        return _blend(_smooth(x), x, arg)
    raise ValueError(f"RandAugment op {name!r} has no batched form: use data.pipeline=cpu for this aug.auto_augment")


class BatchRandAugment:
    """timm's RandAugment (parsed from its config string) applied to uint8 batches.

    Args:
        config: timm's RandAugment string, e.g. ``rand-m9-mstd0.5-inc1``.
        img_size: training image size (timm's ``translate_const``).
        mean: per-channel normalisation mean (0..1); its 0..255 colour fills the geometric ops.
        interpolation: "bicubic", "bilinear" or "nearest" for the geometric ops.
    """

    def __init__(self, config: str, img_size: int, mean: tuple[float, ...], interpolation: str = "bicubic"):
        if not config.startswith("rand"):
            raise ValueError(
                f"aug.auto_augment={config!r}: data.pipeline=gpu runs RandAugment ('rand-...') only; "
                "use data.pipeline=cpu for other policies"
            )
        check_choice(interpolation, GRID_MODES, "aug.interpolation for data.pipeline=gpu")
        fill = tuple(min(255, round(255 * m)) for m in mean)
        try:
            ra = rand_augment_transform(config, {"translate_const": int(img_size * 0.45), "img_mean": fill})
        except (AssertionError, ValueError, KeyError) as err:
            raise ValueError(f"aug.auto_augment={config!r} is not a timm RandAugment string ({err})") from None
        if ra.choice_weights is not None:
            raise ValueError(
                f"aug.auto_augment={config!r}: weighted op choice has no batched form; use data.pipeline=cpu"
            )
        unknown = sorted({op.name for op in ra.ops} - set(OPS))
        if unknown:
            raise ValueError(
                f"aug.auto_augment={config!r}: RandAugment op(s) {', '.join(unknown)} have no batched "
                "form; use data.pipeline=cpu"
            )
        self.names = [op.name for op in ra.ops]
        self.prob = ra.ops[0].prob
        self.magnitude = float(ra.ops[0].magnitude)
        self.magnitude_std = float(ra.ops[0].magnitude_std)
        self.magnitude_max = float(ra.ops[0].magnitude_max or LEVEL_DENOM)
        self.translate_pct = float(ra.ops[0].hparams.get("translate_pct", 0.45))
        self.num_layers = ra.num_layers
        self.fill = torch.tensor(fill, dtype=torch.float32)
        self.interpolation = interpolation

    def draw(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per layer and image: op index, applied, magnitude, negated; [num_layers, n] each (CPU)."""
        br, shape = batch_random(), (n, self.num_layers)
        op = br.randint(0, len(self.names), shape, device="cpu").T
        applied = (br.rand(shape, device="cpu") < self.prob).T
        if math.isinf(self.magnitude_std):
            level = br.rand(shape, device="cpu").T * self.magnitude
        else:
            level = self.magnitude + self.magnitude_std * br.randn(shape, device="cpu").T
        negate = (br.rand(shape, device="cpu") > 0.5).T
        return op, applied, level.clamp(0, self.magnitude_max), negate

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Augment uint8 [N, 3, H, W] (any device); returns a new uint8 tensor of the same shape.

        Per layer, the images that apply an op are sorted by op (geometric ops first; one stable sort on the CPU),
        gathered once and scattered back once. The geometric ops are all affine maps, so their images are resampled
        together by one ``grid_sample`` with a map per image; the maps and the other ops' arguments are made on the
        CPU and copied to the device once per layer.
        """
        op, applied, level, negate = self.draw(x.shape[0])
        x = x.clone()
        fill = self.fill.to(x.device)
        height, width = x.shape[-2:]
        by_rank = sorted(range(len(self.names)), key=lambda k: self.names[k] not in GEOMETRIC_OPS)
        rank = torch.empty(len(by_rank), dtype=torch.long)
        rank[by_rank] = torch.arange(len(by_rank))  # op k's place in the sorted order
        warped_ops = sum(name in GEOMETRIC_OPS for name in self.names)
        for layer in range(self.num_layers):
            key = torch.where(applied[layer], rank[op[layer]], len(by_rank))  # len(by_rank): no op in this layer
            counts = torch.bincount(key, minlength=len(by_rank) + 1).tolist()[:-1]
            bounds = list(itertools.accumulate(counts, initial=0))
            if not bounds[-1]:
                continue
            rows = torch.argsort(key, stable=True)[: bounds[-1]]
            lv, ng = level[layer, rows], negate[layer, rows]
            present = [(self.names[k], a, b) for k, a, b in zip(by_rank, bounds[:-1], bounds[1:], strict=True) if b > a]
            warp_end = bounds[warped_ops]
            order = rows.to(x.device, non_blocking=True)
            picked = x[order]
            if warp_end:
                theta = torch.cat(
                    [
                        affine_theta(
                            name, level_to_arg(name, lv[a:b], ng[a:b], self.translate_pct).double(), height, width
                        )
                        for name, a, b in present
                        if b <= warp_end
                    ]
                )
                picked[:warp_end] = _warp(
                    picked[:warp_end], theta.float().to(x.device, non_blocking=True), fill, self.interpolation
                )
            others = [(name, a, b) for name, a, b in present if a >= warp_end]
            if others:
                args = [level_to_arg(name, lv[a:b], ng[a:b], self.translate_pct) for name, a, b in others]
                arg = torch.cat(args).float().to(x.device, non_blocking=True)
                for name, a, b in others:
                    picked[a:b] = apply_op(
                        picked[a:b], name, arg[a - warp_end : b - warp_end], fill, self.interpolation
                    )
            x[order] = picked
        return x
