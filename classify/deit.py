"""DeiT image classifiers with pluggable attention, registered in timm.

One family, eight token mixers (``lightvision.layers.build_attention`` kinds), three sizes::

    {attention}_deit_{tiny|small|base}_patch16_224
    attention in softmax, lightnet, lion_lit, lion_d, lion_s, lion_d_snake, lion_s_snake, normalized

``import lightvision`` registers the 24 names, so ``timm.create_model`` builds them like any timm model::

    model = timm.create_model("lightnet_deit_small_patch16_224", num_classes=10, img_size=32, patch_size=4)
    model = timm.create_model("lion_s_deit_tiny_patch16_224", pretrained=True, num_classes=10,
                              pretrained_cfg_overlay=dict(file="weights.safetensors", num_classes=10))

Local weights (``file``: safetensors or a torch state dict, e.g. ``<run>/checkpoints/best/ema.safetensors``)
go through ``checkpoint_filter_fn``: a softmax / LION-LIT position embedding is resampled to ``img_size``.
Put the file's class count in the overlay (timm's cfg says 1000); a different ``num_classes`` then drops
the head for fine-tuning.

Data flow: image [B, C, H, W] -> patch tokens [B, N, D] with grid (h, w) = (H / p, W / p), N = h * w ->
cls token prepended [B, 1 + N, D] -> blocks(x, grid, num_prefix_tokens=1) -> norm -> cls token (or mean of
the patch tokens) -> head [B, num_classes]. The grid travels with the tokens, so any image size divisible
by the patch (square or not) runs without touching the weights.

Per-attention architecture (``FAMILIES``):

* ``softmax``: DeiT as published: LayerNorm pre-norm, GELU MLP (ratio 4), learned absolute position
  embedding (cls row included); at another grid it is resampled bicubically on the fly, and
  ``set_input_size`` / checkpoint loading resample it once.
* ``lightnet`` (LightNet paper, Table 14 and Fig. 3, docs/spec.md 1.4): LightNet attention (one scan, MD-LRPE,
  low-rank output gate), GLU channel mixer, a fixed 2-D sin-cos position embedding and per-axis MD-LRPE. The
  paper puts MD-TPE after the patch embedding instead; on CIFAR-10 DeiT-T (4 epochs, evaluated at 32 / 48 / 64 px)
  sin-cos alone scored 60.7 / 46.1 / 28.1% top-1 against 59.1 / 42.1 / 29.0% with that MD-TPE, so MD-TPE is an
  option (``tpe_placement="embed"``, ``pos_embed="none"``: the family default of checkpoints that do not record
  their position settings, ``LEGACY_ARGS``). The paper does not name the block norm; we use RMSNorm (the
  TNL / HGRN2 line LightNet builds on). The GLU hidden width is 8/3 of the model width (same parameters as a
  ratio-4 MLP), which gives 5.80M / 22.15M / 87.21M against the paper's 6.0M / 22.64M / 87.74M (within 4%);
  heads are the paper's 6 / 16 / 16.
* ``lion_lit``: the LION-LIT ViT (linear attention, elu + 1, no mask) keeps DeiT's absolute position
  embedding: nothing else gives it position (LION paper, Table 12 row 5 and Sec. D.7).
* ``lion_d``, ``lion_s``, ``lion_d_snake``, ``lion_s_snake``: no absolute position embedding. Their decay
  masks carry relative position (LION paper Sec. 4 and D.7: "LION-S does not require any positional
  encodings"); the head reads the mean of every token (the LION authors' classifiers, ``global_pool="avg_all"``).
* ``normalized`` (normalized attention, Sieber et al. Eq. 21; ``lightvision.ops.normalized``): DeiT's block as
  published (LayerNorm, GELU MLP, learned absolute position embedding, heads 3 / 6 / 12), only the token mixer
  changes, so a comparison with ``softmax`` and ``lion_lit`` measures the attention alone. The core has no
  position signal of its own (like LION-LIT), hence the absolute embedding. The LayerNorm also keeps the normaliser
  in range: eta = exp(w^T u) reads the normed token u, whose length is set by the norm's affine parameters rather
  than by the residual stream's growth with depth, so the clamp of log eta is a guard, not a regime. The extra
  Linear(dim, heads) adds under 0.1% parameters.

Other sizes (``pos_unit``, docs/spec.md 1.8): the grid a model was built for (``img_size`` / patch, kept by
``set_input_size``) is its training grid, and by default every position signal counts in its cells: the sin-cos
embedding and MD-LRPE at coordinates times training grid / grid, MD-TPE and LION decays per step rescaled to cover
the same image fraction. So at 64 px a model trained at 32 px sees each object's parts where it learned them, as the
resampled learned embedding of softmax does; ``pos_unit="token"`` counts patches instead.

Sizes (docs/spec.md 3): depth 12; width 192 / 384 / 768; heads 3 / 6 / 12 (LightNet 6 / 16 / 16).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import timm
import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import DropPath, Mlp, resample_abs_pos_embed, trunc_normal_
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from torch import nn
from torch.utils.checkpoint import checkpoint

from lightvision.layers import (
    GLU,
    MDTPE,
    PatchEmbed,
    RMSNorm,
    build_attention,
    build_tpe,
    check_pos_unit,
    position_options,
    position_scale,
    signal_unit,
    sincos_pos_embed,
)
from lightvision.ops._checks import check_choice

__all__ = [
    "FAMILIES",
    "GLOBAL_POOLS",
    "LEGACY_ARGS",
    "MODEL_NAMES",
    "POS_EMBEDS",
    "SIZES",
    "Block",
    "DeiT",
    "attention_of",
    "check_model_name",
    "checkpoint_filter_fn",
    "create_deit",
    "create_from_config",
    "model_name",
    "recorded_args",
]


@dataclass(frozen=True)
class Family:
    """What changes with the attention kind besides the token mixer itself.

    norm: "layernorm" | "rmsnorm" (pre-norm of every block and the final norm).
    mlp: "gelu" (DeiT MLP, hidden = 4 * dim, with biases) | "glu" (GLU, hidden = 8/3 * dim, no biases).
    pos_embed: absolute position embedding, one of ``POS_EMBEDS``: "learned" (over cls + patch tokens, resampled to
        other grids), "sincos" (fixed 2-D sin-cos on the patch tokens, computed for every grid) or "none".
    tpe_placement: MD-TPE "none", once after the patch embedding ("embed") or at the start of every block ("block").
    heads: heads per size (tiny, small, base).
    global_pool: the head's input, one of ``GLOBAL_POOLS``.
    """

    norm: str
    mlp: str
    pos_embed: str
    tpe_placement: str
    heads: tuple[int, int, int] = (3, 6, 12)
    global_pool: str = "token"


POS_EMBEDS = ("learned", "sincos", "none")
# cls token, mean of the patch tokens, mean of every token with the cls token (the LION authors' classifiers), none
GLOBAL_POOLS = ("token", "avg", "avg_all", "")
_DEIT = Family(norm="layernorm", mlp="gelu", pos_embed="learned", tpe_placement="none")
# LION-D / S and the snake orders pool the mean of every token, as the LION authors' classifiers: on CIFAR-10 (DeiT-T,
# 200 epochs) it beat the cls token by 2.4-2.5 points at 32 px, and the cls token's reach along the raster decay
# shrinks on larger grids (benchmarks/results/classify_cifar10_resolution_table_h200x4_20261127.json)
_LION_MASKED = Family(norm="layernorm", mlp="gelu", pos_embed="none", tpe_placement="none", global_pool="avg_all")
FAMILIES: dict[str, Family] = {
    "softmax": _DEIT,
    "lightnet": Family(norm="rmsnorm", mlp="glu", pos_embed="sincos", tpe_placement="none", heads=(6, 16, 16)),
    "lion_lit": _DEIT,
    "lion_d": _LION_MASKED,
    "lion_s": _LION_MASKED,
    "lion_d_snake": _LION_MASKED,
    "lion_s_snake": _LION_MASKED,
    "normalized": _DEIT,
}
# Settings whose default changed, as checkpoints written before the change were built; those checkpoints do not
# record them (``create_from_config`` fills them in, ``recorded_args`` records them from now on): LightNet's position
# signals, and the head's pooling of every family (the cls token until LION-D / S took the mean of every token).
LEGACY_ARGS: dict[str, dict[str, str]] = {
    **{attention: {"global_pool": "token"} for attention in FAMILIES},
    "lightnet": {"pos_embed": "none", "tpe_placement": "embed", "global_pool": "token"},
}
SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(depth=12, embed_dim=192),
    "small": dict(depth=12, embed_dim=384),
    "base": dict(depth=12, embed_dim=768),
}


def model_name(attention: str, size: str) -> str:
    """The timm name of one registered model, e.g. ``lightnet_deit_small_patch16_224``."""
    return f"{attention}_deit_{size}_patch16_224"


def attention_of(name: str) -> str:
    """The attention kind of a registered name: ``model_name``'s inverse for the attention part."""
    return name.split("_deit_")[0]


