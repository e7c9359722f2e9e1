"""MD-TPE layer: residual multi-dimensional Toeplitz positional encoding (LightNet Eq. 10-11; docs/spec.md 1.3)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import md_tpe
from ..ops._checks import check_choice, check_pos_scale
from ..ops.md_tpe import COMBINES
from .attention import _check_tokens
from .norm import RMSNorm

_DENSE_MAX_AXIS = 256  # axes up to this length use the dense Toeplitz matmul, longer ones the scan
TPE_FORMS = ("two_sided", "one_sided", "pair")


class MDTPE(nn.Module):
    """x [B, N, C] -> x + W_o md_tpe(norm(x)) (the residual-added tensor); W_o zero-initialised (no bias), so the layer
    is the identity at init; prefix tokens come out unchanged.

    Args:
        dim: channels C.
        num_axes: grid axes.
        expand: SSM hidden states e per axis (decays lambda_r = sigmoid(p_r), initialised evenly over ``decay``;
            coefficients normal with std 1 / e).
        form: "two_sided" (the symmetric kernel lambda^|n|), "one_sided" (n >= 0 only: the printed Eq. 10-11 and the
            LightNet authors' layer) or "pair" (a one-sided kernel each way with its own coefficients and decays:
            an asymmetric two-sided kernel).
        combine: "sum" (Eq. 11: the axes' kernels added, a cross-shaped response) or "product" (applied one after
            the other: a separable 2-D response), ``lightvision.ops.md_tpe``.
        decay: (lowest, highest) initial lambda.
        norm: RMS-normalise the input of the mixing (the residual stays un-normalised).

    Parameters: dim^2 + orders * num_axes * expand * (dim + 1) (+ dim with ``norm``), orders = 2 for "pair".

    Example:
        >>> x = torch.randn(2, 1 + 8 * 8, 32)
        >>> torch.equal(MDTPE(32, form="pair")(x, (8, 8), num_prefix_tokens=1), x)  # W_o = 0 at initialisation
        True
    """

    def __init__(
        self,
        dim: int,
        *,
        num_axes: int = 2,
        expand: int = 4,
        form: str = "two_sided",
        combine: str = "sum",
        decay: Sequence[float] = (0.5, 0.95),
        norm: bool = False,
    ):
        super().__init__()
        check_choice(form, TPE_FORMS, "MD-TPE form")
        check_choice(combine, COMBINES, "MD-TPE combine")
        lo, hi = (float(v) for v in decay)
        if not 0.0 < lo <= hi < 1.0:
            raise ValueError(f"MD-TPE decay must be (lowest, highest) with 0 < lowest <= highest < 1, got {decay}")
        self.dim, self.num_axes, self.form, self.combine = dim, num_axes, form, combine
        orders = 2 if form == "pair" else 1
        self.coeffs = nn.Parameter(torch.randn(orders, num_axes, dim, expand) / expand)
        self.lam_logit = nn.Parameter(torch.logit(torch.linspace(lo, hi, expand)).repeat(orders, num_axes, 1))
        self.norm = RMSNorm(dim) if norm else None
        self.proj = nn.Linear(dim, dim, bias=False)
        nn.init.zeros_(self.proj.weight)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Checkpoints written before the ``form`` option hold one order: coeffs [num_axes, C, e], lam_logit
        [num_axes, e]; they load as order 0."""
        for name, ndim in (("coeffs", 3), ("lam_logit", 2)):
            value = state_dict.get(prefix + name)
            if value is not None and value.dim() == ndim:
                state_dict[prefix + name] = value[None]
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(
        self,
        x: torch.Tensor,
        grid: Sequence[int],
        num_prefix_tokens: int = 0,
        pos_scale: Sequence[float] | None = None,
    ) -> torch.Tensor:
        """Add the position mixing to the tokens.

        With a position scale a (``lightvision.layers.position``) axis j's kernel is sampled at steps of a_j training
        cells: lambda^|n| -> lambda^(a_j |n|) and coefficients b -> a_j b, so the kernel covers the same fraction of
        the image and keeps its mass (the sum over n approximates the same integral) at every resolution.

        Args:
            x: [B, N, C] tokens.
            grid: ``num_axes`` axes covering N - num_prefix_tokens tokens.
            num_prefix_tokens: leading tokens, left unchanged.
            pos_scale: per-axis position scale; None: steps of one token.

        Returns:
            [B, N, C].
        """
        grid = _check_tokens(x, grid, num_prefix_tokens, self.dim, type(self).__name__)
        if grid is None or len(grid) != self.num_axes:
            raise ValueError(f"MDTPE(num_axes={self.num_axes}) needs a grid with {self.num_axes} axes, got {grid}")
        u = x if self.norm is None else self.norm(x)
        kw = dict(
            num_prefix_tokens=num_prefix_tokens,
            causal=self.form != "two_sided",
            combine=self.combine,
            impl="dense" if max(grid) <= _DENSE_MAX_AXIS else "scan",
        )
        log_lam, coeffs = F.logsigmoid(self.lam_logit), self.coeffs  # [orders, axes, e], [orders, axes, C, e]
        scale = check_pos_scale(pos_scale, grid)
        if scale is not None:
            a = torch.tensor(scale, dtype=log_lam.dtype, device=log_lam.device)
            log_lam, coeffs = log_lam * a[:, None], coeffs * a[:, None, None].to(coeffs.dtype)
        y = md_tpe(u, grid, coeffs[0], log_lam[0], **kw)
        if self.form == "pair":  # the backward kernel: the one-sided mixing of the grid read in reverse
            y = y + _reverse(
                md_tpe(_reverse(u, grid, num_prefix_tokens), grid, coeffs[1], log_lam[1], **kw),
                grid,
                num_prefix_tokens,
            )
        return x + self.proj(y)


def _reverse(x: torch.Tensor, grid: tuple[int, ...], num_prefix_tokens: int) -> torch.Tensor:
    """The grid tokens of x [B, N, C] read backwards along every axis (prefix tokens stay first)."""
    b, _, c = x.shape
    body = x[:, num_prefix_tokens:].reshape(b, *grid, c).flip(tuple(range(1, len(grid) + 1)))
    return torch.cat([x[:, :num_prefix_tokens], body.reshape(b, -1, c)], 1)
