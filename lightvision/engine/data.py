"""Data loading shared by classify and diffusion: one reader for image folders, and how many loader workers fit.

Every image folder (classification ``root/train``, ``root/val``, diffusion pixel training, ``extract-latents``) is
read by :class:`SafeImageFolder`: an image that cannot be decoded is skipped with a warning naming the file, the
next image takes its slot, and ``skipped_images()`` counts the skips across DataLoader workers. Readers that decode
a whole set at once (the FID images, the yardstick's CIFAR-10) use :func:`read_rgb` and :func:`warn_skipped`.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from torchvision.datasets import ImageFolder

__all__ = ["SafeImageFolder", "available_cpus", "loader_workers", "read_rgb", "warn_skipped"]

MAX_CONSECUTIVE_FAILURES = 50
UNREADABLE = (OSError, ValueError, SyntaxError)  # what PIL raises for a truncated or bad image file
FIRST_NAMED = 5  # skipped images named in a reader's warning


class SafeImageFolder(ImageFolder):
    """torchvision ``ImageFolder`` (``root/<class>/<image files>``) that skips undecodable images and counts them.

    The counter lives in shared memory, so ``skipped_images()`` sees the skips of every DataLoader worker.
    More than ``MAX_CONSECUTIVE_FAILURES`` failures in a row means the folder is not images: raises instead of
    looping. Items are (transform(loader(path)), class index); the default loader opens a PIL RGB image. Only the
    loader's errors skip an image: an error of the transform is raised.
    """

    def __init__(self, root: str | Path, transform: Any = None, loader: Any = None) -> None:
        super().__init__(str(root), transform=transform, **({"loader": loader} if loader is not None else {}))
        self._skipped = multiprocessing.Value("i", 0)

    def skipped_images(self) -> int:
        """How many unreadable images were skipped so far (all workers, and the device decoder)."""
        return self._skipped.value

    def add_skipped(self, n: int) -> None:
        """Count ``n`` more skipped images (an image found unreadable after loading, e.g. when decoded on the GPU)."""
        with self._skipped.get_lock():
            self._skipped.value += n

    def load(self, index: int) -> tuple[Any, int]:
        """(``loader(path)``, class index) of image ``index``, or of the next readable one."""
        for attempt in range(MAX_CONSECUTIVE_FAILURES):
            slot = (index + attempt) % len(self.samples)
            path, target = self.samples[slot]
            try:
                return self.loader(path), target
            except UNREADABLE as err:
                self.add_skipped(1)
                warnings.warn(f"skipping unreadable image {path}: {err}", stacklevel=2)
        raise ValueError(
            f"{MAX_CONSECUTIVE_FAILURES} unreadable images in a row near {path}: check that {self.root} "
            "holds image files (jpg/png/...) in one sub-folder per class"
        )

    def transformed(self, sample: Any, target: int) -> tuple[Any, int]:
        """A loaded item through ``transform`` and ``target_transform`` (their errors are raised: a failing
        transform is a bug to see, not an unreadable image to skip)."""
        if self.transform is not None:
            sample = self.transform(sample)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return sample, target

    def __getitem__(self, index: int) -> tuple[Any, int]:
        return self.transformed(*self.load(index))

    def load_each(self, indices: Iterable[int]) -> dict[int, tuple[Any, int]]:
        """:meth:`load` of each distinct index once (a batch with DeiT's repeated augmentation repeats its indices)."""
        return {i: self.load(i) for i in dict.fromkeys(indices)}

    def __getitems__(self, indices: list[int]) -> list[tuple[Any, int]]:
        """A batch's items (the DataLoader's batched fetch): a repeated index loaded once (:meth:`load_each`), each
        repeat transformed on its own (without a transform, the repeats share the item)."""
        loaded = self.load_each(indices)
        return [self.transformed(*loaded[i]) for i in indices]


def unpack_hint(folder: str | Path) -> str:
    """For a missing ``folder``: "; unpack ARCHIVE there first (tar -xf)" when a tar archive named like it lies
    beside it (e.g. cifar10-train-jpg.tar.gz for .../train), else ""."""
    folder = Path(folder)
    archives = sorted(a.name for a in folder.parent.glob(f"*{folder.name}*.tar*")) if folder.parent.is_dir() else []
    return f"; unpack {archives[0]} there first (tar -xf)" if archives else ""


def available_cpus() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one, else ``os.cpu_count()``)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def loader_workers(requested: int) -> int:
    """``requested`` DataLoader worker processes, at most one per available core (more only add start-up cost and
    PyTorch's "exceeds the maximum number of workers" warning)."""
    if requested < 0:
        raise ValueError(f"the number of data loader workers must be >= 0, got {requested}")
    return min(requested, available_cpus())


def read_rgb(source: str | Path | bytes) -> np.ndarray | None:
    """uint8 RGB [H, W, 3] of an image file (its path or its bytes); None when it cannot be decoded."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as img:
            return np.asarray(img.convert("RGB"))
    except UNREADABLE:
        return None


def warn_skipped(names: list[str], where: str | Path) -> None:
    """One warning for the unreadable images a reader of ``where`` skipped: how many, and the first few names."""
    if names:
        more = f" and {len(names) - FIRST_NAMED} more" if len(names) > FIRST_NAMED else ""
        warnings.warn(
            f"skipped {len(names)} unreadable image(s) in {where}: {', '.join(map(str, names[:FIRST_NAMED]))}{more}",
            stacklevel=2,
        )
