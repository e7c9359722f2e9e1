"""``lightvision classify``: ``train`` (a recipe, or the built-in digits default), ``eval`` (many resolutions) and
``train-yardstick`` (the CIFAR-10 feature network of FID, :mod:`lightvision.classify.yardstick`).

    lightvision classify train                                    # digits default, no download
    lightvision classify train --config configs/classify/deit_imagenet.yaml data.root=/imagenet \
        model.name=lightnet_deit_small_patch16_224
    lightvision classify eval --checkpoint runs/classify --data /imagenet/val --img-size 224 288 384 512
    lightvision classify train-yardstick --data data/cifar10 --out runs/yardstick
    lightvision classify attention-maps --checkpoint runs/cifar10_deit --image cat.png --img-size 32 64 --out maps
    lightvision classify make-shards --data /imagenet --out /imagenet-shards --split train --shard-size 1000
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from lightvision.cli import add_train_options, resume_setting

SHOWN_SKIPS = 5  # unreadable files named on stderr by make-shards (the index lists all)


def _train(args: argparse.Namespace) -> int:
    overrides = [*args.overrides, *([f"run.dir={args.out}"] if args.out else [])]  # --out wins over run.dir=
    if args.config is None:
        from lightvision.classify.default import run_default

        resume = args.resume_from or True  # the built-in job always continues (or reuses) its run folder
        result = run_default("runs/classify_default", device=args.device, overrides=overrides, resume=resume)
    else:
        from lightvision.classify.train import load_recipe, train

        logging.basicConfig(level=logging.INFO, format="%(message)s")
        result = train(load_recipe(args.config, overrides), device=args.device, resume=resume_setting(args))
    print(json.dumps(result, indent=2))
    return 0


def _train_yardstick(args: argparse.Namespace) -> int:
    from lightvision.classify.yardstick import load_yardstick_config, train_yardstick

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cfg = load_yardstick_config([f"data.root={args.data}", f"run.dir={args.out}", *args.overrides])
    result = train_yardstick(cfg, device=args.device, resume=args.resume)
    print(json.dumps(result, indent=2))
    return 0


def _eval(args: argparse.Namespace) -> int:
    from lightvision.classify.evaluate import evaluate_checkpoint

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.run and args.checkpoint and args.run != args.checkpoint:
        raise ValueError(f"classify eval: two runs given ({args.run} and --checkpoint {args.checkpoint}): give one")
    args.checkpoint = args.checkpoint or args.run
    if args.pretrained:
        report = _eval_pretrained(args)
    else:
        if not args.checkpoint:
            raise ValueError("classify eval: give a RUN folder, or --pretrained FILE --model NAME")
        report = evaluate_checkpoint(
            args.checkpoint,
            args.img_size,
            data=args.data,
            out_dir=args.out,
            weights=args.weights,
            batch_size=args.batch_size,
            num_workers=args.num_workers,
            device=args.device,
            model_args={"pos_unit": args.pos_unit} if args.pos_unit else None,
        )
    if report["paths"]:
        print(open(report["paths"]["markdown"]).read())
        print(f"wrote {', '.join(report['paths'].values())}")
    return 0


def _eval_pretrained(args: argparse.Namespace) -> dict:
    """``eval --pretrained FILE --model NAME``: external weights, converted (``lightvision.classify.convert``)."""
    from lightvision.classify.evaluate import evaluate_pretrained

    if args.checkpoint:
        raise ValueError("classify eval: give --checkpoint or --pretrained, not both")
    if not (args.model and args.data and args.out):
        raise ValueError("classify eval: --pretrained needs --model NAME, --data VAL_FOLDER and --out DIR")
    return evaluate_pretrained(
        args.pretrained,
        args.model,
        args.img_size,
        args.data,
        args.out,
        weights=args.weights,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        device=args.device,
        recipe=args.config,
        model_args={
            **({"global_pool": args.global_pool} if args.global_pool is not None else {}),
            **({"pos_unit": args.pos_unit} if args.pos_unit else {}),
        }
        or None,
    )


def _attention_maps(args: argparse.Namespace) -> int:
    from lightvision.classify.attention_maps import attention_maps_main
    from lightvision.tools.attention_figures import parse_query

    report = attention_maps_main(
        args.checkpoint, args.image, args.img_size, args.out, parse_query(args.query), args.weights, args.layers
    )
    if "runs" in report:
        report = {"runs": list(report["runs"]), "layers": report["layers"], "comparison": report["comparison"]}
    print(json.dumps({k: v for k, v in report.items() if k != "sizes"} | {"out": args.out}, indent=2))
    return 0


def _make_shards(args: argparse.Namespace) -> int:
    from lightvision.classify.data import image_folder
    from lightvision.classify.shards import make_shards

    folder = image_folder(args.data, args.split, None)
    index = make_shards(folder, args.out, args.split, args.shard_size, args.seed, args.max_size, args.workers)
    if index["skipped"]:
        shown = "; ".join(f"{name} ({why})" for name, why in index["skipped"][:SHOWN_SKIPS])
        more = f"; and {len(index['skipped']) - SHOWN_SKIPS} more" if len(index["skipped"]) > SHOWN_SKIPS else ""
        print(
            f"make-shards: left out {len(index['skipped'])} unreadable image(s) of {args.split} (all listed under "
            f'"skipped" in {args.out}/{args.split}.json): {shown}{more}',
            file=sys.stderr,
        )
    print(
        json.dumps(
            {k: index[k] for k in ("split", "count")}
            | {"skipped": len(index["skipped"]), "classes": len(index["classes"]), "shards": len(index["shards"])}
            | {"resized": index["resized"]}
            | {"out": args.out}
        )
    )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``classify`` command group (``train``, ``eval``) to the top-level parser."""
    group = subparsers.add_parser("classify", help="DeiT-family image classifiers: train, evaluate at many resolutions")
    sub = group.add_subparsers(dest="classify_command", required=True, metavar="COMMAND")

    train = sub.add_parser(
        "train",
        help="train a classifier (without --config: the built-in digits default, no download)",
        description="Train with a YAML recipe plus key=value overrides (e.g. data.root=/imagenet "
        "model.name=lightnet_deit_small_patch16_224 train.batch_size=64). Without --config, trains the "
        "built-in LightNet digits default (overrides apply on top of it) and evaluates it at 16 and 24 px.",
    )
    train.add_argument("--config", help="recipe YAML, e.g. configs/classify/deit_imagenet.yaml")
    add_train_options(
        train, "run folder, as run.dir=DIR (default: run.dir of the recipe; runs/classify_default without --config)"
    )
    train.set_defaults(func=_train)

    ys = sub.add_parser(
        "train-yardstick",
        help="train the CIFAR-10 yardstick (a small ResNet; the offline feature network of CIFAR-10 FID)",
        description="Decode the images once into memory, train a ResNet-9-style net with on-device flip + crop "
        "augmentation, and write DIR/yardstick.safetensors (float16, < 20 MB) for `lightvision diffusion fid "
        "--feature-extractor`.",
    )
    ys.add_argument(
        "--data", required=True, help="train/ and test/ class folders, or the cifar10-*-jpg.tar.gz archives"
    )
    ys.add_argument("--out", required=True, help="run folder (checkpoints, metrics.jsonl, yardstick.safetensors)")
    ys.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="default: cuda if available")
    ys.add_argument("--resume", action="store_true", help="continue from the newest checkpoint of the run folder")
    ys.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="e.g. train.epochs=20 optim.lr=0.2")
    ys.set_defaults(func=_train_yardstick)

    ev = sub.add_parser("eval", help="top-1/top-5, images/s and peak GPU memory at several resolutions")
    ev.add_argument("run", nargs="?", help="run folder (its latest checkpoint) or a checkpoint folder")
    ev.add_argument("--checkpoint", help="the same as RUN")
    ev.add_argument(
        "--pretrained",
        help="external weights instead of --checkpoint: timm / DeiT authors' .pth, the "
        "LION authors' classifiers, a .safetensors or a Hub-style folder; needs --model, --data, --out",
    )
    ev.add_argument("--model", help="with --pretrained: the registered model, e.g. softmax_deit_tiny_patch16_224")
    ev.add_argument("--config", help="with --pretrained: recipe of the validation transform (default: DeiT ImageNet)")
    ev.add_argument(
        "--global-pool",
        choices=["token", "avg", "avg_all"],
        help="with --pretrained: the head's pooling (default: the model's, LION authors' layout: avg_all)",
    )
    ev.add_argument(
        "--pos-unit",
        choices=["image", "token"],
        help="what positions count at other sizes: cells of the training grid (image) or patches of the grid at hand "
        "(token); default: the unit the checkpoint records (image when it records none)",
    )
    ev.add_argument(
        "--data",
        help="validation folder (class sub-folders, or a root with the val split); "
        "default: the run's own validation data",
    )
    ev.add_argument("--img-size", type=int, nargs="+", required=True, help="resolutions, e.g. 224 288 384 512")
    ev.add_argument("--weights", choices=["ema", "model"], help="default: EMA when the run (or file) kept one")
    ev.add_argument("--batch-size", type=int, default=128)
    ev.add_argument("--num-workers", type=int, default=4)
    ev.add_argument("--out", help="folder for eval.md / eval.json / eval.png (default: <run>/eval)")
    ev.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="default: cuda if available")
    ev.set_defaults(func=_eval)

    am = sub.add_parser(
        "attention-maps",
        help="a query patch's attention over the grid, per layer and head, and the "
        "mean attention distance, at several resolutions",
    )
    am.add_argument(
        "--checkpoint",
        required=True,
        nargs="+",
        help="run folder (its latest checkpoint) or a checkpoint folder; several: side by side in comparison.png",
    )
    am.add_argument("--image", required=True, help="an image file")
    am.add_argument("--img-size", type=int, nargs="+", required=True, help="resolutions, e.g. 32 64")
    am.add_argument("--query", help="ROW,COL of the query patch on the training-size grid (default: the centre)")
    am.add_argument("--weights", choices=["ema", "model"], help="default: EMA when the run kept one")
    am.add_argument(
        "--layers",
        type=int,
        nargs="+",
        help="layers in comparison.png (several checkpoints; default: first, middle, last)",
    )
    am.add_argument("--out", required=True, help="folder for the figures and attention_maps.json")
    am.set_defaults(func=_attention_maps)

    ms = sub.add_parser(
        "make-shards",
        help="write an ImageFolder split as webdataset tar shards (data.format=shards)",
        description="Pack DATA/SPLIT/<class>/<image files> into OUT/SPLIT-000000.tar ... (the file "
        "bytes and the class index per sample) plus OUT/SPLIT.json; the train split is shuffled.",
    )
    ms.add_argument("--data", required=True, help="ImageFolder root holding the split folder")
    ms.add_argument("--out", required=True, help="shard folder (data.root of a data.format=shards recipe)")
    ms.add_argument("--split", default="train", help="split folder to pack (default: train)")
    ms.add_argument("--shard-size", type=int, default=1000, help="images per shard (default: 1000)")
    ms.add_argument("--seed", type=int, default=0, help="seed of the train split's shuffled order")
    ms.add_argument(
        "--max-size",
        type=int,
        default=None,
        metavar="N",
        help="store images whose shorter side passes N pixels shrunk to N (JPEG, quality 90; default: as they are)",
    )
    ms.add_argument("--workers", type=int, default=1, help="processes that check and shrink the files (default: 1)")
    ms.set_defaults(func=_make_shards)
