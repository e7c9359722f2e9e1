"""Durable file writes: fsync'd files and folders, atomic replace, sha256 digests."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

TMP_PREFIX = ".tmp-"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


FILE_MODE = 0o666 & ~_umask()  # what open() gives new files; safetensors writes 0600 files


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a file or folder (its entries) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync it."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically: readers see the old or the new content, never a mix."""
    path = Path(path)
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}-{os.getpid()}")
    try:
        write_durable(tmp, data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()
