"""One writer per run folder, with real processes: a second `classify train` / `diffusion train` into a folder that
another process trains into is refused in one line naming the holder; a killed holder does not block the folder. The
`lightvision` processes are forks of one interpreter that imported the command's modules once (helpers.Forks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import Forks, tiny_classify_recipe, write_dark_light_folder
from lightvision import cli
from lightvision.engine.checkpoint import PAUSE_IN_SAVE_ENV
from lightvision.engine.run_lock import LOCK_FILE

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def forks(tmp_path_factory):
    server = Forks(tmp_path_factory.mktemp("forks"))
    yield server
    server.close()


def wait_for(pid: int, ready, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert Forks.running(pid), "exited early"
        assert time.monotonic() < deadline, "never got there"
        time.sleep(0.05)


def test_second_classify_train_is_refused_and_a_killed_holder_does_not_block(tmp_path, forks):
    data, run = tmp_path / "data", tmp_path / "run"
    write_dark_light_folder(data)
    train = ["-m", "lightvision", "classify", "train", "--config", tiny_classify_recipe(tmp_path, data), "--out", run]
    train += ["--device", "cpu"]
    env = dict(os.environ)
    # holds the folder, paused writing step 2
    first = forks.start({"first": (train, {**env, PAUSE_IN_SAVE_ENV: "2"}, tmp_path)})["first"]
    try:
        wait_for(first, lambda: any((run / "checkpoints").glob(".tmp-step_0000002-*.paused")))
        code, _, err = forks.run({"second": ([*train, "--resume"], env, tmp_path)})["second"]
        assert code == 1, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("lightvision: error: run folder"), err
        assert str(run) in lines[0] and f"pid {first} " in lines[0] and "another run folder" in lines[0]
    finally:
        os.kill(first, signal.SIGKILL)
        code, _, err = forks.wait("first")["first"]
    assert code == -signal.SIGKILL, err[-2000:]
    assert f"pid {first} " in (run / LOCK_FILE).read_text()  # the dead holder's lock file stays

    code, _, err = forks.run({"resumed": ([*train, "--resume"], env, tmp_path)})["resumed"]
    assert code == 0, err[-2000:]
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
