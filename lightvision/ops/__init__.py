"""Plain PyTorch attention cores: the executable specification (docs/spec.md sections 1-2).

Every public op takes [B, H, N, d] tensors like SDPA and dispatches to a Triton kernel when one is
registered (see :mod:`lightvision.ops._dispatch`: ``register_kernel`` / ``get_kernel``).
"""

from ._checks import check_grid
from ._dispatch import get_kernel, preload_kernels, register_kernel
from .adaln import gated_residual, modulated_layer_norm
from .heads import merge_heads, split_heads
from .lightnet import lightnet_attention, lightnet_attention_qkvpacked
from .lion import lion_attention, lion_attention_qkvpacked, lion_feature_map, lion_snake_attention, snake_permutation
from .md_lrpe import lrpe_angles, lrpe_group_sizes, md_lrpe
from .md_tpe import md_tpe, toeplitz_kernel
from .norm import rms_norm, silu_mul
from .normalized import normalized_attention
from .recompute import rebuilt_in_backward, recomputed_input_linear
from .softmax import softmax_attention
from .two_scan import two_scan_attention

__all__ = [
    "check_grid",
    "gated_residual",
    "get_kernel",
    "lightnet_attention",
    "lightnet_attention_qkvpacked",
    "lion_attention",
    "lion_attention_qkvpacked",
    "lion_feature_map",
    "lion_snake_attention",
    "lrpe_angles",
    "lrpe_group_sizes",
    "md_lrpe",
    "md_tpe",
    "merge_heads",
    "modulated_layer_norm",
    "normalized_attention",
    "preload_kernels",
    "rebuilt_in_backward",
    "recomputed_input_linear",
    "register_kernel",
    "rms_norm",
    "silu_mul",
    "snake_permutation",
    "softmax_attention",
    "split_heads",
    "toeplitz_kernel",
    "two_scan_attention",
]
