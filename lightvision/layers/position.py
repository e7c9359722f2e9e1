"""Position signals shared by the model families: the unit positions are measured in, the fixed 2-D sin-cos
embedding and the switches that place MD-TPE (``MDTPE``) in a model.

Position units (``POS_UNITS``, docs/spec.md 1.8). Every signal computed from grid coordinates (the sin-cos
embedding, MD-LRPE angles, MD-TPE and LION decays) reads them through one per-axis factor, the position scale

    a_j = pos_grid_j / grid_j   ("image": coordinates in units of the training grid pos_grid),   a_j = 1   ("token"),

so in image units a token keeps the code of its place in the image at every resolution, as a learned embedding
resampled to the new grid does; in token units signals extrapolate to positions and offsets never seen in
training. A unit may also be given per signal group (``POS_SIGNALS``: "embed", what is added once after the patch
embedding; "blocks", what acts inside the blocks), e.g. ``{"embed": "token", "blocks": "image"}``, to measure which
signal loses accuracy at another size."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence

import torch

from ..ops._checks import check_choice, check_options, check_pos_scale
from .tpe import MDTPE

TPE_PLACEMENTS = ("none", "embed", "block")  # no MD-TPE, once after the patch embedding, at the start of every block
POS_UNITS = ("image", "token")  # coordinates in units of the training grid, or counted in tokens
POS_SIGNALS = ("embed", "blocks")  # the absolute embedding and embed-placed MD-TPE; MD-LRPE, LION decays, block MD-TPE


def check_pos_unit(unit: str | Mapping[str, str], what: str = "pos_unit") -> None:
    """Raise ValueError unless ``unit`` is one of ``POS_UNITS`` or a mapping of ``POS_SIGNALS`` to them."""
    if isinstance(unit, Mapping):
        check_options(unit, POS_SIGNALS, what)
        for signal, value in unit.items():
            check_choice(value, POS_UNITS, f"{what}[{signal!r}]")
    else:
        check_choice(unit, POS_UNITS, what)


def signal_unit(unit: str | Mapping[str, str], signal: str) -> str:
    """The unit of one of ``POS_SIGNALS`` under ``unit`` (a unit, or a per-signal mapping whose missing signals are in
    image units).

    Example:
        >>> signal_unit("token", "embed"), signal_unit({"embed": "token"}, "blocks")
        ('token', 'image')
    """
    check_choice(signal, POS_SIGNALS, "position signal")
    return unit.get(signal, "image") if isinstance(unit, Mapping) else unit


def position_scale(grid: Sequence[int], pos_grid: Sequence[int], unit: str) -> tuple[float, ...] | None:
    """The per-axis position scale of ``grid`` (module docstring): pos_grid / grid for "image", None (1) for "token"
    or when the grid is the training grid.

    Example:
        >>> position_scale((16, 8), (8, 8), "image"), position_scale((16, 8), (8, 8), "token")
        ((0.5, 1.0), None)
    """
    check_choice(unit, POS_UNITS, "position unit")
    if unit == "token" or tuple(grid) == tuple(pos_grid):
        return None
    if len(grid) != len(pos_grid):
        raise ValueError(f"grid {tuple(grid)} and training grid {tuple(pos_grid)} have different numbers of axes")
    return tuple(p / g for p, g in zip(pos_grid, grid))


def sincos_pos_embed(
    dim: int,
    grid: tuple[int, int],
    device: torch.device | None = None,
    pos_scale: Sequence[float] | None = None,
) -> torch.Tensor:
    """Fixed 2-D sin-cos position embedding [h * w, dim] in row-major order (computed for any grid): half the features
    encode the row, half the column; each half is [sin(pos w_i), cos(pos w_i)], w_i = 10000^(-i / (dim / 4)),
    i < dim / 4, at coordinates pos = (row a_0, col a_1).

    Args:
        dim: embedding width, divisible by 4.
        grid: (h, w).
        device: where to build it.
        pos_scale: (a_0, a_1), the position scale (``position_scale``); None: integer coordinates (token units).

    Returns:
        [h * w, dim] fp32.

    Example:
        >>> sincos_pos_embed(64, (7, 9)).shape
        torch.Size([63, 64])
    """
    if dim % 4:
        raise ValueError(f"sin-cos position embedding needs a width divisible by 4, got {dim}")
    h, w = grid
    a_row, a_col = check_pos_scale(pos_scale, (h, w)) or (1.0, 1.0)
    freqs = 10000.0 ** (-torch.arange(dim // 4, dtype=torch.float64, device=device) / (dim // 4))
    rows, cols = torch.meshgrid(
        torch.arange(h, dtype=torch.float64, device=device) * a_row,
        torch.arange(w, dtype=torch.float64, device=device) * a_col,
        indexing="ij",
    )
    parts = []
    for pos in (rows.reshape(-1), cols.reshape(-1)):
        angles = pos[:, None] * freqs[None]
        parts += [angles.sin(), angles.cos()]
    return torch.cat(parts, dim=1).float()


def build_tpe(placement: str, dim: int, depth: int, tpe_kwargs: dict | None) -> tuple[MDTPE | None, list[MDTPE | None]]:
    """MD-TPE layers for a model of ``depth`` blocks (docs/spec.md 1.3).

    Args:
        placement: "none" | "embed" (once after the patch embedding) | "block" (at the start of every block).
        dim: model width C.
        depth: number of blocks.
        tpe_kwargs: options of every ``MDTPE`` (form, combine, expand, decay, norm); unknown ones are refused, and
            so are options with placement "none" (they would have no layer to reach).

    Returns:
        (the layer after the patch embedding or None, a list of ``depth`` per-block layers or Nones).

    Example:
        >>> embed, blocks = build_tpe("embed", 64, 4, {"form": "pair"})
        >>> type(embed).__name__, blocks
        ('MDTPE', [None, None, None, None])
    """
    check_choice(placement, TPE_PLACEMENTS, "MD-TPE placement")
    kwargs = dict(tpe_kwargs or {})
    check_options(kwargs, list(inspect.signature(MDTPE.__init__).parameters)[2:], "MD-TPE")
    if kwargs and placement == "none":
        raise ValueError(
            f"MD-TPE options {sorted(kwargs)} given without MD-TPE (placement 'none'): set "
            "tpe_placement to 'embed' or 'block', or drop the options"
        )
    embed = MDTPE(dim, **kwargs) if placement == "embed" else None
    return embed, [MDTPE(dim, **kwargs) if placement == "block" else None for _ in range(depth)]
