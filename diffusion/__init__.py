"""DiT-style latent diffusion on lightvision attention (installed as ``lightvision.diffusion``)."""
