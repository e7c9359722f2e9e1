"""`classify make-shards` writes an ImageFolder split as tar shards; ShardDataset reads back the same images and
labels (both pipelines), and `classify train` runs on shards."""

from __future__ import annotations

import io
import json
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
from test_device_pipeline import recipe, write_jpeg_folder

from lightvision import cli
from lightvision.classify.data import image_folder
from lightvision.classify.shards import ShardDataset, checked_bytes, decode_pil


@pytest.fixture
def shards(tmp_path):
    data, out = tmp_path / "data", tmp_path / "shards"
    write_jpeg_folder(data, corrupt=False)
    for split in ("train", "val"):
        assert (
            cli.run(
                [
                    "classify",
                    "make-shards",
                    "--data",
                    str(data),
                    "--out",
                    str(out),
                    "--split",
                    split,
                    "--shard-size",
                    "3",
                ]
            )
            == 0
        )
    return data, out


def test_shards_hold_the_folder(shards, capsys):
    data, out = shards
    index = json.loads((out / "train.json").read_text())
    assert index["count"] == 8 and len(index["shards"]) == 3 and index["classes"] == ["dark", "light"]
    assert sorted(p.name for p in out.glob("train-*.tar")) == index["shards"]
    folder = image_folder(data, "train", None)
    expect = Counter((Path(path).read_bytes(), label) for path, label in folder.samples)
    read = ShardDataset(out, "train", checked_bytes, train=False)
    items = list(read)
    assert read.classes == folder.classes and len(read) == 8
    assert Counter((bytes(data.numpy()), label) for (data, _), label in items) == expect
    decoded = list(ShardDataset(out, "train", decode_pil, train=False, transform=lambda img: torch.tensor(img.size)))
    assert Counter((tuple(size.tolist()), label) for size, label in decoded) == Counter(
        (folder.loader(path).size, label) for path, label in folder.samples
    )


def test_training_stream_repeats_each_kept_image(shards):
    _, out = shards
    stream = [
        (bytes(data.numpy()), label)
        for (data, _), label in ShardDataset(out, "train", checked_bytes, train=True, repeats=2)
    ]
    counts = Counter(stream)
    assert len(stream) == 8 and set(counts.values()) == {2}  # 4 of 8 images kept, each twice


def test_worker_balance_names_uneven_and_idle_workers(shards):
    """3 shards: even over 1 or 3 workers; over 2 the last third of an epoch is read by one worker; over 4 one reads
    nothing. A last round of at most 5% of the epoch is not worth a warning."""
    _, out = shards
    read = ShardDataset(out, "train", checked_bytes, train=True)
    assert read.worker_balance(1) is None and read.worker_balance(3) is None
    uneven = read.worker_balance(2)
    assert "3 shards over 2 loader workers" in uneven and "33%" in uneven and "make-shards --shard-size" in uneven
    assert "1 of them read nothing" in read.worker_balance(4) and "data.num_workers=3" in read.worker_balance(4)
    read.urls = [f"train-{i:06d}.tar" for i in range(1282)]  # ImageNet's 1.28 M images in shards of 1000
    assert read.worker_balance(16) is None  # the last 2 shards of 1,282: 0.2% of an epoch


def test_classify_train_on_shards(shards, tmp_path):
    _, out = shards
    for pipeline in ("gpu", "cpu"):
        run = tmp_path / f"run-{pipeline}"
        cfg = recipe(tmp_path, out, pipeline=pipeline, format="shards")
        assert cli.run(["classify", "train", "--config", str(cfg), "--out", str(run), "--device", "cpu"]) == 0
        results = json.loads((run / "results.json").read_text())
        assert results["step"] == 4 and results["val_images"] == 8 and results["skipped_images"] == 0


