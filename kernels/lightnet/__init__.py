"""Fused one-scan LightNet attention in Triton (forward and backward), registered as a torch custom op.

Importing this package registers ``lightnet_attention_triton`` with the ops dispatch, so
``lightvision.ops.lightnet_attention(..., backend="auto")`` runs it on CUDA inputs.
Custom ops: ``torch.ops.lightvision.lightnet_attn_fwd`` (q, k, v, cos, sin, lrpe) -> (o, S, lse)
and ``torch.ops.lightvision.lightnet_attn_bwd``, and their packed-qkv twins ``lightnet_attn_packed_fwd`` / ``_bwd``
(``lightvision.ops.lightnet_attention_qkvpacked``); cos / sin are ``op.rotation_tables``. See ``op`` for the math
and the derivation of the backward.
"""

from lightvision.ops._dispatch import register_kernel

from .op import *  # noqa: F403  (the names of op.__all__)
from .op import __all__, lightnet_attention_qkvpacked_triton, lightnet_attention_triton  # noqa: F401  (re-exported)

register_kernel("lightnet_attention", lightnet_attention_triton)
register_kernel("lightnet_attention_qkvpacked", lightnet_attention_qkvpacked_triton)
