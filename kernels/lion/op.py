"""The kernel entry points registered with ``lightvision.ops`` (same arguments as the public ops, no backend).

    lion_attention(q, k, v, *, mask, log_decay, form, chunk_size, normalize)
        -> Y [B, H, N, d_v] (q.dtype), or (num [B, H, N, d_v], den [B, H, N]) in fp32 when normalize=False
    two_scan_attention(q, k, v, *, log_decay, chunk_size) -> A V (no normaliser), q.dtype

Kernel forms: "parallel" and "chunk" run the flash-style masked kernel (parallel.py: tiles of keys, O(N)
memory); "scan" and "recurrent" run the linear-time bidirectional chunked scan (scan.py); "auto" picks by
:func:`choose_form`. ``chunk_size`` only names the reference's blocking (every form is the same function);
the kernels use their own tile of 64 tokens. Log-decays must be <= 0 (gates a in (0, 1], as logsigmoid
gives them); the parallel kernel relies on it to skip tiles whose mask underflows to 0.
Supported: CUDA tensors (or the Triton interpreter on CPU), fp32 / bf16 / fp16, head dims <= 128; anything
else returns NotImplemented so the reference runs.
"""

from __future__ import annotations

import os

import torch

from .._launch import num_sms
from .custom import lion_core
from .parallel import EPS

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 128
# form="auto": the flash-style parallel kernel below these sequence lengths, the linear-time scan from them
# on. Crossovers measured on an H100, bf16, H = 6, d = 64, B * N ~ 50k (docs/kernels_lion.md,
# benchmarks/results/lion_h100.json): training (forward + backward) between N = 1024 and 2304 for every mask;
# inference with a decay mask between 196 and 576 (the masked forward pays an exp per tile column, the scan
# only per token), LIT inference between 1024 and 2304.
# Training also needs enough (batch, head) pairs: the scan's backward runs one sequential program per pair, so
# with fewer pairs than about half the SMs the parallel kernel wins at any N (session 3, H100, fwd + bwd:
# B*H = 6 at N = 65536: parallel 6.3 ms vs scan 37.9; B*H = 18 at 16384: 4.5 vs 9.8; B*H = 72 at 4096: scan
# 2.87 vs 4.0; B*H = 144 at 2048: scan 2.90 vs 3.20; benchmarks/results/lion_auto_h100.json).
AUTO_SCAN_MIN_N_TRAIN = 2048
AUTO_SCAN_MIN_PAIRS_TRAIN_PER_SM = 0.5
AUTO_SCAN_MIN_N_INFER = {"lit": 2048, "d": 384, "s": 384}
_FORMS = {"parallel": "parallel", "chunk": "parallel", "scan": "scan", "recurrent": "scan"}


def choose_form(n: int, needs_grad: bool = True, mask: str = "s", pairs: int | None = None, sms: int = 132) -> str:
    """Kernel form for form="auto". With a gradient: "scan" from N >= AUTO_SCAN_MIN_N_TRAIN when the
    ``pairs`` = B * H (None: many) reach AUTO_SCAN_MIN_PAIRS_TRAIN_PER_SM * ``sms``; forward only: "scan"
    from N >= AUTO_SCAN_MIN_N_INFER[mask]; else "parallel"."""
    if not needs_grad:
        return "scan" if n >= AUTO_SCAN_MIN_N_INFER[mask] else "parallel"
    enough = pairs is None or pairs >= AUTO_SCAN_MIN_PAIRS_TRAIN_PER_SM * sms
    return "scan" if n >= AUTO_SCAN_MIN_N_TRAIN and enough else "parallel"


def _kernel_form(form: str, q: torch.Tensor, mask: str, *tensors) -> str:
    if form != "auto":
        return _FORMS[form]
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    return choose_form(q.shape[2], needs_grad, mask, q.shape[0] * q.shape[1], num_sms(q.device))


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the kernels cover these inputs (device, dtypes, head dims)."""
    on_device = q.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    return (on_device and q.dtype in KERNEL_DTYPES and q.dtype == k.dtype == v.dtype
            and q.shape[-1] <= MAX_HEAD_DIM and v.shape[-1] <= MAX_HEAD_DIM)


def gates(mask: str, log_decay: torch.Tensor | None, shape: torch.Size) -> torch.Tensor | None:
    """Per-token fp32 log-gates [B, H, N] of the kernels' mask (None for LIT). D: log lambda at every token
    (autograd sums the gate gradient back to [H]); S: log a_m as given."""
    b, h, n, _ = shape
    if mask == "lit":
        return None
    if mask == "d":
        return log_decay.float()[None, :, None].expand(b, h, n).contiguous()
    return log_decay.float().contiguous()


def lion_attention(q, k, v, *, mask="lit", log_decay=None, form="parallel", chunk_size=64, normalize=True):
    """Kernel implementation of :func:`lightvision.ops.lion.lion_attention` (arguments checked there)."""
    if not supported(q, k, v):
        return NotImplemented
    kform = _kernel_form(form, q, mask, q, k, v, log_decay)
    return lion_core(q, k, v, gates(mask, log_decay, q.shape), normalize, kform)


def two_scan_attention(q, k, v, *, log_decay, chunk_size=64):
    """Kernel implementation of :func:`lightvision.ops.two_scan.two_scan_attention`: the scan kernel's
    numerator A V (D mask for [H] decays, S for [B, H, N] gates)."""
    if not supported(q, k, v):
        return NotImplemented
    mask = "d" if log_decay.dim() == 1 else "s"
    num, _ = lion_core(q, k, v, gates(mask, log_decay, q.shape), False, "scan")
    return num.to(q.dtype)


__all__ = ["lion_attention", "two_scan_attention", "choose_form"]
