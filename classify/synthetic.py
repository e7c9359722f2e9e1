"""``data.source: synthetic``: random images made once on the training device, a run's input without its cost.

A run with this source trains as the same run from image files would (the Trainer, its sampler and epochs, Mixup /
CutMix on the device, EMA, logging, checkpoints), but no file is read, decoded or augmented: its rate against the
real run's shows what the input pipeline costs. A pool of a few training batches of standard normal images (the
normalised form the model takes) with uniform labels is made once; the loader yields only (index [B], label [B]) and
:class:`~lightvision.classify.decoded.CachedBatches` gathers the batch's images from the pool on the device, as for
``data.cache: device``.
"""

from __future__ import annotations

import torch

from lightvision.classify.decoded import DeviceImages

__all__ = ["POOL_BATCHES", "SyntheticImages"]

POOL_BATCHES = 4  # the pool holds this many training batches of images


class SyntheticImages(DeviceImages):
    """A set of ``length`` items over a pool of random images on ``device``: item i is (i mod pool, its label), so
    the loader, its sampler and the epochs are those of a set of ``length`` images.

    Args:
        length: items in the set (an epoch of training); pool: images made (at most ``length``).
        size, in_chans: ``images`` is float [pool, in_chans, size, size], standard normal.
        classes: ``labels`` is int64 [pool], uniform in [0, classes); ``classes`` names them "0", "1", ...
        device: where the pool lives (the training device); seed: its generator's seed.
    """

    def __init__(
        self, length: int, pool: int, size: int, in_chans: int, classes: int, device: torch.device | str, seed: int
    ):
        generator = torch.Generator(device).manual_seed(seed)
        pool = min(pool, length)
        self.images = torch.randn(pool, in_chans, size, size, generator=generator, device=device)
        self.labels = torch.randint(classes, (pool,), generator=generator, device=device)
        self.targets = self.labels.tolist()
        self.classes = [str(c) for c in range(classes)]
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[int, int]:
        return super().__getitem__(index % len(self.targets))
