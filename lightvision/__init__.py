"""lightvision: multi-dimensional vision and diffusion models on bidirectional linear attention.

Cores live in :mod:`lightvision.ops` (plain PyTorch references that are the spec, dispatching to
Triton kernels in :mod:`lightvision.kernels`), layers in :mod:`lightvision.layers`, model families in
:mod:`lightvision.classify` (DeiT, registered in timm) and :mod:`lightvision.diffusion` (DiT).

``import lightvision`` registers the DeiT models in timm: at once when timm is already imported, else the moment
it is (so ``import lightvision`` alone, e.g. for ``lightvision --help``, imports neither torch nor timm).
"""

__version__ = "0.1.0"


def _register_timm_models() -> None:
    import importlib

    importlib.import_module("lightvision.classify.deit")  # its @register_model entry points


from lightvision._import_hooks import after_import  # noqa: E402

after_import("timm", _register_timm_models)
