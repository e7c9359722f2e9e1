"""ImageFolder splits as webdataset tar shards (``data.format: shards``), written and read back.

    lightvision classify make-shards --data /imagenet --out /imagenet-shards --split train --shard-size 1000

``--max-size N`` stores images whose shorter side passes N shrunk to N (re-encoded as JPEG): smaller files to read
and decode per epoch, for recipes that crop well below the originals' size anyway.

Layout: ``OUT/<split>-000000.tar`` ... (webdataset samples: key ``%08d``, the file's bytes under its extension,
``cls`` the class index, ``path`` the file's path in the split) and ``OUT/<split>.json`` (class names, shard
names, image count), which the reader needs for the classes and the epoch length. The train split is written in
a shuffled order (seeded), the others in folder order.

Reading (:class:`ShardDataset`): every loader worker reads its own shards; training shuffles the shard order and a
buffer of samples, and repeated augmentation (``aug.repeated_aug`` r) keeps one image in r of the shuffled stream and
yields it r times in a row, so an epoch has about as many samples as the split has images and an image's repeats share a
batch (decoded once), as the folder's ``RepeatAugSampler`` gives. The shuffles and the transform's draws are seeded by
(seed, epoch, worker, place), so an epoch read again (a resumed run) is the same stream. The epoch lives in memory
shared with the loader workers, which are therefore kept between epochs. Items are what the folder datasets give:
(transformed image, label) for ``data.pipeline: cpu``, ((bytes, key), label) for ``gpu``; unreadable images are skipped
with a warning and counted.
"""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import random
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import webdataset as wds
from PIL import Image
from torch.utils.data import IterableDataset, get_worker_info

from lightvision.classify.encoded import check_image_bytes
from lightvision.engine.batch_random import hashed_seed
from lightvision.engine.sample_draws import seed_generators

__all__ = [
    "ShardDataset",
    "bounded_image",
    "checked_bytes",
    "decode_pil",
    "image_problem",
    "make_shards",
    "read_index",
]

META_KEYS = ("cls", "path")
JPEG_QUALITY = 90  # of the images make-shards --max-size stores shrunk
SHUFFLE_BUFFER = 2000
UNEVEN_SHARE = 0.05  # of an epoch read by fewer than all loader workers, above which training warns


