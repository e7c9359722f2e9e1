"""Absolute position signals shared by the model families: the fixed 2-D sin-cos embedding and the switches that
place MD-TPE (``MDTPE``) in a model."""

from __future__ import annotations

import inspect

import torch

from ..ops._checks import check_choice
from .tpe import MDTPE

TPE_PLACEMENTS = ("none", "embed", "block")  # no MD-TPE, once after the patch embedding, at the start of every block


def sincos_pos_embed(dim: int, grid: tuple[int, int], device: torch.device | None = None) -> torch.Tensor:
    """Fixed 2-D sin-cos position embedding [h * w, dim] in row-major order (computed for any grid, so it transfers to
    other resolutions): half the features encode the row, half the column; each half is [sin(pos w_i), cos(pos w_i)],
    w_i = 10000^(-i / (dim / 4)), i < dim / 4."""
    if dim % 4:
        raise ValueError(f"sin-cos position embedding needs a width divisible by 4, got {dim}")
    h, w = grid
    freqs = 10000.0 ** (-torch.arange(dim // 4, dtype=torch.float64, device=device) / (dim // 4))
    rows, cols = torch.meshgrid(torch.arange(h, dtype=torch.float64, device=device),
                                torch.arange(w, dtype=torch.float64, device=device), indexing="ij")
    parts = []
    for pos in (rows.reshape(-1), cols.reshape(-1)):
        angles = pos[:, None] * freqs[None]
        parts += [angles.sin(), angles.cos()]
    return torch.cat(parts, dim=1).float()


def build_tpe(placement: str, dim: int, depth: int, tpe_kwargs: dict | None) -> tuple[MDTPE | None, list[MDTPE | None]]:
    """MD-TPE layers for a model of ``depth`` blocks: (the one after the patch embedding, one per block), each None
    where ``placement`` ("none" | "embed" | "block") puts none; ``tpe_kwargs`` go to every ``MDTPE``."""
    check_choice(placement, TPE_PLACEMENTS, "MD-TPE placement")
    kwargs = dict(tpe_kwargs or {})
    options = list(inspect.signature(MDTPE.__init__).parameters)[2:]
    unknown = sorted(set(kwargs) - set(options))
    if unknown:
        raise ValueError(f"MD-TPE has no option {', '.join(map(repr, unknown))}; valid: {', '.join(options)}")
    embed = MDTPE(dim, **kwargs) if placement == "embed" else None
    return embed, [MDTPE(dim, **kwargs) if placement == "block" else None for _ in range(depth)]
