"""scripts/make_imagenet_like.py (seeded, ImageNet-like sizes) and scripts/bench_input.py end to end on CPU with
tiny settings: every input setting trains, the JSON records them, the table comes last."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers import load_script


def fake_cifar(root: Path) -> Path:
    """cifar10-{train,test}-jpg.tar.gz with two classes of 32 x 32 JPEGs (the archives' layout)."""
    rng = np.random.default_rng(0)
    root.mkdir()
    for split in ("train", "test"):
        with tarfile.open(root / f"cifar10-{split}-jpg.tar.gz", "w:gz") as tar:
            for cls in ("cat", "dog"):
                for i in range(3):
                    buf = io.BytesIO()
                    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, "JPEG")
                    info = tarfile.TarInfo(f"{split}/{cls}/{i:04d}.jpg")
                    info.size = len(buf.getvalue())
                    tar.addfile(info, io.BytesIO(buf.getvalue()))
    return root


@pytest.fixture(scope="module")
def imagenet_like(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench_input")
    cifar, make = fake_cifar(tmp / "cifar"), load_script("make_imagenet_like")
    for out, workers in (("a", "2"), ("b", "1")):
        assert (
            make.main(
                [
                    "--cifar",
                    str(cifar),
                    "--out",
                    str(tmp / out),
                    "--count",
                    "12",
                    "--val-count",
                    "6",
                    "--workers",
                    workers,
                ]
            )
            == 0
        )
    return tmp


def test_imagenet_like_folder_is_seeded_and_imagenet_sized(imagenet_like):
    files = sorted((imagenet_like / "a").rglob("*.jpg"))
    assert len(files) == 18 and {f.parent.parent.name for f in files} == {"train", "val"}
    for f in files:
        assert f.read_bytes() == (imagenet_like / "b" / f.relative_to(imagenet_like / "a")).read_bytes()
        w, h = Image.open(f).size
        assert 400 <= max(w, h) <= 600 and 0.55 <= min(w, h) / max(w, h) <= 1.0


def test_bench_input_tiny_on_cpu(imagenet_like, capsys):
    """Synthetic, a stage-timed loop, the loaders alone, and classify train (each its own process): first from
    synthetic images, then for the three pipelines on the folder and the shards shrunk by --max-size on one pinned
    core, plus the op-by-op run and the run from images decoded into device memory; more cores than the machine has
    are skipped."""
    import os

    out = imagenet_like / "bench.json"
    # no loader processes: a loader worker forked from this many-threaded test process can hang on a lock
    tiny = ["--set", "model.args={patch_size: 8, embed_dim: 16, depth: 1, num_heads: 2}", "train.mixed_precision=no"]
    tiny += ["data.num_workers=0", "train.profile_steps=[2,1]"]  # the last step of each classify-train run
    args = ["--data", str(imagenet_like / "a"), "--out", str(out), "--work", str(imagenet_like / "work")]
    args += ["--device", "cpu", "--batch-size", "2", "--img-size", "16", "--workers", "0", "--warmup", "1"]
    args += ["--steps", "1", "--stage-steps", "1", "--loader-steps", "1", "--shard-size", "5", "--max-size", "300"]
    too_many = len(os.sched_getaffinity(0)) + 1
    args += ["--loop-settings", "synthetic", "folder_gpu", "--sources", "folder", "shards_max"]
    args += ["--cores", "1", str(too_many), "--loaders", *tiny]
    assert load_script("bench_input").main(args) == 0
    report = json.loads(out.read_text())
    env = report["env"]
    assert env["torchvision"] and env["device"] == "cpu" and env["cpu_cores"] >= 1 and "--img-size 16" in env["command"]
    shards = report["shards"]
    assert list(shards) == ["shards_max"] and shards["shards_max"]["resized"] == shards["shards_max"]["images"] == 12
    folder_mib = sum(f.stat().st_size for f in (imagenet_like / "a" / "train").rglob("*.jpg")) / 2**20
    assert shards["shards_max"]["mib"] < folder_mib  # 400..600 px images shrunk to a 300 px side
    results = report["results"]
    pipelines = ("gpu", "hybrid", "cpu")
    trained = [f"train_{s}_{p}_1c" for s in ("folder", "shards_max") for p in pipelines]
    eager = f"train_folder_gpu_eager_{too_many}c"
    skipped = [f"train_{s}_{p}_{too_many}c" for s in ("folder", "shards_max") for p in pipelines]
    cached = "train_folder_gpu_cached"
    loaders = [f"loader_{s}_{p}_{n}c" for n in (too_many, 1) for s in ("folder", "shards_max") for p in pipelines]
    assert list(results) == ["synthetic", "folder_gpu", *loaders, "train_synthetic", *skipped, eager, cached, *trained]
    for name in loaders[6:]:  # the loader alone: what its workers supply
        assert results[name]["images_per_s"] > 0 and results[name]["cores"] == 1 and "vs_synthetic" in results[name]
    assert all(results[n]["skipped"].startswith(f"needs {too_many} cores") for n in loaders[:6])
    for name in ["synthetic", "folder_gpu", "train_synthetic", cached, *trained]:
        r = results[name]
        assert "error" not in r, (name, r)
        assert r["images_per_s"] > 0 and r["img_size"] == 16 and r["vs_synthetic"] > 0
    train_synthetic = results["train_synthetic"]
    assert train_synthetic["source"] == "synthetic" and train_synthetic["cores"] == 1
    assert train_synthetic["vs_train_synthetic"] == 1.0 and train_synthetic["input_prepare_ms"] > 0  # gathers on device
    for name in [cached, *trained]:  # every train setting against the Trainer run without input
        rate = results[name]["images_per_s"] / train_synthetic["images_per_s"]
        assert results[name]["vs_train_synthetic"] == pytest.approx(rate)
    assert not any("vs_train_synthetic" in results[n] for n in ("synthetic", "folder_gpu"))  # loops, not the Trainer
    config = json.loads((imagenet_like / "work" / "run_train_synthetic" / "config.json").read_text())
    assert config["data"]["source"] == "synthetic" and config["data"]["synthetic_images"] == 12  # the folder's counts
    assert (config["data"]["synthetic_val_images"], config["data"]["synthetic_classes"]) == (6, 2)
    assert results["folder_gpu"]["decode_ms"] > 0 and results["folder_gpu"]["step_ms"] > 0
    assert all(results[n]["skipped"].startswith(f"needs {too_many} cores") for n in [*skipped, eager])
    assert results["train_shards_max_cpu_1c"]["cores"] == 1 and results["train_folder_gpu_1c"]["augment_graph"]
    assert all(0.0 <= results[n]["input_wait_share"] <= 1.0 for n in [cached, *trained])
    # the Trainer prepares these batches
    gpu_path = [cached, *(f"train_{s}_{p}_1c" for s in ("folder", "shards_max") for p in ("gpu", "hybrid"))]
    assert all(results[n]["input_prepare_ms"] >= results[n]["input_prepare_cpu_ms"] * 0.5 > 0 for n in gpu_path)
    staged = results["train_shards_max_gpu_1c"]  # decode, then augment: each stage's time, summing to the whole
    assert len(staged["input_stage_ms"]) == 2 and all(ms > 0 for ms in staged["input_stage_ms"])
    assert sum(staged["input_stage_ms"]) == pytest.approx(staged["input_prepare_ms"], abs=0.01)
    for name in [cached, *trained]:  # the loop thread's CPU per step, over the run and per window
        assert results[name]["loop_cpu_ms"] > 0 and results[name]["windows"][0]["loop_cpu_ms"] > 0
    assert "input_prepare_ms" not in results["train_folder_cpu_1c"]  # augmented in the loader: nothing to prepare
    for name in [cached, *trained]:  # each run's profile summary (train.profile_steps) joined its result
        assert results[name]["profile"]["steps"] == [2, 2] and results[name]["profile"]["loop"]["host_ms_per_step"] > 0
    assert results[cached]["cache"] == "device" and results[cached]["cores"] == 1
    assert results["train_folder_gpu_1c"]["cache"] is None
    assert "input_wait_share" not in results["synthetic"]
    assert (imagenet_like / "work" / "run_train_folder_gpu_1c" / "metrics.jsonl").is_file()
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-31].startswith("| setting |") and "| vs train_synthetic |" in printed[-31]
    assert printed[-15].startswith("| train_synthetic |") and printed[-1].startswith("| train_shards_max_cpu_1c |")


