"""CheckpointManager: atomic save, manifest verification, architecture check, pruning, best, latest, ENOSPC."""

from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest
import torch
from torch import nn

import lightvision.engine.checkpoint as ckpt_module
from lightvision.engine import (
    CheckpointError,
    CheckpointManager,
    load_model_weights,
    read_checkpoint_config,
)

CONFIG = {"dim": 4, "hidden": 8}


def tiny(hidden: int = 8, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 2))


def trained_state(model: nn.Module) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    return {"optimizer": opt.state_dict(), "step": 5, "nested": {"ids": (1, 2), "name": "x", "none": None}}


def snapshot(model: nn.Module) -> dict:
    return {k: v.clone() for k, v in model.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def save(manager: CheckpointManager, step: int, model: nn.Module, **kw) -> os.PathLike:
    return manager.save(
        step, models={"model": model, "ema": model}, model_config=CONFIG, train_state={"step": step}, **kw
    )


def test_round_trip(tmp_path):
    model = tiny()
    state = trained_state(model)
    manager = CheckpointManager(tmp_path)
    path = manager.save(
        5, models={"model": model, "ema": tiny(seed=1)}, model_config=CONFIG, train_state=state, config={"lr": 0.1}
    )
    assert path.name == "step_0000005" and manager.latest() == path
    assert sorted(p.name for p in path.iterdir()) == sorted(
        ["model.safetensors", "ema.safetensors", "config.json", "train_state.pt", "manifest.json"]
    )
    assert {p.stat().st_mode & 0o777 for p in path.iterdir()} == {(path / "config.json").stat().st_mode & 0o777}
    manifest = json.loads((path / "manifest.json").read_text())
    assert set(manifest["files"]) == {"model.safetensors", "ema.safetensors", "config.json", "train_state.pt"}
    fresh, fresh_ema = tiny(seed=2), tiny(seed=3)
    loaded = manager.load(path, models={"model": fresh, "ema": fresh_ema}, expected_model_config=dict(CONFIG))
    assert same(fresh.state_dict(), model.state_dict())
    assert same(fresh_ema.state_dict(), tiny(seed=1).state_dict())
    assert loaded["step"] == 5 and loaded["nested"] == {"ids": (1, 2), "name": "x", "none": None}
    assert torch.equal(loaded["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])
    assert torch.load(path / "train_state.pt", weights_only=True)["step"] == 5
    assert read_checkpoint_config(tmp_path) == {"model_config": CONFIG, "config": {"lr": 0.1}}


@pytest.mark.parametrize("wrap", [nn.DataParallel, torch.compile], ids=["data_parallel", "compile"])
def test_wrapped_models_saved_without_prefixes(tmp_path, wrap):
    model = tiny()
    path = CheckpointManager(tmp_path).save(1, models={"model": wrap(model)}, model_config=CONFIG, train_state={})
    from safetensors import safe_open

    with safe_open(path / "model.safetensors", "pt") as f:
        assert sorted(f.keys()) == sorted(model.state_dict())
    target = tiny(seed=4)
    load_model_weights(tmp_path, wrap(target), which="model")
    assert same(target.state_dict(), model.state_dict())


def corrupt_flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def corrupt_truncate(path):
    path.write_bytes(path.read_bytes()[:-7])


@pytest.mark.parametrize(
    ("file", "damage", "message"),
    [
        ("model.safetensors", corrupt_flip, "corrupt: its sha256"),
        ("ema.safetensors", corrupt_truncate, "truncated"),
        ("train_state.pt", corrupt_truncate, "truncated"),
        ("config.json", corrupt_flip, "corrupt"),
        ("manifest.json", lambda p: p.unlink(), "incomplete"),
        ("manifest.json", lambda p: p.write_text("{not json"), "unreadable"),
        ("ema.safetensors", lambda p: p.unlink(), "missing"),
    ],
    ids=[
        "model-flipped",
        "ema-truncated",
        "train_state-truncated",
        "config-flipped",
        "manifest-deleted",
        "manifest-not_json",
        "ema-deleted",
    ],
)
def test_damaged_checkpoint_refused_and_model_untouched(tmp_path, file, damage, message):
    path = save(CheckpointManager(tmp_path), 1, tiny())
    damage(path / file)
    target, target_ema = tiny(seed=9), tiny(seed=10)
    before, before_ema = snapshot(target), snapshot(target_ema)
    with pytest.raises(CheckpointError, match=message):
        CheckpointManager(tmp_path).load(path, models={"model": target, "ema": target_ema})
    assert same(target.state_dict(), before) and same(target_ema.state_dict(), before_ema)


def test_other_architecture_refused(tmp_path):
    path = save(CheckpointManager(tmp_path), 1, tiny())
    target = tiny(hidden=16)
    before = snapshot(target)
    with pytest.raises(CheckpointError, match=r"another architecture.*hidden: checkpoint 8, expected 16"):
        CheckpointManager(tmp_path).load(path, models={"model": target}, expected_model_config={"dim": 4, "hidden": 16})
    with pytest.raises(CheckpointError, match=r"do not fit the model: shape mismatches \['0.bias: checkpoint \(8,\)"):
        CheckpointManager(tmp_path).load(path, models={"model": target})
    assert same(target.state_dict(), before)


def test_keep_last_and_best(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2, mode="min")
    models = {step: tiny(seed=step) for step in range(1, 6)}
    for step, metric in zip(range(1, 6), [3.0, 1.0, 2.0, None, 1.5]):
        save(manager, step, models[step], metric=metric)
    assert [p.name for p in manager.checkpoints()] == ["step_0000004", "step_0000005"]
    assert manager.best_metric() == 1.0
    assert json.loads((manager.best() / "manifest.json").read_text())["step"] == 2
    target = tiny(seed=7)
    load_model_weights(tmp_path, target, which="model", checkpoint="best")
    assert same(target.state_dict(), models[2].state_dict())
    save(manager, 6, models[5], is_best=True)
    assert json.loads((manager.best() / "manifest.json").read_text())["step"] == 6


def test_latest_pointer_broken_falls_back(tmp_path):
    manager = CheckpointManager(tmp_path)
    save(manager, 1, tiny())
    save(manager, 2, tiny())
    pointer = tmp_path / "checkpoints" / "latest"
    for broken in ["garbage", "step_0000009", ""]:
        pointer.write_text(broken)
        assert manager.latest().name == "step_0000002"
    pointer.unlink()
    (tmp_path / "checkpoints" / "step_0000003").mkdir()  # interrupted copy without manifest
    assert manager.latest().name == "step_0000002"
    assert CheckpointManager(tmp_path / "elsewhere").latest() is None


@pytest.mark.parametrize("writer", ["save_file", "torch.save"])
def test_disk_full_keeps_previous_checkpoint(tmp_path, monkeypatch, writer):
    manager = CheckpointManager(tmp_path)
    model = tiny()
    save(manager, 1, model)
    owner, name = (ckpt_module, "save_file") if writer == "save_file" else (ckpt_module.torch, "save")
    real_write = getattr(owner, name)

    def full_disk(obj, target, *args, **kwargs):
        real_write(obj, target, *args, **kwargs)  # a partial file is on disk when the device fills up
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(owner, name, full_disk)
    with pytest.raises(
        CheckpointError,
        match=r"could not write checkpoint .*step_0000002: No space left on device; "
        r"previous checkpoint step_0000001 is intact",
    ):
        save(manager, 2, tiny(seed=5))
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_0000001"]
    target = tiny(seed=6)
    manager.load(manager.latest(), models={"model": target})
    assert same(target.state_dict(), model.state_dict())


def test_train_state_must_be_plain(tmp_path):
    with pytest.raises(TypeError, match=r"train_state\['rng'\]\['numpy'\] is a numpy.ndarray.*torch.as_tensor"):
        CheckpointManager(tmp_path).save(1, models={}, model_config=CONFIG, train_state={"rng": {"numpy": np.zeros(3)}})
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())


class Exploit:
    def __reduce__(self):
        return (os.mkdir, (EXPLOIT_DIR,))


EXPLOIT_DIR = ""


def test_pickled_object_in_train_state_refused(tmp_path):
    global EXPLOIT_DIR
    EXPLOIT_DIR = str(tmp_path / "pwned")
    path = save(CheckpointManager(tmp_path), 1, tiny())
    torch.save({"step": Exploit()}, path / "train_state.pt")
    manifest = json.loads((path / "manifest.json").read_text())  # a forged but consistent manifest
    manifest["files"]["train_state.pt"] = {
        "sha256": ckpt_module.sha256_file(path / "train_state.pt"),
        "size": (path / "train_state.pt").stat().st_size,
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    target = tiny(seed=3)
    before = snapshot(target)
    with pytest.raises(CheckpointError, match="refusing to unpickle"):
        CheckpointManager(tmp_path).load(path, models={"model": target})
    assert not os.path.exists(EXPLOIT_DIR)
    assert same(target.state_dict(), before)


def test_load_model_weights_needs_ema(tmp_path):
    CheckpointManager(tmp_path).save(1, models={"model": tiny()}, model_config=CONFIG, train_state={})
    with pytest.raises(CheckpointError, match=r"no EMA weights .*: use --weights model"):
        load_model_weights(tmp_path, tiny())
    with pytest.raises(CheckpointError, match="no latest checkpoint"):
        load_model_weights(tmp_path / "nowhere", tiny())
