"""DeiT's repeated augmentation puts an image's repeats in one batch, and each input path decodes such an image
once: the folder's batched fetch loads a repeated index once, the device decode decodes a repeated file once, the
workers' packed batch stores it once, and the shard stream yields an image's repeats in a row, decoded once; the
batches equal those decoded per sample."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from test_device_pipeline import write_jpeg_folder
from test_host_decoded_pipeline import gpu_cfg

import lightvision.classify.encoded as encoded
import lightvision.classify.host_decoded as host_decoded
from lightvision import cli
from lightvision.classify.data import device_batches, make_train_loader, train_dataset
from lightvision.classify.shards import ShardDataset
from lightvision.engine import BatchRandom, use_batch_random
from lightvision.kernels.resize import PackedImages, resized_crops

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def repeated_cfg(root, decode: str) -> dict:
    cfg = gpu_cfg(root, decode)
    return {**cfg, "train": {**cfg["train"], "batch_size": 6}, "aug": {**cfg["aug"], "repeated_aug": 3}}


def counting(monkeypatch, module, name: str) -> list[int]:
    """Patch ``module.name`` (a decoder) to record how many images each call decodes."""
    calls, decode = [], getattr(module, name)

    def counted(data, *args, **kwargs):
        calls.append(len(data) if isinstance(data, list) else 1)
        return decode(data, *args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def first_batch(cfg: dict):
    dataset = train_dataset(cfg)
    torch.manual_seed(5)  # the sampler's shuffle
    return dataset, next(iter(make_train_loader(cfg, dataset, workers=0, pin_memory=False)))


def test_device_decode_decodes_each_repeated_file_once(tmp_path, monkeypatch):
    write_jpeg_folder(tmp_path, corrupt=False)
    cfg = repeated_cfg(tmp_path, "device")
    folder, batch = first_batch(cfg)
    names = batch["images"].names
    assert len(names) == 6 and len(set(names)) == 2 and names[0] == names[1] == names[2]  # two images, thrice each
    calls = counting(monkeypatch, encoded, "decode_jpeg")
    prepare = device_batches(cfg, folder, train=True)
    images, labels = prepare.decode(batch)
    assert sum(calls) == 2 and torch.equal(labels, batch["labels"]) and not prepare.held  # held on CUDA only
    assert len(images.sizes) == 2 and images.index.tolist() == [0, 0, 0, 1, 1, 1]  # each file stored once
    one_by_one = [encoded.decode_image(data) for data in batch["images"].tensors()]
    assert all(torch.equal(a, b) for a, b in zip(images, one_by_one, strict=True))
    outs = []
    for decoded in (images, list(images)):  # the packed batch augments as its images one by one
        with use_batch_random(BatchRandom(3)):
            outs.append(prepare.augment((decoded, labels)))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_packed_decode_keeps_a_batchs_images_until_the_device_copied_them(tmp_path):
    """nvjpeg writes on a stream of its own: the packed decode gives it memory of a stream that runs nothing else, and
    keeps each batch's decoded images while the copy into the pack is still queued on the calling stream, letting
    them go once it is done, without waiting for it; images decoded while the calling stream is busy come out right."""
    write_jpeg_folder(tmp_path, corrupt=False)
    cfg = repeated_cfg(tmp_path, "device")
    folder, batch = first_batch(cfg)
    batch = {"images": batch["images"], "labels": batch["labels"].cuda()}
    prepare = device_batches(cfg, folder, train=True)
    prepare.decode(batch)  # the decoder's first call sets nvjpeg up (a long host step) before the timed part
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)  # the calling stream busy (about half a second): the copy waits behind it
    packed, _ = prepare.decode(batch)
    assert len(prepare.held) == 1 and not prepare.held[0][0].query()  # the first call's images let go, done
    first = prepare.held[0][1]
    torch.cuda.synchronize()
    again, _ = prepare.decode(batch)
    assert len(prepare.held) == 1 and prepare.held[0][1] is not first  # the first batch's images let go
    torch.cuda.synchronize()
    reference, _ = encoded.decode_batch(batch["images"], batch["labels"])  # nvjpeg after its stream's work is done
    for images in (packed, again):
        assert all(torch.equal(a, b) for a, b in zip(images, reference, strict=True))


def test_workers_decode_each_repeated_index_once_and_pack_it_once(tmp_path, monkeypatch):
    write_jpeg_folder(tmp_path, corrupt=False)
    cfg = repeated_cfg(tmp_path, "workers")
    calls = counting(monkeypatch, host_decoded, "decode_image")
    folder, batch = first_batch(cfg)
    packed = batch["images"]
    assert sum(calls) == 2 and len(packed) == 6 and len(packed.sizes) == 2
    assert packed.index.tolist() == [0, 0, 0, 1, 1, 1]
    copies = PackedImages.pack([img.clone() for img in packed])  # the same samples, stored once each
    assert copies.index is None and len(copies.sizes) == 6
    prepare = device_batches(cfg, folder, train=True)
    outs = []
    for images in (packed, copies):
        with use_batch_random(BatchRandom(3)):
            outs.append(prepare({"images": images, "labels": batch["labels"]}))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_packed_images_store_a_repeated_image_once():
    gen = torch.Generator().manual_seed(0)
    a, b = (
        torch.randint(0, 256, (3, h, w), generator=gen, dtype=torch.uint8).to(DEVICE) for h, w in ((9, 14), (17, 11))
    )
    packed = PackedImages.pack([a, b, a, a])
    assert packed.data.numel() == a.numel() + b.numel() and packed.index.tolist() == [0, 1, 0, 0]
    assert len(packed) == 4 and torch.equal(packed[3], a) and torch.equal(packed[1], b)
    assert packed.sample_sizes().tolist() == [[9, 14], [17, 11], [9, 14], [9, 14]]
    boxes = torch.tensor([[0, 0, 9, 14], [2, 1, 12, 9], [1, 2, 7, 10], [3, 3, 5, 5]])
    flip = torch.tensor([False, True, True, False])
    expect = resized_crops([a, b, a.clone(), a.clone()], boxes, flip, 8, backend="torch")
    assert torch.equal(resized_crops(packed, boxes, flip, 8, backend="torch"), expect)
    triton = resized_crops(packed, boxes, flip, 8, backend="triton") if _triton_runs() else None
    if triton is not None:
        assert torch.allclose(triton, expect, atol=1e-3)
    with pytest.raises(ValueError, match="index outside"):
        PackedImages(packed.data, packed.sizes, 3, torch.tensor([0, 2]))


def _triton_runs() -> bool:
    from lightvision.kernels._launch import interpreting

    return torch.cuda.is_available() or interpreting()


def test_shard_stream_yields_repeats_in_a_row_decoded_once(tmp_path):
    data, out = tmp_path / "data", tmp_path / "shards"
    write_jpeg_folder(data, corrupt=False)
    assert cli.run(["classify", "make-shards", "--data", str(data), "--out", str(out), "--split", "train"]) == 0
    decoded: list[str] = []

    def decode(data: bytes, key: str) -> str:
        decoded.append(key)
        return key

    stream = [key for key, _ in ShardDataset(out, "train", decode, train=True, repeats=3)]
    runs = [stream[i : i + 3] for i in range(0, len(stream), 3)]
    assert len(stream) in (6, 9) and all(len(set(run)) == 1 for run in runs)  # 2 or 3 of 8 kept, thrice in a row
    assert Counter(decoded) == Counter(run[0] for run in runs)  # each decoded once


def test_cpu_pipeline_decodes_a_repeated_index_once_with_each_repeat_its_own_draws(tmp_path):
    """``data.pipeline: cpu``: the keyed batch fetch loads (PIL-decodes) an index once and transforms each repeat
    with its own key's draws: the items equal those fetched one by one, and the repeats differ."""
    write_jpeg_folder(tmp_path, corrupt=False)
    cfg = {**repeated_cfg(tmp_path, "device"), "data": {**repeated_cfg(tmp_path, "device")["data"], "pipeline": "cpu"}}
    keyed = make_train_loader(cfg, train_dataset(cfg), workers=0, pin_memory=False).dataset
    folder, loads = keyed.dataset, []
    read = folder.loader
    folder.loader = lambda path: loads.append(path) or read(path)
    items = [(1, 11), (1, 12), (1, 13), (5, 14), (5, 15), (5, 16)]
    batch = keyed.__getitems__(items)
    assert len(loads) == 2
    one_by_one = [keyed[item] for item in items]
    assert len(loads) == 8 and all(torch.equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(batch, one_by_one))
    assert not torch.equal(batch[0][0], batch[1][0])  # each repeat its own crop and augmentation
