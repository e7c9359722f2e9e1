"""``lightvision diffusion sample``: images from a trained DiT (EMA weights), spread over every process.

Sample i has seed ``seed + i`` and label ``i % num_classes``: rank r of W draws the indices i = r, r + W, ...,
so the set of images is the same for any number of processes, with no duplicates. Writes
``images/NNNNNN.png``, ``grid.png`` (the first 64), ``samples.npz`` (``arr_0``: uint8 [N, H, W, 3], the
layout of the ADM / DiT evaluation suites) and ``summary.json``; a run into a folder of an earlier one replaces those
files. ``lightvision diffusion fid`` reads such a folder as its ``images/``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import torch

from lightvision.diffusion.autoencoder import Codec
from lightvision.diffusion.dit import DiT, model_names
from lightvision.diffusion.fid import SAMPLE_IMAGES, SAMPLE_SUMMARY, check_counts
from lightvision.diffusion.gaussian import GaussianDiffusion, SampleNoise, guided
from lightvision.engine.outdir import output_folder

SAMPLE_FILE = re.compile(r"\d{6,}\.png")  # images/NNNNNN.png


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """[B, C, H, W] in [-1, 1] -> uint8 [B, H, W, 3] (grey images repeated to RGB)."""
    x = ((images.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    return np.repeat(x, 3, axis=3) if x.shape[3] == 1 else x


def save_grid(images: torch.Tensor, path: str | Path, nrow: int | None = None) -> Path:
    """Save [B, C, H, W] in [-1, 1] as one PNG grid (``nrow`` per row, default ~sqrt(B))."""
    from PIL import Image

    arr = to_uint8(images)
    b, h, w, _ = arr.shape
    nrow = nrow or max(1, int(np.ceil(np.sqrt(b))))
    rows = int(np.ceil(b / nrow))
    grid = np.zeros((rows * (h + 2) + 2, nrow * (w + 2) + 2, 3), dtype=np.uint8)
    for i in range(b):
        r, c = divmod(i, nrow)
        grid[2 + r * (h + 2) : 2 + r * (h + 2) + h, 2 + c * (w + 2) : 2 + c * (w + 2) + w] = arr[i]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(grid).save(path)
    return path


def clear_samples(out: Path) -> int:
    """Remove the files an earlier run wrote to ``out`` (numbered images, npz, grid, summary; nothing else); returns
    how many."""
    files = [p for p in (out / SAMPLE_IMAGES).glob("*.png") if SAMPLE_FILE.fullmatch(p.name)]
    files += [out / name for name in ("samples.npz", "grid.png", SAMPLE_SUMMARY) if (out / name).is_file()]
    for path in files:
        path.unlink()
    return len(files)


def rank_indices(num_samples: int, rank: int, world: int) -> list[int]:
    """Sample indices of process ``rank`` of ``world``: rank, rank + world, ... (each index on exactly one process)."""
    return list(range(rank, num_samples, world))


@torch.no_grad()
def generate(
    model: DiT,
    diffusion: GaussianDiffusion,
    codec: Codec,
    labels: list[int] | None,
    seeds: list[int],
    *,
    latent_size: int | tuple[int, int],
    sampler: str = "ddpm",
    eta: float = 0.0,
    cfg_scale: float = 1.0,
    guide_channels: int | None = 3,
    device: str | torch.device = "cpu",
    progress: bool = False,
) -> torch.Tensor:
    """Images [len(seeds), C, H, W] in [-1, 1]: sample latents with ``diffusion`` (already respaced), decode.

    ``labels`` None = unconditional (null class). ``cfg_scale`` != 1 needs a class-conditional model.
    """
    h, w = (latent_size, latent_size) if isinstance(latent_size, int) else latent_size
    shape = (len(seeds), model.config.in_channels, h, w)
    model.check_input_shape(shape)
    y = torch.tensor(labels if labels is not None else [model.null_class] * len(seeds), device=device, dtype=torch.long)
    if cfg_scale != 1.0:
        if model.config.num_classes == 0 or labels is None:
            raise ValueError(
                f"guidance scale {cfg_scale} needs a class-conditional model and labels; "
                "use cfg_scale=1 for an unconditional model"
            )
        fn = guided(model, y, model.null_class, cfg_scale, guide_channels)
    else:

        def fn(x, t):
            return model(x, t, y)

    z = diffusion.sample(fn, shape, SampleNoise(seeds, device), method=sampler, eta=eta, progress=progress)
    return codec.decode(z)


def load_for_sampling(checkpoint: str | Path, device: str | torch.device, which: str = "ema") -> tuple[DiT, dict]:
    """Model (``which`` weights, eval mode) and run config of a checkpoint or run folder."""
    from lightvision.diffusion.train import build_model
    from lightvision.engine.checkpoint import load_model_weights, read_checkpoint_config

    info = read_checkpoint_config(checkpoint)
    name = info["model_config"].get("name", "")
    if name not in model_names():
        raise ValueError(
            f"{checkpoint} holds a {name!r}, not a DiT (a classifier run?): sample from a `lightvision diffusion "
            "train` run"
        )
    model = build_model(info["model_config"])
    load_model_weights(checkpoint, model, which=which)
    return model.to(device).eval(), info["config"]


def load_pretrained_for_sampling(
    path: str | Path, model_name: str, cfg: dict, codec: Codec, device: str | torch.device, which: str = "ema"
) -> tuple[DiT, dict]:
    """Model ``model_name`` (eval mode) sized for the recipe ``cfg`` and ``codec``, holding an external weights file
    (official DiT, diffusers or this project's layout, ``lightvision.diffusion.convert``); returns (model, what was
    loaded)."""
    from lightvision.diffusion.convert import load_pretrained
    from lightvision.diffusion.train import build_model, model_config

    cfg["model"]["name"] = model_name
    latent = codec.latent_size(int(cfg["data"]["image_size"]))
    model = build_model(model_config(cfg, codec.channels, latent))
    loaded = load_pretrained(model, path, which)
    return model.to(device).eval(), loaded


def sample_main(
    checkpoint: str | None,
    out_dir: str,
    *,
    num_samples: int = 64,
    batch_size: int = 32,
    sampler: str = "ddpm",
    steps: int = 250,
    eta: float = 0.0,
    cfg_scale: float = 1.0,
    guide_channels: int | None = 3,
    seed: int = 0,
    image_size: int | None = None,
    which: str = "ema",
    vae: str | None = None,
    pretrained: str | None = None,
    model_name: str | None = None,
    recipe: str | None = None,
) -> dict:
    """The ``sample`` command; returns a summary (paths, counts, settings). ``pretrained`` (with ``model_name`` and
    optionally a ``recipe`` for the autoencoder and schedule, default the ImageNet-256 one) samples an external
    weights file instead of a run's ``checkpoint``. Bad counts are refused before anything is loaded or written."""
    check_counts(num_samples=num_samples, batch_size=batch_size, steps=steps)
    from accelerate import PartialState
    from PIL import Image
    from tqdm.auto import tqdm

    from lightvision.diffusion.train import build_codec, build_diffusion, load_recipe

    external = pretrained is not None
    if (checkpoint is None) != external or (external and not model_name) or (not external and (model_name or recipe)):
        raise ValueError(
            "give a run / checkpoint folder, or --pretrained FILE with --model NAME (e.g. "
            "softmax_dit_xl_2) and optionally --config RECIPE"
        )
    state = PartialState(cpu=not torch.cuda.is_available())  # cpu: several CPU processes join one gloo group
    loaded = None
    if pretrained is None:
        model, cfg = load_for_sampling(checkpoint, state.device, which)
    else:
        cfg = load_recipe(recipe)
    if vae is not None:
        cfg["autoencoder"]["path"] = vae
    codec = build_codec(cfg, state.device)
    if pretrained is not None:
        model, loaded = load_pretrained_for_sampling(pretrained, model_name, cfg, codec, state.device, which)
        if state.is_main_process:
            print(f"loaded {loaded['file']} ({loaded['layout']} layout, {loaded['tensors']} tensors) into {model_name}")
    latent = model.config.input_size if image_size is None else codec.latent_size(image_size)
    diffusion = build_diffusion(cfg).respace(steps)
    num_classes = model.config.num_classes
    out = Path(out_dir)
    if state.is_main_process and (cleared := clear_samples(out)):
        print(f"replacing an earlier run's samples in {out} ({cleared} files removed)", file=sys.stderr)
    state.wait_for_everyone()
    mine = rank_indices(num_samples, state.process_index, state.num_processes)
    with output_folder(out / SAMPLE_IMAGES) as images_dir:
        for start in tqdm(
            range(0, len(mine), batch_size),
            desc=f"sampling (rank {state.process_index})",
            disable=not state.is_main_process,
        ):
            idx = mine[start : start + batch_size]
            labels = [i % num_classes for i in idx] if num_classes else None
            images = generate(
                model,
                diffusion,
                codec,
                labels,
                [seed + i for i in idx],
                latent_size=latent,
                sampler=sampler,
                eta=eta,
                cfg_scale=cfg_scale,
                guide_channels=guide_channels,
                device=state.device,
            )
            for i, arr in zip(idx, to_uint8(images)):
                Image.fromarray(arr).save(images_dir / f"{i:06d}.png")
    state.wait_for_everyone()
    summary = {
        "checkpoint": str(checkpoint or pretrained),
        "num_samples": num_samples,
        "sampler": sampler,
        "steps": steps,
        "eta": eta,
        "cfg_scale": cfg_scale,
        "guide_channels": guide_channels,
        "seed": seed,
        "processes": state.num_processes,
    }
    if state.is_main_process:
        arr = np.stack([np.asarray(Image.open(images_dir / f"{i:06d}.png").convert("RGB")) for i in range(num_samples)])
        np.savez(out / "samples.npz", arr_0=arr)
        save_grid(torch.from_numpy(arr[:64]).permute(0, 3, 1, 2).float() / 127.5 - 1, out / "grid.png")
        if loaded is not None:
            summary["loaded"] = loaded
        summary.update(npz=str(out / "samples.npz"), grid=str(out / "grid.png"), images=str(images_dir))
        (out / SAMPLE_SUMMARY).write_text(json.dumps(summary, indent=2))
    return summary
