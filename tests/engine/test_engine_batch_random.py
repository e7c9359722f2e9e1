"""BatchRandom: per-sample loss randomness that does not depend on the number of processes, inside the Trainer
and after an exact resume; and the data-order premise it rests on (accelerate deals out consecutive batches)."""

from __future__ import annotations

import pytest
import torch
from accelerate.data_loader import prepare_data_loader
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightvision.engine import BatchRandom, MetricsLogger, batch_random, use_batch_random
from lightvision.engine.batch_random import batch_seed
from train_tiny import build


def draws(br: BatchRandom, rows: int) -> list[torch.Tensor]:
    """A sequence of draws of every kind, as a loss would make them (the stream must stay aligned across calls)."""
    x = torch.zeros(rows, 2, 3)
    return [
        br.randint(0, 1000, (rows,)),
        br.randn_like(x),
        br.rand(rows),
        br.randn((rows, 5), dtype=torch.float64),
        br.rand_like(x),
    ]


def test_fork_draws_apart_from_the_batch_and_keeps_the_ranks():
    """A fork (the loss's Mixup after the batch's augmentation) draws its own stream, the same for every call with
    the seed, and its ranks still concatenate to its single-process draws; the fallback forks to itself."""
    seed = batch_seed(7, 12, 1)
    main, fork = BatchRandom(seed).rand(8), BatchRandom(seed).fork("mixup").rand(8)
    assert not torch.equal(main, fork) and torch.equal(fork, BatchRandom(seed).fork("mixup").rand(8))
    ranks = [BatchRandom(seed, r, 2).fork("mixup").rand(4) for r in range(2)]
    assert torch.equal(torch.cat(ranks), fork)
    assert batch_random().fork("mixup") is batch_random()


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_concatenate_to_the_single_process_draws(world):
    seed, rows = batch_seed(7, 12, 1), 4
    single = draws(BatchRandom(seed), rows * world)
    per_rank = [draws(BatchRandom(seed, rank, world), rows) for rank in range(world)]
    for k, whole in enumerate(single):
        parts = [ranks[k] for ranks in per_rank]
        assert all(p.shape[0] == rows for p in parts)
        assert torch.equal(torch.cat(parts), whole)
    assert not torch.equal(per_rank[0][1], per_rank[1][1])  # ranks get different rows, not copies


def test_seed_depends_on_step_and_micro_batch_only():
    assert batch_seed(0, 3, 1) == batch_seed(0, 3, 1)
    assert len({batch_seed(0, 3, 1), batch_seed(0, 4, 1), batch_seed(0, 3, 0), batch_seed(1, 3, 1)}) == 4
    with pytest.raises(ValueError, match="rank 2 is not a process"):
        BatchRandom(0, rank=2, world=2)
    with pytest.raises(ValueError, match="cannot span processes"):
        BatchRandom(None, rank=0, world=2)


def test_fallback_outside_a_trainer_uses_torch_generators():
    torch.manual_seed(3)
    a = batch_random().randn((4, 2))
    torch.manual_seed(3)
    assert torch.equal(a, torch.randn(4, 2))
    mine = BatchRandom(5)
    with use_batch_random(mine):
        assert batch_random() is mine
        assert torch.equal(batch_random().rand(3), BatchRandom(5).rand(3))
    assert batch_random() is not mine and batch_random().seed is None


def test_accelerate_deals_consecutive_batches_to_ranks():
    """The premise: with the seedable sampler, the 2-process global batch is the 1-process batch of twice the size,
    rank 0's rows first, every epoch."""
    data = TensorDataset(torch.arange(40))

    def batches(batch_size: int, world: int, rank: int, epoch: int) -> list[torch.Tensor]:
        loader = prepare_data_loader(
            DataLoader(data, batch_size=batch_size, shuffle=True, drop_last=True),
            num_processes=world,
            process_index=rank,
            use_seedable_sampler=True,
            data_seed=11,
        )
        loader.set_epoch(epoch)
        return [b for (b,) in loader]

    for epoch in (0, 1):
        single = batches(8, 1, 0, epoch)
        rank0, rank1 = batches(4, 2, 0, epoch), batches(4, 2, 1, epoch)
        assert len(single) == len(rank0) == len(rank1) == 5
        for whole, a, b in zip(single, rank0, rank1):
            assert torch.equal(torch.cat([a, b]), whole)
    assert not torch.equal(torch.cat(batches(8, 1, 0, 0)), torch.cat(batches(8, 1, 0, 1)))


def noisy_loss(seen: list | None = None):
    """The tiny MSE with its input noise drawn per sample through batch_random (like the diffusion loss)."""

    def loss_fn(model: nn.Module, batch):
        inputs, target = batch
        noise = batch_random().randn_like(inputs)
        if seen is not None:
            seen.append(noise)
        return nn.functional.mse_loss(model(inputs + 0.1 * noise), target)

    return loss_fn


def test_trainer_draws_from_step_and_micro_batch(tmp_path):
    seen: list[torch.Tensor] = []
    build(tmp_path, 3, loss_fn=noisy_loss(seen), grad_accum_steps=2, seed=7).fit()
    assert len(seen) == 6
    for i, noise in enumerate(seen):
        step, micro = divmod(i, 2)
        expected = BatchRandom(batch_seed(7, step, micro)).randn_like(noise)
        assert torch.equal(noise, expected)
    assert batch_random().seed is None  # reset after the step


def test_resume_with_batch_random_matches_uninterrupted_run(tmp_path):
    build(tmp_path / "ref", 8, loss_fn=noisy_loss()).fit()
    build(tmp_path / "run", 5, loss_fn=noisy_loss()).fit()
    build(tmp_path / "run", 8, loss_fn=noisy_loss()).fit(resume=True)

    def curve(run):
        return [(r["step"], r["loss"]) for r in MetricsLogger(run).records() if "loss" in r]

    assert curve(tmp_path / "run") == curve(tmp_path / "ref") and len(curve(tmp_path / "ref")) == 8
