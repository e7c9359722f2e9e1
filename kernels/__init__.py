"""Triton kernels for the lightvision attention cores (installed as ``lightvision.kernels``)."""
