"""data.pipeline=gpu with data.decode=workers: the workers decode and pack a batch, the device's crop and
augmentation give what the device decode gives for the same draws, unreadable files are skipped in the workers, the
settings it does not combine with are refused, and `classify train` runs."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image
from test_device_pipeline import write_jpeg_folder

from helpers import tiny_classify_recipe
from lightvision import cli
from lightvision.classify.data import (
    DeviceBatches,
    HostBatches,
    check_data_options,
    device_batches,
    make_train_loader,
    train_dataset,
)
from lightvision.classify.host_decoded import decoded_shard_image
from lightvision.classify.train import DEFAULTS
from lightvision.engine import BatchRandom, use_batch_random
from lightvision.kernels.resize import PackedImages


def gpu_cfg(root, decode: str) -> dict:
    data = {**DEFAULTS["data"], "root": str(root), "pipeline": "gpu", "decode": decode, "image_size": 16}
    return {
        **DEFAULTS,
        "data": data,
        "train": {**DEFAULTS["train"], "batch_size": 4},
        "aug": {**DEFAULTS["aug"], "repeated_aug": 1},
    }


def first_batch(cfg: dict):
    dataset = train_dataset(cfg)
    torch.manual_seed(5)  # the loader's shuffle
    return dataset, next(iter(make_train_loader(cfg, dataset, workers=0, pin_memory=False)))


def test_workers_decode_gives_what_the_device_decode_gives(tmp_path):
    write_jpeg_folder(tmp_path, corrupt=False)
    folder, batch = first_batch(gpu_cfg(tmp_path, "workers"))
    packed = batch["images"]
    assert isinstance(packed, PackedImages) and packed.data.dtype == torch.uint8 and len(packed) == 4
    assert {tuple(img.shape[1:]) for img in packed} != {(16, 16)}  # full-size images, not crops
    prepare = device_batches(gpu_cfg(tmp_path, "workers"), folder, train=True)
    assert isinstance(prepare, HostBatches) and not prepare.transform.__self__.cropped
    _, encoded = first_batch(gpu_cfg(tmp_path, "device"))
    device_decode = device_batches(gpu_cfg(tmp_path, "device"), folder, train=True)
    assert isinstance(device_decode, DeviceBatches)
    decoded, _ = device_decode.decode(encoded)
    assert all(torch.equal(a, b) for a, b in zip(packed, decoded, strict=True))  # the same libjpeg decode
    outs = []
    for fn, b in ((prepare, batch), (device_decode, encoded)):
        with use_batch_random(BatchRandom(9)):
            outs.append(fn(b))
    (images, labels), (reference, ref_labels) = outs
    assert images.shape == (4, 3, 16, 16) and torch.equal(images, reference) and torch.equal(labels, ref_labels)


def test_unreadable_images_are_skipped_in_the_workers(tmp_path):
    write_jpeg_folder(tmp_path)  # a truncated JPEG, a non-image, a JPEG that does not decode, a PNG
    cfg = gpu_cfg(tmp_path, "workers")
    dataset = train_dataset(cfg)
    with pytest.warns(UserWarning, match="skipping unreadable image") as caught:
        images = [dataset[i][0][0] for i in range(len(dataset))]
    assert any("does not decode" in str(w.message) for w in caught)  # z.jpg: decoded in the worker, refused there
    assert dataset.skipped_images() >= 3 and all(img.dtype == torch.uint8 and img.shape[0] == 3 for img in images)
    buf = io.BytesIO()
    Image.fromarray(np.full((9, 7, 3), 99, np.uint8)).save(buf, "JPEG")
    image, key = decoded_shard_image(buf.getvalue(), "a/b")
    assert key == "a/b" and image.shape == (3, 9, 7)
    with pytest.raises(ValueError, match="c/d does not decode"):
        decoded_shard_image(b"\xff\xd8\xff" + bytes(range(256)) * 4 + b"\xff\xd9", "c/d")


def test_decode_setting_is_checked():
    base = {**DEFAULTS["data"], "pipeline": "gpu"}
    check_data_options({**base, "decode": "workers"})
    with pytest.raises(ValueError, match="unknown data.decode .gpu.; valid: .device., .workers."):
        check_data_options({**base, "decode": "gpu"})
    for other in ({"pipeline": "cpu"}, {"pipeline": "hybrid"}, {"cache": "device"}):
        with pytest.raises(ValueError, match="data.decode=workers says where the gpu pipeline decodes"):
            check_data_options({**base, "decode": "workers", **other})


def test_classify_train_with_workers_decode_on_cpu(tmp_path):
    data, run = tmp_path / "data", tmp_path / "run"
    write_jpeg_folder(data, corrupt=False)
    recipe = tiny_classify_recipe(tmp_path, data, "softmax_deit_tiny_patch16_224", "null", pipeline="gpu")
    args = ["classify", "train", "--config", str(recipe), "--out", str(run), "--device", "cpu", "data.decode=workers"]
    assert cli.run(args) == 0
    assert json.loads((run / "config.json").read_text())["data"]["decode"] == "workers"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 4 and all(np.isfinite(losses))  # 8 images / batch 4 x 2 epochs
    assert all("input_prepare_ms" in r for r in records if "loss" in r)  # crop and augmentation as prepare_batch
    assert json.loads((run / "results.json").read_text())["val_images"] == 8  # evaluated through the device decode


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_packed_batch_on_cuda_equals_its_images_as_a_list(tmp_path):
    """On CUDA the page-locked packed batch, copied in one transfer and cropped in place (graphs replayed), gives
    what the same decoded images give as a list of device tensors, exactly."""
    write_jpeg_folder(tmp_path, corrupt=False)
    cfg = gpu_cfg(tmp_path, "workers")
    cfg["data"]["augment_graph"] = True
    folder, batch = first_batch(cfg)
    packed = batch["images"].pin_memory()
    assert packed.data.is_pinned()
    prepare = device_batches(cfg, folder, train=True)
    labels = batch["labels"].cuda()
    outs = []
    for images in (packed.on(labels.device), [img.cuda() for img in batch["images"]]):
        with use_batch_random(BatchRandom(2)):
            outs.append(prepare.transform(images, labels)[0])
    assert outs[0].is_cuda and torch.equal(outs[0], outs[1])
    with use_batch_random(BatchRandom(2)):
        images, out_labels = prepare({"labels": labels, "images": packed})
    assert torch.equal(images, outs[0]) and torch.equal(out_labels, labels)
