"""Classifier input pipeline throughput: DeiT training images/s fed from each input path, and where the time goes.

    python scripts/make_imagenet_like.py --cifar data/cifar10 --out data/imagenet_like --count 24000
    python scripts/bench_input.py --data data/imagenet_like --out input.json --cores 4 8 16

Each measurement trains the DeiT recipe (``configs/classify/deit_imagenet.yaml``: DeiT-S at 224 px, RandAugment
rand-m9-mstd0.5-inc1, random erasing 0.25, Mixup / CutMix, repeated augmentation x3, AdamW, bf16 autocast; ``--set``
overrides any key) on one device.

``synthetic``: random images already on the device (the model step alone: the ceiling), in this script's own loop
(compiled as the Trainer compiles it when ``--set train.compile=true``).
Then ``lightvision classify train`` itself (the engine's Trainer, ``data.prefetch`` on): first ``train_synthetic``
(``data.source=synthetic``: random images gathered on the device with the folder's image and class counts, Mixup /
CutMix on the device; the same run as the others without reading, decoding or augmenting an image; fewest cores), then
for every combination of

- loader cores (``--cores``): the process and its loader workers are pinned to that many cores, one worker per core;
- source (``--sources``): ``folder`` (the JPEG folder), ``shards`` (its train split as webdataset shards, written once
  into ``--work``) and ``shards_max`` (the same written with ``make-shards --max-size`` ``--max-size``: images
  shrunk to that shorter side);
- pipeline (``--pipelines``): ``gpu`` (workers read bytes; nvjpeg decode, then the augmentation and Mixup / CutMix
  replayed as CUDA graphs, ``data.augment_graph``), ``hybrid`` (PIL decode, timm's crop and flip in the workers; the
  rest replayed on the device as with ``gpu``) and ``cpu`` (PIL decode + timm transforms in the workers); on request
  ``gpu_workers`` (``data.pipeline=gpu data.decode=workers``: torchvision's CPU decode in the workers, crop and
  augmentation on the device);

named ``train_<source>_<pipeline>_<cores>c``, plus ``train_folder_gpu_eager_<cores>c`` (most cores, the augmentation op
by op) unless ``--no-eager`` and ``train_folder_gpu_cached`` (the folder decoded once into device memory,
``data.cache=device``: the Trainer and the augmentation without the loader and the decode; fewest cores, as it reads no
files while it trains) unless ``--no-cached``. Their ``images_per_s`` is the training log's rate over ``--steps`` steps
after ``--warmup``, ``vs_synthetic`` its share of the ceiling, ``vs_train_synthetic`` its share of ``train_synthetic``'s
rate (the Trainer's run without its input: what the input costs), ``input_wait_share`` the share of that time the
training loop waited for its next batch (the Trainer's log; the input's device work on its own stream does not show in
it), ``input_prepare_ms`` / ``input_prepare_cpu_ms`` the wall / CPU milliseconds per batch of the batch's preparation
(decode and augmentation; for ``train_synthetic`` the gather from the pool) on the thread that runs it,
``input_wait_max_ms`` / ``input_prepare_max_ms`` the longest wait for a batch and the longest preparation of one,
``input_stage_ms`` / ``input_stage_cpu_ms`` the preparation's wall / CPU milliseconds per batch stage by stage (decode,
augment: each on a prefetch thread of its own),
``loop_cpu_ms`` the training loop thread's CPU milliseconds per step, ``update_replayed`` the share of steps whose
update was the captured graph's replay (``train.graph_update``), ``windows`` the rate, wait, longest wait and
preparation, loop CPU and garbage collections (``gc_ms``) of each ``--warmup``-step window, ``epochs`` how much of an
epoch the run's steps covered: past 1, an epoch's end was timed, where the loader restarts its workers' streams
(ImageNet meets one every 10,000 steps, a set of 12,000 images every 94), so a set larger than (warmup + steps) x batch
images measures the steady stream. After ``train_synthetic``, settings run most cores first; past ``--budget-s``
seconds no new one starts (recorded as skipped).
``--loop-settings`` adds this script's stage-timed loops (``folder_cpu``, ``folder_gpu``, ``shards_gpu``: per-stage
milliseconds per batch, synchronised after each stage: ``read``, ``decode``, ``augment``, ``step``; and
``loader_images_per_s``, the loader alone); ``--loaders`` adds ``loader_<source>_<pipeline>_<cores>c``, the training
loader alone (no model, nothing on the device: what the workers supply) for every combination, and ``--no-train`` leaves
the ``classify train`` settings out. ``--overlap [MS ...]`` adds ``overlap_<work>[_switch<MS>ms]``: the bare compiled or
eager step alone and beside a thread preparing one batch per step (:func:`measure_overlap`). With
``--set train.profile_steps=[first,count]`` each ``classify train`` setting's profile summary
(:mod:`lightvision.engine.profiling`) joins its result as ``profile``. Output: JSON (``env``: hardware, versions,
command; ``shards``: how long each was written in, its image count and size; ``results``) at ``--out``, and a short
table printed last.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from itertools import product
from pathlib import Path
from typing import Any

import torch
import torchvision

from lightvision.classify.data import (
    build_mixup,
    device_batches,
    image_folder,
    make_train_loader,
    train_dataset,
)
from lightvision.classify.deit import create_from_config
from lightvision.classify.shards import make_shards, read_index
from lightvision.classify.train import load_recipe, make_criterion, make_optimizer, model_config
from lightvision.cli import widen_cuda_queues
from lightvision.engine import BatchRandom, use_batch_random
from lightvision.engine.batch_random import batch_seed
from lightvision.engine.data import available_cpus, loader_workers
from lightvision.engine.device import resolve_device
from lightvision.engine.metrics import MetricsLogger
from lightvision.engine.trainer import switch_interval
from lightvision.tools.results import add_set_argument, results_env

RECIPE = Path(__file__).resolve().parent.parent / "configs" / "classify" / "deit_imagenet.yaml"
LOOP_SETTINGS = ("synthetic", "folder_cpu", "folder_gpu", "shards_gpu")
SOURCES = ("folder", "shards", "shards_max")
PIPELINES = ("gpu", "hybrid", "cpu")  # the default --pipelines; gpu_workers too on request
PIPELINE_KEYS = {"gpu_workers": ("data.pipeline=gpu", "data.decode=workers")}  # else data.pipeline=<name>
STAGES = ("read", "decode", "augment", "step")
NUM_CLASSES = 1000  # ImageNet's head; the folder's labels are a subset


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _to_device(batch: Any, device: torch.device) -> Any:
    """What accelerate does to a loader batch: tensors to the device, encoded images stay on the CPU."""
    if isinstance(batch, dict):
        return {**batch, "labels": batch["labels"].to(device, non_blocking=True)}
    return tuple(t.to(device, non_blocking=True) for t in batch)


class Loop:
    """One setting's training loop, split in stages so that each can be timed.

    Args:
        cfg: the resolved recipe; batches: endless iterator of loader batches (None: synthetic); dataset: the
        training set (None: synthetic); device: where the model runs.
    """

    def __init__(self, cfg: dict, batches: Any, dataset: Any, device: torch.device):
        torch.manual_seed(0)
        self.cfg, self.batches, self.device = cfg, batches, device
        self.model = create_from_config(model_config(cfg, NUM_CLASSES), cfg["model"]["drop_path"]).to(device)
        if cfg["train"]["compile"]:  # as the Trainer compiles it (``--set train.compile=true``)
            self.model = torch.compile(self.model, mode=cfg["train"]["compile_mode"])
        o = cfg["optim"]
        self.optimizer = make_optimizer(self.model, o, o["lr"], device)
        on_device = dataset is not None and cfg["data"]["pipeline"] == "gpu"
        self.mixup = build_mixup(cfg["aug"], NUM_CLASSES, on_device=on_device)
        mixup = self.mixup if on_device else None  # the gpu pipeline mixes in its augmentation's pass
        self.prepare = device_batches(cfg, dataset, train=True, mixup=mixup) if dataset is not None else None
        self.criterion = make_criterion(self.mixup, cfg["aug"]["smoothing"])
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg["train"]["mixed_precision"])
        b, s = cfg["train"]["batch_size"], cfg["data"]["image_size"]
        self.synthetic = (torch.randn(b, 3, s, s, device=device), torch.randint(0, NUM_CLASSES, (b,), device=device))
        self.step_index = 0

    def read(self, _: Any = None) -> Any:
        """The next batch on the device (labels; images too unless encoded)."""
        if self.batches is None:
            return self.synthetic[0].clone(), self.synthetic[1]  # Mixup mixes in place
        return _to_device(next(self.batches), self.device)

    def decode(self, batch: Any) -> Any:
        return self.prepare.decode(batch) if self.prepare is not None else batch

    def augment(self, decoded: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if self.prepare is not None:  # augmented and mixed
            return self.prepare.augment(decoded)
        images, labels = decoded
        return self.mixup(images, labels) if self.mixup is not None else (images, labels)

    def step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        images, labels = batch
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None):
            loss = self.criterion(self.model(images), labels)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def run(self, steps: int, timed_stages: bool = False) -> dict[str, float]:
        """``steps`` training steps; returns the seconds of each stage (when ``timed_stages``: synchronised after
        each, else 0) and in all."""
        totals = dict.fromkeys(STAGES, 0.0)
        _sync(self.device)
        start = time.perf_counter()
        for _ in range(steps):
            with use_batch_random(BatchRandom(batch_seed(0, self.step_index, 0))):
                value, mark = None, time.perf_counter()
                for name in STAGES:
                    value = getattr(self, name)(value)
                    if timed_stages:
                        _sync(self.device)
                        now = time.perf_counter()
                        totals[name] += now - mark
                        mark = now
            self.step_index += 1
        _sync(self.device)
        totals["total"] = time.perf_counter() - start
        return totals


OVERLAP_WORK = ("none", "decode", "augment", "decode_augment", "host_decoded")


def overlap_context(args: argparse.Namespace, device: torch.device) -> tuple[Loop, dict[str, Any]]:
    """This script's loop on synthetic input (compiled as ``--set`` says, warmed up) and, per ``OVERLAP_WORK``, the
    gpu pipeline's work on one of a few folder batches read once: encoded (``decode``, ``decode_augment``), decoded
    on the device (``augment``), or decoded by the loader workers (``host_decoded``: ``data.decode=workers``'s copy,
    crop and augmentation)."""

    def first_batches(decode: str) -> tuple[Any, list[Any]]:
        cfg = _recipe(args, args.data, "gpu", "data.format=folder", f"data.decode={decode}")
        dataset = train_dataset(cfg)
        workers = loader_workers(cfg["data"]["num_workers"])
        loader = make_train_loader(cfg, dataset, workers, pin_memory=device.type == "cuda")
        batches = [_to_device(batch, device) for _, batch in zip(range(4), loader)]
        return device_batches(cfg, dataset, train=True), batches

    (prepare, batches), (from_host, host_batches) = first_batches("device"), first_batches("workers")
    decoded = [prepare.decode(batch) for batch in batches]
    work = {
        "none": None,
        "decode": lambda i: prepare.decode(batches[i]),
        "augment": lambda i: prepare.augment(decoded[i]),
        "decode_augment": lambda i: prepare(batches[i]),
        "host_decoded": lambda i: from_host(host_batches[i]),
    }
    for name in OVERLAP_WORK[1:]:  # first calls: lazy initialisation and the augmentation's graph captures
        with use_batch_random(BatchRandom(0)):
            work[name](0)
    loop = Loop(_recipe(args, args.data, "gpu", "data.format=folder"), None, None, device)
    loop.run(args.warmup)
    return loop, work


def measure_overlap(
    work_name: str,
    switch_ms: float | None,
    context: Callable[[], tuple[Loop, dict[str, Any]]],
    args: argparse.Namespace,
) -> dict:
    """The model's step on synthetic input beside a thread that prepares one batch per step (``work_name`` of the
    gpu pipeline on its own high-priority stream, as the Trainer's prefetch with ``prefetch_priority`` high; it falls
    behind when slower than the step), with Python's thread switch interval at ``switch_ms`` (None: its default): what
    that work costs the step running beside it, with no loader and no waiting for the input. ``context``:
    :func:`overlap_context`, built once for every setting."""
    loop, work = context()
    device = loop.device
    prepare, tokens, stop, done = work[work_name], threading.Semaphore(0), threading.Event(), []

    def background() -> None:
        stream = torch.cuda.Stream(device, priority=-1) if device.type == "cuda" else None
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            while not stop.is_set():
                if not tokens.acquire(timeout=0.05):
                    continue
                start = time.perf_counter()
                with use_batch_random(BatchRandom(len(done))):
                    prepare(len(done) % 4)
                if stream is not None:
                    stream.synchronize()
                done.append(time.perf_counter() - start)

    default = sys.getswitchinterval()
    thread = threading.Thread(target=background, daemon=True) if prepare is not None else None
    with switch_interval(switch_ms):
        if thread is not None:
            thread.start()
        try:
            _sync(device)
            start = time.perf_counter()
            for _ in range(args.steps):
                tokens.release()
                with use_batch_random(BatchRandom(batch_seed(0, loop.step_index, 0))):
                    loop.step(loop.augment(loop.read()))
                loop.step_index += 1
            _sync(device)
            seconds = time.perf_counter() - start
        finally:
            stop.set()
            if thread is not None:
                thread.join()
    batch = loop.cfg["train"]["batch_size"]
    return {
        "work": work_name,
        "switch_ms": switch_ms if switch_ms is not None else 1000 * default,
        "images_per_s": args.steps * batch / seconds,
        "prepared_per_step": len(done) / args.steps,
        "prepare_ms": 1000 * sum(done) / len(done) if done else None,
    }


def _endless(loader: Any) -> Any:
    while True:
        yield from loader


def _source(args: argparse.Namespace, source: str) -> tuple[Path, str]:
    """The data root of a ``--sources`` name (shards under ``--work``) and its ``data.format`` override."""
    if source.startswith("shards"):
        return args.work / source, "data.format=shards"
    return args.data, "data.format=folder"


def _overrides(args: argparse.Namespace, root: Path, pipeline: str, *overrides: str) -> list[str]:
    """Recipe overrides of one setting: data root and pipeline, the command's sizes and workers, ``overrides``, then
    the command's ``--set``."""
    return [
        f"data.root={root}",
        *PIPELINE_KEYS.get(pipeline, (f"data.pipeline={pipeline}",)),
        f"data.num_workers={args.workers}",
        f"train.batch_size={args.batch_size}",
        f"data.image_size={args.img_size}",
        *overrides,
        *args.set,
    ]