def test_epoch_of_each_source(imagenet_like):
    """What an epoch holds, which sets whether a run timed an epoch's end: the folder's train split, and for
    synthetic input the same count unless --set gives data.synthetic_images."""
    import argparse

    bench, data = load_script("bench_input"), imagenet_like / "a"
    assert bench.epoch_images(argparse.Namespace(data=data, set=[]), "shards_max") == 12
    assert bench.epoch_images(argparse.Namespace(data=data, set=[]), "synthetic") == 12
    given = argparse.Namespace(data=data, set=["train.compile=false", "data.synthetic_images=48000"])
    assert bench.epoch_images(given, "synthetic") == 48000 and bench.epoch_images(given, "folder") == 12


def test_bench_input_overlap_on_cpu(imagenet_like):
    """--overlap: the step alone and beside a thread preparing one batch a step (decode, augmentation, both), with
    Python's switch interval and a given one, each against the step alone at the same interval; the interval is
    restored."""
    import sys

    out = imagenet_like / "overlap.json"
    tiny = ["--set", "model.args={patch_size: 8, embed_dim: 16, depth: 1, num_heads: 2}", "train.mixed_precision=no"]
    args = ["--data", str(imagenet_like / "a"), "--out", str(out), "--work", str(imagenet_like / "work_overlap")]
    args += ["--device", "cpu", "--batch-size", "2", "--img-size", "16", "--warmup", "1", "--steps", "3"]
    args += ["--loop-settings", "--no-train", "--sources", "folder", "--overlap", "0.5", *tiny, "data.num_workers=0"]
    before = sys.getswitchinterval()
    assert load_script("bench_input").main(args) == 0
    assert sys.getswitchinterval() == before
    results = json.loads(out.read_text())["results"]
    work = ("none", "decode", "augment", "decode_augment", "host_decoded")
    names = [f"overlap_{w}" for w in work] + [f"overlap_{w}_switch0.5ms" for w in work]
    assert list(results) == names
    for name in names:
        r = results[name]
        assert "error" not in r, (name, r)
        assert r["images_per_s"] > 0 and r["vs_alone"] > 0 and r["switch_ms"] == (0.5 if "switch" in name else 5.0)
    assert results["overlap_none"]["vs_alone"] == 1.0 and results["overlap_none"]["prepare_ms"] is None
    assert all(results[n]["prepared_per_step"] > 0 and results[n]["prepare_ms"] > 0 for n in names if "none" not in n)


