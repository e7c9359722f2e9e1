"""nn.Module layers on the attention cores; every attention layer is called as ``attn(x, grid, num_prefix_tokens)``."""