def test_make_shards_leaves_out_unreadable_files_and_names_them(tmp_path, capsys):
    data, out = tmp_path / "data", tmp_path / "shards"
    write_jpeg_folder(data)  # train/dark: truncated t.jpg, x.jpg not an image, z.jpg that does not decode
    (data / "train" / "light" / "e.jpg").write_bytes(b"")
    assert cli.main(["classify", "make-shards", "--data", str(data), "--out", str(out), "--split", "train"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["count"] == 9 and json.loads(captured.out)["skipped"] == 4
    index = json.loads((out / "train.json").read_text())
    bad = ["dark/t.jpg", "dark/x.jpg", "dark/z.jpg", "light/e.jpg"]
    assert index["count"] == 9 and [name for name, _ in index["skipped"]] == bad
    assert dict(index["skipped"])["light/e.jpg"] == "empty file (0 bytes)"
    assert "left out 4 unreadable image(s)" in captured.err and all(name in captured.err for name in bad)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="skipping unreadable")  # nothing left to skip when reading
        items = list(ShardDataset(out, "train", decode_pil, train=False))
    assert len(items) == 9


def test_make_shards_max_size_shrinks_only_larger_images(tmp_path, capsys):
    """--max-size 30: images whose shorter side passes 30 are stored as JPEGs with that side 30 (aspect kept within
    a pixel), the others as their own bytes; both pipelines read them; the index counts the shrunk ones."""
    from PIL import Image

    data, out = tmp_path / "data", tmp_path / "shards"
    write_jpeg_folder(data, corrupt=False)  # sides in [20, 48)
    args = ["classify", "make-shards", "--data", str(data), "--out", str(out), "--max-size", "30", "--workers", "2"]
    assert cli.main(args) == 0
    folder = image_folder(data, "train", None)
    originals = {str(Path(path).relative_to(folder.root)): Path(path).read_bytes() for path, _ in folder.samples}
    items = list(ShardDataset(out, "train", lambda raw, key: (raw, key), train=False))
    larger = 0
    for (raw, key), _ in items:
        w, h = Image.open(io.BytesIO(originals[key])).size
        if min(w, h) <= 30:
            assert raw == originals[key], key
            continue
        larger += 1
        sw, sh = Image.open(io.BytesIO(raw)).size
        assert min(sw, sh) == 30 and abs(sw / sh - w / h) < 2 / 30, (key, (w, h), (sw, sh))
    index = json.loads((out / "train.json").read_text())
    assert 0 < larger < len(items) == 8 and index["resized"] == larger and index["max_size"] == 30
    assert json.loads(capsys.readouterr().out)["resized"] == larger
    assert len(list(ShardDataset(out, "train", decode_pil, train=False))) == 8
    assert cli.main([*args[:-4], "--max-size", "0"]) == 1
    assert capsys.readouterr().err.startswith("lightvision: error: --max-size must be at least 1 pixel, got 0")


def test_persistent_loader_workers_read_each_epoch_as_fresh_workers_do(shards):
    """Loader workers kept between epochs see set_epoch (shared memory): every epoch's stream is the one fresh
    workers read for that epoch, and the epochs differ (a new shuffle each)."""
    from torch.utils.data import DataLoader

    _, out = shards

    def keys(loader):
        return [key for batch in loader for key in batch]

    def loader(dataset, persistent):
        names = lambda items: [name for (_, name), _ in items]  # noqa: E731
        return DataLoader(dataset, batch_size=2, num_workers=2, persistent_workers=persistent, collate_fn=names)

    kept = ShardDataset(out, "train", checked_bytes, train=True, repeats=1)
    persistent = loader(kept, True)
    epochs = []
    for epoch in range(3):
        kept.set_epoch(epoch)
        fresh = ShardDataset(out, "train", checked_bytes, train=True, repeats=1)
        fresh.set_epoch(epoch)
        epochs.append(keys(persistent))
        assert epochs[-1] == keys(loader(fresh, False)) and sorted(epochs[-1]) == sorted(epochs[0])
    assert len({tuple(e) for e in epochs}) == 3
