"""Classification data: ImageFolder with the DeiT augmentation pipeline (timm), the bundled digits set, and
synthetic images.

Three sources, chosen by ``data.source`` in the recipe:

* ``imagefolder``: ``root/train/<class>/*.jpg`` and ``root/val/<class>/*.jpg`` (torchvision layout).
  Training images go through timm's ``create_transform`` (random resized crop, flip, RandAugment,
  color jitter, random erasing; ``aug.no_aug``: resize and center-crop only); evaluation resizes to
  ``size / crop_pct`` and center-crops ``size``.
  Images that cannot be decoded are skipped with a warning naming the file (the shared reader,
  :class:`lightvision.engine.data.SafeImageFolder`).
  ``data.format: shards`` reads the same splits from webdataset tar shards (:mod:`lightvision.classify.shards`,
  written by ``lightvision classify make-shards``) instead of the folders.
  ``data.pipeline: cpu`` decodes (PIL) and augments each image in the DataLoader workers. ``data.pipeline: gpu``:
  the workers only read the files' bytes (:mod:`lightvision.classify.encoded`); the batch is decoded on the
  training device and augmented there with the same steps (:mod:`lightvision.classify.device_transforms`):
  :func:`device_batches` turns a loader batch into (images, labels) on the device. ``data.pipeline: hybrid``: the
  workers decode (PIL) and run timm's random resized crop and flip (:mod:`lightvision.classify.cropped`), a batch
  travels as uint8 [B, 3, S, S], and the device runs the rest (RandAugment, normalisation, erasing, Mixup / CutMix).
  ``data.decode: workers`` (with ``gpu``): the workers decode (torchvision, CPU) and the device crops and augments
  (:mod:`lightvision.classify.host_decoded`).
  ``data.cache: device`` (with ``gpu``, on a folder) decodes the training images once into device memory
  (:mod:`lightvision.classify.decoded`) and augments batches from there.
* ``digits``: scikit-learn's bundled 8x8 handwritten digits (1797 images, 10 classes, no download),
  bilinearly upsampled to the requested size; a fixed stratified split gives 1437 train / 360 val images
  (:class:`lightvision.engine.digits.DigitsDataset`, shared with the diffusion models).
* ``synthetic``: no files; random images already in the model's normalised form, made once on the training device
  (:mod:`lightvision.classify.synthetic`), ``data.synthetic_images`` per epoch and ``data.synthetic_val_images`` to
  validate on, labels in [0, ``data.synthetic_classes``): the run without its input's cost, to compare a real run
  with. As with ``data.cache: device`` the loader yields (index, label) batches that :func:`device_batches` gathers
  on the device, with either ``data.pipeline``; no augmentation but Mixup / CutMix (on the device, as with ``gpu``).

Batches are (images [B, C, H, W] float, labels [B] int64); with ``data.pipeline: gpu`` the loader's batches are
encoded (``{"labels", "images"}``) and :func:`device_batches` makes them that on the device.
"""

from __future__ import annotations

import collections
import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import timm
import torch
from PIL import Image, ImageOps
from timm.data import Mixup, create_transform
from timm.data.distributed_sampler import RepeatAugSampler
from torch.utils.data import DataLoader, Dataset
from torchvision.datasets.folder import IMG_EXTENSIONS

from lightvision.classify.cropped import collate_cropped, crop_transform
from lightvision.classify.decoded import CachedBatches, DecodedImages, DeviceImages
from lightvision.classify.deit import MODEL_NAMES
from lightvision.classify.device_mixup import DeviceMixup
from lightvision.classify.device_transforms import DeviceEvalTransform, DeviceTrainTransform
from lightvision.classify.encoded import collate_encoded, decode_batch, read_image_bytes
from lightvision.classify.host_decoded import collate_decoded, decoded_shard_image, read_decoded
from lightvision.classify.shards import ShardDataset, checked_bytes, decode_pil
from lightvision.classify.synthetic import POOL_BATCHES, SyntheticImages
from lightvision.engine.config import check_number
from lightvision.engine.data import SafeImageFolder, unpack_hint
from lightvision.engine.digits import DIGITS_MEAN, DIGITS_STD, DigitsDataset
from lightvision.engine.sample_draws import KeyedDraws, KeyedSampler
from lightvision.engine.trainer import PREFETCH_PRIORITIES
from lightvision.kernels.resize import PackedImages
from lightvision.ops._checks import check_choice

