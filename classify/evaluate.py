"""Evaluate a classifier at several resolutions: top-1 / top-5, images/s, peak GPU memory; table, JSON, plot.

    lightvision classify eval --checkpoint runs/deit --data /imagenet --img-size 224 288 384 512

For each size S the validation images are resized to S / crop_pct and center-cropped to S (digits runs:
upsampled to S), then fed to the same weights: LightNet and LION-D/S need nothing else, models with an
absolute position embedding resample it on the fly. Throughput counts only the model forward
(synchronised, the first batch left out as warm-up); peak memory is ``torch.cuda.max_memory_allocated``
during that resolution (None on CPU). Several processes (``accelerate launch``) shard the images and
``gather_for_metrics`` collects the exact per-image results.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from lightvision.classify.data import val_dataset
from lightvision.classify.deit import create_from_config
from lightvision.engine import load_model_weights, read_checkpoint_config, resolve_checkpoint
from lightvision.engine.data import loader_workers
from lightvision.engine.device import resolve_device

__all__ = [
    "MAX_IMG_SIZE",
    "check_img_sizes",
    "evaluate",
    "evaluate_checkpoint",
    "evaluate_pretrained",
    "evaluate_resolutions",
    "load_classifier",
    "write_report",
]


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, accelerator: Accelerator, desc: str = "eval") -> dict[str, Any]:
    """Top-1 / top-5 accuracy (%), images/s of the forward pass and peak GPU memory (GiB) over ``loader``.

    ``loader`` must already be prepared by ``accelerator`` (batches on its device); ``model`` too.
    """
    model.eval()
    device = accelerator.device
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    hits1, hits5 = [], []
    timings: list[tuple[int, float]] = []  # (images, seconds) per batch
    bar = tqdm(loader, desc=desc, leave=False, disable=not accelerator.is_local_main_process)
    for images, labels in bar:
        start = time.perf_counter()
        with accelerator.autocast():
            logits = model(images)
        if cuda:
            torch.cuda.synchronize(device)
        timings.append((images.shape[0], time.perf_counter() - start))
        k = min(5, logits.shape[-1])
        top = logits.float().topk(k, dim=-1).indices
        correct = top == labels[:, None]
        h1, h5 = accelerator.gather_for_metrics((correct[:, 0], correct.any(dim=-1)))
        hits1.append(h1.cpu())
        hits5.append(h5.cpu())
    if not hits1:
        raise ValueError("the evaluation set is empty: check the validation folder")
    h1, h5 = torch.cat(hits1).float(), torch.cat(hits5).float()
    # the first batch pays for allocation and kernel selection: left out when there are others;
    # every process measures its own shard, so images/s adds up over processes
    timed = timings[1:] or timings
    rate = torch.tensor([sum(n for n, _ in timed) / max(sum(t for _, t in timed), 1e-9)], device=device)
    return {
        "top1": 100.0 * h1.mean().item(),
        "top5": 100.0 * h5.mean().item(),
        "images": int(h1.numel()),
        "images_per_s": accelerator.reduce(rate, reduction="sum").item(),
        "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
    }


def evaluate_resolutions(
    model: nn.Module,
    make_dataset: Callable[[int], Dataset],
    img_sizes: Sequence[int],
    accelerator: Accelerator,
    batch_size: int = 128,
    num_workers: int = 4,
) -> list[dict[str, Any]]:
    """``evaluate`` at every size: ``make_dataset(size)`` builds the validation set at that size.
    ``num_workers`` is capped at the available cores (:func:`~lightvision.engine.data.loader_workers`)."""
    model = accelerator.prepare(model)
    num_workers = loader_workers(num_workers)
    results = []
    for size in img_sizes:
        loader = DataLoader(
            make_dataset(size),
            batch_size=batch_size,
            shuffle=False,
            num_workers=num_workers,
            pin_memory=accelerator.device.type == "cuda",
        )
        metrics = evaluate(model, accelerator.prepare(loader), accelerator, desc=f"eval {size}px")
        results.append({"img_size": int(size), **metrics})
    return results


def write_report(
    results: list[dict[str, Any]], out_dir: str | Path, title: str, meta: dict[str, Any] | None = None
) -> dict[str, str]:
    """Write ``eval.md`` (table), ``eval.json`` (results + meta) and ``eval.png`` into ``out_dir``.

    The plot has accuracy vs resolution on the left and peak GPU memory (images/s where memory is not
    measured, i.e. on CPU) on the right. Returns the three paths.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = [
        f"### {title}",
        "",
        "| resolution | top-1 (%) | top-5 (%) | images | images/s | peak GPU memory (GiB) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        mem = "n/a (CPU)" if r["peak_mem_gib"] is None else f"{r['peak_mem_gib']:.2f}"
        lines.append(
            f"| {r['img_size']} | {r['top1']:.2f} | {r['top5']:.2f} | {r['images']} | {r['images_per_s']:.1f} | {mem} |"
        )
    paths = {"markdown": str(out / "eval.md"), "json": str(out / "eval.json"), "plot": str(out / "eval.png")}
    Path(paths["markdown"]).write_text("\n".join(lines) + "\n")
    Path(paths["json"]).write_text(json.dumps({"title": title, **(meta or {}), "results": results}, indent=2) + "\n")

    sizes = [r["img_size"] for r in results]
    fig, (ax_acc, ax_cost) = plt.subplots(1, 2, figsize=(10, 4))
    ax_acc.plot(sizes, [r["top1"] for r in results], "o-", label="top-1")
    ax_acc.plot(sizes, [r["top5"] for r in results], "s--", label="top-5")
    ax_acc.set(xlabel="resolution (px)", ylabel="accuracy (%)", title="accuracy vs resolution")
    ax_acc.legend()
    if all(r["peak_mem_gib"] is not None for r in results):
        ax_cost.plot(sizes, [r["peak_mem_gib"] for r in results], "o-", color="tab:red")
        ax_cost.set(ylabel="peak GPU memory (GiB)", title="memory vs resolution")
    else:
        ax_cost.plot(sizes, [r["images_per_s"] for r in results], "o-", color="tab:green")
        ax_cost.set(ylabel="images/s (CPU: no GPU memory)", title="throughput vs resolution")
    ax_cost.set_xlabel("resolution (px)")
    for ax in (ax_acc, ax_cost):
        ax.set_xticks(sizes)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(paths["plot"], dpi=120)
    plt.close(fig)
    return paths


MAX_IMG_SIZE = 8192
"""The largest evaluation size (px): one 8192 px float32 RGB image is 768 MiB before the model runs."""


def check_img_sizes(model: nn.Module, img_sizes: Sequence[int]) -> None:
    """Refuse, before anything runs, an empty list, a size below 1 or above :data:`MAX_IMG_SIZE`, or one the model's
    patch does not divide."""
    if not img_sizes:
        raise ValueError("no image size to evaluate: pass --img-size, e.g. --img-size 224 288")
    for size in img_sizes:
        if size < 1:
            raise ValueError(f"--img-size {size}: image sizes must be positive")
        if size > MAX_IMG_SIZE:
            gib = 4 * size**2 / 2**30
            raise ValueError(
                f"--img-size {size}: sizes go up to {MAX_IMG_SIZE} px (one channel of one {size} px image is "
                f"{gib:,.0f} GiB in float32)"
            )
        try:
            model._check_size((size, size))
        except ValueError as err:
            raise ValueError(f"--img-size {size}: {err}") from None


def evaluate_checkpoint(
    checkpoint: str | Path,
    img_sizes: Sequence[int],
    data: str | Path | None = None,
    out_dir: str | Path | None = None,
    weights: str | None = None,
    batch_size: int = 128,
    num_workers: int = 4,
    device: str = "auto",
    model_args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Evaluate a training run (or one checkpoint folder) at every size in ``img_sizes``; write the report.

    data: validation folder (class sub-folders, or a root holding the recipe's val split); None: the run's
        own validation split (its ``data.root``, or the bundled digits).
    weights: "ema" or "model"; None: EMA when the run kept one.
    out_dir: where eval.md / eval.json / eval.png go (default: ``<run folder>/eval``).
    model_args: architecture arguments that change how the same weights run (``load_classifier``), e.g.
        ``{"pos_unit": "token"}``.
    Returns ``{"checkpoint", "model", "weights", "results": [per-size metrics], "paths"}``.
    """
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    device = resolve_device(device)
    model, meta, cfg = load_classifier(checkpoint, weights, img_sizes, model_args)
    out = Path(out_dir) if out_dir else Path(meta["checkpoint"]).parent.parent / "eval"
    return _evaluate_and_report(model, cfg, meta, img_sizes, data, out, batch_size, num_workers, device)


def load_classifier(
    checkpoint: str | Path,
    weights: str | None = None,
    img_sizes: Sequence[int] | None = None,
    model_args: dict[str, Any] | None = None,
) -> tuple[nn.Module, dict[str, Any], dict]:
    """The classifier of a ``lightvision classify train`` run (or one checkpoint folder) with its weights.

    Args:
        checkpoint: run folder (its latest checkpoint) or checkpoint folder.
        weights: "ema" or "model"; None: EMA when the run kept one.
        img_sizes: sizes the model will see, checked before the weights load (None: no check).
        model_args: arguments merged over the recorded ``model_config["args"]`` (``attn_kwargs`` key by key) that
            leave the weights as they are: ``pos_unit`` ("image" | "token"), ``attn_kwargs.decay_power`` (LION),
            ``global_pool`` of a head trained for it.

    Returns:
        (model, meta {"checkpoint", "model", "train_img_size", "weights"}, the run's recipe).
    """
    ckpt = resolve_checkpoint(checkpoint)
    saved = read_checkpoint_config(ckpt)
    mcfg, cfg = saved["model_config"], saved["config"]
    if (
        not isinstance(mcfg, dict)
        or not {"name", "num_classes", "in_chans", "img_size", "args"} <= mcfg.keys()
        or not cfg
    ):
        raise ValueError(
            f"{ckpt} was not written by `lightvision classify train` (model_config {mcfg}): pass the run folder of "
            "a classifier"
        )
    if model_args:
        args = {**mcfg["args"], **model_args}
        if "attn_kwargs" in model_args:
            args["attn_kwargs"] = {**(mcfg["args"].get("attn_kwargs") or {}), **model_args["attn_kwargs"]}
        mcfg = {**mcfg, "args": args}
    model = create_from_config(mcfg)
    if img_sizes is not None:
        check_img_sizes(model, img_sizes)
    if weights is None:
        weights = "ema" if (ckpt / "ema.safetensors").is_file() else "model"
    load_model_weights(ckpt, model, which=weights)
    meta = {"checkpoint": str(ckpt), "model": mcfg["name"], "train_img_size": mcfg["img_size"], "weights": weights}
    if model_args:
        meta["model_args"] = model_args
    return model, meta, cfg


def evaluate_pretrained(
    pretrained: str | Path,
    model_name: str,
    img_sizes: Sequence[int],
    data: str | Path,
    out_dir: str | Path,
    weights: str | None = None,
    batch_size: int = 128,
    num_workers: int = 4,
    device: str = "auto",
    recipe: str | Path | None = None,
    model_args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Evaluate external weights (timm / DeiT authors' / LION authors' layouts, ``lightvision.classify.convert``) as
    ``model_name`` at every size in ``img_sizes``; the validation transform is the ``recipe``'s (default: the DeiT
    ImageNet one). ``model_args`` override what the file implies (e.g. {"global_pool": "token"}). Returns
    ``evaluate_checkpoint``'s dict plus "loaded" (file, layout, tensors)."""
    from lightvision.classify.convert import create_pretrained
    from lightvision.classify.train import load_recipe

    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    cfg = load_recipe(recipe, [f"model.name={model_name}"])
    model, loaded = create_pretrained(model_name, pretrained, weights or "ema", **(model_args or {}))
    check_img_sizes(model, img_sizes)
    print(f"loaded {loaded['file']} ({loaded['layout']} layout, {loaded['tensors']} tensors) into {model_name}")
    meta = {
        "checkpoint": str(pretrained),
        "model": model_name,
        "train_img_size": model.img_size[0],
        "weights": weights or "ema",
        "loaded": loaded,
    }
    cfg["train"]["mixed_precision"] = "no"  # the file does not say how it was trained: evaluate in float32
    return _evaluate_and_report(model, cfg, meta, img_sizes, data, Path(out_dir), batch_size, num_workers, device)


def _evaluate_and_report(
    model: nn.Module,
    cfg: dict,
    meta: dict[str, Any],
    img_sizes: Sequence[int],
    data: str | Path | None,
    out_dir: Path,
    batch_size: int,
    num_workers: int,
    device: str,
) -> dict[str, Any]:
    """Evaluate ``model`` on the recipe ``cfg``'s validation data at every size; write the report into ``out_dir``."""
    accelerator = Accelerator(
        cpu=device == "cpu",
        mixed_precision=cfg["train"]["mixed_precision"] or "no",  # as trained (and as the process's accelerate state)
    )
    num_classes = model.num_classes

    def make_dataset(size: int) -> Dataset:
        dataset = val_dataset(cfg, size, data, pipeline="cpu")
        if len(dataset.classes) != num_classes:
            raise ValueError(
                f"{getattr(dataset, 'root', 'the validation set')} has {len(dataset.classes)} classes but the model "
                f"was trained on {num_classes}: pass the validation split of the training data"
            )
        return dataset

    results = evaluate_resolutions(model, make_dataset, img_sizes, accelerator, batch_size, num_workers)
    meta = {**meta, "device": str(accelerator.device)}
    title = f"{meta['model']} ({meta['weights']} weights, trained at {meta['train_img_size']} px)"
    paths = write_report(results, out_dir, title, meta) if accelerator.is_main_process else {}
    return {**meta, "results": results, "paths": paths}
