"""Fused pointwise kernels in Triton, forward and backward, registered as torch custom ops: RMSNorm with the
sigmoid output gate and SiLU x mul (GLU) of the LightNet layer; the modulated LayerNorm and the gated residual
of the DiT block's adaLN-Zero conditioning; LION's feature map phi; MD-TPE's Toeplitz mixing on 2-D grids.

Importing this package registers them with the ops dispatch, so ``lightvision.ops.rms_norm`` / ``silu_mul`` /
``modulated_layer_norm`` / ``gated_residual`` / ``lion_feature_map`` / ``md_tpe`` (backend="auto") run them on CUDA
inputs.
"""

from lightvision.ops._dispatch import register_kernel

from .adaln import gated_residual_triton, modulated_layer_norm_triton
from .feature_map import lion_feature_map_triton
from .md_tpe import md_tpe_triton
from .op import MAX_C, rms_norm_triton, silu_mul_triton

register_kernel("rms_norm", rms_norm_triton)
register_kernel("silu_mul", silu_mul_triton)
register_kernel("modulated_layer_norm", modulated_layer_norm_triton)
register_kernel("gated_residual", gated_residual_triton)
register_kernel("lion_feature_map", lion_feature_map_triton)
register_kernel("md_tpe", md_tpe_triton)

__all__ = [
    "MAX_C",
    "gated_residual_triton",
    "lion_feature_map_triton",
    "md_tpe_triton",
    "modulated_layer_norm_triton",
    "rms_norm_triton",
    "silu_mul_triton",
]
