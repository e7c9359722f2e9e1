"""CIFAR-10 pixel-space comparison of attention kinds and model variants at an equal number of steps (the GPU check).

    python -m lightvision.diffusion.benchmark --data /tmp/cifar --out $OUT --steps 4000 softmax lion_s lightnet \\
        normalized lightnet_paper --variants configs/variants/diffusion_cifar10.yaml

1. per name (an attention kind, or a variant of ``--variants``: an attention kind plus recipe overrides, e.g. an
   ablation of the LightNet block): the ``--recipe`` (default ``configs/diffusion/cifar10_benchmark.yaml``, the
   CIFAR-10 recipe at lr 3e-4 after 100 warm-up steps; ``configs/diffusion/cifar10_paper.yaml``: LightNet's optimiser)
   with ``{kind}_dit_{size}_2`` (``--size``, default s; ``--set`` adds overrides for every name) for ``--steps``
   steps; with ``--eval-every N`` the run also records every N steps FID, precision, recall of ``--samples`` EMA
   samples and test bits/dim (``eval.*`` of the recipe, :func:`lightvision.diffusion.train.eval_hook`), reported as
   ``curve``; then test-set bits/dim (stratified VLB estimate on ``--bpd-images`` test images spread evenly over the
   classes; ``--bpd-buckets M``: also split into M equal ranges of t), ``--samples`` DDPM samples (``--sample-steps``
   respaced steps, label i % classes, seed i), their streak share (``lightvision.diffusion.streaks``), and unless
   ``--no-fid`` FID, precision, recall and KID against the test set in the features of ``--feature-extractor``
   (default: the packaged CIFAR-10 yardstick, :mod:`lightvision.engine.yardstick_net`; Inception is not available
   offline), and an EMA sample grid (100 samples, guidance 1.5, same steps).
   Evaluation uses the EMA weights of the recipe (decay 0.9999 with the engine's warm-up
   ``min(0.9999, (1 + s) / (10 + s))``: after s steps the EMA averages roughly the last s / 10 steps, so short runs
   are evaluated fairly);
   With ``--sample-sizes`` the EMA model also samples at each of those image sizes in every position unit of
   ``--sample-units`` (``lightvision.layers.POS_UNITS``; 64 samples, guidance 1.5): a grid
   ``grid_<name>_<size>px_<unit>.png`` and the streak share of each;
2. ``diffusion_cifar10[_TAG].json`` (results, the streak share of ``--samples`` real test images, env block) and
   ``grid_<name>.png`` under ``--out`` (``--save-samples``: the samples too, ``samples_<name>.npz``, for metrics
   computed elsewhere); runs, checkpoints and the samples otherwise stay in ``--work``.

With ``--resume`` a name whose run folder holds checkpoints continues from the newest (a run stopped by SIGTERM
checkpoints and is reported as an error until it is resumed to the end).

Under ``accelerate launch`` with several processes every name trains data-parallel (``--batch-size`` is the global
batch, split over the processes); its final numbers are then those of the evaluation during training at the last
step (``--eval-every`` must divide ``--steps``), and the main process alone writes the report.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from accelerate import PartialState

from lightvision.cli import close_process_group
from lightvision.tools.results import comparison_parser, comparison_report, report_path, resolve_variant, run_each

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def streak_summary(shares: np.ndarray) -> dict:
    """Mean, standard error and median of per-image streak shares."""
    return {
        "mean": round(float(shares.mean()), 4),
        "sem": round(float(shares.std(ddof=1) / np.sqrt(len(shares))), 4),
        "median": round(float(np.median(shares)), 4),
        "images": int(len(shares)),
    }


def real_streak_share(data: str, count: int) -> dict:
    """Streak share of ``count`` test images (every class alike: sorted files, an even stride)."""
    from lightvision.diffusion.fid import image_files
    from lightvision.diffusion.streaks import folder_streak_share

    files = image_files(Path(data) / "test")
    return streak_summary(folder_streak_share(files[:: max(1, len(files) // count)], count))


def sample_sizes(model, diffusion, codec, name: str, args: argparse.Namespace, device: torch.device) -> list[dict]:
    """Samples of the trained model at each ``--sample-sizes`` image size in each ``--sample-units`` position unit:
    grids under ``--out`` and streak shares (module docstring)."""
    from lightvision.diffusion.sample import generate, save_grid, to_uint8
    from lightvision.diffusion.streaks import streak_share

    trained_unit, classes, rows = model.config.pos_unit, int(model.config["num_classes"]), []
    idx = list(range(64))
    try:
        for unit in args.sample_units:
            model.register_to_config(pos_unit=unit)
            for size in args.sample_sizes:
                images = generate(
                    model,
                    diffusion,
                    codec,
                    [i % classes for i in idx],
                    idx,
                    latent_size=codec.latent_size(size),
                    cfg_scale=1.5,
                    device=device,
                )
                grid = save_grid(images, Path(args.out) / f"grid_{name}_{size}px_{unit}.png", nrow=8)
                share = streak_summary(streak_share(to_uint8(images)))
                rows.append({"img_size": size, "pos_unit": unit, "streak_share": share, "grid": grid.name})
    finally:
        model.register_to_config(pos_unit=trained_unit)
    return rows


def eval_overrides(args: argparse.Namespace, reference: str) -> list[str]:
    """Recipe overrides of ``--eval-every``: FID / precision / recall of ``--samples`` EMA samples in the
    ``--feature-extractor`` space and bits/dim of ``--bpd-images`` test images every N steps (none without it)."""
    if not args.eval_every:
        return []
    return [
        f"train.eval_every_steps={args.eval_every}",
        f"train.eval_samples={args.samples}",
        f"eval.reference={reference}",
        f"eval.feature_extractor={args.feature_extractor}",
        f"eval.cache_dir={Path(args.work) / 'fid_cache'}",
        f"eval.steps={args.sample_steps}",
        f"eval.batch_size={args.sample_batch}",
        f"eval.bpd_images={args.bpd_images}",
        f"eval.bpd_buckets={args.bpd_buckets}",
    ]


CURVE_KEYS = ("fid", "precision", "recall", "test_bits_per_dim", "test_bits_per_dim_t", "feature_space")


def eval_curve(run: str | Path) -> list[dict]:
    """Every evaluation during training of a run (its ``metrics.jsonl`` records with FID), by step: {"step", and
    those of ``CURVE_KEYS`` it has}."""
    from lightvision.engine import MetricsLogger

    seen = {r["step"]: r for r in MetricsLogger(run).records() if "fid" in r}
    return [{"step": step, **{k: seen[step][k] for k in CURVE_KEYS if k in seen[step]}} for step in sorted(seen)]


def run_record(
    cfg: dict,
    args: argparse.Namespace,
    name: str,
    variant_set: list[str],
    model: torch.nn.Module,
    result: dict,
    seconds: float,
) -> dict:
    """What every run reports: model, parameters, steps, batch, training time and rate, final loss, optimiser, the
    evaluations during training (``curve``) and its EMA sample grid (copied to ``--out`` as ``grid_<name>.png``)."""
    grid_out = Path(args.out) / f"grid_{name}.png"
    grid_out.write_bytes((Path(cfg["run"]["dir"]) / "samples" / f"step_{args.steps:07d}.png").read_bytes())
    last = result["last_record"]
    record = {
        "model": cfg["model"]["name"],
        "variant_set": variant_set,
        "model_config": {k: v for k, v in model.config.items() if not k.startswith("_")},
        "params": sum(p.numel() for p in model.parameters()),
        "steps": result["step"],
        "batch_size": args.batch_size,
        "train_seconds": round(seconds, 1),
        "train_steps_per_s": round(last.get("steps_per_s", float("nan")), 2),
        "final_loss": last.get("loss"),
        "recipe": {k: cfg[k] for k in ("optim", "sched")},
        "grid": grid_out.name,
    }
    curve = eval_curve(cfg["run"]["dir"])
    return {**record, "curve": curve} if curve else record


def last_evaluation(curve: list[dict], keys: tuple[str, ...]) -> dict:
    """``keys`` of the curve's last evaluation (rounded) and its feature space."""
    return {**{k: round(curve[-1][k], 4) for k in keys if k in curve[-1]}, "feature_space": curve[-1]["feature_space"]}


