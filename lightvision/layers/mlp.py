"""Feed-forward layers: GLU of the LightNet block (docs/spec.md 1.4) and DiT's GELU MLP, both keeping their
hidden activation once for the backward, and taking the norm before them as ``pre``, recomputed in the backward
(``lightvision.ops.recomputed_input_linear``)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..ops import recomputed_input_linear, silu_mul


class GLU(nn.Module):
    """GLU(x) = W_3 (SiLU(x W_1) * (x W_2)), no biases; x [..., dim] -> [..., dim].

    W_1 and W_2 are one Linear ``w12`` (weight [W_1; W_2], [2 * hidden, dim]): one matmul reads x once, and the
    gated product (``lightvision.ops.silu_mul`` in its packed form, one fused Triton kernel each way on CUDA) reads
    the two halves of its output in place. For the backward only x W_1 | x W_2 is kept: W_3's weight gradient
    recomputes the gated product. State dicts with separate ``w1`` / ``w2`` (saved before the fusion)
    load into ``w12``.

    Args:
        dim: input and output width.
        hidden_dim: width of the gated hidden layer.

    Example:
        >>> GLU(32, 64)(torch.randn(2, 10, 32)).shape
        torch.Size([2, 10, 32])
    """

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w12 = nn.Linear(dim, 2 * hidden_dim, bias=False)
        self.w3 = nn.Linear(hidden_dim, dim, bias=False)
        self.register_load_state_dict_pre_hook(self._join_w1_w2)

    def forward(self, x: torch.Tensor, pre: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """x [..., dim] -> [..., dim]; ``pre``: an elementwise (per token) function of x applied first and recomputed
        in the backward instead of kept (a block's norm)."""
        h = self.w12(x) if pre is None else recomputed_input_linear(pre, x, self.w12.weight)
        return recomputed_input_linear(silu_mul, h, self.w3.weight)

    def xavier_init_(self) -> None:
        """Xavier-uniform init of W_1, W_2 and W_3 as three separate matrices (DiT's FFN init)."""
        for w in (*self.w12.weight.data.chunk(2), self.w3.weight.data):
            nn.init.xavier_uniform_(w)

    @staticmethod
    def _join_w1_w2(module, state_dict, prefix, *args) -> None:
        """Load hook: ``w1.weight`` and ``w2.weight`` of an older checkpoint become ``w12.weight``."""
        w1, w2 = prefix + "w1.weight", prefix + "w2.weight"
        if w1 in state_dict and w2 in state_dict and prefix + "w12.weight" not in state_dict:
            state_dict[prefix + "w12.weight"] = torch.cat([state_dict.pop(w1), state_dict.pop(w2)])


class GeluMlp(nn.Module):
    """fc2(GELU_tanh(fc1(x))), with biases: DiT's FFN, the state dict of timm's ``Mlp`` (fc1, fc2). Its backward
    recomputes the GELU for fc2's weight gradient, so it keeps the hidden activation once (fc1's output), not twice.

    Example:
        >>> GeluMlp(32, 128)(torch.randn(2, 10, 32)).shape
        torch.Size([2, 10, 32])
    """

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden_dim, dim)

    def forward(self, x: torch.Tensor, pre: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """x [..., dim] -> [..., dim]; ``pre`` as for ``GLU``."""
        h = self.fc1(x) if pre is None else recomputed_input_linear(pre, x, self.fc1.weight, self.fc1.bias)
        return recomputed_input_linear(self.act, h, self.fc2.weight, self.fc2.bias)
