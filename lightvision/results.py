"""The ``env`` block every GPU result file under ``benchmarks/results/`` carries."""

from __future__ import annotations

import datetime

import torch


def results_env(command: str) -> dict:
    """``{"gpu", "torch", "triton", "command", "date"}``: the hardware, versions, the producing command, UTC date."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "triton": triton_version,
        "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
