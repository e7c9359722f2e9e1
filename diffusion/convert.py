"""Published DiT weights -> the softmax DiT (``softmax_dit_{s|b|l|xl}_{2|4|8}``).

Three layouts are recognised by their keys (``detect_layout``):

* "lightvision": this project's own names (``patch_embed``, ``blocks.N.modulation``, ``final_linear``).
* "dit": facebookresearch/DiT ``models.py`` (``x_embedder``, ``t_embedder``, ``y_embedder.embedding_table``,
  ``blocks.N.adaLN_modulation``, ``final_layer``), e.g. the released ``DiT-XL-2-256x256.pt`` or a training
  checkpoint {"model", "ema", ...}.
* "diffusers": ``DiTTransformer2DModel`` (``pos_embed.proj``, ``transformer_blocks.N.attn1.to_q``, ``proj_out_2``).

The residual stream is permuted on the way in: DiT's sin-cos table puts the column features first and the row features
second, ``lightvision.layers.sincos_pos_embed`` the other way round. Swapping the two halves of the width in every
layer that writes or reads the residual stream (the norms have no affine and are permutation invariant) gives the
same outputs exactly.

diffusers' ``Timesteps`` divides the frequency exponent by F/2 - 1 (``downscale_freq_shift=1``) where DiT divides by
F/2; the converted model keeps DiT's definition, the one the released weights were trained with.
"""

from __future__ import annotations

import os

import torch

from lightvision.diffusion.dit import DiT
from lightvision.engine.checkpoint import CheckpointError
from lightvision.engine.weights import check_fit, copy_shared, read_state_dict
from lightvision.layers import sincos_pos_embed

LAYOUTS = ("lightvision", "dit", "diffusers")
_MARKERS = {"lightvision": "final_linear.weight", "dit": "x_embedder.proj.weight", "diffusers": "proj_out_2.weight"}


def detect_layout(state: dict[str, torch.Tensor]) -> str:
    """The layout of a DiT state dict, one of ``LAYOUTS``; ValueError naming its first keys if none matches."""
    for layout, marker in _MARKERS.items():
        if marker in state:
            return layout
    raise ValueError(
        f"not a DiT state dict: it has none of {sorted(_MARKERS.values())} (first keys: {sorted(state)[:6]})"
    )


