"""The ``optim.fused`` recipe key: the optimizer's update as one fused program per parameter group.

PyTorch's AdamW (Adam, SGD, Adagrad) updates on CUDA by default with ``foreach`` kernels: about ten multi-tensor
launches a step and a host read of each parameter's step count. ``fused=True`` does the same update in one program per
parameter group with the counts on the device, so the host spends less time on each step; where a compiled step is
short and the next batch is prepared beside it in the same process, that host time is the training loop's margin
(``benchmarks/README.md``, "Steady state on a 48,000-image set; the optimizer's fused update").

The choice is stored with the optimizer's parameter groups, so a resumed run keeps the form its checkpoint was written
with (``Optimizer.load_state_dict`` restores the groups), whatever ``optim.fused`` says on resume.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

__all__ = ["check_fused", "fused_kwargs"]


def _takes_fused(optimizer: Any) -> bool:
    """Whether ``optimizer`` (a class or a factory) has a ``fused`` argument."""
    try:
        return "fused" in inspect.signature(optimizer).parameters
    except (TypeError, ValueError):
        return False


def check_fused(fused: Any, optimizer: Any, name: str) -> None:
    """ValueError, naming ``optim.fused`` and what to set, for a value other than true, false or null, or for true
    with an ``optimizer`` (class or factory; ``name`` its recipe name) that has no fused form."""
    if fused not in (None, True, False):
        raise ValueError(f"optim.fused must be true, false or null, got {fused!r}")
    if fused and not _takes_fused(optimizer):
        raise ValueError(f"optim.fused=true: optimizer {name!r} has no fused form; set optim.fused to null or false")


def fused_kwargs(optimizer: Any, device: torch.device | str, fused: bool | None, name: str) -> dict[str, bool]:
    """The optimizer's keyword arguments for ``optim.fused``: ``{"fused": True}`` for True, or for None (the default)
    on CUDA where ``optimizer`` has a fused form; else {} (its own default, ``foreach`` on CUDA).

    Args:
        optimizer: the optimizer class or factory the arguments go to.
        device: the device the parameters live on.
        fused: the recipe's ``optim.fused`` (True, False or None).
        name: the optimizer's recipe name, for the error.
    Raises:
        ValueError: what :func:`check_fused` refuses.
    """
    check_fused(fused, optimizer, name)
    if fused is None:
        fused = _takes_fused(optimizer) and torch.device(device).type == "cuda"
    return {"fused": True} if fused else {}
