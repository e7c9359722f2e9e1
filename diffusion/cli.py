"""``lightvision diffusion``: train | sample | fid | fid-ref | extract-latents | attention-maps (heavy imports inside
the handlers)."""

from __future__ import annotations

import argparse
import json

from lightvision.cli import add_train_options, resume_setting


def _train(args: argparse.Namespace) -> int:
    if args.config is None:
        from lightvision.diffusion.default import run_default

        resume = args.resume_from or True  # the built-in job always continues (or reuses) its run folder
        run_default(args.out or "runs/diffusion_default", args.device, overrides=args.overrides, resume=resume)
        return 0
    from lightvision.diffusion.train import load_recipe, train

    cfg = load_recipe(args.config, [*args.overrides, *([f"run.dir={args.out}"] if args.out else [])])
    result = train(cfg, device=args.device, resume=resume_setting(args))
    result.pop("trainer")
    print(json.dumps(result, indent=2, default=str))
    return 0


def _sample(args: argparse.Namespace) -> int:
    from lightvision.diffusion.sample import sample_main

    guide = None if args.guide_channels == "all" else int(args.guide_channels)
    summary = sample_main(
        args.checkpoint,
        args.out,
        num_samples=args.num_samples,
        batch_size=args.batch_size,
        sampler=args.sampler,
        steps=args.steps,
        eta=args.eta,
        cfg_scale=args.cfg_scale,
        guide_channels=guide,
        seed=args.seed,
        image_size=args.image_size,
        which=args.weights,
        vae=args.vae,
        pretrained=args.pretrained,
        model_name=args.model,
        recipe=args.config,
    )
    print(json.dumps(summary, indent=2))
    return 0


def _print_json(result: dict, out: str | None = None) -> None:
    print(json.dumps(result, indent=2))
    if out:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)


def _fid(args: argparse.Namespace) -> int:
    from lightvision.diffusion.fid import compute_fid

    metrics = compute_fid(
        args.samples,
        args.reference,
        inception_weights=args.inception_weights,
        feature_extractor=args.feature_extractor,
        cache_dir=args.cache_dir,
        device=args.device,
        batch_size=args.batch_size,
        num_samples=None if args.num_samples == 0 else args.num_samples,
    )
    _print_json(metrics, args.out)
    return 0


def _fid_ref(args: argparse.Namespace) -> int:
    from lightvision.diffusion.fid import write_reference

    summary = write_reference(
        args.images,
        args.out,
        inception_weights=args.inception_weights,
        feature_extractor=args.feature_extractor,
        device=args.device,
        batch_size=args.batch_size,
    )
    _print_json(summary)
    return 0


