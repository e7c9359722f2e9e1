"""data.cache=device: the training images decoded once give the gpu pipeline's batches exactly, unreadable files are
skipped and counted, `classify train` runs with it, and unusable combinations (with data.source=synthetic too) are
refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_device_pipeline import MEAN, STD, write_jpeg_folder
from torch.utils.data import DataLoader

from helpers import tiny_classify_recipe, write_dark_light_folder
from lightvision import cli
from lightvision.classify import decoded as decoded_module
from lightvision.classify.data import (
    DeviceBatches,
    check_data_options,
    image_folder,
    make_train_loader,
)
from lightvision.classify.decoded import CachedBatches, DecodedImages
from lightvision.classify.device_transforms import DeviceTrainTransform
from lightvision.classify.encoded import collate_encoded, read_image_bytes
from lightvision.classify.train import DEFAULTS
from lightvision.engine import BatchRandom, use_batch_random

AUG = {**DEFAULTS["aug"], "scale": (0.3, 1.0)}


@pytest.mark.parametrize("varied_sizes", [True, False], ids=["sizes-vary", "one-size"])
def test_cached_batches_equal_the_gpu_pipeline(tmp_path, varied_sizes):
    write_dark_light_folder(tmp_path, per_class=5, suffix=".jpg", varied_sizes=varied_sizes)
    folder = image_folder(tmp_path, "train", None, loader=read_image_bytes)
    decoded = DecodedImages(folder, torch.device("cpu"), workers=0, batch_size=3, progress=False)
    assert isinstance(decoded.images, torch.Tensor) != varied_sizes and len(decoded) == len(folder) == 10
    assert decoded.targets == folder.targets and decoded.skipped_images() == 0
    transform = DeviceTrainTransform(AUG, 16, MEAN, STD)
    index = [7, 0, 3, 3, 9, 1]
    with use_batch_random(BatchRandom(5)):
        ref_images, ref_labels = DeviceBatches(transform.batch, folder)(collate_encoded([folder[i] for i in index]))
    with use_batch_random(BatchRandom(5)):
        images, labels = CachedBatches(transform.batch, decoded)(
            (torch.tensor(index), torch.tensor([decoded[i][1] for i in index]))
        )
    assert images.shape == (6, 3, 16, 16) and torch.equal(images, ref_images) and torch.equal(labels, ref_labels)


def test_decoding_skips_and_counts_unreadable_files(tmp_path):
    write_jpeg_folder(tmp_path)
    folder = image_folder(tmp_path, "train", None, loader=read_image_bytes)
    with pytest.warns(UserWarning, match="skipping unreadable image"):
        decoded = DecodedImages(folder, torch.device("cpu"), workers=0, batch_size=4, progress=False)
    assert decoded.skipped_images() >= 3 and len(decoded) == len(folder)  # t, x and z are each skipped once or more
    assert isinstance(decoded.images, list)  # varied sizes
    light = folder.class_to_idx["light"]
    for img, label in zip(decoded.images, decoded.targets):  # every slot holds an image of its label's class
        assert (img.float().mean() > 128) == (label == light)
    loader = make_train_loader({**DEFAULTS, "data": {**DEFAULTS["data"], "pipeline": "gpu"}}, decoded, 4, False)
    assert loader.num_workers == 0 and loader.collate_fn is not collate_encoded  # batches are (index, label)
    index, labels = next(iter(DataLoader(decoded, batch_size=5)))
    assert torch.equal(labels, decoded.labels[index])


def test_classify_train_with_device_cache(tmp_path):
    data, run = tmp_path / "data", tmp_path / "run"
    write_jpeg_folder(data)
    recipe = tiny_classify_recipe(
        tmp_path, data, "softmax_deit_tiny_patch16_224", "null", pipeline="gpu", cache="device"
    )
    with pytest.warns(UserWarning, match="skipping unreadable image"):
        assert cli.run(["classify", "train", "--config", str(recipe), "--out", str(run), "--device", "cpu"]) == 0
    assert json.loads((run / "config.json").read_text())["data"]["cache"] == "device"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 6 and all(np.isfinite(losses))  # 12 files / batch 4 x 2 epochs
    assert json.loads((run / "results.json").read_text())["skipped_images"] >= 3


def test_a_set_too_large_for_the_device_is_one_clear_error(tmp_path, monkeypatch):
    write_dark_light_folder(tmp_path, per_class=5, suffix=".jpg")
    folder = image_folder(tmp_path, "train", None, loader=read_image_bytes)
    monkeypatch.setattr(decoded_module, "memory_limit", lambda device: 20 * 20 * 3 * 5)  # room for 5 of 10 images
    with pytest.raises(ValueError, match="leave data.cache unset") as err:
        DecodedImages(folder, torch.device("cpu"), workers=0, batch_size=3, progress=False)
    assert "after 6 of 10 images" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "keys,message",
    [
        ({"cache": "host"}, "data.cache"),
        ({"cache": "device"}, "needs data.pipeline=gpu and data.format=folder"),
        ({"cache": "device", "pipeline": "gpu", "format": "shards"}, "needs data.pipeline=gpu"),
        ({"source": "synthetic", "pipeline": "gpu", "cache": "device"}, "data.source=synthetic reads no files"),
        ({"source": "synthetic", "format": "shards"}, "shards and data.cache=device do not apply to it"),
        ({"source": "synthetic", "synthetic_images": 0}, "data.synthetic_images must be a whole number at least 1"),
        ({"source": "webdataset"}, "unknown data.source 'webdataset'; valid: 'imagefolder', 'digits', 'synthetic'"),
        ({"prefetch_priority": "urgent"}, "unknown data.prefetch_priority 'urgent'; valid: 'high', 'low'"),
    ],
)
def test_unusable_data_settings_are_refused(keys, message):
    with pytest.raises(ValueError, match=message) as err:
        check_data_options({**DEFAULTS["data"], **keys})
    assert "\n" not in str(err.value)
