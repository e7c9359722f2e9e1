"""Exponential moving average of model weights (fp32 shadow copy)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from lightvision.engine.checkpoint import unwrap_model


class ModelEma:
    """fp32 EMA of a model's parameters; buffers are copied. ``ema.module`` is a plain ``nn.Module``
    with the model's state-dict keys, saved as ``ema.safetensors`` and loadable into a fresh model."""

    def __init__(self, model: nn.Module, decay: float):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.module = copy.deepcopy(unwrap_model(model)).float().eval().requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """``ema = decay * ema + (1 - decay) * model`` for parameters; buffers are copied."""
        source = unwrap_model(model)
        ema_params = list(self.module.parameters())
        params = [p.detach().float() for p in source.parameters()]
        torch._foreach_lerp_(ema_params, params, 1.0 - self.decay)
        for ema_buffer, buffer in zip(self.module.buffers(), source.buffers()):
            ema_buffer.copy_(buffer)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.module.state_dict()

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.module.load_state_dict(state_dict, strict=True)
