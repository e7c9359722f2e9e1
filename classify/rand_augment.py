"""RandAugment on a batch of uint8 images on any device, with timm's ops, levels and draws.

timm parses the recipe string (``rand-m9-mstd0.5-inc1``: magnitude 9, magnitude noise std 0.5, the "increasing"
op set; see ``timm.data.auto_augment.rand_augment_transform``); :class:`BatchRandAugment` keeps its op names,
probability, magnitude and layer count and applies them to a whole batch: every image draws its own op per
layer (uniform, with replacement), applies it with the op's probability, at magnitude N(m, std) clipped to
[0, mmax], with a random sign where timm negates. The ops follow PIL's (what timm calls) on uint8 values:
colour ops blend with PIL's degenerate images and truncate like ``Image.blend``; geometric ops sample the
output through the same affine maps as PIL (rotation about the centre, shear about the top-left corner,
translation by a fraction of the size) with the recipe's interpolation, and fill with the mean colour. The
per-pixel ops (autocontrast, equalize, invert, posterize, solarize, contrast, brightness) are value maps: one
256-entry table per image and channel. The draws are read from uniforms the caller draws on the device
(:class:`~lightvision.classify.device_transforms.DeviceTrainTransform`), so nothing waits for the host.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from timm.data.auto_augment import rand_augment_transform

from lightvision.classify.graphed import DeviceConstants
from lightvision.ops._checks import check_choice

__all__ = [
    "BatchRandAugment",
    "GEOMETRIC_OPS",
    "LUT_OPS",
    "OPS",
    "affine_theta",
    "apply_lut",
    "apply_op",
    "level_to_arg",
    "op_lut",
]

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


def _lut_blend(degenerate: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL ``Image.blend(degenerate, x, factor)`` for every value x of 0..255 (degenerate: [N] or a scalar; factor
    [N]): uint8 [N, 1, 256]."""
    values = torch.arange(256, device=factor.device, dtype=torch.float32)
    return _blend(degenerate.view(-1, 1, 1, 1), values, factor)[:, 0]


def _equalize_lut(x: torch.Tensor) -> torch.Tensor:
    """PIL's ``ImageOps.equalize`` table per image and channel (torchvision's form): uint8 [N, 3, 256]."""
    flat = x.flatten(2).long()
    hist = torch.zeros((*x.shape[:2], 256), dtype=torch.int32, device=x.device)
    hist.scatter_add_(2, flat, torch.ones((), dtype=torch.int32, device=x.device).expand_as(flat))
    cum = hist.cumsum(2)
    non_max = flat.shape[-1] - hist.gather(2, cum.argmax(2, keepdim=True))  # pixels below the image's top value
    step = non_max.div(255, rounding_mode="floor")
    lut = (cum[..., :-1] + step // 2).div(step.clamp(min=1), rounding_mode="floor").clamp(0, 255)
    lut = torch.cat([torch.zeros_like(lut[..., :1]), lut], 2)
    values = torch.arange(256, device=x.device).expand_as(lut)
    return torch.where(step != 0, lut, values).to(torch.uint8)


def _autocontrast_lut(x: torch.Tensor) -> torch.Tensor:
    """torchvision's ``autocontrast`` (PIL's, cutoff 0) table per image and channel: uint8 [N, 3, 256]."""
    lo, hi = x.amin((-2, -1)).float()[..., None], x.amax((-2, -1)).float()[..., None]
    flat = hi == lo
    inv_scale = torch.where(flat, 1.0, (hi - lo) * (1.0 / 255))
    values = torch.arange(256, device=x.device, dtype=torch.float32)
    return ((values - torch.where(flat, 0.0, lo)) / inv_scale).clamp(0, 255).to(torch.uint8)


# per-pixel maps of the value (given per-image statistics): one table per image and channel
LUT_OPS = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Posterize",
    "PosterizeOriginal",
    "Solarize",
    "SolarizeAdd",
    "Contrast",
    "Brightness",
)


def _base(name: str) -> str:
    return name[: -len("Increasing")] if name.endswith("Increasing") else name


def op_lut(name: str, x: torch.Tensor, arg: torch.Tensor) -> torch.Tensor:
    """The value map of a per-pixel op (base name in ``LUT_OPS``) for each image: uint8 [N, 1 or 3, 256].

    Args:
        x: uint8 [N, 3, H, W] (the statistics AutoContrast, Equalize and Contrast read); arg: float [N].
    """
    base, v = _base(name), torch.arange(256, device=x.device)
    if base == "AutoContrast":
        return _autocontrast_lut(x)
    if base == "Equalize":
        return _equalize_lut(x)
    if base == "Invert":
        return (255 - v).to(torch.uint8).expand(x.shape[0], 1, 256)
    if base in ("Posterize", "PosterizeOriginal"):
        bits = arg.long().clamp(0, 8).view(-1, 1, 1)
        return (v & ((0xFF << (8 - bits)) & 0xFF)).to(torch.uint8)
    if base == "Solarize":
        return torch.where(v >= arg.view(-1, 1, 1), 255 - v, v).to(torch.uint8)
    if base == "SolarizeAdd":
        return torch.where(v < 128, (v + arg.view(-1, 1, 1).int()).clamp(max=255), v).to(torch.uint8)
    if base == "Contrast":
        mean = (_luma(x).float().mean((1, 2, 3)) + 0.5).floor()
        return _lut_blend(mean, arg)
    if base == "Brightness":
        return _lut_blend(torch.zeros((), device=x.device), arg)
    raise ValueError(f"{name!r} is not a per-pixel op")