MODEL_NAMES = [model_name(a, s) for a in FAMILIES for s in SIZES]


def _norm_layer(kind: str, dim: int) -> nn.Module:
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=1e-6)
    if kind == "rmsnorm":
        return RMSNorm(dim)
    raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {kind!r}")


def _glu_hidden(dim: int) -> int:
    """8/3 * dim rounded up to a multiple of 8: a GLU with the parameters of a ratio-4 MLP."""
    return 8 * math.ceil(8 * dim / 3 / 8)


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm1(x)), then x + mlp(norm2(x)); [B, N, D] -> [B, N, D]."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        attention: str,
        *,
        norm: str,
        mlp: str,
        mlp_ratio: float = 4.0,
        proj_drop: float = 0.0,
        drop_path: float = 0.0,
        attn_kwargs: dict[str, Any] | None = None,
        tpe: MDTPE | None = None,
    ) -> None:
        super().__init__()
        self.tpe = tpe
        self.norm1 = _norm_layer(norm, dim)
        self.attn = build_attention(attention, dim, num_heads, **(attn_kwargs or {}))
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = _norm_layer(norm, dim)
        if mlp == "gelu":
            self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU, drop=proj_drop)
        elif mlp == "glu":
            self.mlp = GLU(dim, _glu_hidden(dim))
        else:
            raise ValueError(f"mlp must be 'gelu' or 'glu', got {mlp!r}")
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(
        self,
        x: torch.Tensor,
        grid: tuple[int, int],
        num_prefix_tokens: int,
        pos_scale: tuple[float, float] | None = None,
    ) -> torch.Tensor:
        """x [B, num_prefix_tokens + h * w, D], grid (h, w), its position scale -> [B, num_prefix_tokens + h * w, D]."""
        if self.tpe is not None:
            x = self.tpe(x, grid, num_prefix_tokens, pos_scale)
        attn = self.attn(self.norm1(x), grid=grid, num_prefix_tokens=num_prefix_tokens, pos_scale=pos_scale)
        x = x + self.drop_path1(attn)
        return x + self.drop_path2(self.mlp(self.norm2(x)))


