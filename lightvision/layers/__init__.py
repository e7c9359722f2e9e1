"""nn.Module layers on the attention cores; every attention layer is called as ``attn(x, grid, num_prefix_tokens)``."""

from .attention import ATTENTION_KINDS, LightNetAttention, LionAttention, SoftmaxAttention, build_attention
from .mlp import GLU
from .norm import ModulatedLayerNorm, RMSNorm
from .patch_embed import PatchEmbed
from .tpe import MDTPE

__all__ = [
    "ATTENTION_KINDS",
    "GLU",
    "LightNetAttention",
    "LionAttention",
    "MDTPE",
    "ModulatedLayerNorm",
    "PatchEmbed",
    "RMSNorm",
    "SoftmaxAttention",
    "build_attention",
]
