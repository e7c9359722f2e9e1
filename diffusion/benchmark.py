"""CIFAR-10 pixel-space comparison of attention kinds at an equal number of steps (the GPU check).

    python -m lightvision.diffusion.benchmark --data /tmp/cifar --out $OUT --steps 1000 softmax lightnet lion_s

1. a small CIFAR-10 classifier trained with ``lightvision classify train`` (its feature space replaces Inception,
   which is not available offline);
2. per attention kind: the ``configs/diffusion/cifar10.yaml`` recipe with ``{kind}_dit_{size}_2`` (``--size``, default s;
   ``--set`` adds recipe overrides) for ``--steps`` steps,
   then test-set bits/dim (stratified VLB estimate on ``--bpd-images`` test images), ``--fid-samples`` DDPM samples
   (``--sample-steps`` respaced steps) and their FID against the test set in the classifier's feature space, and an
   EMA sample grid (100 samples, guidance 1.5, same steps). Evaluation uses the EMA weights of the recipe
   (decay 0.9999 with the engine's warm-up ``min(0.9999, (1 + s) / (10 + s))``: after s steps the EMA averages
   roughly the last s / 10 steps, so short runs are evaluated fairly);
3. ``diffusion_cifar10.json`` (results + env block) and ``grid_<kind>.png`` under ``--out``; runs, checkpoints and
   samples stay in ``--work``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

from lightvision.results import comparison_parser, comparison_report, run_each

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def train_classifier(data: str, work: Path, epochs: int) -> Path:
    """A tiny softmax DeiT (patch 4) on CIFAR-10 through ``lightvision classify train``; returns its run folder."""
    run = work / "classifier"
    cmd = [sys.executable, "-m", "lightvision", "classify", "train", "--config", str(CONFIGS / "classify" / "cifar10.yaml"),
           "--out", str(run), f"data.root={data}", "model.name=softmax_deit_tiny_patch16_224",
           "model.args={patch_size: 4}", f"sched.epochs={epochs}", "sched.warmup_epochs=1", "train.eval_every_epochs=100"]
    subprocess.run(cmd, check=True)
    return run


def run_kind(kind: str, args: argparse.Namespace, classifier: Path, reference: str) -> dict:
    """Train one attention kind and evaluate it; returns its results."""
    from lightvision.diffusion.fid import compute_fid
    from lightvision.diffusion.latents import build_dataset
    from lightvision.diffusion.sample import generate, to_uint8
    from lightvision.diffusion.train import build_codec, build_diffusion, evaluate_bits_per_dim, load_recipe, train

    out, work = Path(args.out), Path(args.work)
    cfg = load_recipe(CONFIGS / "diffusion" / "cifar10.yaml", [
        f"run_dir={work / 'runs' / kind}", f"model.name={kind}_dit_{args.size}_2", f"data.root={args.data}",
        f"data.batch_size={args.batch_size}", f"train.max_steps={args.steps}", f"train.ckpt_every={args.steps}",
        f"sample.every={args.steps}", "sample.num=100", f"sample.steps={args.sample_steps}", "optim.lr=3e-4", "optim.warmup_steps=100", *args.set])
    start = time.time()
    result = train(cfg)
    train_seconds = time.time() - start
    trainer = result.pop("trainer")
    model, device = trainer.ema.module.eval(), trainer.accelerator.device
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        start = time.time()
        test = torch.utils.data.Subset(build_dataset(cfg["data"], "test"), range(args.bpd_images))
        bpd = evaluate_bits_per_dim(model, cfg, test, device, num_workers=4)
        bpd_seconds = time.time() - start
        start = time.time()
        diffusion = build_diffusion(cfg).respace(args.sample_steps)
        codec = build_codec(cfg, device)
        folder = work / "samples" / kind
        folder.mkdir(parents=True, exist_ok=True)
        from PIL import Image

        for lo in range(0, args.fid_samples, args.sample_batch):
            idx = list(range(lo, min(lo + args.sample_batch, args.fid_samples)))
            images = generate(model, diffusion, codec, [i % 10 for i in idx], idx, latent_size=32, device=device)
            for i, arr in zip(idx, to_uint8(images)):
                Image.fromarray(arr).save(folder / f"{i:05d}.png")
        sample_seconds = time.time() - start
    fid = compute_fid(folder, reference, feature_extractor=str(classifier), cache_dir=work / "fid_cache", device=str(device),
                      batch_size=500)
    grid = Path(cfg["run_dir"]) / "samples" / f"step_{args.steps:07d}.png"
    grid_out = out / f"grid_{kind}.png"
    grid_out.write_bytes(grid.read_bytes())
    last = result["last_record"]
    return {"model": cfg["model"]["name"], "params": sum(p.numel() for p in model.parameters()), "steps": result["step"],
            "batch_size": args.batch_size, "train_seconds": round(train_seconds, 1),
            "train_steps_per_s": round(last.get("steps_per_s", float("nan")), 2), "final_loss": last.get("loss"),
            "test_bits_per_dim": round(bpd, 4), "bpd_images": args.bpd_images, "bpd_seconds": round(bpd_seconds, 1),
            "fid_classifier": round(fid["fid"], 3), "fid_samples": args.fid_samples, "sample_steps": args.sample_steps,
            "sample_seconds": round(sample_seconds, 1), "grid": grid_out.name}


def main(argv: list[str] | None = None) -> int:
    p = comparison_parser("diffusion", __doc__.splitlines()[0], "softmax lightnet lion_s",
                          "model.kwargs={depth: 12, adaln: block}")
    p.add_argument("--size", choices=("s", "b", "l", "xl"), default="s", help="DiT size (patch 2): {kind}_dit_{size}_2")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--classifier", help="a CIFAR-10 classifier run folder to measure FID with (default: train one)")
    p.add_argument("--classifier-epochs", type=int, default=4)
    p.add_argument("--bpd-images", type=int, default=2000)
    p.add_argument("--fid-samples", type=int, default=2000)
    p.add_argument("--sample-steps", type=int, default=100)
    p.add_argument("--sample-batch", type=int, default=500)
    args = p.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    out, report = comparison_report("diffusion", args, argv)
    start = time.time()
    classifier = Path(args.classifier) if args.classifier else train_classifier(args.data, Path(args.work), args.classifier_epochs)
    report["classifier_seconds"] = round(time.time() - start, 1)
    reference = str(Path(args.data) / "test")
    run_each(args.kinds, lambda kind: run_kind(kind, args, classifier, reference), report, out / "diffusion_cifar10.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
