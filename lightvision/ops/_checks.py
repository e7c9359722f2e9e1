"""Shared input validation for the attention cores (clear errors naming the problem)."""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence

import torch

BACKENDS = ("auto", "torch", "triton")


def check_grid(grid: Sequence[int] | None, n: int, num_prefix_tokens: int = 0) -> tuple[int, ...] | None:
    """Validate a token grid against a sequence length: prod(grid) + num_prefix_tokens must equal n.

    Returns the grid as a tuple of ints (None stays None). Raises ValueError naming the mismatch.
    """
    if not isinstance(num_prefix_tokens, int) or num_prefix_tokens < 0:
        raise ValueError(f"num_prefix_tokens must be a non-negative int, got {num_prefix_tokens!r}")
    if grid is None:
        if num_prefix_tokens > n:
            raise ValueError(f"num_prefix_tokens={num_prefix_tokens} exceeds the sequence length N={n}")
        return None
    grid = as_grid(grid)
    if math.prod(grid) + num_prefix_tokens != n:
        raise ValueError(
            f"grid {grid} has {math.prod(grid)} tokens plus num_prefix_tokens={num_prefix_tokens} "
            f"= {math.prod(grid) + num_prefix_tokens}, but the sequence has N={n} tokens"
        )
    return grid


def as_grid(grid: Sequence[int]) -> tuple[int, ...]:
    """Validate a grid's form (a non-empty sequence of positive ints) and return it as a tuple."""
    try:
        if isinstance(grid, (str, torch.Tensor)) or any(isinstance(g, bool) for g in grid):
            raise TypeError
        out = tuple(operator.index(g) for g in grid)
    except TypeError:
        raise ValueError(f"grid must be a sequence of ints such as (h, w) or (n,), got {grid!r}") from None
    if len(out) == 0 or any(g < 1 for g in out):
        raise ValueError(f"grid must have at least one axis and positive sizes, got {out}")
    return out


def check_pos_scale(pos_scale: Sequence[float] | None, grid: tuple[int, ...] | None) -> tuple[float, ...] | None:
    """Validate per-axis position scales (grid coordinates are multiplied by them; None = 1, token units) against a
    checked grid: one positive finite float per axis. Returns a tuple of floats, or None for None / all ones."""
    if pos_scale is None:
        return None
    try:
        scale = tuple(float(s) for s in pos_scale)
    except (TypeError, ValueError):
        raise ValueError(f"pos_scale must be a sequence of floats, one per grid axis, got {pos_scale!r}") from None
    if grid is None or len(scale) != len(grid) or not all(math.isfinite(s) and s > 0 for s in scale):
        raise ValueError(f"pos_scale must hold one positive float per grid axis of {grid}, got {pos_scale!r}")
    return None if all(s == 1.0 for s in scale) else scale


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, name: str) -> None:
    """q, k: [B, H, N, d]; v: [B, H, N, d_v]; same device."""
    for t, tn in ((q, "q"), (k, "k"), (v, "v")):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name}: {tn} must be a 4-D tensor [B, H, N, d], got {shape}")
    if q.shape != k.shape:
        raise ValueError(
            f"{name}: q and k must have the same shape [B, H, N, d], got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"{name}: v must be [B, H, N, d_v] with q's B, H, N {tuple(q.shape[:3])}, got {tuple(v.shape)}"
        )
    if not (q.device == k.device == v.device):
        raise ValueError(f"{name}: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.shape[2] == 0:
        raise ValueError(f"{name}: empty sequence (N = 0)")


def check_choice(value: object, choices: Sequence[str], what: str) -> None:
    """Raise ValueError listing the valid choices when value is not one of them."""
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}; valid: {', '.join(repr(c) for c in choices)}")


def check_options(given: Iterable[str], options: Sequence[str], what: str) -> None:
    """Raise ValueError naming the options in ``given`` that ``what`` does not take, and the ones it does."""
    unknown = sorted(set(given) - set(options))
    if unknown:
        raise ValueError(f"{what} has no option {', '.join(map(repr, unknown))}; valid: {', '.join(options)}")


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """At least fp32 (fp64 inputs stay fp64, so fp64 references run the same code)."""
    dt = torch.float32
    for t in tensors:
        dt = torch.promote_types(dt, t.dtype)
    return dt
