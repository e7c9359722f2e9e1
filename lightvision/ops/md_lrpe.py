"""MD-LRPE: multi-dimensional linearised relative positional encoding (LightNet Eq. 12-16, App. A.2; docs/spec.md 1.2).

Every feature i of a token at grid coordinates c (one per axis) is rotated by an angle linear in c,

    Theta_i(c) = theta_i * (u_i . c),      x -> [x * cos(Theta), x * sin(Theta)]  in R^{2d},

so q~_s . k~_t = sum_i q_i k_i cos(Theta_i(s) - Theta_i(t)) depends only on the offset s - t. With a position scale
(``pos_scale``, one factor a per axis) the coordinates are c_j * a_j: a = training grid / grid measures the offset in
units of the training grid (image units), so an offset covering the same fraction of the image keeps its angle at
every resolution; a = 1 counts tokens. The d features are
split into one contiguous group per axis (the first ``d % k`` groups one larger); the variants differ in the
frequencies theta_i and the directions u_i:

* ``per_axis`` (default): group j rotates along axis j (u_i = e_j) with the full 1-D LRPE spectrum of its own
  size g, theta = base^(-2 r / g), r = 0..g-1 (the LightNet authors' public operator gives every axis group the same
  frequencies).
* ``global``: the printed Eq. 14 read literally: u_i = e_j, theta_i = base^(-2 i / d) over the GLOBAL feature
  index i, which leaves the last axis only the lowest frequencies (at a 16 x 16 grid, d = 64, the second axis
  rotates at most 0.0015 rad across the grid). Kept as an ablation.
* ``mixed`` (2-D grids): the per_axis frequencies, but feature r of group j rotates along the direction at angle
  j * pi / k + r * golden_angle, so every frequency still has k evenly spread directions while the pair turns
  from one frequency to the next (fixed "RoPE-Mixed" directions: scores are no longer a sum of a row term and a
  column term). For a 1-D grid it equals per_axis.

Grid tokens are flattened row-major (first axis slowest); prefix tokens get angle 0 (they encode as [x, 0]).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ._checks import as_grid, check_grid, check_pos_scale

LRPE_VARIANTS = ("per_axis", "global", "mixed")
_GOLDEN_ANGLE = math.pi * (3.0 - math.sqrt(5.0))


def lrpe_variant(lrpe: bool | str | None) -> str | None:
    """Normalise an ``lrpe`` switch: a variant name, True (= "per_axis"), or False / None / "none" (off) -> name or
    None.

    Raises ValueError listing the allowed values for anything else."""
    if lrpe is True:
        return "per_axis"
    if lrpe is False or lrpe is None or lrpe == "none":
        return None
    if lrpe not in LRPE_VARIANTS:
        raise ValueError(f"unknown MD-LRPE variant {lrpe!r}; valid: {', '.join(map(repr, LRPE_VARIANTS))}, 'none'")
    return lrpe


def lrpe_group_sizes(dim: int, num_axes: int) -> list[int]:
    """Sizes of the contiguous feature groups, one per axis; the first ``dim % num_axes`` groups get one extra."""
    if num_axes > dim:
        raise ValueError(f"MD-LRPE needs at least one feature per grid axis: dim={dim} < {num_axes} axes")
    base, extra = divmod(dim, num_axes)
    return [base + (1 if j < extra else 0) for j in range(num_axes)]


def lrpe_frequencies(dim: int, num_axes: int, variant: str = "per_axis", base: float = 10000.0) -> torch.Tensor:
    """Per-feature frequency vectors theta_i * u_i as a [dim, num_axes] fp64 matrix (module docstring).

    Args:
        dim: features per head d.
        num_axes: grid axes k.
        variant: one of ``LRPE_VARIANTS``.
        base: the spectrum's base.

    Returns:
        W [dim, num_axes] with Theta(c) = W @ c for a token at coordinates c.
    """
    variant = lrpe_variant(variant) or "per_axis"
    if variant == "mixed" and num_axes > 2:
        raise ValueError(
            f"MD-LRPE 'mixed' directions are defined for 1-D and 2-D grids, got {num_axes} axes; use 'per_axis'"
        )
    sizes = lrpe_group_sizes(dim, num_axes)
    freq = torch.zeros(dim, num_axes, dtype=torch.float64)
    start = 0
    for axis, size in enumerate(sizes):
        r = torch.arange(size, dtype=torch.float64)
        if variant == "global":
            theta = base ** (-2.0 * (start + r) / dim)
        else:
            theta = base ** (-2.0 * r / size)
        if variant == "mixed" and num_axes == 2:
            phi = axis * math.pi / num_axes + r * _GOLDEN_ANGLE
            freq[start : start + size] = theta[:, None] * torch.stack([torch.cos(phi), torch.sin(phi)], -1)
        else:
            freq[start : start + size, axis] = theta
        start += size
    return freq


def lrpe_angles(
    grid: Sequence[int],
    dim: int,
    num_prefix_tokens: int = 0,
    base: float = 10000.0,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    variant: str = "per_axis",
    pos_scale: Sequence[float] | None = None,
) -> torch.Tensor:
    """Rotation angles Theta [N, dim] of every token (N = prod(grid) + num_prefix_tokens; prefix rows 0).

    Computed in fp64 and returned in ``dtype`` (fp32 by default; the fp64 references ask for fp64). This is the
    single source of truth for the angles: the Triton kernels consume its cos / sin tables.

    Args:
        grid: token grid (h, w) or any number of axes (``mixed``: at most 2).
        dim: features per head d.
        num_prefix_tokens: leading tokens without a position.
        base: the spectrum's base.
        variant: one of ``LRPE_VARIANTS`` (module docstring).
        pos_scale: per-axis factors on the coordinates (module docstring); None: 1 (token units).

    Returns:
        Theta [N, dim].

    Example:
        >>> lrpe_angles((14, 14), 64, num_prefix_tokens=1).shape
        torch.Size([197, 64])
    """
    grid = as_grid(grid)
    if not isinstance(num_prefix_tokens, int) or num_prefix_tokens < 0:
        raise ValueError(f"num_prefix_tokens must be a non-negative int, got {num_prefix_tokens!r}")
    if not isinstance(dim, int) or dim < 1:
        raise ValueError(f"dim must be a positive int, got {dim!r}")
    scale = check_pos_scale(pos_scale, grid) or (1.0,) * len(grid)
    freq = lrpe_frequencies(dim, len(grid), variant, base).to(device)
    axes = [torch.arange(g, dtype=torch.float64, device=device) * a for g, a in zip(grid, scale)]
    coords = torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(grid))  # [prod(grid), axes]
    angles = coords @ freq.T  # [prod(grid), dim]
    prefix = angles.new_zeros(num_prefix_tokens, dim)
    return torch.cat([prefix, angles], 0).to(dtype)


def md_lrpe(
    x: torch.Tensor,
    grid: Sequence[int],
    num_prefix_tokens: int = 0,
    base: float = 10000.0,
    variant: str = "per_axis",
    pos_scale: Sequence[float] | None = None,
) -> torch.Tensor:
    """MD-LRPE of features x, cos/sin form (LightNet Eq. 16).

    Args:
        x: [..., N, d] features (e.g. SiLU(q) or the key softmax).
        grid: token grid; prod(grid) + num_prefix_tokens must equal N.
        num_prefix_tokens: leading tokens, encoded as [x, 0].
        base: the spectrum's base.
        variant: one of ``LRPE_VARIANTS``.
        pos_scale: per-axis factors on the coordinates (module docstring); None: token units.

    Returns:
        [x * cos(Theta), x * sin(Theta)] of shape [..., N, 2d] in x's dtype (computed in at least fp32).

    Example:
        >>> md_lrpe(torch.rand(2, 6, 1 + 7 * 9, 64), (7, 9), num_prefix_tokens=1).shape
        torch.Size([2, 6, 64, 128])
    """
    if x.dim() < 2:
        raise ValueError(f"md_lrpe: x must be [..., N, d], got shape {tuple(x.shape)}")
    grid = check_grid(grid, x.shape[-2], num_prefix_tokens)
    dt = torch.promote_types(x.dtype, torch.float32)
    ang = lrpe_angles(
        grid, x.shape[-1], num_prefix_tokens, base, device=x.device, dtype=dt, variant=variant, pos_scale=pos_scale
    )
    xf = x.to(dt)
    return torch.cat([xf * torch.cos(ang), xf * torch.sin(ang)], -1).to(x.dtype)
