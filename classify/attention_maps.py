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


def attention_maps_main(checkpoint: str, image: str, img_sizes: Sequence[int], out_dir: str,
                        query: tuple[int, int] | None = None, weights: str | None = None) -> dict:
    """Write ``attention_maps_<size>px.png`` per size, ``mean_distance.png`` and ``attention_maps.json`` under
    ``out_dir``; returns the JSON's content. ``query`` (row, col) is given at the training size's grid and scaled to
    the others (default: the centre patch)."""
    from lightvision.analysis import attention_maps, mean_attention_distance
    from lightvision.attention_figures import draw_query_maps, load_image, plot_mean_distance
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
        x, shown = load_image(image, size, model.patch_embed.proj.in_channels, mean, std)
        grid = model.grid_size((size, size))
        maps = attention_maps(model, x)
        q = query or (train_grid[0] // 2, train_grid[1] // 2)
        row, col = (min(g - 1, int(v * g / t)) for v, g, t in zip(q, grid, train_grid))
        p = model.num_prefix_tokens
        path = out / f"attention_maps_{size}px.png"
        draw_query_maps(maps, shown, grid, model.patch_size, p, (row, col),
                        f"{meta['model']}, {size} px, query patch ({row}, {col})", path)
        distance = [mean_attention_distance(a, grid, p)[0].tolist() for a in maps]
        report["sizes"][str(size)] = {"grid": list(grid), "query": [row, col], "figure": path.name,
                                      "mean_distance": distance}
    plot_mean_distance({f"{size} px": e["mean_distance"] for size, e in report["sizes"].items()},
                       out / "mean_distance.png")
    (out / "attention_maps.json").write_text(json.dumps(report, indent=2))
    return report
