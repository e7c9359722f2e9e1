"""The ``--device`` argument of the commands: "auto", "cpu", "cuda" or "cuda:N", checked before any work starts."""

from __future__ import annotations

import torch

__all__ = ["resolve_device"]


def resolve_device(device: str) -> str:
    """``"auto"`` -> ``"cuda"`` when a GPU is visible, else ``"cpu"``; "cpu" and "cuda[:N]" are returned as they are
    ("cuda" needs a visible GPU). Anything else, or "cuda" without a GPU, raises ValueError."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return device
    kind, colon, index = device.partition(":")
    if kind != "cuda" or (colon and not index.isdigit()):
        raise ValueError(f"--device must be auto, cpu, cuda or cuda:N, got {device!r}")
    if not torch.cuda.is_available():
        raise ValueError(f"--device {device} was asked for but no GPU is visible; use --device cpu (or auto)")
    return device