def test_bench_input_workers_decode_on_cpu(imagenet_like):
    """--pipelines gpu_workers: classify train with data.pipeline=gpu data.decode=workers, named as a pipeline."""
    out = imagenet_like / "workers.json"
    tiny = ["--set", "model.args={patch_size: 8, embed_dim: 16, depth: 1, num_heads: 2}", "train.mixed_precision=no"]
    args = ["--data", str(imagenet_like / "a"), "--out", str(out), "--work", str(imagenet_like / "work_workers")]
    args += ["--device", "cpu", "--batch-size", "2", "--img-size", "16", "--warmup", "1", "--steps", "1"]
    args += ["--loop-settings", "--sources", "folder", "--pipelines", "gpu_workers", "--cores", "1", "--no-eager"]
    args += ["--no-cached", *tiny, "data.num_workers=0"]
    assert load_script("bench_input").main(args) == 0
    results = json.loads(out.read_text())["results"]
    assert list(results) == ["train_synthetic", "train_folder_gpu_workers_1c"]
    r = results["train_folder_gpu_workers_1c"]
    assert "error" not in r, r
    assert r["images_per_s"] > 0 and r["pipeline"] == "gpu_workers" and r["input_prepare_ms"] > 0
    run = imagenet_like / "work_workers" / "run_train_folder_gpu_workers_1c"
    config = json.loads((run / "config.json").read_text())
    assert (config["data"]["pipeline"], config["data"]["decode"]) == ("gpu", "workers")
