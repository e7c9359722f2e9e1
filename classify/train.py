"""Train a DeiT-family classifier with the DeiT recipe through the engine ``Trainer``.

    lightvision classify train --config configs/classify/deit_imagenet.yaml data.root=/imagenet \
        model.name=lightnet_deit_small_patch16_224
    accelerate launch -m lightvision classify train --config ...      # several GPUs

``DEFAULTS`` is the DeiT ImageNet recipe (Touvron et al. 2021, timm ``train.py`` flags in brackets): AdamW
lr 5e-4 x global batch / 512, weight decay 0.05 (cls token, position embedding and every 1-D tensor
excluded), cosine schedule per step with 5 warmup epochs from 1e-6 down to 1e-5, 300 epochs, RandAugment
``rand-m9-mstd0.5-inc1``, color jitter 0.3 (unused with RandAugment, as in timm), Mixup 0.8 / CutMix 1.0
with label smoothing 0.1 (SoftTargetCrossEntropy), random erasing 0.25, repeated augmentation x3, drop path
0.1, EMA 0.99996, bf16 autocast. Recipe files in ``configs/classify/`` list only what they change; every
key is checked against ``DEFAULTS`` (a typo is an error that names the close matches).

The run folder gets ``config.json`` (resolved config), ``metrics.jsonl`` (train loss / lr every
``log_every`` steps, validation top-1 / top-5 every ``eval_every_epochs``), ``checkpoints/`` (engine
format: model + EMA safetensors, verified) and ``results.json`` (final validation metrics).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from accelerate import PartialState
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2, get_optimizer_class
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import IterableDataset

from lightvision.classify.data import (
    build_mixup,
    device_batches,
    make_train_loader,
    make_val_loader,
    train_dataset,
    val_dataset,
)
from lightvision.classify.decoded import DecodedImages
from lightvision.classify.deit import create_from_config, recorded_args
from lightvision.classify.evaluate import evaluate
from lightvision.classify.shards import ShardDataset
from lightvision.engine import Trainer, load_config, make_accelerator, save_config
from lightvision.engine.batch_random import batch_random
from lightvision.engine.compiled import compile_setting
from lightvision.engine.config import check_betas, check_number
from lightvision.engine.data import loader_workers
from lightvision.engine.device import resolve_device
from lightvision.engine.fused_update import check_fused, fused_kwargs
from lightvision.engine.guards import NAN_POLICIES
from lightvision.engine.run_lock import run_folder_lock
from lightvision.engine.weights import record_init
from lightvision.ops._checks import check_choice

__all__ = [
    "DEFAULTS",
    "check_recipe",
    "load_recipe",
    "make_criterion",
    "make_loss_fn",
    "make_optimizer",
    "model_config",
    "train",
]

log = logging.getLogger(__name__)

DEFAULTS: dict[str, Any] = {
    "model": {
        "name": "softmax_deit_small_patch16_224",  # any registered name: {attention}_deit_{size}_patch16_224
        "drop_path": 0.1,
        # more timm.create_model kwargs as one mapping, e.g. model.args={patch_size: 4, embed_dim: 64}
        # (patch_size, embed_dim, depth, num_heads, drop_rate, attn_kwargs, pos_embed, tpe_placement, tpe_kwargs, ...);
        # an open section: model.args.KEY=VALUE sets one of them
        "args": {},
        # start from a checkpoint (a run folder, or timm / DeiT / LION authors' weights; its EMA when it has one):
        # every tensor of the same name and shape is copied, e.g. a softmax DeiT into LION-S or LightNet
        "init_from": None,
    },
    "data": {
        # "imagefolder" (root/train, root/val), "digits" (bundled, no download) or "synthetic" (random images made
        # on the training device, no files: the same run without its input's cost, to measure that cost against)
        "source": "imagefolder",
        "root": None,
        "image_size": 224,  # the model's input size: training crops and validation images
        "train_split": "train",
        "val_split": "val",
        "in_chans": 3,
        "mean": None,  # None: the model's pretrained_cfg (ImageNet)
        "std": None,
        "crop_pct": None,  # eval resize = size / crop_pct; None: the model's pretrained_cfg (0.875)
        "num_workers": 8,
        # "cpu": decode + augment in loader workers; "gpu": workers read bytes, the device decodes and augments;
        # "hybrid": workers decode, crop and flip, the device runs RandAugment, erasing and Mixup / CutMix
        "pipeline": "cpu",
        "format": "folder",  # "folder": root/<split>/<class>/*; "shards": root/<split>-*.tar (classify make-shards)
        "decode": "device",  # pipeline gpu: "device" (nvjpeg) or "workers" (the loader workers, torchvision on CPU)
        "prefetch": True,  # pipeline gpu / hybrid: prepare the next batch in a background thread during the step
        "thread_switch_ms": 0.2,  # with prefetch: Python's thread switch interval (ms) while training; null: its 5
        # with prefetch on CUDA: "low", the step's stream ranks above the input's; "high", the input's above the step's
        "prefetch_priority": "low",
        "augment_graph": False,  # pipeline gpu / hybrid on CUDA: replay the augmentation and Mixup / CutMix as graphs
        "cache": None,  # "device" (pipeline gpu, folder): decode the training images once into device memory
        # source synthetic (a pool of 4 training batches of random images on the device): images per training epoch
        # and validation images (ImageNet-1k's splits: an ImageNet run's epochs and schedule; set a real run's counts
        # to match it) and labels in [0, synthetic_classes)
        "synthetic_images": 1281167,
        "synthetic_val_images": 50000,
        "synthetic_classes": 1000,
    },
    "aug": {
        "no_aug": False,  # true: resize + center crop only (timm no_aug: no random crop/flip/RandAugment/erasing)
        "scale": [0.08, 1.0],  # RandomResizedCrop area range
        # mixed resolution (FlexiViT-style): a list of image sizes, one drawn per optimizer step (keyed by seed and
        # step) to which the batch is resized on the device; null: every step at data.image_size
        "sizes": None,
        "auto_augment": "rand-m9-mstd0.5-inc1",
        "color_jitter": 0.3,
        "interpolation": "bicubic",
        "reprob": 0.25,
        "remode": "pixel",
        "recount": 1,
        "mixup": 0.8,
        "cutmix": 1.0,
        "mixup_prob": 1.0,
        "mixup_switch_prob": 0.5,
        "smoothing": 0.1,
        "repeated_aug": 3,  # repeats per image and epoch; 1 = off
    },
    "optim": {
        "opt": "adamw",
        "lr": 5e-4,
        "lr_base_batch": 512,  # lr is scaled by global batch / lr_base_batch; null = use lr as is
        "weight_decay": 0.05,
        "betas": [0.9, 0.999],
        "eps": 1e-8,
        "clip_grad": None,
        "fused": None,  # the update as one fused program (less host time a step); null: on CUDA where opt has one
    },
    "sched": {"epochs": 300, "warmup_epochs": 5, "warmup_lr": 1e-6, "min_lr": 1e-5},
    "train": {
        "batch_size": 128,  # per process and micro-batch
        "max_steps": None,  # stop after this many optimizer steps (null: sched.epochs); the schedule keeps its length
        "grad_accum_steps": 1,
        "mixed_precision": "bf16",  # "no" | "bf16" | "fp16"
        "ema_decay": 0.99996,  # null: no EMA
        "grad_checkpointing": False,
        "compile": False,  # torch.compile the model (lightvision kernels stay in the graph as custom ops)
        "compile_mode": None,  # with compile: "reduce-overhead" (CUDA graphs), "max-autotune", ... (null: default)
        "profile_steps": None,  # [first, count]: profile those optimizer steps into RUN/profile (trace, summary)
        "profile_host": True,  # false (CUDA): that profile records the device alone (its idle time the run's own)
        "graph_update": True,  # CUDA, fused Adam/AdamW: the update after the backward replayed as one CUDA graph
        "eval_every_epochs": 1,
        "eval_batch_size": 256,
        "log_every": 50,
        "ckpt_every_epochs": 1,
        "keep_last": 3,
        "nan_policy": "stop",
        "seed": 0,  # model init, data order, per-step randomness (the same init for any number of processes)
    },
    "run": {"dir": "runs/classify"},
}


def load_recipe(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """``DEFAULTS`` <- recipe YAML ``path`` <- ``key=value`` overrides; unknown keys are errors."""
    return load_config(path, overrides, defaults=DEFAULTS)


def model_config(cfg: dict, num_classes: int) -> dict:
    """What rebuilds the architecture (stored with every checkpoint, checked on resume and eval)."""
    m = cfg["model"]
    return {
        "name": m["name"],
        "num_classes": num_classes,
        "in_chans": cfg["data"]["in_chans"],
        "img_size": cfg["data"]["image_size"],
        "args": recorded_args(m["name"], m["args"] or {}),
    }


def make_criterion(mixup: Any, smoothing: float) -> nn.Module:
    """Soft-target CE after Mixup/CutMix (their targets carry the smoothing), else label-smoothing CE, else CE."""
    if mixup is not None:
        return SoftTargetCrossEntropy()
    return LabelSmoothingCrossEntropy(smoothing) if smoothing > 0 else nn.CrossEntropyLoss()


def step_size(images: torch.Tensor, sizes: list[int] | None) -> torch.Tensor:
    """A training batch [B, C, H, W] at this step's size of ``sizes`` (``aug.sizes``): one size per step, drawn from
    the current :func:`~lightvision.engine.batch_random.batch_random` (the same on every process and on resume), the
    batch resized to it (bilinear, antialiased); None or the batch's own size: unchanged."""
    if not sizes:
        return images
    pick = int(torch.randint(len(sizes), (1,), generator=batch_random().generator()))
    size = sizes[pick]
    if images.shape[-2:] == (size, size):
        return images
    return F.interpolate(images, size=(size, size), mode="bilinear", antialias=True, align_corners=False)