__all__ = [
    "train_dataset",
    "val_dataset",
    "DeviceBatches",
    "HostBatches",
    "FORMATS",
    "PIPELINES",
    "SOURCES",
    "SafeImageFolder",
    "build_mixup",
    "check_data_options",
    "device_batches",
    "make_train_loader",
    "make_val_loader",
    "build_repeat_sampler",
    "eval_transform",
    "image_folder",
    "norm_stats",
    "train_transform",
]

SOURCES = ("imagefolder", "digits", "synthetic")
PIPELINES = ("cpu", "gpu", "hybrid")
DECODES = ("device", "workers")  # where data.pipeline=gpu decodes its training images
FORMATS = ("folder", "shards")
CACHES = (None, "device")


def decodes_in_workers(d: dict[str, Any]) -> bool:
    """Whether the data section ``d`` has the loader workers decode (``data.decode: workers``; a run's saved config
    may predate the key)."""
    return d.get("decode", "device") == "workers"


def check_data_options(d: dict[str, Any]) -> None:
    """``data.source``, ``data.pipeline``, ``data.format``, ``data.cache``, ``data.decode`` and
    ``data.prefetch_priority`` are known values (and usable together);
    a synthetic source's counts are whole numbers from 1."""
    check_choice(d["source"], SOURCES, "data.source")
    check_choice(d["pipeline"], PIPELINES, "data.pipeline")
    check_choice(d["format"], FORMATS, "data.format")
    check_choice(d.get("cache"), CACHES, "data.cache")
    check_choice(d.get("decode", "device"), DECODES, "data.decode")
    check_choice(d.get("prefetch_priority", "low"), PREFETCH_PRIORITIES, "data.prefetch_priority")
    if decodes_in_workers(d) and (d["pipeline"] != "gpu" or d.get("cache") == "device"):
        raise ValueError(
            "data.decode=workers says where the gpu pipeline decodes its training images: it needs data.pipeline=gpu "
            "and no data.cache (or leave data.decode unset)"
        )
    if d["source"] == "synthetic":
        if d["format"] == "shards" or d.get("cache") == "device":
            raise ValueError(
                "data.source=synthetic reads no files (its images are made on the training device): "
                "data.format=shards and data.cache=device do not apply to it, leave them unset"
            )
        for key in ("synthetic_images", "synthetic_val_images", "synthetic_classes"):
            check_number(d[key], f"data.{key}", 1, integer=True)
    if d.get("cache") == "device" and (d["source"], d["pipeline"], d["format"]) != ("imagefolder", "gpu", "folder"):
        raise ValueError(
            "data.cache=device keeps the gpu pipeline's decoded images of an image folder: it needs "
            "data.pipeline=gpu and data.format=folder (or leave data.cache unset)"
        )
    if d["source"] == "digits" and (d["pipeline"], d["format"]) != ("cpu", "folder"):
        raise ValueError("data.source=digits is an in-memory set: it takes data.pipeline=cpu and data.format=folder")


def image_folder(root: str | Path, split: str, transform: Any, loader: Any = None) -> SafeImageFolder:
    """``root/split`` as a ``SafeImageFolder`` (``loader``: how a file is read, default PIL RGB), with errors that
    say what the layout must be."""
    folder = Path(root) / split
    layout = f"expected {Path(root)}/{split}/<class name>/<image files>"
    if not Path(root).is_dir():
        raise FileNotFoundError(f"data folder {root} does not exist: pass data.root=PATH ({layout})")
    if not folder.is_dir():
        raise FileNotFoundError(f"no '{split}' folder in {root}: {layout}{unpack_hint(folder)}")
    classes = [d for d in os.scandir(folder) if d.is_dir()]
    if not classes:
        raise FileNotFoundError(f"{folder} has no class sub-folders: {layout}")
    try:
        return SafeImageFolder(folder, transform=transform, loader=loader)
    except FileNotFoundError as err:  # torchvision: a class folder without any image file
        raise FileNotFoundError(f"{err}. Every class folder needs images with one of {IMG_EXTENSIONS}") from None


def _pretrained_cfg(cfg: dict) -> Any:
    """timm's pretrained cfg (mean, std, crop_pct) of the recipe's model, without building the model."""
    name = cfg["model"]["name"]
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODEL_NAMES)}")
    return timm.models.get_pretrained_cfg(name)


