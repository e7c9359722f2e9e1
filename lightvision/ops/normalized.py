"""Normalized attention: linear attention with identity feature maps and a learned per-token normaliser.

Sieber et al., "Understanding the differences in Foundation Models: Attention, State Space Models, and Recurrent
Neural Networks" (https://arxiv.org/abs/2405.15731), Eq. 21 in the separable form of Eq. 13-14:

    phi(q) = q,   psi(k) = k,   eta(u_i) = exp(w^T u_i)
    y_i = sum_j (q_i . k_j) v_j / eta(u_i) = exp(-w^T u_i) q_i (K^T V)

u_i is the layer's input token and w (W_eta, one row per head) a learned vector; the caller passes the per-token
log-normaliser log eta_i = w^T u_i. Our reading of the paper:

* no feature map and no 1/sqrt(d) or other fixed scale on q . k (Eq. 21 has none; a scale belongs in log eta);
* the paper's models are causal (j <= i); images have no order, so here the sum runs over every token j. eta
  depends on the query token alone, so the bidirectional form is Eq. 21 with the causal mask dropped;
* prefix tokens (cls, registers, conditions) are ordinary tokens: each gets its own eta from its input.

Numerics: 1 / eta = exp(-log eta) overflows fp32 and bf16 once log eta < -88. log eta is taken in fp32 (fp64 stays
fp64) and clamped to [-LOG_ETA_MAX, LOG_ETA_MAX] before the exponential, so the scale lies in
[exp(-30), exp(30)] and is always finite; outside that range the clamp passes no gradient to log eta.

Forms (the same function): "linear" q (K^T V), two batched matmuls in the input dtype (fp32 accumulation) with the
d x d_v state K^T V per head, O(N d d_v); "parallel" materialises A = (q k^T) / eta [N, N] in fp32 and returns A V,
the executable specification the linear form is tested against. No Triton kernel and so no ``backend`` argument:
with identity feature maps and a per-query scale the fast form is two cuBLAS matmuls (the LightNet and LION
kernels exist to fuse feature maps, key softmax, masks and normalisers that this core does not have).
"""

from __future__ import annotations

import torch

from ._checks import check_choice, check_qkv, compute_dtype

FORMS = ("linear", "parallel")
LOG_ETA_MAX = 30.0


def inverse_normalizer(log_eta: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """1 / eta = exp(-clamp(log eta, +-LOG_ETA_MAX)) as [..., N, 1] in ``dtype`` (module docstring, Numerics)."""
    return torch.exp(-log_eta.to(dtype).clamp(-LOG_ETA_MAX, LOG_ETA_MAX))[..., None]


def normalized_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_eta: torch.Tensor,
    *,
    form: str = "linear",
) -> torch.Tensor:
    """Bidirectional normalized attention, O_i = sum_j (q_i . k_j) v_j / eta_i (module docstring).

    Args:
        q, k: [B, H, N, d] query and key projections (no feature map).
        v: [B, H, N, d_v] values.
        log_eta: [B, H, N] log-normaliser of every query token, w^T u_i per head; used in fp32 (fp64 stays fp64).
        form: "linear" (q (K^T V), the fast form) or "parallel" (the materialised [N, N] matrix).

    Returns:
        O [B, H, N, d_v] in q's dtype.

    Example:
        >>> q, k, v = (torch.randn(2, 3, 1 + 14 * 14, 64) for _ in range(3))
        >>> normalized_attention(q, k, v, torch.zeros(2, 3, 197)).shape
        torch.Size([2, 3, 197, 64])
    """
    check_qkv(q, k, v, "normalized_attention")
    check_choice(form, FORMS, "normalized attention form")
    if not isinstance(log_eta, torch.Tensor) or tuple(log_eta.shape) != tuple(q.shape[:3]):
        got = tuple(log_eta.shape) if isinstance(log_eta, torch.Tensor) else type(log_eta).__name__
        raise ValueError(f"normalized_attention: log_eta must be [B, H, N] = {tuple(q.shape[:3])}, got {got}")
    dt = compute_dtype(q, k, v, log_eta)
    scale = inverse_normalizer(log_eta, dt)
    if form == "parallel":
        a = (q.to(dt) @ k.to(dt).transpose(-1, -2)) * scale
        return (a @ v.to(dt)).to(q.dtype)
    return ((q @ (k.transpose(-1, -2) @ v)) * scale).to(q.dtype)  # the product promotes to the scale's dtype
