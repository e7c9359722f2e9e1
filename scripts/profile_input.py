"""Where the GPU input path's time goes: one batch of JPEGs through ``decode_batch`` and the DeiT train transform.

    python scripts/profile_input.py --data data/imagenet_like --out input_profile.json

Median milliseconds of each stage (decode, from pageable memory and from page-locked memory as the training loader gives
it; draws + crop + flip + resize; RandAugment, as two Triton launches per layer on CUDA and as PyTorch ops; the whole
augmentation after the crop, op by op; the whole transform op by op and with the augmentation replayed as a CUDA graph;
Mixup / CutMix of its output on its own, and the transform with Mixup / CutMix in its normalisation's pass, as training
runs it) with the device synchronised after each, over ``--repeats`` batches after ``--warmup``, and how many
RandAugment values the two ways give differently (resampling rounding); then the operations of one decode + mixing
transform: on CUDA the kernel launches and the host and device time in torch.profiler (the top entries by each), with
the graph replayed, and RandAugment's device time both ways; on the CPU the operations dispatched, in all
and by RandAugment alone (on a GPU most are one kernel launch each). ``--max-size N`` first shrinks each image as
``make-shards --max-size N`` stores it; ``--tiles`` (CUDA) times the resize program's output tiles on the batch's crops.
The JSON holds the environment and the command.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lightvision.classify.data import build_mixup, norm_stats
from lightvision.classify.device_transforms import DeviceTrainTransform
from lightvision.classify.encoded import EncodedImages, decode_batch
from lightvision.classify.rand_augment import BatchRandAugment
from lightvision.classify.shards import bounded_image
from lightvision.classify.train import load_recipe
from lightvision.engine.batch_random import BatchRandom, use_batch_random
from lightvision.tools.results import results_env

STAGES = (
    "decode",
    "decode_pinned",
    "crop_flip",
    "rand_augment",
    "rand_augment_torch",
    "augment",
    "whole_eager",
    "whole",
    "mix",
    "whole_mixed",
)
RECIPE = Path(__file__).resolve().parents[1] / "configs" / "classify" / "deit_imagenet.yaml"


class CountOps(TorchDispatchMode):
    """Counts the aten operations dispatched inside the ``with`` block, by name."""

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def time_tiles(transform: DeviceTrainTransform, images: list[torch.Tensor], size: int) -> dict:
    """Device ms of the resize program (bicubic, rounded, Triton's default 4 warps) on these images' crops per output
    tile (rows x columns), each checked equal to the chosen tile's output; the taps its images need."""
    from lightvision.kernels.resize import PackedImages, resized_crops
    from lightvision.kernels.resize.op import horizontal_taps

    packed = PackedImages.pack(images)
    u = transform.draw(len(images), images[0].device)
    boxes, flip = transform.crop_boxes(packed, u)
    chosen = resized_crops(packed, boxes, flip, size, "bicubic", rounded=True)
    times = {}
    for tile in itertools.product((8, 16, 32), (32, 64, 128)):

        def run(tile=tile):
            return resized_crops(packed, boxes, flip, size, "bicubic", rounded=True, tile=tile)

        same = torch.equal(run(), chosen)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            run()
        end.record()
        torch.cuda.synchronize()
        times[f"{tile[0]}x{tile[1]}_w4"] = {"ms": round(start.elapsed_time(end) / 20, 4), "equal": same}
    taps = horizontal_taps(packed.sample_sizes(), size, "bicubic")
    return {"taps": taps, "bytes": packed.data.numel(), "tiles": times}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="image folder (train/<class>/<image> or <class>/<image>)")
    p.add_argument("--out", required=True, help="JSON to write")
    p.add_argument("--recipe", default=str(RECIPE), help="classification recipe whose aug section is profiled")
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--max-size", type=int, help="shrink each image first as make-shards --max-size stores it")
    p.add_argument("--tiles", action="store_true", help="time the resize program's output tiles (CUDA)")
    args = p.parse_args(argv)
    root = Path(args.data)
    files = sorted(f for f in (root / "train" if (root / "train").is_dir() else root).glob("*/*") if f.is_file())
    if not files:
        sys.exit(f"profile_input: no images under {root} (expected <class>/<image> or train/<class>/<image>)")
    raw = [f.read_bytes() for f in files[: args.batch]]
    if args.max_size:
        raw = [bounded_image(r, args.max_size) or r for r in raw]
    data = torch.frombuffer(bytearray(b"".join(raw)), dtype=torch.uint8)
    encoded = EncodedImages(data, [len(r) for r in raw], [str(f) for f in files[: args.batch]])
    cfg = load_recipe(args.recipe, [])
    transform = DeviceTrainTransform(cfg["aug"], args.img_size, *norm_stats(cfg))
    eager = DeviceTrainTransform(cfg["aug"], args.img_size, *norm_stats(cfg), graph=False)
    rand_augment = rand_augment_torch = transform.rand_augment or (lambda v, _: v)
    if transform.rand_augment is not None:  # the same recipe as PyTorch ops (what a CPU run does)
        mean, interpolation = norm_stats(cfg)[0], transform.interpolation
        rand_augment_torch = BatchRandAugment(cfg["aug"]["auto_augment"], args.img_size, mean, interpolation, "torch")
    mixup = build_mixup(cfg["aug"], len({f.parent.name for f in files}), on_device=True)
    mixing = DeviceTrainTransform(cfg["aug"], args.img_size, *norm_stats(cfg), mixup=mixup)
    labels = torch.zeros(len(raw), dtype=torch.long, device=args.device)
    cuda = args.device.startswith("cuda")
    pinned = encoded.pin_memory() if cuda else encoded

    def timed(fn, *inputs):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn(*inputs)
        if cuda:
            torch.cuda.synchronize()
        return out, 1000 * (time.perf_counter() - start)

    def crop(images):
        u = transform.draw(len(images), images[0].device)
        return transform.crop_flip(images, u), u

    stages = collections.defaultdict(list)
    mismatch = {"values": 0, "of": 0, "max": 0}
    for i in range(args.warmup + args.repeats):
        with use_batch_random(BatchRandom(i)):
            images, t_decode = timed(lambda: decode_batch(encoded, labels)[0])
            _, t_pinned = timed(lambda: decode_batch(pinned, labels)[0])
            (x, u), t_crop = timed(crop, images)
            drawn = transform.split(u).get("rand_augment")
            out_kernel, t_rand = timed(rand_augment, x, drawn)
            out_torch, t_rand_torch = timed(rand_augment_torch, x, drawn)
            _, t_augment = timed(eager.augment, x, u)
            _, t_eager = timed(eager, images)
            augmented, t_whole = timed(transform, images)
            _, t_mix = timed(mixup, augmented, labels)
            _, t_mixed = timed(mixing.batch, images, labels)
        if i >= args.warmup:
            times = (t_decode, t_pinned, t_crop, t_rand, t_rand_torch, t_augment, t_eager, t_whole, t_mix, t_mixed)
            differ = (out_kernel.int() - out_torch.int()).abs()
            mismatch["values"] += int((differ > 0).sum())
            mismatch["of"] += differ.numel()
            mismatch["max"] = max(mismatch["max"], int(differ.max()))
            for name, ms in zip(STAGES, times):
                stages[name].append(ms)
    report = {
        "env": results_env("python scripts/profile_input.py " + " ".join(sys.argv[1:] if argv is None else argv)),
        "settings": vars(args),
        "images": len(raw),
        "median_ms": {name: round(statistics.median(v), 2) for name, v in stages.items()},
        "rand_augment_mismatch": {
            "fraction": mismatch["values"] / mismatch["of"],
            "max_levels": mismatch["max"],
        },
    }
    with use_batch_random(BatchRandom(0)):
        if cuda:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                mixing.batch(decode_batch(encoded, labels)[0], labels)
                torch.cuda.synchronize()
            events = prof.key_averages()
            launch = ("cudaLaunchKernel", "cuLaunchKernel")
            report["launches"] = sum(e.count for e in events if e.key.startswith(launch))
            report["device_ms"] = round(sum(e.self_device_time_total for e in events) / 1000, 2)
            report["host_ms"] = round(sum(e.self_cpu_time_total for e in events) / 1000, 2)
            for key, attr in (("by_device", "self_device_time_total"), ("by_host", "self_cpu_time_total")):
                top = sorted(events, key=lambda e: -getattr(e, attr))[:25]
                report[key] = [(e.key, e.count, round(getattr(e, attr) / 1000, 2)) for e in top]
            if transform.rand_augment is not None:
                x, u = crop(decode_batch(encoded, labels)[0])
                report["rand_augment_device_ms"] = {}
                for name, fn in (("kernel", rand_augment), ("torch", rand_augment_torch)):
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        fn(x, transform.split(u)["rand_augment"])
                        torch.cuda.synchronize()
                    device_us = sum(e.self_device_time_total for e in prof.key_averages())
                    report["rand_augment_device_ms"][name] = round(device_us / 1000, 2)
            if args.tiles:
                report["resize_tiles"] = time_tiles(transform, decode_batch(encoded, labels)[0], args.img_size)
        else:
            with CountOps() as ops:
                mixing.batch(decode_batch(encoded, labels)[0], labels)
            report["ops_dispatched"] = sum(ops.counts.values())
            report["top_ops"] = ops.counts.most_common(25)
            if transform.rand_augment is not None:
                x, u = crop(decode_batch(encoded, labels)[0])
                with CountOps() as ops:
                    transform.rand_augment(x, transform.split(u)["rand_augment"])
                report["rand_augment_ops"] = sum(ops.counts.values())
    Path(args.out).write_text(json.dumps(report, indent=1))
    counted = f"{report['launches']} launches" if cuda else f"{report['ops_dispatched']} operations dispatched"
    print(
        f"median ms per batch of {len(raw)}: {report['median_ms']}; {counted}; RandAugment values differing "
        f"between the launches and the PyTorch ops: {report['rand_augment_mismatch']}; RandAugment device ms: "
        f"{report.get('rand_augment_device_ms', 'not profiled')}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
