"""Triton program of :func:`lightvision.kernels.erase.normalize_erase`: BLOCK pixels (every channel) of one image per
program. A pixel inside one of the image's K boxes takes the fill (read only there); the others take
(v / 255 - mean) / std with IEEE division, launched with ``enable_fp_fusion=False`` as the reference rounds."""

import triton
import triton.language as tl


@triton.jit
def normalize_erase_kernel(
    X, MEAN, STD, BOXES, NOISE, OUT, H, W, s_nn, s_nc, s_nh, s_nw,
    C: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """X uint8 [N, C, H, W]; MEAN, STD float32 [C]; BOXES int64 [N, K, 4]; NOISE float32 (strides s_n*);
    OUT float32 [N, C, H, W]."""
    n = tl.program_id(0)
    hw = H * W
    p = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = p < hw
    row, col = p // W, p % W
    erased = tl.zeros((BLOCK,), tl.int32) != 0
    for k in tl.static_range(K):
        box = BOXES + (n * K + k) * 4
        top, left, bh, bw = tl.load(box), tl.load(box + 1), tl.load(box + 2), tl.load(box + 3)
        erased = erased | ((row >= top) & (row < top + bh) & (col >= left) & (col < left + bw))
    for c in tl.static_range(C):
        plane = (n * C + c) * hw
        v = tl.load(X + plane + p, mask=ok, other=0).to(tl.float32)
        z = tl.div_rn(tl.div_rn(v, 255.0) - tl.load(MEAN + c), tl.load(STD + c))
        fill = tl.load(NOISE + n * s_nn + c * s_nc + row * s_nh + col * s_nw, mask=ok & erased, other=0.0)
        tl.store(OUT + plane + p, tl.where(erased, fill, z), mask=ok)
