"""An ImageNet-like JPEG folder from CIFAR-10, for input-pipeline throughput (not for accuracy).

    python scripts/make_imagenet_like.py --cifar data/cifar10 --out data/imagenet_like --count 20000

Writes ``OUT/train/<class>/<n>.jpg`` (``--count`` images) and ``OUT/val/<class>/<n>.jpg`` (``--val-count``,
default count / 20): CIFAR-10 images (train archive for train, test archive for val, drawn with replacement),
each upscaled bicubically to a random size around ImageNet's typical 500 x 375 (long side 400..600 px, aspect
(short / long) 0.6..1.0, mostly landscape), then cropped at random by up to 10% per side, given pixel noise (std
4..10 levels: camera-like detail, so files are 40..70 KiB rather than the 15 KiB of a smooth upscale; ImageNet's
average is about 110 KiB) and saved as JPEG at quality 75..95. The same ``--seed`` gives the same bytes; images
are made in parallel processes (``--workers``, default: every available core).
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from lightvision.classify.yardstick import ARCHIVES
from lightvision.engine.data import available_cpus

LONG_SIDE = (400, 600)
ASPECT = (0.6, 1.0)
CROP = 0.1
QUALITY = (75, 95)
NOISE = (4.0, 10.0)


def read_archive(path: Path) -> tuple[list[bytes], list[str]]:
    """JPEG bytes and class names of a CIFAR-10 archive (members ``<split>/<class>/<image>``), in sorted order."""
    items = []
    with tarfile.open(path) as tar:
        for member in tar:
            parts = Path(member.name).parts
            if member.isfile() and len(parts) >= 3:
                items.append((parts[-2], parts[-1], tar.extractfile(member).read()))
    items.sort(key=lambda it: it[:2])
    return [data for _, _, data in items], [cls for cls, _, _ in items]


def make_image(data: bytes, rng: np.random.Generator) -> bytes:
    """One upscaled, cropped CIFAR image as JPEG bytes."""
    long = int(rng.integers(LONG_SIDE[0], LONG_SIDE[1] + 1))
    short = int(round(long * rng.uniform(*ASPECT)))
    w, h = (long, short) if rng.random() < 0.75 else (short, long)  # mostly landscape, as ImageNet
    big_w, big_h = int(w * (1 + CROP * rng.random())), int(h * (1 + CROP * rng.random()))
    img = Image.open(io.BytesIO(data)).convert("RGB").resize((big_w, big_h), Image.BICUBIC)
    left, top = int(rng.integers(0, big_w - w + 1)), int(rng.integers(0, big_h - h + 1))
    pixels = np.asarray(img.crop((left, top, left + w, top + h)), dtype=np.float32)
    pixels += rng.uniform(*NOISE) * rng.standard_normal(pixels.shape, dtype=np.float32)
    out = io.BytesIO()
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(
        out, "JPEG", quality=int(rng.integers(QUALITY[0], QUALITY[1] + 1))
    )
    return out.getvalue()


_SOURCE: dict[str, tuple[list[bytes], list[str]]] = {}


def _write(task: tuple[str, int, int, str, int]) -> int:
    """Write image ``n`` of ``split`` from source image ``index``; returns its size in bytes."""
    split, n, index, out, seed = task
    data, classes = _SOURCE[split]
    jpeg = make_image(data[index], np.random.default_rng([seed, 0 if split == "train" else 1, n]))
    path = Path(out) / split / classes[index] / f"{n:06d}.jpg"
    path.write_bytes(jpeg)
    return len(jpeg)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cifar", required=True, help="folder with cifar10-train-jpg.tar.gz and cifar10-test-jpg.tar.gz")
    p.add_argument("--out", required=True, help="output ImageFolder root (train/ and val/)")
    p.add_argument("--count", type=int, default=20000, help="train images (default 20000)")
    p.add_argument("--val-count", type=int, help="val images (default: count / 20)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, help="processes (default: every available core)")
    args = p.parse_args(argv)
    counts = {"train": args.count, "val": args.count // 20 if args.val_count is None else args.val_count}
    if min(counts.values()) < 1:
        p.error(f"--count and --val-count must give at least one image per split, got {counts}")
    start = time.perf_counter()
    tasks = []
    for k, (split, archive) in enumerate((("train", ARCHIVES["train"]), ("val", ARCHIVES["test"]))):
        path = Path(args.cifar) / archive
        if not path.is_file():
            p.error(f"no {path}: --cifar must hold the CIFAR-10 JPEG archives {', '.join(ARCHIVES.values())}")
        _SOURCE[split] = read_archive(path)
        for cls in sorted(set(_SOURCE[split][1])):
            (Path(args.out) / split / cls).mkdir(parents=True, exist_ok=True)
        picks = np.random.default_rng([args.seed, k]).integers(0, len(_SOURCE[split][0]), counts[split])
        tasks += [(split, n, int(i), args.out, args.seed) for n, i in enumerate(picks)]
    workers = args.workers or available_cpus()
    if workers > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:  # children inherit the decoded archives
            sizes = pool.map(_write, tasks, chunksize=64)
    else:
        sizes = [_write(t) for t in tasks]
    summary = {
        "out": args.out,
        **{f"{s}_images": c for s, c in counts.items()},
        "mean_kib": sum(sizes) / len(sizes) / 1024,
        "seconds": round(time.perf_counter() - start, 1),
        "workers": workers,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
