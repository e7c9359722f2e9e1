"""Triton program of :func:`lightvision.kernels.mix.mix_reversed`: BLOCK values of image n per program, read with
the same values of image N-1-n; CutMix takes the mirror's value inside the box, mixup x lam + mirror (1 - lam)
(launched with ``enable_fp_fusion=False``: a product each, then the sum, as the reference rounds). :func:`mix_terms`
and :func:`mixed` are the choice itself, shared with :func:`lightvision.kernels.erase.normalize_erase`'s program."""

import triton
import triton.language as tl


@triton.jit
def mix_terms(row, col, WEIGHTS, CUT, BOX):
    """The batch's mix at pixels (row, col), read once per program: (inside the box, CutMix, lam, 1 - lam); WEIGHTS
    float32 [2] (lam, 1 - lam); CUT int32 [1]; BOX int64 [4] (top, bottom, left, right)."""
    top, bottom, left, right = tl.load(BOX), tl.load(BOX + 1), tl.load(BOX + 2), tl.load(BOX + 3)
    inside = (row >= top) & (row < bottom) & (col >= left) & (col < right)
    return inside, tl.load(CUT) != 0, tl.load(WEIGHTS), tl.load(WEIGHTS + 1)


@triton.jit
def mixed(own, mirror, inside, cut, lam, rest):
    """The mix of values ``own`` (image n) and ``mirror`` (image N-1-n), by :func:`mix_terms`."""
    return tl.where(cut, tl.where(inside, mirror, own), own * lam + mirror * rest)


@triton.jit
def mix_reversed_kernel(X, OUT, WEIGHTS, CUT, BOX, N, H, W, C: tl.constexpr, BLOCK: tl.constexpr):
    """X, OUT float32 [N, C, H, W]; WEIGHTS, CUT, BOX: :func:`mix_terms`'s."""
    n = tl.program_id(0)
    size = C * H * W
    q = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = q < size
    p = q % (H * W)
    own = tl.load(X + n * size + q, mask=ok, other=0.0)
    mirror = tl.load(X + (N - 1 - n) * size + q, mask=ok, other=0.0)
    inside, cut, lam, rest = mix_terms(p // W, p % W, WEIGHTS, CUT, BOX)
    tl.store(OUT + n * size + q, mixed(own, mirror, inside, cut, lam, rest), mask=ok)
