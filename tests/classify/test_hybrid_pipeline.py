"""data.pipeline=hybrid: the workers' crop is timm's, a batch travels as page-lockable uint8 with its labels, the
device runs what follows the crop, draws replay by (seed, epoch, position), and `classify train` runs."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import create_transform

from helpers import tiny_classify_recipe, write_dark_light_folder
from lightvision import cli
from lightvision.classify.cropped import HostImages, collate_cropped, crop_transform
from lightvision.classify.data import HostBatches, device_batches, make_train_loader, train_dataset
from lightvision.classify.device_transforms import DeviceTrainTransform
from lightvision.classify.train import DEFAULTS
from lightvision.engine import BatchRandom, use_batch_random

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def photo(h: int = 45, w: int = 70, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


@pytest.mark.parametrize("no_aug", [False, True])
def test_crop_transform_is_timms_crop_and_flip_as_uint8(no_aug):
    aug = {**DEFAULTS["aug"], "no_aug": no_aug}
    ours = crop_transform(aug, 24)
    if no_aug:  # timm's no_aug train transform without its tensor conversion and normalisation
        theirs = create_transform(24, is_training=True, no_aug=True, interpolation="bicubic").transforms[:-2]
    else:
        theirs = create_transform(
            24, is_training=True, scale=tuple(aug["scale"]), interpolation="bicubic", separate=True
        )[0].transforms
    for seed in range(8):
        img = photo(40 + 3 * seed, 70 - 2 * seed, seed)
        random.seed(seed)
        torch.manual_seed(seed)
        out = ours(img)
        random.seed(seed)
        torch.manual_seed(seed)
        ref = img
        for t in theirs:
            ref = t(ref)
        assert out.dtype == torch.uint8 and out.shape == (3, 24, 24)
        assert torch.equal(out, torch.from_numpy(np.array(ref)).permute(2, 0, 1)), seed


def test_cropped_transform_draws_no_crop_and_finishes_the_deit_transform():
    full = DeviceTrainTransform(DEFAULTS["aug"], 16, MEAN, STD, graph=False)
    cropped = DeviceTrainTransform(DEFAULTS["aug"], 16, MEAN, STD, graph=False, cropped=True)
    assert set(full.columns) - set(cropped.columns) == {"crop", "flip"}
    x = torch.randint(0, 256, (6, 3, 16, 16), dtype=torch.uint8)
    with use_batch_random(BatchRandom(3)):
        whole = cropped(x)
    with use_batch_random(BatchRandom(3)):  # the rest of the DeiT transform, with the same draws
        assert torch.equal(whole, cropped.augment(x, cropped.draw(6, x.device)))
    plain = {**DEFAULTS["aug"], "auto_augment": None, "color_jitter": None, "reprob": 0.0}
    for no_aug in (False, True):  # nothing random left (or no_aug): normalisation only
        tf = DeviceTrainTransform({**plain, "no_aug": no_aug}, 16, MEAN, STD, graph=False, cropped=True)
        ref = (x.float() / 255 - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
        assert torch.allclose(tf(x), ref)


def hybrid_cfg(root, batch: int = 4) -> dict:
    data = {**DEFAULTS["data"], "root": str(root), "pipeline": "hybrid", "image_size": 16}
    return {
        **DEFAULTS,
        "data": data,
        "train": {**DEFAULTS["train"], "batch_size": batch},
        "aug": {**DEFAULTS["aug"], "repeated_aug": 1},
    }


def test_loader_batches_are_cropped_uint8_and_replay_by_epoch(tmp_path):
    write_dark_light_folder(tmp_path, per_class=6, suffix=".jpg", varied_sizes=True)
    cfg = hybrid_cfg(tmp_path)
    runs = []
    for _ in range(2):
        loader = make_train_loader(cfg, train_dataset(cfg), workers=0, pin_memory=False)
        loader.sampler.set_epoch(3)
        runs.append(list(loader))
    first = runs[0][0]
    assert isinstance(first["images"], HostImages) and not isinstance(first["images"], torch.Tensor)
    assert first["images"].data.dtype == torch.uint8 and first["images"].data.shape == (4, 3, 16, 16)
    assert first["labels"].dtype == torch.int64 and len(first["images"]) == 4
    for a, b in zip(*runs, strict=True):  # the same (seed, epoch) gives the same crops
        assert torch.equal(a["images"].data, b["images"].data) and torch.equal(a["labels"], b["labels"])
    loader.sampler.set_epoch(4)
    assert not all(torch.equal(a["images"].data, b["images"].data) for a, b in zip(runs[0], loader))
    prepare = device_batches(cfg, train_dataset(cfg), train=True)
    assert isinstance(prepare, HostBatches) and prepare.transform.__self__.cropped
    with use_batch_random(BatchRandom(0)):
        images, labels = prepare(first)
    assert images.dtype == torch.float32 and images.shape == (4, 3, 16, 16) and torch.equal(labels, first["labels"])
    assert device_batches(cfg, train_dataset(cfg), train=False) is None  # evaluation: the cpu transform


def test_collate_cropped_pins_with_the_loader():
    items = [(torch.full((3, 4, 4), i, dtype=torch.uint8), i % 2) for i in range(3)]
    batch = collate_cropped(items)
    assert batch["labels"].tolist() == [0, 1, 0] and batch["images"].data[:, 0, 0, 0].tolist() == [0, 1, 2]
    if torch.cuda.is_available():
        assert batch["images"].pin_memory().data.is_pinned()


def test_classify_train_with_hybrid_pipeline_on_cpu(tmp_path):
    data, run = tmp_path / "data", tmp_path / "run"
    write_dark_light_folder(data, per_class=6, suffix=".jpg", varied_sizes=True)
    recipe = tiny_classify_recipe(tmp_path, data, "softmax_deit_tiny_patch16_224", "null", pipeline="hybrid")
    assert cli.run(["classify", "train", "--config", str(recipe), "--out", str(run), "--device", "cpu"]) == 0
    assert json.loads((run / "config.json").read_text())["data"]["pipeline"] == "hybrid"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 6 and all(np.isfinite(losses))  # 12 images / batch 4 x 2 epochs
    assert all("input_prepare_ms" in r for r in records if "loss" in r)  # the device part ran as prepare_batch
    assert json.loads((run / "results.json").read_text())["val_images"] == 12