def run_kind(name: str, args: argparse.Namespace, reference: str) -> dict:
    """Train one attention kind or variant and evaluate it; returns its results."""
    from lightvision.diffusion.dit import ATTENTION_KINDS
    from lightvision.diffusion.fid import compute_fid
    from lightvision.diffusion.latents import build_dataset
    from lightvision.diffusion.sample import generate, to_uint8
    from lightvision.diffusion.streaks import streak_share
    from lightvision.diffusion.train import build_codec, build_diffusion, evaluate_bits_per_dim, load_recipe, train

    kind, variant_set = resolve_variant(name, args.variants, ATTENTION_KINDS)
    out, work = Path(args.out), Path(args.work)
    world = PartialState().num_processes
    cfg = load_recipe(
        args.recipe,
        [
            f"run.dir={work / 'runs' / name}",
            f"model.name={kind}_dit_{args.size}_2",
            f"data.root={args.data}",
            f"train.batch_size={args.batch_size // world}",
            f"train.max_steps={args.steps}",
            f"train.ckpt_every_steps={args.steps}",
            f"sample.every={args.steps}",
            "sample.num=100",
            f"sample.steps={args.sample_steps}",
            *eval_overrides(args, reference),
            *variant_set,
            *args.set,
        ],
    )
    start = time.time()
    result = train(cfg, resume=args.resume)
    train_seconds = time.time() - start
    if result["interrupted"]:
        raise RuntimeError(f"stopped by SIGTERM at step {result['step']}; run again with --resume to finish")
    trainer = result.pop("trainer")
    if world > 1:  # data parallel: the evaluation during training at the last step gives the final numbers
        if not trainer.accelerator.is_main_process:
            return {}
        record = run_record(cfg, args, name, variant_set, trainer.ema.module, result, train_seconds)
        last = record["curve"][-1]
        return {
            **record,
            **last_evaluation(record["curve"], ("fid", "precision", "recall", "test_bits_per_dim")),
            **({"test_bits_per_dim_t": last["test_bits_per_dim_t"]} if "test_bits_per_dim_t" in last else {}),
            "processes": world,
        }
    model, device = trainer.ema.module.eval(), trainer.accelerator.device
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        start = time.time()
        test = build_dataset(cfg["data"], "val")
        bpd = evaluate_bits_per_dim(
            model, cfg, test, device, images=args.bpd_images, buckets=args.bpd_buckets, num_workers=4
        )
        bpd_seconds = time.time() - start
        start = time.time()
        diffusion = build_diffusion(cfg).respace(args.sample_steps)
        codec = build_codec(cfg, device)
        classes = int(model.config["num_classes"])
        batches = []
        for lo in range(0, args.samples, args.sample_batch):
            idx = list(range(lo, min(lo + args.sample_batch, args.samples)))
            images = to_uint8(
                generate(model, diffusion, codec, [i % classes for i in idx], idx, latent_size=32, device=device)
            )
            batches.append(images)
        samples = np.concatenate(batches)
        batch_file = (out if args.save_samples else work / "samples") / f"samples_{name}.npz"
        batch_file.parent.mkdir(parents=True, exist_ok=True)
        np.savez(batch_file, arr_0=samples)  # the ADM batch layout: uint8 [N, H, W, 3] as arr_0
        sample_seconds = time.time() - start
    record = run_record(cfg, args, name, variant_set, model, result, train_seconds)
    curve = record.get("curve")
    if curve and curve[-1]["step"] == result["step"]:  # the last evaluation scored the final weights already
        record.update(last_evaluation(curve, ("fid", "precision", "recall")))
    elif not args.no_fid:
        try:  # the run's other numbers stand without them
            fid = compute_fid(
                batch_file,
                reference,
                feature_extractor=args.feature_extractor,
                cache_dir=work / "fid_cache",
                device=str(device),
                batch_size=500,
                num_samples=None,
            )
            record.update({k: round(fid[k], 4) for k in ("fid", "precision", "recall", "kid") if k in fid})
            record["feature_space"] = fid["feature_space"]
        except (RuntimeError, ValueError, OSError) as err:
            record["fid_error"] = f"{type(err).__name__}: {err}"
    if args.sample_sizes:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            record["sizes"] = sample_sizes(model, diffusion, codec, name, args, device)
    return {
        **record,
        "test_bits_per_dim": round(bpd["test_bits_per_dim"], 4),
        **({"test_bits_per_dim_t": bpd["test_bits_per_dim_t"]} if args.bpd_buckets else {}),
        "bpd_images": bpd["bpd_images"],
        "bpd_seconds": round(bpd_seconds, 1),
        "streak_share": streak_summary(streak_share(samples)),
        "samples": args.samples,
        "sample_steps": args.sample_steps,
        "sample_seconds": round(sample_seconds, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = comparison_parser(
        "diffusion",
        __doc__.splitlines()[0],
        "softmax lightnet lion_s normalized",
        "model.args={depth: 12, adaln: block}",
    )
    p.add_argument("--size", choices=("s", "b", "l", "xl"), default="s", help="DiT size (patch 2): {kind}_dit_{size}_2")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument(
        "--batch-size", type=int, default=128, help="global batch (split over the processes of a data-parallel launch)"
    )
    p.add_argument(
        "--feature-extractor",
        default="yardstick",
        help="feature network of FID / precision / recall: 'yardstick' (the packaged CIFAR-10 yardstick), "
        "a yardstick .safetensors file or a classifier run folder",
    )
    p.add_argument("--no-fid", action="store_true", help="skip FID, precision and recall (bits/dim and streaks only)")
    p.add_argument("--bpd-images", type=int, default=2000)
    p.add_argument("--bpd-buckets", type=int, default=0, help="also split test bits/dim into M equal ranges of t")
    p.add_argument(
        "--recipe",
        default=str(CONFIGS / "diffusion" / "cifar10_benchmark.yaml"),
        help="the recipe every name starts from, e.g. configs/diffusion/cifar10_paper.yaml (LightNet's optimiser)",
    )
    p.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help="FID, precision, recall (--samples samples) and test bits/dim (--bpd-images) every N training steps",
    )
    p.add_argument("--resume", action="store_true", help="continue each run from the newest checkpoint of its folder")
    p.add_argument("--samples", type=int, default=2000, help="samples for FID and the streak share")
    p.add_argument("--sample-steps", type=int, default=100)
    p.add_argument("--sample-batch", type=int, default=500)
    p.add_argument("--save-samples", action="store_true", help="also write samples_<name>.npz (ADM layout) to --out")
    p.add_argument("--sample-sizes", type=int, nargs="*", default=[], help="image sizes to sample at after training")
    p.add_argument("--sample-units", nargs="+", default=["image"], help="position units of --sample-sizes")
    args = p.parse_args(argv)
    if not Path(args.recipe).is_file():
        p.error(f"--recipe {args.recipe}: no such file (e.g. configs/diffusion/cifar10_paper.yaml)")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    state = PartialState(cpu=not torch.cuda.is_available())  # cpu: several CPU processes join one gloo group
    if state.num_processes > 1 and (not args.eval_every or args.steps % args.eval_every):
        p.error(
            f"{state.num_processes} processes take the final numbers from the evaluation during training: give "
            f"--eval-every dividing --steps {args.steps}"
        )
    if args.batch_size % state.num_processes:
        p.error(f"--batch-size {args.batch_size} does not split over {state.num_processes} processes")
    reference = str(Path(args.data) / "test")
    if state.is_main_process:
        out, report = comparison_report("diffusion", args, argv)
        report["real_streak_share"] = real_streak_share(args.data, args.samples)
        run_each(args.kinds, lambda name: run_kind(name, args, reference), report, report_path("diffusion", args))
    else:  # a data-parallel launch: the other processes train beside the main one
        for name in args.kinds:
            run_kind(name, args, reference)
    if state.num_processes > 1:
        state.wait_for_everyone()
        close_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
