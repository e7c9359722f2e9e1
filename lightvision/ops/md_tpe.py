"""MD-TPE: multi-dimensional Toeplitz positional encoding (LightNet Eq. 10-11; docs/spec.md 1.3).

Axis j of the grid carries a per-channel Toeplitz kernel t^j_n[c] = sum_r coeffs[j, c, r] * lambda_{j,r}^|n| (an SSM
with e hidden states; one-sided: n >= 0 only). Two ways to combine the axes:

* ``sum`` (Eq. 11): y = sum_j T^j x. Every token mixes its whole row and its whole column: the response to one token
  is a cross, and the output carries additive row and column components.
* ``product``: y = T^{k-1} ... T^0 x, the separable kernel t(n) = prod_j t^j_{n_j}. The response to one token is a
  2-D patch that decays in every direction (no cross), computed with the same per-axis products.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._checks import check_choice, check_grid, compute_dtype
from ._dispatch import dispatch

IMPLS = ("dense", "scan")
COMBINES = ("sum", "product")


def md_tpe(
    x: torch.Tensor,
    grid: Sequence[int],
    coeffs: torch.Tensor,
    log_lambda: torch.Tensor,
    *,
    num_prefix_tokens: int = 0,
    causal: bool = False,
    impl: str = "dense",
    combine: str = "sum",
    backend: str = "auto",
) -> torch.Tensor:
    """Per-axis Toeplitz token mixing (module docstring): x [B, N, C] -> y [B, N, C].

    ``sum``: y[p, c] = sum_j sum_{p' on p's line along axis j} t^j_{p_j - p'_j}[c] x[p', c]  (Eq. 10-11);
    ``product``: the axes applied one after the other. Prefix tokens (the first ``num_prefix_tokens``) are neither
    mixed nor mixed into: their rows of y are 0, so a residual caller x + f(y) leaves them unchanged.
    Computed in fp32 (fp64 stays fp64), returns x's dtype.

    Args:
        x: [B, N, C] tokens, N = num_prefix_tokens + prod(grid).
        grid: token grid (h, w) or any number of axes.
        coeffs: [len(grid), C, e] SSM output coefficients per axis.
        log_lambda: [len(grid), e] log decays (e.g. logsigmoid of a parameter), lambda in (0, 1).
        num_prefix_tokens: leading tokens left out of the mixing.
        causal: keep only n >= 0 (the one-sided kernel of the printed equations).
        impl: "dense" (one [C, L, L] Toeplitz matmul per axis, fast for image axes L <= ~128) or "scan" (first-order
            recurrences h_a = lambda h_{a-1} + x_a per axis and direction, O(L) per line).
        combine: "sum" or "product" (``COMBINES``).
        backend: "torch" | "auto" | "triton" (:mod:`lightvision.ops._dispatch`; the kernel
            ``lightvision.kernels.fused.md_tpe`` runs the dense sum of 2-D grids on the [B, N, C] layout).

    Returns:
        y [B, N, C] in x's dtype, zero on the prefix rows.

    Example:
        >>> x = torch.randn(2, 1 + 8 * 8, 32)
        >>> md_tpe(x, (8, 8), torch.randn(2, 32, 4), torch.full((2, 4), -0.5), num_prefix_tokens=1).shape
        torch.Size([2, 65, 32])
    """
    if x.dim() != 3:
        raise ValueError(f"md_tpe: x must be [B, N, C], got shape {tuple(x.shape)}")
    grid = check_grid(grid, x.shape[1], num_prefix_tokens)
    if grid is None:
        raise ValueError("md_tpe needs a grid such as (h, w) or (n,)")
    check_choice(impl, IMPLS, "md_tpe impl")
    check_choice(combine, COMBINES, "md_tpe combine")
    b, n, c = x.shape
    if coeffs.dim() != 3 or coeffs.shape[:2] != (len(grid), c):
        raise ValueError(f"md_tpe: coeffs must be [num_axes={len(grid)}, C={c}, e], got {tuple(coeffs.shape)}")
    if tuple(log_lambda.shape) != (len(grid), coeffs.shape[2]):
        raise ValueError(
            f"md_tpe: log_lambda must be [num_axes, e] = {(len(grid), coeffs.shape[2])}, got {tuple(log_lambda.shape)}"
        )
    out = dispatch(
        "md_tpe",
        backend,
        x.device,
        (x, coeffs, log_lambda),
        dict(grid=grid, num_prefix_tokens=num_prefix_tokens, causal=causal, impl=impl, combine=combine),
    )
    if out is not NotImplemented:
        return out
    dt = compute_dtype(x, coeffs, log_lambda)
    xg = x[:, num_prefix_tokens:].to(dt).reshape(b, *grid, c)
    coeffs, log_lambda = coeffs.to(dt), log_lambda.to(dt)
    if impl == "dense" and len(grid) <= 2:
        y = _dense_channel_first(
            xg, [toeplitz_kernel(coeffs[j], log_lambda[j], length, causal) for j, length in enumerate(grid)], combine
        )
    else:
        y = torch.zeros_like(xg) if combine == "sum" else xg
        for j, length in enumerate(grid):
            xt = (xg if combine == "sum" else y).movedim(j + 1, -2)  # [..., L, C]
            if impl == "dense":
                yt = torch.einsum("cab,...bc->...ac", toeplitz_kernel(coeffs[j], log_lambda[j], length, causal), xt)
            else:
                yt = _axis_scan(xt, coeffs[j], log_lambda[j], causal)
            y = y + yt.movedim(-2, j + 1) if combine == "sum" else yt.movedim(-2, j + 1)
    out = torch.cat([y.new_zeros(b, num_prefix_tokens, c), y.reshape(b, -1, c)], 1)
    return out.to(x.dtype)


def _dense_channel_first(xg: torch.Tensor, kernels: list[torch.Tensor], combine: str) -> torch.Tensor:
    """The dense mixing of a 1-D or 2-D grid as channel-batched matrix products whose operands need no strided copies:
    xg [B, *grid, C], kernels[j] = T^j [C, L_j, L_j] -> y [B, *grid, C] (a view), y = sum_j T^j applied along axis j
    (``combine="product"``: T^1 applied to T^0's output).

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
    if combine == "product":
        y = torch.matmul(y.view(c, h * b, w), kernels[1].transpose(1, 2)).view(c, h, b, w)
    else:
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
