"""The CIFAR-10 yardstick: a small ResNet trained in minutes, the offline feature network of CIFAR-10 FID.

    lightvision classify train-yardstick --data data/cifar10 --out runs/yardstick      # one GPU, a few minutes

Network (:class:`~lightvision.engine.yardstick_net.YardstickNet`, with its weights file shared with the diffusion
metrics; 9.1M parameters at the default widths 64-160-320-512, the ResNet-9 layout of the fast CIFAR-10 training
literature with a residual pair in every stage): conv-BN-GELU stem, three stages of conv-BN-GELU + 2x2 max-pool, each
followed by a residual pair of conv-BN-GELU where ``model.residual`` says so, global max-pool, a bias-free linear head
scaled by 1/8. Input: RGB in [0, 1], normalised inside the network with the CIFAR-10 channel statistics, so the
weights file alone is a feature network. Features: ``pool`` (the pooled last stage, 512-d) and ``spatial`` (the second
stage, 8 x 8 at 32 px). With ``model.flip_average`` (default) the network in eval mode (as a classifier and as the
feature network) averages its features over the image and its mirror image (the mirror's spatial map flipped back),
so its features, logits and top-1 do not change under a horizontal flip; training sees single views.

Training (:func:`train_yardstick`, through the engine :class:`~lightvision.engine.Trainer`): the JPEG (or PNG) files
are decoded once into uint8 tensors held in memory (the ImageFolder layout ``root/train/<class>/*``,
``root/test/<class>/*``, or the two ``cifar10-{train,test}-jpg.tar.gz`` archives in ``root``); each batch is
augmented on the device (reflect-pad 4 + random 32 x 32 crop, horizontal flip, a 16 x 16 cutout; per-sample draws
from the engine's ``batch_random``); label smoothing 0.2; 100 epochs; SGD with Nesterov momentum 0.9, weight decay
5e-4 on conv / linear weights, a linear warm-up over the first 20% of the steps and a linear decay to 0; bf16
autocast on a GPU. Writes the engine
run folder (checkpoints, ``metrics.jsonl`` with test top-1 every ``train.eval_every_epochs``), ``results.json`` and
``yardstick.safetensors`` (float16 conv / linear weights; the architecture, classes and test top-1 in its metadata).

The packaged weights (:func:`~lightvision.engine.yardstick_net.packaged_yardstick`) are
``lightvision/weights/cifar10_yardstick.safetensors``.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lightvision.engine import Trainer, batch_random, load_config, make_accelerator, save_config
from lightvision.engine.data import read_rgb, warn_skipped
from lightvision.engine.device import resolve_device
from lightvision.engine.yardstick_net import CIFAR10_MEAN, YardstickNet, save_yardstick

__all__ = [
    "DEFAULTS",
    "augment",
    "load_images",
    "load_yardstick_config",
    "train_yardstick",
]

ARCHIVES = {"train": "cifar10-train-jpg.tar.gz", "test": "cifar10-test-jpg.tar.gz"}
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")

DEFAULTS: dict[str, Any] = {
    "model": {"widths": [64, 160, 320, 512], "residual": [True, True, True], "flip_average": True},
    "data": {"root": None, "train_split": "train", "val_split": "test"},
    "augment": {"pad": 4, "cutout": 16},
    "optim": {"lr": 0.4, "momentum": 0.9, "weight_decay": 5e-4, "warmup_fraction": 0.2, "label_smoothing": 0.2},
    "train": {
        "epochs": 100,
        "batch_size": 512,
        "max_steps": None,
        "mixed_precision": "bf16",
        "seed": 0,
        "eval_every_epochs": 5,
        "log_every": 50,
        "compile": False,
    },
    "run": {"dir": "runs/yardstick"},
}


def load_images(root: str | Path, split: str) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Decode a split once: uint8 images [N, 3, H, W], labels [N] (int64) and the sorted class names.

    ``root/split/<class>/<image>`` or, when that folder is missing, the archive ``root/cifar10-<split>-jpg.tar.gz``
    (members ``<split>/<class>/<image>``). Files are read in sorted order, so the tensors do not depend on the disk;
    unreadable files are skipped (one warning naming the first ones).
    """
    root = Path(root)
    folder, archive = root / split, root / ARCHIVES.get(split, f"cifar10-{split}-jpg.tar.gz")
    items: list[tuple[str, str, bytes]] = []  # (class, name, bytes)
    if folder.is_dir():
        for path in sorted(folder.glob("*/*")):
            if path.suffix.lower() in IMAGE_SUFFIXES:
                items.append((path.parent.name, path.name, path.read_bytes()))
    elif archive.is_file():
        with tarfile.open(archive) as tar:
            for member in tar:
                parts = Path(member.name).parts
                if member.isfile() and len(parts) >= 3 and Path(member.name).suffix.lower() in IMAGE_SUFFIXES:
                    items.append((parts[-2], parts[-1], tar.extractfile(member).read()))
        items.sort(key=lambda it: it[:2])
    else:
        raise FileNotFoundError(
            f"no {split!r} images under {str(root)!r}: expected {folder}/<class>/<images> or {archive}"
        )
    source = folder if folder.is_dir() else archive
    if not items:
        raise FileNotFoundError(f"{source} holds no {'/'.join(IMAGE_SUFFIXES)} images")
    decoded = [(c, name, read_rgb(data)) for c, name, data in items]
    warn_skipped([f"{c}/{name}" for c, name, img in decoded if img is None], source)
    decoded = [(c, name, img) for c, name, img in decoded if img is not None]
    if not decoded:
        raise ValueError(f"none of the {len(items)} image files in {source} is readable")
    size = decoded[0][2].shape
    for c, name, img in decoded:
        if img.shape != size:
            raise ValueError(
                f"{source}: {c}/{name} is {img.shape[0]} x {img.shape[1]} px, {decoded[0][0]}/{decoded[0][1]} "
                f"{size[0]} x {size[1]} px: every image must have one size"
            )
    classes = sorted({c for c, _, _ in items})
    index = {c: i for i, c in enumerate(classes)}
    images = torch.from_numpy(np.stack([img for _, _, img in decoded])).permute(0, 3, 1, 2).contiguous()
    return images, torch.tensor([index[c] for c, _, _ in decoded]), classes


