"""Published classifier weights -> the DeiT family of ``lightvision.classify.deit``; Hub-style save / load.

Layouts, recognised by their keys (``detect_layout``):

* "deit": timm's ``VisionTransformer`` / the DeiT authors' checkpoints ({"model": ...}) and this project's own
  DeiT weights: the names are the same, so the tensors load as they are (``deit.checkpoint_filter_fn`` resamples
  the position embedding). A LION-LIT classifier of the LION authors has this layout too (no mask parameters).
* "lion": the LION authors' image classifiers (``lion_{tiny|small|base}_patch16_224`` of their ``models_lion.py``):
  DeiT names plus ``blocks.N.attn.a_i``, a [H] logit per head for LION-D (-> ``attn.decay`` [1, H]; lambda =
  sigmoid(a) in both) or a Linear(D, H) for LION-S (-> ``attn.gate``; a = 1 - sigmoid(W x + b) there,
  sigmoid(-(W x + b)) here). Without ``--cls_tok`` their head reads the mean of every token, cls included
  (``global_pool="avg_all"``); their optional ``pos_embed`` is a learned one (``pos_embed="learned"``).
  Their S-curve patch order (``--order S``: ``a2_i`` beside ``a_i``) is this project's snake pair (row snake,
  column snake): it converts to ``lion_d_snake`` / ``lion_s_snake``.
* Distilled DeiT (``dist_token``, ``head_dist``) is refused: the family has one prefix token and one head.

``pretrained_kwargs`` reads the model arguments a file implies (classes, patch, image size, position embedding,
pooling), so ``timm.create_model(name, **pretrained_kwargs(state))`` builds the model the file fits.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import timm
import torch
from torch import nn

from lightvision.classify.deit import DeiT, checkpoint_filter_fn as deit_filter_fn
from lightvision.engine.checkpoint import CheckpointError
from lightvision.engine.weights import check_fit, copy_shared, read_state_dict

LAYOUTS = ("deit", "lion")


def detect_layout(state: dict[str, torch.Tensor]) -> str:
    """The layout of a classifier state dict, one of ``LAYOUTS``; CheckpointError for the refused ones, ValueError
    naming the first keys when it is no DeiT-style classifier."""
    if "dist_token" in state or "head_dist.weight" in state:
        raise CheckpointError(
            "a distilled DeiT (dist_token, head_dist) cannot be converted: the DeiT family has one "
            "class token and one head; use the non-distilled deit_*_patch16_224 weights"
        )
    if "patch_embed.proj.weight" not in state or "blocks.0.norm1.weight" not in state:
        raise ValueError(
            f"not a DeiT-style classifier: no patch_embed.proj / blocks.0.norm1 (first keys: {sorted(state)[:6]})"
        )
    return "lion" if any(".attn.a_i" in k for k in state) else "deit"


def pretrained_kwargs(state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """``timm.create_model`` arguments a state dict implies: num_classes, in_chans, patch_size, pos_embed (and
    img_size from a learned one), global_pool ("avg_all" for the LION authors' layout), and pos_unit "token" where no
    learned embedding tells the training grid (the file's authors counted patches; pass img_size, the training size,
    with pos_unit="image" to measure positions in its cells)."""
    weight = state["patch_embed.proj.weight"]  # [D, C, p, p]
    kwargs: dict[str, Any] = {
        "in_chans": weight.shape[1],
        "patch_size": weight.shape[-1],
        "num_classes": state["head.weight"].shape[0] if "head.weight" in state else 0,
        "pos_embed": "learned" if "pos_embed" in state else "none",
    }
    if "pos_embed" in state:
        side = math.isqrt(state["pos_embed"].shape[1] - 1)
        kwargs["img_size"] = side * weight.shape[-1]
    else:
        kwargs["pos_unit"] = "token"
    if detect_layout(state) == "lion":
        kwargs["global_pool"] = "avg_all"
    return kwargs


def _from_lion(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The LION authors' mask parameters under this project's names (everything else is named alike). With their
    S-curve order, ``a_i`` belongs to the row snake and ``a2_i`` to the column snake: this project's orders 0 and 1
    (``decay`` rows, ``gate`` output blocks)."""
    out = {k: v for k, v in state.items() if ".attn.a_i" not in k and ".attn.a2_i" not in k}
    for key in [k for k in state if k.endswith(".attn.a_i") or k.endswith(".attn.a_i.weight")]:
        block = key.partition(".attn.a_i")[0]
        second = f"{block}.attn.a2_i"
        if key.endswith(".a_i"):
            out[f"{block}.attn.decay"] = torch.stack([state[key], *([state[second]] if second in state else [])])
            continue
        for p in ("weight", "bias"):
            parts = [state[f"{block}.attn.a_i.{p}"], *([state[f"{second}.{p}"]] if f"{second}.{p}" in state else [])]
            out[f"{block}.attn.gate.{p}"] = torch.cat(parts)
    return out


def convert(state: dict[str, torch.Tensor], model: DeiT, source: str = "the state dict") -> dict[str, torch.Tensor]:
    """Adapt a classifier state dict of any of ``LAYOUTS`` to ``model``; CheckpointError naming the mismatching
    keys when it holds another model."""
    converted = _renamed(state, model)
    check_fit(converted, model, source)
    return converted


def _renamed(state: dict[str, torch.Tensor], model: DeiT) -> dict[str, torch.Tensor]:
    """This project's names, the position embedding resampled to ``model``'s grid."""
    return deit_filter_fn(_from_lion(state) if detect_layout(state) == "lion" else state, model)


def load_pretrained(model: nn.Module, path: str | os.PathLike, which: str = "ema") -> dict[str, Any]:
    """Load a classifier weights file or Hub-style folder into ``model`` (``which`` picks "ema" or "model" in a
    checkpoint that has both); returns {"file", "layout", "tensors"}."""
    return _load(model, read_state_dict(path, which), str(path))


def create_pretrained(name: str, path: str | os.PathLike, which: str = "ema", **kwargs: Any) -> tuple[DeiT, dict]:
    """``timm.create_model(name)`` shaped by the file (``pretrained_kwargs``; ``kwargs`` override) with its weights
    loaded; returns (model, ``load_pretrained``'s report)."""
    state = read_state_dict(path, which)
    model = timm.create_model(name, **{**pretrained_kwargs(state), **kwargs})
    return model, _load(model, state, str(path))


def _load(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> dict[str, Any]:
    model.load_state_dict(convert(state, model, source))
    return {"file": source, "layout": detect_layout(state), "tensors": len(model.state_dict())}


def init_from(model: DeiT, path: str | os.PathLike, which: str = "ema") -> dict[str, list[str]]:
    """Start ``model`` (any attention) from a classifier checkpoint of any of ``LAYOUTS`` (or a run folder): the
    position embedding is resampled to the model's grid, then every tensor with the same name and shape is copied
    (``lightvision.engine.weights.copy_shared``'s report)."""
    return copy_shared(_renamed(read_state_dict(path, which), model), model)


def save_pretrained(model: DeiT, directory: str | os.PathLike) -> Path:
    """Hub-style folder (timm's ``save_for_hf``): ``model.safetensors`` + ``config.json`` (architecture,
    pretrained_cfg, the model arguments, the position unit and training grid); ``from_pretrained`` or
    ``timm.create_model("local-dir:<dir>")`` reads it."""
    from timm.models import save_for_hf

    save_for_hf(
        model,
        str(directory),
        safe_serialization=True,
        model_args={"pos_unit": model.pos_unit, "pos_grid": list(model.pos_grid)},  # set_input_size keeps the grid
    )
    return Path(directory)


def from_pretrained(dir_or_hub_id: str | os.PathLike, **kwargs: Any) -> DeiT:
    """A model saved by ``save_pretrained``: a local folder, or a Hub id (``org/name``, fetched by timm)."""
    source = "local-dir" if Path(dir_or_hub_id).is_dir() else "hf-hub"
    return timm.create_model(f"{source}:{dir_or_hub_id}", pretrained=True, **kwargs)
