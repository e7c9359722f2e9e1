"""Triton kernels for LION / two-scan attention: flash-style masked form and chunked bidirectional scan.

Importing this package registers the kernels with the ops dispatch (``lightvision.ops._dispatch``):
``lion_attention``, ``lion_attention_qkvpacked`` and ``two_scan_attention`` then run on Triton for CUDA inputs
with ``backend="auto"``; ``lion_snake_attention`` runs each snake order through ``lion_attention``. See
:mod:`lightvision.kernels.lion.op` for the forms and what is supported.
"""

from lightvision.ops._dispatch import register_kernel

from .op import choose_form, lion_attention, lion_attention_qkvpacked, two_scan_attention

register_kernel("lion_attention", lion_attention)
register_kernel("lion_attention_qkvpacked", lion_attention_qkvpacked)
register_kernel("two_scan_attention", two_scan_attention)

__all__ = ["choose_form", "lion_attention", "lion_attention_qkvpacked", "two_scan_attention"]
