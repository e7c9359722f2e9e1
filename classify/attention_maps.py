"""``lightvision classify attention-maps``: what each layer and head of a trained classifier attends to.

For one image at each requested size, the effective attention of every block (``lightvision.analysis``) gives, for a
query patch, its weights over the grid; the figure shows the image with the query marked, then one row per layer and
one column per head. The mean attention distance of every layer and head (in patches) goes to a JSON file and a plot.
Given several checkpoints (e.g. softmax, LightNet and LION-S runs), each one's figures go to its own folder and
``comparison.png`` sets them side by side: one row per run, per size the image and the query's head-averaged weights
in the chosen layers.

    lightvision classify attention-maps --checkpoint runs/cifar10_deit --image cat.png --img-size 32 64 --query 8,8
    lightvision classify attention-maps --checkpoint runs/softmax runs/lightnet runs/lion_s --image cat.png \\
        --img-size 32 64 --out maps
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch


def _run_label(checkpoint: Path) -> str:
    """The run folder's name of a resolved checkpoint folder (``run/checkpoints/step_N`` -> ``run``)."""
    return checkpoint.parent.parent.name if checkpoint.parent.name == "checkpoints" else checkpoint.name


def _maps_of_one(
    checkpoint: str | Path,
    image: str,
    img_sizes: Sequence[int],
    out: Path,
    query: tuple[int, int] | None,
    weights: str | None,
) -> tuple[dict, dict]:
    """One checkpoint's figures and JSON under ``out``; returns (report, per size {"shown", "grid", "query",
    "patch_px", "maps": head-averaged query weights [layers, h, w]})."""
    from lightvision.analysis import attention_maps, mean_attention_distance
    from lightvision.classify.data import norm_stats
    from lightvision.classify.evaluate import load_classifier
    from lightvision.engine.outdir import output_folder
    from lightvision.tools.attention_figures import draw_query_maps, load_image, plot_mean_distance

    model, meta, cfg = load_classifier(checkpoint, weights, img_sizes)
    model.eval()
    mean, std = norm_stats(cfg)
    train_grid = model.grid_size(tuple(model.img_size))
    if query is not None and not all(0 <= q < g for q, g in zip(query, train_grid)):
        raise ValueError(
            f"--query {query[0]},{query[1]} lies outside the training grid {train_grid[0]}x{train_grid[1]}"
        )
    report, views = {**meta, "image": str(image), "sizes": {}}, {}
    p = model.num_prefix_tokens
    with output_folder(out):
        for size in img_sizes:
            x, shown = load_image(image, size, model.patch_embed.proj.in_channels, mean, std)
            grid = model.grid_size((size, size))
            maps = attention_maps(model, x)
            q = query or (train_grid[0] // 2, train_grid[1] // 2)
            row, col = (min(g - 1, int(v * g / t)) for v, g, t in zip(q, grid, train_grid))
            path = out / f"attention_maps_{size}px.png"
            draw_query_maps(
                maps,
                shown,
                grid,
                model.patch_size,
                p,
                (row, col),
                f"{meta['model']}, {size} px, query patch ({row}, {col})",
                path,
            )
            distance = [mean_attention_distance(a, grid, p)[0].tolist() for a in maps]
            report["sizes"][str(size)] = {
                "grid": list(grid),
                "query": [row, col],
                "figure": path.name,
                "mean_distance": distance,
            }
            query_token = p + row * grid[1] + col
            views[size] = {
                "shown": shown,
                "grid": grid,
                "query": (row, col),
                "patch_px": model.patch_size,
                "maps": torch.stack([a[0, :, query_token, p:].mean(0).reshape(grid) for a in maps]),
            }
        plot_mean_distance(
            {f"{size} px": e["mean_distance"] for size, e in report["sizes"].items()}, out / "mean_distance.png"
        )
        (out / "attention_maps.json").write_text(json.dumps(report, indent=2))
    return report, views


def attention_maps_main(
    checkpoints: str | Path | Sequence[str | Path],
    image: str,
    img_sizes: Sequence[int],
    out_dir: str,
    query: tuple[int, int] | None = None,
    weights: str | None = None,
    layers: Sequence[int] | None = None,
) -> dict:
    """Write ``attention_maps_<size>px.png`` per size, ``mean_distance.png`` and ``attention_maps.json`` under
    ``out_dir``; returns the JSON's content. ``query`` (row, col) is given at the training size's grid and scaled to
    the others (default: the centre patch).

    Several checkpoints: each one's files go to ``out_dir/<run name>``, and ``comparison.png`` (a row per run; per
    size the image and the head-averaged query weights of ``layers``, default the first, middle and last) plus an
    ``attention_maps.json`` holding every run's report go to ``out_dir``.
    """
    from lightvision.engine.checkpoint import resolve_checkpoint
    from lightvision.tools.attention_figures import draw_comparison

    paths = [checkpoints] if isinstance(checkpoints, (str, Path)) else list(checkpoints)
    out = Path(out_dir)
    if len(paths) == 1:
        if layers is not None:
            raise ValueError("--layers chooses the layers of comparison.png: pass two or more --checkpoint runs")
        return _maps_of_one(paths[0], image, img_sizes, out, query, weights)[0]
    labels: list[str] = []
    for path in paths:
        label = _run_label(resolve_checkpoint(path))
        labels.append(label if label not in labels else f"{label}_{len(labels)}")
    reports, rows = {}, []
    for label, path in zip(labels, paths):
        reports[label], views = _maps_of_one(path, image, img_sizes, out / label, query, weights)
        rows.append((label, views))
    depth = min(len(v["maps"]) for _, views in rows for v in views.values())
    chosen = sorted({0, depth // 2, depth - 1}) if layers is None else list(layers)
    bad = [i for i in chosen if not -depth <= i < depth]
    if bad:
        raise ValueError(f"--layers {bad} out of range: the models have {depth} layers (0 to {depth - 1})")
    draw_comparison(rows, [i % depth for i in chosen], out / "comparison.png")
    report = {
        "image": str(image),
        "layers": [i % depth for i in chosen],
        "comparison": "comparison.png",
        "runs": {label: {**r, "folder": label} for label, r in reports.items()},
    }
    (out / "attention_maps.json").write_text(json.dumps(report, indent=2))
    return report
