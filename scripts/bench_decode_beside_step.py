"""nvjpeg's batched JPEG decode alone and beside a running compiled training step: what holds the gpu pipeline's
decode back while the model trains.

    python scripts/make_imagenet_like.py --cifar data/cifar10 --out data/imagenet_like --count 2048
    python scripts/bench_decode_beside_step.py --data data/imagenet_like --study side_stream --out decode.json

Decoders (each checked against torchvision's output: ``max_abs_diff``):

- ``torchvision``: ``torchvision.io.decode_jpeg`` of the batch on the GPU, as the gpu pipeline decodes (nvjpeg's
  hardware batched decode on a stream of torchvision's own);
- nvjpeg's batched decode called through ctypes from the library torchvision loaded, on a stream this script makes:
  ``hw_high_priority`` / ``hw_normal_priority`` (hardware backend, stream priority -1 / 0), ``hw_own_alloc`` (nvjpeg's
  own cudaMalloc / cudaHostAlloc allocators), ``hw_torch_alloc`` (PyTorch's caching allocator and page-locked tensors;
  their calls counted), ``hw_torch_alloc_padding`` (16 MiB of nvjpeg memory padding), ``hybrid_torch_alloc_4threads``
  (the default backend: Huffman decoding on 4 CPU threads).

The step: timm's DeiT-S at 224 px, ``torch.compile(mode="reduce-overhead")``, bf16 autocast, fused AdamW, batch 128,
synthetic input. Per decoder: ``alone`` (ms per batch of 128 images, synchronised) and ``beside``: the step runs 120
times while a thread decodes batches one after another on a high-priority stream; the step's rate against its rate
alone, batches decoded per step and the median ms per batch. ``--study``:

- ``side_stream``: the step on the legacy default stream, on a stream of its own, or synchronised after every step;
- ``pacing``: the step queued freely, at most 1 or 2 steps ahead of the GPU (a blocking event per step, the oldest
  waited on), or synchronised after every step;
- ``allocators``: the allocator and backend decoders above, the step queued freely.

``side_stream`` and ``pacing`` add ``fed``: the step waits for each decoded batch (decoded two batches ahead; a 192 px
crop resized to 224 stands in for the augmentation): training images/s against the step alone. Output: JSON at
``--out`` (``env``: hardware, versions, command).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import timm
import torch
import torchvision
from torchvision.io import ImageReadMode, decode_jpeg

from lightvision.tools.results import results_env

BATCH = 128
STEPS = 120
FED_STEPS = 60
HARDWARE, DEFAULT = 3, 0  # nvjpegBackend_t
OUTPUT_RGB = 3  # nvjpegOutputFormat_t: planar RGB
SYNCED = ("sync_each_step", {"sync": True})
# per study, the step's settings (name, Step.set arguments) beside the decode, and those it is fed under ("" is the
# step queued freely on the legacy default stream)
STUDIES = {
    "side_stream": {
        "beside": [("step_on_legacy", {}), ("step_on_side", {"stream": "side"}), SYNCED],
        "fed": [("step_on_legacy", {}), ("step_on_side", {"stream": "side"})],
    },
    "pacing": {
        "beside": [("", {}), ("1_ahead", {"ahead": 1}), ("2_ahead", {"ahead": 2}), SYNCED],
        "fed": [("", {}), ("1_ahead", {"ahead": 1}), ("2_ahead", {"ahead": 2})],
    },
    "allocators": {"beside": [("", {})], "fed": []},
}

c_void, c_int, c_size, c_uint = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint
DEV_MALLOC = ctypes.CFUNCTYPE(c_int, ctypes.POINTER(c_void), c_size)
DEV_FREE = ctypes.CFUNCTYPE(c_int, c_void)
PINNED_MALLOC = ctypes.CFUNCTYPE(c_int, ctypes.POINTER(c_void), c_size, c_uint)
PINNED_FREE = ctypes.CFUNCTYPE(c_int, c_void)


class DevAllocator(ctypes.Structure):
    _fields_ = [("dev_malloc", DEV_MALLOC), ("dev_free", DEV_FREE)]


class PinnedAllocator(ctypes.Structure):
    _fields_ = [("pinned_malloc", PINNED_MALLOC), ("pinned_free", PINNED_FREE)]


class NvjpegImage(ctypes.Structure):
    _fields_ = [("channel", c_void * 4), ("pitch", c_size * 4)]


def nvjpeg_library() -> ctypes.CDLL:
    """The libnvjpeg torchvision loaded (call after one torchvision GPU decode), its functions typed."""
    paths = sorted({line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "nvjpeg" in line})
    if not paths:
        raise SystemExit("torchvision loaded no libnvjpeg: this torchvision decodes JPEGs on the CPU only")
    lib = ctypes.CDLL(paths[0])
    p = ctypes.POINTER
    lib.nvjpegCreateEx.argtypes = [c_int, c_void, c_void, c_uint, p(c_void)]
    lib.nvjpegJpegStateCreate.argtypes = [c_void, p(c_void)]
    lib.nvjpegGetImageInfo.argtypes = [c_void, c_void, c_size, p(c_int), p(c_int), p(c_int), p(c_int)]
    lib.nvjpegDecodeBatchedInitialize.argtypes = [c_void, c_void, c_int, c_int, c_int]
    lib.nvjpegDecodeBatched.argtypes = [c_void, c_void, p(c_void), p(c_size), p(NvjpegImage), c_void]
    lib.nvjpegSetDeviceMemoryPadding.argtypes = [c_size, c_void]
    lib.nvjpegSetPinnedMemoryPadding.argtypes = [c_size, c_void]
    return lib


class TorchAllocators:
    """nvjpeg allocators backed by PyTorch (device: the caching allocator on ``stream``; pinned: page-locked uint8
    tensors kept until freed), each call counted in ``calls``."""

    def __init__(self, device: torch.device, stream: torch.cuda.Stream):
        self.calls = dict.fromkeys(("dev_malloc", "dev_free", "pinned_malloc", "pinned_free"), 0)
        self.pinned: dict[int, torch.Tensor] = {}
        index = device.index if device.index is not None else torch.cuda.current_device()

        def dev_malloc(out: Any, size: int) -> int:
            self.calls["dev_malloc"] += 1
            out[0] = torch.cuda.caching_allocator_alloc(max(int(size), 1), index, stream)
            return 0

        def dev_free(ptr: int) -> int:
            self.calls["dev_free"] += 1
            torch.cuda.caching_allocator_delete(ptr)
            return 0

        def pinned_malloc(out: Any, size: int, flags: int) -> int:
            self.calls["pinned_malloc"] += 1
            buffer = torch.empty(max(int(size), 1), dtype=torch.uint8, pin_memory=True)
            self.pinned[buffer.data_ptr()] = buffer
            out[0] = buffer.data_ptr()
            return 0

        def pinned_free(ptr: int) -> int:
            self.calls["pinned_free"] += 1
            self.pinned.pop(ptr, None)
            return 0

        self.dev = DevAllocator(DEV_MALLOC(dev_malloc), DEV_FREE(dev_free))
        self.host = PinnedAllocator(PINNED_MALLOC(pinned_malloc), PINNED_FREE(pinned_free))

    @contextlib.contextmanager
    def counted(self, into: dict[str, Any]) -> Any:
        """``into["alloc_calls"]``: the calls made inside the block, per allocator function."""
        before = dict(self.calls)
        yield
        into["alloc_calls"] = {k: self.calls[k] - before[k] for k in before}


class BatchedDecoder:
    """nvjpeg's batched decode of a list of JPEGs (page-locked uint8 [len] each) into uint8 [3, H, W] tensors on
    ``device``, on a stream of ``priority``; the caller's stream waits for it."""

    def __init__(
        self,
        lib: ctypes.CDLL,
        device: torch.device,
        backend: int,
        priority: int = -1,
        allocators: TorchAllocators | None = None,
        padding: int = 0,
        cpu_threads: int = 1,
    ):
        self.lib, self.device, self.cpu_threads, self.size = lib, device, cpu_threads, None
        self.handle, self.state = c_void(), c_void()
        dev = ctypes.cast(ctypes.pointer(allocators.dev), c_void) if allocators else None
        host = ctypes.cast(ctypes.pointer(allocators.host), c_void) if allocators else None
        status = lib.nvjpegCreateEx(backend, dev, host, 0, ctypes.byref(self.handle))
        if status:
            raise RuntimeError(f"nvjpegCreateEx(backend {backend}) failed with status {status}")
        if padding:
            lib.nvjpegSetDeviceMemoryPadding(padding, self.handle)
            lib.nvjpegSetPinnedMemoryPadding(padding, self.handle)
        self._check(lib.nvjpegJpegStateCreate(self.handle, ctypes.byref(self.state)), "JpegStateCreate")
        self.stream = torch.cuda.Stream(device, priority=priority)

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status:
            raise RuntimeError(f"nvjpeg{what} failed with status {status}")

    def __call__(self, datas: list[torch.Tensor]) -> list[torch.Tensor]:
        n, lib = len(datas), self.lib
        if self.size != n:
            init = lib.nvjpegDecodeBatchedInitialize(self.handle, self.state, n, self.cpu_threads, OUTPUT_RGB)
            self._check(init, "DecodeBatchedInitialize")
            self.size = n
        images, outputs = (NvjpegImage * n)(), []
        components, subsampling, widths, heights = c_int(), c_int(), (c_int * 4)(), (c_int * 4)()
        with torch.cuda.stream(self.stream):
            for i, data in enumerate(datas):
                info = lib.nvjpegGetImageInfo(
                    self.handle, data.data_ptr(), data.numel(), components, subsampling, widths, heights
                )
                self._check(info, "GetImageInfo")
                out = torch.empty(3, heights[0], widths[0], dtype=torch.uint8, device=self.device)
                outputs.append(out)
                for c in range(3):
                    images[i].channel[c], images[i].pitch[c] = out[c].data_ptr(), widths[0]
            pointers = (c_void * n)(*[d.data_ptr() for d in datas])
            lengths = (c_size * n)(*[d.numel() for d in datas])
            stream = c_void(self.stream.cuda_stream)
            self._check(lib.nvjpegDecodeBatched(self.handle, self.state, pointers, lengths, images, stream), "Decode")
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        return outputs


