"""``data.pipeline: gpu`` with ``data.decode: workers``: the loader workers decode, the device crops and augments.

Each worker reads an image's bytes (checked as for the device decode,
:func:`~lightvision.classify.encoded.check_image_bytes`) and decodes them with torchvision's CPU decoder (libjpeg-turbo
for JPEGs; PNG and the rest as ``torchvision.io.decode_image`` reads them) into uint8 [3, H, W]; :func:`collate_decoded`
packs a batch's images back to back in one buffer (:class:`~lightvision.kernels.resize.PackedImages`), which the loader
page-locks and accelerate leaves on the host. The thread that prepares the batch copies it to the device in one transfer
on its own stream and runs the gpu pipeline's train transform on it: the random resized crop reads the packed buffer in
place, then the replayed augmentation. The device's share is then copies and a few batch-wide kernels, where nvjpeg's
decode waits for the work the training loop has queued on the GPU before it (benchmarks/README.md, "Why the decode
waits for the step"); the host's cores pay for the decode. Evaluation decodes on the device as ``data.decode: device``
does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torchvision.io import ImageReadMode, decode_image

from lightvision.classify.encoded import batch_labels, check_image_bytes, read_image_bytes
from lightvision.kernels.resize import PackedImages

__all__ = ["collate_decoded", "decode_on_host", "decoded_shard_image", "read_decoded"]


def decode_on_host(data: torch.Tensor, name: str) -> torch.Tensor:
    """Checked image bytes uint8 [len] -> uint8 [3, H, W] (RGB); what does not decode raises ValueError naming it."""
    try:
        return decode_image(data, mode=ImageReadMode.RGB)
    except RuntimeError as err:
        raise ValueError(f"{name} does not decode: {err}") from None


def read_decoded(path: str) -> tuple[torch.Tensor, str]:
    """ImageFolder ``loader``: (uint8 [3, H, W], path)."""
    data, name = read_image_bytes(path)
    return decode_on_host(data, name), name


def decoded_shard_image(data: bytes, key: str) -> tuple[torch.Tensor, str]:
    """``decode`` of a shard sample: (uint8 [3, H, W], key)."""
    return decode_on_host(check_image_bytes(data, key), key), key


def collate_decoded(items: Sequence[tuple[tuple[torch.Tensor, str], int]]) -> dict[str, Any]:
    """DataLoader ``collate_fn`` of ``((uint8 [3, H_i, W_i], name), label)`` items
    -> ``{"labels": int64 [B], "images": PackedImages}``."""
    return {"labels": batch_labels(items), "images": PackedImages.pack([image for (image, _), _ in items])}
