"""Non-finite loss / gradient guard."""

from __future__ import annotations

import math

import torch
from torch import nn

from lightvision.engine.checkpoint import unwrap_model

NAN_POLICIES = ("stop", "skip")


class NonFiniteError(FloatingPointError):
    """The loss or a gradient is NaN/inf and the policy is ``stop``."""


def _group(name: str) -> str:
    """Module group of a parameter name: ``blocks.3.attn.qkv.weight`` -> ``blocks.3``, ``head.weight`` -> ``head``."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 and parts[1].isdigit() else parts[0]


def nonfinite_grads(model: nn.Module) -> list[str]:
    """Names of parameters whose gradient holds NaN/inf (one device sync)."""
    named = [(n, p.grad) for n, p in unwrap_model(model).named_parameters() if p.grad is not None and p.grad.numel()]
    if not named:
        return []
    norms = torch.stack(torch._foreach_norm([g.detach() for _, g in named], ord=math.inf))
    bad = (~torch.isfinite(norms)).tolist()
    return [n for (n, _), b in zip(named, bad) if b]


def nonfinite_error(step: int, loss: float, bad: list[str]) -> NonFiniteError:
    """The error for a non-finite training state at ``step``: the loss, the parameters (and their module groups)
    whose gradients are not finite, and what to do."""
    parts = [f"non-finite training state at step {step}: loss={loss}"]
    if bad:
        groups = sorted({_group(n) for n in bad})
        shown = ", ".join(bad[:10]) + (f", ... ({len(bad) - 10} more)" if len(bad) > 10 else "")
        parts.append(f"non-finite gradients in {len(bad)} parameter(s) of group(s) {', '.join(groups)}: {shown}")
    parts.append(
        "this state was not saved; resume from the last checkpoint with a lower learning rate or clip_grad, "
        "check the input data, or set nan_policy=skip"
    )
    return NonFiniteError("; ".join(parts))


def check_finite(loss: torch.Tensor | float, model: nn.Module | None, step: int, policy: str = "stop") -> bool:
    """True when ``loss`` and every gradient of ``model`` are finite (the host waits for the device).

    Otherwise ``policy="skip"`` returns False (the caller skips the optimizer step) and ``policy="stop"``
    raises :func:`nonfinite_error`. Pass ``model=None`` to check the loss only (fp16 with a grad scaler, whose
    overflowing gradients are expected and handled by the scaler).
    """
    if policy not in NAN_POLICIES:
        raise ValueError(f"nan_policy must be one of {NAN_POLICIES}, got {policy!r}")
    value = float(loss)
    bad = nonfinite_grads(model) if model is not None else []
    if math.isfinite(value) and not bad:
        return True
    if policy == "skip":
        return False
    raise nonfinite_error(step, value, bad)


class FiniteWatch:
    """The first step whose loss or gradients are not finite, kept on the device, so that a training loop need not
    wait for the device at every step.

    :meth:`note` after each backward (a few device operations, no host synchronisation); :meth:`first` reads what
    was noted (one synchronisation): None, or (step, its loss, the parameters whose gradients were not finite).
    ``model`` None watches the loss only (fp16 with a grad scaler). The record lives in three device tensors that
    :meth:`note` updates in place, allocated at its first call, so that later calls can be captured in a CUDA graph
    (:mod:`lightvision.engine.graphed_update`).
    """

    def __init__(self, model: nn.Module | None):
        params = [] if model is None else unwrap_model(model).named_parameters()
        self._params = [(n, p) for n, p in params if p.requires_grad and p.numel()]  # an empty one has no bad values
        self._index: tuple[tuple[int, ...], torch.Tensor] | None = None  # positions of the present gradients
        self._first: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # step (-1: none), loss, flags

    @torch.no_grad()
    def note(self, loss: torch.Tensor, step: int | torch.Tensor) -> None:
        """Record ``step`` (an int, or a 0-d int64 tensor on the loss's device) if it is the first whose ``loss`` or
        gradients are not finite."""
        loss = loss.detach().float().reshape(())
        grads = [p.grad for _, p in self._params]
        if grads and all(g is not None for g in grads):  # the usual step: every parameter has its gradient
            flags = ~torch.isfinite(torch.stack(torch._foreach_norm(grads, ord=math.inf)))
        else:
            flags = torch.zeros(len(self._params), dtype=torch.bool, device=loss.device)
            present = [i for i, g in enumerate(grads) if g is not None]
            if present:
                key = tuple(present)
                if self._index is None or self._index[0] != key:
                    self._index = (key, torch.tensor(key, device=loss.device))
                norms = torch.stack(torch._foreach_norm([grads[i] for i in present], ord=math.inf))
                flags[self._index[1]] = ~torch.isfinite(norms)
        if self._first is None:
            device = loss.device
            self._first = (
                torch.full((), -1, dtype=torch.int64, device=device),
                torch.zeros((), device=device),
                torch.zeros(len(self._params), dtype=torch.bool, device=device),
            )
        first_step, first_loss, first_flags = self._first
        new = (~torch.isfinite(loss) | flags.any()) & (first_step < 0)
        first_step.copy_(torch.where(new, step, first_step))
        torch.where(new, loss, first_loss, out=first_loss)
        torch.where(new, flags, first_flags, out=first_flags)

    def first(self) -> tuple[int, float, list[str]] | None:
        if self._first is None:
            return None
        step, loss, flags = self._first
        if int(step) < 0:
            return None
        return int(step), float(loss), [n for (n, _), bad in zip(self._params, flags.tolist()) if bad]