def load_batches(folder: Path, count: int) -> list[list[torch.Tensor]]:
    """Up to ``count`` batches of the folder's train JPEGs (sorted), each image's bytes page-locked."""
    files = sorted((folder / "train").glob("*/*.jpg"))[: BATCH * count]
    if len(files) < BATCH:
        raise SystemExit(f"{folder}/train holds {len(files)} JPEGs, fewer than one batch of {BATCH}")
    read = [torch.frombuffer(bytearray(f.read_bytes()), dtype=torch.uint8).pin_memory() for f in files]
    return [read[i : i + BATCH] for i in range(0, len(read) - BATCH + 1, BATCH)]


class Step:
    """The compiled DeiT-S training step on synthetic input, run on the legacy default stream or a stream of its own,
    queued freely, at most ``ahead`` steps ahead of the GPU, or synchronised after each step."""

    def __init__(self, device: torch.device):
        model = timm.create_model("deit_small_patch16_224", num_classes=1000).to(device)
        self.model = torch.compile(model, mode="reduce-overhead")
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        self.device, self.side = device, torch.cuda.Stream(device)
        self.x = torch.randn(BATCH, 3, 224, 224, device=device)
        self.y = torch.randint(0, 1000, (BATCH,), device=device)
        self.stream, self.ahead, self.sync = "legacy", 0, False
        for _ in range(20):
            self(self.x)

    def set(self, stream: str = "legacy", ahead: int = 0, sync: bool = False) -> None:
        self.stream, self.ahead, self.sync = stream, ahead, sync

    def on_stream(self) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(self.side if self.stream == "side" else torch.cuda.default_stream(self.device))

    def __call__(self, images: torch.Tensor) -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(self.model(images), self.y)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def pace(self, queued: list[torch.cuda.Event]) -> None:
        if self.ahead:
            done = torch.cuda.Event(blocking=True)
            done.record()
            queued.append(done)
            if len(queued) > self.ahead:
                queued.pop(0).synchronize()
        if self.sync:
            torch.cuda.current_stream().synchronize()

    def rate(self, next_batch: Callable[[], torch.Tensor] | None = None, steps: int = STEPS) -> float:
        """Images/s over ``steps`` steps (on synthetic input unless ``next_batch`` gives each batch)."""
        with self.on_stream():
            for _ in range(5):
                self(next_batch() if next_batch else self.x)
            torch.cuda.synchronize()
            start, queued = time.perf_counter(), []
            for _ in range(steps):
                self(next_batch() if next_batch else self.x)
                self.pace(queued)
            torch.cuda.synchronize()
        return steps * BATCH / (time.perf_counter() - start)


