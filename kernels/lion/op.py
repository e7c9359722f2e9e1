"""The kernel entry points registered with ``lightvision.ops`` (same arguments as the public ops, no backend).

    lion_attention(q, k, v, *, mask, log_decay, form, chunk_size, normalize)
        -> Y [B, H, N, d_v] (q.dtype), or (num [B, H, N, d_v], den [B, H, N]) in fp32 when normalize=False
    two_scan_attention(q, k, v, *, log_decay, chunk_size) -> A V (no normaliser), q.dtype
    lion_attention_qkvpacked(qkv, num_heads, *, mask, log_decay, gates_in_qkv, num_prefix_tokens, form)
        -> Y [B, N, H * d], q.dtype

Kernel forms: "parallel" and "chunk" run the flash-style masked kernel (parallel.py: tiles of keys, O(N)
memory); "scan" and "recurrent" run the linear-time bidirectional chunked scan (scan.py); "auto" picks by
:func:`choose_form`. ``chunk_size`` only names the reference's blocking (every form is the same function);
the kernels use their own tiles of 64 tokens. Log-decays must be <= 0 (gates a in (0, 1], as logsigmoid
gives them); the parallel kernel relies on it to skip tiles whose mask underflows to 0.
Supported: CUDA tensors (or the Triton interpreter on CPU), fp32 / bf16 / fp16, head dims <= 128; anything
else returns NotImplemented so the reference runs.
"""

from __future__ import annotations

import os

import torch

from lightvision.ops.heads import split_heads
from lightvision.ops.lion import MASK_FEATURE_MAP, split_gate_logits

from ..fused.feature_map import covered
from .custom import lion_core, lion_packed

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 128
# form="auto": the flash-style parallel kernel below these sequence lengths, the linear-time scan from them
# on. Every stage of the scan is parallel over chunks, so the choice depends on N alone (not on the batch).
# Crossovers measured on an H100, bf16, H = 6, d = 64, B * N ~ 50k (docs/kernels_lion.md,
# commits d4669ef and 595434c).
AUTO_SCAN_MIN_N_TRAIN = {"lit": 512, "d": 512, "s": 512}
AUTO_SCAN_MIN_N_INFER = {"lit": 1024, "d": 512, "s": 512}
_FORMS = {"parallel": "parallel", "chunk": "parallel", "scan": "scan", "recurrent": "scan"}


def choose_form(n: int, needs_grad: bool = True, mask: str = "s") -> str:
    """Kernel form for form="auto": "scan" from N >= AUTO_SCAN_MIN_N_TRAIN[mask] when a gradient is needed,
    from N >= AUTO_SCAN_MIN_N_INFER[mask] for the forward alone; else "parallel"."""
    limits = AUTO_SCAN_MIN_N_TRAIN if needs_grad else AUTO_SCAN_MIN_N_INFER
    return "scan" if n >= limits[mask] else "parallel"


def _kernel_form(form: str, q: torch.Tensor, mask: str, *tensors) -> str:
    if form != "auto":
        return _FORMS[form]
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    return choose_form(q.shape[2], needs_grad, mask)


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the kernels cover these inputs (device, dtypes, head dims)."""
    on_device = q.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    return (
        on_device
        and q.dtype in KERNEL_DTYPES
        and q.dtype == k.dtype == v.dtype
        and q.shape[-1] <= MAX_HEAD_DIM
        and v.shape[-1] <= MAX_HEAD_DIM
    )


def gates(mask: str, log_decay: torch.Tensor | None) -> torch.Tensor | None:
    """The kernels' fp32 log-gates (None for LIT): D: log lambda [H], which the kernels read at every token
    (the gradient comes back as [H], no [B, H, N] copy either way); S: log a_m [B, H, N] as given."""
    if mask == "lit":
        return None
    return log_decay.float().contiguous()


def lion_attention(q, k, v, *, mask="lit", log_decay=None, form="parallel", chunk_size=64, normalize=True):
    """Kernel implementation of :func:`lightvision.ops.lion.lion_attention` (arguments checked there)."""
    if not supported(q, k, v):
        return NotImplemented
    kform = _kernel_form(form, q, mask, q, k, v, log_decay)
    return lion_core(q, k, v, gates(mask, log_decay), normalize, kform)


def lion_attention_qkvpacked(
    qkv, num_heads, *, mask="lit", log_decay=None, gates_in_qkv=False, num_prefix_tokens=0, form="parallel"
):
    """Kernel implementation of :func:`lightvision.ops.lion.lion_attention_qkvpacked`: one packed op in either form
    (custom.lion_packed: phi and its gradient inside, the gate logits read from qkv, Y and dqkv in the projections'
    layouts)."""
    q, k, v = split_heads(split_gate_logits(qkv, num_heads)[0] if gates_in_qkv else qkv, num_heads)
    if not supported(q, k, v):
        return NotImplemented
    if not covered(q):
        raise RuntimeError(f"lion_feature_map: the Triton kernel does not cover q / k {tuple(q.shape)} {q.dtype}")
    kform = _kernel_form(form, q, mask, qkv, log_decay)
    g = gates(mask, log_decay) if not gates_in_qkv else None
    return lion_packed(qkv, g, num_heads, MASK_FEATURE_MAP[mask], gates_in_qkv, num_prefix_tokens, kform)


def two_scan_attention(q, k, v, *, log_decay, chunk_size=64):
    """Kernel implementation of :func:`lightvision.ops.two_scan.two_scan_attention`: the scan kernel's
    numerator A V (D mask for [H] decays, S for [B, H, N] gates)."""
    if not supported(q, k, v):
        return NotImplemented
    mask = "d" if log_decay.dim() == 1 else "s"
    num, _ = lion_core(q, k, v, gates(mask, log_decay), False, "scan")
    return num.to(q.dtype)


__all__ = ["lion_attention", "lion_attention_qkvpacked", "two_scan_attention", "choose_form"]