def norm_stats(cfg: dict) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel (mean, std) that a train recipe's images are normalised with (``data.in_chans`` values each):
    the digits' own statistics, else ``data.mean`` / ``data.std``, else the model's pretrained cfg."""
    d = cfg["data"]
    if d.get("source") == "digits":
        return DIGITS_MEAN * d["in_chans"], DIGITS_STD * d["in_chans"]
    pcfg = _pretrained_cfg(cfg) if not (d["mean"] and d["std"]) else None
    mean, std = tuple(d["mean"] or pcfg.mean), tuple(d["std"] or pcfg.std)
    if len(mean) != d["in_chans"] or len(std) != d["in_chans"]:
        raise ValueError(f"data.mean and data.std need {d['in_chans']} values each (data.in_chans): set both")
    return mean, std


def _synthetic(cfg: dict, length: int, img_size: int, device: torch.device | str, seed: int) -> SyntheticImages:
    """A synthetic set of ``length`` items at ``img_size`` on ``device`` over a pool of ``POOL_BATCHES`` training
    batches of images."""
    d = cfg["data"]
    pool = POOL_BATCHES * cfg["train"]["batch_size"]
    return SyntheticImages(length, pool, img_size, d["in_chans"], d["synthetic_classes"], device, seed)


def train_dataset(cfg: dict, device: torch.device | str = "cpu") -> Dataset:
    """Training set of a train recipe (``classify.train.DEFAULTS`` keys) at ``data.image_size``, augmented
    (``device``: where ``data.source: synthetic`` makes its images, the training device)."""
    d = cfg["data"]
    check_data_options(d)
    if d["source"] == "digits":
        return DigitsDataset("train", d["image_size"], d["in_chans"])
    if d["source"] == "synthetic":
        return _synthetic(cfg, d["synthetic_images"], d["image_size"], device, cfg["train"]["seed"])
    if d["root"] is None:
        raise ValueError(
            "data.root is not set: pass data.root=PATH (a folder with train/ and val/ ImageFolder splits), "
            "or run `lightvision classify train` without --config for the built-in digits default"
        )
    gpu = d["pipeline"] == "gpu"
    in_workers = gpu and decodes_in_workers(d)
    if d["pipeline"] == "cpu":
        tf = train_transform(cfg["aug"], d["image_size"], *norm_stats(cfg))
    else:
        tf = crop_transform(cfg["aug"], d["image_size"]) if d["pipeline"] == "hybrid" else None
    if d["format"] == "shards":
        decode = (decoded_shard_image if in_workers else checked_bytes) if gpu else decode_pil
        repeats, seed = cfg["aug"]["repeated_aug"], cfg["train"]["seed"]
        return ShardDataset(d["root"], d["train_split"], decode, train=True, repeats=repeats, transform=tf, seed=seed)
    loader = (read_decoded if in_workers else read_image_bytes) if gpu else None
    return image_folder(d["root"], d["train_split"], tf, loader=loader)


def val_dataset(
    cfg: dict,
    img_size: int,
    folder: str | Path | None = None,
    pipeline: str | None = None,
    device: torch.device | str | None = None,
) -> Dataset:
    """Validation set of a train recipe at ``img_size``.

    folder: evaluate another folder than ``data.root``: a root holding the val split, or the split folder
    itself (class sub-folders directly inside).
    pipeline: "cpu" or "hybrid" (transformed images) or "gpu" (encoded images, see :func:`device_batches`); None:
    the recipe's ``data.pipeline``.
    device: the training device, where ``data.source: synthetic`` makes its images (None: a synthetic recipe needs
    ``folder``)."""
    d = {"pipeline": "cpu", "format": "folder", **cfg["data"]}  # a run's saved config may predate these keys
    check_data_options(d)
    gpu = (pipeline or d["pipeline"]) == "gpu"
    if d["source"] == "synthetic" and folder is None:
        if device is None:
            raise ValueError(
                "this run was trained on synthetic images (data.source=synthetic), which have no validation set "
                "to evaluate on: pass --data PATH (a folder of class sub-folders)"
            )
        seed = cfg["train"]["seed"] + 1  # another pool than the training set's
        return _synthetic(cfg, d["synthetic_val_images"], img_size, device, seed)
    if d["source"] == "digits":
        if folder is not None:
            raise ValueError(
                f"this run was trained on the bundled digits (data.source=digits) and is evaluated on "
                f"their held-out split, not on {folder}: leave out --data"
            )
        return DigitsDataset("val", img_size, d["in_chans"])
    mean, std = norm_stats(cfg)
    tf = (
        None
        if gpu
        else eval_transform(
            img_size, d["crop_pct"] or _pretrained_cfg(cfg).crop_pct, cfg["aug"]["interpolation"], mean, std
        )
    )
    loader = read_image_bytes if gpu else None
    if folder is None:
        if d["root"] is None:
            raise ValueError(
                "no validation data: pass --data PATH (a folder of class sub-folders, or one holding "
                f"{d['val_split']}/)"
            )
        if d["format"] == "shards":
            return ShardDataset(
                d["root"], d["val_split"], checked_bytes if gpu else decode_pil, train=False, transform=tf
            )
        return image_folder(d["root"], d["val_split"], tf, loader)
    root = Path(folder)
    if (root / d["val_split"]).is_dir():
        return image_folder(root, d["val_split"], tf, loader)
    return image_folder(root.parent, root.name, tf, loader)


class DeviceBatches:
    """(images float [B, C, S, S], targets [B] or [B, classes]) on the labels' device from an encoded loader batch
    (:func:`~lightvision.classify.encoded.collate_encoded`): :meth:`decode`, then :meth:`augment`; the Trainer's
    prefetch runs the two ``stages`` on two threads, decoding one batch while the previous one is augmented.

    Args:
        transform: ``transform(images, labels) -> (inputs, targets)`` on decoded images, the ``batch`` method of a
            :mod:`~lightvision.classify.device_transforms` transform.
        skips: the dataset that counts undecodable images (``add_skipped``).
        packed: :meth:`decode` returns the batch's images as one
            :class:`~lightvision.kernels.resize.PackedImages` (each decoded file once), which the train transform's
            crop reads in place: the next stage then holds one device buffer instead of an image list (one
            ``record_stream``, no per-image host work there).
    """

    def __init__(self, transform: Any, skips: Any, packed: bool = False):
        self.transform, self.skips, self.packed = transform, skips, packed
        self.held: collections.deque[tuple[torch.cuda.Event, list[torch.Tensor]]] = collections.deque()
        self._output_stream: torch.cuda.Stream | None = None  # CUDA, packed: the decoded images' memory

    def decode(self, batch: dict[str, Any]) -> tuple[list[torch.Tensor] | PackedImages, torch.Tensor]:
        """uint8 [3, H_i, W_i] per image (``packed``: as one PackedImages) and labels [B], on the labels' device."""
        if not self.packed:
            return decode_batch(batch["images"], batch["labels"], skips=self.skips)
        device = batch["labels"].device
        if device.type == "cuda" and self._output_stream is None:
            self._output_stream = torch.cuda.Stream(device)
        images, labels = decode_batch(batch["images"], batch["labels"], self.skips, self._output_stream)
        packed = PackedImages.pack(images)
        self._hold(images, device)
        return packed, labels

    def _hold(self, images: list[torch.Tensor], device: torch.device) -> None:
        """Keep a CUDA batch's decoded images until the calling stream has copied them into the pack, without
        waiting for it: the batches held are let go once their copies are done. Their memory, that of a stream
        running nothing else, then goes back to nvjpeg (which writes on a stream of its own) with nothing queued
        on it."""
        if device.type != "cuda":
            return
        while self.held and self.held[0][0].query():
            self.held.popleft()
        copied = torch.cuda.Event()
        copied.record(torch.cuda.current_stream(device))
        self.held.append((copied, images))

    def augment(self, decoded: tuple[Any, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`decode`'s (images, labels) -> ``transform(images, labels)``."""
        return self.transform(*decoded)

    @property
    def stages(self) -> tuple[Any, Any]:
        return self.decode, self.augment

    def __call__(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.augment(self.decode(batch))


class HostBatches:
    """(images float [B, C, S, S], targets) on the labels' device from a batch of images kept on the host (a
    :func:`~lightvision.classify.cropped.collate_cropped` batch's ``HostImages``, or the packed images of
    ``data.decode: workers``): the images copied there (``images.on``: asynchronously from page-locked memory, on the
    calling thread's stream), then ``transform(images, labels)``, a ``DeviceTrainTransform``'s ``batch`` (made with
    ``cropped=True`` for cropped images)."""

    def __init__(self, transform: Callable[[Any, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]):
        self.transform = transform

    def __call__(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        labels = batch["labels"]
        return self.transform(batch["images"].on(labels.device), labels)


def device_batches(
    cfg: dict, dataset: Dataset, train: bool, img_size: int | None = None, mixup: DeviceMixup | None = None
) -> DeviceBatches | CachedBatches | HostBatches | None:
    """How a loader batch becomes (images float [B, C, S, S], targets) on the training device: None for
    ``data.pipeline: cpu`` and for ``hybrid``'s evaluation (the batch already is that); for ``gpu`` a
    :class:`DeviceBatches` with the DeiT train transform (``train``) or the eval transform at ``img_size`` (default
    ``data.image_size``); ``dataset`` counts the images that do not decode (``data.augment_graph``: the train
    augmentation replayed as a CUDA graph on CUDA); for ``hybrid`` training, and ``gpu`` training with
    ``data.decode: workers``, a :class:`HostBatches`.
    A :class:`~lightvision.classify.decoded.DecodedImages` ``dataset``
    (``data.cache: device``) gets a :class:`~lightvision.classify.decoded.CachedBatches` with the train transform; a
    :class:`~lightvision.classify.synthetic.SyntheticImages` one (either pipeline) gets one without a transform, its
    images being the model's input already.
    ``mixup`` (training): the batches come mixed, with soft targets (in the augmentation's own pass; a synthetic
    batch through ``mixup`` itself)."""
    d = cfg["data"]
    if isinstance(dataset, SyntheticImages):
        return CachedBatches(mixup, dataset)
    hybrid = d["pipeline"] == "hybrid" and train
    if d["pipeline"] != "gpu" and not hybrid:
        return None
    size = img_size or cfg["data"]["image_size"]
    mean, std = norm_stats(cfg)
    if train:
        graph = d.get("augment_graph", False)
        transform = DeviceTrainTransform(cfg["aug"], size, mean, std, graph=graph, cropped=hybrid, mixup=mixup)
        if hybrid or decodes_in_workers(d):
            return HostBatches(transform.batch)
        if isinstance(dataset, DecodedImages):
            return CachedBatches(transform.batch, dataset)
        return DeviceBatches(transform.batch, dataset, packed=True)
    crop_pct = d["crop_pct"] or _pretrained_cfg(cfg).crop_pct
    return DeviceBatches(DeviceEvalTransform(size, crop_pct, cfg["aug"]["interpolation"], mean, std).batch, dataset)


class _MappedLoader:
    """A loader whose batches go through ``fn`` (keeps ``len``)."""

    def __init__(self, loader: Any, fn: Callable[[Any], Any]):
        self.loader, self.fn = loader, fn

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        return (self.fn(batch) for batch in self.loader)


def make_train_loader(cfg: dict, dataset: Dataset, workers: int, pin_memory: bool) -> DataLoader:
    """The training DataLoader of a recipe: batches of ``train.batch_size`` (last one dropped), repeated
    augmentation through ``RepeatAugSampler`` for a folder (the shard reader repeats by itself), encoded batches
    for ``data.pipeline: gpu`` (packed decoded images with ``data.decode: workers``), cropped uint8 batches for
    ``hybrid``, (index, label) batches read in this process for
    images held on the device (:class:`~lightvision.classify.decoded.DeviceImages`: decoded or synthetic). The
    ``cpu`` and ``hybrid`` pipelines transform each sample with draws keyed by (``train.seed``, epoch, position)
    (:mod:`lightvision.engine.sample_draws`), so a resume replays them."""
    repeats = cfg["aug"]["repeated_aug"]
    iterable = isinstance(dataset, ShardDataset)
    sampler = build_repeat_sampler(dataset, repeats) if repeats > 1 and not iterable else None
    held = isinstance(dataset, DeviceImages)
    gpu_collate = collate_decoded if decodes_in_workers(cfg["data"]) else collate_encoded
    collate = {"gpu": gpu_collate, "hybrid": collate_cropped}.get(cfg["data"]["pipeline"]) if not held else None
    workers = 0 if held else workers
    if cfg["data"]["pipeline"] in ("cpu", "hybrid") and not (iterable or held):
        sampler = KeyedSampler(len(dataset), cfg["train"]["seed"], sampler)
        dataset = KeyedDraws(dataset)
    return DataLoader(
        dataset,
        batch_size=cfg["train"]["batch_size"],
        shuffle=sampler is None and not iterable,
        sampler=sampler,
        drop_last=True,
        num_workers=workers,
        pin_memory=pin_memory,
        persistent_workers=workers > 0,  # kept between epochs (shard workers read the epoch from shared memory)
        collate_fn=collate,
    )


def make_val_loader(
    cfg: dict,
    dataset: Dataset,
    batch_size: int,
    workers: int,
    pin_memory: bool,
    prepare: Callable[[Any], Any] | None = None,
    accelerator: Any = None,
) -> Any:
    """The validation loader (prepared by ``accelerator`` when given); with ``prepare`` (:func:`device_batches`)
    its batches are made on the device: decoded and transformed, or gathered from images held there (read in this
    process)."""
    held = isinstance(dataset, DeviceImages)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=False,
        num_workers=0 if held else workers,
        pin_memory=pin_memory,
        collate_fn=collate_encoded if prepare is not None and not held else None,
    )
    if accelerator is not None:
        loader = accelerator.prepare(loader)
    return _MappedLoader(loader, prepare) if prepare is not None else loader


def train_transform(aug: dict[str, Any], img_size: int, mean: tuple[float, ...], std: tuple[float, ...]) -> Any:
    """DeiT training transform (timm): RandomResizedCrop, flip, RandAugment, jitter, random erasing.

    ``aug["no_aug"]`` true: timm's ``no_aug`` training transform instead (resize the short side to ``img_size``,
    center-crop, normalise; nothing random), e.g. to compare runs image for image."""
    transform = create_transform(
        input_size=img_size,
        is_training=True,
        no_aug=bool(aug.get("no_aug", False)),
        scale=tuple(aug.get("scale", (0.08, 1.0))),
        auto_augment=aug.get("auto_augment") or None,
        color_jitter=aug.get("color_jitter", 0.3),
        interpolation=aug.get("interpolation", "bicubic"),
        re_prob=aug.get("reprob", 0.25),
        re_mode=aug.get("remode", "pixel"),
        re_count=aug.get("recount", 1),
        mean=mean,
        std=std,
    )
    for step in transform.transforms:  # RandAugment / AugMix keep .ops, AutoAugment a .policy of op lists
        for op in [*getattr(step, "ops", []), *(op for ops in getattr(step, "policy", []) for op in ops)]:
            if op.name.startswith("Posterize"):
                op.aug_fn = posterize
    return transform


def posterize(img: Image.Image, bits_to_keep: int, **_: Any) -> Image.Image:
    """Keep the ``bits_to_keep`` high bits of every channel value; 0 bits gives a black image.

    timm's posterize passes 0 bits (RandAugment's increasing posterize at magnitude 10) straight to Pillow, which
    rejects it (Pillow 13; 12.3 still took it); the GPU pipeline's posterize keeps 0 bits the same way."""
    if bits_to_keep >= 8:
        return img
    if bits_to_keep <= 0:
        return Image.new(img.mode, img.size)
    return ImageOps.posterize(img, bits_to_keep)


def eval_transform(
    img_size: int, crop_pct: float, interpolation: str, mean: tuple[float, ...], std: tuple[float, ...]
) -> Any:
    """Resize to img_size / crop_pct, center-crop img_size, normalise."""
    return create_transform(
        input_size=img_size, is_training=False, crop_pct=crop_pct, interpolation=interpolation, mean=mean, std=std
    )


def build_mixup(
    aug: dict[str, Any], num_classes: int, on_device: bool = False, graph: bool = True
) -> Mixup | DeviceMixup | None:
    """timm Mixup / CutMix with label smoothing, or None when both alphas are 0; ``on_device`` (``data.pipeline:
    gpu``): the same mix with its draws on the device (:class:`DeviceMixup`), replayed as a CUDA graph if ``graph``."""
    if aug.get("mixup", 0.0) <= 0 and aug.get("cutmix", 0.0) <= 0:
        return None
    kind = functools.partial(DeviceMixup, graph=graph) if on_device else Mixup
    return kind(
        mixup_alpha=aug.get("mixup", 0.0),
        cutmix_alpha=aug.get("cutmix", 0.0),
        prob=aug.get("mixup_prob", 1.0),
        switch_prob=aug.get("mixup_switch_prob", 0.5),
        label_smoothing=aug.get("smoothing", 0.1),
        num_classes=num_classes,
    )


def build_repeat_sampler(dataset: Dataset, num_repeats: int) -> RepeatAugSampler:
    """DeiT repeated augmentation: an epoch draws len(dataset) / num_repeats images, each num_repeats times
    (independently augmented). One global order; accelerate then deals its batches out to the processes,
    so the repeats of an image mostly share a batch (DeiT spreads them over GPUs; without batch norm the
    gradient is the same in expectation)."""
    return RepeatAugSampler(dataset, num_replicas=1, rank=0, shuffle=True, num_repeats=num_repeats)
