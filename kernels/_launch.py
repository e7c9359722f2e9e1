"""Host helpers shared by the kernel families: output allocation (NaN-poisoned for tests), stride keywords, interpreter
detection and the GPU's SM count."""

from __future__ import annotations

import functools
import os

import torch

# Debug hook for tests and GPU checks: when True every kernel output and workspace starts as NaN (integers: their
# largest value), so an element a kernel fails to write shows up in the result.
POISON_OUTPUTS = False


def empty(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """torch.empty, or NaN-filled (integers: their largest value) while POISON_OUTPUTS is set."""
    t = torch.empty(shape, device=device, dtype=dtype)
    if not POISON_OUTPUTS:
        return t
    return t.fill_(float("nan") if dtype.is_floating_point else torch.iinfo(dtype).max)


def interpreting() -> bool:
    """True when Triton runs its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def program_runs(x: torch.Tensor, backend: str, covered: bool, needs: str, got: str | None = None) -> bool:
    """Whether a kernel family runs its Triton program on input ``x`` rather than its PyTorch reference, for
    ``backend``: "auto" where the inputs are ``covered`` and on CUDA, "triton" always (CUDA, or Triton's interpreter; a
    ValueError saying what the program ``needs`` and what it ``got``, by default x's dtype, shape and device, where it
    cannot), "torch" never."""
    if backend not in ("auto", "triton", "torch"):
        raise ValueError(f"backend must be 'auto', 'triton' or 'torch', got {backend!r}")
    got = got or f"{x.dtype} {list(x.shape)} on {x.device.type}"
    runnable = x.device.type == "cuda" or (backend == "triton" and interpreting())
    if backend == "triton" and not (covered and runnable):
        raise ValueError(f"backend='triton' needs {needs} on CUDA (or under TRITON_INTERPRET=1); got {got}")
    return backend != "torch" and covered and runnable


@functools.lru_cache(maxsize=16)
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 2 stand-in "SMs" elsewhere (the interpreter)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 2


@functools.cache
def _stride_names(prefix: str, name: str, dims: str) -> tuple[str, ...]:
    return tuple(f"{prefix}{name}{dim}" for dim in dims)


def strides(dims: str, prefix: str = "s_", **tensors: torch.Tensor) -> dict[str, int]:
    """Launch keywords ``<prefix><name><dim>`` for the leading ``len(dims)`` strides of each named tensor:
    ``strides("bhn", o=o)`` -> ``{"s_ob": o.stride(0), "s_oh": o.stride(1), "s_on": o.stride(2)}``."""
    out = {}
    for name, t in tensors.items():
        out.update(zip(_stride_names(prefix, name, dims), t.stride()))
    return out
