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


def check_finite(loss: torch.Tensor | float, model: nn.Module | None, step: int, policy: str = "stop") -> bool:
    """True when ``loss`` and every gradient of ``model`` are finite.

    Otherwise ``policy="skip"`` returns False (the caller skips the optimizer step) and ``policy="stop"``
    raises :class:`NonFiniteError` naming the step and the parameters (and their module groups) with
    non-finite gradients. Pass ``model=None`` to check the loss only (fp16 with a grad scaler, whose
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
    parts = [f"non-finite training state at step {step}: loss={value}"]
    if bad:
        groups = sorted({_group(n) for n in bad})
        shown = ", ".join(bad[:10]) + (f", ... ({len(bad) - 10} more)" if len(bad) > 10 else "")
        parts.append(f"non-finite gradients in {len(bad)} parameter(s) of group(s) {', '.join(groups)}: {shown}")
    parts.append(
        "this state was not saved; resume from the last checkpoint with a lower learning rate or clip_grad, "
        "check the input data, or set nan_policy=skip"
    )
    raise NonFiniteError("; ".join(parts))
