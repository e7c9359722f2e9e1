"""Faults: SIGKILL during a step and during a checkpoint write, SIGTERM (preemption); resume continues the
exact loss curve."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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


def run_script(run_dir: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), str(run_dir), "--max-steps", str(MAX_STEPS), *extra],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def kill_when(proc: subprocess.Popen, ready, timeout: float = 120.0) -> None:
    """SIGKILL ``proc`` as soon as ``ready()`` is true."""
    deadline = time.monotonic() + timeout
    try:
        while not ready():
            if proc.poll() is not None:
                pytest.fail(f"training exited early ({proc.returncode}): {proc.stderr.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail("training never reached the kill point")
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL


def resume_and_check(run_dir: Path, expected_latest: str, reference: list[tuple]) -> None:
    manager = CheckpointManager(run_dir)
    latest = manager.latest()
    assert latest is not None and latest.name == expected_latest
    model = TinyNet(**MODEL_CONFIG)
    state = manager.load(latest, models={"model": model}, expected_model_config=MODEL_CONFIG)
    assert state["step"] == int(expected_latest.split("_")[1])
    resumed = run_script(run_dir, "--resume")
    _, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err.decode()[-2000:]
    assert curve(run_dir) == reference
    assert not list((run_dir / "checkpoints").glob(".tmp-*")), "stale temporary checkpoint left behind"
    assert manager.latest().name == f"step_{MAX_STEPS:07d}"


def test_sigkill_during_step_resumes_exact_curve(tmp_path, reference):
    proc = run_script(tmp_path, env={"TINY_SLEEP_AT_STEP": "8"})
    kill_when(proc, (tmp_path / "in_step_8").exists)
    assert [r[0] for r in curve(tmp_path)] == list(range(1, 8))  # step 7 logged, not checkpointed
    resume_and_check(tmp_path, "step_0000006", reference)


def test_sigkill_during_checkpoint_write_keeps_previous(tmp_path, reference):
    proc = run_script(tmp_path, env={PAUSE_IN_SAVE_ENV: "6"})
    ckpt_dir = tmp_path / "checkpoints"
    kill_when(proc, lambda: any(ckpt_dir.glob(".tmp-step_0000006-*.paused")))
    partial = [p for p in ckpt_dir.glob(".tmp-step_0000006-*") if p.is_dir()]
    assert partial and (partial[0] / "model.safetensors").exists() and not (partial[0] / "manifest.json").exists()
    assert not (ckpt_dir / "step_0000006").exists()
    resume_and_check(tmp_path, "step_0000003", reference)


def test_sigterm_checkpoints_current_step_and_stops(tmp_path, reference):
    proc = run_script(tmp_path, env={"TINY_SIGTERM_AT_STEP": "5"})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert out.decode().split() == ["interrupted", "5"]
    assert [r[0] for r in curve(tmp_path)] == list(range(1, 6))
    resume_and_check(tmp_path, "step_0000005", reference)
