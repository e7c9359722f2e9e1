"""The ``env`` block every GPU result file under ``benchmarks/results/`` carries, and the per-name loop of the
comparison drivers that write them."""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterable
from pathlib import Path

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


def run_each(names: Iterable[str], run: Callable[[str], dict], report: dict, path: str | Path) -> dict:
    """``report["results"][name] = run(name)`` for every name, in order; a failure becomes ``{"error": ...}`` so one
    failing name does not lose the others' numbers. ``report`` is written to ``path`` (JSON) and each result printed
    after every name. Returns ``report["results"]``."""
    results = report.setdefault("results", {})
    for name in names:
        try:
            results[name] = run(name)
        except Exception as err:  # noqa: BLE001 - recorded in the report, the loop goes on
            results[name] = {"error": f"{type(err).__name__}: {err}"}
        Path(path).write_text(json.dumps(report, indent=2, default=str))
        print(json.dumps({name: results[name]}, indent=2, default=str), flush=True)
    return results
