"""DiT family (Peebles & Xie) with pluggable lightvision attention; a diffusers ``ModelMixin`` + ``ConfigMixin``.

    x [B, C, H, W] --patchify p--> tokens [B, N, D], grid (H/p, W/p)
      + fixed 2-D sin-cos position embedding (``pos_embed="sincos"``; recomputed for each grid, in the position
        unit ``pos_unit``: at another size, "image" measures coordinates in training-grid cells)
      + MD-TPE residual after the patch embedding (``tpe_placement="embed"``) or at the start of every block ("block");
        LightNet's MD-LRPE lives inside its attention
    c = TimestepEmbed(t) + LabelEmbed(y)                                   [B, D]
    block:  (shift1, scale1, gate1, shift2, scale2, gate2) = modulation(c)
            x = x + gate1 * Attn(LN(x) (1 + scale1) + shift1, grid)
            x = x + gate2 * FFN(LN(x) (1 + scale2) + shift2)
    head:   LN(x) (1 + scale) + shift -> Linear -> unpatchify -> [B, 2C, H, W]  (eps, variance interpolation v)

adaLN-Zero: every gate and the head start at zero, so each block starts as the identity. Two modulation sources:
``adaln="block"`` (DiT: a Linear(D, 6D) per block, FFN = GELU MLP, ratio 4) and ``adaln="shared"`` (LightNet-DiT: one
Linear(D, 6D) shared by all blocks plus a learned [6, D] offset per block, FFN = GLU of hidden 2/3 * 4D). The shared
form is how this code meets LightNet Table 13 (docs/spec.md 3): 18 / 18 / 36 / 42 LightNet layers of 12 D^2 weights each
have the parameter budget of DiT's 12 / 12 / 24 / 28 blocks of 18 D^2 only without a per-block Linear(D, 6D).
The paper does not spell out its conditioning path; this choice is ours.
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn as nn
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config

from lightvision.layers import (
    ATTENTION_KINDS,
    GLU,
    MDTPE,
    POS_UNITS,
    GeluMlp,
    ModulatedLayerNorm,
    PatchEmbed,
    build_attention,
    build_tpe,
    position_options,
    position_scale,
    sincos_pos_embed,
)
from lightvision.ops import gated_residual, rebuilt_in_backward
from lightvision.ops._checks import check_choice

# (depth, width, heads) per size; docs/spec.md 3.
DIT_SIZES = {"s": (12, 384, 6), "b": (12, 768, 12), "l": (24, 1024, 16), "xl": (28, 1152, 16)}
LIGHTNET_DIT_SIZES = {"s": (18, 384, 6), "b": (18, 768, 6), "l": (36, 1024, 16), "xl": (42, 1152, 16)}
PATCH_SIZES = (2, 4, 8)
POS_EMBEDS = ("sincos", "none")
# Position signals when the constructor leaves them unset (None): DiT's sin-cos embedding for softmax, LION and
# normalized attention (DiT's block as published, only the token mixer changes; its core has no position). LightNet
# adds to it a one-sided MD-TPE pair with short initial decays after the patch embedding: MD-TPE as the only absolute
# signal (the printed form) makes samples a plaid of row and column streaks; beside the sin-cos embedding this form
# keeps the likelihood gain without the plaid (CIFAR-10 DiT-S/2 position screen in benchmarks/README.md).
POSITION_DEFAULTS = {"pos_embed": "sincos", "tpe_placement": "none", "tpe_kwargs": {}}
LIGHTNET_POSITION_DEFAULTS = {
    "pos_embed": "sincos",
    "tpe_placement": "embed",
    "tpe_kwargs": {"form": "pair", "decay": [0.2, 0.6]},
}


class TimestepEmbedder(nn.Module):
    """t [B] -> [B, D]: sinusoidal features [cos(t w_i), sin(t w_i)], w_i = 10000^(-i/(F/2)), then
    Linear-SiLU-Linear."""

    def __init__(self, dim: int, freq_dim: int = 256):
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.freq_dim // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        angles = t.float()[:, None] * freqs[None]
        return self.mlp(torch.cat([angles.cos(), angles.sin()], dim=1).to(self.mlp[0].weight.dtype))


class DiTBlock(nn.Module):
    """Pre-norm residual [attention, FFN] with adaLN-Zero modulation; x [B, N, D], c [B, D] or shared [B, 6, D].
    The modulated norms and the gated residuals run as fused kernels on CUDA (``lightvision.ops.adaln``)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        attention: str,
        adaln: str,
        mlp_ratio: float,
        attention_kwargs: dict,
        ffn: str,
        tpe: MDTPE | None = None,
    ):
        super().__init__()
        self.tpe = tpe
        self.norm1 = ModulatedLayerNorm(eps=1e-6)
        self.attn = build_attention(attention, dim, num_heads, **attention_kwargs)
        self.norm2 = ModulatedLayerNorm(eps=1e-6)
        hidden = int(dim * mlp_ratio)
        if ffn == "glu":
            self.ffn = GLU(dim, int(round(hidden * 2 / 3 / 32)) * 32)
        else:
            self.ffn = GeluMlp(dim, hidden)
        self.adaln = adaln
        if adaln == "block":
            self.modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        else:
            self.modulation_offset = nn.Parameter(torch.zeros(6, dim))

    def forward(
        self, x: torch.Tensor, c: torch.Tensor, grid: tuple[int, int], pos_scale: tuple[float, float] | None = None
    ) -> torch.Tensor:
        # the shared form in the shared output's dtype, as the per-block Linear gives it: under autocast the fp32
        # offset would otherwise promote the gated residuals, and with them the residual stream, to fp32
        mod = (
            self.modulation(c).unflatten(1, (6, -1))
            if self.adaln == "block"
            else (c + self.modulation_offset).to(c.dtype)
        )
        shift1, scale1, gate1, shift2, scale2, gate2 = mod.unbind(1)  # [B, D] each
        if self.tpe is not None:
            x = self.tpe(x, grid, 0, pos_scale)
        h = self.norm1(x, shift1, scale1)
        with rebuilt_in_backward(h, self.norm1, x, shift1, scale1):
            a = self.attn(h, grid=grid, pos_scale=pos_scale)  # its projections keep no copy of h: rebuilt from x
        x = gated_residual(x, gate1, a)
        # the FFN recomputes the modulated norm in its backward instead of keeping its output
        return gated_residual(x, gate2, self.ffn(x, pre=partial(self.norm2, shift=shift2, scale=scale2)))


