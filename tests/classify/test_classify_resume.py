"""Exact classifier resume with real processes: a run killed at an epoch boundary (SIGKILL, resumed from the epoch's
checkpoint) or stopped mid-epoch (SIGTERM) and resumed logs the uninterrupted run's losses and validation metrics,
with the full DeiT augmentation (random resized crop, flip, RandAugment, random erasing, Mixup / CutMix) on both
pipelines and from shards, and from synthetic images. The stopped and the resumed runs are real processes, forks of one
interpreter that imported the command's modules once (helpers.Forks)."""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

import pytest

from helpers import Forks, tiny_classify_recipe, write_dark_light_folder
from lightvision import cli
from lightvision.engine.trainer import TIMING_KEYS

DRIVER = Path(__file__).with_name("stop_at_step.py")
# data section and repeated augmentation: cpu augments in 2 loader workers, with RepeatAugSampler (16 x 3 / 3 per
# epoch); gpu on the device from a shuffled folder; shards in 2 workers, 2 shards of 4 images each; synthetic: 16
# random images per epoch, Mixup / CutMix on the device, and the optimizer's fused update (the CUDA default)
PIPELINES = {
    "cpu": ({"num_workers": "2"}, 3),
    "gpu": ({"pipeline": "gpu"}, 1),
    "shards": ({"num_workers": "2", "format": "shards"}, 1),
    "synthetic": ({"source": "synthetic", "synthetic_images": "16", "synthetic_val_images": "4"}, 1),
}
EPOCH = 4  # 16 images, batch 4
STEPS = 2 * EPOCH


def records(run: Path) -> tuple[list[dict], dict]:
    """The training and validation records (without the timing), and the final results (without steps_run)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    results = json.loads((run / "results.json").read_text())
    results.pop("steps_run")
    timeless = [{k: v for k, v in r.items() if k not in (*TIMING_KEYS, "time")} for r in rows]
    return [r for r in timeless if "steps_run" not in r], results


def train_args(tmp_path: Path, pipeline: str) -> list[str]:
    data, section = tmp_path / "data", PIPELINES[pipeline][0]
    write_dark_light_folder(data, per_class=8)
    if section.get("format") == "shards":
        for split in ("train", "val"):
            argv = ["classify", "make-shards", "--data", str(data), "--out", str(tmp_path / "shards")]
            assert cli.run([*argv, "--split", split, "--shard-size", "4"]) == 0
        data = tmp_path / "shards"
    recipe = tiny_classify_recipe(tmp_path, data, **section)
    return [
        "classify",
        "train",
        "--config",
        str(recipe),
        "--device",
        "cpu",
        f"aug.repeated_aug={PIPELINES[pipeline][1]}",
        *(["optim.fused=true"] if pipeline == "synthetic" else []),
    ]


@pytest.fixture(scope="module")
def reference(request, tmp_path_factory) -> tuple[list[str], tuple[list[dict], dict]]:
    """The uninterrupted run's command line, and its records and results."""
    tmp = tmp_path_factory.mktemp(f"reference-{request.param}")
    args = train_args(tmp, request.param)
    assert cli.run([*args, "--out", str(tmp / "run")]) == 0
    got = records(tmp / "run")
    assert [r["step"] for r in got[0] if "loss" in r] == list(range(1, STEPS + 1))
    assert [r["step"] for r in got[0] if "val_top1" in r] == [EPOCH]  # epoch 1; the final one is in the results
    return args, got


@pytest.fixture(scope="module")
def forks(tmp_path_factory):
    server = Forks(tmp_path_factory.mktemp("forks"))
    yield server
    server.close()


def wait_for_the_lock(run: Path, timeout: float = 60.0) -> None:
    """Until the run folder's lock is free: a killed run's loader workers hold it until they see (within seconds)
    that their parent is gone."""
    fd = os.open(run / ".lock", os.O_RDWR)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                assert time.monotonic() < deadline, "the killed run's lock was never released"
                time.sleep(0.1)
    finally:
        os.close(fd)


KILLED = ("KILL", EPOCH + 2, EPOCH)  # SIGKILL in step 6: resumed from the epoch-boundary checkpoint
TERMINATED = ("TERM", 2, 2)  # SIGTERM mid-epoch: checkpoints step 2 and stops


# both stops on the cpu pipeline, one each on the gpu pipeline, on shards and on synthetic images
@pytest.mark.parametrize(
    ("reference", "signal", "at", "resumes_from"),
    [("cpu", *KILLED), ("cpu", *TERMINATED), ("gpu", *TERMINATED), ("shards", *KILLED), ("synthetic", *TERMINATED)],
    indirect=["reference"],
)
def test_resume_repeats_the_run(tmp_path, forks, reference, signal, at, resumes_from):
    args, expected = reference
    run, env = tmp_path / "run", dict(os.environ)
    code, _, err = forks.run({"stopped": ([DRIVER, signal, at, *args, "--out", run], env, tmp_path)})["stopped"]
    assert code == (-9 if signal == "KILL" else 0), err[-2000:]
    assert (run / "checkpoints" / "latest").read_text().strip() == f"step_{resumes_from:07d}"
    wait_for_the_lock(run)
    argv = ["-m", "lightvision", *args, "--out", run, "--resume"]
    code, _, err = forks.run({"resumed": (argv, env, tmp_path)})["resumed"]
    assert code == 0, err[-2000:]
    assert records(run) == expected