def make_loss_fn(mixup: Any, smoothing: float, sizes: list[int] | None = None, mixed: bool = False):
    """``loss_fn(model, (images, labels))`` for the Trainer: the step's size (:func:`step_size`), Mixup/CutMix (unless
    the batches come ``mixed``, their targets soft), then :func:`make_criterion`'s loss."""
    criterion = make_criterion(mixup, smoothing)

    def loss_fn(model: nn.Module, batch: Any) -> torch.Tensor:
        images, labels = batch
        images = step_size(images, sizes)
        if mixup is not None and not mixed:
            images, labels = mixup(images, labels)
        return criterion(model(images), labels)

    return loss_fn


def _warmup_cosine(total_steps: int, warmup_steps: int, lr: float, warmup_lr: float, min_lr: float):
    """LambdaLR factor: linear warmup_lr -> lr over ``warmup_steps``, then cosine lr -> min_lr."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (warmup_lr + (lr - warmup_lr) * step / warmup_steps) / lr
        t = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return (min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * t))) / lr

    return factor


def _base_optimizer(opt: str) -> str:
    """timm's optimizer name inside ``[lookahead_]name``."""
    return str(opt).lower().split("_")[-1]


def _optimizer_class(opt: str) -> Any:
    """timm's class (or factory) of the recipe's ``optim.opt``, the one its ``fused`` argument goes to."""
    return get_optimizer_class(_base_optimizer(opt))


