"""Triton programs of :func:`lightvision.kernels.augment.augment_layer`: a statistics pass and an apply pass.

Both cover BLOCK pixels (all three channels) of one image per program. The statistics program adds its block's
per-channel value histograms (``tl.histogram``) and the sum of its PIL luma, (19595 r + 38470 g + 7471 b + 2^15)
>> 16, into the image's row of a zeroed int32 buffer (given the images' value-table codes, only for the images whose
table reads them). The apply program reads its image's kind and writes the block through that one op:

- resample: PyTorch's ``affine_grid`` + ``grid_sample`` (align_corners=False, zero padding) of (value - fill), then
  + fill, rounded half to even, clipped. The output pixel (u, v) has normalised coordinates linspace(-1, 1, W)[u]
  (W - 1) / W (and likewise v), sampled at theta [x, y, 1], unnormalised to ((x + 1) W - 1) / 2; bicubic is Keys'
  cubic with a = -0.75 over 4 x 4 taps, bilinear 2 x 2, nearest the tap at the coordinates rounded half to even.
- table: ``TABLE[n, c, value]``.
- colour / sharpness: PIL's blend d + f (x - d) in float64 (what the reference computes), clipped and truncated,
  with d the luma or PIL's SMOOTH filter (3 x 3, centre 5, others 1, (2 s + 13) // 26 = s / 13 rounded; the border
  keeps its pixels).
- copy otherwise.

Launched with ``enable_fp_fusion=False``, so each product and sum is rounded as the reference's separate ops are.
"""

import triton
import triton.language as tl

from .._rounding import rint

# the kinds of op.py
KIND_WARP = tl.constexpr(1)
KIND_TABLE = tl.constexpr(2)
KIND_COLOR = tl.constexpr(3)
KIND_SHARPNESS = tl.constexpr(4)


