"""Output folders of one-shot commands (sample, attention maps): a failed run leaves no empty folder behind."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def output_folder(path: str | os.PathLike) -> Iterator[Path]:
    """Create ``path`` (with its missing parents) for the body's outputs; when the body raises, remove again the
    folders this call created that are still empty, deepest first."""
    path = Path(path)
    created = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield path
    except BaseException:
        for folder in created:
            if any(folder.iterdir()):
                break
            folder.rmdir()
        raise
