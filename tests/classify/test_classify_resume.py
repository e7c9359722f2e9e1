"""Exact classifier resume with real processes: a run killed at an epoch boundary (SIGKILL, resumed from the epoch's
checkpoint) or stopped mid-epoch (SIGTERM) and resumed logs the uninterrupted run's losses and validation metrics,
with the full DeiT augmentation (random resized crop, flip, RandAugment, random erasing, Mixup / CutMix) on both
pipelines and from shards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import tiny_classify_recipe, write_dark_light_folder
from lightvision import cli

DRIVER = Path(__file__).with_name("stop_at_step.py")
# data section and repeated augmentation: cpu augments in 2 loader workers, with RepeatAugSampler (16 x 3 / 3 per
# epoch); gpu on the device from a shuffled folder; shards in 2 workers, 2 shards of 4 images each
PIPELINES = {
    "cpu": ({"num_workers": "2"}, 3),
    "gpu": ({"pipeline": "gpu"}, 1),
    "shards": ({"num_workers": "2", "format": "shards"}, 1),
}
EPOCH = 4  # 16 images, batch 4
STEPS = 2 * EPOCH


def records(run: Path) -> tuple[list[dict], dict]:
    """The training and validation records (without the timing), and the final results (without steps_run)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    results = json.loads((run / "results.json").read_text())
    results.pop("steps_run")
    timeless = [{k: v for k, v in r.items() if k not in ("steps_per_s", "time")} for r in rows]
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


KILLED = ("KILL", EPOCH + 2, EPOCH)  # SIGKILL in step 6: resumed from the epoch-boundary checkpoint
TERMINATED = ("TERM", 2, 2)  # SIGTERM mid-epoch: checkpoints step 2 and stops


# both stops on the cpu pipeline, one each on the gpu pipeline and on shards
@pytest.mark.parametrize(
    ("reference", "signal", "at", "resumes_from"),
    [("cpu", *KILLED), ("cpu", *TERMINATED), ("gpu", *TERMINATED), ("shards", *KILLED)],
    indirect=["reference"],
)
def test_resume_repeats_the_run(tmp_path, reference, signal, at, resumes_from):
    args, expected = reference
    run = tmp_path / "run"
    stopped = subprocess.run(
        [sys.executable, str(DRIVER), signal, str(at), *args, "--out", str(run)], capture_output=True, text=True
    )
    assert stopped.returncode == (-9 if signal == "KILL" else 0), stopped.stderr[-2000:]
    assert (run / "checkpoints" / "latest").read_text().strip() == f"step_{resumes_from:07d}"
    resumed = subprocess.run(
        [sys.executable, "-m", "lightvision", *args, "--out", str(run), "--resume"], capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert records(run) == expected
