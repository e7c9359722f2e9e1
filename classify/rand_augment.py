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
(:class:`~lightvision.classify.device_transforms.DeviceTrainTransform`), so nothing waits for the host. Each image
gets one op per layer, so a layer is a statistics pass over its input and one pass writing every image through its
own op (:func:`~lightvision.kernels.augment.augment_layer`: two Triton launches on CUDA, PyTorch ops elsewhere). On
CUDA the layer's per-image parameters (argument, sampling map, blend factor, value tables) come from two more
programs that read each op's formula as a code (:data:`ARG_FORMULAS`, :data:`MAPS`, :data:`TABLES`); elsewhere, and
as the spec, from :func:`level_to_arg`, :func:`pil_affine`, :func:`normalised_theta` and :func:`op_lut`.
"""

from __future__ import annotations

import functools
import math

import torch
from timm.data.auto_augment import rand_augment_transform

from lightvision.classify.graphed import DeviceConstants
from lightvision.kernels import augment as K
from lightvision.kernels.augment import (
    COLOR,
    COPY,
    SHARPNESS,
    TABLE,
    WARP,
    apply_table,
    augment_layer,
    blend,
    image_stats_reference,
    layer_params,
    layer_tables,
    luma,
    runs_programs,
    smooth,
    warp,
)
from lightvision.ops._checks import check_choice

__all__ = [
    "BatchRandAugment",
    "GEOMETRIC_OPS",
    "LUT_OPS",
    "OPS",
    "affine_theta",
    "apply_op",
    "level_to_arg",
    "normalised_theta",
    "op_lut",
    "pil_affine",
]

LEVEL_DENOM = 10.0
# timm's argument scales: degrees, shear, enhancer slope (increasing) / slope and offset, posterize bits, solarize
# levels and solarize-add offset (at the largest level)
ROTATE_DEGREES, SHEAR, ENHANCE_INCREASING, ENHANCE, ENHANCE_OFFSET = 30.0, 0.3, 0.9, 1.8, 0.1
POSTERIZE_BITS, SOLARIZE_LEVELS, SOLARIZE_ADD = 4, 256, 110
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
        return x * ROTATE_DEGREES * sign
    if name in ("ShearX", "ShearY"):
        return x * SHEAR * sign
    if name in ("TranslateXRel", "TranslateYRel"):
        return x * translate_pct * sign
    if name.endswith("Increasing") and name[: -len("Increasing")] in ("Color", "Contrast", "Brightness", "Sharpness"):
        return (1.0 + x * ENHANCE_INCREASING * sign).clamp(min=ENHANCE_OFFSET)
    if name in ("Color", "Contrast", "Brightness", "Sharpness"):
        return x * ENHANCE + ENHANCE_OFFSET
    if name == "Posterize":
        return (x * POSTERIZE_BITS).floor()
    if name == "PosterizeIncreasing":
        return POSTERIZE_BITS - (x * POSTERIZE_BITS).floor()
    if name == "PosterizeOriginal":
        return (x * POSTERIZE_BITS).floor() + POSTERIZE_BITS
    if name == "Solarize":
        return (x * SOLARIZE_LEVELS).floor().clamp(max=SOLARIZE_LEVELS)
    if name == "SolarizeIncreasing":
        return SOLARIZE_LEVELS - (x * SOLARIZE_LEVELS).floor().clamp(max=SOLARIZE_LEVELS)
    if name == "SolarizeAdd":
        return (x * SOLARIZE_ADD).floor().clamp(max=SOLARIZE_LEVELS // 2)
    return torch.zeros_like(level)


# each op's formulas as codes of the layer programs (lightvision.kernels.augment.layer_params / layer_tables): the
# argument (level_to_arg's cases), the sampling map (pil_affine's) and the value table (op_lut's, by base name)
ARG_FORMULAS = {
    "Rotate": K.ARG_ROTATE,
    "ShearX": K.ARG_SHEAR,
    "ShearY": K.ARG_SHEAR,
    "TranslateXRel": K.ARG_TRANSLATE,
    "TranslateYRel": K.ARG_TRANSLATE,
    **dict.fromkeys(("Color", "Contrast", "Brightness", "Sharpness"), K.ARG_ENHANCE),
    **{f"{name}Increasing": K.ARG_ENHANCE_INCREASING for name in ("Color", "Contrast", "Brightness", "Sharpness")},
    "Posterize": K.ARG_POSTERIZE,
    "PosterizeIncreasing": K.ARG_POSTERIZE_INCREASING,
    "PosterizeOriginal": K.ARG_POSTERIZE_ORIGINAL,
    "Solarize": K.ARG_SOLARIZE,
    "SolarizeIncreasing": K.ARG_SOLARIZE_INCREASING,
    "SolarizeAdd": K.ARG_SOLARIZE_ADD,
}
MAPS = {
    "Rotate": K.GEO_ROTATE,
    "ShearX": K.GEO_SHEAR_X,
    "ShearY": K.GEO_SHEAR_Y,
    "TranslateXRel": K.GEO_TRANSLATE_X,
    "TranslateYRel": K.GEO_TRANSLATE_Y,
}
TABLES = {
    "AutoContrast": K.LUT_AUTOCONTRAST,
    "Equalize": K.LUT_EQUALIZE,
    "Invert": K.LUT_INVERT,
    "Posterize": K.LUT_POSTERIZE,
    "PosterizeOriginal": K.LUT_POSTERIZE,
    "Solarize": K.LUT_SOLARIZE,
    "SolarizeAdd": K.LUT_SOLARIZE_ADD,
    "Contrast": K.LUT_CONTRAST,
    "Brightness": K.LUT_BRIGHTNESS,
}


def layer_constants(translate_pct: float, height: int, width: int) -> torch.Tensor:
    """The float64 constants of :func:`~lightvision.kernels.augment.layer_params`, in its order (host tensor)."""
    values = (LEVEL_DENOM, ROTATE_DEGREES, SHEAR, translate_pct, ENHANCE_INCREASING, ENHANCE, ENHANCE_OFFSET)
    values += (POSTERIZE_BITS, SOLARIZE_LEVELS, SOLARIZE_ADD, math.pi, 180.0, float(height), float(width))
    return torch.tensor(values, dtype=torch.float64)


def pil_affine(name: str, arg: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The geometric op's map as PIL's ``Image.transform(AFFINE)`` / ``rotate`` coefficients (a, b, c, d, e, f):
    the output pixel centre (u, v) samples (a u + b v + c, d u + e v + f), in pixels from the top-left corner;
    float [6, N] on ``arg``'s device."""
    one, zero = torch.ones_like(arg), torch.zeros_like(arg)
    h, w = float(height), float(width)
    if name == "Rotate":  # counter-clockwise by arg degrees about the centre (PIL rotate)
        rad = -arg * math.pi / 180.0
        cos, sin = rad.cos(), rad.sin()
        cx, cy = w / 2.0, h / 2.0
        coefficients = (cos, sin, cx - cos * cx - sin * cy, -sin, cos, cy + sin * cx - cos * cy)
    elif name == "ShearX":
        coefficients = (one, arg, zero, zero, one, zero)
    elif name == "ShearY":
        coefficients = (one, zero, zero, arg, one, zero)
    elif name == "TranslateXRel":
        coefficients = (one, zero, arg * w, zero, one, zero)
    else:  # TranslateYRel
        coefficients = (one, zero, zero, zero, one, arg * h)
    return torch.stack(coefficients)


