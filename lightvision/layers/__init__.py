"""nn.Module layers on the attention cores; every attention layer is called as
``attn(x, grid, num_prefix_tokens, pos_scale)``."""

from .attention import (
    ATTENTION_KINDS,
    LightNetAttention,
    LionAttention,
    NormalizedAttention,
    SoftmaxAttention,
    build_attention,
    position_options,
)
from .mlp import GLU, GeluMlp
from .norm import ModulatedLayerNorm, RMSNorm
from .patch_embed import PatchEmbed
from .position import (
    POS_SIGNALS,
    POS_UNITS,
    TPE_PLACEMENTS,
    build_tpe,
    check_pos_unit,
    position_scale,
    signal_unit,
    sincos_pos_embed,
)
from .tpe import MDTPE, TPE_FORMS

__all__ = [
    "ATTENTION_KINDS",
    "GLU",
    "GeluMlp",
    "LightNetAttention",
    "LionAttention",
    "MDTPE",
    "ModulatedLayerNorm",
    "NormalizedAttention",
    "POS_SIGNALS",
    "POS_UNITS",
    "PatchEmbed",
    "RMSNorm",
    "SoftmaxAttention",
    "TPE_FORMS",
    "TPE_PLACEMENTS",
    "build_attention",
    "build_tpe",
    "check_pos_unit",
    "position_options",
    "position_scale",
    "signal_unit",
    "sincos_pos_embed",
]