def make_optimizer(model: nn.Module, o: dict[str, Any], lr: float, device: torch.device | str) -> Optimizer:
    """The recipe's optimizer (``optim``: timm's ``opt`` at learning rate ``lr``, fused on ``device`` as
    ``optim.fused`` says) over ``model``'s parameters, weight decay off for biases and norms as timm sets it."""
    fused = fused_kwargs(_optimizer_class(o["opt"]), device, o["fused"], o["opt"])
    return create_optimizer_v2(
        model, opt=o["opt"], lr=lr, weight_decay=o["weight_decay"], betas=tuple(o["betas"]), eps=o["eps"], **fused
    )


def check_recipe(cfg: dict) -> None:
    """Every choice and count of a resolved recipe, named by its key, before anything is built or trained."""
    from timm.optim import list_optimizers

    t, o, s, a = cfg["train"], cfg["optim"], cfg["sched"], cfg["aug"]
    check_choice(_base_optimizer(o["opt"]), list_optimizers(), "optim.opt")
    check_fused(o["fused"], _optimizer_class(o["opt"]), o["opt"])
    check_choice(t["mixed_precision"] or "no", ("no", "bf16", "fp16"), "train.mixed_precision")
    check_choice(t["nan_policy"], NAN_POLICIES, "train.nan_policy")
    check_number(o["lr"], "optim.lr", 0, above=True)
    check_number(o["lr_base_batch"], "optim.lr_base_batch", 0, above=True, optional=True)
    check_number(o["weight_decay"], "optim.weight_decay", 0)
    check_betas(o["betas"])
    check_number(o["clip_grad"], "optim.clip_grad", 0, above=True, optional=True)
    check_number(s["epochs"], "sched.epochs", 1, integer=True)
    for key in ("warmup_epochs", "warmup_lr", "min_lr"):
        check_number(s[key], f"sched.{key}", 0)
    for key in ("batch_size", "grad_accum_steps", "eval_batch_size", "log_every", "keep_last"):
        check_number(t[key], f"train.{key}", 1, integer=True)
    for key in ("eval_every_epochs", "ckpt_every_epochs"):
        check_number(t[key], f"train.{key}", 1, integer=True)
    check_number(t["max_steps"], "train.max_steps", 1, integer=True, optional=True)
    check_number(t["ema_decay"], "train.ema_decay", 0, optional=True)
    check_number(a["repeated_aug"], "aug.repeated_aug", 1, integer=True)
    for key in ("mixup", "cutmix", "smoothing", "reprob"):
        check_number(a[key], f"aug.{key}", 0)


