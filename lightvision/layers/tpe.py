"""MD-TPE layer: residual multi-dimensional Toeplitz positional encoding (LightNet Eq. 10-11; SPEC 1.3)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import md_tpe
from .attention import _check_tokens

_DENSE_MAX_AXIS = 256  # axes up to this length use the dense Toeplitz matmul, longer ones the scan


class MDTPE(nn.Module):
    """x [B, N, C] -> x + W_o md_tpe(x) (the residual-added tensor), W_o zero-initialised (no bias), so the
    layer is the identity at init; prefix tokens come out unchanged.

    Per axis: coeffs [C, expand] (normal, std 1/expand) and expand decays lambda = sigmoid(p), initialised
    evenly in [0.5, 0.95]. Parameters: dim^2 + num_axes * expand * (dim + 1) (about 38.9k at dim 192).
    Two-sided kernel by default (images), ``causal=True`` for the one-sided one.
    """

    def __init__(self, dim: int, *, num_axes: int = 2, expand: int = 4, causal: bool = False):
        super().__init__()
        self.dim, self.num_axes, self.causal = dim, num_axes, causal
        self.coeffs = nn.Parameter(torch.randn(num_axes, dim, expand) / expand)
        self.lam_logit = nn.Parameter(torch.logit(torch.linspace(0.5, 0.95, expand)).repeat(num_axes, 1))
        self.proj = nn.Linear(dim, dim, bias=False)
        nn.init.zeros_(self.proj.weight)

    def forward(self, x: torch.Tensor, grid: Sequence[int], num_prefix_tokens: int = 0) -> torch.Tensor:
        grid = _check_tokens(x, grid, num_prefix_tokens, self.dim, type(self).__name__)
        if grid is None or len(grid) != self.num_axes:
            raise ValueError(f"MDTPE(num_axes={self.num_axes}) needs a grid with {self.num_axes} axes, got {grid}")
        impl = "dense" if max(grid) <= _DENSE_MAX_AXIS else "scan"
        y = md_tpe(x, grid, self.coeffs, F.logsigmoid(self.lam_logit), num_prefix_tokens=num_prefix_tokens,
                   causal=self.causal, impl=impl)
        return x + self.proj(y)
