"""Replaying a fixed-shape function of device tensors as a CUDA graph, and constants kept on each device.

A function that issues the same launches whatever its inputs hold, and never waits for the host (no ``.item()``,
no branching on tensor values), is captured once per input shape and replayed: one launch instead of hundreds, so
the host's launch time no longer limits it. Its inputs are copied into the graph's own buffers, and its output is
copied out (the next replay overwrites the graph's).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["DeviceConstants", "GraphedCall"]

WARMUP_CALLS = 2  # eager calls on a side stream before capture (lazy initialisation stays out of the graph)


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", repr(fn))


class DeviceConstants:
    """Host tensors with a copy per device, made on first use (a graph cannot copy from host memory)."""

    def __init__(self, *tensors: torch.Tensor):
        self.tensors, self.copies = tensors, {}

    def get(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        if device not in self.copies:
            self.copies[device] = tuple(t.to(device) for t in self.tensors)
        return self.copies[device]


class GraphedCall:
    """``fn(*tensors) -> tensor or tuple of tensors`` captured as a CUDA graph per (shape, dtype, device) of its
    inputs and replayed; on other devices ``fn`` is called directly.

    ``fn`` must issue the same operations for any input values and never synchronise with the host. The capture is
    local to the calling thread (``capture_error_mode="thread_local"``), so a training step may run on another
    thread meanwhile. A capture that fails is reported in one warning and that shape runs op by op.
    """

    def __init__(self, fn: Callable[..., Any]):
        self.fn, self.graphs = fn, {}

    def __call__(self, *args: torch.Tensor) -> Any:
        if args[0].device.type != "cuda":
            return self.fn(*args)
        key = tuple((a.shape, a.dtype, a.device) for a in args)
        if key not in self.graphs:
            try:
                self.graphs[key] = self._capture(args)
            except RuntimeError as err:  # e.g. an operation CUDA cannot capture: run op by op, and say so
                message = f"CUDA graph capture of {_name(self.fn)} failed, running it op by op: {err}"
                warnings.warn(message, stacklevel=2)
                self.graphs[key] = None
        if self.graphs[key] is None:
            return self.fn(*args)
        graph, inputs, output = self.graphs[key]
        for buffer, arg in zip(inputs, args, strict=True):
            buffer.copy_(arg, non_blocking=True)
        graph.replay()
        return tuple(o.clone() for o in output) if isinstance(output, tuple) else output.clone()

    def _capture(self, args: tuple[torch.Tensor, ...]) -> tuple[torch.cuda.CUDAGraph, list[torch.Tensor], Any]:
        inputs = [a.clone() for a in args]
        current = torch.cuda.current_stream(args[0].device)
        side = torch.cuda.Stream(args[0].device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):
                self.fn(*inputs)
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            output = self.fn(*inputs)
        return graph, inputs, output