def _feature_network_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--inception-weights", help="torch-fidelity Inception weights file (default: torch's hub cache)")
    p.add_argument(
        "--feature-extractor",
        help="yardstick .safetensors, 'yardstick' (the packaged CIFAR-10 one) or a "
        "`lightvision classify` run: its feature space instead of Inception (default for 32 px images "
        "without Inception weights: the packaged yardstick)",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch-size", type=int, default=64)


def _extract(args: argparse.Namespace) -> int:
    from lightvision.diffusion.autoencoder import load_codec
    from lightvision.diffusion.latents import extract_latents
    from lightvision.engine.device import resolve_device

    codec = load_codec(args.vae_kind, args.vae, device=resolve_device(args.device))
    meta = extract_latents(
        args.images,
        args.out,
        codec,
        args.image_size,
        batch_size=args.batch_size,
        shard_size=args.shard_size,
        num_workers=args.num_workers,
    )
    print(json.dumps({k: v for k, v in meta.items() if k != "classes"}, indent=2))
    return 0


def _attention_maps(args: argparse.Namespace) -> int:
    from lightvision.diffusion.attention_maps import attention_maps_main
    from lightvision.tools.attention_figures import parse_query

    report = attention_maps_main(
        args.checkpoint,
        args.image,
        args.timestep,
        args.label,
        args.out,
        parse_query(args.query),
        args.weights,
        args.seed,
    )
    print(json.dumps({k: v for k, v in report.items() if k != "timesteps"} | {"out": args.out}, indent=2))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``diffusion`` command group to the top-level parser."""
    group = subparsers.add_parser(
        "diffusion", help="DiT latent / pixel diffusion: train, sample, fid, fid-ref, extract-latents, attention-maps"
    )
    sub = group.add_subparsers(dest="diffusion_command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "train",
        help="train a recipe (no --config: the built-in digits default)",
        description="Train a YAML recipe plus key=value overrides. Without --config, trains the "
        "built-in pixel-space digits default (overrides apply on top of it, e.g. train.max_steps=200).",
    )
    p.add_argument("--config", help="YAML recipe, e.g. configs/diffusion/imagenet256_xl.yaml")
    add_train_options(
        p,
        "with --config: the run folder, as run.dir=DIR (default: run.dir of the recipe); without: the built-in "
        "job's folder (summary.json, its run in DIR/run; default: runs/diffusion_default)",
    )
    p.set_defaults(func=_train)

    p = sub.add_parser(
        "sample", help="sample PNGs, a grid and an .npz from a checkpoint (all GPUs under accelerate launch)"
    )
    p.add_argument("checkpoint", nargs="?", help="run folder or checkpoint folder (or --pretrained)")
    p.add_argument(
        "--pretrained",
        help="external weights instead: the official DiT-XL-2-256x256.pt, a diffusers "
        "DiT (folder or file) or this project's .safetensors; needs --model",
    )
    p.add_argument("--model", help="with --pretrained: the registered model the file holds, e.g. softmax_dit_xl_2")
    p.add_argument(
        "--config",
        help="with --pretrained: recipe for the autoencoder and schedule "
        "(default: the ImageNet-256 one, sd-vae-ft-ema)",
    )
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--num-samples", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--sampler", choices=("ddpm", "ddim"), default="ddpm")
    p.add_argument("--steps", type=int, default=250, help="respaced sampling steps")
    p.add_argument("--eta", type=float, default=0.0, help="DDIM eta")
    p.add_argument("--cfg-scale", type=float, default=1.0, help="classifier-free guidance scale (1 = none)")
    p.add_argument("--guide-channels", default="3", help="'3' (DiT convention) or 'all'")
    p.add_argument("--seed", type=int, default=0, help="sample i uses seed + i")
    p.add_argument("--image-size", type=int, help="image size (default: the training size)")
    p.add_argument("--weights", choices=("ema", "model"), default="ema")
    p.add_argument("--vae", help="autoencoder folder / hub id overriding the run's")
    p.set_defaults(func=_sample)

    p = sub.add_parser(
        "fid",
        help="FID, sFID, IS, precision / recall, KID of samples against a reference (ADM conventions)",
        description="Score samples against a reference with the ADM evaluator's conventions (docs/evaluation.md): "
        "FID (pool features), sFID (spatial features), IS (Inception logits, splits of 5000), precision and recall "
        "(k = 3) and KID, in the feature space of Inception-v3 or of --feature-extractor. Prints one JSON object "
        "(--out writes it too): fid, sfid, isc, precision, recall, kid, kid_std (those the feature network and "
        "the reference allow: no isc outside Inception, no sfid without spatial features, no precision / recall / "
        "kid against a plain mu / sigma file), feature_space (network and weights hash), num_samples and "
        "num_reference.",
    )
    p.add_argument("samples", help="folder of sample images or an .npz batch (arr_0: uint8 [N, H, W, 3])")
    p.add_argument(
        "--reference",
        required=True,
        help="folder of reference images, an .npz batch, or statistics from `lightvision diffusion fid-ref`",
    )
    p.add_argument("--num-samples", type=int, default=50_000, help="evaluate the first N samples (0: all)")
    p.add_argument("--cache-dir", help="reference statistics cache (default: $XDG_CACHE_HOME/lightvision/fid)")
    _feature_network_args(p)
    p.add_argument("--out", help="write the metrics JSON here too")
    p.set_defaults(func=_fid)

    p = sub.add_parser(
        "fid-ref", help="compute a reference's statistics once (mu / sigma, spatial, features) into an .npz"
    )
    p.add_argument("images", help="folder of reference images or an .npz batch (arr_0: uint8 [N, H, W, 3])")
    p.add_argument("--out", required=True, help="statistics file to write (.npz), then `fid --reference` it")
    _feature_network_args(p)
    p.set_defaults(func=_fid_ref)

    p = sub.add_parser("extract-latents", help="cache autoencoder latent moments (+ flips) of an ImageFolder")
    p.add_argument("--images", required=True, help="ImageFolder root (class sub-folders)")
    p.add_argument("--out", required=True, help="output folder (shards + meta.json)")
    p.add_argument("--image-size", type=int, default=256)
    p.add_argument("--vae", default="stabilityai/sd-vae-ft-ema", help="diffusers autoencoder folder or hub id")
    p.add_argument("--vae-kind", choices=("kl", "tiny"), default="kl")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--shard-size", type=int, default=8192)
    p.add_argument("--num-workers", type=int, default=4)
    p.add_argument("--device", default="auto", help="auto (cuda when available) | cpu | cuda")
    p.set_defaults(func=_extract)

    p = sub.add_parser(
        "attention-maps",
        help="a query patch's attention over the grid, per layer and head, and the "
        "mean attention distance, of a DiT on a noised image at chosen timesteps",
    )
    p.add_argument("--checkpoint", required=True, help="run folder (its latest checkpoint) or a checkpoint folder")
    p.add_argument("--image", required=True, help="an image file (resized to the run's image size)")
    p.add_argument(
        "--timestep",
        type=int,
        nargs="+",
        required=True,
        help="diffusion steps t of the run's schedule, e.g. 100 500 900",
    )
    p.add_argument("--label", type=int, help="class label y (default: the null class, unconditional)")
    p.add_argument("--query", help="ROW,COL of the query patch on the token grid (default: the centre)")
    p.add_argument("--seed", type=int, default=0, help="seed of the noise (the same at every timestep)")
    p.add_argument("--weights", choices=("ema", "model"), default="ema")
    p.add_argument("--out", required=True, help="folder for the figures and attention_maps.json")
    p.set_defaults(func=_attention_maps)
