"""Faults: SIGKILL during a step and during a checkpoint write, SIGTERM (preemption); resume continues the
exact loss curve. The training processes are forks of one interpreter that imported the command's modules once
(helpers.Forks)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from helpers import Forks
from lightvision.engine import CheckpointManager, MetricsLogger
from lightvision.engine.checkpoint import PAUSE_IN_SAVE_ENV
from train_tiny import MODEL_CONFIG, TinyNet, build

SCRIPT = Path(__file__).with_name("train_tiny.py")
MAX_STEPS = 10
CURVE_KEYS = ("loss", "rmse", "grad_norm", "lr", "epoch")


def curve(run_dir: Path) -> list[tuple]:
    return [(r["step"], *(r[k] for k in CURVE_KEYS)) for r in MetricsLogger(run_dir).records() if "loss" in r]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[tuple]:
    """The uninterrupted run's curve."""
    run_dir = tmp_path_factory.mktemp("reference")
    build(run_dir, MAX_STEPS).fit()
    result = curve(run_dir)
    assert [r[0] for r in result] == list(range(1, MAX_STEPS + 1))
    return result


@pytest.fixture(scope="module")
def forks(tmp_path_factory):
    server = Forks(tmp_path_factory.mktemp("forks"))
    yield server
    server.close()


def run_script(forks: Forks, run_dir: Path, *extra: str, env: dict | None = None) -> int:
    """Start train_tiny.py on ``run_dir`` (as case "train"); its pid."""
    argv = [SCRIPT, run_dir, "--max-steps", MAX_STEPS, *extra]
    return forks.start({"train": (argv, {**os.environ, **(env or {})}, os.getcwd())})["train"]


def kill_when(forks: Forks, pid: int, ready, timeout: float = 120.0) -> None:
    """SIGKILL the training process ``pid`` as soon as ``ready()`` is true."""
    deadline = time.monotonic() + timeout
    while not ready():
        if not forks.running(pid):
            code, _, err = forks.wait("train")["train"]
            pytest.fail(f"training exited early ({code}): {err[-2000:]}")
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            forks.wait("train")
            pytest.fail("training never reached the kill point")
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    assert forks.wait("train")["train"][0] == -signal.SIGKILL


def resume_and_check(forks: Forks, run_dir: Path, expected_latest: str, reference: list[tuple]) -> None:
    manager = CheckpointManager(run_dir)
    latest = manager.latest()
    assert latest is not None and latest.name == expected_latest
    model = TinyNet(**MODEL_CONFIG)
    state = manager.load(latest, models={"model": model}, expected_model_config=MODEL_CONFIG)
    assert state["step"] == int(expected_latest.split("_")[1])
    run_script(forks, run_dir, "--resume")
    code, _, err = forks.wait("train")["train"]
    assert code == 0, err[-2000:]
    assert curve(run_dir) == reference
    assert not list((run_dir / "checkpoints").glob(".tmp-*")), "stale temporary checkpoint left behind"
    assert manager.latest().name == f"step_{MAX_STEPS:07d}"


def test_sigkill_during_step_resumes_exact_curve(tmp_path, forks, reference):
    pid = run_script(forks, tmp_path, env={"TINY_SLEEP_AT_STEP": "8"})
    kill_when(forks, pid, (tmp_path / "in_step_8").exists)
    assert [r[0] for r in curve(tmp_path)] == list(range(1, 8))  # step 7 logged, not checkpointed
    resume_and_check(forks, tmp_path, "step_0000006", reference)


def test_sigkill_during_checkpoint_write_keeps_previous(tmp_path, forks, reference):
    pid = run_script(forks, tmp_path, env={PAUSE_IN_SAVE_ENV: "6"})
    ckpt_dir = tmp_path / "checkpoints"
    kill_when(forks, pid, lambda: any(ckpt_dir.glob(".tmp-step_0000006-*.paused")))
    partial = [p for p in ckpt_dir.glob(".tmp-step_0000006-*") if p.is_dir()]
    assert partial and (partial[0] / "model.safetensors").exists() and not (partial[0] / "manifest.json").exists()
    assert not (ckpt_dir / "step_0000006").exists()
    resume_and_check(forks, tmp_path, "step_0000003", reference)


def test_sigterm_checkpoints_current_step_and_stops(tmp_path, forks, reference):
    run_script(forks, tmp_path, env={"TINY_SIGTERM_AT_STEP": "5"})
    code, out, err = forks.wait("train")["train"]
    assert code == 0, err[-2000:]
    assert out.split() == ["interrupted", "5"]
    assert [r[0] for r in curve(tmp_path)] == list(range(1, 6))
    resume_and_check(forks, tmp_path, "step_0000005", reference)