@triton.jit
def _luma(r, g, b):
    return (r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16


@triton.jit
def image_stats_kernel(X, STATS, LUT, HW, BLOCK: tl.constexpr, SOME: tl.constexpr):
    """X uint8 [N, 3, H, W]; STATS int32 [N, 769] zeroed: 3 x 256 histogram bins, then the luma sum. SOME: only the
    images whose value-table code LUT int32 [N] reads them (autocontrast, equalize, contrast); the others' rows stay
    zero."""
    n = tl.program_id(0).to(tl.int64)
    if SOME:
        code = tl.load(LUT + n)
        if (code != LUT_AUTOCONTRAST) & (code != LUT_EQUALIZE) & (code != LUT_CONTRAST):
            return
    p = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = p < HW
    src = X + n * 3 * HW + p
    r = tl.load(src, mask=ok, other=0).to(tl.int32)
    g = tl.load(src + HW, mask=ok, other=0).to(tl.int32)
    b = tl.load(src + 2 * HW, mask=ok, other=0).to(tl.int32)
    bins = STATS + n * 769 + tl.arange(0, 256)
    tl.atomic_add(bins, tl.histogram(r, 256, mask=ok))
    tl.atomic_add(bins + 256, tl.histogram(g, 256, mask=ok))
    tl.atomic_add(bins + 512, tl.histogram(b, 256, mask=ok))
    tl.atomic_add(STATS + n * 769 + 768, tl.sum(tl.where(ok, _luma(r, g, b), 0)))


@triton.jit
def _normalised(i, size, step):
    """affine_grid's base coordinate (align_corners=False) of pixel index i along an axis of ``size`` pixels."""
    lin = tl.where(i < size // 2, -1.0 + step * i.to(tl.float32), 1.0 - step * (size - 1 - i).to(tl.float32))
    return tl.where(size > 1, tl.div_rn(lin * (size - 1).to(tl.float32), size.to(tl.float32)), 0.0)


@triton.jit
def _cubic_near(x):  # Keys' cubic, a = -0.75, for |x| <= 1
    return (1.25 * x - 2.25) * x * x + 1.0


@triton.jit
def _cubic_far(x):  # for 1 < |x| < 2
    return ((-0.75 * x + 3.75) * x - 6.0) * x + 3.0


@triton.jit
def _cubic_weights(t):
    """The four taps' weights at fraction t past the second tap, in grid_sample's arithmetic."""
    s = 1.0 - t
    return _cubic_far(t + 1.0), _cubic_near(t), _cubic_near(s), _cubic_far(s + 1.0)


@triton.jit
def _tap(src, xx, yy, H, W, ok, fill):
    """(value - fill) at integer coordinates (xx, yy); 0 outside the image."""
    inside = ok & (xx >= 0) & (xx < W) & (yy >= 0) & (yy < H)
    v = tl.load(src + yy * W + xx, mask=inside, other=0).to(tl.float32)
    return tl.where(inside, v - fill, 0.0)


@triton.jit
def _row(src, x0, yy, H, W, ok, fill, c0, c1, c2, c3):
    """Four horizontal taps from x0 - 1, weighted and summed in grid_sample's order."""
    v0 = _tap(src, x0 - 1, yy, H, W, ok, fill)
    v1 = _tap(src, x0, yy, H, W, ok, fill)
    v2 = _tap(src, x0 + 1, yy, H, W, ok, fill)
    v3 = _tap(src, x0 + 2, yy, H, W, ok, fill)
    return v0 * c0 + v1 * c1 + v2 * c2 + v3 * c3


@triton.jit
def _blend(d, x, f):
    """PIL's blend of int32 degenerate d and value x by float64 factor f, clipped, truncated to uint8."""
    d = d.to(tl.float64)
    v = d + f * (x.to(tl.float64) - d)
    return tl.minimum(tl.maximum(v, 0.0), 255.0).to(tl.int32).to(tl.uint8)


@triton.jit(do_not_specialize=["H", "W"])  # used as float values (a size of 1 would become a constant)
def augment_kernel(
    X, OUT, KIND, FACTOR, THETA, TABLE, FILL, HW, H, W, STEP_X, STEP_Y,
    MODE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """X, OUT uint8 [N, 3, H, W]; KIND int32 [N]; FACTOR float64 [N]; THETA float32 [N, 2, 3]; TABLE uint8 [N, 3,
    256]; FILL float32 [3]; HW = H W; STEP_X, STEP_Y: linspace's float32 step 2 / (W - 1), 2 / (H - 1) (0 for one
    pixel); MODE 0 bilinear, 1 bicubic, 2 nearest."""
    n = tl.program_id(0).to(tl.int64)
    hw = HW
    p = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = p < hw
    src = X + n * 3 * hw
    dst = OUT + n * 3 * hw + p
    kind = tl.load(KIND + n)
    if kind == KIND_WARP:
        oy = p // W
        ox = p - oy * W
        t = THETA + n * 6
        xn = _normalised(ox, W, STEP_X)
        yn = _normalised(oy, H, STEP_Y)
        gx = xn * tl.load(t) + yn * tl.load(t + 1) + tl.load(t + 2)
        gy = xn * tl.load(t + 3) + yn * tl.load(t + 4) + tl.load(t + 5)
        ix = ((gx + 1.0) * W.to(tl.float32) - 1.0) * 0.5
        iy = ((gy + 1.0) * H.to(tl.float32) - 1.0) * 0.5
        x0f = tl.floor(ix)
        y0f = tl.floor(iy)
        x0 = x0f.to(tl.int32)
        y0 = y0f.to(tl.int32)
        tx = ix - x0f
        ty = iy - y0f
        if MODE == 1:
            cx0, cx1, cx2, cx3 = _cubic_weights(tx)
            cy0, cy1, cy2, cy3 = _cubic_weights(ty)
        for c in tl.static_range(3):
            fill = tl.load(FILL + c)
            plane = src + c * hw
            if MODE == 1:  # bicubic
                cx0, cx1, cx2, cx3 = (
                    _cubic_far(tx + 1.0),
                    _cubic_near(tx),
                    _cubic_near(1.0 - tx),
                    _cubic_far((1.0 - tx) + 1.0),
                )
                cy0, cy1, cy2, cy3 = (
                    _cubic_far(ty + 1.0),
                    _cubic_near(ty),
                    _cubic_near(1.0 - ty),
                    _cubic_far((1.0 - ty) + 1.0),
                )
                r0 = _row(plane, x0, y0 - 1, H, W, ok, fill, cx0, cx1, cx2, cx3)
                r1 = _row(plane, x0, y0, H, W, ok, fill, cx0, cx1, cx2, cx3)
                r2 = _row(plane, x0, y0 + 1, H, W, ok, fill, cx0, cx1, cx2, cx3)
                r3 = _row(plane, x0, y0 + 2, H, W, ok, fill, cx0, cx1, cx2, cx3)
                acc = r0 * cy0 + r1 * cy1 + r2 * cy2 + r3 * cy3
            elif MODE == 0:  # bilinear
                x1f = x0f + 1.0
                y1f = y0f + 1.0
                acc = _tap(plane, x0, y0, H, W, ok, fill) * ((x1f - ix) * (y1f - iy))
                acc += _tap(plane, x0 + 1, y0, H, W, ok, fill) * ((ix - x0f) * (y1f - iy))
                acc += _tap(plane, x0, y0 + 1, H, W, ok, fill) * ((x1f - ix) * (iy - y0f))
                acc += _tap(plane, x0 + 1, y0 + 1, H, W, ok, fill) * ((ix - x0f) * (iy - y0f))
            else:  # nearest
                acc = _tap(plane, rint(ix).to(tl.int32), rint(iy).to(tl.int32), H, W, ok, fill)
            v = tl.minimum(tl.maximum(rint(acc + fill), 0.0), 255.0)
            tl.store(dst + c * hw, v.to(tl.int32).to(tl.uint8), mask=ok)
    elif kind == KIND_TABLE:
        for c in tl.static_range(3):
            v = tl.load(src + c * hw + p, mask=ok, other=0).to(tl.int32)
            tl.store(dst + c * hw, tl.load(TABLE + (n * 3 + c) * 256 + v, mask=ok), mask=ok)
    elif kind == KIND_COLOR:
        r = tl.load(src + p, mask=ok, other=0).to(tl.int32)
        g = tl.load(src + hw + p, mask=ok, other=0).to(tl.int32)
        b = tl.load(src + 2 * hw + p, mask=ok, other=0).to(tl.int32)
        gray = _luma(r, g, b)
        f = tl.load(FACTOR + n)
        tl.store(dst, _blend(gray, r, f), mask=ok)
        tl.store(dst + hw, _blend(gray, g, f), mask=ok)
        tl.store(dst + 2 * hw, _blend(gray, b, f), mask=ok)
    elif kind == KIND_SHARPNESS:
        oy = p // W
        ox = p - oy * W
        inner = ok & (oy >= 1) & (oy < H - 1) & (ox >= 1) & (ox < W - 1)
        f = tl.load(FACTOR + n)
        for c in tl.static_range(3):
            plane = src + c * hw
            v = tl.load(plane + p, mask=ok, other=0).to(tl.int32)
            s = 4 * v
            for dy in tl.static_range(-1, 2):
                for dx in tl.static_range(-1, 2):
                    s += tl.load(plane + p + dy * W + dx, mask=inner, other=0).to(tl.int32)
            smoothed = tl.where(inner, (2 * s + 13) // 26, v)
            tl.store(dst + c * hw, _blend(smoothed, v, f), mask=ok)
    else:
        for c in tl.static_range(3):
            tl.store(dst + c * hw, tl.load(src + c * hw + p, mask=ok, other=0), mask=ok)


# the argument formulas, sampling maps and value tables of op.py (ARG_*, GEO_*, LUT_*)
ARG_ROTATE = tl.constexpr(1)
ARG_SHEAR = tl.constexpr(2)
ARG_TRANSLATE = tl.constexpr(3)
ARG_ENHANCE = tl.constexpr(4)
ARG_ENHANCE_INCREASING = tl.constexpr(5)
ARG_POSTERIZE = tl.constexpr(6)
ARG_POSTERIZE_INCREASING = tl.constexpr(7)
ARG_POSTERIZE_ORIGINAL = tl.constexpr(8)
ARG_SOLARIZE = tl.constexpr(9)
ARG_SOLARIZE_INCREASING = tl.constexpr(10)
ARG_SOLARIZE_ADD = tl.constexpr(11)
GEO_ROTATE = tl.constexpr(1)
GEO_SHEAR_X = tl.constexpr(2)
GEO_SHEAR_Y = tl.constexpr(3)
GEO_TRANSLATE_X = tl.constexpr(4)
GEO_TRANSLATE_Y = tl.constexpr(5)
LUT_AUTOCONTRAST = tl.constexpr(1)
LUT_EQUALIZE = tl.constexpr(2)
LUT_INVERT = tl.constexpr(3)
LUT_POSTERIZE = tl.constexpr(4)
LUT_SOLARIZE = tl.constexpr(5)
LUT_SOLARIZE_ADD = tl.constexpr(6)
LUT_CONTRAST = tl.constexpr(7)
LUT_BRIGHTNESS = tl.constexpr(8)
KIND_COPY = tl.constexpr(0)


@triton.jit
def _c(CONST, i):
    """Float64 constant i of a program's CONST (float literals would be float32 in a program)."""
    return tl.load(CONST + i)


@triton.jit
def layer_params_kernel(
    OP, APPLIED, LEVEL, NEGATE, CODES, CONST, KIND, FACTOR, THETA, LUT, ARG, N, BLOCK: tl.constexpr
):  # fmt: skip
    """One RandAugment layer's per-image parameters from its draws. OP int64 [N]; APPLIED, NEGATE uint8 [N] (bool
    tensors' bytes); LEVEL float64 [N] (clipped magnitudes); CODES int32 [ops, 4] (argument formula, sampling map,
    value table, kind per op); CONST float64 [14] (op.layer_params' constants: 10, 30, 0.3, translate fraction, 0.9,
    1.8, 0.1, 4, 256, 110, pi, 180, H, W). Writes KIND int32 [N] (COPY where not applied), FACTOR float64 [N] (blend
    ops' argument, else 0), THETA float32 [N, 6] (affine_grid's map, identity unless a geometric op), LUT int32 [N]
    (value table code, 0 unless a table op), ARG float64 [N] (the op's argument)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < N
    op = tl.load(OP + i, mask=ok, other=0).to(tl.int32)
    applied = tl.load(APPLIED + i, mask=ok, other=0) != 0
    level = tl.load(LEVEL + i, mask=ok, other=0.0)
    negate = tl.load(NEGATE + i, mask=ok, other=0) != 0
    formula = tl.load(CODES + op * 4, mask=ok, other=0)
    geo = tl.where(applied, tl.load(CODES + op * 4 + 1, mask=ok, other=0), 0)
    lut = tl.where(applied, tl.load(CODES + op * 4 + 2, mask=ok, other=0), 0)
    kind = tl.where(applied, tl.load(CODES + op * 4 + 3, mask=ok, other=0), KIND_COPY)
    x = level / _c(CONST, 0)  # float64 division: IEEE (div.rn.f64)
    sign = tl.where(negate, -1.0, 1.0).to(tl.float64)
    zero = tl.zeros_like(x)
    arg = zero
    arg = tl.where(formula == ARG_ROTATE, x * _c(CONST, 1) * sign, arg)
    arg = tl.where(formula == ARG_SHEAR, x * _c(CONST, 2) * sign, arg)
    arg = tl.where(formula == ARG_TRANSLATE, x * _c(CONST, 3) * sign, arg)
    arg = tl.where(formula == ARG_ENHANCE, x * _c(CONST, 5) + _c(CONST, 6), arg)
    increasing = 1.0 + x * _c(CONST, 4) * sign
    arg = tl.where(formula == ARG_ENHANCE_INCREASING, tl.maximum(increasing, _c(CONST, 6)), arg)
    bits = tl.floor(x * _c(CONST, 7))
    arg = tl.where(formula == ARG_POSTERIZE, bits, arg)
    arg = tl.where(formula == ARG_POSTERIZE_INCREASING, _c(CONST, 7) - bits, arg)
    arg = tl.where(formula == ARG_POSTERIZE_ORIGINAL, bits + _c(CONST, 7), arg)
    threshold = tl.minimum(tl.floor(x * _c(CONST, 8)), _c(CONST, 8))
    arg = tl.where(formula == ARG_SOLARIZE, threshold, arg)
    arg = tl.where(formula == ARG_SOLARIZE_INCREASING, _c(CONST, 8) - threshold, arg)
    added = tl.minimum(tl.floor(x * _c(CONST, 9)), _c(CONST, 8) / 2)
    arg = tl.where(formula == ARG_SOLARIZE_ADD, added, arg)
    # PIL's affine coefficients (a, b, c, d, e, f) of the geometric op, then affine_grid's normalised map
    h, w = _c(CONST, 12), _c(CONST, 13)
    one = zero + 1.0
    rad = -arg * _c(CONST, 10) / _c(CONST, 11)
    rotate = geo == GEO_ROTATE
    cos = tl.where(rotate, tl.cos(rad), one)
    sin = tl.where(rotate, tl.sin(rad), zero)
    cx, cy = w / 2, h / 2
    a = cos
    b = tl.where(geo == GEO_SHEAR_X, arg, sin)
    c = tl.where(rotate, cx - cos * cx - sin * cy, tl.where(geo == GEO_TRANSLATE_X, arg * w, zero))
    d = tl.where(geo == GEO_SHEAR_Y, arg, tl.where(rotate, -sin, zero))
    e = cos
    f = tl.where(rotate, cy + sin * cx - cos * cy, tl.where(geo == GEO_TRANSLATE_Y, arg * h, zero))
    bhw = b * h / w
    dwh = d * w / h
    rows = (a, bhw, a + bhw + 2 * c / w - 1, dwh, e, dwh + e + 2 * f / h - 1)
    for r in tl.static_range(6):
        tl.store(THETA + i * 6 + r, rows[r].to(tl.float32), mask=ok)
    blended = (kind == 3) | (kind == 4)  # COLOR, SHARPNESS
    tl.store(KIND + i, kind, mask=ok)
    tl.store(FACTOR + i, tl.where(blended, arg, zero), mask=ok)
    tl.store(LUT + i, lut, mask=ok)
    tl.store(ARG + i, arg, mask=ok)


@triton.jit
def _pil_blend(d, v, f):
    """PIL's blend of float32 degenerate d and float32 value v by float64 factor f, clipped, truncated (int32)."""
    r = d.to(tl.float64) + f * (v - d).to(tl.float64)
    return tl.minimum(tl.maximum(r, 0.0), 255.0).to(tl.int32)


@triton.jit
def layer_tables_kernel(LUT, ARG, HIST, LUMA, TABLE, s_hist, s_luma):
    """One value table per image and channel: TABLE uint8 [N, 3, 256] from the image's table code LUT int32 [N]
    (identity for 0), its argument ARG float64 [N], its histograms HIST int32 [N, 3, 256] (row stride s_hist) and
    luma sum LUMA int32 [N] (stride s_luma); one program per image."""
    n = tl.program_id(0).to(tl.int64)
    code = tl.load(LUT + n)
    arg = tl.load(ARG + n)
    v = tl.arange(0, 256)
    vf = v.to(tl.float32)
    count = tl.maximum(tl.sum(tl.load(HIST + n * s_hist + v)), 1)  # pixels: channel 0's histogram (0 if not read)
    mean = tl.floor(tl.load(LUMA + n * s_luma).to(tl.float64) / count.to(tl.float64) + 0.5)
    mean = mean.to(tl.float32)
    bits = tl.minimum(tl.maximum(arg.to(tl.int32), 0), 8)
    for ch in tl.static_range(3):
        table = v
        if code == LUT_AUTOCONTRAST:
            present = tl.load(HIST + n * s_hist + ch * 256 + v) > 0
            lo = tl.min(tl.where(present, v, 256)).to(tl.float32)
            hi = tl.max(tl.where(present, v, -1)).to(tl.float32)
            flat = hi == lo
            inv_scale = tl.where(flat, 1.0, (hi - lo) * (1.0 / 255))
            scaled = tl.div_rn(vf - tl.where(flat, 0.0, lo), inv_scale)
            table = tl.minimum(tl.maximum(scaled, 0.0), 255.0).to(tl.int32)
        elif code == LUT_EQUALIZE:
            hist = tl.load(HIST + n * s_hist + ch * 256 + v)
            cum = tl.cumsum(hist, 0)
            total = tl.max(cum)
            top = tl.min(tl.where(cum == total, v, 256))  # the largest value present
            step = (total - tl.sum(tl.where(v == top, hist, 0))) // 255
            mapped = tl.minimum((cum - hist + step // 2) // tl.maximum(step, 1), 255)
            table = tl.where(step != 0, mapped, v)
        elif code == LUT_INVERT:
            table = 255 - v
        elif code == LUT_POSTERIZE:
            table = v & ((0xFF << (8 - bits)) & 0xFF)
        elif code == LUT_SOLARIZE:
            table = tl.where(v.to(tl.float64) >= arg, 255 - v, v)
        elif code == LUT_SOLARIZE_ADD:
            table = tl.where(v < 128, tl.minimum(v + arg.to(tl.int32), 255), v)
        elif code == LUT_CONTRAST:
            table = _pil_blend(mean, vf, arg)
        elif code == LUT_BRIGHTNESS:
            table = _pil_blend(vf * 0.0, vf, arg)
        tl.store(TABLE + (n * 3 + ch) * 256 + v, table.to(tl.uint8))


@triton.jit
def _round_half_even(v):
    """torch.round of float64 values below 2^52 in magnitude, exactly (v - floor(v) is exact there)."""
    r = tl.floor(v)
    frac = v - r
    odd = r - 2.0 * tl.floor(r * 0.5) == 1.0
    return tl.where((frac > 0.5) | ((frac == 0.5) & odd), r + 1.0, r)


@triton.jit
def _attempt_sides(box, a, ok, height, width, parts, CONST, ATTEMPTS: tl.constexpr):
    """One attempt's box sides, rounded half to even: (sqrt(area * aspect), sqrt(area / aspect)) with area = a uniform
    in the scale range (CONST 0, 1) * height * width / parts (in the spec's order of rounding) and aspect = exp of a
    uniform in the log ratio range (CONST 2, 3); box: the image's draws, attempt a's area uniform at box + a, its
    aspect uniform at box + ATTEMPTS + a."""
    area = (_c(CONST, 0) + _c(CONST, 1) * tl.load(box + a, mask=ok, other=0.0)) * height * width / parts
    aspect = tl.exp(_c(CONST, 2) + _c(CONST, 3) * tl.load(box + ATTEMPTS + a, mask=ok, other=0.0))
    return _round_half_even(tl.sqrt(area * aspect)), _round_half_even(tl.sqrt(area / aspect))


@triton.jit
def crop_boxes_kernel(SIZES, U, CONST, OUT, N, s_u, ATTEMPTS: tl.constexpr, BLOCK: tl.constexpr):
    """Random resized crops (timm's draw) of N images: SIZES int64 [N, 2] (H, W); U float64 rows of stride s_u: the
    attempts' area uniforms, their aspect uniforms, then two placement uniforms; CONST float64: scale low, scale span,
    log ratio low, log ratio span, ratio low, ratio high. OUT int64 [N, 4]: top, left, height, width."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < N
    h = tl.load(SIZES + i * 2, mask=ok, other=1).to(tl.float64)
    w = tl.load(SIZES + i * 2 + 1, mask=ok, other=1).to(tl.float64)
    row = U + i * s_u
    found = i < 0
    ch = tl.zeros_like(h)
    cw = tl.zeros_like(h)
    for a in tl.static_range(ATTEMPTS):
        tw, th = _attempt_sides(row, a, ok, h, w, 1.0, CONST, ATTEMPTS)  # (/ 1.0 is exact)
        fit = (tw <= w) & (th <= h)
        take = fit & ~found
        cw = tl.where(take, tw, cw)
        ch = tl.where(take, th, ch)
        found = found | fit
    in_ratio = w / h  # no attempt fits: the centre crop of the closest allowed aspect ratio
    fw = tl.where(in_ratio > _c(CONST, 5), _round_half_even(h * _c(CONST, 5)), w)
    fh = tl.where(in_ratio < _c(CONST, 4), _round_half_even(w / _c(CONST, 4)), h)
    ch = tl.where(found, ch, fh)
    cw = tl.where(found, cw, fw)
    place_y = tl.load(row + 2 * ATTEMPTS, mask=ok, other=0.0)
    place_x = tl.load(row + 2 * ATTEMPTS + 1, mask=ok, other=0.0)
    top = tl.where(found, tl.floor(place_y * (h - ch + 1)), tl.floor((h - ch) / 2))
    left = tl.where(found, tl.floor(place_x * (w - cw + 1)), tl.floor((w - cw) / 2))
    tl.store(OUT + i * 4, top.to(tl.int64), mask=ok)
    tl.store(OUT + i * 4 + 1, left.to(tl.int64), mask=ok)
    tl.store(OUT + i * 4 + 2, ch.to(tl.int64), mask=ok)
    tl.store(OUT + i * 4 + 3, cw.to(tl.int64), mask=ok)


@triton.jit(do_not_specialize=["HEIGHT", "WIDTH"])  # used as float values (a size of 1 would become a constant)
def erase_boxes_kernel(
    U, CONST, OUT, N, s_u, HEIGHT, WIDTH, MAX_COUNT: tl.constexpr, ATTEMPTS: tl.constexpr, BLOCK: tl.constexpr
):  # fmt: skip
    """timm's RandomErasing boxes of N images of HEIGHT x WIDTH: U float64 rows of stride s_u: the count and apply
    uniforms, then per box the attempts' area and aspect uniforms and two placement uniforms; CONST float64: area
    low, area span, log ratio low, log ratio span, probability. OUT int64 [N, MAX_COUNT, 4]: top, left, height (0
    where nothing is erased), width."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < N
    row = U + i * s_u
    height = HEIGHT.to(tl.float64)
    width = WIDTH.to(tl.float64)
    count = tl.minimum(tl.floor(tl.load(row, mask=ok, other=0.0) * MAX_COUNT), MAX_COUNT - 1) + 1
    erased = tl.load(row + 1, mask=ok, other=1.0) < _c(CONST, 4)
    for b in tl.static_range(MAX_COUNT):
        box = row + 2 + b * (2 * ATTEMPTS + 2)
        found = i < 0
        bh = tl.zeros_like(count)
        bw = tl.zeros_like(count)
        for a in tl.static_range(ATTEMPTS):
            th, tw = _attempt_sides(box, a, ok, height, width, count, CONST, ATTEMPTS)
            fit = (tw < width) & (th < height)
            if a == 0:  # the first fit, else the first attempt (then not kept)
                bh, bw = th, tw
            else:
                take = fit & ~found
                bh = tl.where(take, th, bh)
                bw = tl.where(take, tw, bw)
            found = found | fit
        top = tl.floor(tl.load(box + 2 * ATTEMPTS, mask=ok, other=0.0) * (height - bh + 1))
        left = tl.floor(tl.load(box + 2 * ATTEMPTS + 1, mask=ok, other=0.0) * (width - bw + 1))
        kept = erased & (b < count) & found
        out = OUT + (i * MAX_COUNT + b) * 4
        tl.store(out, top.to(tl.int64), mask=ok)
        tl.store(out + 1, left.to(tl.int64), mask=ok)
        tl.store(out + 2, tl.where(kept, bh, 0.0).to(tl.int64), mask=ok)
        tl.store(out + 3, bw.to(tl.int64), mask=ok)
