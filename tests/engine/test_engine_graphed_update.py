"""``graph_update``: where the captured update applies, the finite watch's device-side step, and on CUDA that the
replayed update computes what the eager one does, resumes exactly, reports a bad step and follows moved gradients."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import DistributedType
from torch import nn

from lightvision.engine import CheckpointManager, MetricsLogger, NonFiniteError, graphed_update
from lightvision.engine.graphed_update import graph_update_blocker
from lightvision.engine.guards import FiniteWatch
from lightvision.engine.trainer import TIMING_KEYS
from train_tiny import build, model_with_grads, poisoned_loss

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def fake_accelerator(device="cuda", scaler=None, distributed=DistributedType.NO):
    return SimpleNamespace(device=torch.device(device), scaler=scaler, distributed_type=distributed)


def test_the_update_is_captured_for_fused_adam_on_cuda_only():
    params = [nn.Parameter(torch.zeros(3))]
    fused = torch.optim.AdamW(params, fused=True)
    assert graph_update_blocker(fake_accelerator(), fused, "stop") is None
    assert graph_update_blocker(fake_accelerator(), SimpleNamespace(optimizer=fused), "stop") is None  # accelerate's
    assert graph_update_blocker(fake_accelerator(distributed=DistributedType.MULTI_GPU), fused, "stop") is None
    blocked = {
        "on cpu, not CUDA": (fake_accelerator("cpu"), fused, "stop"),
        "nan_policy=skip": (fake_accelerator(), fused, "skip"),
        "grad scaler": (fake_accelerator(scaler=object()), fused, "stop"),
        "FSDP": (fake_accelerator(distributed=DistributedType.FSDP), fused, "stop"),
        "AdamW without fused=True": (fake_accelerator(), torch.optim.AdamW(params, foreach=True), "stop"),
        "SGD without fused=True": (fake_accelerator(), torch.optim.SGD(params, fused=True), "stop"),
    }
    for phrase, args in blocked.items():
        assert phrase in graph_update_blocker(*args), phrase


def test_finite_watch_takes_the_step_as_a_device_tensor():
    model = model_with_grads("head.weight")
    watch = FiniteWatch(model)
    watch.note(torch.tensor(0.5), torch.tensor(6))
    first = watch._first
    watch.note(torch.tensor(math.nan), torch.tensor(7))
    assert watch.first() == (6, 0.5, ["head.weight"])
    assert all(a is b for a, b in zip(first, watch._first))  # updated in place, as a captured graph needs


# a model compiled with CUDA graphs, one micro-batch a step: the backward leaves each gradient at a fixed address
COMPILED = dict(data_device="cuda", fused=True, torch_compile="reduce-overhead", grad_accum_steps=1)


def run(tmp_path, steps, **kwargs):
    trainer = build(tmp_path, steps, **{**COMPILED, "log_every": 4, "ckpt_every": 5, **kwargs})
    trainer.fit()
    return trainer


def state(trainer) -> list[torch.Tensor]:
    optimizer = [t for s in trainer.optimizer.state.values() for t in s.values()]
    return [*trainer.unwrapped_model.state_dict().values(), *trainer.ema.module.state_dict().values(), *optimizer]


def records(run_dir) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in MetricsLogger(run_dir).records()]


def replayed(run_dir) -> list[float]:
    return [r["update_replayed"] for r in MetricsLogger(run_dir).records() if "update_replayed" in r]


def moving_grads(trainer, monkeypatch, step: int) -> None:
    """Copy every gradient to a new place after the backward of ``step``."""
    backward = trainer.accelerator.backward

    def backward_then_move(loss, **kwargs):
        backward(loss, **kwargs)
        if trainer.step + 1 == step:
            for p in trainer.unwrapped_model.parameters():
                p.grad = p.grad.clone()

    monkeypatch.setattr(trainer.accelerator, "backward", backward_then_move)


@needs_cuda
def test_replayed_update_computes_what_the_eager_update_does(tmp_path, monkeypatch):
    """Clipping, two parameter groups, a schedule, EMA warm-up: replaying the captured update gives the weights, EMA,
    optimizer state and logs of running it eagerly, bit for bit, and the plain update's closely; once the compile has
    warmed up (and met the epoch's short last batch at step 7), every step replays."""
    graphed = run(tmp_path / "replayed", 12)
    assert graphed.unwrapped_model.head.weight.device.type == "cuda"
    assert replayed(tmp_path / "replayed")[-1] == 1.0
    monkeypatch.setattr(graphed_update, "MAX_GRAPHS", 0)
    eager = run(tmp_path / "eager", 12)
    monkeypatch.undo()
    assert replayed(tmp_path / "eager") == [0.0, 0.0, 0.0]
    plain = run(tmp_path / "plain", 12, graph_update=False)
    assert records(tmp_path / "replayed") == records(tmp_path / "eager")
    assert all(torch.equal(a, b) for a, b in zip(state(graphed), state(eager)))
    for a, b in zip(state(graphed), state(plain)):  # the learning rate reaches the fused update as float32
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert graphed.optimizer.param_groups[0]["lr"] == plain.optimizer.param_groups[0]["lr"]  # a float again
    assert not any(g["capturable"] for g in graphed.optimizer.param_groups)


@needs_cuda
def test_an_eager_backward_with_micro_batches_updates_like_the_plain_update(tmp_path):
    """Without CUDA graphs in the backward the caching allocator places the gradients, and two micro-batches
    accumulate them: the update replays where they come back to addresses seen before, and the run equals the one
    with the plain update."""
    eager_backward = dict(torch_compile=False, grad_accum_steps=2)
    graphed = run(tmp_path / "graphed", 12, **eager_backward)
    plain = run(tmp_path / "plain", 12, graph_update=False, **eager_backward)
    assert len(replayed(tmp_path / "graphed")) == 3 and not replayed(tmp_path / "plain")
    for a, b in zip(state(graphed), state(plain)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@needs_cuda
def test_compiled_micro_batches_accumulate_outside_the_graphs_memory(tmp_path):
    """CUDA-graph trees hand the backward's memory to the next micro-batch's forward: the Trainer copies the first
    micro-batch's gradients out, so that the second backward accumulates into them instead of failing."""
    trainer = run(tmp_path, 8, grad_accum_steps=2)
    assert trainer.step == 8 and all(torch.isfinite(p).all() for p in trainer.unwrapped_model.parameters())


@needs_cuda
def test_replayed_update_resumes_exactly(tmp_path):
    reference = run(tmp_path / "ref", 12)
    run(tmp_path / "run", 9)
    resumed = build(tmp_path / "run", 12, **COMPILED, log_every=4, ckpt_every=5)
    resumed.fit(resume=tmp_path / "run" / "checkpoints" / "step_0000005")
    assert records(tmp_path / "run") == records(tmp_path / "ref")
    assert all(torch.equal(a, b) for a, b in zip(state(resumed), state(reference)))


@needs_cuda
@pytest.mark.parametrize("kind", ["loss", "grad"])
def test_replayed_update_reports_the_first_bad_step(tmp_path, kind):
    loss_fn, holder = poisoned_loss(9, kind)
    trainer = build(tmp_path, 12, loss_fn=loss_fn, **COMPILED, ckpt_every=4)
    holder.append(trainer)
    expected = "loss=nan" if kind == "loss" else r"group\(s\) body.0: body.0.weight"
    with pytest.raises(NonFiniteError, match=f"step 9.*{expected}"):
        trainer.fit()
    assert trainer._graphed.replays >= 3
    assert [p.name for p in CheckpointManager(tmp_path).checkpoints()] == ["step_0000004", "step_0000008"]


@needs_cuda
def test_moved_gradients_are_never_read_from_their_old_place(tmp_path, monkeypatch):
    """Gradients that land elsewhere (here: copied after the backward of step 10) run that step's update eagerly; the
    graph replays again once they are back, and the run equals the all-eager one bit for bit."""
    moved = build(tmp_path / "moved", 12, **COMPILED, log_every=4, ckpt_every=100)
    moving_grads(moved, monkeypatch, 10)
    moved.fit()
    assert replayed(tmp_path / "moved")[-1] == 0.75
    monkeypatch.setattr(graphed_update, "MAX_GRAPHS", 0)
    eager = build(tmp_path / "eager", 12, **COMPILED, log_every=4, ckpt_every=100)
    moving_grads(eager, monkeypatch, 10)
    eager.fit()
    assert all(torch.equal(a, b) for a, b in zip(state(moved), state(eager)))


@needs_cuda
def test_a_replayed_update_does_not_wait_for_the_gpu(tmp_path, monkeypatch):
    """A replayed update queues its work without one synchronisation (``set_sync_debug_mode("error")`` raises on a
    sync): the learning rates' copy from the host, the loss's copy, the replay."""
    call, checked = graphed_update.GraphedUpdate.__call__, []

    def watched(self, loss):
        if self._key() not in self._graphs:
            return call(self, loss)
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = call(self, loss)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        checked.append(out)
        return out

    monkeypatch.setattr(graphed_update.GraphedUpdate, "__call__", watched)
    run(tmp_path, 12, log_every=100, ckpt_every=100)
    assert len(checked) >= 5