class TensorBatches(torch.utils.data.Dataset):
    """In-memory uint8 images and labels; the DataLoader fetches whole batches (``__getitems__``) without collating."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index], self.labels[index]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(indices)
        return self.images[idx], self.labels[idx]


def _batch_as_is(batch: Any) -> Any:
    return batch


def augment(images: torch.Tensor, pad: int = 4, cutout: int = 0) -> torch.Tensor:
    """Random crop of the reflect-padded batch, random horizontal flip and (``cutout`` > 0) a ``cutout`` x ``cutout``
    square, centred anywhere in the image and clipped at its border, set to the CIFAR-10 mean colour; per sample, on
    the batch's device.

    Args:
        images: uint8 [B, 3, H, W].
    Returns:
        float [B, 3, H, W] in [0, 1]. Draws come from :func:`~lightvision.engine.batch_random`.
    """
    b, _, h, w = images.shape
    x = F.pad(images.float() / 255.0, (pad,) * 4, mode="reflect")
    draws = batch_random()
    dy, dx = (draws.randint(0, 2 * pad + 1, (b,), device=x.device) for _ in range(2))
    flip = draws.randint(0, 2, (b,), device=x.device).bool()
    rows = dy[:, None] + torch.arange(h, device=x.device)
    cols = dx[:, None] + torch.arange(w, device=x.device)
    cols = torch.where(flip[:, None], cols.flip(1), cols)
    x = x[torch.arange(b, device=x.device)[:, None, None], :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)
    if cutout > 0:
        cy, cx = draws.randint(0, h, (b,), device=x.device), draws.randint(0, w, (b,), device=x.device)
        lo = cutout // 2
        inside_y = (torch.arange(h, device=x.device) - cy[:, None] + lo).clamp(min=-1) // cutout == 0  # [B, H]
        inside_x = (torch.arange(w, device=x.device) - cx[:, None] + lo).clamp(min=-1) // cutout == 0  # [B, W]
        square = (inside_y[:, :, None] & inside_x[:, None, :])[:, None]
        x = torch.where(square, torch.tensor(CIFAR10_MEAN, device=x.device)[None, :, None, None], x)
    return x


@torch.no_grad()
def accuracy(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    device: torch.device,
    batch_size: int = 1000,
    autocast: bool = False,
) -> float:
    """Top-1 (%) of ``model`` on uint8 images [N, 3, H, W] with labels [N]."""
    was_training = model.training
    model.eval()
    hits = 0
    for i in range(0, len(labels), batch_size):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(images[i : i + batch_size].to(device).float() / 255.0)
        hits += (logits.argmax(1).cpu() == labels[i : i + batch_size]).sum().item()
    model.train(was_training)
    return 100.0 * hits / len(labels)


def _optimizer(model: nn.Module, o: dict) -> torch.optim.Optimizer:
    """SGD with Nesterov momentum; weight decay on conv / linear weights only (not BatchNorm)."""
    decay = [p for p in model.parameters() if p.ndim > 1]
    other = [p for p in model.parameters() if p.ndim <= 1]
    return torch.optim.SGD(
        [{"params": decay, "weight_decay": float(o["weight_decay"])}, {"params": other, "weight_decay": 0.0}],
        lr=float(o["lr"]),
        momentum=float(o["momentum"]),
        nesterov=True,
    )


def train_yardstick(cfg: dict, device: str = "auto", resume: bool | str = False) -> dict[str, Any]:
    """Train the yardstick with a resolved config (``DEFAULTS`` keys; :func:`load_config`); returns the results
    (test top-1, parameters, steps, seconds, the weights file), also written to ``run.dir/results.json``."""
    import time

    if cfg["data"]["root"] is None:
        raise ValueError(
            "no training data: pass --data ROOT (train/ and test/ class folders, or the CIFAR-10 archives)"
        )
    start = time.perf_counter()
    t, o, d, a = cfg["train"], cfg["optim"], cfg["data"], cfg["augment"]
    run_dir = Path(cfg["run"]["dir"])
    images, labels, classes = load_images(d["root"], d["train_split"])
    test_images, test_labels, test_classes = load_images(d["root"], d["val_split"])
    if test_classes != classes:
        raise ValueError(f"train and test class folders differ ({len(classes)} vs {len(test_classes)})")
    decode_seconds = time.perf_counter() - start
    accelerator = make_accelerator(t["mixed_precision"] or "no", 1, int(t["seed"]), cpu=resolve_device(device) == "cpu")
    torch.manual_seed(int(t["seed"]))
    m = cfg["model"]
    model = YardstickNet(m["widths"], len(classes), m["residual"], m["flip_average"])
    model = model.to(memory_format=torch.channels_last)
    batch = int(t["batch_size"])
    per_process = batch // accelerator.num_processes
    loader = torch.utils.data.DataLoader(
        TensorBatches(images, labels), batch_size=per_process, shuffle=True, drop_last=True, collate_fn=_batch_as_is
    )
    steps_per_epoch = len(labels) // (per_process * accelerator.num_processes)
    if steps_per_epoch < 1:
        raise ValueError(f"{len(labels)} training images are less than one batch of {batch}: lower train.batch_size")
    total = int(t["epochs"]) * steps_per_epoch
    max_steps = total if t["max_steps"] is None else min(int(t["max_steps"]), total)
    warmup = max(1, int(float(o["warmup_fraction"]) * total))
    optimizer = _optimizer(model, o)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warmup if s < warmup else max(0.0, (total - s) / max(1, total - warmup))
    )
    smoothing = float(o["label_smoothing"])

    def loss_fn(net: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        x = augment(x, int(a["pad"]), int(a["cutout"])).contiguous(memory_format=torch.channels_last)
        return F.cross_entropy(net(x), y, label_smoothing=smoothing)

    cuda = accelerator.device.type == "cuda"

    def evaluate(trainer: Trainer) -> dict[str, float]:
        return {
            "test_top1": accuracy(trainer.unwrapped_model, test_images, test_labels, accelerator.device, autocast=cuda)
        }

    trainer = Trainer(
        run_dir,
        cfg,
        model,
        optimizer,
        scheduler,
        loader,
        loss_fn,
        max_steps=max_steps,
        model_config={
            "name": "yardstick",
            "widths": model.widths,
            "residual": model.residual,
            "flip_average": model.flip_average,
            "num_classes": len(classes),
        },
        mixed_precision=t["mixed_precision"] or "no",
        log_every=min(int(t["log_every"]), max_steps),
        ckpt_every=max_steps,
        keep_last=1,
        seed=int(t["seed"]),
        accelerator=accelerator,
        hooks=[(int(t["eval_every_epochs"]) * steps_per_epoch, evaluate)],
        torch_compile=bool(t["compile"]),
    )
    fit = trainer.fit(resume=resume or None)
    net = trainer.unwrapped_model
    top1 = accuracy(net, test_images, test_labels, accelerator.device, autocast=cuda)
    flip_average, net.flip_average = net.flip_average, False
    single_view = accuracy(net, test_images, test_labels, accelerator.device, autocast=cuda)
    net.flip_average = flip_average
    results = {
        "test_top1": round(top1, 2),
        "test_top1_single_view": round(single_view, 2),
        "params": sum(p.numel() for p in net.parameters()),
        "step": fit["step"],
        "epochs": round(fit["step"] / steps_per_epoch, 2),
        "global_batch": batch,
        "processes": accelerator.num_processes,
        "train_images": len(labels),
        "test_images": len(test_labels),
        "decode_seconds": round(decode_seconds, 1),
        "seconds": round(time.perf_counter() - start, 1),
        "weights": str(run_dir / "yardstick.safetensors"),
    }
    if accelerator.is_main_process:
        save_yardstick(
            net,
            run_dir / "yardstick.safetensors",
            {"classes": classes, "test_top1": results["test_top1"], "epochs": results["epochs"]},
        )
        trainer.metrics.log(fit["step"], results)
        save_config(results, run_dir / "results.json")
    accelerator.wait_for_everyone()
    return results


def load_yardstick_config(overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """``DEFAULTS`` <- ``key=value`` overrides (unknown keys are errors)."""
    return load_config(None, overrides, defaults=DEFAULTS)
