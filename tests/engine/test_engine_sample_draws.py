"""Per-sample draws keyed by slot (KeyedSampler / KeyedDraws): the same for any worker layout and after skipping
batches; every sampler level of a skipped, sharded loader sees its epoch."""

from __future__ import annotations

import random

import torch
from accelerate.data_loader import BatchSamplerShard, DataLoaderShard, SeedableRandomSampler, SkipBatchSampler
from torch.utils.data import BatchSampler, DataLoader, Dataset

from lightvision.engine.sample_draws import KeyedDraws, KeyedSampler
from lightvision.engine.trainer import set_loader_epoch


class Draws(Dataset):
    """Item i: (i, a python draw, a torch draw): what a worker's augmentation would draw for it."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> tuple[int, float, float]:
        return index, random.random(), float(torch.rand(()))


def epoch_items(workers: int, epoch: int, skip: int = 0) -> list[tuple]:
    sampler = KeyedSampler(10, seed=3)
    batches = SkipBatchSampler(BatchSampler(sampler, 2, True), skip)
    loader = DataLoader(KeyedDraws(Draws()), batch_sampler=batches, num_workers=workers)
    sampler.set_epoch(epoch)
    return [tuple(zip(*(t.tolist() for t in batch))) for batch in loader]


def test_draws_follow_the_slot_not_the_worker():
    one = epoch_items(0, epoch=1)
    assert epoch_items(2, epoch=1) == one  # other workers, the same draws
    assert epoch_items(2, epoch=1, skip=2) == one[2:]  # the rest of a resumed epoch: the same draws
    assert sorted(i for batch in one for i, _, _ in batch) == list(range(10))
    other = epoch_items(0, epoch=2)
    assert {i for batch in other for i, _, _ in batch} == set(range(10)) and other != one  # a new epoch: new draws
    draws = [d for batch in one for _, d, _ in batch]
    assert len(set(draws)) == 10  # every slot its own draws


def test_set_loader_epoch_reaches_the_sampler_of_a_skipped_shard():
    sampler = KeyedSampler(16, seed=0)
    shard = BatchSamplerShard(BatchSampler(sampler, 2, True), num_processes=2, process_index=1)
    loader = DataLoaderShard(KeyedDraws(Draws()), batch_sampler=SkipBatchSampler(shard, 1))
    set_loader_epoch(loader, 3)
    assert sampler.epoch == 3


def test_order_is_the_seedable_samplers():
    """Without a base sampler the order is the one accelerate's seedable sampler gives a shuffled loader."""
    sampler, seedable = KeyedSampler(10, seed=5), SeedableRandomSampler(range(10), data_seed=5)
    for epoch in (0, 3):
        sampler.set_epoch(epoch)
        seedable.set_epoch(epoch)
        assert [i for i, _ in sampler] == list(seedable)
