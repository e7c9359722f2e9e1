"""MD-TPE: multi-dimensional Toeplitz positional encoding (LightNet Eq. 10-11; SPEC 1.3)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._checks import check_choice, check_grid, compute_dtype
from ._dispatch import dispatch

IMPLS = ("dense", "scan")


def md_tpe(
    x: torch.Tensor,
    grid: Sequence[int],
    coeffs: torch.Tensor,
    log_lambda: torch.Tensor,
    *,
    num_prefix_tokens: int = 0,
    causal: bool = False,
    impl: str = "dense",
    backend: str = "auto",
) -> torch.Tensor:
    """Per-axis Toeplitz token mixing, summed over axes: x [B, N, C] -> y [B, N, C].

    Axis j of the grid carries the kernel t^j_n[c] = sum_r coeffs[j, c, r] * lambda_{j,r}^|n| (an SSM with
    e = coeffs.shape[-1] hidden states, lambda = exp(log_lambda) in (0, 1)); causal=True keeps n >= 0 only.
    y[p, c] = sum_j sum_{p' on p's line along axis j} t^j_{p_j - p'_j}[c] x[p', c]  (Eq. 10-11).
    coeffs: [len(grid), C, e]; log_lambda: [len(grid), e] (log lambda, e.g. logsigmoid of a parameter).
    Prefix tokens (the first ``num_prefix_tokens``) are neither mixed nor mixed into: their rows of y are 0,
    so a residual caller x + f(y) leaves them unchanged.
    impl "dense": one [C, L, L] Toeplitz matmul per axis (fast for image axes, L <= ~128; 1-D and 2-D grids as
    channel-batched products, ``_dense_channel_first``);
    impl "scan": forward (and backward) first-order recurrences h_a = lambda h_{a-1} + x_a per axis,
    y = coeffs . (h_fwd + h_bwd - x), O(L) per line. Computed in fp32, returns x's dtype.
    ``backend``: "torch" | "auto" | "triton" (see :mod:`lightvision.ops._dispatch`); the kernel
    (``lightvision.kernels.fused.md_tpe``) runs the dense form of 2-D grids on their [B, N, C] layout.
    """
    if x.dim() != 3:
        raise ValueError(f"md_tpe: x must be [B, N, C], got shape {tuple(x.shape)}")
    grid = check_grid(grid, x.shape[1], num_prefix_tokens)
    if grid is None:
        raise ValueError("md_tpe needs a grid such as (h, w) or (n,)")
    check_choice(impl, IMPLS, "md_tpe impl")
    b, n, c = x.shape
    if coeffs.dim() != 3 or coeffs.shape[:2] != (len(grid), c):
        raise ValueError(f"md_tpe: coeffs must be [num_axes={len(grid)}, C={c}, e], got {tuple(coeffs.shape)}")
    if tuple(log_lambda.shape) != (len(grid), coeffs.shape[2]):
        raise ValueError(f"md_tpe: log_lambda must be [num_axes, e] = {(len(grid), coeffs.shape[2])}, got {tuple(log_lambda.shape)}")
    out = dispatch("md_tpe", backend, x.device, (x, coeffs, log_lambda),
                   dict(grid=grid, num_prefix_tokens=num_prefix_tokens, causal=causal, impl=impl))
    if out is not NotImplemented:
        return out
    dt = compute_dtype(x, coeffs, log_lambda)
    xg = x[:, num_prefix_tokens:].to(dt).reshape(b, *grid, c)
    coeffs, log_lambda = coeffs.to(dt), log_lambda.to(dt)
    if impl == "dense" and len(grid) <= 2:
        y = _dense_channel_first(xg, [toeplitz_kernel(coeffs[j], log_lambda[j], length, causal)
                                      for j, length in enumerate(grid)])
    else:
        y = torch.zeros_like(xg)
        for j, length in enumerate(grid):
            xt = xg.movedim(j + 1, -2)  # [..., L, C]
            if impl == "dense":
                yt = torch.einsum("cab,...bc->...ac", toeplitz_kernel(coeffs[j], log_lambda[j], length, causal), xt)
            else:
                yt = _axis_scan(xt, coeffs[j], log_lambda[j], causal)
            y = y + yt.movedim(-2, j + 1)
    out = torch.cat([y.new_zeros(b, num_prefix_tokens, c), y.reshape(b, -1, c)], 1)
    return out.to(x.dtype)


def _dense_channel_first(xg: torch.Tensor, kernels: list[torch.Tensor]) -> torch.Tensor:
    """The dense mixing of a 1-D or 2-D grid as channel-batched matrix products whose operands need no strided copies:
    xg [B, *grid, C], kernels[j] = T^j [C, L_j, L_j] -> y [B, *grid, C] (a view), y = sum_j T^j applied along axis j.

    x is transposed once to [C, B, L] (1-D) or [C, h, B, w] (2-D). In the 2-D layout the first axis contracts as
    T^0 [C, h, h] @ x [C, h, B w] and the second as x [C, h B, w] @ T^1^T, both on contiguous views. Per-axis
    ``movedim`` views gave bmm operands with a unit batch stride, which it copied (LightNet-DeiT-S, 224 px, compiled:
    five such copies of 146 us each per training step on an H100)."""
    if len(kernels) == 1:
        xc = xg.permute(2, 0, 1).contiguous()  # [C, B, L]
        return torch.matmul(xc, kernels[0].transpose(1, 2)).permute(1, 2, 0)
    b, h, w, c = xg.shape
    xc = xg.permute(3, 1, 0, 2).contiguous()  # [C, h, B, w]
    y = torch.matmul(kernels[0], xc.view(c, h, b * w)).view(c, h, b, w)
    y = y + torch.matmul(xc.view(c, h * b, w), kernels[1].transpose(1, 2)).view(c, h, b, w)
    return y.permute(2, 1, 3, 0)


def toeplitz_kernel(coeffs: torch.Tensor, log_lambda: torch.Tensor, length: int, causal: bool) -> torch.Tensor:
    """T[c, a, b] = sum_r coeffs[c, r] exp(|a - b| log_lambda[r]) (0 where a < b if causal): [C, L, L]."""
    pos = torch.arange(length, device=coeffs.device)
    off = pos[:, None] - pos[None, :]
    t = torch.einsum("cr,abr->cab", coeffs, torch.exp(off.abs()[..., None].to(coeffs.dtype) * log_lambda))
    return t.masked_fill(off < 0, 0.0) if causal else t


def _axis_scan(xt: torch.Tensor, coeffs: torch.Tensor, log_lambda: torch.Tensor, causal: bool) -> torch.Tensor:
    """xt [..., L, C] -> [..., L, C] via h_a = lambda h_{a-1} + x_a over e hidden states (and backward)."""
    lam = torch.exp(log_lambda)  # [e]
    length = xt.shape[-2]
    xe = xt[..., None].expand(*xt.shape, lam.shape[0])  # [..., L, C, e]
    total = -xe if not causal else torch.zeros_like(xe)
    directions = [range(length)] if causal else [range(length), range(length - 1, -1, -1)]
    for steps in directions:
        h = torch.zeros_like(xe[..., 0, :, :])
        hs = [None] * length
        for a in steps:
            h = lam * h + xe[..., a, :, :]
            hs[a] = h
        total = total + torch.stack(hs, -3)
    return (total * coeffs).sum(-1)
