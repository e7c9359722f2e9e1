"""check_finite, FiniteWatch and the Trainer's NaN/inf policies."""

from __future__ import annotations

import math

import pytest
import torch

from lightvision.engine import CheckpointManager, MetricsLogger, NonFiniteError, check_finite
from lightvision.engine.guards import FiniteWatch
from lightvision.engine.trainer import READ_EVERY, TIMING_KEYS
from train_tiny import build, model_with_grads, poisoned_loss


def test_finite_passes():
    assert check_finite(torch.tensor(1.5), model_with_grads(), step=3)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_nonfinite_grad_named(value):
    model = model_with_grads("head.weight", value)
    with pytest.raises(NonFiniteError, match=r"step 12.*1 parameter\(s\) of group\(s\) head: head.weight"):
        check_finite(torch.tensor(0.3), model, step=12)
    assert check_finite(torch.tensor(0.3), model, step=12, policy="skip") is False


def test_nonfinite_loss():
    with pytest.raises(NonFiniteError, match="step 4: loss=inf"):
        check_finite(torch.tensor(math.inf), model_with_grads(), step=4)
    assert check_finite(math.nan, None, step=4, policy="skip") is False
    with pytest.raises(ValueError, match="nan_policy"):
        check_finite(1.0, None, step=1, policy="ignore")


@pytest.mark.parametrize("kind", ["loss", "grad"])
def test_trainer_stop_keeps_last_good_checkpoint(tmp_path, kind):
    loss_fn, holder = poisoned_loss(5, kind)
    trainer = build(tmp_path, 8, loss_fn=loss_fn, ckpt_every=2)
    holder.append(trainer)
    expected = "loss=nan" if kind == "loss" else r"group\(s\) body.0: body.0.weight"
    with pytest.raises(NonFiniteError, match=f"step 5.*{expected}"):
        trainer.fit()
    manager = CheckpointManager(tmp_path)
    assert [p.name for p in manager.checkpoints()] == ["step_0000002", "step_0000004"]
    records = MetricsLogger(tmp_path).records()
    assert records[-1]["step"] == 5 and records[-1]["event"] == "non_finite"


def test_trainer_skip_continues(tmp_path):
    loss_fn, holder = poisoned_loss(3, "grad")
    trainer = build(tmp_path, 6, loss_fn=loss_fn, nan_policy="skip")
    holder.append(trainer)
    before = {k: v.clone() for k, v in trainer.unwrapped_model.state_dict().items()}
    result = trainer.fit()
    assert result["step"] == 6 and result["skipped_steps"] == 1
    assert all(torch.isfinite(p).all() for p in trainer.unwrapped_model.parameters())
    assert all(torch.isfinite(p).all() for p in trainer.ema.module.parameters())
    assert any(not torch.equal(before[k], v) for k, v in trainer.unwrapped_model.state_dict().items())
    records = {r["step"]: r for r in MetricsLogger(tmp_path).records()}
    assert "loss" not in records[3] and records[3]["skipped_steps"] == 1 and math.isfinite(records[4]["loss"])


def test_finite_watch_keeps_the_first_bad_step():
    """The device-side record: nothing before a bad step; then that step's loss and parameters, however many finite
    or bad steps follow; partial gradients (a parameter without one) keep their names' places."""
    model = model_with_grads()
    watch = FiniteWatch(model)
    watch.note(torch.tensor(0.5), step=1)
    assert watch.first() is None
    dict(model.named_parameters())["head.weight"].grad[0, 0] = math.inf
    watch.note(torch.tensor(0.25), step=2)
    dict(model.named_parameters())["head.weight"].grad.zero_()
    watch.note(torch.tensor(math.nan), step=3)
    assert watch.first() == (2, 0.25, ["head.weight"])
    partial = model_with_grads()
    first_name, first = next(iter(partial.named_parameters()))
    first.grad = None
    dict(partial.named_parameters())["head.bias"].grad[0] = math.nan
    watch = FiniteWatch(partial)
    watch.note(torch.tensor(1.0), step=4)
    assert watch.first() == (4, 1.0, ["head.bias"]) and first_name != "head.bias"
    loss_only = FiniteWatch(None)
    loss_only.note(torch.tensor(math.inf), step=9)
    assert loss_only.first() == (9, math.inf, [])


def test_trainer_reads_the_device_only_at_boundaries(tmp_path, monkeypatch):
    """nan_policy stop: the host reads the device state every READ_EVERY steps and before logs, checkpoints and the
    last step, not every step; a bad step is still reported as itself, with nothing saved past it."""
    loss_fn, holder = poisoned_loss(3, "grad")
    trainer = build(tmp_path, 25, loss_fn=loss_fn, log_every=50, ckpt_every=100)
    holder.append(trainer)
    reads = []
    read = trainer._read_device_state
    monkeypatch.setattr(trainer, "_read_device_state", lambda: (reads.append(trainer.step), read())[1])
    with pytest.raises(NonFiniteError, match=r"step 3.*group\(s\) body.0: body.0.weight"):
        trainer.fit()
    assert reads == [READ_EVERY] and trainer.step == READ_EVERY
    assert CheckpointManager(tmp_path).checkpoints() == []
    assert MetricsLogger(tmp_path).records()[-1]["step"] == 3


def test_stop_and_skip_policies_log_the_same_clean_run(tmp_path):
    """Without a bad step the watched run (host reads at boundaries) logs what the per-step checked run logs."""
    runs = {}
    for policy in ("stop", "skip"):
        build(tmp_path / policy, 9, nan_policy=policy, log_every=4, ckpt_every=100).fit()
        records = MetricsLogger(tmp_path / policy).records()
        runs[policy] = [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]
    assert runs["stop"] == runs["skip"] and [r["step"] for r in runs["stop"]] == [4, 8, 9]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host-sync check needs a CUDA device")
def test_trainer_steps_between_boundaries_do_not_wait_for_the_gpu(tmp_path, monkeypatch):
    """With the data on the GPU, the steps between the host's reads queue their work without one synchronisation
    (``set_sync_debug_mode("error")`` raises on a sync): loss, backward, the watch, clipping, AdamW, EMA."""
    trainer = build(tmp_path, 8, data_device="cuda", log_every=100, ckpt_every=100)
    step = trainer._train_step

    def watched(batches):
        if trainer.step == 0:  # the first step allocates the optimizer's and the watch's state
            return step(batches)
        torch.cuda.set_sync_debug_mode("error")
        try:
            step(batches)
        finally:
            torch.cuda.set_sync_debug_mode(0)

    monkeypatch.setattr(trainer, "_train_step", watched)
    assert trainer.fit()["step"] == 8
    assert [r["step"] for r in MetricsLogger(tmp_path).records()] == [8]
