"""CIFAR-10 yardstick: decoding (folders and archives), on-device augmentation, a few training steps through the CLI,
and the written weights as the FID feature network."""

import io
import json
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image

from lightvision.classify.yardstick import augment, load_images
from lightvision.engine.batch_random import BatchRandom, use_batch_random
from lightvision.engine.yardstick_net import YardstickNet, load_yardstick, save_yardstick


def write_split(root, split, per_class=6, size=32, seed=0):
    """Two classes of JPEGs: bright-top vs bright-bottom images (learnable), with noise."""
    rng = np.random.default_rng(seed)
    for label, name in enumerate(("cat", "dog")):
        (root / split / name).mkdir(parents=True)
        for i in range(per_class):
            img = rng.integers(0, 80, (size, size, 3))
            img[slice(None, size // 2) if label == 0 else slice(size // 2, None)] += 150
            Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(root / split / name / f"{i}.jpg")


def test_images_decode_the_same_from_folders_and_archives(tmp_path):
    write_split(tmp_path / "folders", "test", per_class=3)
    archive = tmp_path / "archives" / "cifar10-test-jpg.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "folders" / "test", arcname="test")
    a_img, a_lab, a_cls = load_images(tmp_path / "folders", "test")
    b_img, b_lab, b_cls = load_images(tmp_path / "archives", "test")
    assert a_img.dtype == torch.uint8 and a_img.shape == (6, 3, 32, 32) and a_cls == b_cls == ["cat", "dog"]
    assert torch.equal(a_img, b_img) and a_lab.tolist() == b_lab.tolist() == [0, 0, 0, 1, 1, 1]
    direct = np.array(Image.open(io.BytesIO((tmp_path / "folders/test/dog/0.jpg").read_bytes())).convert("RGB"))
    assert torch.equal(a_img[3], torch.from_numpy(direct).permute(2, 0, 1))
    with pytest.raises(FileNotFoundError, match="no 'train' images"):
        load_images(tmp_path / "folders", "train")


def test_unreadable_images_are_skipped_and_named(tmp_path):
    write_split(tmp_path, "test", per_class=3)
    (tmp_path / "test" / "cat" / "1.jpg").write_bytes((tmp_path / "test" / "cat" / "0.jpg").read_bytes()[:300])
    (tmp_path / "test" / "dog" / "9.jpg").write_bytes(b"")
    with pytest.warns(UserWarning, match=r"skipped 2 unreadable image\(s\) in .*test: cat/1\.jpg, dog/9\.jpg$"):
        images, labels, classes = load_images(tmp_path, "test")
    assert images.shape == (5, 3, 32, 32) and labels.tolist() == [0, 0, 1, 1, 1] and classes == ["cat", "dog"]


def test_augment_is_a_padded_crop_and_flip_of_each_image():
    x = torch.randint(0, 256, (64, 3, 8, 8), dtype=torch.uint8)
    with use_batch_random(BatchRandom(7)):
        out = augment(x, pad=2)
    padded = torch.nn.functional.pad(x.float() / 255, (2,) * 4, mode="reflect")
    flips = 0
    for i in range(64):  # each output is one of the 5 x 5 crops of its own padded image, maybe flipped
        crops = [padded[i, :, r : r + 8, c : c + 8] for r in range(5) for c in range(5)]
        plain = any(torch.equal(out[i], c) for c in crops)
        flipped = any(torch.equal(out[i], c.flip(-1)) for c in crops)
        assert plain or flipped
        flips += flipped and not plain
    assert 16 < flips < 48  # about half


def test_cutout_sets_one_clipped_square_per_image_to_the_mean_colour():
    from lightvision.engine.yardstick_net import CIFAR10_MEAN

    x = torch.randint(0, 256, (64, 3, 12, 12), dtype=torch.uint8)
    with use_batch_random(BatchRandom(3)):
        plain = augment(x, pad=2)
    with use_batch_random(BatchRandom(3)):
        cut = augment(x, pad=2, cutout=5)
    mean = torch.tensor(CIFAR10_MEAN)[:, None, None]
    changed = (cut != plain).any(1)  # [B, H, W]
    clipped = 0
    for i in range(64):
        ys, xs = torch.nonzero((cut[i] == mean).all(0), as_tuple=True)
        assert len(ys) > 0 and torch.equal(changed[i] & ~(cut[i] == mean).all(0), torch.zeros_like(changed[i]))
        height, width = int(ys.max() - ys.min() + 1), int(xs.max() - xs.min() + 1)
        assert height <= 5 and width <= 5 and len(ys) == height * width  # one filled rectangle
        clipped += height * width < 25
    assert 0 < clipped < 64  # squares near a border are clipped, others whole


def test_yardstick_trains_through_the_cli_and_loads_as_a_feature_network(tmp_path, capsys):
    from lightvision.cli import main
    from lightvision.diffusion.features import YardstickFeatures, feature_network

    write_split(tmp_path / "data", "train", per_class=16)
    write_split(tmp_path / "data", "test", per_class=4, seed=1)
    out = tmp_path / "run"
    main(
        [
            "classify",
            "train-yardstick",
            "--data",
            str(tmp_path / "data"),
            "--out",
            str(out),
            "--device",
            "cpu",
            "model.widths=[8, 8, 16, 16]",
            "train.batch_size=8",
            "train.epochs=2",
            "train.eval_every_epochs=1",
            "train.mixed_precision=no",
            "train.log_every=1",
        ]
    )
    results = json.loads(capsys.readouterr().out)
    assert results["step"] == 8 and results["train_images"] == 32 and 0 <= results["test_top1"] <= 100
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 8 and all(np.isfinite(losses)) and any("test_top1" in r for r in records)
    weights = out / "yardstick.safetensors"
    model, path = load_yardstick(out)
    assert path == weights and model.widths == [8, 8, 16, 16] and not model.training
    net = feature_network(feature_extractor=str(weights))
    assert isinstance(net, YardstickFeatures) and net.id.startswith("yardstick-")
    images, _, _ = load_images(tmp_path / "data", "test")
    feats = net(images)
    assert feats["pool"].shape == (8, 16) and feats["spatial"].shape == (8, 8 * 8 * 7)
    expected = model.forward_features(images.float() / 255)
    torch.testing.assert_close(feats["pool"], expected["pool"].double())
    from lightvision.diffusion.fid import compute_fid

    itself = compute_fid(
        tmp_path / "data" / "test",
        tmp_path / "data" / "test",
        feature_extractor=str(out),
        cache_dir=tmp_path / "cache",
        num_samples=None,
    )
    assert itself["feature_space"] == net.id and abs(itself["fid"]) < 1e-4 and itself["precision"] == 1.0


def test_saved_weights_are_under_20_mb_and_reload(tmp_path):
    torch.manual_seed(0)
    model = YardstickNet().eval()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    path = save_yardstick(model, tmp_path / "y.safetensors", {"test_top1": 93.5})
    assert path.stat().st_size < 20e6
    loaded, _ = load_yardstick(path)
    x = torch.rand(4, 3, 32, 32)
    torch.testing.assert_close(loaded(x), model(x), rtol=2e-2, atol=2e-2)  # float16 storage
    with pytest.raises(ValueError, match="not a yardstick file"):
        from safetensors.torch import save_file

        save_file({"w": torch.zeros(1)}, str(tmp_path / "other.safetensors"))
        load_yardstick(tmp_path / "other.safetensors")


def test_packaged_yardstick_loads_as_a_feature_network():
    """The committed CIFAR-10 weights load with their header (classes, accuracy) and give pooled and spatial
    features for 32 px images."""
    from lightvision.diffusion.features import feature_network
    from lightvision.engine.yardstick_net import packaged_yardstick

    path = packaged_yardstick()
    assert path is not None and path.stat().st_size < 20 * 2**20
    net = feature_network(feature_extractor="yardstick", image_size=(32, 32))
    feats = net(torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8))
    assert feats["pool"].shape == (2, 512) and feats["spatial"].shape == (2, 448)
    assert all(torch.isfinite(v).all() for v in feats.values())
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        header = f.metadata()
    assert float(header["test_top1"]) >= 93.0 and json.loads(header["flip_average"]) is True
    images = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    assert torch.allclose(net(images)["pool"], net(images.flip(-1))["pool"], atol=1e-4)  # features of a mirror pair


def test_residual_stages_are_an_architecture_choice_kept_in_the_weights_file(tmp_path):
    plain, deep = YardstickNet([8, 8, 16, 16]), YardstickNet([8, 8, 16, 16], residual=[True, True, True])
    added = sum(p.numel() for p in deep.parameters()) - sum(p.numel() for p in plain.parameters())
    assert added == 2 * (16 * 16 * 9 + 32)  # a residual pair of 3x3 convolutions + BatchNorm at 16 channels
    deep.eval()
    path = save_yardstick(deep, tmp_path / "deep.safetensors")
    loaded, _ = load_yardstick(path)
    assert loaded.residual == [True, True, True]
    x = torch.rand(2, 3, 16, 16)
    assert torch.allclose(loaded(x), deep(x), atol=2e-2)  # conv weights stored in float16
    with pytest.raises(ValueError, match="one flag per stage"):
        YardstickNet(residual=[True, True])


def test_flip_average_makes_eval_features_mirror_invariant_and_training_single_view(tmp_path):
    torch.manual_seed(0)
    net = YardstickNet([8, 8, 16, 16], flip_average=True).eval()
    x = torch.rand(3, 3, 16, 16)
    feats, mirrored = net.forward_features(x), net.forward_features(x.flip(-1))
    assert torch.allclose(feats["pool"], mirrored["pool"], atol=1e-6)
    assert torch.allclose(feats["spatial"], mirrored["spatial"].flip(-1), atol=1e-6)
    single = YardstickNet([8, 8, 16, 16]).eval()
    single.load_state_dict(net.state_dict())
    a, b = single.forward_features(x), single.forward_features(x.flip(-1))
    assert torch.allclose(feats["pool"], 0.5 * (a["pool"] + b["pool"]), atol=1e-6)
    assert torch.allclose(feats["spatial"], 0.5 * (a["spatial"] + b["spatial"].flip(-1)), atol=1e-6)
    assert not torch.allclose(a["pool"], b["pool"], atol=1e-3)  # a single view is not mirror-invariant
    net.train()
    assert torch.equal(net.forward_features(x)["pool"], single.train().forward_features(x)["pool"])
    loaded, _ = load_yardstick(save_yardstick(net, tmp_path / "f.safetensors"))
    assert (
        loaded.flip_average and not load_yardstick(save_yardstick(single, tmp_path / "s.safetensors"))[0].flip_average
    )
