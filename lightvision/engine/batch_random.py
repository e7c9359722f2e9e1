"""Per-sample randomness of a training loss that does not depend on the number of processes.

With ``accelerate launch --num_processes W`` (``split_batches=False`` and the seedable sampler the Trainer asks
for) rank r receives the r-th per-process batch of every group of W, so the global batch of W processes with b
rows each is the batch of one process with W x b rows, rank 0's rows first. Random draws made per sample inside
the loss (diffusion timesteps and noise, the latent draw from cached moments...) must follow the same rule, or a
2-GPU run is a different experiment from the 1-GPU run with the same global batch. :class:`BatchRandom` does it:
its generator is seeded from (seed, step, micro-batch) only, identical on every process; each draw produces the
rows of the whole global micro-batch and returns this process's slice ``[rank * b, (rank + 1) * b)``.

The Trainer makes one current around each micro-batch's ``loss_fn`` call; a loss reads it with
:func:`batch_random`::

    br = batch_random()
    t = br.randint(0, T, (x.shape[0],), device=x.device)
    noise = br.randn_like(x)

Outside a Trainer (tests, notebooks, evaluation) :func:`batch_random` returns a fallback that draws from torch's
default generators, local rows only. Rows must be the same number on every process (the Trainer's loaders drop
or pad uneven last batches). Randomness inside the model (dropout, drop path) stays on the per-process seeding of
the Trainer: it is not a per-sample draw of the loss, and DDP does not need it to match a 1-process run.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar

import torch

__all__ = ["BatchRandom", "batch_random", "batch_seed", "hashed_seed", "use_batch_random"]


def hashed_seed(*parts: object, nbytes: int = 8) -> int:
    """A non-negative seed of at most 63 bits hashed (blake2b, ``nbytes`` bytes) from ``parts`` joined by ':'."""
    key = ":".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=nbytes).digest(), "little") & ((1 << 63) - 1)


def batch_seed(seed: int, step: int, micro: int) -> int:
    """64-bit generator seed of micro-batch ``micro`` of optimizer step ``step`` (no process in it)."""
    return hashed_seed("batch", seed, step, micro)


def _size(size: Sequence[int] | int) -> tuple[int, ...]:
    size = (size,) if isinstance(size, int) else tuple(int(s) for s in size)
    if not size:
        raise ValueError("BatchRandom draws need at least one dimension: the batch rows")
    return size


class BatchRandom:
    """Draws for one micro-batch: the same global tensor on every process, of which this process keeps its rows.

    seed: generator seed (see :func:`batch_seed`); None draws from torch's default generators (the fallback
        outside a Trainer; then ``rank`` must be 0 and ``world`` 1).
    rank, world: this process's index and the number of processes.

    Every method takes the LOCAL size (first dimension = this process's rows) and returns a tensor of that size.
    One generator per device, created on first use, so draws stay on the batch's device.
    """

    def __init__(self, seed: int | None, rank: int = 0, world: int = 1):
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not a process of a world of {world}")
        if seed is None and world != 1:
            raise ValueError("a BatchRandom without seed draws from the default generators: it cannot span processes")
        self.seed, self.rank, self.world = seed, rank, world
        self._generators: dict[torch.device, torch.Generator] = {}

    def generator(self, device: torch.device | str | None = None) -> torch.Generator | None:
        """This batch's generator on ``device`` (None: the default generators are used)."""
        if self.seed is None:
            return None
        device = torch.device("cpu" if device is None else device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        gen = self._generators.get(device)
        if gen is None:
            gen = torch.Generator(device=device)
            gen.manual_seed(self.seed)
            self._generators[device] = gen
        return gen

    def fork(self, name: str) -> BatchRandom:
        """Draws of their own for a second consumer of this micro-batch (e.g. the loss's Mixup after the batch's
        augmentation, both seeded from the same step): seeded from (``name``, seed), same processes; the fallback
        (no seed) returns itself."""
        return self if self.seed is None else BatchRandom(hashed_seed(name, self.seed), self.rank, self.world)

    def _draw(self, fn, size: Sequence[int] | int, device, **kwargs) -> torch.Tensor:
        size = _size(size)
        rows = size[0]
        full = fn((rows * self.world, *size[1:]), generator=self.generator(device), device=device, **kwargs)
        return full[self.rank * rows : (self.rank + 1) * rows] if self.world > 1 else full

    def randn(self, size: Sequence[int] | int, *, device=None, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Standard normal, local ``size``."""
        return self._draw(torch.randn, size, device, dtype=dtype)

    def rand(self, size: Sequence[int] | int, *, device=None, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Uniform on [0, 1), local ``size``."""
        return self._draw(torch.rand, size, device, dtype=dtype)

    def randint(
        self, low: int, high: int, size: Sequence[int] | int, *, device=None, dtype: torch.dtype = torch.int64
    ) -> torch.Tensor:
        """Integers uniform on [low, high), local ``size``."""
        return self._draw(lambda shape, **kw: torch.randint(low, high, shape, **kw), size, device, dtype=dtype)

    def randn_like(self, x: torch.Tensor) -> torch.Tensor:
        """Standard normal of ``x``'s shape, dtype and device (first dimension = rows)."""
        return self.randn(x.shape, device=x.device, dtype=x.dtype)

    def rand_like(self, x: torch.Tensor) -> torch.Tensor:
        """Uniform [0, 1) of ``x``'s shape, dtype and device (first dimension = rows)."""
        return self.rand(x.shape, device=x.device, dtype=x.dtype)


_FALLBACK = BatchRandom(None)
_CURRENT: ContextVar[BatchRandom | None] = ContextVar("lightvision_batch_random", default=None)


def batch_random() -> BatchRandom:
    """The current micro-batch's :class:`BatchRandom` (set by the Trainer around ``loss_fn``); outside one, a
    fallback drawing from torch's default generators."""
    current = _CURRENT.get()
    return _FALLBACK if current is None else current


@contextlib.contextmanager
def use_batch_random(br: BatchRandom) -> Iterator[BatchRandom]:
    """Make ``br`` what :func:`batch_random` returns inside the ``with`` block."""
    token = _CURRENT.set(br)
    try:
        yield br
    finally:
        _CURRENT.reset(token)
