"""Exponential moving average of model weights (fp32 shadow copy)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from lightvision.engine.checkpoint import unwrap_model


class ModelEma:
    """fp32 EMA of a model's parameters; buffers are copied. ``ema.module`` is a plain ``nn.Module``
    with the model's state-dict keys, saved as ``ema.safetensors`` and loadable into a fresh model.

    With ``warmup`` the decay at optimizer step s is ``min(decay, (1 + s) / (10 + s))``, so a short run's
    EMA follows the trained weights instead of staying near the initial ones (0.9999 is reached after
    about 90k steps; long runs are unaffected). The step comes from the caller, so resume stays exact."""

    def __init__(self, model: nn.Module, decay: float, warmup: bool = True):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.warmup = warmup
        self.module = copy.deepcopy(unwrap_model(model)).float().eval().requires_grad_(False)
        # (source model, EMA parameters, its parameters, (EMA buffer, its buffer) pairs, whether those parameters need
        # a cast to float32): gathered at the first update
        self._lists: tuple[nn.Module, list[torch.Tensor], list[torch.Tensor], list[tuple], bool] | None = None

    @torch.no_grad()
    def decay_at(self, step: int) -> float:
        """The decay used for the update after optimizer step ``step`` (0-based)."""
        return min(self.decay, (1 + step) / (10 + step)) if self.warmup else self.decay

    @torch.no_grad()
    def update(self, model: nn.Module, step: int) -> None:
        """``ema = d * ema + (1 - d) * model`` for parameters with d = ``decay_at(step)``; buffers are copied. The
        parameter and buffer lists are gathered at the first update from ``model`` (the optimizer updates its
        tensors in place), not walked again every step."""
        source = unwrap_model(model)
        if self._lists is None or self._lists[0] is not source:
            params = list(source.parameters())
            buffers = list(zip(self.module.buffers(), source.buffers()))
            cast = any(p.dtype != torch.float32 for p in params)
            self._lists = (source, list(self.module.parameters()), params, buffers, cast)
        _, ema_params, params, buffers, cast = self._lists
        if cast:
            params = [p.float() for p in params]
        torch._foreach_lerp_(ema_params, params, 1.0 - self.decay_at(step))
        for ema_buffer, buffer in buffers:
            ema_buffer.copy_(buffer)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.module.state_dict()

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.module.load_state_dict(state_dict, strict=True)