def alone_ms(decode: Callable, batches: list) -> float:
    """Median ms per batch decoded alone, synchronised (after one pass over the batches)."""
    times = []
    for batch in batches + batches:
        torch.cuda.synchronize()
        start = time.perf_counter()
        decode(batch)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times[len(batches) :])


def beside(step: Step, decode: Callable, batches: list, alone_rate: float, device: torch.device) -> dict[str, Any]:
    """The step's rate while a thread decodes batches one after another on a high-priority stream."""
    stop, done = threading.Event(), []

    def background() -> None:
        stream = torch.cuda.Stream(device, priority=-1)
        with torch.cuda.stream(stream):
            i = 0
            while not stop.is_set():
                start = time.perf_counter()
                decode(batches[i % len(batches)])
                stream.synchronize()
                done.append(time.perf_counter() - start)
                i += 1

    thread = threading.Thread(target=background, daemon=True)
    thread.start()
    time.sleep(0.5)
    first = len(done)
    rate = step.rate()
    last = len(done)
    stop.set()
    thread.join()
    return {
        "step_img_s": rate,
        "vs_alone": rate / alone_rate,
        "decoded_per_step": (last - first) / STEPS,
        "decode_ms": 1000 * statistics.median(done[first:last]) if last > first else None,
    }


def fed(step: Step, decode: Callable, batches: list, device: torch.device) -> float:
    """Images/s of the step fed by a thread decoding two batches ahead (crop 192 px, resize to 224)."""
    ready, stop = queue.Queue(maxsize=2), threading.Event()

    def producer() -> None:
        stream, i = torch.cuda.Stream(device, priority=-1), 0
        with torch.cuda.stream(stream):
            while not stop.is_set():
                crops = torch.stack([image[:, :192, :192] for image in decode(batches[i % len(batches)])]).float()
                batch = torch.nn.functional.interpolate(crops, size=(224, 224), mode="bilinear")
                event = torch.cuda.Event()
                event.record(stream)
                while not stop.is_set():
                    with contextlib.suppress(queue.Full):
                        ready.put((batch, event), timeout=0.05)
                        break
                i += 1

    def next_batch() -> torch.Tensor:
        batch, event = ready.get()
        torch.cuda.current_stream().wait_event(event)
        return batch

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    try:
        return step.rate(next_batch, FED_STEPS)
    finally:
        stop.set()
        thread.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="a folder made by scripts/make_imagenet_like.py")
    parser.add_argument("--study", choices=STUDIES, required=True)
    parser.add_argument("--batches", type=int, default=16, help="batches of 128 JPEGs read once, decoded in turn")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("this benchmark needs a CUDA GPU (nvjpeg)")
    device = torch.device("cuda", torch.cuda.current_device())
    batches = load_batches(args.data, args.batches)
    reference = decode_jpeg(batches[0], mode=ImageReadMode.RGB, device=device)
    lib = nvjpeg_library()
    decoders: dict[str, Callable] = {"torchvision": lambda d: decode_jpeg(d, mode=ImageReadMode.RGB, device=device)}
    allocators = None
    if args.study == "allocators":
        allocators = TorchAllocators(device, torch.cuda.Stream(device, priority=-1))
        decoders.update(
            hw_own_alloc=BatchedDecoder(lib, device, HARDWARE),
            hw_torch_alloc=BatchedDecoder(lib, device, HARDWARE, allocators=allocators),
            hw_torch_alloc_padding=BatchedDecoder(lib, device, HARDWARE, allocators=allocators, padding=16 << 20),
            hybrid_torch_alloc_4threads=BatchedDecoder(lib, device, DEFAULT, allocators=allocators, cpu_threads=4),
        )
    else:
        decoders.update(
            hw_high_priority=BatchedDecoder(lib, device, HARDWARE, priority=-1),
            hw_normal_priority=BatchedDecoder(lib, device, HARDWARE, priority=0),
        )
    report: dict[str, Any] = {
        "env": {**results_env(" ".join(["python", *sys.argv])), "torchvision": torchvision.__version__},
        "study": args.study,
        "images": sum(len(b) for b in batches),
        "nvjpeg": Path(lib._name).name,
        "max_abs_diff": {},
        "alone_ms_per_batch": {},
    }
    for name, decode in decoders.items():
        images = decode(batches[0])
        torch.cuda.synchronize()
        report["max_abs_diff"][name] = max((a.int() - b.int()).abs().max().item() for a, b in zip(images, reference))
        calls: dict[str, Any] = {}
        with allocators.counted(calls) if allocators else contextlib.nullcontext():
            report["alone_ms_per_batch"][name] = alone_ms(decode, batches)
        if calls:
            report.setdefault("alone_alloc_calls", {})[name] = calls["alloc_calls"]
    step = Step(device)
    report["step_alone_img_s"] = alone = step.rate()
    shown = [name for name in decoders if name != "hw_normal_priority"]
    report["beside"], report["fed"] = {}, {}
    for part in ("beside", "fed"):
        for (setting, kwargs), name in [(v, n) for v in STUDIES[args.study][part] for n in shown]:
            step.set(**kwargs)
            record: dict[str, Any] = {"decoder": name, "step": setting.replace("_", " ") or "queued freely"}
            with allocators.counted(record) if allocators else contextlib.nullcontext():
                if part == "beside":
                    record.update(beside(step, decoders[name], batches, alone, device))
                else:
                    rate = fed(step, decoders[name], batches, device)
                    record.update(img_s=rate, vs_step_alone=rate / alone)
            key = f"{name}_{setting}" if setting else name
            report[part][key] = record
            print(part, key, record, flush=True)
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
