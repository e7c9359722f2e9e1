"""The RandAugment layer programs (lightvision.kernels.augment) against their PyTorch reference: histograms and luma
sums exactly, every kind of op forced in turn and mixed, each interpolation, NaN-poisoned outputs, and
BatchRandAugment's kernel path against its PyTorch path op by op and with random draws. On CPU the programs run in
the Triton interpreter, on tiny images."""

import functools
import math
import os
import subprocess
import sys

import pytest
import torch

from lightvision.classify.rand_augment import GEOMETRIC_OPS, BatchRandAugment
from lightvision.kernels import _launch
from lightvision.kernels.augment import (
    COLOR,
    COPY,
    MODES,
    SHARPNESS,
    TABLE,
    WARP,
    augment_layer,
    augment_layer_reference,
    image_stats,
    image_stats_reference,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MEAN = (0.485, 0.456, 0.406)
FILL = torch.tensor([124.0, 116.0, 104.0], device=DEVICE)
# Resampling may round differently from grid_sample's float arithmetic: at most this fraction of the values may
# differ, by one level (bilinear, bicubic) or by taking the neighbouring pixel ("nearest", exactly between two).
RESAMPLING_MISMATCH = 0.005


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setattr(_launch, "POISON_OUTPUTS", True)  # unwritten output values are 255


def _images(n: int = 5, height: int = 13, width: int = 17, seed: int = 0) -> torch.Tensor:
    """uint8 [n, 3, height, width]: noise, then (where n allows) a gradient, a flat image and a narrow-range one."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (max(n, 4), 3, height, width), generator=g, dtype=torch.uint8)
    x[1] = (torch.arange(width) * 9 + torch.arange(height)[:, None] * 5).clamp(max=255).to(torch.uint8)
    x[2] = 77
    x[3] = x[3] // 8 + 100
    return x[:n].contiguous().to(DEVICE)


def _draws(n: int, seed: int = 1):
    """Per image a sampling map (rotation, shear, translation, in and out of the image) and a blend factor."""
    g = torch.Generator().manual_seed(seed)
    angle = (torch.rand(n, generator=g) - 0.5) * math.pi / 3
    shear, shift = torch.rand(n, generator=g) - 0.5, (torch.rand(n, 2, generator=g) - 0.5) * 1.2
    rows = [angle.cos(), -angle.sin() + shear, shift[:, 0], angle.sin(), angle.cos(), shift[:, 1]]
    theta = torch.stack(rows, 1).view(n, 2, 3)
    factor = torch.tensor([0.0, 0.3, 1.0, 1.7, 1.9, 0.1, 1.4])[torch.arange(n) % 7].double()
    return theta.to(DEVICE), factor.to(DEVICE)


def _tables(hist: torch.Tensor, luma_sum: torch.Tensor) -> torch.Tensor:
    """A value table per image and channel that reads both statistics (as equalize and contrast do)."""
    shift = (hist.argmax(2, keepdim=True) + luma_sum.view(-1, 1, 1)) % 256
    return ((torch.arange(256, device=hist.device) * 7 + shift) % 256).to(torch.uint8)


def _assert_layer_matches(out: torch.Tensor, ref: torch.Tensor, warped: torch.Tensor, one_level: bool) -> None:
    """Exact outside the resampled images; within RESAMPLING_MISMATCH there, by at most one level where
    ``one_level`` (not so for "nearest", or where a later layer's op may turn a level's difference into more)."""
    assert out.shape == ref.shape and out.dtype == torch.uint8
    assert torch.equal(out[~warped], ref[~warped])
    diff = (out.int() - ref.int()).abs()
    if warped.any():
        wrong = diff[warped] > 0
        assert wrong.float().mean() <= RESAMPLING_MISMATCH, f"{wrong.sum()} of {wrong.numel()} values differ"
        if one_level:
            assert diff[warped].max() <= 1


@pytest.mark.parametrize("size", [(13, 17), (65, 70)], ids=["13x17", "65x70-two-blocks"])
def test_statistics_exact(size):
    x = _images(3, *size)
    hist, luma_sum = image_stats(x, backend="triton")
    ref_hist, ref_luma = image_stats_reference(x)
    assert torch.equal(hist, ref_hist) and torch.equal(luma_sum, ref_luma)
    assert (hist.sum(2) == size[0] * size[1]).all() and hist[2, :, 77].eq(size[0] * size[1]).all()


def test_statistics_only_for_the_tables_that_read_them():
    """Given the images' value-table codes, the statistics program reads the images whose tables use the statistics
    (autocontrast, equalize, contrast) exactly as the reference and leaves the others' rows zero; a layer through
    those statistics writes what the reference writes."""
    from lightvision.classify.rand_augment import layer_constants
    from lightvision.kernels.augment import layer_params, layer_tables, op

    x = _images(10, 19, 23, seed=7)
    codes = ("NONE", "AUTOCONTRAST", "EQUALIZE", "INVERT", "POSTERIZE", "SOLARIZE", "SOLARIZE_ADD", "CONTRAST")
    codes += ("BRIGHTNESS", "EQUALIZE")
    lut = torch.tensor([getattr(op, f"LUT_{code}") for code in codes], dtype=torch.int32, device=DEVICE)
    hist, luma_sum = image_stats(x, backend="triton", lut=lut)
    ref_hist, ref_luma = image_stats_reference(x)
    read = torch.isin(lut, torch.tensor(op.STATS_LUTS, dtype=torch.int32, device=DEVICE))
    assert read.sum() == 4
    assert torch.equal(hist[read], ref_hist[read]) and torch.equal(luma_sum[read], ref_luma[read])
    assert not hist[~read].any() and not luma_sum[~read].any()
    level = torch.linspace(1, 10, 10, dtype=torch.float64, device=DEVICE)
    negate = torch.arange(10, device=DEVICE) % 2 == 0
    constants = layer_constants(0.45, *x.shape[-2:]).to(DEVICE)
    for name in ("AutoContrast", "Equalize", "Contrast", "Posterize"):
        first = torch.zeros(10, dtype=torch.int64, device=DEVICE)
        kind, factor, theta, codes_lut, arg = layer_params(
            first, torch.ones(10, dtype=torch.bool, device=DEVICE), level, negate, _one_op_codes(name), constants
        )
        tables = functools.partial(layer_tables, codes_lut, arg)
        some = augment_layer(x, kind, factor, theta, tables, FILL, backend="triton", lut=codes_lut)
        assert torch.equal(some, augment_layer(x, kind, factor, theta, tables, FILL, backend="triton")), name


@pytest.mark.parametrize("mode", MODES)
def test_every_kind_matches_reference(mode):
    """Every image through one kind (each in turn), then every kind in one batch."""
    x = _images()
    n = len(x)
    theta, factor = _draws(n)
    mixed = torch.tensor([WARP, TABLE, COLOR, SHARPNESS, COPY], device=DEVICE)
    for kind in [torch.full((n,), k, device=DEVICE) for k in (COPY, WARP, TABLE, COLOR, SHARPNESS)] + [mixed]:
        out = augment_layer(x, kind, factor, theta, _tables, FILL, mode, backend="triton")
        ref = augment_layer_reference(x, kind, factor, theta, _tables, FILL, mode)
        warped = (kind == WARP).view(-1, 1, 1, 1).expand_as(x)
        _assert_layer_matches(out, ref, warped, one_level=mode != "nearest")
        assert not torch.equal(out, x) or (kind == COPY).all()


def test_resampling_out_of_the_image_fills():
    """A map that samples only outside the image gives the fill colour everywhere; the identity map the image."""
    x = _images(2)
    theta = torch.tensor([[[1.0, 0.0, 5.0], [0.0, 1.0, 0.0]], [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]], device=DEVICE)
    kind = torch.full((2,), WARP, device=DEVICE)
    out = augment_layer(x, kind, torch.zeros(2, device=DEVICE), theta, _tables, FILL, "bicubic", backend="triton")
    assert torch.equal(out[0], FILL.to(torch.uint8).view(3, 1, 1).expand(3, 13, 17))
    assert torch.equal(out[1], x[1])


@pytest.mark.parametrize(
    "config,forced",
    [("rand-m9-n1-mstd0.5-inc1", True), ("rand-m9-mstd0.5-inc1", False), ("rand-m7-n2-mstd1.0", False)],
    ids=["each-op-forced", "deit-random", "m7-random"],
)
def test_batch_rand_augment_kernel_equals_torch(config, forced):
    """BatchRandAugment's two-launch layers against its PyTorch layers: image i forced to op i (one layer), or the
    recipe's own random draws (two layers)."""
    kernel = BatchRandAugment(config, 224, MEAN, backend="triton")
    torch_ops = BatchRandAugment(config, 224, MEAN, backend="torch")
    ops = len(kernel.names)
    n = ops if forced else 6
    x = _images(n, seed=2)
    u = torch.rand((n, kernel.columns), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    if forced:
        u[:, 0] = (torch.arange(n) + 0.5) / ops
        u[:, 1] = 0.0  # applied
    u = u.to(DEVICE)
    out, ref = kernel(x, u), torch_ops(x, u)
    op, applied, _, _ = kernel.draw(u)
    geometric = torch.tensor([name in GEOMETRIC_OPS for name in kernel.names])
    warped = (applied & geometric.to(DEVICE)[op]).any(0).view(-1, 1, 1, 1).expand_as(x)
    _assert_layer_matches(out, ref, warped, one_level=kernel.num_layers == 1)
    assert not torch.equal(out, x)


COMPILE_FOR_HOPPER = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from lightvision.kernels.augment._triton import augment_kernel, image_stats_kernel, layer_params_kernel
from lightvision.kernels.augment._triton import crop_boxes_kernel, erase_boxes_kernel, layer_tables_kernel
from lightvision.kernels.augment.op import BLOCK, NUM_WARPS, PARAMS_BLOCK, STATS_BLOCK

options = {"enable_fp_fusion": False, "num_warps": NUM_WARPS}

pointers = {"X": "*u8", "OUT": "*u8", "KIND": "*i32", "FACTOR": "*fp64", "THETA": "*fp32", "TABLE": "*u8"}
scalars = {"FILL": "*fp32", "HW": "i32", "H": "i32", "W": "i32", "STEP_X": "fp32", "STEP_Y": "fp32"}
for mode in (0, 1, 2):
    signature = {**pointers, **scalars, "MODE": "constexpr", "BLOCK": "constexpr"}
    source = ASTSource(augment_kernel, signature, constexprs={"MODE": mode, "BLOCK": BLOCK})
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
    assert "fma.rn.f" not in ptx  # each product rounded, as the reference's separate ops
stats_signature = {"X": "*u8", "STATS": "*i32", "LUT": "*i32", "HW": "i32", "BLOCK": "constexpr", "SOME": "constexpr"}
for some in (False, True):
    source = ASTSource(image_stats_kernel, stats_signature, constexprs={"BLOCK": STATS_BLOCK, "SOME": some})
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": NUM_WARPS}).asm["ptx"]
    assert "atom" in ptx
params = {"OP": "*i64", "APPLIED": "*u8", "LEVEL": "*fp64", "NEGATE": "*u8", "CODES": "*i32", "CONST": "*fp64"}
params |= {"KIND": "*i32", "FACTOR": "*fp64", "THETA": "*fp32", "LUT": "*i32", "ARG": "*fp64", "N": "i32"}
source = ASTSource(layer_params_kernel, {**params, "BLOCK": "constexpr"}, constexprs={"BLOCK": PARAMS_BLOCK})
exact = {"enable_fp_fusion": False}
triton.compile(source, target=GPUTarget("cuda", 90, 32), options=exact)  # (its libdevice cos / sin use fma)
tables = {"LUT": "*i32", "ARG": "*fp64", "HIST": "*i32", "LUMA": "*i32", "TABLE": "*u8"}
tables |= {"s_hist": "i32", "s_luma": "i32"}
triton.compile(ASTSource(layer_tables_kernel, tables), target=GPUTarget("cuda", 90, 32), options=exact)
crop = {"SIZES": "*i64", "U": "*fp64", "CONST": "*fp64", "OUT": "*i64", "N": "i32", "s_u": "i32"}
crop |= {"ATTEMPTS": "constexpr", "BLOCK": "constexpr"}
source = ASTSource(crop_boxes_kernel, crop, constexprs={"ATTEMPTS": 10, "BLOCK": PARAMS_BLOCK})
triton.compile(source, target=GPUTarget("cuda", 90, 32), options=exact)
erase = {"U": "*fp64", "CONST": "*fp64", "OUT": "*i64", "N": "i32", "s_u": "i32", "HEIGHT": "i32", "WIDTH": "i32"}
erase |= {"MAX_COUNT": "constexpr", "ATTEMPTS": "constexpr", "BLOCK": "constexpr"}
source = ASTSource(erase_boxes_kernel, erase, constexprs={"MAX_COUNT": 2, "ATTEMPTS": 10, "BLOCK": PARAMS_BLOCK})
triton.compile(source, target=GPUTarget("cuda", 90, 32), options=exact)
"""


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the programs run")
def test_programs_compile_for_hopper():
    """The interpreter runs what the compiler may refuse (non-constexpr globals, op lowerings): the six programs
    build to sm_90 PTX (Triton's own compiler, no GPU), the apply program with no fused multiply-add."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", COMPILE_FOR_HOPPER], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


def test_bad_arguments_named():
    x = _images(2)
    theta, factor = _draws(2)
    kind = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="mode must be one of"):
        augment_layer(x, kind, factor, theta, _tables, FILL, "lanczos")
    with pytest.raises(ValueError, match="backend must be"):
        augment_layer(x, kind, factor, theta, _tables, FILL, backend="cuda")
    with pytest.raises(ValueError, match="uint8 \\[N, 3, H, W\\]"):
        augment_layer(x.float(), kind, factor, theta, _tables, FILL, backend="triton")
    with pytest.raises(ValueError, match="RandAugment backend"):
        BatchRandAugment("rand-m9-mstd0.5-inc1", 224, MEAN, backend="cuda")


def _one_op_codes(name: str) -> torch.Tensor:
    """layer_params' codes of a one-op list."""
    from lightvision.classify.rand_augment import ARG_FORMULAS, MAPS, TABLES, _base, _kind
    from lightvision.kernels.augment import ARG_NONE, GEO_NONE, LUT_NONE

    codes = [ARG_FORMULAS.get(name, ARG_NONE), MAPS.get(name, GEO_NONE), TABLES.get(_base(name), LUT_NONE), _kind(name)]
    return torch.tensor([codes], dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("size", [(224, 224), (13, 17)], ids=["224", "13x17"])
def test_layer_params_equal_the_spec_for_every_op(size):
    """layer_params against level_to_arg / pil_affine / normalised_theta for every op at random magnitudes and signs
    (not applied: COPY, identity map, no table): arguments, kinds, blend factors and tables' codes exactly, maps to
    float32 rounding (the rotation's cosine and sine)."""
    from lightvision.classify.rand_augment import (
        GEOMETRIC_OPS,
        OPS,
        TABLES,
        _base,
        _kind,
        layer_constants,
        level_to_arg,
        normalised_theta,
        pil_affine,
    )
    from lightvision.kernels.augment import LUT_NONE, layer_params

    g = torch.Generator().manual_seed(4)
    n = 37
    level = torch.rand(n, generator=g, dtype=torch.float64) * 10
    level[:3] = torch.tensor([0.0, 10.0, 5.0], dtype=torch.float64)
    negate = torch.rand(n, generator=g) < 0.5
    applied = torch.rand(n, generator=g) < 0.8
    applied[:3] = True
    constants = layer_constants(0.45, *size).to(DEVICE)
    identity = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0]).expand(n, 6)
    op = torch.zeros(n, dtype=torch.int64, device=DEVICE)
    draws = (applied.to(DEVICE), level.to(DEVICE), negate.to(DEVICE))
    for name in OPS:
        outputs = layer_params(op, *draws, _one_op_codes(name), constants)
        kind, factor, theta, lut, arg = (t.cpu() for t in outputs)
        expected = level_to_arg(name, level, negate, 0.45)  # on the CPU: CUDA divides by a scalar via its reciprocal
        assert torch.equal(arg, expected), name
        assert torch.equal(kind, torch.where(applied, _kind(name), COPY).int()), name
        blended = _kind(name) in (COLOR, SHARPNESS)
        assert torch.equal(factor, torch.where(applied & blended, expected, 0.0)), name
        assert torch.equal(lut, torch.where(applied, TABLES.get(_base(name), LUT_NONE), LUT_NONE).int()), name
        if name in GEOMETRIC_OPS:
            spec = normalised_theta(pil_affine(name, expected, *size), *size).float().view(n, 6)
            spec = torch.where(applied[:, None], spec, identity)
            torch.testing.assert_close(theta.view(n, 6), spec, atol=2e-7, rtol=0)
        else:
            assert torch.equal(theta.view(n, 6), identity), name


def test_layer_tables_equal_the_spec_for_every_table_op():
    """layer_tables against op_lut for every value-table op from real images' histograms and luma sums (flat,
    narrow-range and noisy images; magnitudes across the range), exactly; identity where no table op applies."""
    from lightvision.classify.rand_augment import TABLES, _base, layer_constants, level_to_arg, op_lut
    from lightvision.kernels.augment import layer_params, layer_tables

    x = _images(6, seed=5)
    x[4] = 0
    x[5, 0] = 255
    hist, luma_sum = image_stats(x, backend="triton")
    level = torch.tensor([0.0, 2.5, 5.0, 7.5, 9.0, 10.0], dtype=torch.float64, device=DEVICE)
    negate = torch.tensor([False, True, False, True, False, True], device=DEVICE)
    constants = layer_constants(0.45, *x.shape[-2:]).to(DEVICE)
    names = [n for n in ("AutoContrast", "Equalize", "Invert", "PosterizeIncreasing", "PosterizeOriginal", "Solarize")]
    names += ["SolarizeIncreasing", "SolarizeAdd", "ContrastIncreasing", "Contrast", "Brightness", "Rotate"]
    for name in names:
        op = torch.zeros(6, dtype=torch.int64, device=DEVICE)
        applied = torch.ones(6, dtype=torch.bool, device=DEVICE)
        _, _, _, lut, arg = layer_params(op, applied, level, negate, _one_op_codes(name), constants)
        table = layer_tables(lut, arg, hist, luma_sum)
        if _base(name) in TABLES:  # the spec on the CPU (CUDA divides by a scalar via its reciprocal)
            spec = op_lut(name, hist.cpu(), luma_sum.cpu(), level_to_arg(name, level.cpu(), negate.cpu()))
        else:
            spec = torch.arange(256).to(torch.uint8)
        assert torch.equal(table.cpu(), spec.expand(6, 3, 256)), name


def test_crop_boxes_program_equals_the_spec():
    """crop_boxes against resized_crop_params for many images (landscape, portrait, tiny, extreme aspect: the
    centre-crop fallback) and scales, with a strided view of the draws as the transform passes them: exactly."""
    from lightvision.classify.device_transforms import ATTEMPTS, CROP_COLUMNS, crop_constants, resized_crop_params
    from lightvision.kernels.augment import crop_boxes

    g = torch.Generator().manual_seed(6)
    n = 300
    sizes = torch.randint(8, 600, (n, 2), generator=g)
    sizes[:4] = torch.tensor([[10, 400], [400, 10], [1, 1], [224, 224]])
    u = torch.rand((n, CROP_COLUMNS + 3), generator=g, dtype=torch.float64)[:, 1 : 1 + CROP_COLUMNS]
    for scale in ((0.08, 1.0), (0.9, 1.0)):
        spec = resized_crop_params(sizes, scale, u)
        out = crop_boxes(sizes.to(DEVICE), u.to(DEVICE), crop_constants(scale).to(DEVICE), ATTEMPTS)
        assert torch.equal(out.cpu(), spec), scale
    assert (spec[:2, 2:] == torch.tensor([[10, 13], [13, 10]])).all()  # the fallback's 3/4 and 4/3 crops


@pytest.mark.parametrize("count", [1, 3])
def test_erase_boxes_program_equals_the_spec(count):
    """erase_boxes_program against erase_boxes (probability, count, first fitting attempt or none), exactly."""
    from lightvision.classify.device_transforms import ATTEMPTS, ERASE_COLUMNS, erase_boxes, erase_constants
    from lightvision.kernels.augment import erase_boxes_program

    g = torch.Generator().manual_seed(7 + count)
    n, columns = 400, 2 + count * ERASE_COLUMNS
    u = torch.rand((n, columns + 2), generator=g, dtype=torch.float64)[:, 2:]
    for height, width in ((224, 224), (13, 40)):
        spec = erase_boxes(height, width, 0.6, count, u)
        out = erase_boxes_program(height, width, count, u.to(DEVICE), erase_constants(0.6).to(DEVICE), ATTEMPTS)
        assert torch.equal(out.cpu(), spec), (height, width)
        assert (spec[..., 2] > 0).any() and (spec[..., 2] == 0).any()  # some erased, some not