def _swap_halves(width: int) -> torch.Tensor:
    """Index i -> (i + width / 2) mod width: DiT's residual coordinates in this project's order (an involution)."""
    return torch.arange(width).roll(width // 2)


def _from_dit(state: dict[str, torch.Tensor], depth: int) -> dict[str, torch.Tensor]:
    """facebookresearch/DiT names -> this project's (same tensors, residual not yet permuted)."""
    out = {
        "patch_embed.proj.weight": state["x_embedder.proj.weight"],
        "patch_embed.proj.bias": state["x_embedder.proj.bias"],
        "y_embedder.weight": state["y_embedder.embedding_table.weight"],
        "final_linear.weight": state["final_layer.linear.weight"],
        "final_linear.bias": state["final_layer.linear.bias"],
        "final_modulation.1.weight": state["final_layer.adaLN_modulation.1.weight"],
        "final_modulation.1.bias": state["final_layer.adaLN_modulation.1.bias"],
    }
    for i in (0, 2):
        for p in ("weight", "bias"):
            out[f"t_embedder.mlp.{i}.{p}"] = state[f"t_embedder.mlp.{i}.{p}"]
    for n in range(depth):
        for ours, theirs in (
            ("attn.qkv", "attn.qkv"),
            ("attn.proj", "attn.proj"),
            ("ffn.fc1", "mlp.fc1"),
            ("ffn.fc2", "mlp.fc2"),
            ("modulation.1", "adaLN_modulation.1"),
        ):
            for p in ("weight", "bias"):
                out[f"blocks.{n}.{ours}.{p}"] = state[f"blocks.{n}.{theirs}.{p}"]
    return out


def _from_diffusers(state: dict[str, torch.Tensor], depth: int) -> dict[str, torch.Tensor]:
    """``DiTTransformer2DModel`` names -> this project's. diffusers keeps a copy of the timestep and label embedders in
    every block (converted DiT weights hold the same tensors in each); the forward pass reads block 0's for the output
    head, so all copies must agree."""
    emb = "transformer_blocks.{}.norm1.emb."
    shared = {
        "t_embedder.mlp.0": "timestep_embedder.linear_1",
        "t_embedder.mlp.2": "timestep_embedder.linear_2",
        "y_embedder": "class_embedder.embedding_table",
    }
    out = {}
    for ours, theirs in shared.items():
        for p in ("weight", "bias") if ours != "y_embedder" else ("weight",):
            first = state[emb.format(0) + f"{theirs}.{p}"]
            for n in range(1, depth):
                if not torch.equal(state[emb.format(n) + f"{theirs}.{p}"], first):
                    raise CheckpointError(
                        f"block {n}'s {theirs}.{p} differs from block 0's: DiT shares one timestep "
                        "and label embedder across blocks, so this model cannot be converted"
                    )
            out[f"{ours}.{p}"] = first
    renames = {"patch_embed.proj": "pos_embed.proj", "final_modulation.1": "proj_out_1", "final_linear": "proj_out_2"}
    for n in range(depth):
        b = f"transformer_blocks.{n}."
        renames.update(
            {
                f"blocks.{n}.attn.proj": b + "attn1.to_out.0",
                f"blocks.{n}.ffn.fc1": b + "ff.net.0.proj",
                f"blocks.{n}.ffn.fc2": b + "ff.net.2",
                f"blocks.{n}.modulation.1": b + "norm1.linear",
            }
        )
        for p in ("weight", "bias"):
            out[f"blocks.{n}.attn.qkv.{p}"] = torch.cat([state[b + f"attn1.to_{x}.{p}"] for x in "qkv"])
    for ours, theirs in renames.items():
        for p in ("weight", "bias"):
            out[f"{ours}.{p}"] = state[f"{theirs}.{p}"]
    return out


def _check_sincos(table: torch.Tensor, source: str) -> None:
    """The file's fixed position table [1, N, D] must be DiT's 2-D sin-cos (the model recomputes it per grid)."""
    n, d = table.shape[-2:]
    side = int(round(n**0.5))
    perm = _swap_halves(d)
    expected = sincos_pos_embed(d, (side, side))[:, perm]
    if side * side != n or not torch.allclose(table.reshape(n, d).float(), expected, atol=1e-4):
        raise CheckpointError(
            f"{source}: its pos_embed is not DiT's fixed 2-D sin-cos table, which this DiT "
            "recomputes; a learned position embedding cannot be converted"
        )


def _permute_residual(state: dict[str, torch.Tensor], depth: int, width: int) -> dict[str, torch.Tensor]:
    """Swap the halves of the residual width (module docstring): rows of the layers that write it, columns of the
    layers that read it."""
    perm = _swap_halves(width)
    state = dict(state)

    def rows(key: str, chunks: int = 1) -> None:
        index = torch.cat([perm + c * width for c in range(chunks)])
        state[key] = state[key][index]

    for p in ("weight", "bias"):
        rows(f"patch_embed.proj.{p}")
        rows(f"final_modulation.1.{p}", 2)
        for n in range(depth):
            rows(f"blocks.{n}.attn.proj.{p}")
            rows(f"blocks.{n}.ffn.fc2.{p}")
            rows(f"blocks.{n}.modulation.1.{p}", 6)
    readers = [f"blocks.{n}.{m}.weight" for n in range(depth) for m in ("attn.qkv", "ffn.fc1")]
    for key in ["final_linear.weight", *readers]:
        state[key] = state[key][:, perm]
    return state


def to_project_names(state: dict[str, torch.Tensor], source: str = "the state dict") -> dict[str, torch.Tensor]:
    """A DiT state dict of any of ``LAYOUTS`` under this project's names, residual in this project's order (a
    softmax DiT with per-block modulation and a GELU MLP, as deep and wide as the file)."""
    layout = detect_layout(state)
    if layout == "lightvision":
        return state
    if layout == "dit" and "pos_embed" in state:
        _check_sincos(state["pos_embed"], source)
    depth = _depth(state)
    try:
        converted = (_from_dit if layout == "dit" else _from_diffusers)(state, depth)
    except KeyError as e:
        raise CheckpointError(f"{source} looks like a {layout} DiT but lacks {e.args[0]!r}") from None
    return _permute_residual(converted, depth, converted["patch_embed.proj.weight"].shape[0])


def _depth(state: dict[str, torch.Tensor]) -> int:
    blocks = (k.split(".")[1] for k in state if k.startswith(("blocks.", "transformer_blocks.")))
    return 1 + max((int(b) for b in blocks if b.isdigit()), default=-1)


def checkpoint_filter_fn(
    state: dict[str, torch.Tensor], model: DiT, source: str = "the state dict"
) -> dict[str, torch.Tensor]:
    """Adapt a DiT state dict of any of ``LAYOUTS`` to ``model`` (for a foreign layout: a softmax DiT with per-block
    modulation); raises CheckpointError naming the mismatching keys when the file holds another model."""
    layout = detect_layout(state)
    cfg = model.config
    if layout != "lightvision":
        if cfg.attention != "softmax" or cfg.adaln != "block" or cfg.ffn != "mlp" or cfg.pos_embed != "sincos":
            raise CheckpointError(
                f"{source} is a {layout} DiT: it converts to a softmax DiT (e.g. softmax_dit_xl_2), "
                f"not to attention={cfg.attention!r}; to start another attention from it, train "
                "with model.init_from"
            )
        if _depth(state) != cfg.depth:
            raise CheckpointError(
                f"{source} has {_depth(state)} blocks, the model {cfg.depth}: choose the model the file was trained as"
            )
    converted = to_project_names(state, source)
    check_fit(converted, model, source)
    return converted


def load_pretrained(model: DiT, path: str | os.PathLike, which: str = "ema") -> dict:
    """Load a DiT weights file or folder of any of ``LAYOUTS`` into ``model`` (``which`` picks "ema" or "model" in a
    training checkpoint that has both); returns what was loaded: {"file", "layout", "tensors"}."""
    state = read_state_dict(path, which)
    model.load_state_dict(checkpoint_filter_fn(state, model, str(path)))
    return {"file": str(path), "layout": detect_layout(state), "tensors": len(model.state_dict())}


def init_from(model: DiT, path: str | os.PathLike, which: str = "ema") -> dict[str, list[str]]:
    """Start ``model`` (any attention) from a softmax DiT checkpoint of any of ``LAYOUTS`` (or a run folder): every
    tensor with the same name and shape is copied (``lightvision.engine.weights.copy_shared``'s report)."""
    return copy_shared(to_project_names(read_state_dict(path, which), str(path)), model)
