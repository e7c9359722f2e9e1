"""``torch.compile`` for lightvision models: the trainers' ``train.compile`` and ``scripts/bench_models.py
--compile``."""

from __future__ import annotations

import torch
from torch import nn

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # the modes whose forward and backward replay CUDA graphs


def compile_setting(compile: bool, mode: str | None) -> bool | str:
    """A recipe's ``train.compile`` / ``train.compile_mode`` as the Trainer's ``torch_compile``: False, True (torch's
    default mode) or a mode name. A mode without ``compile`` or an unknown mode is one clear error."""
    if mode is None:
        return bool(compile)
    if mode not in COMPILE_MODES:
        raise ValueError(f"train.compile_mode must be one of {', '.join(COMPILE_MODES)} or null, got {mode!r}")
    if not compile:
        raise ValueError(f"train.compile_mode={mode} applies to a compiled model: set train.compile=true as well")
    return mode


def compile_model(model: nn.Module, mode: str | None = None) -> nn.Module:
    """``torch.compile(model, mode=mode)`` with Inductor's coalescing tiling analysis turned off.

    On torch 2.11 that analysis raises a TypeError (CantSplit) on the MD-TPE graph. It only chooses tilings, so turning
    it off changes no results. The lightvision kernels are custom ops, so they stay in the graph without a break; their
    families are imported first (``lightvision.ops.preload_kernels``), since the lazy import of a first call is not
    traceable.
    ``mode="reduce-overhead"`` replays the forward and the backward as CUDA graphs: one launch per graph instead of
    one per kernel, which takes the host's launch time out of small steps. The kernels keep no GPU tensors between
    calls under compile (the LightNet rotation tables are computed by the graph), so the graphs own all their memory.
    ``dynamic=False``: each input size (mixed-resolution training, ``aug.sizes``; evaluation at other sizes) gets a
    graph of its own with its grid and position scale as constants, instead of one graph with symbolic sizes.
    Checkpoints stay free of ``_orig_mod.`` prefixes (:func:`lightvision.engine.unwrap_model`).
    """
    import torch._inductor.config as inductor_config

    from lightvision.ops import preload_kernels

    preload_kernels()  # a kernel family's lazy import inside the traced code would break the graph

    if hasattr(inductor_config.triton, "coalesce_tiling_analysis"):
        inductor_config.triton.coalesce_tiling_analysis = False
    return torch.compile(model, mode=mode, dynamic=False)
