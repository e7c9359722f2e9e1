"""LION entries for scripts/bench_attention.py (``register(add)``) and a tile sweep (``python scripts/bench_lion.py``).

ops lion_lit / lion_d / lion_s; impls:
    torch_mask       the reference with the materialised [N, N] mask (lion_attention(form="parallel", backend="torch"))
    triton_parallel  the flash-style masked kernel
    triton_scan      the bidirectional chunked scan kernel
    auto             form="auto" (choose_form)
    fla              flash-linear-attention ``chunk_simple_gla`` forward + on the reversed sequence (the outside
                     two-scan anchor, no normaliser; lion_d / lion_s, only when ``fla`` is installed)
Inputs: q, k positive unit-norm features (what LION's feature map gives), v Gaussian; D learns a raw [H]
parameter (log lambda = logsigmoid), S a raw per-token [B, H, N] gate (log a = logsigmoid, cls-free).
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

from lightvision.ops.lion import lion_attention

IMPLS = {
    "torch_mask": ("parallel", "torch"),
    "triton_parallel": ("parallel", "triton"),
    "triton_scan": ("scan", "triton"),
    "auto": ("auto", "triton"),
}


def _features(B, H, N, d, dtype, device):
    q = F.normalize(torch.rand(B, H, N, d, device=device) + 0.1, dim=-1).to(dtype)
    k = F.normalize(torch.rand(B, H, N, d, device=device) + 0.1, dim=-1).to(dtype)
    return [q, k, torch.randn(B, H, N, d, device=device, dtype=dtype)]


def _make(mask: str, form: str, backend: str):
    def make(B, H, N, d, dtype, device):
        inputs = _features(B, H, N, d, dtype, device)
        if mask == "d":
            inputs.append(torch.full((H,), 3.0, device=device))
        elif mask == "s":
            inputs.append(torch.randn(B, H, N, device=device) + 3.0)

        def fn(q, k, v, *raw):
            ld = F.logsigmoid(raw[0]) if raw else None
            return lion_attention(q, k, v, mask=mask, log_decay=ld, form=form, backend=backend)

        return fn, inputs

    return make


def _make_fla(B, H, N, d, dtype, device):
    """flash-linear-attention's ``chunk_simple_gla`` forward + on the reversed sequence in its [B, N, H, d] layout,
    with a fixed per-head decay (``g_gamma``, lambda = sigmoid(3) as the D inputs above): its per-token gated
    backward refuses Hopper GPUs with Triton < 3.7.1, so selective decay is timed this way too."""
    from fla.ops.simple_gla import chunk_simple_gla

    log_decay = F.logsigmoid(torch.full((H,), 3.0, device=device))

    def fn(q, k, v):
        fwd, _ = chunk_simple_gla(q, k, v, g_gamma=log_decay, scale=1.0)
        rev, _ = chunk_simple_gla(q.flip(1), k.flip(1), v.flip(1), g_gamma=log_decay, scale=1.0)
        return fwd + rev.flip(1)

    return fn, [x.transpose(1, 2).contiguous() for x in _features(B, H, N, d, dtype, device)]


def register(add) -> None:
    """Add every (lion_<mask>, impl) pair to the bench_attention registry, and ``fla`` for D and S when installed."""
    for mask in ("lit", "d", "s"):
        for impl, (form, backend) in IMPLS.items():
            add(op=f"lion_{mask}", impl=impl, make=_make(mask, form, backend))
    if importlib.util.find_spec("fla") is not None:
        add(op="lion_d", impl="fla", make=_make_fla)
        add(op="lion_s", impl="fla", make=_make_fla)


def _sweep_inputs(N: int, B: int, form: str):
    """bf16 CUDA inputs of one sweep shape (H = 6, d = 64, S gates): q, k, v, g and the backward's dO, 1 / Z, dden."""
    from lightvision.kernels.lion.custom import lion_core

    q, k, v = _features(B, 6, N, 64, torch.bfloat16, "cuda")
    g = F.logsigmoid(torch.randn(B, 6, N, device="cuda") + 3.0)
    y, den = lion_core(q, k, v, g, False, form)
    return q, k, v, g, torch.randn_like(y).bfloat16(), torch.ones_like(den), torch.randn_like(den)


def sweep(forms=("parallel", "scan")) -> None:
    """Time the kernels' launch configurations (bf16, H = 6, d = 64, S mask, fwd and bwd) and print them."""
    import triton

    from lightvision.kernels.lion.parallel import parallel_backward, parallel_forward
    from lightvision.kernels.lion.scan import scan_backward, scan_forward

    for N, B in ((196, 256), (1024, 48), (4096, 12)) if "parallel" in forms else ():
        q, k, v, g, do, zinv, delta = _sweep_inputs(N, B, "parallel")
        for tile, warps, stages in ((64, 4, 2), (64, 4, 3), (128, 8, 2), (128, 8, 3), (64, 8, 2)):
            f = triton.testing.do_bench(
                lambda: parallel_forward(q, k, v, g, True, tile, warps, stages), return_mode="median"
            )
            tab = parallel_forward(q, k, v, g, True, tile, warps, stages)[2]
            b = triton.testing.do_bench(
                lambda: parallel_backward(q, k, v, g, do, zinv, delta, tab, tile, warps, stages), return_mode="median"
            )
            print(
                f"parallel N={N:5d} B={B:3d} tile={tile:3d} warps={warps} stages={stages}: fwd {f:.3f} bwd {b:.3f} ms"
            )
    for N, B in ((196, 256), (1024, 48), (4096, 12), (16384, 3), (65536, 1)) if "scan" in forms else ():
        q, k, v, g, do, zinv, delta = _sweep_inputs(N, B, "scan")
        for chunk, tb, block, warps in (
            (64, 16, 512, 4),
            (64, 16, 1024, 4),
            (64, 32, 256, 4),
            (64, 8, 512, 4),
            (128, 16, 512, 8),
            (128, 16, 512, 4),
            (64, 16, 512, 8),
        ):
            f = triton.testing.do_bench(
                lambda: scan_forward(q, k, v, g, True, chunk, tb, block, warps), return_mode="median"
            )
            ks = scan_forward(q, k, v, g, True, chunk, tb, block, warps)[2]
            b = triton.testing.do_bench(
                lambda: scan_backward(q, k, v, g, do, zinv, delta, ks, chunk, tb, block, warps), return_mode="median"
            )
            print(
                f"scan     N={N:5d} B={B:3d} chunk={chunk:3d} tb={tb:2d} block={block:4d} warps={warps}: "
                f"fwd {f:.3f} bwd {b:.3f} ms"
            )


if __name__ == "__main__":
    import sys

    sweep(tuple(sys.argv[1:]) or ("parallel", "scan"))
