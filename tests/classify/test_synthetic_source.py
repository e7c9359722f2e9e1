"""data.source=synthetic: `classify train` reads no file; the model sees batches of the random pool gathered on the
training device, Mixup / CutMix runs on the device where the batch is prepared, both pipelines train alike, and a run
evaluates only on a folder."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers import tiny_classify_recipe
from lightvision import cli
from lightvision.classify import train as train_module
from lightvision.classify.data import make_train_loader
from lightvision.classify.device_mixup import DeviceMixup
from lightvision.classify.synthetic import POOL_BATCHES, SyntheticImages
from lightvision.classify.train import DEFAULTS

# 24 images per epoch (6 steps of batch 4) over a pool of 4 batches (16 images), 6 validation images, 3 classes
SYNTHETIC = {"source": "synthetic", "synthetic_images": 24, "synthetic_val_images": 6, "synthetic_classes": 3}
MAKE_LOSS_FN = train_module.make_loss_fn


def train_synthetic(tmp_path, monkeypatch, pipeline: str) -> tuple[list[float], list, list, dict]:
    """A 2-epoch tiny run from a recipe whose data.root does not exist: its losses, the (mixup, mixed, images, targets)
    of every batch its loss function got, the (images, labels) every Mixup call got, and its results."""
    seen, gathered = [], []

    def recording(mixup, smoothing, sizes=None, mixed=False):
        loss_fn = MAKE_LOSS_FN(mixup, smoothing, sizes, mixed)

        def record(model, batch):
            seen.append((mixup, mixed, batch[0].clone(), batch[1].clone()))
            return loss_fn(model, batch)

        return record

    def mixing(self, x, labels, mix=DeviceMixup.__call__):
        gathered.append((x.clone(), labels.clone()))
        return mix(self, x, labels)

    monkeypatch.setattr(train_module, "make_loss_fn", recording)
    monkeypatch.setattr(DeviceMixup, "__call__", mixing)
    folder, missing = tmp_path / pipeline, tmp_path / "no-data"
    folder.mkdir()
    recipe = tiny_classify_recipe(
        folder, missing, "softmax_deit_tiny_patch16_224", "0.9", pipeline=pipeline, **SYNTHETIC
    )
    run = folder / "run"
    assert cli.run(["classify", "train", "--config", str(recipe), "--out", str(run), "--device", "cpu"]) == 0
    assert not missing.exists()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == list(range(1, 13))  # 24 images / batch 4 x 2 epochs
    return [r["loss"] for r in records if "loss" in r], seen, gathered, json.loads((run / "results.json").read_text())


def test_classify_train_from_the_synthetic_pool(tmp_path, monkeypatch):
    losses, seen, gathered, results = train_synthetic(tmp_path, monkeypatch, "cpu")
    assert all(np.isfinite(losses)) and len(seen) == len(gathered) == 12
    pool = SyntheticImages(24, POOL_BATCHES * 4, 16, 3, 3, "cpu", seed=0)  # the recipe's: train.seed 0
    assert pool.images.shape == (16, 3, 16, 16) and set(pool.targets) <= {0, 1, 2}
    for mixup, mixed, images, targets in seen:
        assert isinstance(mixup, DeviceMixup) and mixed  # the gpu pipeline's, though data.pipeline is cpu: the batch
        assert images.shape == (4, 3, 16, 16) and images.dtype == torch.float32 and images.device.type == "cpu"
        assert targets.shape == (4, 3) and torch.allclose(targets.sum(1), torch.ones(4))  # ... comes mixed
    drawn = set()
    for images, labels in gathered:
        match = (images[:, None] == pool.images[None]).flatten(2).all(-1)  # [batch, pool]: which pool image it is
        assert match.sum(1).tolist() == [1, 1, 1, 1]
        slots = match.float().argmax(1)
        assert torch.equal(labels, pool.labels[slots])
        drawn |= set(slots.tolist())
    assert len(drawn) > 8  # the batches come from all over the pool
    assert results["val_images"] == results["val_set_size"] == 6 and 0 <= results["val_top1"] <= 100
    assert "val_ema_top1" in results and "skipped_images" not in results

    gpu_losses, gpu_seen, _, _ = train_synthetic(tmp_path, monkeypatch, "gpu")
    assert gpu_losses == losses  # images on the device either way: the same run
    assert len(gpu_seen) == 12 and all(torch.equal(a[2], b[2]) for a, b in zip(seen, gpu_seen))

    with pytest.raises(ValueError, match=r"trained on synthetic images .*: pass --data PATH"):
        cli.run(
            ["classify", "eval", "--checkpoint", str(tmp_path / "cpu" / "run"), "--img-size", "16", "--device", "cpu"]
        )


def test_synthetic_set_loads_indices_in_this_process():
    cfg = {**DEFAULTS, "data": {**DEFAULTS["data"], **SYNTHETIC}, "train": {**DEFAULTS["train"], "batch_size": 4}}
    dataset = SyntheticImages(24, 16, 8, 1, 3, "cpu", seed=1)
    assert len(dataset) == 24 and dataset[17] == (1, dataset.targets[1]) and dataset.classes == ["0", "1", "2"]
    assert dataset.images.shape == (16, 1, 8, 8) and abs(dataset.images.std().item() - 1) < 0.1
    loader = make_train_loader(cfg, dataset, workers=4, pin_memory=False)
    assert loader.num_workers == 0 and loader.dataset is dataset  # no loader workers, no per-sample draws
    index, labels = next(iter(loader))
    assert index.max() < 16 and torch.equal(labels, dataset.labels[index])
