"""Kernel registry: how the plain PyTorch cores hand off to Triton kernels.

Contract for kernel packages (``lightvision.kernels.<family>``): on import, call
``register_kernel(op_name, fn)``. ``fn`` receives exactly the public function's arguments, the tensors
positionally and the rest by keyword, minus ``backend`` (e.g. ``fn(q, k, v, grid=..., num_prefix_tokens=...,
lrpe=..., causal=..., key_softmax=...)`` or ``fn(x, weight, gate, eps=...)``) and returns what the public
function returns. A kernel may return
``NotImplemented`` for a configuration it does not cover: with ``backend="auto"`` the reference then
runs, with ``backend="triton"`` a RuntimeError is raised.

Under ``torch.compile``, "auto" runs the reference of the ops in ``INDUCTOR_FUSES`` (RMSNorm, SiLU x mul): Inductor
fuses it with the residual adds and casts around it, which the opaque kernel cannot (one H100, DeiT-S training
under reduce-overhead, LightNet 4-6% more images/s at 224-1024 px: commit 235b8d0);
"triton" still takes the kernel's custom op. The other fused kernels stay faster than Inductor's code there.

Families are imported lazily, once, the first time an op asks for a kernel (or all at once by
``preload_kernels``, before torch.compile); an ImportError (no Triton, no GPU build) just means "no
kernel". Backends: "torch" = reference; "auto" = kernel when the inputs are on CUDA and one is
registered, else reference; "triton" = kernel required (any device; the kernel decides what it supports).
When "auto" falls back to the reference on CUDA (no kernel importable, or the kernel returned NotImplemented), a
warning says so once per op and reason (outside ``torch.compile`` tracing, which cannot emit it).
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable

import torch

from ._checks import BACKENDS, check_choice

_KERNELS: dict[str, Callable] = {}
_FAMILY = {
    "lightnet_attention": "lightvision.kernels.lightnet",
    "lightnet_attention_qkvpacked": "lightvision.kernels.lightnet",
    "lion_attention": "lightvision.kernels.lion",
    "lion_attention_qkvpacked": "lightvision.kernels.lion",
    "two_scan_attention": "lightvision.kernels.lion",
    "rms_norm": "lightvision.kernels.fused",
    "silu_mul": "lightvision.kernels.fused",
    "modulated_layer_norm": "lightvision.kernels.fused",
    "gated_residual": "lightvision.kernels.fused",
    "lion_feature_map": "lightvision.kernels.fused",
    "md_tpe": "lightvision.kernels.fused",
}
INDUCTOR_FUSES = frozenset({"rms_norm", "silu_mul"})
_IMPORTED: set[str] = set()
_IMPORT_ERRORS: dict[str, str] = {}
_WARNED: set[tuple] = set()


def warn_once(key: tuple, message: str) -> None:
    """``warnings.warn(message)`` the first time ``key`` is seen in this process (never while torch.compile traces)."""
    if torch.compiler.is_compiling() or key in _WARNED:  # compiling first: Dynamo then never reads the set
        return
    _WARNED.add(key)
    warnings.warn(message + " (shown once)", RuntimeWarning, stacklevel=4)


def _signature(args: tuple, kwargs: dict) -> tuple:
    """What distinguishes one unsupported call from another: tensor dtypes and the non-tensor arguments."""
    values = [*args, *kwargs.values()]
    return tuple(str(v.dtype) if isinstance(v, torch.Tensor) else repr(v) for v in values)


def register_kernel(op_name: str, fn: Callable) -> None:
    """Register ``fn`` as the Triton implementation of the public op ``op_name`` (replaces any earlier one)."""
    check_choice(op_name, tuple(_FAMILY), "op name")
    if not callable(fn):
        raise TypeError(f"register_kernel({op_name!r}, ...): fn must be callable, got {type(fn).__name__}")
    _KERNELS[op_name] = fn


def _import_family(family: str) -> None:
    """Import a kernel family once; an ImportError is kept (for error messages) and means "no kernel"."""
    if family not in _IMPORTED:
        _IMPORTED.add(family)
        try:
            importlib.import_module(family)
        except ImportError as err:
            _IMPORT_ERRORS[family] = f"{type(err).__name__}: {err}"


def get_kernel(op_name: str) -> Callable | None:
    """The registered kernel for ``op_name``, importing its kernel family on first use; None when absent."""
    check_choice(op_name, tuple(_FAMILY), "op name")
    if op_name not in _KERNELS:
        _import_family(_FAMILY[op_name])
    return _KERNELS.get(op_name)


def preload_kernels() -> None:
    """Import every kernel family now. ``torch.compile`` cannot trace the lazy import of a first call (each one was a
    graph break), so ``lightvision.engine.compile_model`` calls this before compiling."""
    for family in dict.fromkeys(_FAMILY.values()):
        _import_family(family)


def dispatch(op_name: str, backend: str, device: torch.device, args: tuple, kwargs: dict):
    """Run the kernel chosen by ``backend`` and return its result, or NotImplemented to run the reference."""
    check_choice(backend, BACKENDS, "backend")
    if backend == "torch" or (
        backend == "auto" and (device.type != "cuda" or (op_name in INDUCTOR_FUSES and torch.compiler.is_compiling()))
    ):
        return NotImplemented
    fn = get_kernel(op_name)
    if fn is None:
        failed = _IMPORT_ERRORS.get(_FAMILY[op_name])
        if backend == "triton":
            raise RuntimeError(
                f"{op_name}: backend='triton' but no Triton kernel is registered (importing "
                f"{_FAMILY[op_name]} did not call register_kernel({op_name!r}, ...)"
                f"{'; import failed: ' + failed if failed is not None else ''}"
                "); use backend='torch' or 'auto'"
            )
        warn_once(
            (op_name, "no kernel"),
            f"{op_name}: no Triton kernel is available"
            f"{' (' + failed + ')' if failed else ''}; backend='auto' runs the PyTorch reference on {device}",
        )
        return NotImplemented
    out = fn(*args, **kwargs)
    if out is NotImplemented:
        shapes = ", ".join(f"{tuple(a.shape)} {a.dtype}" for a in args if isinstance(a, torch.Tensor))
        if backend == "triton":
            raise RuntimeError(
                f"{op_name}: the registered Triton kernel does not support these arguments: {shapes}; "
                f"{kwargs_repr(kwargs)}"
            )
        warn_once(
            (op_name, "unsupported", *_signature(args, kwargs)),
            f"{op_name}: the Triton kernel does not cover this call ({shapes}; {kwargs_repr(kwargs)}); "
            f"backend='auto' runs the PyTorch reference on {device}",
        )
    return out


def kwargs_repr(kwargs: dict) -> str:
    """Compact repr of keyword arguments with tensors shown by shape."""
    return ", ".join(f"{k}={tuple(v.shape) if isinstance(v, torch.Tensor) else v!r}" for k, v in kwargs.items())