def apply_lut(x: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    """uint8 [N, C, H, W] through each image's value map uint8 [N, 1 or C, 256] (one gather)."""
    lut = lut.expand(x.shape[0], x.shape[1], 256)
    return lut.gather(2, x.flatten(2).long()).view_as(x)


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
    base = _base(name)
    if name in GEOMETRIC_OPS:
        return _warp(x, affine_theta(name, arg, x.shape[-2], x.shape[-1]), fill, mode)
    if base in LUT_OPS:
        return apply_lut(x, op_lut(name, x, arg))
    if base == "Color":
        return _blend(_luma(x).expand_as(x), x, arg)
    if base == "Sharpness":
        return _blend(_smooth(x), x, arg)
    raise ValueError(f"RandAugment op {name!r} has no batched form: use data.pipeline=cpu for this aug.auto_augment")


def _rows(mask: torch.Tensor) -> torch.Tensor:
    """bool [N] -> [N, 1, 1, 1], to select whole images with ``torch.where``."""
    return mask.view(-1, 1, 1, 1)


class BatchRandAugment:
    """timm's RandAugment (parsed from its config string) applied to uint8 batches as a fixed sequence of batched ops.

    Args:
        config: timm's RandAugment string, e.g. ``rand-m9-mstd0.5-inc1``.
        img_size: training image size (timm's ``translate_const``).
        mean: per-channel normalisation mean (0..1); its 0..255 colour fills the geometric ops.
        interpolation: "bicubic", "bilinear" or "nearest" for the geometric ops.
    """

    COLUMNS = 5  # uniforms per layer and image: op, applied, magnitude (two, for a normal draw), sign

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
        self.columns = self.COLUMNS * self.num_layers
        self.fill = DeviceConstants(torch.tensor(fill, dtype=torch.float32))
        self.interpolation = interpolation
        # the ops' indices by how a layer runs them: one grid_sample, one table lookup, one batched op each
        self.warped = [k for k, name in enumerate(self.names) if name in GEOMETRIC_OPS]
        self.mapped = [k for k, name in enumerate(self.names) if _base(name) in LUT_OPS]
        self.blended = [k for k in range(len(self.names)) if k not in self.warped + self.mapped]

    def draw(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per layer and image: op index, applied, magnitude, negated; [num_layers, N] each, from uniforms
        u [N, ``columns``] in [0, 1) (any device; no host work)."""
        u = u.view(-1, self.num_layers, self.COLUMNS).permute(2, 1, 0)  # [COLUMNS, layers, N]
        op = (u[0] * len(self.names)).long().clamp(max=len(self.names) - 1)
        applied = u[1] < self.prob
        if math.isinf(self.magnitude_std):
            level = u[2] * self.magnitude
        else:  # Box-Muller: a standard normal from two uniforms
            normal = (-2.0 * torch.log1p(-u[2])).sqrt() * torch.cos(2.0 * math.pi * u[3])
            level = self.magnitude + self.magnitude_std * normal
        return op, applied, level.clamp(0, self.magnitude_max), u[4] > 0.5

    def __call__(self, x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Augment uint8 [N, 3, H, W] (any device) with the draws of uniforms u [N, ``columns``]; a new uint8 tensor.

        Every layer runs the same batched ops whatever was drawn: one ``grid_sample`` with a map per image (identity
        where no geometric op was chosen), one table lookup with a value map per image (identity where no per-pixel
        op was chosen), and Color and Sharpness on the batch, each image keeping the result of its own op
        (``torch.where``). No host synchronisation, the same launches every call: a CUDA graph can replay it.
        """
        op, applied, level, negate = self.draw(u)
        (fill,) = self.fill.get(x.device)
        ops = torch.arange(len(self.names), device=x.device)[:, None]
        for layer in range(self.num_layers):
            chosen = applied[layer] & (op[layer] == ops)  # [ops, N]
            args = [level_to_arg(name, level[layer], negate[layer], self.translate_pct) for name in self.names]
            x = self._layer(x, chosen, args, fill)
        return x

    def _layer(self, x: torch.Tensor, chosen: torch.Tensor, args: list[torch.Tensor], fill: torch.Tensor):
        """One layer: each image through its chosen op (``chosen`` bool [ops, N]; ``args`` float [N] per op)."""
        n, _, height, width = x.shape
        if self.warped:
            theta = torch.eye(2, 3, device=x.device, dtype=torch.float64).expand(n, 2, 3)
            for k in self.warped:
                op_theta = affine_theta(self.names[k], args[k].double(), height, width)
                theta = torch.where(chosen[k].view(-1, 1, 1), op_theta, theta)
            x = torch.where(
                _rows(torch.stack([chosen[k] for k in self.warped]).any(0)),
                _warp(x, theta.float(), fill, self.interpolation),
                x,
            )
        if self.mapped:
            lut = torch.arange(256, device=x.device).to(torch.uint8).expand(n, 3, 256)
            for k in self.mapped:
                lut = torch.where(chosen[k].view(-1, 1, 1), op_lut(self.names[k], x, args[k]), lut)
            x = apply_lut(x, lut)
        for k in self.blended:
            x = torch.where(_rows(chosen[k]), apply_op(x, self.names[k], args[k], fill, self.interpolation), x)
        return x
