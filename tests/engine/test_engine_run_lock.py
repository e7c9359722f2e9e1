"""One writer per run folder, with real processes: a second `classify train` / `diffusion train` into a folder that
another process trains into is refused in one line naming the holder; a killed holder does not block the folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers import tiny_classify_recipe, write_dark_light_folder
from lightvision import cli
from lightvision.engine.checkpoint import PAUSE_IN_SAVE_ENV
from lightvision.engine.run_lock import LOCK_FILE

REPO = Path(__file__).resolve().parents[2]


def lightvision(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "lightvision", *args],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(proc: subprocess.Popen, ready, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"exited early ({proc.returncode}): {proc.stderr.read()[-2000:]}"
        assert time.monotonic() < deadline, "never got there"
        time.sleep(0.05)


def test_second_classify_train_is_refused_and_a_killed_holder_does_not_block(tmp_path):
    data, run = tmp_path / "data", tmp_path / "run"
    write_dark_light_folder(data)
    train = ["classify", "train", "--config", str(tiny_classify_recipe(tmp_path, data)), "--out", str(run)]
    train += ["--device", "cpu"]
    first = lightvision(*train, env={PAUSE_IN_SAVE_ENV: "2"})  # holds the folder, paused writing step 2
    try:
        wait_for(first, lambda: any((run / "checkpoints").glob(".tmp-step_0000002-*.paused")))
        second = lightvision(*train, "--resume")
        out, err = second.communicate(timeout=120)
        assert second.returncode == 1, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("lightvision: error: run folder"), err
        assert str(run) in lines[0] and f"pid {first.pid}" in lines[0] and "another run folder" in lines[0]
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate()
    assert f"pid {first.pid}" in (run / LOCK_FILE).read_text()  # the dead holder's lock file stays

    resumed = lightvision(*train, "--resume")
    _, err = resumed.communicate(timeout=180)
    assert resumed.returncode == 0, err[-2000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4]  # one writer: every step once


def test_diffusion_train_is_refused_while_another_process_holds_the_folder(tmp_path, capsys):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from lightvision.engine.run_lock import run_folder_lock\n"
            "with run_folder_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(600)",
            str(run),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        recipe = REPO / "configs" / "diffusion" / "cifar10.yaml"
        assert cli.main(["diffusion", "train", "--config", str(recipe), f"run.dir={run}", "--device", "cpu"]) == 1
        err = capsys.readouterr().err
        assert f"run folder {run} is in use by pid {holder.pid}" in err and len(err.strip().splitlines()) == 1
    finally:
        holder.kill()
        holder.wait()


def test_a_run_that_fails_at_start_leaves_no_folder(tmp_path, capsys):
    data, run = tmp_path / "data", tmp_path / "run"
    write_dark_light_folder(data)
    recipe = str(tiny_classify_recipe(tmp_path, data))
    missing = tmp_path / "no_such_data"  # found only after the run folder is locked
    assert cli.main(["classify", "train", "--config", recipe, "--out", str(run), f"data.root={missing}"]) == 1
    assert "no_such_data" in capsys.readouterr().err and not run.exists()