class DiT(ModelMixin, ConfigMixin):
    """Class-conditional diffusion transformer; ``model(x [B, C, H, W], t [B], y [B]) -> [B, 2C | C, H, W]``.

    ``num_classes`` real classes plus a null class (index ``num_classes``) used by label dropout
    (``class_dropout_prob`` in training) and classifier-free guidance; ``num_classes=0`` is unconditional.
    Any H, W divisible by ``patch_size`` works; ``input_size`` is the training size, the grid that image units of
    position refer to.

    Args (every one is a config entry, so each ablation is a ``model.args`` switch of the recipes, where
    ``attention_kwargs`` is written ``attn_kwargs`` as for the classifiers):
        input_size (32), patch_size (2), in_channels (4): latent size, patch p, latent channels.
        hidden_size (1152), depth (28), num_heads (16), mlp_ratio (4.0): width D, blocks, heads, FFN ratio.
        attention ("softmax"): one of ``ATTENTION_KINDS``.
        adaln (None: "shared" for lightnet, else "block"): per-block modulation Linear or one shared.
        ffn (None: "glu" for lightnet, else "mlp"): GELU MLP of ratio ``mlp_ratio`` or a GLU of the same parameters.
        class_dropout_prob (0.1), num_classes (1000), learn_sigma (True).
        attention_kwargs (None): options of the attention kind (``lightvision.layers.attention_options``), e.g.
            LightNet's lrpe ("per_axis" | "global" | "mixed" | "none"), key_softmax, norm, gate_rank.
        pos_embed (None: the family's default): "sincos" (fixed 2-D sin-cos added after the patch embedding) or "none".
        tpe_placement (None: the family's default): MD-TPE placement "none" | "embed" | "block" (``TPE_PLACEMENTS``).
        tpe_kwargs (None: the family's default): ``MDTPE`` options (form, combine, decay, norm, expand).
        pos_unit ("image"): what grid positions count at another latent size (``lightvision.layers.POS_UNITS``):
            "image" measures the sin-cos embedding, MD-TPE, MD-LRPE and LION decays in cells of the training grid
            (``input_size / patch_size``), "token" in patches of the grid at hand.
    The family defaults are ``POSITION_DEFAULTS`` / ``LIGHTNET_POSITION_DEFAULTS``; the resolved values (and the
    attention's position options, LION's ``decay_power``) are written back to the config, so a saved model rebuilds
    as it was trained.
    """

    @register_to_config
    def __init__(
        self,
        input_size: int = 32,
        patch_size: int = 2,
        in_channels: int = 4,
        hidden_size: int = 1152,
        depth: int = 28,
        num_heads: int = 16,
        mlp_ratio: float = 4.0,
        attention: str = "softmax",
        adaln: str | None = None,
        class_dropout_prob: float = 0.1,
        num_classes: int = 1000,
        learn_sigma: bool = True,
        attention_kwargs: dict | None = None,
        pos_embed: str | None = None,
        tpe_placement: str | None = None,
        tpe_kwargs: dict | None = None,
        ffn: str | None = None,
        pos_unit: str = "image",
    ):
        super().__init__()
        check_choice(attention, ATTENTION_KINDS, "attention")
        check_choice(pos_unit, POS_UNITS, "pos_unit")
        adaln = adaln or ("shared" if attention == "lightnet" else "block")
        check_choice(adaln, ("block", "shared"), "adaln")
        ffn = ffn or ("glu" if attention == "lightnet" else "mlp")
        check_choice(ffn, ("mlp", "glu"), "ffn")
        defaults = LIGHTNET_POSITION_DEFAULTS if attention == "lightnet" else POSITION_DEFAULTS
        pos_embed = pos_embed or defaults["pos_embed"]
        tpe_placement = tpe_placement or defaults["tpe_placement"]
        if tpe_kwargs is None:  # the family's MD-TPE options, unless there is no MD-TPE to take them
            tpe_kwargs = defaults["tpe_kwargs"] if tpe_placement != "none" else {}
        tpe_kwargs = dict(tpe_kwargs)
        check_choice(pos_embed, POS_EMBEDS, "pos_embed")
        attention_kwargs = {**position_options(attention), **(attention_kwargs or {})}
        self.register_to_config(
            adaln=adaln,
            ffn=ffn,
            pos_embed=pos_embed,
            tpe_placement=tpe_placement,
            tpe_kwargs=tpe_kwargs,
            attention_kwargs=attention_kwargs,
        )
        self.out_channels = 2 * in_channels if learn_sigma else in_channels
        self.patch_embed = PatchEmbed(input_size, patch_size, in_channels, hidden_size)
        self.tpe, block_tpes = build_tpe(tpe_placement, hidden_size, depth, tpe_kwargs)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.y_embedder = nn.Embedding(num_classes + 1, hidden_size)
        self.shared_modulation = (
            nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size)) if adaln == "shared" else None
        )
        self.blocks = nn.ModuleList(
            DiTBlock(hidden_size, num_heads, attention, adaln, mlp_ratio, attention_kwargs, ffn, block_tpe)
            for block_tpe in block_tpes
        )
        self.final_norm = ModulatedLayerNorm(eps=1e-6)
        if adaln == "block":
            self.final_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size))
        else:
            self.final_modulation_offset = nn.Parameter(torch.zeros(2, hidden_size))
        self.final_linear = nn.Linear(hidden_size, patch_size * patch_size * self.out_channels)
        self._init_weights()

    def _init_weights(self) -> None:
        """DiT init on the layers this class owns (attention layers keep their own init): xavier for the FFN and the
        patch projection, N(0, 0.02) for the embeddings, zeros for every modulation and the output head (adaLN-Zero)."""
        for block in self.blocks:
            if isinstance(block.ffn, GLU):
                block.ffn.xavier_init_()
            else:
                for m in block.ffn.modules():
                    if isinstance(m, nn.Linear):
                        nn.init.xavier_uniform_(m.weight)
                        if m.bias is not None:
                            nn.init.zeros_(m.bias)
            if block.adaln == "block":
                nn.init.zeros_(block.modulation[1].weight)
                nn.init.zeros_(block.modulation[1].bias)
        proj = self.patch_embed.proj
        nn.init.xavier_uniform_(proj.weight.view(proj.weight.shape[0], -1))
        nn.init.zeros_(proj.bias)
        nn.init.normal_(self.y_embedder.weight, std=0.02)
        for layer in (self.t_embedder.mlp[0], self.t_embedder.mlp[2]):
            nn.init.normal_(layer.weight, std=0.02)
        heads = [self.final_linear] + [
            m[1] for m in (self.shared_modulation, getattr(self, "final_modulation", None)) if m is not None
        ]
        for layer in heads:
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    @property
    def null_class(self) -> int:
        """Label index of the unconditional (dropped) class."""
        return self.config.num_classes

    def position_scale(self, grid: tuple[int, int]) -> tuple[float, float] | None:
        """Per-axis position scale at ``grid`` (``lightvision.layers.position``): training grid / grid in image units,
        None in token units or at the training grid."""
        side = self.config.input_size // self.config.patch_size
        return position_scale(grid, (side, side), self.config.pos_unit)

    def check_input_shape(self, shape: tuple[int, ...]) -> None:
        """Raise ValueError unless ``shape`` is [B, in_channels, H, W] with H and W divisible by the patch."""
        p, c = self.config.patch_size, self.config.in_channels
        if len(shape) != 4 or shape[1] != c:
            raise ValueError(f"expected latents [B, {c}, H, W], got {tuple(shape)}")
        if shape[2] % p or shape[3] % p:
            raise ValueError(f"latent size {tuple(shape[2:])} is not divisible by the patch size {p}")

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, C, H, W], t [B] (or scalar) timesteps, y [B] labels in [0, num_classes] (None, or any labels for an
        unconditional model: the null class)."""
        self.check_input_shape(tuple(x.shape))
        b = x.shape[0]
        t = torch.as_tensor(t, device=x.device).expand(b) if torch.as_tensor(t).ndim == 0 else t.to(x.device)
        if y is None or self.config.num_classes == 0:
            y = torch.full((b,), self.null_class, device=x.device, dtype=torch.long)
        if self.training and self.config.class_dropout_prob > 0:
            drop = torch.rand(b, device=x.device) < self.config.class_dropout_prob
            y = torch.where(drop, torch.full_like(y, self.null_class), y)
        tokens, grid = self.patch_embed(x)
        grid = tuple(grid)
        scale = self.position_scale(grid)
        if self.config.pos_embed == "sincos":
            tokens = tokens + sincos_pos_embed(tokens.shape[-1], grid, x.device, pos_scale=scale).to(tokens.dtype)
        if self.tpe is not None:
            tokens = self.tpe(tokens, grid, 0, scale)
        c = self.t_embedder(t) + self.y_embedder(y)
        cond = c if self.shared_modulation is None else self.shared_modulation(c).unflatten(1, (6, -1))
        for block in self.blocks:
            tokens = block(tokens, cond, grid, scale)
        if self.shared_modulation is None:
            shift, scale = self.final_modulation(c).unflatten(1, (2, -1)).unbind(1)
        else:
            shift, scale = (c[:, None] + self.final_modulation_offset).unbind(1)
        out = self.final_linear(self.final_norm(tokens, shift, scale))
        p, (h, w) = self.config.patch_size, grid
        out = out.view(b, h, w, p, p, self.out_channels).permute(0, 5, 1, 3, 2, 4)
        return out.reshape(b, self.out_channels, h * p, w * p)


def model_names() -> list[str]:
    """Every registered name ``{attention}_dit_{s|b|l|xl}_{2|4|8}``."""
    return [f"{kind}_dit_{size}_{p}" for kind in ATTENTION_KINDS for size in DIT_SIZES for p in PATCH_SIZES]


def size_preset(name: str) -> dict:
    """The DiT constructor arguments a registered name presets (its size, patch and attention).

    Args:
        name: ``{attention}_dit_{s|b|l|xl}_{2|4|8}``.

    Returns:
        {"depth", "hidden_size", "num_heads", "patch_size", "attention"} (docs/spec.md 3 sizes).
    """
    kind, sep, rest = name.rpartition("_dit_")
    size, _, patch = rest.partition("_")
    if (
        not sep
        or kind not in ATTENTION_KINDS
        or size not in DIT_SIZES
        or not patch.isdigit()
        or int(patch) not in PATCH_SIZES
    ):
        raise ValueError(
            f"unknown model {name!r}: expected {{attention}}_dit_{{s|b|l|xl}}_{{2|4|8}} with attention in "
            f"{sorted(ATTENTION_KINDS)}"
        )
    depth, width, heads = (LIGHTNET_DIT_SIZES if kind == "lightnet" else DIT_SIZES)[size]
    return {"depth": depth, "hidden_size": width, "num_heads": heads, "patch_size": int(patch), "attention": kind}


def create_model(name: str, input_size: int = 32, in_channels: int = 4, num_classes: int = 1000, **kwargs) -> DiT:
    """Build a registered DiT, e.g. ``create_model("lightnet_dit_xl_2")``.

    Args:
        name: ``{attention}_dit_{s|b|l|xl}_{2|4|8}`` (:func:`model_names`).
        input_size: latent side length (the model accepts any size divisible by the patch).
        in_channels: latent channels.
        num_classes: class labels (one more embedding row is the null class of classifier-free guidance).
        **kwargs: :class:`DiT` constructor arguments that override the preset (e.g. ``learn_sigma``,
            ``tpe_placement``).

    Returns:
        The :class:`DiT`, ``forward(x [B, C, H, W], t [B], y [B]) -> [B, C or 2C, H, W]``.
    """
    config = size_preset(name)
    config.update(kwargs)
    return DiT(input_size=input_size, in_channels=in_channels, num_classes=num_classes, **config)
