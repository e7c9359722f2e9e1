"""Triton program of :func:`lightvision.kernels.erase.normalize_erase`: BLOCK pixels (every channel) of one image per
program. A pixel inside one of the image's K boxes takes the fill (read only there, or drawn only in blocks that hold
such a pixel); the others take (v / 255 - mean) / std with IEEE division, launched with ``enable_fp_fusion=False`` as
the reference rounds. With MIX a program computes the same pixels of image n and of its mirror N-1-n and writes both
images' mixes (:func:`lightvision.kernels.mix._triton.mixed`), over the first half of the batch (the middle image of
an odd batch is its own mirror)."""

import triton
import triton.language as tl

from ..mix._triton import mix_terms, mixed


@triton.jit
def _erased(BOXES, n, row, col, K: tl.constexpr, BLOCK: tl.constexpr):
    """bool [BLOCK]: the pixels (row, col) inside one of image n's K boxes (BOXES int64 [N, K, 4])."""
    erased = tl.zeros((BLOCK,), tl.int32) != 0
    for k in tl.static_range(K):
        box = BOXES + (n * K + k) * 4
        top, left, bh, bw = tl.load(box), tl.load(box + 1), tl.load(box + 2), tl.load(box + 3)
        erased = erased | ((row >= top) & (row < top + bh) & (col >= left) & (col < left + bw))
    return erased


@triton.jit
def _normals(seed, c, start, hw, BLOCK: tl.constexpr):
    """float32 [BLOCK]: standard normals of pixels start .. start + BLOCK - 1 of plane c (start a multiple of 4),
    four per Philox draw (``tl.randn4x``): pixel i of plane c takes normal i mod 4 of counter
    c ceil(hw / 4) + i // 4."""
    q = c * ((hw + 3) // 4) + start // 4 + tl.arange(0, BLOCK // 4)
    n1, n2, n3, n4 = tl.randn4x(seed, q)
    return tl.reshape(tl.join(tl.join(n1, n2), tl.join(n3, n4)), (BLOCK,))


@triton.jit
def _drawn(erased, ok, DRAWS: tl.constexpr):
    """Whether the block holds an erased pixel, where the program draws a per-pixel fill (DRAWS); else False."""
    if DRAWS:
        return tl.sum((erased & ok).to(tl.int32), 0) > 0
    return False


@triton.jit
def _channel(
    X, MEAN, STD, NOISE, SEEDS, n, c, p, ok, row, col, erased, drawn, hw, s_nn, s_nc, s_nh, s_nw,
    C: tl.constexpr, SEEDED: tl.constexpr, PER_PIXEL: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Channel c of image n at pixels p: normalised, or the fill where ``erased`` (``drawn``: the block holds an
    erased pixel, so a per-pixel fill is drawn)."""
    v = tl.load(X + (n * C + c) * hw + p, mask=ok, other=0).to(tl.float32)
    z = tl.div_rn(tl.div_rn(v, 255.0) - tl.load(MEAN + c), tl.load(STD + c))
    if SEEDED:
        seed = tl.load(SEEDS + n)
        if PER_PIXEL:
            fill = tl.zeros((BLOCK,), tl.float32)
            if drawn:  # Philox only in blocks that show it
                fill = _normals(seed, c, tl.program_id(1) * BLOCK, hw, BLOCK)
        else:
            fill = tl.randn(seed, tl.full((), c, tl.int32))
    else:
        fill = tl.load(NOISE + n * s_nn + c * s_nc + row * s_nh + col * s_nw, mask=ok & erased, other=0.0)
    return tl.where(erased, fill, z)


@triton.jit
def normalize_erase_kernel(
    X, MEAN, STD, BOXES, NOISE, SEEDS, WEIGHTS, CUT, BOX, OUT, N, H, W, s_nn, s_nc, s_nh, s_nw,
    C: tl.constexpr, K: tl.constexpr, SEEDED: tl.constexpr, PER_PIXEL: tl.constexpr, MIX: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """X uint8 [N, C, H, W]; MEAN, STD float32 [C]; BOXES int64 [N, K, 4]; NOISE float32 (strides s_n*), or with
    SEEDED the fill drawn from SEEDS int64 [N] (per pixel, or per channel); with MIX, WEIGHTS, CUT and BOX the mix's
    (:func:`lightvision.kernels.mix._triton.mix_terms`, read once per program), and program n writes images n and
    N-1-n (n < N - n), each computed once; OUT float32 [N, C, H, W]."""
    n = tl.program_id(0)
    m = N - 1 - n
    hw = H * W
    p = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = p < hw
    row, col = p // W, p % W
    erased = _erased(BOXES, n, row, col, K, BLOCK)
    drawn = _drawn(erased, ok, SEEDED and PER_PIXEL)
    if MIX:
        erased_m = _erased(BOXES, m, row, col, K, BLOCK)
        drawn_m = _drawn(erased_m, ok, SEEDED and PER_PIXEL)
        inside, cut, lam, rest = mix_terms(row, col, WEIGHTS, CUT, BOX)
    for c in tl.static_range(C):
        z = _channel(
            X, MEAN, STD, NOISE, SEEDS, n, c, p, ok, row, col, erased, drawn, hw, s_nn, s_nc, s_nh, s_nw,
            C, SEEDED, PER_PIXEL, BLOCK,
        )  # fmt: skip
        if MIX:
            zm = _channel(
                X, MEAN, STD, NOISE, SEEDS, m, c, p, ok, row, col, erased_m, drawn_m, hw, s_nn, s_nc, s_nh, s_nw,
                C, SEEDED, PER_PIXEL, BLOCK,
            )  # fmt: skip
            tl.store(OUT + (m * C + c) * hw + p, mixed(zm, z, inside, cut, lam, rest), mask=ok)
            z = mixed(z, zm, inside, cut, lam, rest)
        tl.store(OUT + (n * C + c) * hw + p, z, mask=ok)
