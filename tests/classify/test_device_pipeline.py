"""data.pipeline=gpu on CPU tensors: the batched draws follow timm's distributions, the ops follow timm's PIL ops,
eval matches the CPU eval transform, unreadable files are skipped and counted, and `classify train` runs."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.stats import ks_2samp
from timm.data.auto_augment import _RAND_INCREASING_TRANSFORMS, NAME_TO_OP
from timm.data.transforms import RandomResizedCropAndInterpolation
from timm.loss import SoftTargetCrossEntropy
from torch.utils.data import DataLoader
from torchvision.io import ImageReadMode, decode_jpeg

from helpers import tiny_classify_recipe, write_dark_light_folder
from lightvision import cli
from lightvision.classify.data import build_mixup, eval_transform, image_folder, make_train_loader, train_transform
from lightvision.classify.device_transforms import (
    CROP_COLUMNS,
    ERASE_COLUMNS,
    DeviceEvalTransform,
    DeviceTrainTransform,
    erase_boxes,
    resized_crop_params,
)
from lightvision.classify.encoded import EncodedImages, collate_encoded, decode_batch, read_image_bytes
from lightvision.classify.rand_augment import BatchRandAugment, apply_op, level_to_arg
from lightvision.classify.train import DEFAULTS, make_loss_fn
from lightvision.engine import BatchRandom, use_batch_random

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
FILL = tuple(round(255 * m) for m in MEAN)
DRAWS = 4000
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def uniforms(rows: int, columns: int, seed: int) -> torch.Tensor:
    """float64 [rows, columns] uniforms in [0, 1) from a seeded CPU generator."""
    return torch.rand((rows, columns), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def jpeg_bytes(h: int, w: int, seed: int = 0, quality: int = 90) -> bytes:
    """A smooth random colour field (bicubic-upsampled noise) as JPEG bytes."""
    rng = np.random.default_rng(seed)
    small = Image.fromarray(rng.integers(0, 256, (h // 4 + 1, w // 4 + 1, 3), dtype=np.uint8))
    buf = io.BytesIO()
    small.resize((w, h), Image.BICUBIC).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def textured(h: int = 48, w: int = 64) -> np.ndarray:
    """uint8 [h, w, 3]: gradients plus noise, so every op changes it."""
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([(xx * 4) % 256, (yy * 5) % 256, ((xx + yy) * 3) % 256], -1).astype(np.float32)
    return np.clip(img + np.random.default_rng(0).normal(0, 10, img.shape), 0, 255).astype(np.uint8)


@pytest.mark.parametrize(
    "height,width,scale",
    [(375, 500, (0.08, 1.0)), (40, 400, (0.08, 1.0)), (300, 200, (0.5, 1.0))],
    ids=["375x500", "40x400-wide", "300x200-s0.5"],
)
def test_resized_crop_draws_follow_timm(height, width, scale):
    random.seed(0)
    img = Image.new("RGB", (width, height))
    ref = np.array([RandomResizedCropAndInterpolation.get_params(img, scale, (3 / 4, 4 / 3)) for _ in range(2 * DRAWS)])
    u = uniforms(2 * DRAWS, CROP_COLUMNS, 1)
    ours = resized_crop_params(torch.tensor([[height, width]] * 2 * DRAWS), scale, u).numpy()
    assert (ours[:, 0] >= 0).all() and (ours[:, 0] + ours[:, 2] <= height).all()
    assert (ours[:, 1] >= 0).all() and (ours[:, 1] + ours[:, 3] <= width).all()
    for name, stat in (
        ("area", lambda p: p[:, 2] * p[:, 3]),
        ("aspect", lambda p: p[:, 3] / p[:, 2]),
        ("top", lambda p: p[:, 0]),
        ("left", lambda p: p[:, 1]),
    ):
        ks = ks_2samp(stat(ours), stat(ref)).statistic
        assert ks < 0.04, f"{name}: KS {ks:.3f} between the batched draws and timm's"


def test_crop_keeps_whole_image_and_flips_half():
    n, img = 2000, torch.arange(8, dtype=torch.uint8).repeat(3, 8, 1) * 30  # [3, 8, 8], left-right ramp
    tf = DeviceTrainTransform(
        {"scale": [1.0, 1.0], "auto_augment": None, "color_jitter": None, "reprob": 0.0}, 8, MEAN, STD
    )
    with use_batch_random(BatchRandom(2)):
        u = tf.draw(n, torch.device("cpu"))
    out = tf.crop_flip([img] * n, u)
    flipped = (out == img.flip(-1)).flatten(1).all(1)
    assert ((out == img).flatten(1).all(1) | flipped).all()  # scale 1: the whole image, resized to itself
    assert abs(flipped.float().mean().item() - 0.5) < 0.04


@pytest.mark.parametrize(
    "name,arg",
    [
        ("AutoContrast", 0),
        ("Equalize", 0),
        ("Invert", 0),
        ("PosterizeIncreasing", 1),
        ("SolarizeIncreasing", 40),
        ("SolarizeAdd", 99),
        ("ColorIncreasing", 1.8),
        ("ContrastIncreasing", 0.3),
        ("BrightnessIncreasing", 1.5),
        ("SharpnessIncreasing", 1.9),
        ("SharpnessIncreasing", 0.1),
    ],
)
def test_colour_ops_equal_timm(name, arg):
    img = textured()
    args = () if name in ("AutoContrast", "Equalize", "Invert") else (arg,)
    ref = torch.from_numpy(np.array(NAME_TO_OP[name](Image.fromarray(img), *args))).permute(2, 0, 1)
    out = apply_op(
        torch.from_numpy(img).permute(2, 0, 1)[None],
        name,
        torch.tensor([float(arg)]),
        torch.tensor(FILL, dtype=torch.float32),
    )[0]
    assert torch.equal(out, ref)


def test_cpu_posterize_keeps_zero_bits_like_the_gpu():
    """RandAugment's increasing posterize at magnitude 10 keeps 0 bits: the CPU transform gives the GPU op's black
    image (timm hands 0 bits to Pillow, which rejects them) and a whole transform at that magnitude never fails."""
    aug = {"auto_augment": "rand-m10-n3-mstd0-inc1", "reprob": 0.0, "scale": (1.0, 1.0)}
    tf = train_transform(aug, 32, MEAN, STD)
    op = next(op for step in tf.transforms for op in getattr(step, "ops", []) if op.name == "PosterizeIncreasing")
    op.prob = 1.0
    img = textured()
    out = torch.from_numpy(np.array(op(Image.fromarray(img)))).permute(2, 0, 1)
    ref = apply_op(
        torch.from_numpy(img).permute(2, 0, 1)[None],
        "PosterizeIncreasing",
        torch.tensor([0.0]),
        torch.tensor(FILL, dtype=torch.float32),
    )
    assert out.max() == 0 and torch.equal(out, ref[0])
    random.seed(0)
    for _ in range(100):  # 3 ops of 15 a draw at probability 0.5: posterize at 0 bits about 10 times
        assert tf(Image.fromarray(img)).shape == (3, 32, 32)


@pytest.mark.parametrize(
    "name,arg",
    [
        ("Rotate", 20.0),
        ("Rotate", -13.0),
        ("ShearX", 0.25),
        ("ShearY", -0.2),
        ("TranslateXRel", 0.3),
        ("TranslateYRel", -0.4),
    ],
)
def test_geometric_ops_match_timm(name, arg):
    img = textured()
    ref = np.array(NAME_TO_OP[name](Image.fromarray(img), arg, fillcolor=FILL, resample=Image.BICUBIC))
    ref = torch.from_numpy(ref).permute(2, 0, 1).float()
    x = torch.from_numpy(img).permute(2, 0, 1)[None]
    out = apply_op(x, name, torch.tensor([arg]), torch.tensor(FILL, dtype=torch.float32))[0].float()
    assert (out - ref).abs().mean() < 2.5  # resampling kernels differ (PIL bicubic a=-0.5, grid_sample -0.75)
    assert (x[0].float() - ref).abs().mean() > 10  # ... much less than the op changes


def test_rand_augment_parses_recipe_and_draws_like_timm():
    ra = BatchRandAugment("rand-m9-mstd0.5-inc1", 224, MEAN)
    assert ra.names == _RAND_INCREASING_TRANSFORMS and ra.num_layers == 2 and ra.prob == 0.5
    op, applied, level, _ = ra.draw(uniforms(DRAWS, ra.columns, 3))
    counts = torch.bincount(op.flatten(), minlength=len(ra.names)).float() / op.numel()
    assert (counts - 1 / len(ra.names)).abs().max() < 0.02
    assert abs(applied.float().mean().item() - 0.5) < 0.02
    assert abs(level.mean().item() - 9.0) < 0.05 and abs(level.std().item() - 0.5) < 0.05 and level.max() <= 10
    x = torch.from_numpy(textured()).permute(2, 0, 1)[None].repeat(16, 1, 1, 1)
    out = ra(x, uniforms(16, ra.columns, 3))
    assert out.dtype == torch.uint8 and out.shape == x.shape and not torch.equal(out, x)
    for config, refusal in (("augmix-m5-w4-d2", "RandAugment"), ("rand-m9-t3a", "GaussianBlur have no batched")):
        with pytest.raises(ValueError, match=refusal):
            BatchRandAugment(config, 224, MEAN)


def test_contrast_mean_is_pils_on_a_large_image():
    """PIL's Contrast blends with int(mean luma + 0.5), the mean in double precision: on 512 x 512 pixels whose mean
    is just below 100.5, a float32 mean (101) would blend with the wrong grey."""
    x = torch.full((1, 3, 512, 512), 100, dtype=torch.uint8)
    x.view(1, 3, -1)[:, :, : 512 * 512 // 2 - 1] = 101
    ref = NAME_TO_OP["Contrast"](Image.fromarray(x[0].permute(1, 2, 0).numpy()), 1.9)
    out = apply_op(x, "Contrast", torch.tensor([1.9], dtype=torch.float64), torch.zeros(3))
    assert torch.equal(out[0], torch.from_numpy(np.array(ref)).permute(2, 0, 1))


def test_rand_augment_batch_equals_image_by_image():
    """Each image of a batch gets exactly its own drawn ops: the batch equals the images augmented one at a time."""
    ra = BatchRandAugment("rand-m9-mstd0.5-inc1", 224, MEAN)
    base = torch.from_numpy(textured()).permute(2, 0, 1)
    x = torch.stack([base.roll(7 * i, dims=-1) for i in range(24)])
    u = uniforms(len(x), ra.columns, 6)
    batch = ra(x, u)
    for i in range(len(x)):
        assert torch.equal(batch[i], ra(x[i : i + 1], u[i : i + 1])[0]), f"image {i}"
    assert ra.draw(u)[1].any(0).sum() > 12  # most images had an op applied


def test_train_transform_is_reproducible_and_erases_at_reprob():
    images = [
        decode_jpeg(torch.frombuffer(bytearray(jpeg_bytes(60 + 7 * i, 80, i)), dtype=torch.uint8)) for i in range(6)
    ]
    tf = DeviceTrainTransform(DEFAULTS["aug"], 32, MEAN, STD)
    assert tf.jitter is None  # timm: RandAugment switches colour jitter off
    runs = []
    for _ in range(2):
        with use_batch_random(BatchRandom(4)):
            runs.append(tf(images))
    assert runs[0].shape == (6, 3, 32, 32) and torch.equal(runs[0], runs[1])
    boxes = erase_boxes(32, 32, 0.25, 1, uniforms(DRAWS, 2 + ERASE_COLUMNS, 5))[:, 0]
    erased = boxes[:, 2] > 0
    assert abs(erased.float().mean().item() - 0.25) < 0.03
    area = (boxes[erased, 2] * boxes[erased, 3]).float() / 32**2
    assert area.min() >= 0.01 and area.max() <= 0.4 and (boxes[:, 0] + boxes[:, 2] <= 32).all()


def test_colour_jitter_when_no_rand_augment():
    tf = DeviceTrainTransform({**DEFAULTS["aug"], "auto_augment": None, "color_jitter": [0.4, 0.0, 0.0]}, 8, MEAN, STD)
    x = torch.full((DRAWS, 3, 8, 8), 100, dtype=torch.uint8)
    ratio = tf.color_jitter(x.clone(), uniforms(DRAWS, 6, 6)).float().mean((1, 2, 3)) / 100
    assert 0.59 <= ratio.min() and ratio.max() <= 1.41 and abs(ratio.mean().item() - 1.0) < 0.02
    assert ratio.std() > 0.2  # uniform on [0.6, 1.4]: std 0.23


@pytest.mark.parametrize("mode", ["mixup", "cutmix"])
def test_mixup_labels_follow_the_mixed_images(mode):
    n, classes, smoothing = 8, 5, 0.1
    aug = {**DEFAULTS["aug"], "mixup": 0.8 if mode == "mixup" else 0.0, "cutmix": 1.0 if mode == "cutmix" else 0.0}
    mixup = build_mixup(aug, classes)
    x = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 3, 16, 16).contiguous()
    labels = torch.arange(n) % classes
    np.random.seed(0)
    mixed, target = mixup(x.clone(), labels)
    own = (mixed == x).float().mean((1, 2, 3)) if mode == "cutmix" else (mixed - x.flip(0)) / (x - x.flip(0))
    lam = own if mode == "cutmix" else own[:, 0, 0, 0]
    off, on = smoothing / classes, 1 - smoothing + smoothing / classes
    onehot = torch.full((n, classes), off).scatter_(1, labels[:, None], on)
    expect = lam[:, None] * onehot + (1 - lam[:, None]) * onehot.flip(0)
    assert torch.allclose(target, expect, atol=1e-5)
    assert 0 < lam[0] < 1  # something was mixed

    class Record(
        torch.nn.Module
    ):  # decode + transform on the device (the Trainer's prepare_batch), then the loss's mixup
        def forward(self, images):
            self.images = images
            return torch.zeros(images.shape[0], classes)

    model, prepared = Record(), []
    batch = collate_encoded(
        [
            ((torch.frombuffer(bytearray(jpeg_bytes(40, 50, i)), dtype=torch.uint8), f"{i}"), i % classes)
            for i in range(n)
        ]
    )

    def prepare(b):
        images, y = decode_batch(b["images"], b["labels"])
        prepared.append((DeviceEvalTransform(16, 1.0, "bicubic", MEAN, STD)(images), y))
        return prepared[-1][0].clone(), y  # timm's Mixup mixes in place

    np.random.seed(1)
    loss = make_loss_fn(mixup, smoothing)(model, prepare(batch))
    np.random.seed(1)
    ref_images, ref_target = mixup(prepared[0][0].clone(), prepared[0][1])
    assert torch.equal(model.images, ref_images)
    assert torch.allclose(loss, SoftTargetCrossEntropy()(torch.zeros(n, classes), ref_target))


@pytest.mark.parametrize("size,crop_pct", [(32, 0.875), (24, 1.0)])
def test_eval_matches_cpu_eval_transform(size, crop_pct):
    for i, (h, w) in enumerate([(60, 80), (75, 50), (33, 97), (40, 40)]):
        data = jpeg_bytes(h, w, i)
        ref = eval_transform(size, crop_pct, "bicubic", MEAN, STD)(Image.open(io.BytesIO(data)).convert("RGB"))
        decoded = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
        out = DeviceEvalTransform(size, crop_pct, "bicubic", MEAN, STD)([decoded])[0]
        diff = (out - ref).abs() * torch.tensor(STD).view(3, 1, 1) * 255  # in 0..255 pixel levels
        assert out.shape == ref.shape and diff.max() <= 4 and diff.mean() < 0.3, (h, w)


def write_jpeg_folder(root: Path, per_class: int = 4, corrupt: bool = True) -> None:
    """root/{train,val}/{dark,light}/*.jpg of varied sizes; train/dark gets a truncated JPEG, a file that is not
    an image, and a JPEG that passes the byte check but does not decode; train/light gets a PNG."""
    write_dark_light_folder(root, per_class, ".jpg", varied_sizes=True)
    if corrupt:
        dark, light = root / "train" / "dark", root / "train" / "light"
        (dark / "t.jpg").write_bytes((dark / "0.jpg").read_bytes()[:150])
        (dark / "x.jpg").write_bytes(b"not an image at all")
        (dark / "z.jpg").write_bytes(b"\xff\xd8\xff" + bytes(range(256)) * 4 + b"\xff\xd9")
        Image.fromarray(np.full((30, 20, 3), 210, np.uint8)).save(light / "p.png")


def test_unreadable_images_are_skipped_and_counted(tmp_path):
    write_jpeg_folder(tmp_path)
    folder = image_folder(tmp_path, "train", None, loader=read_image_bytes)
    loader = DataLoader(folder, batch_size=len(folder), collate_fn=collate_encoded)
    with pytest.warns(UserWarning, match="skipping unreadable image") as caught:
        batch = next(iter(loader))
        images, labels = decode_batch(batch["images"], batch["labels"], skips=folder)
    skipped = [str(w.message).split()[3].rstrip(":") for w in caught if str(w.message).startswith("skipping")]
    assert sorted(Path(s).name for s in skipped) == ["t.jpg", "x.jpg", "x.jpg", "z.jpg"]
    # the loader worker skips to the next file (t -> x -> z, x -> z), z passes the byte check and fails to decode
    # on the device once (one decode per file of the batch), counted in each of its 3 slots; the PNG decodes (on the
    # CPU)
    assert folder.skipped_images() == 6 and len(images) == len(folder) == len(labels)
    for img, label in zip(images, labels.tolist()):  # every slot holds a decoded image of its label's class
        assert img.shape[0] == 3 and (img.float().mean() > 128) == (label == folder.class_to_idx["light"])


def test_encoded_batch_reads_each_images_head_in_one_gather():
    """``starts_with`` says for the images asked what slicing each one's bytes says, for images shorter than the
    marker, empty ones, the last one, and an empty batch buffer."""
    files = [b"\xff\xd8\xffabc", b"\x89PNG", b"\xff\xd8", b"", b"\xff\xd8\xff", b"x\xff\xd8\xff"]
    encoded = EncodedImages(torch.tensor(list(b"".join(files)), dtype=torch.uint8), [len(f) for f in files], ["f"] * 6)
    which = [5, 0, 2, 3, 4, 1]
    assert encoded.starts_with(b"\xff\xd8\xff", which) == [files[i].startswith(b"\xff\xd8\xff") for i in which]
    assert encoded.starts_with(b"\xff\xd8\xff", which) == [False, True, False, False, True, False]
    assert encoded.starts_with(b"\x89PNG", [1, 0]) == [True, False] and encoded.starts_with(b"\xff", []) == []
    empty = EncodedImages(torch.zeros(0, dtype=torch.uint8), [0, 0], ["a", "b"])
    assert empty.starts_with(b"\xff\xd8\xff", [0, 1]) == [False, False]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_training_loader_pins_encoded_batches_and_they_decode_alike(tmp_path):
    """The gpu pipeline's training loader hands over page-locked bytes (nvjpeg copies them without staging), and
    they decode to what pageable bytes give."""
    write_jpeg_folder(tmp_path, corrupt=False)
    folder = image_folder(tmp_path, "train", None, loader=read_image_bytes)
    cfg = {**DEFAULTS, "data": {**DEFAULTS["data"], "pipeline": "gpu"}}
    cfg = {**cfg, "train": {**cfg["train"], "batch_size": 4}, "aug": {**cfg["aug"], "repeated_aug": 1}}
    batch = next(iter(make_train_loader(cfg, folder, workers=0, pin_memory=True)))
    pinned = batch["images"]
    assert pinned.data.is_pinned() and all(t.is_pinned() for t in pinned.tensors())
    pageable = EncodedImages(pinned.data.clone(), pinned.lengths, pinned.names)
    labels = batch["labels"].cuda()
    for a, b in zip(decode_batch(pinned, labels)[0], decode_batch(pageable, labels)[0], strict=True):
        assert torch.equal(a, b)


def recipe(tmp_path: Path, data: Path, **data_keys: str) -> Path:
    return tiny_classify_recipe(tmp_path, data, "softmax_deit_tiny_patch16_224", "null", **data_keys)


def test_classify_train_with_gpu_pipeline_on_cpu(tmp_path, capsys):
    data, run = tmp_path / "data", tmp_path / "run"
    write_jpeg_folder(data)
    with pytest.warns(UserWarning, match="skipping unreadable image"):
        assert (
            cli.run(
                [
                    "classify",
                    "train",
                    "--config",
                    str(recipe(tmp_path, data, pipeline="gpu")),
                    "--out",
                    str(run),
                    "--device",
                    "cpu",
                ]
            )
            == 0
        )
    assert json.loads((run / "config.json").read_text())["data"]["pipeline"] == "gpu"
    losses = [
        json.loads(line)["loss"]
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if "loss" in json.loads(line)
    ]
    assert len(losses) == 6 and all(np.isfinite(losses))  # 12 files / batch 4 x 2 epochs
    results = json.loads((run / "results.json").read_text())
    assert results["val_images"] == 8 and results["skipped_images"] >= 1


def test_rand_augment_layer_equals_each_op_alone():
    """One RandAugment layer on a batch where image i draws op i mod 15: each image equals that op applied to it alone
    (the batched warp, value tables and selection change nothing)."""
    ra = BatchRandAugment("rand-m9-n1-mstd0.5-inc1", 224, MEAN)
    n, ops = 2 * len(ra.names), len(ra.names)
    base = torch.from_numpy(textured()).permute(2, 0, 1)
    x = torch.stack([base.roll(5 * i, dims=-1) for i in range(n)])
    u = uniforms(n, ra.columns, 7)
    u[:, 0] = (torch.arange(n) % ops + 0.5) / ops
    u[:, 1] = 0.0  # applied
    out = ra(x, u)
    _, _, level, negate = ra.draw(u)
    fill = torch.tensor(FILL, dtype=torch.float32)
    for i in range(n):
        name = ra.names[i % ops]
        arg = level_to_arg(name, level[0, i : i + 1], negate[0, i : i + 1], ra.translate_pct)
        assert torch.equal(out[i], apply_op(x[i : i + 1], name, arg, fill)[0]), name


SYNCING_CALLS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "numpy", "cpu"}


def recorded_calls(fn, *args) -> tuple[list[str], torch.Tensor]:
    """The torch functions ``fn(*args)`` calls (names, in order) and its result."""
    from torch.overrides import TorchFunctionMode

    class Record(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.calls.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    with Record() as record:
        out = fn(*args)
    return record.calls, out


@pytest.mark.parametrize("variant", ["deit", "jitter-rand", "deit-mixed"])
def test_augmentation_calls_do_not_depend_on_the_draws(variant):
    """Crop, flip, RandAugment / jitter, normalisation and erasing (and Mixup / CutMix in the same pass) issue the
    same torch calls for any draws and none that reads a tensor back to the host: what a CUDA graph captured once can
    replay."""
    aug = {**DEFAULTS["aug"], "reprob": 0.5, "recount": 2}
    if variant == "jitter-rand":
        aug |= {"auto_augment": None, "color_jitter": 0.4, "remode": "rand"}
    mixup = build_mixup(aug, 3, on_device=True) if variant == "deit-mixed" else None
    tf = DeviceTrainTransform(aug, 16, MEAN, STD, mixup=mixup)
    base = torch.from_numpy(textured()).permute(2, 0, 1)
    images = torch.stack([base.roll(3 * i, dims=-1) for i in range(8)])
    runs = []
    for seed in (10, 11, 12):  # the first call makes the per-device constants (what a graph's warm-up call does)
        with use_batch_random(BatchRandom(seed)):
            u = tf.draw(len(images), torch.device("cpu"))
            mix = (torch.arange(8) % 3, *mixup.draw(torch.device("cpu"))) if mixup else ()
        crop_calls, _ = recorded_calls(tf.crop_boxes, images, u)  # then one resize launch (kernels/resize)
        with use_batch_random(BatchRandom(seed)):  # off CUDA the erasing noise follows the draws
            calls, out = recorded_calls(tf.augment, tf.crop_flip(images, u), u, *mix)
        runs.append((crop_calls, calls, out[0] if mixup else out))
    runs = runs[1:]
    assert runs[0][0] == runs[1][0] and runs[0][1] == runs[1][1]
    assert not SYNCING_CALLS & set(runs[0][0] + runs[0][1]), SYNCING_CALLS & set(runs[0][0] + runs[0][1])
    assert not torch.equal(runs[0][2], runs[1][2])  # ... while the draws differ
    assert len(runs[0][1]) > 100  # the recording saw the ops


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_augmentation_never_waits_for_the_host_and_replays_as_a_graph():
    """On CUDA the whole train transform runs under ``set_sync_debug_mode("error")``, op by op and replayed from its
    CUDA graph, and the replay gives what the ops give."""
    images = [
        decode_jpeg(torch.frombuffer(bytearray(jpeg_bytes(60 + 7 * i, 80, i)), dtype=torch.uint8)).cuda()
        for i in range(6)
    ]
    eager = DeviceTrainTransform(DEFAULTS["aug"], 32, MEAN, STD, graph=False)
    graphed = DeviceTrainTransform(DEFAULTS["aug"], 32, MEAN, STD)
    outs = []
    for tf in (eager, graphed, graphed):  # the second graphed call replays the captured graph
        with use_batch_random(BatchRandom(4)):
            tf(images)  # first use: lazy initialisation, the capture
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                outs.append(tf(images))
            finally:
                torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=0)
    assert torch.equal(outs[1], outs[2])
    labels, batches = torch.arange(6, device="cuda") % 3, []
    eager_mix, graphed_mix = (build_mixup(DEFAULTS["aug"], 3, on_device=True, graph=g) for g in (False, True))
    eager = DeviceTrainTransform(DEFAULTS["aug"], 32, MEAN, STD, graph=False, mixup=eager_mix)
    graphed = DeviceTrainTransform(DEFAULTS["aug"], 32, MEAN, STD, mixup=graphed_mix)
    for tf in (eager, graphed, graphed):  # the transform with Mixup / CutMix in its pass, the same way
        with use_batch_random(BatchRandom(6)):
            tf.batch(images, labels)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                batches.append(tf.batch(images, labels))
            finally:
                torch.cuda.set_sync_debug_mode("default")
    for eager_out, graphed_out in zip(batches[0], batches[1], strict=True):
        torch.testing.assert_close(graphed_out, eager_out, atol=1e-5, rtol=0)
    assert all(torch.equal(a, b) for a, b in zip(batches[1], batches[2], strict=True))
    mixed = []
    eager_mix, graphed_mix = (build_mixup(DEFAULTS["aug"], 3, on_device=True, graph=g) for g in (False, True))
    for mixup in (eager_mix, graphed_mix, graphed_mix):  # Mixup / CutMix the same way
        with use_batch_random(BatchRandom(5)):
            mixup(outs[0], labels)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                mixed.append(mixup(outs[0], labels))
            finally:
                torch.cuda.set_sync_debug_mode("default")
    for eager_out, graphed_out in zip(mixed[0], mixed[1], strict=True):
        torch.testing.assert_close(graphed_out, eager_out, atol=1e-6, rtol=0)


@pytest.mark.parametrize("aug_change", [{}, {"remode": "rand", "recount": 2}, {"no_aug": True}], ids=str)
def test_batch_mixes_as_mixup_after_the_transform(aug_change):
    """The train transform's ``batch`` with the recipe's device Mixup / CutMix (mixed in the normalisation's pass, or
    after ``no_aug``'s resize) gives what the transform and then the Mixup give for the same draws, images and soft
    targets; on CUDA as the programs compute it, exactly on the CPU."""
    aug = {**DEFAULTS["aug"], "reprob": 0.5, **aug_change}
    data = [jpeg_bytes(30 + 3 * i, 41 - 2 * i, i) for i in range(6)]
    images = [decode_jpeg(torch.frombuffer(bytearray(d), dtype=torch.uint8)).to(DEVICE) for d in data]
    labels = torch.arange(6, device=DEVICE) % 4
    mixup = build_mixup(aug, 4, on_device=True, graph=False)
    tf = DeviceTrainTransform(aug, 16, MEAN, STD, graph=False)
    mixing = DeviceTrainTransform(aug, 16, MEAN, STD, graph=False, mixup=mixup)
    seen = []
    for seed in (21, 22):
        with use_batch_random(BatchRandom(seed)):
            ours = mixing.batch(images, labels)
        with use_batch_random(BatchRandom(seed)):
            plain = tf(images)
            ref = mixup(plain, labels)
        for a, b in zip(ours, ref, strict=True):
            if DEVICE == "cpu":
                assert torch.equal(a, b)
            else:
                torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
        assert ours[1].shape == (6, 4) and not torch.equal(ours[0], plain)  # mixed
        seen.append(ours[0])
    assert not torch.equal(*seen)


@pytest.mark.parametrize("mode", ["mixup", "cutmix"])
def test_device_mixup_labels_follow_the_mixed_images(mode):
    """The device mix with timm's arithmetic: each image is lam x itself + (1 - lam) x its partner in the reversed
    batch (mixup) or takes the partner inside one box (cutmix, lam corrected to the box), and the soft targets mix
    the smoothed one-hot labels by the same lam."""
    n, classes, smoothing = 8, 5, 0.1
    aug = {**DEFAULTS["aug"], "mixup": 0.8 if mode == "mixup" else 0.0, "cutmix": 1.0 if mode == "cutmix" else 0.0}
    mixup = build_mixup(aug, classes, on_device=True)
    x = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 3, 16, 16).contiguous()
    labels = torch.arange(n) % classes
    with use_batch_random(BatchRandom(3)):
        mixed, target = mixup(x, labels)
    own = (mixed == x).float().mean((1, 2, 3)) if mode == "cutmix" else (mixed - x.flip(0)) / (x - x.flip(0))
    lam = own if mode == "cutmix" else own[:, 0, 0, 0]
    off, on = smoothing / classes, 1 - smoothing + smoothing / classes
    onehot = torch.full((n, classes), off).scatter_(1, labels[:, None], on)
    torch.testing.assert_close(target, lam[:, None] * onehot + (1 - lam[:, None]) * onehot.flip(0), atol=1e-5, rtol=0)
    assert 0 < lam[0] < 1 and torch.allclose(lam, lam[0])  # something was mixed, by one lam for the batch


def test_device_mixup_draws_like_timm():
    """lam follows timm's draws (Beta(0.8) for mixup, the box-corrected Beta(1) for cutmix, switched half the time),
    and the mix issues the same torch calls for any draws, none reading a tensor back to the host."""
    aug, classes = {**DEFAULTS["aug"], "mixup": 0.8, "cutmix": 1.0}, 5
    ours = build_mixup(aug, classes, on_device=True)
    x, labels = torch.rand(4, 3, 32, 32), torch.arange(4)
    lams, calls = [], []
    for seed in range(800):
        with use_batch_random(BatchRandom(seed)):
            u, gammas = ours.draw(torch.device("cpu"))
        recorded, (_, target) = recorded_calls(ours.mix, x, labels, u, gammas)
        if seed < 2:
            calls.append(recorded)
        lams.append(((target[0, 0] - 0.02) / 0.9).item())  # label 0 of image 0 holds lam (smoothing 0.1)
    np.random.seed(0)
    timm_mixup = build_mixup(aug, classes)
    ref = [timm_mixup(x.clone(), labels)[1][0, 0].item() for _ in range(800)]
    assert ks_2samp(np.array(lams), (np.array(ref) - 0.02) / 0.9).statistic < 0.08
    assert calls[0] == calls[1] and not SYNCING_CALLS & set(calls[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graphed_call_replays_and_falls_back_where_capture_fails():
    """A graphed function gives its own result for new inputs of the captured shape; one that reads a value back
    (not capturable) warns once and runs op by op."""
    from lightvision.classify.graphed import GraphedCall

    double = GraphedCall(lambda x: x * 2)
    x = torch.arange(4.0, device="cuda")
    assert torch.equal(double(x), x * 2) and torch.equal(double(x + 1), (x + 1) * 2)
    reads_back = GraphedCall(lambda x: x * float(x.sum()))
    with pytest.warns(UserWarning, match="CUDA graph capture of .* failed, running it op by op"):
        assert torch.equal(reads_back(x), x * 6)
    assert torch.equal(reads_back(x + 1), (x + 1) * 10)


def test_train_transform_through_the_programs_equals_the_spec(monkeypatch):
    """The DeiT train transform with its CUDA programs (crop and erasing boxes, RandAugment's parameters, tables and
    layers), on the GPU or in Triton's interpreter, gives what its PyTorch spec gives for the same draws: exactly
    outside the resampled images, within resampling rounding inside (as the layer programs alone)."""
    import lightvision.classify.device_transforms as transforms

    aug = {**DEFAULTS["aug"], "reprob": 0.5, "recount": 2, "remode": "const"}  # the programs draw a noise of their own
    data = [jpeg_bytes(30 + 3 * i, 41 - 2 * i, i) for i in range(5)]
    images = [decode_jpeg(torch.frombuffer(bytearray(d), dtype=torch.uint8)).to(DEVICE) for d in data]
    calls = []
    for name in ("crop_boxes", "erase_boxes_program"):
        program = getattr(transforms, name)
        monkeypatch.setattr(transforms, name, lambda *a, program=program, name=name: calls.append(name) or program(*a))
    outs = []
    for programs in (False, True):
        monkeypatch.setattr(transforms, "_draws_by_program", lambda t, programs=programs: programs)
        tf = DeviceTrainTransform(aug, 16, MEAN, STD, graph=False)
        tf.rand_augment.backend = "triton" if programs else "torch"
        with use_batch_random(BatchRandom(11)):
            outs.append(tf(images))
    diff = (outs[0] - outs[1]).abs().cpu() * torch.tensor(STD).view(1, 3, 1, 1) * 255  # pixel levels
    assert calls == ["crop_boxes", "erase_boxes_program"]  # the second run's boxes came from the programs
    assert outs[0].shape == (5, 3, 16, 16) and (diff > 1e-3).float().mean() <= 0.01 and diff.max() <= 3
