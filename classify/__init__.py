"""Image classifiers (DeiT family) on lightvision attention (installed as ``lightvision.classify``)."""
