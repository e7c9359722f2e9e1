"""Image classifiers (DeiT family) on lightvision attention (installed as ``lightvision.classify``).

Modules: ``deit`` (the model family, registered in timm on ``import lightvision`` as
``{softmax|lightnet|lion_lit|lion_d|lion_s|lion_d_snake|lion_s_snake|normalized}_deit_{tiny|small|base}_patch16_224``),
``data`` (ImageFolder with the DeiT augmentation, bundled digits), ``train`` (recipe -> engine Trainer),
``evaluate`` (accuracy, images/s and peak memory at several resolutions), ``default`` (the built-in digits
job), ``cli`` (``lightvision classify train|eval``).
"""