def normalised_theta(coefficients: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """PIL's affine coefficients float [6, N] (:func:`pil_affine`) as ``F.affine_grid``'s map: float [N, 2, 3].

    With x_n = 2 x / W - 1, y_n = 2 y / H - 1 the PIL map is [[a, b H/W, a + b H/W + 2c/W - 1], [d W/H, e, d W/H + e
    + 2f/H - 1]] of normalised coordinates.
    """
    a, b, c, d, e, f = coefficients.unbind(0)
    h, w = float(height), float(width)
    rows = (a, b * h / w, a + b * h / w + 2 * c / w - 1, d * w / h, e, d * w / h + e + 2 * f / h - 1)
    return torch.stack(rows, 1).view(-1, 2, 3)


def affine_theta(name: str, arg: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The geometric op's sampling map for ``F.affine_grid``: float [N, 2, 3] on ``arg``'s device."""
    return normalised_theta(pil_affine(name, arg, height, width), height, width)


def _lut_blend(degenerate: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL ``Image.blend(degenerate, x, factor)`` for every value x of 0..255 (degenerate: [N] or a scalar; factor
    [N]): uint8 [N, 1, 256]."""
    values = torch.arange(256, device=factor.device, dtype=torch.float32)
    return blend(degenerate.view(-1, 1, 1, 1), values, factor)[:, 0]


def _equalize_lut(hist: torch.Tensor) -> torch.Tensor:
    """PIL's ``ImageOps.equalize`` table (torchvision's form) from the histograms int [N, 3, 256]: uint8 [N, 3, 256]."""
    cum = hist.cumsum(2)
    non_max = cum[..., -1:] - hist.gather(2, cum.argmax(2, keepdim=True))  # pixels below the image's top value
    step = non_max.div(255, rounding_mode="floor")
    lut = (cum[..., :-1] + step // 2).div(step.clamp(min=1), rounding_mode="floor").clamp(0, 255)
    lut = torch.cat([torch.zeros_like(lut[..., :1]), lut], 2)
    values = torch.arange(256, device=hist.device).expand_as(lut)
    return torch.where(step != 0, lut, values).to(torch.uint8)


def _autocontrast_lut(hist: torch.Tensor) -> torch.Tensor:
    """torchvision's ``autocontrast`` (PIL's, cutoff 0) table from the histograms int [N, 3, 256]: uint8 [N, 3, 256]."""
    present = hist > 0
    lo = present.int().argmax(2, keepdim=True).float()  # the smallest and largest values present
    hi = 255 - present.flip(2).int().argmax(2, keepdim=True).float()
    flat = hi == lo
    inv_scale = torch.where(flat, 1.0, (hi - lo) * (1.0 / 255))
    values = torch.arange(256, device=hist.device, dtype=torch.float32)
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


def op_lut(name: str, hist: torch.Tensor, luma_sum: torch.Tensor, arg: torch.Tensor) -> torch.Tensor:
    """The value map of a per-pixel op (base name in ``LUT_OPS``) for each image: uint8 [N, 1 or 3, 256].

    Args:
        hist, luma_sum: the images' statistics (:func:`~lightvision.kernels.augment.image_stats`): per-channel
            histograms int32 [N, 3, 256] (AutoContrast, Equalize) and the sum of PIL's luma int32 [N] (Contrast).
        arg: float [N].
    """
    base, v = _base(name), torch.arange(256, device=hist.device)
    if base == "AutoContrast":
        return _autocontrast_lut(hist)
    if base == "Equalize":
        return _equalize_lut(hist)
    if base == "Invert":
        return (255 - v).to(torch.uint8).expand(hist.shape[0], 1, 256)
    if base in ("Posterize", "PosterizeOriginal"):
        bits = arg.long().clamp(0, 8).view(-1, 1, 1)
        return (v & ((0xFF << (8 - bits)) & 0xFF)).to(torch.uint8)
    if base == "Solarize":
        return torch.where(v >= arg.view(-1, 1, 1), 255 - v, v).to(torch.uint8)
    if base == "SolarizeAdd":
        return torch.where(v < 128, (v + arg.view(-1, 1, 1).int()).clamp(max=255), v).to(torch.uint8)
    if base == "Contrast":  # PIL: int(mean + 0.5) of the luma image, the mean in double precision
        mean = (luma_sum.double() / hist[:, 0].sum(1) + 0.5).floor()
        return _lut_blend(mean, arg)
    if base == "Brightness":
        return _lut_blend(torch.zeros((), device=hist.device), arg)
    raise ValueError(f"{name!r} is not a per-pixel op")


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
        return warp(x, affine_theta(name, arg, x.shape[-2], x.shape[-1]), fill, mode)
    if base in LUT_OPS:
        return apply_table(x, op_lut(name, *image_stats_reference(x), arg))
    if base == "Color":
        return blend(luma(x).expand_as(x), x, arg)
    if base == "Sharpness":
        return blend(smooth(x), x, arg)
    raise ValueError(f"RandAugment op {name!r} has no batched form: use data.pipeline=cpu for this aug.auto_augment")


class BatchRandAugment:
    """timm's RandAugment (parsed from its config string) applied to uint8 batches as a fixed sequence of batched ops.

    Args:
        config: timm's RandAugment string, e.g. ``rand-m9-mstd0.5-inc1``.
        img_size: training image size (timm's ``translate_const``).
        mean: per-channel normalisation mean (0..1); its 0..255 colour fills the geometric ops.
        interpolation: "bicubic", "bilinear" or "nearest" for the geometric ops.
        backend: how a layer runs (:func:`~lightvision.kernels.augment.augment_layer`): "auto" four Triton launches
            on CUDA (parameters, statistics, tables, apply) and PyTorch ops elsewhere, "triton" the launches (CUDA or
            Triton's interpreter), "torch" the PyTorch ops (the spec).
    """

    COLUMNS = 5  # uniforms per layer and image: op, applied, magnitude (two, for a normal draw), sign

    def __init__(
        self,
        config: str,
        img_size: int,
        mean: tuple[float, ...],
        interpolation: str = "bicubic",
        backend: str = "auto",
    ):
        if not config.startswith("rand"):
            raise ValueError(
                f"aug.auto_augment={config!r}: data.pipeline=gpu runs RandAugment ('rand-...') only; "
                "use data.pipeline=cpu for other policies"
            )
        check_choice(interpolation, GRID_MODES, "aug.interpolation for data.pipeline=gpu")
        check_choice(backend, ("auto", "triton", "torch"), "RandAugment backend")
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
        self.backend = backend
        # how a layer runs each op (kernels.augment): resampled, through a value table, or blended
        kinds = [_kind(name) for name in self.names]
        self.op_kinds = DeviceConstants(torch.tensor(kinds, dtype=torch.int32))
        self.kinds = tuple(sorted(set(kinds)))
        self.warped = [k for k, kind in enumerate(kinds) if kind == WARP]
        self.mapped = [k for k, kind in enumerate(kinds) if kind == TABLE]
        self.blended = [k for k, kind in enumerate(kinds) if kind in (COLOR, SHARPNESS)]
        codes = [
            (ARG_FORMULAS.get(name, K.ARG_NONE), MAPS.get(name, K.GEO_NONE), TABLES.get(_base(name), K.LUT_NONE), kind)
            for name, kind in zip(self.names, kinds, strict=True)
        ]
        self.codes = DeviceConstants(torch.tensor(codes, dtype=torch.int32))
        self.constants: dict[tuple, DeviceConstants] = {}  # layer_constants per image size

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

        Every layer runs the same launches whatever was drawn (:func:`~lightvision.kernels.augment.augment_layer`):
        each image's op kind, blend factor, sampling map (identity where no geometric op was chosen) and value table
        (from the layer input's histograms and luma sums; identity where no per-pixel op was chosen) are computed on
        the device, then every image goes through its own op: on CUDA a parameter, a statistics, a table and an apply
        launch (:func:`~lightvision.kernels.augment.layer_params`, ``image_stats``, ``layer_tables``,
        ``augment_layer``), elsewhere the spec's ops per op name, one ``grid_sample``, one table lookup, Color and
        Sharpness on the batch, each image keeping its own op's result (``torch.where``). No host synchronisation:
        a CUDA graph can replay it.
        """
        op, applied, level, negate = self.draw(u)
        (fill,) = self.fill.get(x.device)
        if runs_programs(x, self.backend):  # each layer's parameters and value tables in two programs
            (codes,) = self.codes.get(x.device)
            size = tuple(x.shape[-2:])
            if size not in self.constants:
                self.constants[size] = DeviceConstants(layer_constants(self.translate_pct, *size))
            (constants,) = self.constants[size].get(x.device)
            for layer in range(self.num_layers):
                kind, factor, theta, lut, arg = layer_params(
                    op[layer], applied[layer], level[layer], negate[layer], codes, constants
                )
                tables = functools.partial(layer_tables, lut, arg)
                x = augment_layer(
                    x, kind, factor, theta, tables, fill, self.interpolation, self.kinds, self.backend, lut
                )
            return x
        (op_kinds,) = self.op_kinds.get(x.device)
        ops = torch.arange(len(self.names), device=x.device)[:, None]
        for layer in range(self.num_layers):
            chosen = applied[layer] & (op[layer] == ops)  # [ops, N]
            kind = torch.where(applied[layer], op_kinds[op[layer]], COPY)
            args = [level_to_arg(name, level[layer], negate[layer], self.translate_pct) for name in self.names]
            x = self._layer(x, kind, chosen, args, fill)
        return x

    def _layer(self, x: torch.Tensor, kind: torch.Tensor, chosen: torch.Tensor, args: list[torch.Tensor], fill):
        """One layer: each image through its chosen op (``kind`` int [N]; ``chosen`` bool [ops, N]; ``args`` float
        [N] per op)."""
        n, _, height, width = x.shape
        coefficients = torch.eye(2, 3, device=x.device, dtype=torch.float64).view(6, 1).expand(6, n)  # identity
        for k in self.warped:  # each image's own op's PIL map, then one conversion for the batch
            op_coefficients = pil_affine(self.names[k], args[k].double(), height, width)
            coefficients = torch.where(chosen[k], op_coefficients, coefficients)
        theta = normalised_theta(coefficients, height, width)
        factor = torch.zeros(n, device=x.device, dtype=torch.float64)
        for k in self.blended:
            factor = torch.where(chosen[k], args[k].double(), factor)

        def tables(hist: torch.Tensor, luma_sum: torch.Tensor) -> torch.Tensor:
            lut = torch.arange(256, device=x.device).to(torch.uint8).expand(n, 3, 256)
            for k in self.mapped:
                lut = torch.where(chosen[k].view(-1, 1, 1), op_lut(self.names[k], hist, luma_sum, args[k]), lut)
            return lut

        return augment_layer(x, kind, factor, theta.float(), tables, fill, self.interpolation, self.kinds, self.backend)


def _kind(name: str) -> int:
    """How a layer runs op ``name`` (a kind of :mod:`lightvision.kernels.augment`)."""
    if name in GEOMETRIC_OPS:
        return WARP
    if _base(name) in LUT_OPS:
        return TABLE
    return COLOR if _base(name) == "Color" else SHARPNESS
