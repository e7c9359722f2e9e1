"""Plain PyTorch attention cores: the executable specification (SPEC sections 1-2)."""
