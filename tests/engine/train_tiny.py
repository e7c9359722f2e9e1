"""Tiny deterministic training run on the engine's Trainer, for the engine's tests (a model with gradients, a loss
poisoned at one step, a built Trainer) and the fault-tolerance tests.

``python train_tiny.py RUN_DIR --max-steps N [--resume]``. With ``TINY_SLEEP_AT_STEP=k`` the loss function of
step k creates ``RUN_DIR/in_step_k`` and sleeps, so a test can SIGKILL the process mid-step; with
``TINY_SIGTERM_AT_STEP=k`` it sends itself SIGTERM during step k (a preemption).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightvision.engine import Trainer, unwrap_model

MODEL_CONFIG = {"dim": 8, "hidden": 16}


class TinyNet(nn.Module):
    def __init__(self, dim: int = 8, hidden: int = 16):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(0.2))
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def tiny_loss(model: nn.Module, batch) -> dict[str, torch.Tensor]:
    """MSE on noised inputs (the noise exercises the seeded RNG, like diffusion noise) plus a logged RMSE."""
    inputs, target = batch
    mse = nn.functional.mse_loss(model(inputs + 0.1 * torch.randn_like(inputs)), target)
    return {"loss": mse, "rmse": mse.detach().sqrt()}


def model_with_grads(poison: str | None = None, value: float = math.nan) -> nn.Module:
    model = TinyNet()
    model(torch.randn(4, 8)).sum().backward()
    if poison is not None:
        dict(model.named_parameters())[poison].grad[0, 0] = value
    return model


def poisoned_loss(at_step: int, kind: str):
    """tiny_loss, except at one step: a NaN loss, or a finite loss whose gradient in body.0.weight is inf
    (d sqrt(u) / du at u = 0). Returns the loss function and a list to put the trainer in."""
    holder: list = []

    def loss_fn(model, batch):
        out = tiny_loss(model, batch)
        if holder[0].step + 1 == at_step:
            if kind == "loss":
                out["loss"] = out["loss"] * math.nan
            else:
                weight = unwrap_model(model).body[0].weight
                out["loss"] = out["loss"] + torch.sqrt(weight - weight.detach()).sum()
        return out

    return loss_fn, holder


def build(
    run_dir: str | os.PathLike,
    max_steps: int,
    loss_fn=tiny_loss,
    data_device: str = "cpu",
    fused: bool = False,
    **trainer_kwargs,
) -> Trainer:
    """A Trainer on 52 synthetic samples (batch 8: 7 batches per epoch, the last one short), kept on
    ``data_device``; AdamW in two parameter groups (weights decayed, biases not), ``fused`` or not."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = TinyNet(**MODEL_CONFIG)
    groups = [
        {"params": [p for n, p in model.named_parameters() if n.endswith("weight")]},
        {"params": [p for n, p in model.named_parameters() if n.endswith("bias")], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=3e-2, weight_decay=0.05, fused=fused or None)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1.0 + 0.05 * s))
    x = torch.randn(52, 8, generator=torch.Generator().manual_seed(1))
    x = x.to(data_device)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True)
    kwargs = dict(
        max_steps=max_steps,
        model_config=MODEL_CONFIG,
        grad_accum_steps=2,
        clip_grad=1.0,
        ema_decay=0.9,
        log_every=1,
        ckpt_every=3,
        seed=7,
    )
    kwargs.update(trainer_kwargs)
    return Trainer(run_dir, {"recipe": "tiny"}, model, optimizer, scheduler, loader, loss_fn, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    sleep_at = int(os.environ.get("TINY_SLEEP_AT_STEP", "0"))
    sigterm_at = int(os.environ.get("TINY_SIGTERM_AT_STEP", "0"))
    sent: list[bool] = []

    def loss_fn(model: nn.Module, batch):
        if trainer.step + 1 == sleep_at:
            (Path(args.run_dir) / f"in_step_{sleep_at}").touch()
            time.sleep(600)
        if trainer.step + 1 == sigterm_at and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
        return tiny_loss(model, batch)

    trainer = build(args.run_dir, args.max_steps, loss_fn=loss_fn)
    result = trainer.fit(resume=args.resume)
    print("interrupted" if result["interrupted"] else "finished", result["step"])


if __name__ == "__main__":
    main()
