"""Encoded images for ``data.pipeline: gpu``: loader workers read file bytes only, the device decodes whole batches.

Workers return each image's bytes (checked cheaply: a known image signature, and a JPEG must end with its
end-of-image marker, so truncated files are skipped there like :class:`~lightvision.engine.data.SafeImageFolder`
skips them); ``collate_encoded`` packs a batch into one flat uint8 tensor (one shared-memory transfer per batch)
as :class:`EncodedImages` (page-locked by the loader's ``pin_memory`` on CUDA), which accelerate leaves on the
CPU (no ``.to``) while it moves the labels; a batch is the mapping ``{"labels": labels, "images": EncodedImages}``
(labels first: accelerate reads the batch size there).
:func:`decode_batch` then decodes the JPEGs of the batch (each file once, however many samples repeat it) in one
``torchvision.io.decode_jpeg`` call on the labels' device (nvjpeg on CUDA, libjpeg on CPU). When that call fails, each
JPEG is decoded alone on the device, and what still fails (CMYK JPEGs nvjpeg declines), like other formats (PNG, ...),
by ``torchvision.io.decode_image`` on the CPU; an image nothing decodes is skipped, counted, and its slot takes the next
good image of the batch (with its label), so the batch keeps its size.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torchvision.io import ImageReadMode, decode_image, decode_jpeg

__all__ = ["EncodedImages", "batch_labels", "check_image_bytes", "collate_encoded", "decode_batch", "read_image_bytes"]

JPEG_SOI = b"\xff\xd8\xff"
JPEG_EOI = b"\xff\xd9"
SIGNATURES = (JPEG_SOI, b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"RIFF", b"BM")
EOI_WINDOW = 4096  # bytes at the end of a JPEG searched for its end-of-image marker (trailing padding allowed)


def check_image_bytes(data: bytes, name: str) -> torch.Tensor:
    """``data`` as a uint8 [len] tensor; ValueError for an empty, unknown or truncated (JPEG without EOI) file."""
    if not data.startswith(SIGNATURES):
        raise ValueError(f"{name} is not a JPEG/PNG/GIF/WebP/BMP image (unknown file signature)")
    if data.startswith(JPEG_SOI) and JPEG_EOI not in data[-EOI_WINDOW:]:
        raise ValueError(f"{name} is truncated (the JPEG has no end-of-image marker)")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def read_image_bytes(path: str) -> tuple[torch.Tensor, str]:
    """ImageFolder ``loader`` of the gpu pipeline: (checked bytes uint8 [len], path)."""
    return check_image_bytes(Path(path).read_bytes(), path), path


@dataclass
class EncodedImages:
    """A batch of encoded images: ``data`` uint8 [sum of lengths] (the files back to back), ``lengths`` and
    ``names`` per image (file path or shard key, for warnings)."""

    data: torch.Tensor
    lengths: list[int]
    names: list[str]

    def __len__(self) -> int:
        return len(self.lengths)

    def tensors(self) -> list[torch.Tensor]:
        """Each image's bytes, uint8 [len] views (CPU)."""
        return list(self.data.split(self.lengths))

    def starts_with(self, marker: bytes, which: Sequence[int]) -> list[bool]:
        """Whether each image of ``which`` (indices) begins with ``marker``: one gather for the batch, not a slice
        and a host read per image."""
        if not which:
            return []
        lengths, index = torch.tensor(self.lengths), torch.tensor(list(which))
        starts, lengths = (lengths.cumsum(0) - lengths)[index], lengths[index]
        last = max(self.data.numel() - 1, 0)
        places = (starts[:, None] + torch.arange(len(marker))).clamp(max=last)
        heads = self.data[places] if self.data.numel() else torch.zeros(places.shape, dtype=torch.uint8)
        match = (heads == torch.tensor(list(marker), dtype=torch.uint8)).all(1) & (lengths >= len(marker))
        return match.tolist()

    def pin_memory(self) -> EncodedImages:
        """The batch in page-locked memory (the DataLoader's ``pin_memory`` calls this): nvjpeg then copies each
        image's bytes to the GPU without staging them through a pageable buffer first."""
        return EncodedImages(self.data.pin_memory(), self.lengths, self.names)


