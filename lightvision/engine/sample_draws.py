"""Per-sample draws of a map-style dataset (augmentations in DataLoader workers) that a resumed run replays.

A transform that runs in a loader worker (random resized crop, flip, RandAugment, random erasing...) draws from the
worker's python / numpy / torch generators, whose state depends on the worker and on everything it loaded before:
after a resume the same sample gets other draws. Here the draws are keyed by the sample's slot instead:
:class:`KeyedSampler` yields ``(index, key)`` with ``key`` hashed from (seed, epoch, position in the epoch's order),
and :class:`KeyedDraws` seeds the three generators from ``key`` before reading ``dataset[index]``. A slot is a
(step, row of the global batch) pair, so the draws are a pure function of (seed, step, sample): the same after a
resume, in any worker, for any number of workers or processes (accelerate deals the one order out to the processes).

    loader = DataLoader(KeyedDraws(dataset), sampler=KeyedSampler(len(dataset), seed), batch_size=...)
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from lightvision.engine.batch_random import hashed_seed

__all__ = ["KeyedDraws", "KeyedSampler", "seed_generators"]


def seed_generators(key: int) -> None:
    """Seed python's, numpy's and torch's CPU global generators from ``key`` (a non-negative int); about 15 us
    (``torch.manual_seed`` would also visit every device's generator, at ten times the cost)."""
    random.seed(key)
    np.random.seed(key % (1 << 32))
    torch.default_generator.manual_seed(key)


class KeyedSampler(Sampler):
    """``(index, key)`` per sample of an epoch: the indices of ``base`` (or, when ``base`` is None, the permutation of
    ``range(size)`` that accelerate's seedable sampler draws with this seed in this epoch), each with the draw key of
    its slot, hashed from (seed, epoch, position).

    base: a sampler with ``set_epoch`` (e.g. timm's ``RepeatAugSampler``), or None.
    """

    def __init__(self, size: int, seed: int, base: Sampler | None = None):
        self.size, self.seed, self.base, self.epoch = size, seed, base, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if self.base is not None:
            self.base.set_epoch(epoch)

    def __len__(self) -> int:
        return self.size if self.base is None else len(self.base)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        if self.base is None:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.size, generator=generator).tolist()
        else:
            order = list(self.base)
        for position, index in enumerate(order):
            yield index, hashed_seed("sample", self.seed, self.epoch, position)


class KeyedDraws(Dataset):
    """``dataset[index]`` for an item ``(index, key)`` of :class:`KeyedSampler`, read with the global generators
    seeded from ``key`` (:func:`seed_generators`)."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, int]) -> Any:
        index, key = item
        seed_generators(key)
        return self.dataset[index]

    def __getitems__(self, items: list[tuple[int, int]]) -> list[Any]:
        """A batch's items: from a dataset that loads and transforms apart (``load_each`` / ``transformed``, as
        :class:`~lightvision.engine.data.SafeImageFolder`), an index the batch repeats is loaded (decoded) once and
        each repeat transformed with its own key's draws; the items equal ``[self[item] for item in items]``."""
        if not hasattr(self.dataset, "load_each"):
            return [self[item] for item in items]
        loaded = self.dataset.load_each(index for index, _ in items)
        out = []
        for index, key in items:
            seed_generators(key)
            out.append(self.dataset.transformed(*loaded[index]))
        return out
