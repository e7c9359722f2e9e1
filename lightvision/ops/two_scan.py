"""The "two-scan" baseline: bidirectional multiplicative decay as two causal scans (LightNet Sec. 3.1; docs/spec.md
1.6)."""

from __future__ import annotations

import torch

from ._checks import check_qkv, compute_dtype
from ._dispatch import dispatch
from ._scan import bidirectional_scan
from .lion import check_log_decay, step_log_decays


def two_scan_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor,
    *,
    chunk_size: int = 64,
    backend: str = "auto",
) -> torch.Tensor:
    """Forward causal decay scan + backward one, diagonal once: O_i = sum_j M_ij (q_i . k_j) v_j.

    No normalisation (O = A V, as the forward + reverse ``chunk_simple_gla`` of flash-linear-attention runs it);
    LION's normalised output is ``lion_attention(form="scan")``. Each scan is chunked, fp32 accumulation.

    Args:
        q, k: [B, H, N, d]; v: [B, H, N, d_v].
        log_decay: [H] (log lambda per head, M_ij = lambda^|i-j|, the Vim / Vision-RWKV / RetNet pattern) or
            [B, H, N] (log gates a_m with LION-S's convention: forward lam_i = a_{i-1}, backward lam_i = a_{i+1}).
        chunk_size: tokens per chunk of each scan.
        backend: "torch" | "auto" | "triton" (:mod:`lightvision.ops._dispatch`).

    Returns:
        O [B, H, N, d_v] in q's dtype.

    Example:
        >>> q, k, v = (torch.randn(2, 3, 40, 16) for _ in range(3))
        >>> two_scan_attention(q, k, v, torch.full((3,), -0.1)).shape
        torch.Size([2, 3, 40, 16])
    """
    check_qkv(q, k, v, "two_scan_attention")
    if not isinstance(log_decay, torch.Tensor) or log_decay.dim() not in (1, 3):
        got = tuple(log_decay.shape) if isinstance(log_decay, torch.Tensor) else type(log_decay).__name__
        raise ValueError(f"two_scan_attention: log_decay must be [H] or [B, H, N], got {got}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"two_scan_attention: chunk_size must be a positive int, got {chunk_size!r}")
    mask = "d" if log_decay.dim() == 1 else "s"
    check_log_decay(mask, log_decay, q, "two_scan_attention")
    out = dispatch("two_scan_attention", backend, q.device, (q, k, v), dict(log_decay=log_decay, chunk_size=chunk_size))
    if out is not NotImplemented:
        return out
    dt = compute_dtype(q, k, v)
    log_fwd, log_bwd = step_log_decays(mask, log_decay, q.shape, dt, q.device)
    return bidirectional_scan(q.to(dt), k.to(dt), v.to(dt), log_fwd, log_bwd, chunk_size).to(q.dtype)
