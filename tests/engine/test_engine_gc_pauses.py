"""The garbage collector's collections, timed while training: ``GcPauses`` and each log record's ``gc_ms``."""

from __future__ import annotations

import gc

from lightvision.engine import MetricsLogger
from lightvision.engine.gc_pauses import GcPauses
from train_tiny import build, tiny_loss


class Cycle:
    def __init__(self) -> None:
        self.me = self


def test_pauses_time_the_collections():
    with GcPauses() as pauses:
        pauses.take()
        for _ in range(20_000):
            Cycle()  # garbage only a collection frees
        gc.collect()
        assert pauses.take() > 0 and pauses.take() == 0.0  # read once
    assert pauses._note not in gc.callbacks


def test_each_record_has_its_windows_collections(tmp_path):
    def collecting(model, batch):  # a full collection inside steps 3 and 4 (two micro-batches a step)
        calls.append(1)
        if len(calls) in (5, 7):
            gc.collect()
        return tiny_loss(model, batch)

    calls: list[int] = []
    build(tmp_path, 4, loss_fn=collecting, log_every=2, ckpt_every=100).fit()
    records = [r for r in MetricsLogger(tmp_path).records() if "loss" in r]
    assert [r["step"] for r in records] == [2, 4] and all(r["gc_ms"] >= 0 for r in records)
    assert records[1]["gc_ms"] > 0  # the window that collected
    assert not any(callback.__qualname__.startswith("GcPauses") for callback in gc.callbacks)  # removed by fit