def make_shards(
    folder: Any,
    out: str | Path,
    split: str,
    shard_size: int = 1000,
    seed: int = 0,
    max_size: int | None = None,
    workers: int = 1,
) -> dict[str, Any]:
    """Write an ImageFolder split as tar shards; files that are not readable images (empty, unknown, truncated,
    undecodable: :func:`image_problem`) are left out, and named in the index.

    Args:
        folder: the split as a torchvision ImageFolder (``samples``, ``classes``, ``root``).
        out: output folder (created); split: the split's name (file prefix); shard_size: images per shard.
        max_size: images whose shorter side is longer are stored shrunk to it, as JPEG (:func:`bounded_image`);
            None keeps every file's bytes.
        workers: processes that check (and shrink) the files.
    Returns:
        the index written to ``out/<split>.json``: split, classes, count (images written), shards, max_size,
        ``resized`` (images stored shrunk) and ``skipped``: [path in the split, why] per file left out.
    """
    if shard_size < 1:
        raise ValueError(f"--shard-size must be at least 1 image, got {shard_size}")
    if max_size is not None and max_size < 1:
        raise ValueError(f"--max-size must be at least 1 pixel, got {max_size}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    samples = list(folder.samples)
    if split == "train":
        random.Random(seed).shuffle(samples)
    root = Path(folder.root)
    count, resized, skipped = 0, 0, []
    jobs = [(path, str(Path(path).relative_to(root)), max_size) for path, _ in samples]
    with (
        wds.ShardWriter(str(out / f"{split}-%06d.tar"), maxcount=shard_size, verbose=0) as sink,
        multiprocessing.get_context("spawn").Pool(workers) if workers > 1 else contextlib.nullcontext() as pool,
    ):
        stored = pool.imap(_stored_file, jobs, chunksize=16) if pool is not None else map(_stored_file, jobs)
        for (_, label), (name, ext, data, problem, shrunk) in zip(samples, stored, strict=True):
            if problem is not None:
                skipped.append([name, problem])
                continue
            sink.write({"__key__": f"{count:08d}", ext: data, "cls": str(label).encode(), "path": name.encode()})
            count, resized = count + 1, resized + shrunk
        shards = sink.shard
    if not count:
        raise ValueError(f"no readable image in {root} ({len(skipped)} unreadable): nothing to pack")
    index = {
        "split": split,
        "classes": list(folder.classes),
        "count": count,
        "shards": [f"{split}-{i:06d}.tar" for i in range(shards)],
        "max_size": max_size,
        "resized": resized,
        "skipped": sorted(skipped),
    }
    (out / f"{split}.json").write_text(json.dumps(index, indent=1))
    return index


def _stored_file(job: tuple[str, str, int | None]) -> tuple[str, str, bytes, str | None, bool]:
    """(name, extension, bytes to store, why it is left out or None, whether it was shrunk) of one file."""
    path, name, max_size = job
    data = Path(path).read_bytes()
    problem = image_problem(data, name)
    shrunk = bounded_image(data, max_size) if problem is None and max_size is not None else None
    if shrunk is not None:
        return name, "jpg", shrunk, None, True
    return name, Path(path).suffix.lower().lstrip(".") or "img", data, problem, False


def bounded_image(data: bytes, max_size: int, quality: int = JPEG_QUALITY) -> bytes | None:
    """The image shrunk so that its shorter side is ``max_size`` (aspect kept, bicubic; a JPEG is first decoded at
    the smallest DCT scale still above that size), as RGB JPEG bytes at ``quality``; None when it already fits."""
    with Image.open(io.BytesIO(data)) as img:
        width, height = img.size
        if min(width, height) <= max_size:
            return None
        scale = max_size / min(width, height)
        size = (max(max_size, round(width * scale)), max(max_size, round(height * scale)))
        img.draft("RGB", size)
        small = img.convert("RGB").resize(size, Image.BICUBIC)
    buf = io.BytesIO()
    small.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def image_problem(data: bytes, name: str) -> str | None:
    """Why the file ``name`` holding ``data`` is not a readable image (empty, unknown signature, truncated, does not
    decode), or None when it reads. JPEGs are decoded at 1/8 scale (every byte is still read)."""
    if not data:
        return "empty file (0 bytes)"
    try:
        check_image_bytes(data, name)
        with Image.open(io.BytesIO(data)) as img:
            img.draft("RGB", (1, 1))
            img.load()
    except (OSError, ValueError, SyntaxError) as err:  # what PIL raises for damaged files (as the readers catch)
        return str(err) or type(err).__name__
    return None


def read_index(root: str | Path, split: str) -> dict[str, Any]:
    """``root/<split>.json`` of :func:`make_shards`, with an error that says how to make it."""
    path = Path(root) / f"{split}.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"no shard index {path}: make the shards with `lightvision classify make-shards "
            f"--data IMAGEFOLDER --out {root} --split {split}` (data.format=shards reads them)"
        )
    return json.loads(path.read_text())


