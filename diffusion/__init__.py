"""DiT-style latent diffusion on lightvision attention (installed as ``lightvision.diffusion``).

``create_model(name, input_size=32, in_channels=4, num_classes=1000, **kwargs)`` builds a registered DiT
(``{attention}_dit_{s|b|l|xl}_{2|4|8}``); ``GaussianDiffusion`` holds the schedule, losses and samplers.
Attributes load lazily so that ``lightvision --help`` does not import diffusers.
"""

from __future__ import annotations

_EXPORTS = {
    "DiT": "dit",
    "create_model": "dit",
    "model_names": "dit",
    "GaussianDiffusion": "gaussian",
    "SampleNoise": "gaussian",
    "sample_with_scheduler": "gaussian",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'lightvision.diffusion' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"lightvision.diffusion.{_EXPORTS[name]}"), name)
