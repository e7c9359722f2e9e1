"""The built-in default diffusion job: a small pixel-space, class-conditional LightNet-DiT on scikit-learn's digits.

No download, a few minutes on a 2-core CPU: 16 x 16 x 1 images (8 x 8 digits upsampled, 8-bit grid, [-1, 1]), patch 2,
hybrid loss over T = 1000 linear steps, EMA. Writes a class-conditional sample grid (PNG, one row per digit) and
reports the test-set negative log-likelihood bound in bits/dim: the full 1000-step VLB of the EMA model on the 360
held-out digits, estimated without bias from 50 stratified timesteps per image (``GaussianDiffusion.bits_per_dim``).
Called by ``lightvision quickstart`` and by ``lightvision diffusion train`` without a recipe (``key=value`` overrides
apply on top of :data:`DIGITS_OVERRIDES`, e.g. ``train.max_steps=200``). A finished run folder is reused: running
again only re-measures bits/dim.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

DIGITS_OVERRIDES = [
    "model.name=lightnet_dit_s_2",
    "model.args={depth: 4, hidden_size: 64, num_heads: 4, class_dropout_prob: 0.1}",
    "data.source=digits",
    "data.image_size=16",
    "data.channels=1",
    "data.num_classes=10",
    "data.num_workers=0",
    "autoencoder.kind=pixel",
    "autoencoder.path=null",
    "diffusion.clip_denoised=true",
    "optim.lr=2e-3",
    "sched.warmup_steps=100",
    "train.batch_size=64",
    "train.max_steps=1000",
    "train.ema_decay=0.995",
    "optim.clip_grad=1.0",
    "train.mixed_precision='no'",
    "train.log_every=100",
    "train.ckpt_every_steps=1000",
    "train.keep_last=1",
    "sample.every=1000",
    "sample.num=40",
    "sample.sampler=ddim",
    "sample.steps=50",
    "sample.cfg_scale=2.0",
    "sample.guide_channels=null",
]


def run_default(out_dir: str, device: str = "auto", overrides: Sequence[str] = (), resume: bool | str = True) -> dict:
    """Train, sample a grid and measure test bits/dim; returns (and writes ``out_dir/summary.json``) the results.

    Training runs on the accelerator's device (CUDA when visible); ``device`` "cpu" forces the CPU everywhere.
    ``overrides``: more ``key=value`` settings on top of :data:`DIGITS_OVERRIDES` (``run.dir`` is ``out_dir/run``
    unless one sets it). ``resume``: True continues (or reuses) the run folder's newest checkpoint; a path, that
    checkpoint or run folder.
    """
    from lightvision.diffusion.latents import build_dataset
    from lightvision.diffusion.train import check_recipe, evaluate_bits_per_dim, load_recipe, train
    from lightvision.engine.device import resolve_device

    device = resolve_device(device)
    out = Path(out_dir)
    cfg = load_recipe(None, [*DIGITS_OVERRIDES, f"run.dir={out / 'run'}", *overrides])
    check_recipe(cfg)
    cfg["sample"]["every"] = min(int(cfg["sample"]["every"]), int(cfg["train"]["max_steps"]))  # a grid at the end
    run_dir = Path(cfg["run"]["dir"])
    start = time.time()
    result = train(cfg, device=device, resume=resume)
    train_seconds = time.time() - start
    trainer = result.pop("trainer")
    model = trainer.ema.module.eval()
    start = time.time()
    bpd = evaluate_bits_per_dim(
        model, cfg, build_dataset(cfg["data"], "val"), trainer.accelerator.device, batch_size=360
    )["test_bits_per_dim"]
    summary = {
        "model": cfg["model"]["name"],
        "params": sum(p.numel() for p in model.parameters()),
        "steps": result["step"],
        "steps_run": result["steps_run"],
        "train_seconds": round(train_seconds, 1),
        "test_bits_per_dim": round(bpd, 4),
        "bpd_seconds": round(time.time() - start, 1),
        "device": str(trainer.accelerator.device),
        "sample_grid": str(run_dir / "samples" / f"step_{result['step']:07d}.png"),
        "last_train_record": result["last_record"],
    }
    out.mkdir(parents=True, exist_ok=True)  # a run.dir= override trains elsewhere: the job's folder may not exist
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    if result["steps_run"]:
        trained = f"{result['steps_run']} steps in {summary['train_seconds']} s"
    else:
        trained = f"reused the finished run in {run_dir} ({result['step']} steps trained earlier)"
    print(f"digits diffusion: {trained}, test {bpd:.3f} bits/dim, grid {summary['sample_grid']}")
    return summary