class ShardDataset(IterableDataset):
    """The samples of one split's shards (see the module docstring).

    Args:
        root: the shard folder; split: which split.
        decode: ``decode(image bytes, key) -> image`` (raises OSError / ValueError for an unreadable image, which is
            skipped and counted); transform: applied to the decoded image (its errors are raised, not skipped).
        train: shuffle shards and samples, and repeat; repeats: ``aug.repeated_aug``.
        seed: with the epoch (:meth:`set_epoch`) and the loader worker, what the shuffles and the transform's draws
            are a function of, so an epoch read again (a resumed run skipping its first batches) is the same stream.
    """

    def __init__(
        self,
        root: str | Path,
        split: str,
        decode: Callable[[bytes, str], Any],
        train: bool,
        repeats: int = 1,
        transform: Callable[[Any], Any] | None = None,
        seed: int = 0,
    ):
        index = read_index(root, split)
        self.classes, self.count = index["classes"], index["count"]
        self.urls = [str(Path(root) / name) for name in index["shards"]]
        self.decode, self.transform, self.train, self.repeats = decode, transform, train, max(1, repeats)
        self.seed = seed
        self._epoch = multiprocessing.Value("i", 0, lock=False)  # shared: persistent loader workers see set_epoch
        self._skipped = multiprocessing.Value("i", 0)

    def __len__(self) -> int:
        return self.count

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return self._epoch.value

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch the next iteration reads, in this process and in the loader workers (persistent or not,
        they share it with this process)."""
        self._epoch.value = epoch

    def skipped_images(self) -> int:
        """How many unreadable images were skipped so far (all workers, and the device decoder)."""
        return self._skipped.value

    def add_skipped(self, n: int) -> None:
        """Count ``n`` more skipped images."""
        with self._skipped.get_lock():
            self._skipped.value += n

    def worker_balance(self, workers: int) -> str | None:
        """None when ``workers`` loader workers read equal shares of the shards to an epoch's end (or nearly: the
        unequal last round is at most ``UNEVEN_SHARE`` of the epoch); else a line saying what is uneven and what to
        change. Worker i reads shards i, i + workers, ... (webdataset's split by worker)."""
        shards = len(self.urls)
        if workers < 2:
            return None
        if shards < workers:
            return (
                f"{shards} shards for {workers} loader workers: {workers - shards} of them read nothing; write "
                f"smaller shards (make-shards --shard-size) or set data.num_workers={shards}"
            )
        rest = shards % workers
        if not rest or rest / shards <= UNEVEN_SHARE:
            return None
        return (
            f"{shards} shards over {workers} loader workers: the last {rest / shards:.0%} of each epoch is read by "
            f"{rest} of them; a shard count that is a multiple of data.num_workers (make-shards --shard-size) keeps "
            f"every worker reading to the epoch's end"
        )

    def _key(self, *parts: object) -> int:
        """A seed from (seed, epoch, loader worker, ``parts``)."""
        info = get_worker_info()
        return hashed_seed("shards", self.seed, self.epoch, 0 if info is None else info.id, *parts)

    def _repeat(self, samples: Iterator[dict]) -> Iterator[dict]:
        offset = random.Random(self._key("repeat")).randrange(self.repeats)  # which one of every r samples is kept
        for i, sample in enumerate(samples):
            if (i + offset) % self.repeats == 0:
                yield from [sample] * self.repeats

    def _items(self, samples: Iterator[dict]) -> Iterator[Any]:
        last: tuple[dict, Any] | None = None  # the previous sample and its decoded image: a repeat decodes once
        for i, sample in enumerate(samples):
            key = sample.get("path", sample["__key__"].encode()).decode()
            ext = next(k for k in sample if not k.startswith("__") and k not in META_KEYS)
            try:
                image = last[1] if last is not None and last[0] is sample else self.decode(sample[ext], key)
            except (OSError, ValueError, SyntaxError) as err:
                self.add_skipped(1)
                warnings.warn(f"skipping unreadable image {key} ({sample['__url__']}): {err}", stacklevel=2)
                continue
            last = (sample, image)
            if self.transform is not None:
                if self.train:
                    seed_generators(self._key("sample", i))  # the draws of this place in this worker's stream
                image = self.transform(image)
            yield image, int(sample["cls"])

    def __iter__(self) -> Iterator[Any]:
        urls = list(self.urls)
        if self.train:  # the same shard order in every worker (each takes every n-th shard), new every epoch
            random.Random(hashed_seed("shards", self.seed, self.epoch)).shuffle(urls)
        pipeline = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        if self.train:
            pipeline = pipeline.shuffle(SHUFFLE_BUFFER, rng=random.Random(self._key("buffer")))
            if self.repeats > 1:  # an image's repeats one after another: in one batch, decoded once
                pipeline = pipeline.compose(self._repeat)
        return iter(pipeline.compose(self._items))


def decode_pil(data: bytes, key: str) -> Image.Image:
    """``decode`` of the cpu pipeline: the image as PIL RGB."""
    return Image.open(io.BytesIO(data)).convert("RGB")


def checked_bytes(data: bytes, key: str) -> tuple[Any, str]:
    """``decode`` of the gpu pipeline: the checked bytes and the key, decoded later on the device."""
    return check_image_bytes(data, key), key
