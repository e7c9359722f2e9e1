"""Weights from outside the project's own checkpoints: read any state-dict file, check that a converted one fits a
model, copy what two models share.

The family converters (``lightvision.classify.convert``, ``lightvision.diffusion.convert``) rename a foreign layout
into the project's; this module is the part they have in common.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from lightvision.engine.checkpoint import (
    MANIFEST,
    CheckpointError,
    fit_problems,
    resolve_checkpoint,
    unwrap_model,
    verify_checkpoint,
)

log = logging.getLogger(__name__)

# Weight files a Hub-style folder may hold, in the order they are looked for.
FOLDER_FILES = (
    "model.safetensors",
    "diffusion_pytorch_model.safetensors",
    "transformer/diffusion_pytorch_model.safetensors",
    "pytorch_model.bin",
    "transformer/diffusion_pytorch_model.bin",
)
# Keys under which training scripts nest the weights (DiT: {"model", "ema", "opt", "args"}; DeiT: {"model", ...}).
NESTING = ("model", "state_dict", "module")
# Those scripts also store their argparse.Namespace under "args": a plain attribute bag, safe to rebuild under
# weights_only loading (torch 2.4 has add_safe_globals, not yet the safe_globals context).
torch.serialization.add_safe_globals([argparse.Namespace])


def read_state_dict(path: str | os.PathLike, which: str = "ema") -> dict[str, torch.Tensor]:
    """The tensors of a weights file (.safetensors, or a torch .pt / .pth / .bin read with ``weights_only``), of a
    Hub-style folder (``FOLDER_FILES``) or of this project's run / checkpoint folder (its ``which`` weights). A
    training checkpoint that nests its weights (its "args" may be an argparse.Namespace) gives its ``which`` ("ema"
    or "model") entry when it has one, else its "model" / "state_dict" / "module" entry; a DDP "module." prefix is
    dropped.

    Raises FileNotFoundError (no such file, or a folder without weights) and CheckpointError (unreadable).
    """
    path = Path(path)
    if path.is_dir():
        if (path / MANIFEST).is_file() or (path / "checkpoints").is_dir():  # this project's checkpoint / run
            path = _checkpoint_weights(path, which)
        else:
            found = next((path / name for name in FOLDER_FILES if (path / name).is_file()), None)
            if found is None:
                raise FileNotFoundError(
                    f"{path} holds none of the weight files {', '.join(FOLDER_FILES)} and is no "
                    "run or checkpoint folder"
                )
            path = found
    if not path.is_file():
        raise FileNotFoundError(f"weights file {str(path)!r} not found")
    try:
        state = (
            load_file(path)
            if path.suffix == ".safetensors"
            else torch.load(path, map_location="cpu", weights_only=True)
        )
    except Exception as e:  # safetensors and pickle raise their own error types for malformed files
        raise CheckpointError(f"{path} is not a readable weights file ({type(e).__name__}: {e})") from e
    for key in (which, *NESTING):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path} holds no state dict (a mapping of names to tensors)")
    return {k.removeprefix("module."): v for k, v in state.items()}


def _checkpoint_weights(path: Path, which: str) -> Path:
    """``<checkpoint>/<which>.safetensors`` (else model.safetensors) of a run folder's latest checkpoint or of a
    checkpoint folder, verified against its manifest."""
    ckpt = resolve_checkpoint(path)
    name = f"{which}.safetensors" if (ckpt / f"{which}.safetensors").is_file() else "model.safetensors"
    verify_checkpoint(ckpt, [name])
    return ckpt / name


def check_fit(state: dict[str, torch.Tensor], model: nn.Module, source: str) -> None:
    """Raise CheckpointError naming the missing, unexpected and mis-shaped keys unless ``state`` (already converted
    to the project's names) loads strictly into ``model``; ``source`` names the file in the message."""
    problems = fit_problems(state, unwrap_model(model).state_dict())
    if problems:
        raise CheckpointError(
            f"{source} holds another model: " + "; ".join(problems) + ". Choose the model the file was trained as"
        )


def copy_shared(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, list[str]]:
    """Copy every tensor of ``state`` whose name and shape match one of ``model``'s; returns {"copied": names,
    "skipped": the model's tensors left as initialised, "unused": the state's tensors the model has no place for}."""
    own = unwrap_model(model).state_dict()
    copied = sorted(k for k in own.keys() & state.keys() if own[k].shape == state[k].shape)
    with torch.no_grad():
        for k in copied:
            own[k].copy_(state[k].to(own[k].dtype))
    return {"copied": copied, "skipped": sorted(own.keys() - set(copied)), "unused": sorted(state.keys() - set(copied))}


def record_init(
    report: dict[str, list[str]], source: str | os.PathLike, run_dir: str | os.PathLike | None, write: bool = True
) -> dict:
    """Log a ``copy_shared`` report of a start from ``source``, write it in full to ``<run_dir>/init_from.json``
    (when ``write``, i.e. on the main process) and return its summary {"file", "copied", "skipped", "unused"} (counts)
    plus the names of the skipped tensors."""
    summary = {"file": str(source), **{k: len(v) for k, v in report.items()}, "skipped_names": report["skipped"]}
    log.info(
        "init_from %s: copied %d tensors; left as initialised: %s",
        source,
        summary["copied"],
        ", ".join(report["skipped"]) or "none",
    )
    if write and run_dir is not None:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / "init_from.json").write_text(json.dumps({"file": str(source), **report}, indent=2) + "\n")
    return summary