def _check_sizes(sizes: Any, model: nn.Module) -> None:
    """``aug.sizes``: null or a non-empty list of image sizes the model's patch divides."""
    if sizes is None:
        return
    if not isinstance(sizes, list) or not sizes or not all(isinstance(v, int) and v > 0 for v in sizes):
        raise ValueError(f"aug.sizes must be null or a list of image sizes such as [24, 32, 48], got {sizes!r}")
    for size in sizes:
        try:
            model._check_size((size, size))
        except ValueError as err:
            raise ValueError(f"aug.sizes: {err}") from None


def train(cfg: dict, device: str = "auto", resume: bool | str = False) -> dict[str, Any]:
    """Train with the resolved config ``cfg`` (see ``DEFAULTS``); returns the final validation metrics with the run's
    step, epochs, steps run by this call and ``interrupted`` (True when a SIGTERM stopped it after a checkpoint).
    Refused (:class:`~lightvision.engine.run_lock.RunFolderInUse`) while another process trains into ``run.dir``.

    Args:
        device: "auto" (a GPU when one is visible), "cpu" or "cuda" (:func:`~lightvision.engine.device.resolve_device`).
        resume: True continues from the newest checkpoint of ``run.dir``, a path from that checkpoint or run folder;
            False starts fresh (refused if ``run.dir`` has checkpoints).
    """
    check_recipe(cfg)
    with run_folder_lock(cfg["run"]["dir"], PartialState(cpu=resolve_device(device) == "cpu")):
        return _train(cfg, device, resume)