class DeiT(nn.Module):
    """DeiT classifier (cls token, pre-norm blocks) with any lightvision attention as the token mixer.

    Args:
        img_size: nominal input size (int or (H, W)); sets the absolute position embedding grid of the
            families that have one. Any size divisible by ``patch_size`` runs at forward time.
        patch_size: square patch side p; the grid is (H / p, W / p).
        in_chans: image channels.
        num_classes: classifier outputs; 0 gives no head (``forward`` returns pooled features).
        global_pool: "token" (cls token, DeiT), "avg" (mean of the patch tokens), "avg_all" (mean of every token,
            cls included: the LION authors' classifiers) or "" (no pooling); None: the family's ("avg_all" for
            LION-D / S and the snake orders, "token" for the others).
        attention: one of ``FAMILIES`` (the ``build_attention`` kinds).
        embed_dim, depth, num_heads: width D, number of blocks, attention heads.
        mlp_ratio: hidden / D of the GELU MLP (GLU families use 8/3).
        drop_rate: dropout after the position embedding and before the head.
        proj_drop_rate: dropout inside the GELU MLP.
        drop_path_rate: stochastic depth, linearly increasing over the blocks up to this value.
        attn_kwargs: extra keyword arguments for ``build_attention`` (the kind's ablation switches, e.g. LightNet's
            lrpe "per_axis" | "global" | "mixed" | "none", key_softmax, norm, gate_rank).
        pos_embed: absolute position embedding "learned" | "sincos" | "none" (None: the family's, ``FAMILIES``).
        pos_unit: what grid positions count, ``lightvision.layers.POS_UNITS``: "image" (default: coordinates in units
            of the training grid ``pos_grid``, so the sin-cos embedding, MD-LRPE angles, MD-TPE and LION decays give
            a token the code of its place in the image at any input size, as the resampled learned embedding does)
            or "token" (integer patch coordinates at every size). At the training size the two are the same model.
            A mapping of ``POS_SIGNALS`` to units (``{"embed": "token"}``: the absolute embedding in token units,
            the blocks' signals in image units) measures which signal loses accuracy at another size.
        pos_grid: the training grid (h, w) that image units refer to; None: the grid of ``img_size``.
            ``set_input_size`` keeps it (the weights were trained on it).
        tpe_placement: MD-TPE "none" | "embed" | "block" (None: the family's).
        tpe_kwargs: ``MDTPE`` options (form, combine, decay, norm, expand).
    """

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str | None = None,
        attention: str = "softmax",
        embed_dim: int = 192,
        depth: int = 12,
        num_heads: int = 3,
        mlp_ratio: float = 4.0,
        drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        attn_kwargs: dict[str, Any] | None = None,
        pos_embed: str | None = None,
        pos_unit: str | dict[str, str] = "image",
        pos_grid: tuple[int, int] | None = None,
        tpe_placement: str | None = None,
        tpe_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        check_pos_unit(pos_unit)
        if attention not in FAMILIES:
            raise ValueError(f"attention must be one of {sorted(FAMILIES)}, got {attention!r}")
        family = FAMILIES[attention]
        global_pool = family.global_pool if global_pool is None else global_pool
        check_choice(global_pool, GLOBAL_POOLS, "global_pool")
        self.pos_embed_kind = pos_embed or family.pos_embed
        check_choice(self.pos_embed_kind, POS_EMBEDS, "pos_embed")
        self.attention = attention
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.num_prefix_tokens = 1
        self.grad_checkpointing = False

        self.patch_embed = PatchEmbed(img_size=img_size, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim)
        self.patch_size = patch_size
        self.img_size = _pair(img_size)
        self._check_size(self.img_size)
        self.pos_unit = pos_unit
        self.pos_grid = self.grid_size(self.img_size) if pos_grid is None else _pair(pos_grid)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        if self.pos_embed_kind == "learned":
            grid = self.grid_size(self.img_size)
            self.pos_embed = nn.Parameter(torch.zeros(1, self.num_prefix_tokens + grid[0] * grid[1], embed_dim))
        else:
            self.pos_embed = None
        self.pos_drop = nn.Dropout(drop_rate)
        self.tpe, block_tpes = build_tpe(tpe_placement or family.tpe_placement, embed_dim, depth, tpe_kwargs)

        dpr = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]
        self.blocks = nn.ModuleList(
            Block(
                embed_dim,
                num_heads,
                attention,
                norm=family.norm,
                mlp=family.mlp,
                mlp_ratio=mlp_ratio,
                proj_drop=proj_drop_rate,
                drop_path=dpr[i],
                attn_kwargs=attn_kwargs,
                tpe=block_tpes[i],
            )
            for i in range(depth)
        )
        self.norm = _norm_layer(family.norm, embed_dim)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self._init_weights()
        self.feature_info = [dict(module=f"blocks.{i}", num_chs=embed_dim, reduction=patch_size) for i in range(depth)]

    def _init_weights(self) -> None:
        """DeiT init for the tensors this class owns; layers keep their own init (MD-TPE's zero projection)."""
        trunc_normal_(self.cls_token, std=0.02)
        if self.pos_embed is not None:
            trunc_normal_(self.pos_embed, std=0.02)
        for blk in self.blocks:
            if isinstance(blk.mlp, Mlp):
                for fc in (blk.mlp.fc1, blk.mlp.fc2):
                    trunc_normal_(fc.weight, std=0.02)
                    nn.init.zeros_(fc.bias)
        if isinstance(self.head, nn.Linear):
            trunc_normal_(self.head.weight, std=0.02)
            nn.init.zeros_(self.head.bias)

    # ----------------------------------------------------------------------------------- resolution
    def grid_size(self, img_size: tuple[int, int]) -> tuple[int, int]:
        """Patch grid (h, w) of an image of size (H, W)."""
        return img_size[0] // self.patch_size, img_size[1] // self.patch_size

    def _check_size(self, img_size: tuple[int, int]) -> None:
        h, w = img_size
        if h % self.patch_size or w % self.patch_size:
            p = self.patch_size
            raise ValueError(
                f"image size {h}x{w} is not divisible by the patch size {p}: resize or crop the images to a "
                f"multiple of {p} (e.g. {max(p, h // p * p)}x{max(p, w // p * p)})"
            )

    def position_scale(self, grid: tuple[int, int], signal: str = "blocks") -> tuple[float, float] | None:
        """Per-axis position scale at ``grid`` of one of ``POS_SIGNALS``: training grid / grid in image units, None in
        token units or at the training grid (``lightvision.layers.position``)."""
        return position_scale(grid, self.pos_grid, signal_unit(self.pos_unit, signal))

    def _pos_embed_for(self, grid: tuple[int, int]) -> torch.Tensor:
        """The absolute position embedding [1, 1 + h * w, D] for ``grid`` (bicubic resample if needed)."""
        stored = self.grid_size(self.img_size)
        if grid == stored:
            return self.pos_embed
        return resample_abs_pos_embed(
            self.pos_embed, new_size=list(grid), old_size=list(stored), num_prefix_tokens=self.num_prefix_tokens
        )

    def set_input_size(self, img_size: int | tuple[int, int]) -> None:
        """Make ``img_size`` the nominal size: resamples the learned position embedding once (no-op without one); the
        training grid of image units (``pos_grid``) stays."""
        img_size = _pair(img_size)
        self._check_size(img_size)
        if self.pos_embed is not None:
            self.pos_embed = nn.Parameter(self._pos_embed_for(self.grid_size(img_size)).detach().clone())
        self.img_size = img_size
        if hasattr(self.patch_embed, "set_input_size"):
            self.patch_embed.set_input_size(img_size)
        if hasattr(self, "pretrained_cfg"):
            self.pretrained_cfg = dict(
                self.pretrained_cfg, input_size=(self.pretrained_cfg["input_size"][0], *img_size)
            )

    # ----------------------------------------------------------------------------------- timm surface
    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Parameter names excluded from weight decay (timm also excludes every 1-D parameter)."""
        return {"cls_token", "pos_embed"}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """Regexes grouping parameters into stem / blocks / head for layer-wise lr decay."""
        return dict(
            stem=r"^cls_token|pos_embed|patch_embed|tpe", blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))]
        )

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute every block in the backward pass instead of storing its activations."""
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """New head with ``num_classes`` outputs (0: none); optionally a new pooling ("token", "avg", "avg_all", "")."""
        if global_pool is not None:
            check_choice(global_pool, GLOBAL_POOLS, "global_pool")
            self.global_pool = global_pool
        self.num_classes = num_classes
        device = self.cls_token.device
        self.head = nn.Linear(self.embed_dim, num_classes, device=device) if num_classes > 0 else nn.Identity()

    # ----------------------------------------------------------------------------------- forward
    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """Images [B, C, H, W] (H, W multiples of the patch) -> the first block's input [B, 1 + (H/p)(W/p), D] and
        the grid: patch embedding, cls token, absolute position embedding, dropout, MD-TPE."""
        self._check_size((x.shape[-2], x.shape[-1]))
        x, grid = self.patch_embed(x)
        grid = tuple(grid)
        scale = self.position_scale(grid, "embed")
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        if self.pos_embed is not None:
            x = x + self._pos_embed_for(grid)
        elif self.pos_embed_kind == "sincos":
            pos = sincos_pos_embed(x.shape[-1], grid, x.device, pos_scale=scale).to(x.dtype)
            x = torch.cat([x[:, :1], x[:, 1:] + pos], 1)
        x = self.pos_drop(x)
        if self.tpe is not None:
            x = self.tpe(x, grid, self.num_prefix_tokens, scale)
        return x, grid

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images [B, C, H, W] (H, W multiples of the patch) -> normed tokens [B, 1 + (H/p)(W/p), D]."""
        x, grid = self.embed(x)
        scale = self.position_scale(grid)
        for blk in self.blocks:
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = checkpoint(blk, x, grid, self.num_prefix_tokens, scale, use_reentrant=False)
            else:
                x = blk(x, grid, self.num_prefix_tokens, scale)
        return self.norm(x)

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """Block outputs along the way (timm's ``forward_intermediates``; ``features_only=True`` builds on it).

        Args:
            x: images [B, C, H, W] (H, W multiples of the patch).
            indices: blocks to return, in depth order: None all, an int n the last n, a list their indices (negative
                from the end).
            return_prefix_tokens: pair each intermediate with its cls token [B, 1, D].
            norm: pass each intermediate through the final norm.
            stop_early: accepted for timm's interface; every block of the model runs (``prune_intermediate_layers``
                removes the ones after the last index).
            output_fmt: "NCHW" (feature maps [B, D, H/p, W/p]) or "NLC" (patch tokens [B, (H/p)(W/p), D]).
            intermediates_only: return the intermediates alone.
        Returns:
            the list of intermediates, or (normed final tokens [B, 1 + N, D] as ``forward_features``, the list).
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take, _ = feature_take_indices(len(self.blocks), indices)
        taken: dict[int, torch.Tensor] = {}  # block outputs, caught by hooks: the forward is forward_features itself

        def keep(i: int):
            return lambda module, args, out: taken.__setitem__(i, out)

        hooks = [self.blocks[i].register_forward_hook(keep(i)) for i in take]
        try:
            final = self.forward_features(x)
        finally:
            for hook in hooks:
                hook.remove()
        grid = self.grid_size((x.shape[-2], x.shape[-1]))
        out = []
        for i in sorted(taken):  # depth order, each block once, whatever the order of ``indices`` (as timm's ViT)
            y = self.norm(taken[i]) if norm else taken[i]
            prefix, y = y[:, : self.num_prefix_tokens], y[:, self.num_prefix_tokens :]
            if output_fmt == "NCHW":
                y = y.reshape(y.shape[0], *grid, -1).permute(0, 3, 1, 2).contiguous()
            out.append((y, prefix) if return_prefix_tokens else y)
        return out if intermediates_only else (final, out)

    def prune_intermediate_layers(
        self, indices: int | list[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop the blocks after the last of ``indices`` (and the final norm / head if asked); returns the absolute
        indices kept, as timm's ``features_only`` wrapper expects."""
        take, max_index = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: max_index + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, "")
        return take

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Tokens [B, 1 + N, D] -> logits [B, num_classes] (or pooled features [B, D] with pre_logits)."""
        if self.global_pool == "token":
            x = x[:, 0]
        elif self.global_pool == "avg":
            x = x[:, self.num_prefix_tokens :].mean(dim=1)
        elif self.global_pool == "avg_all":
            x = x.mean(dim=1)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Images [B, C, H, W] -> logits [B, num_classes]."""
        return self.forward_head(self.forward_features(x))


def _pair(size: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    if len(size) != 2:
        raise ValueError(f"image size must be an int or (height, width), got {size!r}")
    return int(size[0]), int(size[1])


# --------------------------------------------------------------------------------------- checkpoints
def checkpoint_filter_fn(state_dict: dict[str, torch.Tensor], model: DeiT) -> dict[str, torch.Tensor]:
    """Adapt a state dict to ``model``: unwrap {"model": ...} / {"state_dict": ...}, resample pos_embed."""
    for key in ("model", "state_dict"):
        if key in state_dict and isinstance(state_dict[key], dict):
            state_dict = state_dict[key]
    if model.pos_embed is not None and "pos_embed" in state_dict:
        pos = state_dict["pos_embed"]
        if pos.shape != model.pos_embed.shape:
            side = math.isqrt(pos.shape[1] - model.num_prefix_tokens)
            if side * side != pos.shape[1] - model.num_prefix_tokens:
                raise ValueError(
                    f"pos_embed of shape {tuple(pos.shape)} is not a square grid: load it with the img_size it "
                    "was trained at, then call model.set_input_size(new_size)"
                )
            state_dict = dict(state_dict)
            state_dict["pos_embed"] = resample_abs_pos_embed(
                pos,
                new_size=list(model.grid_size(model.img_size)),
                old_size=[side, side],
                num_prefix_tokens=model.num_prefix_tokens,
            )
    return state_dict


# --------------------------------------------------------------------------------------- timm registration
def _cfg(**kwargs: Any) -> dict[str, Any]:
    return {
        "url": "",
        "num_classes": 1000,
        "input_size": (3, 224, 224),
        "pool_size": None,
        "crop_pct": 0.875,
        "interpolation": "bicubic",
        "fixed_input_size": False,
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
        "first_conv": "patch_embed.proj",
        "classifier": "head",
        "license": "apache-2.0",
        **kwargs,
    }


default_cfgs = generate_default_cfgs({name: _cfg() for name in MODEL_NAMES})


def create_deit(attention: str, size: str, pretrained: bool = False, **kwargs: Any) -> DeiT:
    """Build ``{attention}_deit_{size}_patch16_224`` through timm (pretrained weights and features_only included).

    Args:
        attention: one of ``FAMILIES`` (softmax, lightnet, lion_lit, lion_d, lion_s, lion_d_snake, lion_s_snake,
            normalized).
        size: "tiny" | "small" | "base" (docs/spec.md 3).
        pretrained: load the weights of the model's pretrained config.
        **kwargs: :class:`DeiT` arguments that override the size preset (e.g. ``img_size``, ``num_classes``).

    Returns:
        The :class:`DeiT`, ``forward(images [B, C, H, W]) -> logits [B, num_classes]``.
    """
    heads = dict(zip(SIZES, FAMILIES[attention].heads))[size]
    model_args = dict(patch_size=16, num_heads=heads, attention=attention, **SIZES[size])
    out_indices = kwargs.pop("out_indices", 3)  # features_only: the last 3 blocks, as timm's ViTs
    return build_model_with_cfg(
        DeiT,
        model_name(attention, size),
        pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=out_indices, feature_cls="getter"),
        **dict(model_args, **kwargs),
    )


def create_from_config(model_config: dict[str, Any], drop_path_rate: float = 0.0) -> DeiT:
    """The model a checkpoint's ``model_config`` describes.

    Args:
        model_config: {"name", "num_classes", "in_chans", "img_size", "args" (more ``timm.create_model`` kwargs)},
            as ``lightvision.classify.train.model_config`` writes it.
        drop_path_rate: stochastic depth; only matters for training.

    Returns:
        The :class:`DeiT`.
    """
    name = check_model_name(model_config["name"])
    args = {**LEGACY_ARGS.get(attention_of(name), {}), **model_config["args"]}
    return timm.create_model(
        name,
        num_classes=model_config["num_classes"],
        in_chans=model_config["in_chans"],
        img_size=model_config["img_size"],
        drop_path_rate=drop_path_rate,
        **args,
    )


def check_model_name(name: str) -> str:
    """``name`` if it is a registered model (``MODEL_NAMES``), else ValueError listing them."""
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODEL_NAMES)}")
    return name


