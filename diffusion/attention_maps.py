"""``lightvision diffusion attention-maps``: what each layer and head of a trained DiT attends to at a timestep.

The DiT denoises x_t given t and a label y, so its attention depends on both: the image (encoded by the run's
autoencoder, or the pixels themselves) is noised to x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps with the run's
schedule (``GaussianDiffusion.q_sample``, eps from ``--seed``), and one forward pass model(x_t, t, y) gives the
effective attention of every block (``lightvision.analysis``). The figure shows the noised input (decoded) with the
query patch marked, then one row per layer and one column per head; the mean attention distance of every layer and
head (in patches) goes to a JSON file and a plot, one curve per timestep.

    lightvision diffusion attention-maps --checkpoint runs/cifar10_dit --image cat.png --timestep 100 500 900 \\
        --label 3 --query 8,8 --out maps
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import torch


def attention_maps_main(
    checkpoint: str,
    image: str,
    timesteps: Sequence[int],
    label: int | None,
    out_dir: str,
    query: tuple[int, int] | None = None,
    weights: str = "ema",
    seed: int = 0,
) -> dict:
    """Write ``attention_maps_t<t>.png`` per timestep, ``mean_distance.png`` and ``attention_maps.json`` under
    ``out_dir``; returns the JSON's content.

    Args:
        checkpoint: run folder (its latest checkpoint) or checkpoint folder of ``lightvision diffusion train``.
        image: an image file, resized to the recipe's ``data.image_size``.
        timesteps: diffusion steps t in [0, T) of the run's schedule.
        label: class label in [0, num_classes), or None for the null (unconditional) class.
        out_dir: output folder.
        query: (row, col) of the query patch on the model's token grid (default: the centre patch).
        weights: "ema" or "model".
        seed: seed of the noise eps (the same eps at every timestep).
    """
    from lightvision.analysis import attention_maps, mean_attention_distance
    from lightvision.diffusion.sample import load_for_sampling
    from lightvision.diffusion.train import build_codec, build_diffusion
    from lightvision.engine.outdir import output_folder
    from lightvision.tools.attention_figures import draw_query_maps, load_image, plot_mean_distance

    model, cfg = load_for_sampling(checkpoint, "cpu", weights)
    diffusion = build_diffusion(cfg)
    bad = [t for t in timesteps if not 0 <= t < diffusion.num_steps]
    if bad:
        raise ValueError(f"--timestep {bad[0]} is outside the run's schedule: use 0 .. {diffusion.num_steps - 1}")
    classes = model.config.num_classes
    if label is not None and not classes:
        raise ValueError(f"--label {label}: this model is unconditional; leave --label out")
    if label is not None and not 0 <= label < classes:
        raise ValueError(
            f"--label {label} is not a class of this model: use 0 .. {classes - 1}, or leave it out for "
            "the unconditional (null) class"
        )
    codec = build_codec(cfg, "cpu")
    size, channels = int(cfg["data"]["image_size"]), int(cfg["data"]["channels"])
    x, _ = load_image(image, size, channels, [0.5] * channels, [0.5] * channels)  # pixels in [-1, 1]
    with torch.no_grad():
        z0 = codec.scaling_factor * codec.moments(x)[0]
    p = model.config.patch_size
    grid = (z0.shape[-2] // p, z0.shape[-1] // p)
    row, col = query or (grid[0] // 2, grid[1] // 2)
    if not (0 <= row < grid[0] and 0 <= col < grid[1]):
        raise ValueError(f"--query {row},{col} lies outside the token grid {grid[0]}x{grid[1]}")
    y = torch.tensor([model.null_class if label is None else label])
    eps = torch.randn(z0.shape, generator=torch.Generator().manual_seed(seed))
    name = cfg["model"]["name"]
    report = {
        "model": name,
        "checkpoint": str(checkpoint),
        "weights": weights,
        "image": str(image),
        "label": label,
        "seed": seed,
        "grid": list(grid),
        "query": [row, col],
        "timesteps": {},
    }
    with output_folder(out_dir) as out:
        for step in timesteps:
            t = torch.tensor([step])
            xt = diffusion.q_sample(z0, t, eps)
            maps = attention_maps(model, xt, t, y)
            with torch.no_grad():
                shown = ((codec.decode(xt)[0] + 1) / 2).permute(1, 2, 0).clamp(0, 1)
            path = out / f"attention_maps_t{step}.png"
            draw_query_maps(
                maps,
                shown,
                grid,
                size // grid[0],
                0,
                (row, col),
                f"{name}, t = {step}, label {'null' if label is None else label}, query ({row}, {col})",
                path,
            )
            report["timesteps"][str(step)] = {
                "figure": path.name,
                "mean_distance": [mean_attention_distance(a, grid)[0].tolist() for a in maps],
            }
        plot_mean_distance(
            {f"t = {t}": e["mean_distance"] for t, e in report["timesteps"].items()}, out / "mean_distance.png"
        )
        (out / "attention_maps.json").write_text(json.dumps(report, indent=2))
    return report
