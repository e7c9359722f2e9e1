"""Fused one-scan LightNet attention in Triton (forward and backward), registered as a torch custom op."""
