"""Fused pointwise kernels of the LightNet layer in Triton: RMSNorm with the sigmoid output gate and
SiLU x mul (GLU), forward and backward, registered as torch custom ops.

Importing this package registers ``rms_norm_triton`` and ``silu_mul_triton`` with the ops dispatch, so
``lightvision.ops.rms_norm`` / ``silu_mul`` (backend="auto") run them on CUDA inputs.
"""

from lightvision.ops._dispatch import register_kernel

from .op import MAX_C, rms_norm_triton, silu_mul_triton

register_kernel("rms_norm", rms_norm_triton)
register_kernel("silu_mul", silu_mul_triton)

__all__ = ["MAX_C", "rms_norm_triton", "silu_mul_triton"]