def recorded_args(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """``args`` with every setting of ``LEGACY_ARGS``, the position unit and the attention's position options (LION's
    decay power) made explicit, so that a checkpoint keeps rebuilding as it was trained whatever the defaults
    become."""
    attention = attention_of(check_model_name(name))
    family = FAMILIES[attention]
    explicit = {"pos_unit": "image", "global_pool": family.global_pool}
    scaling = position_options(attention)
    if scaling:
        args = {**args, "attn_kwargs": {**scaling, **(args.get("attn_kwargs") or {})}}
    if attention == "lightnet":
        explicit.update(pos_embed=family.pos_embed, tpe_placement=family.tpe_placement)
    return {**explicit, **args}


@register_model
def softmax_deit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> DeiT:
    """DeiT-Tiny, patch 16, 224 px, with softmax attention (DeiT)."""
    return create_deit("softmax", "tiny", pretrained, **kwargs)


@register_model
def softmax_deit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> DeiT:
    """DeiT-Small, patch 16, 224 px, with softmax attention (DeiT)."""
    return create_deit("softmax", "small", pretrained, **kwargs)


@register_model
def softmax_deit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> DeiT:
    """DeiT-Base, patch 16, 224 px, with softmax attention (DeiT)."""
    return create_deit("softmax", "base", pretrained, **kwargs)


@register_model
def lightnet_deit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> DeiT:
    """DeiT-Tiny, patch 16, 224 px, with LightNet attention (one scan, MD-LRPE)."""
    return create_deit("lightnet", "tiny", pretrained, **kwargs)


@register_model
def lightnet_deit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> DeiT:
    """DeiT-Small, patch 16, 224 px, with LightNet attention (one scan, MD-LRPE)."""
    return create_deit("lightnet", "small", pretrained, **kwargs)


@register_model
def lightnet_deit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> DeiT:
    """DeiT-Base, patch 16, 224 px, with LightNet attention (one scan, MD-LRPE)."""
    return create_deit("lightnet", "base", pretrained, **kwargs)


@register_model
def lion_lit_deit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> DeiT:
    """DeiT-Tiny, patch 16, 224 px, with LION-LIT attention."""
    return create_deit("lion_lit", "tiny", pretrained, **kwargs)


@register_model
def lion_lit_deit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> DeiT:
    """DeiT-Small, patch 16, 224 px, with LION-LIT attention."""
    return create_deit("lion_lit", "small", pretrained, **kwargs)


@register_model
def lion_lit_deit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> DeiT:
    """DeiT-Base, patch 16, 224 px, with LION-LIT attention."""
    return create_deit("lion_lit", "base", pretrained, **kwargs)


@register_model
def lion_d_deit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> DeiT:
    """DeiT-Tiny, patch 16, 224 px, with LION-D attention."""
    return create_deit("lion_d", "tiny", pretrained, **kwargs)


@register_model
def lion_d_deit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> DeiT:
    """DeiT-Small, patch 16, 224 px, with LION-D attention."""
    return create_deit("lion_d", "small", pretrained, **kwargs)


@register_model
def lion_d_deit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> DeiT:
    """DeiT-Base, patch 16, 224 px, with LION-D attention."""
    return create_deit("lion_d", "base", pretrained, **kwargs)


@register_model
def lion_s_deit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> DeiT:
    """DeiT-Tiny, patch 16, 224 px, with LION-S attention."""
    return create_deit("lion_s", "tiny", pretrained, **kwargs)


@register_model
def lion_s_deit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> DeiT:
    """DeiT-Small, patch 16, 224 px, with LION-S attention."""
    return create_deit("lion_s", "small", pretrained, **kwargs)


@register_model
def lion_s_deit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> DeiT:
    """DeiT-Base, patch 16, 224 px, with LION-S attention."""
    return create_deit("lion_s", "base", pretrained, **kwargs)


@register_model
def lion_d_snake_deit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> DeiT:
    """DeiT-Tiny, patch 16, 224 px, with LION-D attention with snake orders."""
    return create_deit("lion_d_snake", "tiny", pretrained, **kwargs)


@register_model
def lion_d_snake_deit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> DeiT:
    """DeiT-Small, patch 16, 224 px, with LION-D attention with snake orders."""
    return create_deit("lion_d_snake", "small", pretrained, **kwargs)


@register_model
def lion_d_snake_deit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> DeiT:
    """DeiT-Base, patch 16, 224 px, with LION-D attention with snake orders."""
    return create_deit("lion_d_snake", "base", pretrained, **kwargs)


@register_model
def lion_s_snake_deit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> DeiT:
    """DeiT-Tiny, patch 16, 224 px, with LION-S attention with snake orders."""
    return create_deit("lion_s_snake", "tiny", pretrained, **kwargs)


@register_model
def lion_s_snake_deit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> DeiT:
    """DeiT-Small, patch 16, 224 px, with LION-S attention with snake orders."""
    return create_deit("lion_s_snake", "small", pretrained, **kwargs)


@register_model
def lion_s_snake_deit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> DeiT:
    """DeiT-Base, patch 16, 224 px, with LION-S attention with snake orders."""
    return create_deit("lion_s_snake", "base", pretrained, **kwargs)


@register_model
def normalized_deit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> DeiT:
    """DeiT-Tiny, patch 16, 224 px, with normalized attention (learned per-token normaliser)."""
    return create_deit("normalized", "tiny", pretrained, **kwargs)


@register_model
def normalized_deit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> DeiT:
    """DeiT-Small, patch 16, 224 px, with normalized attention (learned per-token normaliser)."""
    return create_deit("normalized", "small", pretrained, **kwargs)


@register_model
def normalized_deit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> DeiT:
    """DeiT-Base, patch 16, 224 px, with normalized attention (learned per-token normaliser)."""
    return create_deit("normalized", "base", pretrained, **kwargs)