def _recipe(args: argparse.Namespace, root: Path, pipeline: str, *overrides: str) -> dict:
    """The DeiT recipe of one setting (:func:`_overrides` applied)."""
    return load_recipe(RECIPE, _overrides(args, root, pipeline, *overrides))


def measure(name: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """images/s, loader-only images/s and per-stage ms per batch of one setting."""
    pipeline = "cpu" if name == "folder_cpu" else "gpu"
    fmt = "shards" if name.startswith("shards") else "folder"
    root = args.work / "shards" if fmt == "shards" else args.data
    cfg = _recipe(args, root, pipeline, f"data.format={fmt}")
    batch = cfg["train"]["batch_size"]
    dataset = loader = batches = None
    if name != "synthetic":
        dataset = train_dataset(cfg)
        workers = loader_workers(cfg["data"]["num_workers"])
        loader = make_train_loader(cfg, dataset, workers, pin_memory=device.type == "cuda")
        batches = _endless(loader)
    loop = Loop(cfg, batches, dataset, device)
    loop.run(args.warmup)
    total = loop.run(args.steps)["total"]
    stages = loop.run(args.stage_steps, timed_stages=True)
    out: dict[str, Any] = {
        "pipeline": pipeline if name != "synthetic" else None,
        "format": fmt if name != "synthetic" else None,
        "batch_size": batch,
        "img_size": cfg["data"]["image_size"],
        "steps": args.steps,
        "images_per_s": args.steps * batch / total,
        **{f"{k}_ms": 1000 * v / args.stage_steps for k, v in stages.items() if k != "total"},
    }
    if batches is not None:
        buffered = 2 * max(1, loader.num_workers)  # prefetch_factor 2 per worker, already filled
        for _ in range(buffered):
            next(batches)
        start = time.perf_counter()
        for _ in range(args.loader_steps):
            next(batches)
        out["loader_images_per_s"] = args.loader_steps * batch / (time.perf_counter() - start)
        out["skipped_images"] = dataset.skipped_images()
    return out


def trainer_settings(args: argparse.Namespace) -> list[tuple[str, str, str, int, bool, bool]]:
    """(name, source, pipeline, cores, graph, cached) of each ``classify train`` measurement: ``train_synthetic`` (no
    loader workers: fewest cores), then most cores first."""
    cores = sorted(set(args.cores), reverse=True)
    synthetic = ("train_synthetic", "synthetic", "gpu", cores[-1], True, False)
    out = [
        (f"train_{source}_{pipeline}_{n}c", source, pipeline, n, True, False)
        for n in cores
        for source in args.sources
        for pipeline in args.pipelines
    ]
    extras = []
    if "gpu" in args.pipelines and "folder" in args.sources:
        if not args.no_eager:
            extras.append((f"train_folder_gpu_eager_{cores[0]}c", "folder", "gpu", cores[0], False, False))
        if not args.no_cached:
            extras.append(("train_folder_gpu_cached", "folder", "gpu", cores[-1], True, True))  # no loader workers
    at = len(args.sources) * len(args.pipelines)
    return [synthetic, *out[:at], *extras, *out[at:]]


def measure_trainer(
    name: str,
    source: str,
    pipeline: str,
    cores: int,
    graph: bool,
    cached: bool,
    args: argparse.Namespace,
    device: torch.device,
) -> dict[str, Any]:
    """images/s of ``lightvision classify train`` run as its own process pinned to ``cores`` cores (its loader
    workers inherit the mask): the training log's rate after the warm-up. A setting that fails or outlasts
    ``--setting-timeout`` is recorded with the last line it printed and the next one starts."""
    allowed = sorted(os.sched_getaffinity(0))
    if cores > len(allowed):
        return {"skipped": f"needs {cores} cores, {len(allowed)} available"}
    run = args.work / f"run_{name}"
    shutil.rmtree(run, ignore_errors=True)
    window = max(1, args.warmup)
    steps = max(window, args.steps // window * window)
    root, fmt = _source(args, source)
    overrides = _overrides(
        args,
        root,
        pipeline,
        fmt,
        *(synthetic_overrides(args.data) if source == "synthetic" else []),
        f"data.num_workers={cores}",
        f"data.augment_graph={'true' if graph else 'false'}",
        *(["data.cache=device"] if cached else []),
        "data.prefetch=true",
        f"train.max_steps={window + steps}",
        f"train.log_every={window}",
        "train.eval_every_epochs=1000",
        "train.ckpt_every_epochs=1000",
        f"run.dir={run}",
    )
    command = [sys.executable, "-m", "lightvision", "classify", "train", "--config", str(RECIPE)]
    command += ["--device", device.type, *overrides]
    pinned = set(allowed[:cores])
    try:
        done = subprocess.run(  # in --work: `-m lightvision` must not find a checkout's unmapped lightvision/ first
            command,
            cwd=args.work,
            preexec_fn=lambda: os.sched_setaffinity(0, pinned),
            capture_output=True,
            text=True,
            timeout=args.setting_timeout,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {args.setting_timeout:.0f} s"}
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return {"error": lines[-1] if lines else f"exit code {done.returncode}"}
    records = [r for r in MetricsLogger(run).records() if "steps_per_s" in r and r["step"] > window]
    profiled = run / "profile" / "summary_0.json"  # with --set train.profile_steps=[first,count]
    durations = [window / r["steps_per_s"] for r in records]  # seconds of each logged window
    seconds = sum(durations)
    batch = args.batch_size
    return {
        "pipeline": pipeline,
        "source": source,
        "cores": cores,
        "augment_graph": graph,
        "cache": "device" if cached else None,
        "batch_size": batch,
        "img_size": args.img_size,
        "steps": len(records) * window,
        "epochs": (window + steps) * batch / epoch_images(args, source),  # past 1: an epoch's end was timed
        "images_per_s": len(records) * window * batch / seconds,
        "input_wait_share": sum(r["input_wait_share"] * t for r, t in zip(records, durations)) / seconds,
        **{  # prepare_batch's time per batch on its thread, over the same windows (logged where it runs)
            key: sum(r[key] for r in records) / len(records)
            for key in ("input_prepare_ms", "input_prepare_cpu_ms", "loop_cpu_ms", "update_replayed")
            if all(key in r for r in records)
        },
        **{  # the same per stage of the preparation (decode, augment): the slowest thread sets the input's pace
            key: [round(sum(stage) / len(records), 3) for stage in zip(*(r[key] for r in records))]
            for key in ("input_stage_ms", "input_stage_cpu_ms")
            if all(key in r for r in records)
        },
        **{  # the longest wait for a batch and the longest preparation of one, over the timed windows
            key: max(r[key] for r in records)
            for key in ("input_wait_max_ms", "input_prepare_max_ms")
            if all(key in r for r in records)
        },
        "windows": [  # each logged window: where in the run the rate or the wait moved
            {
                "images_per_s": window * batch / t,
                **{
                    k: r.get(k)
                    for k in ("input_wait_share", "input_wait_max_ms", "input_prepare_max_ms", "loop_cpu_ms", "gc_ms")
                },
                **({"update_replayed": r["update_replayed"]} if "update_replayed" in r else {}),
            }
            for r, t in zip(records, durations)
        ],
        **({"profile": json.loads(profiled.read_text())} if profiled.is_file() else {}),
    }


@functools.cache
def train_images(data: Path) -> int:
    """Images in the folder's train split (an epoch of every source made from it)."""
    return len(image_folder(data, "train", None))


def epoch_images(args: argparse.Namespace, source: str) -> int:
    """Images in an epoch of ``source``: the folder's train split; for ``synthetic`` its count unless ``--set``
    gives ``data.synthetic_images``."""
    if source != "synthetic":
        return train_images(args.data)
    return int(load_recipe(RECIPE, [*synthetic_overrides(args.data), *args.set])["data"]["synthetic_images"])


def measure_loader(source: str, pipeline: str, cores: int, args: argparse.Namespace, device: torch.device) -> dict:
    """The training loader alone (no model, no device work): images/s of ``cores`` workers (``--set
    data.num_workers=...`` overrides) pinned to ``cores`` cores, timed over six batches a worker after two a worker
    (what the workers had buffered) were taken."""
    allowed = sorted(os.sched_getaffinity(0))
    if cores > len(allowed):
        return {"skipped": f"needs {cores} cores, {len(allowed)} available"}
    root, fmt = _source(args, source)
    cfg = _recipe(args, root, pipeline, fmt, f"data.num_workers={cores}")
    os.sched_setaffinity(0, allowed[:cores])  # the workers inherit the mask
    try:
        workers = loader_workers(cfg["data"]["num_workers"])
        loader = make_train_loader(cfg, train_dataset(cfg), workers, pin_memory=device.type == "cuda")
        batches = _endless(loader)
        for _ in range(2 * max(1, workers)):
            next(batches)
        timed = 6 * max(1, workers)
        start = time.perf_counter()
        for _ in range(timed):
            next(batches)
        seconds = time.perf_counter() - start
        del batches, loader  # the workers stop before the next setting starts
    finally:
        os.sched_setaffinity(0, allowed)
    batch = cfg["train"]["batch_size"]
    return {"pipeline": pipeline, "source": source, "cores": cores, "images_per_s": timed * batch / seconds}


def synthetic_overrides(data: Path) -> list[str]:
    """``data.source=synthetic`` with the image counts of the folder's train and val splits and its class count: the
    folder runs' epochs, head and validation, without an image read."""
    train, val = (image_folder(data, split, None) for split in ("train", "val"))
    return [
        "data.source=synthetic",
        f"data.synthetic_images={len(train)}",
        f"data.synthetic_val_images={len(val)}",
        f"data.synthetic_classes={len(train.classes)}",
    ]


def _written_index(root: Path, split: str, images: int, shard_size: int, max_size: int | None) -> dict | None:
    """The index of shards an earlier run wrote from the same folder split (image count, shard size, max size)."""
    try:
        index = read_index(root, split)
    except FileNotFoundError:
        return None
    same = index["count"] + len(index["skipped"]) == images and index.get("max_size") == max_size
    return index if same and -(-index["count"] // shard_size) == len(index["shards"]) else None


def write_shards(args: argparse.Namespace) -> dict[str, Any]:
    """The folder's train and val splits as shards under ``--work``: ``shards`` (the files' bytes) and ``shards_max``
    (``--max-size``), each written once (kept from an earlier run into the same ``--work`` when its indexes name the
    same image counts, shard size and ``--max-size``); seconds, train images, shrunk train images and MiB of the
    train split."""
    out, sources = {}, [s for s in args.sources if s != "folder"]
    folders = {split: image_folder(args.data, split, None) for split in ("val", "train")} if sources else {}
    for source in sources:
        start = time.perf_counter()
        max_size = args.max_size if source == "shards_max" else None
        for split in ("val", "train"):
            index = _written_index(args.work / source, split, len(folders[split]), args.shard_size, max_size)
            reused = index is not None
            index = index or make_shards(
                folders[split], args.work / source, split, args.shard_size, max_size=max_size, workers=available_cpus()
            )
        mib = sum(f.stat().st_size for f in (args.work / source).glob("train-*.tar")) / 2**20
        out[source] = {
            "seconds": time.perf_counter() - start,
            "images": index["count"],
            "resized": index["resized"],
            "max_size": max_size,
            "mib": mib,
            "reused": reused,  # the train split's shards were an earlier run's
        }
        print(json.dumps({f"wrote {source}": out[source]}), flush=True)
    return out


def table(results: dict[str, dict[str, Any]]) -> str:
    """The short table: images/s, its shares of the synthetic ceiling and of ``train_synthetic`` and (``classify
    train`` settings) the share of the time its loop waited for the next batch and the batch preparation's wall / CPU
    ms on its thread, per setting."""
    lines = [
        "| setting | images/s | vs synthetic | vs train_synthetic | input wait | prepare ms (CPU) |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        if "images_per_s" not in r:
            lines.append(f"| {name} | {(r.get('error') or r.get('skipped', ''))[:60]} | - | - | - | - |")
            continue
        shares = [f"{100 * r[key]:.0f}%" if key in r else "-" for key in ("vs_synthetic", "vs_train_synthetic")]
        wait = f"{100 * r['input_wait_share']:.0f}%" if "input_wait_share" in r else "-"
        prepare = f"{r['input_prepare_ms']:.1f} ({r['input_prepare_cpu_ms']:.1f})" if "input_prepare_ms" in r else "-"
        lines.append(f"| {name} | {r['images_per_s']:.0f} | {' | '.join(shares)} | {wait} | {prepare} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="ImageFolder root with train/ (make_imagenet_like.py)")
    p.add_argument("--out", type=Path, required=True, help="JSON results file")
    p.add_argument("--work", type=Path, default=Path("/tmp/lightvision_bench_input"), help="scratch for the shards")
    p.add_argument("--loop-settings", nargs="*", choices=LOOP_SETTINGS, default=["synthetic"])
    p.add_argument("--cores", nargs="*", type=int, default=[4, 8, 16], help="loader cores of the classify-train runs")
    p.add_argument("--sources", nargs="*", choices=SOURCES, default=list(SOURCES))
    p.add_argument("--pipelines", nargs="*", choices=[*PIPELINES, *PIPELINE_KEYS], default=list(PIPELINES))
    p.add_argument("--max-size", type=int, default=256, help="shorter side of the shards_max images")
    p.add_argument("--no-eager", action="store_true", help="leave out the run with the augmentation op by op")
    p.add_argument("--no-cached", action="store_true", help="leave out the run from images decoded into device memory")
    p.add_argument("--loaders", action="store_true", help="time the training loader alone per cores, source, pipeline")
    p.add_argument("--no-train", action="store_true", help="leave out the classify-train settings")
    p.add_argument(
        "--overlap",
        nargs="*",
        type=float,
        default=None,
        help="the step beside the gpu pipeline's decode / augmentation on a thread (measure_overlap), with Python's "
        "switch interval and each of these (ms)",
    )
    p.add_argument("--budget-s", type=float, default=0, help="start no setting after this many seconds (0: no limit)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--workers", type=int, default=available_cpus(), help="loader processes of the loop settings")
    p.add_argument(
        "--warmup", type=int, default=30, help="untimed steps first (worker start-up, kernels, the loader's buffer)"
    )
    p.add_argument("--steps", type=int, default=90, help="timed steps (a multiple of --warmup for the train runs)")
    p.add_argument("--setting-timeout", type=float, default=240, help="seconds one classify-train setting may take")
    p.add_argument("--stage-steps", type=int, default=10, help="steps timed stage by stage")
    p.add_argument("--loader-steps", type=int, default=30, help="batches of the loader-only measurement")
    p.add_argument("--shard-size", type=int, default=500)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    add_set_argument(p, "recipe overrides, e.g. model.name=lightnet_deit_small_patch16_224")
    args = p.parse_args(argv)
    widen_cuda_queues()  # as the lightvision command does, for this script's own loops
    start = time.perf_counter()
    args.data, args.work = args.data.resolve(), args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    device = torch.device(resolve_device(args.device))
    if "shards_gpu" in args.loop_settings and "shards" not in args.sources:
        args.sources.append("shards")
    command = shlex.join(["python", "scripts/bench_input.py", *(sys.argv[1:] if argv is None else argv)])
    env = {
        **results_env(command),
        "torchvision": torchvision.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_cores": os.cpu_count(),
        "available_cores": available_cpus(),
        "device": str(device),
        "cuda_device_max_connections": os.environ["CUDA_DEVICE_MAX_CONNECTIONS"],
    }
    report: dict[str, Any] = {"env": env, "args": {k: str(v) for k, v in vars(args).items()}, "results": {}}
    report["shards"] = write_shards(args)
    runs = [(name, lambda name=name: measure(name, args, device)) for name in args.loop_settings]
    if args.overlap is not None:
        context = functools.cache(functools.partial(overlap_context, args, device))
        for switch, work in product([None, *args.overlap], OVERLAP_WORK):
            measure_one = functools.partial(measure_overlap, work, switch, context, args)
            runs.append((f"overlap_{work}" + (f"_switch{switch:g}ms" if switch is not None else ""), measure_one))
    if args.loaders:
        for n, source, pipeline in product(sorted(set(args.cores), reverse=True), args.sources, args.pipelines):
            measure_one = functools.partial(measure_loader, source, pipeline, n, args, device)
            runs.append((f"loader_{source}_{pipeline}_{n}c", measure_one))
    run_steps = max(1, args.warmup) + max(1, args.steps)
    shortest = min(epoch_images(args, source) for source in ("synthetic", *args.sources))
    if not args.no_train and run_steps * args.batch_size > shortest:
        print(
            f"bench_input: {run_steps} steps of {args.batch_size} pass the end of an epoch of {shortest} images: "
            f"the loader's restart is timed with the step (a larger --data set, or fewer --warmup / --steps, leaves "
            f"it out)",
            file=sys.stderr,
        )
    for name, *setting in [] if args.no_train else trainer_settings(args):
        runs.append((name, lambda name=name, setting=setting: measure_trainer(name, *setting, args, device)))
    for name, run in runs:
        if args.budget_s and time.perf_counter() - start > args.budget_s:
            report["results"][name] = {"skipped": f"past the {args.budget_s:.0f} s budget"}
            continue
        try:
            report["results"][name] = run()
        except Exception as err:  # noqa: BLE001 - recorded; the other settings still run
            report["results"][name] = {"error": f"{type(err).__name__}: {err}"}
        result = report["results"][name]
        for base in ("synthetic", "train_synthetic"):
            rate = report["results"].get(base, {}).get("images_per_s")
            if rate and "images_per_s" in result and (base == "synthetic" or name.startswith("train_")):
                result[f"vs_{base}"] = result["images_per_s"] / rate
        if "work" in result:  # an overlap setting: against the step alone at the same switch interval
            alone = [
                r
                for r in report["results"].values()
                if (r.get("work"), r.get("switch_ms")) == ("none", result["switch_ms"])
            ]
            if alone and "images_per_s" in alone[0]:
                result["vs_alone"] = result["images_per_s"] / alone[0]["images_per_s"]
        print(json.dumps({name: result}), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
    report["seconds"] = time.perf_counter() - start
    args.out.write_text(json.dumps(report, indent=2))
    print(table(report["results"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
