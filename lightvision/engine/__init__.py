"""Training infrastructure shared by classify and diffusion: config, checkpoints, guards, logging."""
