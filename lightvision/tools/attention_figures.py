"""Figures of effective attention (``lightvision.analysis``) for the ``attention-maps`` commands of the classifiers
and the diffusion models: a query patch's weights over the grid per layer and head, and the mean attention distance.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch


def load_image(path: str | Path, size: int, in_chans: int, mean, std) -> tuple[torch.Tensor, torch.Tensor]:
    """(normalised [1, C, size, size], displayable [size, size, C] in [0, 1]) of an image file, resized bicubically."""
    import numpy as np
    from PIL import Image

    if not Path(path).is_file():
        raise FileNotFoundError(f"image {str(path)!r} not found")
    img = Image.open(path).convert("L" if in_chans == 1 else "RGB").resize((size, size), Image.BICUBIC)
    pixels = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0)
    pixels = pixels[..., None] if pixels.dim() == 2 else pixels
    x = (pixels.permute(2, 0, 1) - torch.tensor(mean).view(-1, 1, 1)) / torch.tensor(std).view(-1, 1, 1)
    return x[None].float(), pixels


def parse_query(text: str | None) -> tuple[int, int] | None:
    """``"ROW,COL"`` -> (row, col); None stays None. Raises ValueError naming the expected form."""
    if text is None:
        return None
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"--query must be ROW,COL (two non-negative ints), got {text!r}")
    return int(parts[0]), int(parts[1])


def draw_query_maps(
    maps: Sequence[torch.Tensor],
    shown: torch.Tensor,
    grid: tuple[int, int],
    patch_px: int,
    num_prefix_tokens: int,
    query: tuple[int, int],
    title: str,
    path: str | Path,
) -> None:
    """One row per layer: the image with the query patch marked, then the query's weights over the grid per head.

    Args:
        maps: one effective attention A [B, H, N, N] per layer (batch item 0 is drawn).
        shown: the image as displayed, [h_px, w_px, C] in [0, 1] (C = 1 or 3).
        grid: (h, w) of the patch grid; patch_px: a patch's side in image pixels.
        num_prefix_tokens: leading tokens of A without a grid position.
        query: (row, col) of the query patch on ``grid``.
        title: the figure's title; path: the PNG to write.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    row, col = query
    p, heads = num_prefix_tokens, maps[0].shape[1]
    fig, axes = plt.subplots(len(maps), heads + 1, figsize=(1.6 * (heads + 1), 1.6 * len(maps)), squeeze=False)
    for layer, a in enumerate(maps):
        ax = axes[layer, 0]
        ax.imshow((shown.squeeze(-1) if shown.shape[-1] == 1 else shown).numpy(), cmap="gray")
        ax.add_patch(
            matplotlib.patches.Rectangle(
                (col * patch_px - 0.5, row * patch_px - 0.5), patch_px, patch_px, fill=False, color="red"
            )
        )
        ax.set_ylabel(f"layer {layer}", fontsize=7)
        weights_over_grid = a[0, :, p + row * grid[1] + col, p:].reshape(heads, *grid)
        for head in range(heads):
            axes[layer, head + 1].imshow(weights_over_grid[head].float().numpy(), cmap="viridis")
            if layer == 0:
                axes[layer, head + 1].set_title(f"head {head}", fontsize=7)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def draw_comparison(rows: Sequence[tuple[str, dict]], layers: Sequence[int], path: str | Path) -> None:
    """Runs side by side: one row per run; per size the image with the query patch marked, then the query's
    head-averaged weights over the grid in each of ``layers`` (each map scaled to its own range).

    Args:
        rows: (label, per size {"shown" [h_px, w_px, C], "grid" (h, w), "query" (row, col), "patch_px",
            "maps" [layers, h, w]}) per run, every run with the same sizes.
        layers: indices into "maps" to draw.
        path: the PNG to write.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(rows[0][1])
    cols = len(sizes) * (len(layers) + 1)
    fig, axes = plt.subplots(len(rows), cols, figsize=(1.5 * cols, 1.6 * len(rows)), squeeze=False)
    for r, (label, views) in enumerate(rows):
        for s, size in enumerate(sizes):
            view, first = views[size], s * (len(layers) + 1)
            (row, col), px = view["query"], view["patch_px"]
            shown = view["shown"]
            axes[r, first].imshow((shown.squeeze(-1) if shown.shape[-1] == 1 else shown).numpy(), cmap="gray")
            axes[r, first].add_patch(
                matplotlib.patches.Rectangle((col * px - 0.5, row * px - 0.5), px, px, fill=False, color="red")
            )
            if r == 0:
                axes[r, first].set_title(f"{size} px", fontsize=8)
            for j, layer in enumerate(layers):
                ax = axes[r, first + j + 1]
                ax.imshow(view["maps"][layer].float().numpy(), cmap="viridis")
                ax.add_patch(
                    matplotlib.patches.Rectangle((col - 0.5, row - 0.5), 1, 1, fill=False, color="red", linewidth=0.8)
                )
                if r == 0:
                    ax.set_title(f"{size} px, layer {layer}", fontsize=7)
        axes[r, 0].set_ylabel(label, fontsize=8)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_mean_distance(curves: dict[str, list[list[float]]], path: str | Path) -> None:
    """Mean attention distance against the layer, averaged over heads, one curve per label.

    Args:
        curves: label -> per layer, per head distances (in patches).
        path: the PNG to write.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for label, distances in curves.items():
        per_layer = torch.tensor(distances)
        ax.plot(range(len(per_layer)), per_layer.mean(1), marker="o", label=f"{label} (mean over heads)")
    ax.set_xlabel("layer")
    ax.set_ylabel("mean attention distance (patches)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
