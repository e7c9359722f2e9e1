"""``data.pipeline: hybrid``: the loader workers decode and crop, the device augments.

The workers decode each image (PIL) and run timm's random resized crop and horizontal flip (:func:`crop_transform`,
with the cpu pipeline's per-sample draws keyed by seed, epoch and position, so a resume replays them); a batch
travels as one uint8 [B, 3, S, S] tensor, page-locked by the loader and kept on the host through accelerate's move
(:class:`HostImages`), so the thread that prepares the batch copies it to the device on its own stream while the
step runs. There :class:`~lightvision.classify.data.HostBatches` runs the rest of the DeiT transform
(:class:`~lightvision.classify.device_transforms.DeviceTrainTransform` with ``cropped=True``: RandAugment, colour
jitter where timm applies it, normalisation, random erasing; Mixup / CutMix follow on the device as with ``gpu``).

The decode and the crop, the host work of the gpu pipeline's nvjpeg call and its crop stage, run in parallel worker
processes; the device is left a batch of S x S images (about a quarter of the pixels of a 500 x 375 ImageNet photo)
and the augmentation that follows the crop. Evaluation runs the cpu pipeline's transform in the workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from timm.data import create_transform
from torchvision import transforms

from lightvision.classify.encoded import batch_labels

__all__ = ["HostImages", "collate_cropped", "crop_transform"]


def crop_transform(aug: dict[str, Any], img_size: int) -> Any:
    """The workers' transform: timm's random resized crop (``aug.scale``, ``aug.interpolation``) and horizontal flip
    of a PIL image, as uint8 [3, S, S] (timm's prefetcher form); with ``aug.no_aug`` timm's resize and centre crop."""
    common = dict(input_size=img_size, is_training=True, interpolation=aug.get("interpolation", "bicubic"))
    if aug.get("no_aug"):
        return create_transform(no_aug=True, use_prefetcher=True, **common)
    crop_flip, _, to_uint8 = create_transform(
        scale=tuple(aug.get("scale", (0.08, 1.0))), use_prefetcher=True, separate=True, **common
    )
    return transforms.Compose([*crop_flip.transforms, *to_uint8.transforms])


@dataclass
class HostImages:
    """A batch's cropped images uint8 [B, 3, S, S] on the host. Having no ``.to``, it stays there when accelerate
    moves the batch's labels; the loader's ``pin_memory`` page-locks it."""

    data: torch.Tensor

    def __len__(self) -> int:
        return len(self.data)

    def pin_memory(self) -> HostImages:
        return HostImages(self.data.pin_memory())

    def on(self, device: torch.device) -> torch.Tensor:
        """The images on ``device``: one copy, asynchronous from page-locked memory on the current stream."""
        return self.data.to(device, non_blocking=True)


def collate_cropped(items: Sequence[tuple[torch.Tensor, int]]) -> dict[str, Any]:
    """DataLoader ``collate_fn`` of (uint8 [3, S, S], label) items
    -> ``{"labels": int64 [B], "images": HostImages}``."""
    return {
        "labels": batch_labels(items),
        "images": HostImages(torch.stack([torch.as_tensor(img) for img, _ in items])),
    }
