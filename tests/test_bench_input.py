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
    out = imagenet_like / "bench.json"
    assert (
        load_script("bench_input").main(
            [
                "--data",
                str(imagenet_like / "a"),
                "--out",
                str(out),
                "--work",
                str(imagenet_like / "work"),
                "--device",
                "cpu",
                "--batch-size",
                "2",
                "--img-size",
                "16",
                "--workers",
                "0",
                "--warmup",
                "1",
                "--steps",
                "1",
                "--stage-steps",
                "1",
                "--loader-steps",
                "1",
                "--shard-size",
                "5",
                "--set",
                "model.args={patch_size: 8, embed_dim: 16, depth: 1, num_heads: 2}",
                "train.mixed_precision=no",
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    env = report["env"]
    assert env["torchvision"] and env["device"] == "cpu" and env["cpu_cores"] >= 1 and "--img-size 16" in env["command"]
    results = report["results"]
    trainer = ["trainer_gpu", "trainer_gpu_inline", "trainer_cpu"]
    assert list(results) == ["synthetic", "folder_cpu", "folder_gpu", "shards_gpu", *trainer]
    for name, r in results.items():
        assert "error" not in r, (name, r)
        assert r["images_per_s"] > 0 and r["img_size"] == 16 and (name in trainer or r["step_ms"] > 0)
    assert results["folder_gpu"]["decode_ms"] > 0 and results["shards_gpu"]["loader_images_per_s"] > 0
    assert [results[n]["prefetch"] for n in trainer] == [True, False, True] and results["trainer_gpu"]["steps"] == 1
    assert (imagenet_like / "work" / "run_trainer_gpu" / "metrics.jsonl").is_file()
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-9].startswith("| setting |") and printed[-1].startswith("| trainer_cpu |")
