"""Atomic, verified checkpoints.

Layout of ``run_dir/checkpoints/``::

    step_0001000/   <name>.safetensors per model (e.g. model, ema), config.json, train_state.pt,
                    manifest.json (sha256 + size of every other file, written last)
    best/           hard links (or copies) of the best checkpoint by metric
    latest          name of the newest complete checkpoint

A checkpoint is written into a ``.tmp-*`` folder, fsync'd and renamed into place, so a crash leaves either
the complete new checkpoint or none. Loading verifies the manifest before anything is read into a model;
``train_state.pt`` holds tensors and plain Python values only and is read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import shutil
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from lightvision.engine.config import upgrade_config
from lightvision.engine.fsio import FILE_MODE, TMP_PREFIX, atomic_write, fsync_path, sha256_file, write_durable

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
CONFIG = "config.json"
TRAIN_STATE = "train_state.pt"
LATEST = "latest"
BEST = "best"
FORMAT = "lightvision-checkpoint-1"
PAUSE_IN_SAVE_ENV = "LIGHTVISION_TEST_PAUSE_IN_SAVE"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_PLAIN = (bool, int, float, str, type(None))


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written, or is incomplete, corrupt or of another architecture."""


def unwrap_model(model: nn.Module) -> nn.Module:
    """The bare module under DataParallel / DistributedDataParallel / torch.compile wrappers."""
    while True:
        if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        else:
            return model


