"""Triton program of :func:`lightvision.kernels.resize.resized_crops`.

One program computes a BY x BX tile of one image's channel. PyTorch's antialiased resampling (``F.interpolate(...,
antialias=True)``, PIL's filters) is separable: output pixel (y, x) of a crop of h x w input pixels scaled to S x S is

    out[y, x] = sum_r wy[y, r] sum_c wx[x, c] in[t + r, l + c],

    w[o, i] = f((i - center_o + 0.5) / s') / sum_i' f((i' - center_o + 0.5) / s'),   center_o = scale (o + 0.5),
    scale = h / S (rows) or w / S (columns),  s' = max(scale, 1),  i in [int(center_o - R s' + 0.5), int(center_o +
    R s' + 0.5)) clipped to the crop,

with f the bicubic kernel of a = -0.5 (R = 2) or the triangle (R = 1). The program computes its tile's horizontal
weights once, walks the input rows the tile needs once, resamples each row horizontally for the tile's columns, and adds
it to every output row with that row's vertical weight, so each input pixel is read about (horizontal taps) times
instead of (horizontal x vertical taps). With ROUNDED it stores uint8, rounded half to even and clipped to 0..255.
"""

import triton
import triton.language as tl

from .._rounding import rint


@triton.jit
def _filter(x, BICUBIC: tl.constexpr):
    x = tl.abs(x)
    if BICUBIC:  # Keys' cubic convolution with a = -0.5 (PIL's and PyTorch's antialiased bicubic)
        near = (1.5 * x - 2.5) * x * x + 1.0
        far = ((-0.5 * x + 2.5) * x - 4.0) * x + 2.0
        return tl.where(x < 1.0, near, tl.where(x < 2.0, far, 0.0))
    return tl.maximum(1.0 - x, 0.0)


@triton.jit
def _taps(o, scale, size, RADIUS: tl.constexpr):
    """First input index, tap count, centre and filter stretch of output indices o (any shape)."""
    center = scale * (o.to(tl.float32) + 0.5)
    stretch = tl.maximum(scale, 1.0)
    support = RADIUS * stretch
    lo = tl.maximum((center - support + 0.5).to(tl.int32), 0)
    hi = tl.minimum((center + support + 0.5).to(tl.int32), size)
    return lo, hi - lo, center, stretch


@triton.jit
def resized_crops_kernel(
    SRC, PARAMS, OUT, C, S,
    BICUBIC: tl.constexpr, RADIUS: tl.constexpr, BY: tl.constexpr, BX: tl.constexpr, TAPS: tl.constexpr,
    ROUNDED: tl.constexpr,
):  # fmt: skip
    """SRC: every image's [C, H, W] uint8 pixels one after another; PARAMS int64 [N, 8]: offset of the image in
    SRC, H, W, crop top, left, height, width, flip; OUT float32 [N, C, S, S] (ROUNDED: uint8). TAPS: a power of two
    at least the most horizontal taps an output pixel has (the tile's [TAPS, BX] weights are computed once, then
    reused for every input row)."""
    nc = tl.program_id(0)
    n, c = nc // C, nc % C
    p = PARAMS + n * 8
    offset, width = tl.load(p), tl.load(p + 2)
    height_img = tl.load(p + 1)
    top, left, h, w, flip = tl.load(p + 3), tl.load(p + 4), tl.load(p + 5), tl.load(p + 6), tl.load(p + 7)
    oy = tl.program_id(1) * BY + tl.arange(0, BY)
    ox = tl.program_id(2) * BX + tl.arange(0, BX)
    row_ok, col_ok = oy < S, ox < S
    scale_y = h.to(tl.float32) / S
    scale_x = w.to(tl.float32) / S
    ylo, yn, yc, ys = _taps(oy, scale_y, h.to(tl.int32), RADIUS)
    xlo, xn, xc, xs = _taps(ox, scale_x, w.to(tl.int32), RADIUS)
    xn = tl.where(col_ok, xn, 0)
    yn = tl.where(row_ok, yn, 0)
    # each output column's horizontal weights [TAPS, BX], normalised to sum 1
    k = tl.arange(0, TAPS)
    tap_ok = k[:, None] < xn[None, :]
    cols = xlo[None, :] + k[:, None]
    wx = tl.where(tap_ok, _filter((cols - xc[None, :] + 0.5) / xs[None, :], BICUBIC), 0.0)
    wx = wx / tl.where(col_ok, tl.sum(wx, 0), 1.0)[None, :]
    ynorm = tl.zeros((BY,), tl.float32)
    for t in range(0, tl.max(yn)):
        ynorm += tl.where(t < yn, _filter((ylo + t - yc + 0.5) / ys, BICUBIC), 0.0)
    ynorm = tl.where(row_ok, ynorm, 1.0)
    base = SRC + offset + c * height_img * width + top * width + left
    r_first = tl.min(tl.where(row_ok, ylo, 2147483647))
    r_last = tl.max(tl.where(row_ok, ylo + yn, 0))
    acc = tl.zeros((BY, BX), tl.float32)
    for r in range(r_first, r_last):
        px = tl.load(base + r * width + cols, mask=tap_ok, other=0).to(tl.float32)
        line = tl.sum(wx * px, 0)
        wy = tl.where((r >= ylo) & (r < ylo + yn), _filter((r - yc + 0.5) / ys, BICUBIC), 0.0)
        acc += wy[:, None] * line[None, :]
    acc = acc / ynorm[:, None]
    ox_out = tl.where(flip != 0, S - 1 - ox, ox)
    dst = OUT + nc * S * S + oy[:, None] * S + ox_out[None, :]
    if ROUNDED:
        acc = tl.minimum(tl.maximum(rint(acc), 0.0), 255.0).to(tl.uint8)
    tl.store(dst, acc, mask=row_ok[:, None] & col_ok[None, :])
