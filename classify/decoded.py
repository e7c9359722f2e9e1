"""``data.cache: device``: the training images decoded once and kept in the training device's memory.

For sets small enough to hold decoded (CIFAR-10: 50,000 x 3 x 32 x 32 uint8 = 150 MB). The image folder is read and
decoded once, as ``data.pipeline: gpu`` decodes a batch (loader workers read the bytes,
:func:`~lightvision.classify.encoded.decode_batch` decodes on the device, unreadable images are skipped and counted,
their slots hold the next good image with its label). From then on the training loader yields only
(index [B], label [B]) and :class:`CachedBatches` gathers the batch's images on the device and augments them with
the gpu pipeline's train transform: per epoch no file is read, no image decoded, no loader worker busy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from lightvision.classify.encoded import collate_encoded, decode_batch

__all__ = ["CachedBatches", "DecodedImages", "DeviceImages", "MEMORY_SHARE", "memory_limit"]

MEMORY_SHARE = 0.4  # the decoded images may take at most this share of a CUDA device's memory


def memory_limit(device: torch.device) -> float | None:
    """Bytes the decoded images may take on ``device``: ``MEMORY_SHARE`` of a CUDA device's memory; None (no limit)
    elsewhere."""
    if device.type != "cuda":
        return None
    return MEMORY_SHARE * torch.cuda.get_device_properties(device).total_memory


class DeviceImages(Dataset):
    """Images held in the training device's memory, for a loader of (index [B], label [B]) batches that
    :class:`CachedBatches` turns into images: item i is (i, label i). Subclasses set ``images`` (a tensor [N, ...] or a
    list of N tensors), ``labels`` int64 [N] on the device, ``targets`` (the labels as a host list) and ``classes``."""

    images: torch.Tensor | list[torch.Tensor]
    labels: torch.Tensor
    targets: list[int]
    classes: list[str]

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[int, int]:
        return index, self.targets[index]

    def gather(self, index: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        """The images at ``index`` [B]: a tensor [B, ...], or a list of B tensors when ``images`` is a list."""
        if isinstance(self.images, torch.Tensor):
            return self.images[index.to(self.images.device)]
        return [self.images[i] for i in index.tolist()]


class DecodedImages(DeviceImages):
    """An image folder decoded on ``device``; item i is (i, label i).

    Args:
        folder: a :class:`~lightvision.engine.data.SafeImageFolder` whose loader returns checked bytes
            (:func:`~lightvision.classify.encoded.read_image_bytes`).
        device: where the decoded images live (the training device).
        workers: loader workers reading the files; batch_size: images decoded per call; progress: show a bar.

    Raises a one-line ValueError when the decoded images pass ``MEMORY_SHARE`` of a CUDA device's memory.
    ``images`` is uint8 [N, 3, H, W] when every image has one size, else a list of uint8 [3, H_i, W_i];
    ``labels`` int64 [N] on the device; ``classes``, ``class_to_idx`` and ``skipped_images()`` are the folder's.
    """

    def __init__(self, folder: Any, device: torch.device, workers: int, batch_size: int = 256, progress: bool = True):
        self.folder, self.classes, self.class_to_idx = folder, folder.classes, folder.class_to_idx
        loader = DataLoader(folder, batch_size=batch_size, num_workers=workers, collate_fn=collate_encoded)
        images: list[torch.Tensor] = []
        labels = []
        limit = memory_limit(device)
        held = 0
        for batch in tqdm(loader, desc="decoding the training images once", disable=not progress, leave=False):
            decoded, batch_labels = decode_batch(batch["images"], batch["labels"].to(device), skips=folder)
            images += decoded
            labels.append(batch_labels)
            held += sum(img.numel() for img in decoded)
            if limit is not None and held > limit:
                raise ValueError(
                    f"data.cache=device: the decoded training images pass {limit / 2**30:.1f} GiB "
                    f"({MEMORY_SHARE:.0%} of {device}'s memory) after {len(images)} of {len(folder)} images: "
                    "leave data.cache unset for this data set"
                )
        self.labels = torch.cat(labels)
        self.targets = self.labels.tolist()  # on the host: items are read without a device round trip
        one_size = len({img.shape for img in images}) == 1
        self.images: torch.Tensor | list[torch.Tensor] = torch.stack(images) if one_size else images

    def describe(self) -> str:
        """Shape and size of the decoded images, for the log."""
        if isinstance(self.images, torch.Tensor):
            shape, size = list(self.images.shape), self.images.numel()
        else:
            shape, size = f"{len(self.images)} images, sizes vary", sum(t.numel() for t in self.images)
        return f"uint8 {shape}, {size / 2**20:.0f} MiB"

    def skipped_images(self) -> int:
        """Unreadable images skipped while decoding (counted once: the set is decoded once)."""
        return self.folder.skipped_images()


class CachedBatches:
    """(images [B, ...], targets) on the device from a loader batch (index [B], label [B]) of a
    :class:`DeviceImages`: the images at ``index`` and their labels, through ``transform(images, labels) -> (inputs,
    targets)`` when one is given (a ``DeviceTrainTransform``'s ``batch`` for decoded images, a ``DeviceMixup`` for
    images already in the model's form; None: as they are)."""

    def __init__(
        self, transform: Callable[[Any, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None, images: DeviceImages
    ):
        self.transform, self.images = transform, images

    def __call__(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        index, labels = batch
        images, labels = self.images.gather(index), labels.to(self.images.labels.device)
        return (images, labels) if self.transform is None else self.transform(images, labels)