def _cpu_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Unwrapped state dict as contiguous CPU tensors that share no storage (what safetensors requires)."""
    out, seen = {}, set()
    for key, value in unwrap_model(model).state_dict().items():
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"state dict entry {key!r} is a {type(value).__name__}; only tensors can be saved")
        value = value.detach().to("cpu").contiguous()
        storage = value.untyped_storage().data_ptr()
        if storage in seen:
            value = value.clone()
        seen.add(value.untyped_storage().data_ptr())
        out[key] = value
    return out


def check_plain(obj: Any, where: str = "train_state") -> None:
    """Raise TypeError unless ``obj`` is tensors / plain Python values in dicts, lists and tuples
    (what ``torch.load(weights_only=True)`` accepts). Convert e.g. numpy RNG states with ``torch.as_tensor``."""
    if isinstance(obj, torch.Tensor) or type(obj) in _PLAIN:
        return
    if type(obj) in (dict, OrderedDict):
        for key, value in obj.items():
            if type(key) not in (str, int):
                raise TypeError(f"{where} has a key of type {type(key).__name__}; use str or int keys")
            check_plain(value, f"{where}[{key!r}]")
        return
    if type(obj) in (list, tuple):
        for i, value in enumerate(obj):
            check_plain(value, f"{where}[{i}]")
        return
    raise TypeError(
        f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}; train_state may hold only tensors, "
        "bool/int/float/str/None, dicts, lists and tuples (convert it, e.g. with torch.as_tensor or .tolist())"
    )


def metric_is_better(metric: float | None, best: float | None, mode: str) -> bool:
    """Whether ``metric`` beats ``best`` ("max": larger is better, "min": smaller); any metric beats None."""
    if metric is None:
        return False
    return best is None or (metric > best if mode == "max" else metric < best)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _replace_dir(src: Path, dst: Path) -> None:
    """Rename folder ``src`` to ``dst``, replacing an existing ``dst``."""
    if dst.exists():
        old = dst.with_name(f"{TMP_PREFIX}old-{dst.name}-{os.getpid()}")
        os.rename(dst, old)
        os.rename(src, dst)
        fsync_path(dst.parent)
        _remove(old)
    else:
        os.rename(src, dst)
        fsync_path(dst.parent)


def _pause_for_fault_test(step: int, tmp: Path) -> None:
    """Test hook: with ``LIGHTVISION_TEST_PAUSE_IN_SAVE=<step>``, block forever inside the save of that step
    (payload written, manifest not yet) after creating ``<tmp>.paused``, so a test can SIGKILL mid-save."""
    if os.environ.get(PAUSE_IN_SAVE_ENV) != str(step):
        return
    tmp.with_name(tmp.name + ".paused").touch()
    while True:
        time.sleep(1)


def verify_checkpoint(path: str | os.PathLike, files: list[str] | None = None) -> dict:
    """Check ``files`` (default: all) of checkpoint folder ``path`` against its manifest; return the manifest.

    Raises :class:`CheckpointError` if the folder is incomplete, or a file is missing, truncated or corrupt.
    """
    path = Path(path)
    manifest_path = path / MANIFEST
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a checkpoint folder")
    if not manifest_path.is_file():
        raise CheckpointError(
            f"{path} is incomplete (no {MANIFEST}): its save was interrupted; load an earlier checkpoint"
        )
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        entries = manifest["files"]
        if not all(isinstance(e, dict) and {"size", "sha256"} <= e.keys() for e in entries.values()):
            raise ValueError("a file entry lacks size or sha256")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{manifest_path} is unreadable ({e}); the checkpoint is corrupt") from e
    for name in entries if files is None else files:
        if name not in entries:
            raise CheckpointError(f"{path} has no {name} (it holds: {', '.join(sorted(entries))})")
        file = path / name
        if Path(name).name != name or not file.is_file():
            raise CheckpointError(f"{file} is missing; the checkpoint is damaged, load another one")
        size, expected = file.stat().st_size, entries[name]["size"]
        if size != expected:
            raise CheckpointError(f"{file} is truncated or altered: {size} bytes, the manifest says {expected}")
        if sha256_file(file) != entries[name]["sha256"]:
            raise CheckpointError(f"{file} is corrupt: its sha256 does not match the manifest")
    return manifest


def _flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(cfg, dict):
        return {prefix.rstrip("."): cfg}
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        out.update(_flatten(value, f"{prefix}{key}."))
    return out


def _check_model_config(path: Path, found: dict, expected: dict) -> None:
    found, expected = _flatten(found), _flatten(json.loads(json.dumps(expected, default=str)))
    absent = "<absent>"
    diffs = [
        f"{key}: checkpoint {found.get(key, absent)!r}, expected {expected.get(key, absent)!r}"
        for key in sorted(found.keys() | expected.keys())
        if found.get(key, absent) != expected.get(key, absent)
    ]
    if diffs:
        raise CheckpointError(f"{path} holds another architecture; differing model_config keys: " + "; ".join(diffs))


def _read_weights(path: Path, name: str, model: nn.Module, map_location: Any) -> dict[str, torch.Tensor]:
    """Load ``<name>.safetensors`` and check that its keys and shapes fit ``model`` (not modified)."""
    try:
        state = load_file(path / f"{name}.safetensors", device=str(map_location))
    except Exception as e:  # safetensors raises its own error types for malformed files
        raise CheckpointError(f"{path / name}.safetensors is not a readable safetensors file: {e}") from e
    problems = fit_problems(state, unwrap_model(model).state_dict())
    if problems:
        raise CheckpointError(f"'{name}' weights in {path} do not fit the model: " + "; ".join(problems))
    return state


def fit_problems(state: dict[str, torch.Tensor], own: dict[str, torch.Tensor]) -> list[str]:
    """What keeps ``state`` from loading strictly into a model whose state dict is ``own``: missing keys, unexpected
    keys and shape mismatches (the first 8 of each); empty when it fits."""
    missing, unexpected = sorted(own.keys() - state.keys()), sorted(state.keys() - own.keys())
    shapes = [
        f"{k}: checkpoint {tuple(state[k].shape)}, model {tuple(own[k].shape)}"
        for k in sorted(own.keys() & state.keys())
        if state[k].shape != own[k].shape
    ]
    return [
        f"{label} {items[:8]}"
        for label, items in [("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", shapes)]
        if items
    ]


def resolve_checkpoint(path: str | os.PathLike, which: str = "latest") -> Path:
    """A checkpoint folder as is, or the ``which`` ("latest" or "best") checkpoint of a run folder."""
    path = Path(path)
    if (path / MANIFEST).exists() or _STEP_DIR.match(path.name) or path.name == BEST:
        return path
    if which not in ("latest", "best"):
        raise ValueError(f"which must be 'latest' or 'best', got {which!r}")
    manager = CheckpointManager(path)
    found = manager.latest() if which == "latest" else manager.best()
    if found is None:
        raise CheckpointError(
            f"no {which} checkpoint in {path}: pass a checkpoint folder (with {MANIFEST}) or a run folder "
            "with checkpoints/"
        )
    return found


def read_checkpoint_config(path: str | os.PathLike, which: str = "latest") -> dict:
    """``{"model_config": ..., "config": ...}`` of a checkpoint (or of a run folder's latest/best one), verified; a
    run config saved by an earlier release is returned in the current key layout (:func:`upgrade_config`)."""
    ckpt = resolve_checkpoint(path, which)
    verify_checkpoint(ckpt, [CONFIG])
    saved = json.loads((ckpt / CONFIG).read_text(encoding="utf-8"))
    if isinstance(saved.get("config"), dict):
        saved["config"] = upgrade_config(saved["config"])
    return saved


def load_model_weights(
    path: str | os.PathLike, model: nn.Module, which: str = "ema", checkpoint: str = "latest", map_location: Any = "cpu"
) -> Path:
    """Load the ``which`` ("ema" or "model") weights of a checkpoint (or of a run folder's ``checkpoint``
    = "latest"/"best" one) into ``model`` with strict=True after verifying them; returns the checkpoint folder."""
    ckpt = resolve_checkpoint(path, checkpoint)
    manifest = verify_checkpoint(ckpt, [CONFIG])
    file = f"{which}.safetensors"
    if file not in manifest["files"]:
        if which == "ema":
            raise CheckpointError(
                f"{ckpt} has no EMA weights (the run was trained without EMA): use --weights model (which='model')"
            )
        raise CheckpointError(f"{ckpt} has no '{which}' weights")
    verify_checkpoint(ckpt, [file])
    state = _read_weights(ckpt, which, model, map_location)
    unwrap_model(model).load_state_dict(state, strict=True)
    return ckpt


class CheckpointManager:
    """Writes, prunes and loads the checkpoints of one run folder (call ``save`` on the main process only).

    ``mode`` says whether a larger ("max", e.g. accuracy) or smaller ("min", e.g. FID) metric is better.
    """

    def __init__(self, run_dir: str | os.PathLike, keep_last: int = 3, mode: str = "max"):
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        self.dir = Path(run_dir) / "checkpoints"
        self.keep_last = keep_last
        self.mode = mode

    def checkpoints(self) -> list[Path]:
        """Complete step folders, oldest first."""
        if not self.dir.is_dir():
            return []
        found = [p for p in self.dir.iterdir() if _STEP_DIR.match(p.name) and (p / MANIFEST).is_file()]
        return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))

    def latest(self) -> Path | None:
        """The newest complete checkpoint: the ``latest`` pointer, or a scan if the pointer is missing/broken."""
        try:
            name = (self.dir / LATEST).read_text(encoding="utf-8").strip()
        except OSError:
            name = ""
        if _STEP_DIR.match(name) and (self.dir / name / MANIFEST).is_file():
            return self.dir / name
        found = self.checkpoints()
        if name and found:
            log.warning(
                "checkpoint pointer %s names %r, which is not a complete checkpoint; using %s",
                self.dir / LATEST,
                name,
                found[-1].name,
            )
        return found[-1] if found else None

    def best(self) -> Path | None:
        best = self.dir / BEST
        return best if (best / MANIFEST).is_file() else None

    def best_metric(self) -> float | None:
        best = self.best()
        if best is None:
            return None
        try:
            return json.loads((best / MANIFEST).read_text(encoding="utf-8")).get("metric")
        except ValueError:
            return None

    def is_better(self, metric: float | None) -> bool:
        """Whether ``metric`` beats the best checkpoint's metric (True if there is none yet)."""
        return metric_is_better(metric, self.best_metric(), self.mode)

    def save(
        self,
        step: int,
        *,
        models: dict[str, nn.Module],
        model_config: dict,
        train_state: dict,
        metric: float | None = None,
        is_best: bool = False,
        config: dict | None = None,
    ) -> Path:
        """Write ``step_XXXXXXX`` atomically, update ``latest``, ``best`` (if ``is_best`` or ``metric`` beats
        it) and prune to the last ``keep_last`` steps. On an OSError (disk full, ...) nothing is left behind
        and :class:`CheckpointError` says which earlier checkpoint is intact."""
        check_plain(train_state)
        weights = {name: _cpu_weights(model) for name, model in models.items()}
        name = f"step_{step:07d}"
        final = self.dir / name
        previous = self.latest()
        best = is_best or self.is_better(metric)
        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in self.dir.glob(TMP_PREFIX + "*"):
            _remove(stale)
        tmp = self.dir / f"{TMP_PREFIX}{name}-{os.getpid()}"
        try:
            tmp.mkdir()
            for model_name, tensors in weights.items():
                file = tmp / f"{model_name}.safetensors"
                save_file(tensors, file, metadata={"step": str(step)})
                os.chmod(file, FILE_MODE)
                fsync_path(file)
            write_durable(
                tmp / CONFIG,
                json.dumps({"model_config": model_config, "config": config}, indent=2, default=str).encode("utf-8"),
            )
            with open(tmp / TRAIN_STATE, "wb") as f:
                torch.save(train_state, f)
                f.flush()
                os.fsync(f.fileno())
            _pause_for_fault_test(step, tmp)
            files = {p.name: {"sha256": sha256_file(p), "size": p.stat().st_size} for p in sorted(tmp.iterdir())}
            manifest = {"format": FORMAT, "step": step, "metric": metric, "files": files}
            write_durable(tmp / MANIFEST, json.dumps(manifest, indent=2).encode("utf-8"))
            fsync_path(tmp)
            _replace_dir(tmp, final)
            atomic_write(self.dir / LATEST, (name + "\n").encode("utf-8"))
            if best:
                self._link_best(final)
            self._prune(step)
        except BaseException as e:
            _remove(tmp)
            if isinstance(e, OSError):
                intact = f"previous checkpoint {previous.name} is intact" if previous else "no earlier checkpoint"
                raise CheckpointError(f"could not write checkpoint {final}: {e.strerror or e}; {intact}") from e
            raise
        return final

    def _link_best(self, src: Path) -> None:
        tmp = self.dir / f"{TMP_PREFIX}{BEST}-{os.getpid()}"
        tmp.mkdir()
        for file in src.iterdir():
            try:
                os.link(file, tmp / file.name)
            except OSError:
                shutil.copy2(file, tmp / file.name)
        fsync_path(tmp)
        _replace_dir(tmp, self.dir / BEST)

    def _prune(self, step: int) -> None:
        """Keep the newest ``keep_last`` checkpoints up to ``step`` (later ones, from an abandoned run
        that was resumed from an earlier checkpoint, are left alone)."""
        timeline = [p for p in self.checkpoints() if int(_STEP_DIR.match(p.name).group(1)) <= step]
        for old in timeline[: -self.keep_last]:
            _remove(old)

    def load(
        self,
        path: str | os.PathLike,
        *,
        models: dict[str, nn.Module],
        expected_model_config: dict | None = None,
        map_location: Any = "cpu",
    ) -> dict:
        """Verify checkpoint ``path`` fully, check its architecture against ``expected_model_config``, then load
        every model (strict) and return the train state. Nothing is modified unless everything checks out."""
        path = Path(path)
        held = verify_checkpoint(path)["files"]
        absent = [f for f in [CONFIG, TRAIN_STATE, *(f"{name}.safetensors" for name in models)] if f not in held]
        if absent:
            raise CheckpointError(f"{path} lacks {', '.join(absent)} (it holds: {', '.join(sorted(held))})")
        if expected_model_config is not None:
            saved = json.loads((path / CONFIG).read_text(encoding="utf-8"))
            _check_model_config(path, saved.get("model_config"), expected_model_config)
        states = {name: _read_weights(path, name, model, map_location) for name, model in models.items()}
        try:
            train_state = torch.load(path / TRAIN_STATE, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as e:
            raise CheckpointError(
                f"{path / TRAIN_STATE} holds objects other than tensors and plain values; refusing to unpickle it "
                f"(weights_only=True): {e}"
            ) from e
        for name, model in models.items():
            unwrap_model(model).load_state_dict(states[name], strict=True)
        return train_state