def _train(cfg: dict, device: str, resume: bool | str) -> dict[str, Any]:
    """:func:`train` with the run folder locked."""
    t, o, s, a = cfg["train"], cfg["optim"], cfg["sched"], cfg["aug"]
    accelerator = make_accelerator(
        t["mixed_precision"] or "no",
        t["grad_accum_steps"],
        t["seed"],  # YAML: no -> False
        cpu=resolve_device(device) == "cpu",
    )
    if cfg["data"]["format"] == "shards" and accelerator.num_processes > 1:
        raise ValueError(
            f"data.format=shards reads on one process only ({accelerator.num_processes} were launched): "
            "train from the image folder (data.format=folder, data.pipeline=gpu works there)"
        )
    run_dir = Path(cfg["run"]["dir"])

    train_set = train_dataset(cfg, accelerator.device)
    num_classes = len(train_set.classes)
    mcfg = model_config(cfg, num_classes)
    torch.manual_seed(t["seed"])  # every process (and a 1-process run) starts from the same weights
    model = create_from_config(mcfg, cfg["model"]["drop_path"])
    init_report = None
    if cfg["model"]["init_from"]:
        from lightvision.classify.convert import init_from

        source = cfg["model"]["init_from"]
        init_report = record_init(init_from(model, source), source, run_dir, accelerator.is_main_process)
    if t["grad_checkpointing"]:
        model.set_grad_checkpointing(True)
    val_set = val_dataset(cfg, cfg["data"]["image_size"], device=accelerator.device)
    if val_set.classes != train_set.classes:
        raise ValueError(
            f"train and val class folders differ ({len(train_set.classes)} vs {len(val_set.classes)} classes): "
            "both splits need the same class sub-folders"
        )

    _check_sizes(a["sizes"], model)
    gpu_graph = cfg["data"].get("augment_graph", False)
    # Mixup / CutMix where the batch is made: on the device unless the cpu pipeline's workers made it
    on_device = cfg["data"]["pipeline"] in ("gpu", "hybrid") or cfg["data"]["source"] == "synthetic"
    mixup = build_mixup(a, num_classes, on_device=on_device, graph=gpu_graph)
    if mixup is not None and t["batch_size"] % 2:
        raise ValueError(f"Mixup/CutMix needs an even train.batch_size, got {t['batch_size']}")
    # a device Mixup mixes where the batch is prepared (after the step's resize when aug.sizes draws one)
    mixed = on_device and mixup is not None and not a["sizes"]
    workers = loader_workers(cfg["data"]["num_workers"])
    cuda = accelerator.device.type == "cuda"
    if cfg["data"]["cache"] == "device":
        train_set = DecodedImages(train_set, accelerator.device, workers, progress=accelerator.is_local_main_process)
        if accelerator.is_main_process:
            log.info(
                "decoded %d training images once into %s memory (%s)",
                len(train_set),
                accelerator.device,
                train_set.describe(),
            )
    train_loader = make_train_loader(cfg, train_set, workers, cuda)
    if isinstance(train_set, ShardDataset) and (uneven := train_set.worker_balance(workers)):
        log.warning("%s", uneven)
    val_loader = make_val_loader(
        cfg, val_set, t["eval_batch_size"], workers, cuda, device_batches(cfg, val_set, train=False), accelerator
    )

    procs = accelerator.num_processes
    samples = len(train_set) if isinstance(train_set, IterableDataset) else len(train_loader.sampler)
    steps_per_epoch = samples // (t["batch_size"] * procs) // t["grad_accum_steps"]
    if steps_per_epoch < 1:
        raise ValueError(
            f"{samples} training images are less than one optimizer step ({t['batch_size']} x {procs} processes x "
            f"{t['grad_accum_steps']} accumulation): lower train.batch_size"
        )
    global_batch = t["batch_size"] * procs * t["grad_accum_steps"]
    lr = o["lr"] * global_batch / o["lr_base_batch"] if o["lr_base_batch"] else o["lr"]
    optimizer = make_optimizer(model, o, lr, accelerator.device)
    schedule_steps = s["epochs"] * steps_per_epoch
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, _warmup_cosine(schedule_steps, s["warmup_epochs"] * steps_per_epoch, lr, s["warmup_lr"], s["min_lr"])
    )
    max_steps = schedule_steps if t["max_steps"] is None else min(t["max_steps"], schedule_steps)

    def validate(trainer: Trainer) -> dict[str, Any]:
        """Top-1 / top-5 of the trained weights (and of the EMA); the model's top-1 picks the best checkpoint."""
        res = evaluate(trainer.model, val_loader, accelerator, desc=f"val step {trainer.step}")
        out = {"val_top1": res["top1"], "val_top5": res["top5"], "val_images": res["images"], "metric": res["top1"]}
        if trainer.ema is not None:
            ema = evaluate(trainer.ema.module, val_loader, accelerator, desc="val ema")
            out.update(val_ema_top1=ema["top1"], val_ema_top5=ema["top5"])
        if hasattr(train_set, "skipped_images"):
            out["skipped_images"] = train_set.skipped_images()
        return out

    eval_every = t["eval_every_epochs"] * steps_per_epoch
    loss_fn = make_loss_fn(mixup, a["smoothing"], a["sizes"], mixed=mixed)
    trainer = Trainer(
        run_dir,
        cfg,
        model,
        optimizer,
        scheduler,
        train_loader,
        loss_fn,
        max_steps=max_steps,
        prepare_batch=device_batches(cfg, train_set, train=True, mixup=mixup if mixed else None),
        prefetch=cfg["data"]["prefetch"],
        prefetch_priority=cfg["data"]["prefetch_priority"],
        switch_interval_ms=cfg["data"]["thread_switch_ms"],
        model_config=mcfg,
        grad_accum_steps=t["grad_accum_steps"],
        clip_grad=o["clip_grad"],
        ema_decay=t["ema_decay"],
        log_every=min(t["log_every"], max_steps),
        ckpt_every=t["ckpt_every_epochs"] * steps_per_epoch,
        keep_last=t["keep_last"],
        nan_policy=t["nan_policy"],
        seed=t["seed"],
        hooks=[(eval_every, lambda tr: None if tr.step == max_steps else validate(tr))],
        accelerator=accelerator,
        torch_compile=compile_setting(t["compile"], t["compile_mode"]),
        profile_steps=t["profile_steps"],
        profile_host=t["profile_host"],
        graph_update=t["graph_update"],
    )
    if accelerator.is_main_process:
        log.info(
            "%s: %d classes, %d train / %d val images, %d epochs x %d steps (%d trained), global batch %d "
            "(%d processes), lr %.3g",
            mcfg["name"],
            num_classes,
            len(train_set),
            len(val_set),
            s["epochs"],
            steps_per_epoch,
            max_steps,
            global_batch,
            procs,
            lr,
        )
    fit = trainer.fit(resume=resume or None)
    final = validate(trainer)
    final.pop("metric")
    results = {
        "model": mcfg["name"],
        "params": sum(p.numel() for p in model.parameters()),
        "step": fit["step"],
        "epochs": fit["step"] / steps_per_epoch,
        "global_batch": global_batch,
        "lr": lr,
        "processes": procs,
        "val_set_size": len(val_set),
        "steps_run": fit["steps_run"],
        "interrupted": fit["interrupted"],
        **final,
    }
    trainer.metrics.log(fit["step"], results)
    if init_report:
        results["init_from"] = init_report
    if accelerator.is_main_process:
        save_config(results, run_dir / "results.json")
    return results
