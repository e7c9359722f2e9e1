"""One RandAugment layer on a uint8 batch, each image through its own op: resample, value table, blend or copy.

In a layer every image gets one op or none, so every op reads the layer's input: the statistics the value tables
need (per-channel 256-bin histograms for equalize and autocontrast, the sum of PIL's luma for contrast) come from
one pass over the input, and one more pass writes every image through its own op. The reference (the spec) runs
each kind of op on the whole batch in PyTorch and keeps each image's own result (``torch.where``). On CUDA the two
passes are two Triton programs (``_triton``): a fixed launch sequence with no host synchronisation, which a CUDA
graph can replay. The ops follow PIL on uint8 values (what timm's RandAugment calls). A layer's per-image parameters
(the op's argument, sampling map, blend factor and value table) come from two more programs, :func:`layer_params`
and :func:`layer_tables`, from codes naming each op's formula (the spec: ``lightvision.classify.rand_augment``), so a
layer is four launches whatever its op list, not hundreds of small ones.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .._launch import empty, program_runs

# what an image goes through in a layer (``kind``)
COPY, WARP, TABLE, COLOR, SHARPNESS = range(5)
# per op, for layer_params: its argument's formula (timm's LEVEL_TO_ARG families), its sampling map, its value table
(
    ARG_NONE,
    ARG_ROTATE,
    ARG_SHEAR,
    ARG_TRANSLATE,
    ARG_ENHANCE,
    ARG_ENHANCE_INCREASING,
    ARG_POSTERIZE,
    ARG_POSTERIZE_INCREASING,
    ARG_POSTERIZE_ORIGINAL,
    ARG_SOLARIZE,
    ARG_SOLARIZE_INCREASING,
    ARG_SOLARIZE_ADD,
) = range(12)
GEO_NONE, GEO_ROTATE, GEO_SHEAR_X, GEO_SHEAR_Y, GEO_TRANSLATE_X, GEO_TRANSLATE_Y = range(6)
(
    LUT_NONE,
    LUT_AUTOCONTRAST,
    LUT_EQUALIZE,
    LUT_INVERT,
    LUT_POSTERIZE,
    LUT_SOLARIZE,
    LUT_SOLARIZE_ADD,
    LUT_CONTRAST,
    LUT_BRIGHTNESS,
) = range(9)
PARAMS_BLOCK = 128  # images per program of layer_params
KINDS = (WARP, TABLE, COLOR, SHARPNESS)
MODES = ("bilinear", "bicubic", "nearest")  # grid_sample interpolations; the program implements all three
MAX_PIXELS = (2**31 - 1) // 255  # the program sums an image's luma in int32
BLOCK = 512  # output pixels (all channels) per program of the apply pass: two a thread (112 registers on sm_90)
STATS_BLOCK = 4096  # pixels per program of the statistics pass (769 atomic adds each)
STATS_LUTS = (LUT_AUTOCONTRAST, LUT_EQUALIZE, LUT_CONTRAST)  # the value tables that read an image's statistics
NUM_WARPS = 8

Tables = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def luma(x: torch.Tensor) -> torch.Tensor:
    """PIL's ``convert("L")`` (ITU-R 601-2, fixed point): uint8 [N, 3, H, W] -> int32 [N, 1, H, W]."""
    r, g, b = x.int().unbind(1)
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16)[:, None]


