"""CIFAR-10 comparison of attention kinds with one recipe and epoch count (the GPU check of the classifiers).

    python -m lightvision.classify.benchmark --data /tmp/cifar --out $OUT --epochs 5 --warmup-epochs 1 \\
        softmax lightnet lion_d lion_s lion_s_snake normalized

Per attention kind (or a variant of ``--variants``: a kind plus recipe overrides): ``{kind}_deit_tiny_patch16_224``
(tiny width and depth, patch 4: an 8 x 8 grid + cls at 32 px)
trained with ``configs/classify/cifar10.yaml`` (its 200 epochs with 5 of linear warm-up unless ``--epochs`` /
``--warmup-epochs`` say otherwise; ``--set`` changes any other key), then evaluated on the test split at every
``--img-size`` (the models see 48 and 64 px images without any change to their weights) in every position setting of
``--eval-pos`` (the same weights run with another position unit or LION decay power, :func:`pos_setting`). Writes
``classify_cifar10[_TAG].json`` (the recipe as resolved, per kind: parameters, top-1 / top-5 per size, train seconds,
images/s, the mean training loss of every epoch, test top-1 after every tenth of the epochs) under ``--out`` and
prints a table last; runs stay in ``--work``.
With ``--resume`` a name whose run folder holds checkpoints continues from the newest (a run stopped by SIGTERM
checkpoints and is reported as an error until it is resumed to the end). Exits with 1 when a name failed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from lightvision.tools.results import comparison_parser, comparison_report, report_path, resolve_variant, run_each

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "classify" / "cifar10.yaml"


def loss_per_epoch(run: str | Path) -> list[float]:
    """Mean training loss of each epoch (0, 1, ...) of a run, from the logged windows of its ``metrics.jsonl``."""
    from lightvision.engine import MetricsLogger

    sums: dict[int, list[float]] = {}
    for record in MetricsLogger(run).records():
        if "loss" in record and "steps_per_s" in record:
            sums.setdefault(int(record["epoch"]), []).append(record["loss"])
    return [round(sum(v) / len(v), 4) for _, v in sorted(sums.items())]


def top1_per_eval(run: str | Path, steps_per_epoch: float) -> list[list[float]]:
    """[epoch, test top-1] of every evaluation of a run (``val_top1`` records of its ``metrics.jsonl``), in order."""
    from lightvision.engine import MetricsLogger

    seen = {r["step"]: r["val_top1"] for r in MetricsLogger(run).records() if "val_top1" in r}
    return [[round(step / steps_per_epoch, 2), round(top1, 2)] for step, top1 in sorted(seen.items())]


def pos_setting(text: str, kind: str) -> dict | None:
    """``load_classifier``'s model_args of an ``--eval-pos`` setting for an attention kind: a position unit, "image"
    or "token", then optional ``:KEY=VALUE`` parts: ``p=P`` LION's decay power ("P,Q": the row and column snake
    orders), ``embed=UNIT`` / ``blocks=UNIT`` that signal group in another unit (``POS_SIGNALS``; e.g.
    "image:embed=token" keeps the absolute embedding in token units). None when the setting does not apply to the
    kind (a decay power without LION decays, a pair without snake orders).

    Example:
        >>> pos_setting("image:embed=token", "lightnet")
        {'pos_unit': {'embed': 'token', 'blocks': 'image'}}
    """
    from lightvision.layers import POS_SIGNALS, POS_UNITS, position_options

    unit, *parts = text.split(":")
    options = dict(part.partition("=")[::2] for part in parts)
    units = {signal: options.get(signal, unit) for signal in POS_SIGNALS}
    if {unit, *units.values()} - set(POS_UNITS) or set(options) - {"p", *POS_SIGNALS} or not all(options.values()):
        raise ValueError(
            f"--eval-pos {text!r}: write a unit ('image' or 'token'), then optionally ':p=POWER' and "
            f"':embed=UNIT' / ':blocks=UNIT'"
        )
    args = {"pos_unit": unit if len(set(units.values())) == 1 else units}
    if "p" not in options:
        return args
    if "decay_power" not in position_options(kind):
        return None
    powers = [float(v) for v in options["p"].split(",")]
    if len(powers) > 1 and not kind.endswith("_snake"):
        return None
    return {**args, "attn_kwargs": {"decay_power": powers[0] if len(powers) == 1 else powers}}


def run_kind(name: str, args: argparse.Namespace) -> dict:
    """Train an attention kind or a variant of ``--variants`` with the shared recipe and evaluate it at every size;
    returns its results."""
    from lightvision.classify.deit import FAMILIES
    from lightvision.classify.evaluate import evaluate_checkpoint
    from lightvision.classify.train import load_recipe, train

    kind, variant_set = resolve_variant(name, args.variants, FAMILIES)
    run = Path(args.work) / name
    cfg = load_recipe(
        RECIPE,
        [
            f"model.name={kind}_deit_tiny_patch16_224",
            f"data.root={args.data}",
            f"data.num_workers={args.workers}",
            *([f"sched.epochs={args.epochs}"] if args.epochs is not None else []),
            *([f"sched.warmup_epochs={args.warmup_epochs}"] if args.warmup_epochs is not None else []),
            f"train.batch_size={args.batch_size}",
            f"run.dir={run}",
            "train.log_every=50",
            *variant_set,
            *args.set,
        ],
    )
    cfg["train"]["eval_every_epochs"] = max(1, cfg["sched"]["epochs"] // 10)  # a top-1 curve of about 10 points
    start = time.time()
    final = train(cfg, resume=args.resume)
    train_seconds = time.time() - start
    if final["interrupted"]:
        raise RuntimeError(f"stopped by SIGTERM at step {final['step']}; run again with --resume to finish")
    evals = []
    for setting in args.eval_pos:
        model_args = pos_setting(setting, kind)
        if model_args is None:
            continue
        report = evaluate_checkpoint(
            run,
            args.img_size,
            out_dir=run / "eval" / setting.replace(":", "_").replace(",", "_"),
            batch_size=500,
            num_workers=args.workers,
            model_args=model_args,
        )
        keys = ("img_size", "top1", "top5", "images", "images_per_s", "peak_mem_gib")
        evals += [{"pos": setting, **{k: r[k] for k in keys}} for r in report["results"]]
    return {
        "model": cfg["model"]["name"],
        "variant_set": variant_set,
        "recipe": {k: cfg[k] for k in ("model", "aug", "optim", "sched", "train")},
        "params": final["params"],
        "epochs": final["epochs"],
        "train_seconds": round(train_seconds, 1),
        "train_images_per_s": round(final["steps_run"] * final["global_batch"] / train_seconds, 1),
        "final": final,
        "loss_per_epoch": loss_per_epoch(run),
        "top1_per_eval": top1_per_eval(run, final["step"] / final["epochs"]),
        "eval": evals,
    }


def table(results: dict, sizes: list[int]) -> str:
    """Markdown: kind, parameters, top-1 at each size (the first ``--eval-pos`` setting), train seconds."""
    head = "| attention | params (M) | " + " | ".join(f"top-1 @{s}px" for s in sizes) + " | train s |"
    lines = [head, "| --- " * (len(sizes) + 3) + "|"]
    for kind, r in results.items():
        if "error" in r:
            lines.append(f"| {kind} | error: {r['error']} |")
            continue
        first = r["eval"][0]["pos"] if r["eval"] and "pos" in r["eval"][0] else None
        acc = {e["img_size"]: e["top1"] for e in r["eval"] if e.get("pos") == first}
        cells = " | ".join(f"{acc[s]:.2f}" for s in sizes)
        lines.append(f"| {kind} | {r['params'] / 1e6:.2f} | {cells} | {r['train_seconds']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = comparison_parser(
        "classify",
        __doc__.splitlines()[0],
        "softmax lightnet lion_d lion_s lion_s_snake normalized",
        "model.args={patch_size: 4}",
    )
    p.add_argument("--epochs", type=int, help="training epochs (default: the recipe's)")
    p.add_argument("--warmup-epochs", type=int, help="linear warm-up epochs (default: the recipe's)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--img-size", type=int, nargs="+", default=[16, 24, 32, 48, 64, 96])
    p.add_argument(
        "--eval-pos",
        nargs="+",
        default=["image"],
        help="position settings to evaluate the same weights in: image, token, image:p=POWER (LION decays), "
        "image:embed=token / image:blocks=token (one signal group in the other unit); the table shows the first",
    )
    p.add_argument("--resume", action="store_true", help="continue each run from the newest checkpoint of its folder")
    args = p.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = True
    _, report = comparison_report("classify", args, argv)
    results = run_each(args.kinds, lambda name: run_kind(name, args), report, report_path("classify", args))
    print(table(results, args.img_size))
    failed = [name for name, r in results.items() if "error" in r]
    if failed:
        print(f"classify benchmark: {len(failed)} of {len(results)} failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