def batch_labels(items: Sequence[tuple[Any, int]]) -> torch.Tensor:
    """The labels of a batch's (sample, label) items: int64 [B] (the ``"labels"`` every collate here puts first:
    accelerate reads the batch size there)."""
    return torch.tensor([int(item[1]) for item in items], dtype=torch.long)


def collate_encoded(items: Sequence[tuple[tuple[torch.Tensor, str], int]]) -> dict[str, Any]:
    """DataLoader ``collate_fn`` of ``((bytes uint8 [len], name), label)`` items
    -> ``{"labels": int64 [B], "images": EncodedImages}``."""
    encoded = [item[0] for item in items]
    images = EncodedImages(torch.cat([e[0] for e in encoded]), [len(e[0]) for e in encoded], [e[1] for e in encoded])
    return {"labels": batch_labels(items), "images": images}


def _decode_one(data: torch.Tensor, device: torch.device) -> torch.Tensor:
    if data[:3].tolist() == list(JPEG_SOI):
        try:
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
        except RuntimeError:
            pass  # e.g. CMYK or progressive variants nvjpeg declines: the CPU decoder below reads them
    return decode_image(data, mode=ImageReadMode.RGB).to(device, non_blocking=True)


def decode_batch(
    images: EncodedImages, labels: torch.Tensor, skips: Any = None, output_stream: torch.cuda.Stream | None = None
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Decode a batch on ``labels.device``, each image once: samples of one name (DeiT's repeated augmentation puts
    an image's repeats in one batch) get the same decoded tensor.

    Args:
        images: the batch's encoded images (CPU).
        labels: int64 [B], on the device to decode on.
        skips: the dataset (``add_skipped(n)``) that counts undecodable images; None: not counted.
        output_stream: on CUDA, the stream whose memory the decoded images take. nvjpeg writes on a stream of its
            own, unordered with the calling stream, so it must not be handed memory that queued work still uses:
            None waits for the calling stream's queued work first; a stream that runs nothing else (the caller keeps
            each batch's images until its own stream has read them) needs no wait. The calling stream is ordered
            after it on return.
    Returns:
        (uint8 [3, H_i, W_i] per image on labels' device, labels [B]); undecodable images replaced by the next
        decodable one of the batch, with its label.
    """
    device, data = labels.device, images.tensors()
    first: dict[str, int] = {}
    origin = [first.setdefault(name, i) for i, name in enumerate(images.names)]  # each sample's first of its name
    distinct = list(first.values())
    jpeg = [i for i, is_jpeg in zip(distinct, images.starts_with(JPEG_SOI, distinct)) if is_jpeg]
    decoded: list[torch.Tensor | None] = [None] * len(data)
    calling = torch.cuda.current_stream(device) if device.type == "cuda" else None
    if jpeg and calling is not None and output_stream is None:
        calling.synchronize()
    own_stream = calling is not None and output_stream is not None
    with torch.cuda.stream(output_stream) if own_stream else contextlib.nullcontext():
        try:
            for i, img in zip(
                jpeg, decode_jpeg([data[i] for i in jpeg], mode=ImageReadMode.RGB, device=device) if jpeg else []
            ):
                decoded[i] = img
        except RuntimeError:  # one bad file fails the batched call: decode one by one below
            pass
        for i in distinct:
            if decoded[i] is None:
                try:
                    decoded[i] = _decode_one(data[i], device)
                except RuntimeError as err:
                    warnings.warn(f"skipping unreadable image {images.names[i]}: {err}", stacklevel=2)
    if own_stream:
        calling.wait_stream(output_stream)
    decoded = [decoded[j] for j in origin]
    failed = [i for i in range(len(data)) if decoded[i] is None]
    if not failed:
        return decoded, labels
    good = [i for i in range(len(data)) if decoded[i] is not None]
    if not good:
        raise ValueError(f"no image of the batch could be decoded (first: {images.names[0]}): check the data files")
    if skips is not None:
        skips.add_skipped(len(failed))
    source = [i if decoded[i] is not None else next((g for g in good if g > i), good[0]) for i in range(len(data))]
    index = torch.tensor(source, device=device)
    return [decoded[i] for i in source], labels[index]