def blend(degenerate: torch.Tensor, x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL ``Image.blend(degenerate, x, factor)``: interpolate or extrapolate, clip, truncate to uint8; factor [N]."""
    d = degenerate.float()
    return (d + factor.view(-1, 1, 1, 1) * (x.float() - d)).clamp(0, 255).to(torch.uint8)


def smooth(x: torch.Tensor) -> torch.Tensor:
    """PIL's ``ImageFilter.SMOOTH`` (3x3, centre 5, others 1, / 13, rounded); the border keeps its pixels."""
    kernel = torch.ones(3, 1, 3, 3, device=x.device)
    kernel[:, :, 1, 1] = 5.0
    inner = (F.conv2d(x.float(), kernel, groups=3) / 13.0).round().to(torch.uint8)
    out = x.clone()
    out[..., 1:-1, 1:-1] = inner
    return out


def warp(x: torch.Tensor, theta: torch.Tensor, fill: torch.Tensor, mode: str) -> torch.Tensor:
    """Each uint8 [N, 3, H, W] image resampled through its own ``theta`` float [N, 2, 3] (``F.affine_grid``'s map of
    normalised output to input coordinates), outside the image filled with ``fill`` [3] (0..255); rounded to uint8."""
    grid = F.affine_grid(theta.float(), list(x.shape), align_corners=False)
    fill = fill.view(1, -1, 1, 1)
    out = F.grid_sample(x.float() - fill, grid, mode=mode, padding_mode="zeros", align_corners=False) + fill
    return out.round().clamp(0, 255).to(torch.uint8)


def apply_table(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """uint8 [N, C, H, W] through each image's value map uint8 [N, 1 or C, 256] (one gather)."""
    table = table.expand(x.shape[0], x.shape[1], 256)
    return table.gather(2, x.flatten(2).long()).view_as(x)


def image_stats_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel value histograms int32 [N, 3, 256] and the sum of PIL's luma int32 [N] of uint8 [N, 3, H, W]."""
    flat = x.flatten(2).long()
    hist = torch.zeros((*x.shape[:2], 256), dtype=torch.int32, device=x.device)
    hist.scatter_add_(2, flat, torch.ones((), dtype=torch.int32, device=x.device).expand_as(flat))
    return hist, luma(x).sum((1, 2, 3), dtype=torch.int32)


def augment_layer_reference(
    x: torch.Tensor,
    kind: torch.Tensor,
    factor: torch.Tensor,
    theta: torch.Tensor,
    tables: Tables,
    fill: torch.Tensor,
    mode: str = "bicubic",
    kinds: tuple[int, ...] = KINDS,
) -> torch.Tensor:
    """Each image of a batch through its own op, in PyTorch.

    Args:
        x: uint8 [N, 3, H, W], the layer's input.
        kind: int [N], per image ``COPY``, ``WARP`` (resample through ``theta``), ``TABLE`` (its value table),
            ``COLOR`` (blend with its luma) or ``SHARPNESS`` (blend with its smoothed image).
        factor: float [N], the blend factor of ``COLOR`` and ``SHARPNESS`` (applied in float64).
        theta: float [N, 2, 3], the ``WARP`` map (:func:`warp`).
        tables: ``tables(hist, luma_sum)`` -> uint8 [N, 3, 256], each image's value table from the statistics of
            x (:func:`image_stats_reference`), read where ``kind`` is ``TABLE``.
        fill: float [3], the colour outside the resampled image (0..255).
        mode: interpolation of ``WARP`` ("bilinear", "bicubic" or "nearest").
        kinds: the kinds ``kind`` may hold (the others are not computed).
    Returns:
        uint8 [N, 3, H, W], a new tensor.
    """
    kind, factor = kind.view(-1, 1, 1, 1), factor.double()
    out = x
    if WARP in kinds:
        out = torch.where(kind == WARP, warp(x, theta, fill, mode), out)
    if TABLE in kinds:
        out = torch.where(kind == TABLE, apply_table(x, tables(*image_stats_reference(x))), out)
    if COLOR in kinds:
        out = torch.where(kind == COLOR, blend(luma(x), x, factor), out)
    if SHARPNESS in kinds:
        out = torch.where(kind == SHARPNESS, blend(smooth(x), x, factor), out)
    return out.clone() if out is x else out


def _step(size: int) -> float:
    """``torch.linspace(-1, 1, size)``'s float32 step (0 for one pixel)."""
    return float(np.float32(2.0) / np.float32(size - 1)) if size > 1 else 0.0


def _check(x: torch.Tensor, backend: str, mode: str | None = None) -> bool:
    """Whether the Triton programs run (raises on a bad ``mode`` / ``backend`` or a forced program that cannot)."""
    if mode is not None and mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    covered = x.dtype == torch.uint8 and x.dim() == 4 and x.shape[1] == 3 and x.shape[-2] * x.shape[-1] <= MAX_PIXELS
    needs = f"uint8 [N, 3, H, W] images of at most {MAX_PIXELS} pixels"
    return program_runs(x, backend, covered, needs)


def runs_programs(x: torch.Tensor, backend: str = "auto") -> bool:
    """Whether :func:`augment_layer` runs its Triton programs on ``x`` for ``backend`` (raises where "triton" is
    forced and cannot run)."""
    return _check(x, backend)


def layer_params(
    op: torch.Tensor,
    applied: torch.Tensor,
    level: torch.Tensor,
    negate: torch.Tensor,
    codes: torch.Tensor,
    constants: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """One layer's per-image parameters in one launch (CUDA, or Triton's interpreter).

    Args:
        op: int64 [N], each image's op index; applied, negate: bool [N]; level: float64 [N], clipped magnitudes.
        codes: int32 [ops, 4] per op: ARG_* formula, GEO_* map, LUT_* table, kind (COPY .. SHARPNESS).
        constants: float64 [14]: the level divisor, the rotation, shear and translation scales, the increasing
            enhancers' 0.9, the enhancers' 1.8 and 0.1, the posterize 4, the solarize 256, the solarize-add 110, pi,
            180, H, W.
    Returns:
        kind int32 [N] (COPY where not applied), factor float64 [N] (the blend ops' argument, else 0), theta float32
        [N, 2, 3] (``affine_grid``'s map; identity unless a geometric op), lut int32 [N] (the LUT_* code, LUT_NONE
        unless a table op), arg float64 [N] (the op's argument).
    """
    n, device = op.shape[0], op.device
    kind, lut = empty((n,), torch.int32, device), empty((n,), torch.int32, device)
    factor, arg = empty((n,), torch.float64, device), empty((n,), torch.float64, device)
    theta = empty((n, 2, 3), torch.float32, device)
    from ._triton import layer_params_kernel

    layer_params_kernel[(-(-n // PARAMS_BLOCK),)](
        OP=op.contiguous(), APPLIED=applied.contiguous().view(torch.uint8), LEVEL=level.contiguous(),
        NEGATE=negate.contiguous().view(torch.uint8),
        CODES=codes, CONST=constants, KIND=kind, FACTOR=factor, THETA=theta, LUT=lut, ARG=arg, N=n,
        BLOCK=PARAMS_BLOCK, enable_fp_fusion=False,
    )  # fmt: skip
    return kind, factor, theta, lut, arg


def layer_tables(lut: torch.Tensor, arg: torch.Tensor, hist: torch.Tensor, luma_sum: torch.Tensor) -> torch.Tensor:
    """Each image's value table uint8 [N, 3, 256] in one launch, from :func:`layer_params`' ``lut`` and ``arg`` and
    the layer input's statistics (:func:`image_stats`: histograms [N, 3, 256], luma sums [N])."""
    n = lut.shape[0]
    table = empty((n, 3, 256), torch.uint8, lut.device)
    from ._triton import layer_tables_kernel

    layer_tables_kernel[(n,)](
        LUT=lut, ARG=arg, HIST=hist, LUMA=luma_sum, TABLE=table, s_hist=hist.stride(0), s_luma=luma_sum.stride(0),
        enable_fp_fusion=False,
    )  # fmt: skip
    return table


def crop_boxes(sizes: torch.Tensor, u: torch.Tensor, constants: torch.Tensor, attempts: int) -> torch.Tensor:
    """Random resized crops' boxes int64 [N, 4] (top, left, height, width) in one launch (CUDA, or Triton's
    interpreter). sizes: int64 [N, 2] (H, W) on u's device; u: float64 [N, 2 attempts + 2] (any row stride: area
    uniforms, aspect uniforms, placement); constants: float64 [6]: scale low and span, log ratio low and span, ratio
    low and high (the spec: ``lightvision.classify.device_transforms.resized_crop_params``)."""
    n = sizes.shape[0]
    out = empty((n, 4), torch.int64, sizes.device)
    from ._triton import crop_boxes_kernel

    crop_boxes_kernel[(-(-n // PARAMS_BLOCK),)](
        SIZES=sizes.contiguous(), U=u, CONST=constants, OUT=out, N=n, s_u=u.stride(0), ATTEMPTS=attempts,
        BLOCK=PARAMS_BLOCK, enable_fp_fusion=False,
    )  # fmt: skip
    return out


def erase_boxes_program(
    height: int, width: int, max_count: int, u: torch.Tensor, constants: torch.Tensor, attempts: int
) -> torch.Tensor:
    """RandomErasing's boxes int64 [N, max_count, 4] in one launch (CUDA, or Triton's interpreter). u: float64
    [N, 2 + max_count (2 attempts + 2)] (any row stride); constants: float64 [5]: area low and span, log ratio low and
    span, probability (the spec: ``lightvision.classify.device_transforms.erase_boxes``)."""
    n = u.shape[0]
    out = empty((n, max_count, 4), torch.int64, u.device)
    from ._triton import erase_boxes_kernel

    erase_boxes_kernel[(-(-n // PARAMS_BLOCK),)](
        U=u, CONST=constants, OUT=out, N=n, s_u=u.stride(0), HEIGHT=height, WIDTH=width, MAX_COUNT=max_count,
        ATTEMPTS=attempts, BLOCK=PARAMS_BLOCK, enable_fp_fusion=False,
    )  # fmt: skip
    return out


def image_stats(
    x: torch.Tensor, backend: str = "auto", lut: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`image_stats_reference` in one Triton launch (after zeroing its output); ``backend`` as for
    :func:`augment_layer`. ``lut``: int32 [N], each image's value-table code (:func:`layer_params`): the program
    then reads only the images whose table uses the statistics (:data:`STATS_LUTS`) and leaves the others' zero
    (the reference computes every image's)."""
    if not _check(x, backend):
        return image_stats_reference(x)
    n, _, height, width = x.shape
    stats = torch.zeros((n, 3 * 256 + 1), dtype=torch.int32, device=x.device)  # histograms, then the luma sum
    from ._triton import image_stats_kernel  # Triton is imported when a kernel first runs

    image_stats_kernel[(n, -(-height * width // STATS_BLOCK))](
        X=x.contiguous(), STATS=stats, LUT=stats if lut is None else lut.int().contiguous(), HW=height * width,
        BLOCK=STATS_BLOCK, SOME=lut is not None, num_warps=NUM_WARPS,
    )  # fmt: skip
    return stats[:, :-1].view(n, 3, 256), stats[:, -1]


def augment_layer(
    x: torch.Tensor,
    kind: torch.Tensor,
    factor: torch.Tensor,
    theta: torch.Tensor,
    tables: Tables,
    fill: torch.Tensor,
    mode: str = "bicubic",
    kinds: tuple[int, ...] = KINDS,
    backend: str = "auto",
    lut: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`augment_layer_reference` (same arguments) as two Triton launches: the statistics pass
    (:func:`image_stats`, skipped when ``TABLE`` is not in ``kinds``; given the images' value-table codes ``lut``
    it reads only the images whose tables use them), ``tables`` (PyTorch ops on [N, 3, 256] tensors), and one pass
    writing every image through its own op.

    ``backend``: "auto" runs the programs on CUDA and the reference elsewhere; "triton" requires the programs (CUDA,
    or Triton's interpreter); "torch" the reference. Resampling agrees with ``grid_sample`` up to float rounding (a
    level on a few pixels, a neighbouring pixel for "nearest" exactly between two); the other ops exactly.
    """
    if not _check(x, backend, mode):
        return augment_layer_reference(x, kind, factor, theta, tables, fill, mode, kinds)
    n, _, height, width = x.shape
    x = x.contiguous()
    table = tables(*image_stats(x, backend, lut)).expand(n, 3, 256).contiguous() if TABLE in kinds else x
    out = empty(x.shape, torch.uint8, x.device)
    from ._triton import augment_kernel

    augment_kernel[(n, -(-height * width // BLOCK))](
        X=x, OUT=out, KIND=kind.int().contiguous(), FACTOR=factor.double().contiguous(),
        THETA=theta.float().contiguous(), TABLE=table, FILL=fill.float().contiguous(), HW=height * width, H=height,
        W=width, STEP_X=_step(width), STEP_Y=_step(height), MODE=MODES.index(mode), BLOCK=BLOCK,
        num_warps=NUM_WARPS, enable_fp_fusion=False,
    )  # fmt: skip
    return out
