"""lightvision: multi-dimensional vision and diffusion models on bidirectional linear attention.

Cores live in :mod:`lightvision.ops` (plain PyTorch references that are the spec, dispatching to
Triton kernels in :mod:`lightvision.kernels`), layers in :mod:`lightvision.layers`, model families in
:mod:`lightvision.classify` (DeiT, registered in timm) and :mod:`lightvision.diffusion` (DiT).
"""

__version__ = "0.1.0"

from lightvision.classify import deit as _deit  # noqa: E402, F401  registers the DeiT models in timm
