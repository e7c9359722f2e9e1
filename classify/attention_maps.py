"""``lightvision classify attention-maps``: what each layer and head of a trained classifier attends to.

For one image at each requested size, the effective attention of every block (``lightvision.analysis``) gives, for a
query patch, its weights over the grid; the figure shows the image with the query marked, then one row per layer and
one column per head. The mean attention distance of every layer and head (in patches) goes to a JSON file and a plot.

    lightvision classify attention-maps --checkpoint runs/cifar10 --image cat.png --img-size 32 64 --query 8,8
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch


def _load_image(path: str | Path, size: int, in_chans: int, mean, std) -> tuple[torch.Tensor, torch.Tensor]:
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


def attention_maps_main(checkpoint: str, image: str, img_sizes: Sequence[int], out_dir: str,
                        query: tuple[int, int] | None = None, weights: str | None = None) -> dict:
    """Write ``attention_maps_<size>px.png`` per size, ``mean_distance.png`` and ``attention_maps.json`` under
    ``out_dir``; returns the JSON's content. ``query`` (row, col) is given at the training size's grid and scaled to
    the others (default: the centre patch)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lightvision.analysis import attention_maps, mean_attention_distance
    from lightvision.classify.data import norm_stats
    from lightvision.classify.evaluate import load_classifier

    model, meta, cfg = load_classifier(checkpoint, weights, img_sizes)
    model.eval()
    mean, std = norm_stats(cfg)
    train_grid = model.grid_size(tuple(model.img_size))
    if query is not None and not all(0 <= q < g for q, g in zip(query, train_grid)):
        raise ValueError(f"--query {query[0]},{query[1]} lies outside the training grid "
                         f"{train_grid[0]}x{train_grid[1]}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = {**meta, "image": str(image), "sizes": {}}
    for size in img_sizes:
        x, shown = _load_image(image, size, model.patch_embed.proj.in_channels, mean, std)
        grid = model.grid_size((size, size))
        maps = attention_maps(model, x)
        q = query or (train_grid[0] // 2, train_grid[1] // 2)
        row, col = (min(g - 1, int(v * g / t)) for v, g, t in zip(q, grid, train_grid))
        p = model.num_prefix_tokens
        heads = maps[0].shape[1]
        fig, axes = plt.subplots(len(maps), heads + 1, figsize=(1.6 * (heads + 1), 1.6 * len(maps)), squeeze=False)
        for layer, a in enumerate(maps):
            ax = axes[layer, 0]
            ax.imshow((shown.squeeze(-1) if shown.shape[-1] == 1 else shown).numpy(), cmap="gray")
            ax.add_patch(matplotlib.patches.Rectangle((col * model.patch_size - 0.5, row * model.patch_size - 0.5),
                                                      model.patch_size, model.patch_size, fill=False, color="red"))
            ax.set_ylabel(f"layer {layer}", fontsize=7)
            weights_over_grid = a[0, :, p + row * grid[1] + col, p:].reshape(heads, *grid)
            for head in range(heads):
                axes[layer, head + 1].imshow(weights_over_grid[head].float().numpy(), cmap="viridis")
                if layer == 0:
                    axes[layer, head + 1].set_title(f"head {head}", fontsize=7)
        for ax in axes.flat:
            ax.set_xticks([])
            ax.set_yticks([])
        fig.suptitle(f"{meta['model']}, {size} px, query patch ({row}, {col})", fontsize=8)
        fig.tight_layout()
        path = out / f"attention_maps_{size}px.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        distance = [mean_attention_distance(a, grid, p)[0].tolist() for a in maps]
        report["sizes"][str(size)] = {"grid": list(grid), "query": [row, col], "figure": path.name,
                                      "mean_distance": distance}
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for size, entry in report["sizes"].items():
        per_layer = torch.tensor(entry["mean_distance"])
        ax.plot(range(len(per_layer)), per_layer.mean(1), marker="o", label=f"{size} px (mean over heads)")
    ax.set_xlabel("layer")
    ax.set_ylabel("mean attention distance (patches)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "mean_distance.png", dpi=110)
    plt.close(fig)
    (out / "attention_maps.json").write_text(json.dumps(report, indent=2))
    return report
