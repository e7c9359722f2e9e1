"""MD-LRPE: multi-dimensional linearised relative positional encoding (LightNet Eq. 12-16, App. A.2; SPEC 1.2)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._checks import as_grid, check_grid


def lrpe_group_sizes(dim: int, num_axes: int) -> list[int]:
    """Sizes of the contiguous feature groups, one per axis; the first ``dim % num_axes`` groups get one extra."""
    if num_axes > dim:
        raise ValueError(f"MD-LRPE needs at least one feature per grid axis: dim={dim} < {num_axes} axes")
    base, extra = divmod(dim, num_axes)
    return [base + (1 if j < extra else 0) for j in range(num_axes)]


def lrpe_angles(
    grid: Sequence[int],
    dim: int,
    num_prefix_tokens: int = 0,
    base: float = 10000.0,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Rotation angles Theta[t, i] = c_{a(i)}(t) * theta_i, shape [N, dim] (N = prod(grid) + prefix).

    Computed in fp64 and returned in ``dtype`` (fp32 by default; the fp64 references ask for fp64).

    theta_i = base^(-2 i / dim) with i = 0..dim-1 the GLOBAL feature index (LightNet Eq. 16; the paper counts
    j from 1, we count from 0 so theta_0 = 1). Feature i belongs to axis a(i): the dim features are split into
    len(grid) contiguous groups (the first dim % len(grid) groups one larger) and group j is rotated by the
    token's coordinate c_j on axis j. Grid tokens are flattened row-major (first axis slowest); the
    ``num_prefix_tokens`` prefix rows come first and have angle 0 (so they encode as [x, 0]).
    This is the single source of truth for the angles (the Triton kernel consumes it directly).
    """
    grid = as_grid(grid)
    if not isinstance(num_prefix_tokens, int) or num_prefix_tokens < 0:
        raise ValueError(f"num_prefix_tokens must be a non-negative int, got {num_prefix_tokens!r}")
    if not isinstance(dim, int) or dim < 1:
        raise ValueError(f"dim must be a positive int, got {dim!r}")
    theta = base ** (-2.0 * torch.arange(dim, dtype=torch.float64, device=device) / dim)
    coords = torch.stack(
        torch.meshgrid(*[torch.arange(g, dtype=torch.float64, device=device) for g in grid], indexing="ij"), -1
    ).reshape(-1, len(grid))  # [prod(grid), num_axes], row-major
    # axis of every feature, built from Python ints (a repeat_interleave with tensor repeats has a data-dependent
    # shape, which broke torch.compile graphs once per layer)
    axis_of = torch.tensor([a for a, size in enumerate(lrpe_group_sizes(dim, len(grid))) for _ in range(size)],
                           device=device)
    angles = coords[:, axis_of] * theta  # [prod(grid), dim]
    prefix = angles.new_zeros(num_prefix_tokens, dim)
    return torch.cat([prefix, angles], 0).to(dtype)


def md_lrpe(x: torch.Tensor, grid: Sequence[int], num_prefix_tokens: int = 0, base: float = 10000.0) -> torch.Tensor:
    """x [..., N, d] -> [x * cos(Theta), x * sin(Theta)] of shape [..., N, 2d] (LightNet Eq. 16, cos/sin form).

    Theta from :func:`lrpe_angles`. Computed in (at least) fp32 and returned in x's dtype.
    For two encoded tokens, x~_s . y~_t = sum_i x_i y_i cos(Theta_s,i - Theta_t,i), which depends only on
    the per-axis offsets between s and t.
    """
    if x.dim() < 2:
        raise ValueError(f"md_lrpe: x must be [..., N, d], got shape {tuple(x.shape)}")
    grid = check_grid(grid, x.shape[-2], num_prefix_tokens)
    dt = torch.promote_types(x.dtype, torch.float32)
    ang = lrpe_angles(grid, x.shape[-1], num_prefix_tokens, base, device=x.device, dtype=dt)
    xf = x.to(dt)
    return torch.cat([xf * torch.cos(ang), xf * torch.sin(ang)], -1).to(x.dtype)

