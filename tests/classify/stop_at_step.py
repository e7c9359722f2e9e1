"""``python stop_at_step.py KILL|TERM STEP ARGS...``: the ``lightvision ARGS...`` command line, which sends itself
SIGKILL (a crash) or SIGTERM (a preemption) as training optimizer step STEP begins."""

from __future__ import annotations

import os
import signal
import sys

from lightvision import cli
from lightvision.engine.trainer import Trainer


def main() -> int:
    sig, step = getattr(signal, f"SIG{sys.argv[1]}"), int(sys.argv[2])
    train_step = Trainer._train_step

    def stopping(trainer: Trainer, batches):
        if trainer.step + 1 == step:
            os.kill(os.getpid(), sig)
        return train_step(trainer, batches)

    Trainer._train_step = stopping
    return cli.main(sys.argv[3:])


if __name__ == "__main__":
    sys.exit(main())
