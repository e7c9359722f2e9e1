"""How long the interpreter's garbage collector holds a training process: ``gc_ms`` in every log record.

A collection holds the interpreter lock while it walks the objects it tracks, so every thread of the process waits for
it: the training loop and the threads that prepare the next batch. ``torch.compile`` leaves hundreds of thousands of
long-lived objects, which a full collection walks in tenths of a second; the collector starts one once enough objects
have survived its younger generations.
"""

from __future__ import annotations

import gc
import time
from typing import Any

__all__ = ["GcPauses"]


class GcPauses:
    """Wall seconds of the collector's collections (every generation, whichever thread set them off) between reads,
    timed by ``gc.callbacks`` while entered."""

    def __init__(self) -> None:
        self._started: float | None = None
        self._seconds = 0.0

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._note)
        return self

    def __exit__(self, *exc: Any) -> None:
        gc.callbacks.remove(self._note)

    def _note(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self._seconds += time.perf_counter() - self._started
            self._started = None

    def take(self) -> float:
        """Seconds spent in collections since the last call (or since entering)."""
        seconds, self._seconds = self._seconds, 0.0
        return seconds
