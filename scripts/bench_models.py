"""Model-level speed: training-step and inference throughput (images/s) and peak GPU memory, bf16.

    python scripts/bench_models.py --out models.json                                   # everything
    python scripts/bench_models.py --family deit --sizes 224 512 --attentions softmax lightnet

Families and the batch used at each resolution (stated in every record):
- DeiT-S (``{attention}_deit_small_patch16_224`` from timm, created at ``img_size``) with softmax (SDPA),
  lightnet, lion_d, lion_s, lion_s_snake and ``lion_s_mask`` (the published LION style: mask
  materialised in PyTorch) at 224 / 384 / 512 / 768 / 1024 px, batches of docs/spec.md 4.
- DiT-B/2 and DiT-XL/2 (``{attention}_dit_{b|xl}_2``, latent = px / 8, 4 channels) with softmax,
  lightnet and lion_s (or a named variant of ``configs/variants/diffusion_cifar10.yaml``, e.g. ``lightnet_b_head64``)
  at 256 / 512 / 1024 px; DiT-B/2 batches 256 / 64 / 16 (the same latent tokens per step,
  about a quarter of an H100's memory; at a quarter of that, 64 / 16 / 4, an eager step was host-bound on an
  H100: 31.6 ms of GPU time in 47 ms for softmax at 512 px), DiT-XL/2 64 / 16 / 4.

A training step is forward + backward + AdamW step under bf16 autocast (classification: cross-entropy
on random labels; DiT: MSE on its noise/variance output for random t, y). Inference is a forward pass
under ``torch.inference_mode``. Each measurement: warm-up steps, then the median over timed steps with
CUDA events; peak memory from ``torch.cuda.max_memory_allocated`` after a reset. ``--memory-batch B`` adds an
inference-memory record at the fixed batch B at every size (``mode: infer_memory``): the peak, the memory held before
the forward (weights, input; ``base_gb``) and their difference, the forward's own memory (``activation_gb``), against
the token count (``tokens``). ``--memory-only`` measures just that (fast; the check that memory grows
linearly with the tokens): the growth exponent between neighbouring sizes, log(activation ratio) / log(token ratio),
is printed per attention (1 = linear, 2 = quadratic) and written as a second table. Out-of-memory is
recorded as ``oom: true``. With ``--compile MODE`` each model is compiled fresh (``torch._dynamo.reset()`` first), as
in a process of its own; ``--compile none MODE`` measures each model eager and compiled, side by side. Every timed
record is also set against softmax's of the same model, px, mode and compile mode (``vs_softmax``: images/s and
peak-memory ratios, a table of its own). Output: JSON (``{"env": ..., "records": [...]}``, plus ``memory_growth``
with fixed-batch records), a markdown table and a PNG per family (training images/s against resolution; the
forward's own memory against the token count, log-log, with fixed-batch records, else the inference peak against
resolution), the table printed last.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from lightvision.engine.compiled import compile_model
from lightvision.tools.results import results_env
from lightvision.tools.speed_tables import md_table, ratio_table, ratios

DEIT_BATCH = {224: 256, 384: 96, 512: 48, 768: 16, 1024: 8}
DIT_BATCH = {"b": {256: 256, 512: 64, 1024: 16}, "xl": {256: 64, 512: 16, 1024: 4}}
DEIT_ATTENTIONS = ("softmax", "lightnet", "lion_d", "lion_s", "lion_s_snake", "lion_s_mask")
DIT_ATTENTIONS = ("softmax", "lightnet", "lion_s")


def build_deit(attention: str, img_size: int) -> torch.nn.Module:
    """DeiT-S at ``img_size``; ``lion_s_mask`` is LION-S with the mask materialised in PyTorch."""
    import timm

    import lightvision  # noqa: F401  registers the models in timm

    if attention == "lion_s_mask":
        return timm.create_model(
            "lion_s_deit_small_patch16_224", img_size=img_size, attn_kwargs=dict(form="parallel", backend="torch")
        )
    return timm.create_model(f"{attention}_deit_small_patch16_224", img_size=img_size)


def build_dit(attention: str, size: str, img_size: int) -> torch.nn.Module:
    """DiT-{size}/2 on the latent of an ``img_size`` image (downsampling 8, 4 channels, 1000 classes).
    ``attention``: a kind, or a variant of ``configs/variants/diffusion_cifar10.yaml`` (e.g. ``lightnet_b_head64``),
    built with the model overrides the variant gives a recipe."""
    from lightvision.diffusion.benchmark import CONFIGS
    from lightvision.diffusion.dit import ATTENTION_KINDS
    from lightvision.diffusion.train import build_model, load_recipe, model_config
    from lightvision.tools.results import resolve_variant

    kind, overrides = resolve_variant(attention, CONFIGS / "variants" / "diffusion_cifar10.yaml", ATTENTION_KINDS)
    cfg = load_recipe(None, [f"model.name={kind}_dit_{size}_2", *overrides])
    return build_model(model_config(cfg, 4, img_size // 8))


def _median_ms(fn, warmup: int, steps: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def make_train_step(model: torch.nn.Module, inputs, loss_of):
    """One training step of ``model`` on ``inputs``: bf16 autocast forward, ``loss_of(output)``, backward, fused
    AdamW."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def train_step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of(model(*inputs))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return train_step


def _reset_peak() -> None:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def _peak_gb() -> float:
    return torch.cuda.max_memory_allocated() / 2**30


def _infer(model: torch.nn.Module, inputs) -> None:
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
        model(*inputs)


def measure_memory(model: torch.nn.Module, inputs) -> dict:
    """Inference memory (GB) of one forward of ``model`` (on CUDA, in eval mode) on ``inputs``: ``base_gb`` held before
    it (weights, inputs, lazily created workspaces: a first forward runs untimed), ``peak_mem_gb`` during it and
    ``activation_gb`` = peak - base, the forward's own memory."""
    _infer(model, inputs)
    torch.cuda.synchronize()
    _reset_peak()
    base = torch.cuda.memory_allocated() / 2**30
    _infer(model, inputs)
    torch.cuda.synchronize()
    peak = _peak_gb()
    return {"batch": int(inputs[0].shape[0]), "base_gb": base, "peak_mem_gb": peak, "activation_gb": peak - base}


def measure(
    model: torch.nn.Module,
    make_batch,
    loss_of,
    batch: int,
    warmup: int,
    steps: int,
    memory_batch: int = 0,
    memory_only: bool = False,
    train_only: bool = False,
) -> dict:
    """Train-step and inference images/s and peak memory (GB) of ``model`` on random batches; with ``memory_batch``
    also ``measure_memory`` at that fixed batch (``infer_memory``: the same batch at every resolution, so the growth
    with the token count shows; capped at ``batch``), before any optimizer state exists; ``memory_only``: just that;
    ``train_only``: no inference timing (a compiled model then compiles one graph, not two)."""
    model = model.cuda()
    inputs = make_batch()
    result = {}
    model.eval()
    if not memory_only and not train_only:
        _reset_peak()
        ms = _median_ms(lambda: _infer(model, inputs), warmup, steps)
        result["infer"] = {"img_per_s": batch / ms * 1e3, "peak_mem_gb": _peak_gb()}
    if memory_batch:
        result["infer_memory"] = measure_memory(model, [t[:memory_batch] for t in inputs])
    if memory_only:
        return result

    model.train()
    train_step = make_train_step(model, inputs, loss_of)
    _reset_peak()
    ms = _median_ms(train_step, warmup, steps)
    result["train"] = {"img_per_s": batch / ms * 1e3, "peak_mem_gb": _peak_gb()}
    return result


def bench_one(
    family: str, attention: str, size: str, img_size: int, batch: int, args, compile_mode: str | None = None
) -> list[dict]:
    """Records for one (model, attention, resolution), compiled in ``compile_mode`` when given; an OOM becomes
    ``oom: true`` records."""
    base = {
        "model": f"{family}_{size}",
        "attention": attention,
        "img_size": img_size,
        "batch": batch,
        **({"compile": compile_mode} if compile_mode else {}),
    }
    try:
        if family == "deit":
            model = build_deit(attention, img_size)
            make_batch = lambda: (torch.randn(batch, 3, img_size, img_size, device="cuda"),)  # noqa: E731
            labels = torch.randint(0, 1000, (batch,), device="cuda")
            loss_of = lambda out: F.cross_entropy(out.float(), labels)  # noqa: E731
        else:
            model = build_dit(attention, size, img_size)
            latent = img_size // 8

            def make_batch():
                return (
                    torch.randn(batch, 4, latent, latent, device="cuda"),
                    torch.randint(0, 1000, (batch,), device="cuda"),
                    torch.randint(0, 1000, (batch,), device="cuda"),
                )

            loss_of = lambda out: out.float().square().mean()  # noqa: E731
        base["tokens"] = token_count(model)
        if compile_mode:
            torch._dynamo.reset()  # each model compiles fresh, as in its own process (no shared cache entries)
            model = compile_model(model, mode=compile_mode)
        measured = measure(
            model,
            make_batch,
            loss_of,
            batch,
            args.warmup,
            args.steps,
            args.memory_batch,
            args.memory_only,
            args.train_only,
        )
        records = [{**base, "mode": mode, **values} for mode, values in measured.items()]
    except torch.cuda.OutOfMemoryError:
        modes = ("infer_memory",) if args.memory_only else ("train",) if args.train_only else ("infer", "train")
        records = [{**base, "mode": mode, "oom": True} for mode in modes]
    finally:
        model = None
        torch.cuda.empty_cache()
    for record in records:
        speed = f"{record['img_per_s']:9.1f} img/s" if "img_per_s" in record else " " * 15
        shown = "OOM" if record.get("oom") else f"{speed} {record['peak_mem_gb']:6.2f} GB"
        if "activation_gb" in record:
            shown += f" (forward's own {record['activation_gb']:.3f} GB, {record['tokens']} tokens)"
        print(
            f"{record['model']:8s} {attention:13s} {img_size:5d}px b={record['batch']:<4d} {record['mode']:5s} "
            f"{compile_mode or 'eager':15s} {shown}",
            flush=True,
        )
    return records


def token_count(model: torch.nn.Module) -> int:
    """Tokens the attention sees: the model's patches plus its prefix tokens (DeiT's class token)."""
    return model.patch_embed.num_patches + getattr(model, "num_prefix_tokens", 0)


def memory_growth(records: list[dict]) -> list[dict]:
    """Per (model, attention), from its ``infer_memory`` records (OOM ones left out): the sizes, tokens, activation GB
    and the growth exponents between neighbouring sizes, log(activation ratio) / log(token ratio) (1 = linear in
    the tokens, 2 = quadratic; None where a size measured no memory), with their maximum (``max_exponent``; None
    without two such sizes)."""
    series: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        if r["mode"] == "infer_memory" and not r.get("oom"):
            series.setdefault((r["model"], r["attention"]), []).append(r)
    rows = []
    for (model, attention), rs in series.items():
        rs = sorted(rs, key=lambda r: r["tokens"])
        exponents = [
            math.log(b["activation_gb"] / a["activation_gb"]) / math.log(b["tokens"] / a["tokens"])
            if min(a["activation_gb"], b["activation_gb"]) > 0
            else None
            for a, b in zip(rs, rs[1:])
        ]
        known = [e for e in exponents if e is not None]
        rows.append(
            {
                "model": model,
                "attention": attention,
                "batch": rs[0]["batch"],
                "img_size": [r["img_size"] for r in rs],
                "tokens": [r["tokens"] for r in rs],
                "activation_gb": [r["activation_gb"] for r in rs],
                "exponents": exponents,
                "max_exponent": max(known) if known else None,
            }
        )
    return rows


def memory_growth_table(rows: list[dict]) -> str:
    """Markdown: activation GB per size and the growth exponents of ``memory_growth``."""
    cells = []
    for r in rows:
        sizes = ", ".join(f"{px} ({n}): {gb:.3f}" for px, n, gb in zip(r["img_size"], r["tokens"], r["activation_gb"]))
        exps = ", ".join("-" if e is None else f"{e:.2f}" for e in r["exponents"]) or "-"
        worst = "-" if r["max_exponent"] is None else f"{r['max_exponent']:.2f}"
        cells.append([r["model"], r["attention"], r["batch"], sizes, exps, worst])
    header = ["model", "attention", "batch", "px (tokens): forward activation GB", "growth exponents", "max"]
    return md_table(header, cells)


def markdown_table(records: list[dict]) -> str:
    """Rows (model, attention, px, compile mode, batch); columns train/infer images/s and peak GB."""
    rows = {}
    for r in records:
        if r.get("oom"):
            cell = "OOM"
        elif r["mode"] == "infer_memory":
            cell = f"{r['peak_mem_gb']:.2f} / {r['activation_gb']:.3f} (b={r['batch']})"
        else:
            cell = f"{r['img_per_s']:.1f} / {r['peak_mem_gb']:.2f}"
        row_key = (r["model"], r["attention"], r["img_size"], r.get("compile") or "eager")
        rows.setdefault(row_key, {"batch": r["batch"]})[r["mode"]] = cell
    header = ["model", "attention", "px", "compile", "batch", "train img/s / peak GB", "infer img/s / peak GB"]
    header.append("infer peak GB / forward's own GB, fixed batch")
    modes = ("train", "infer", "infer_memory")
    return md_table(header, [[*key, c["batch"], *(c.get(m, "-") for m in modes)] for key, c in rows.items()])


def plot(records: list[dict], path: Path) -> None:
    """Per model family: training images/s against resolution (log-y), and inference memory: the forward's own GB
    against the token count at the fixed batch (log-log: slope 1 is linear), else the peak GB against resolution."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    models = sorted({r["model"] for r in records})
    panels = {}
    for model in models:
        modes = {r["mode"] for r in records if r["model"] == model}
        panels[model] = (
            [("train", "img_size", "img_per_s", "image px", "train images/s")] if "train" in modes else []
        ) + (
            [("infer_memory", "tokens", "activation_gb", "tokens", "forward's own GB, fixed batch")]
            if "infer_memory" in modes
            else [("infer", "img_size", "peak_mem_gb", "image px", "inference peak GB")]
        )
    cols = max(len(p) for p in panels.values())
    fig, axes = plt.subplots(len(models), cols, figsize=(5.5 * cols, 3.6 * len(models)), squeeze=False)
    for row, model in enumerate(models):
        for col, (mode, xkey, ykey, xlabel, ylabel) in enumerate(panels[model]):
            ax = axes[row][col]
            xs = set()
            for attention in sorted({r["attention"] for r in records if r["model"] == model}):
                pts = sorted(
                    (r[xkey], r[ykey])
                    for r in records
                    if r["model"] == model and r["attention"] == attention and r["mode"] == mode and not r.get("oom")
                )
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=attention)
                    xs.update(x for x, _ in pts)
            if xkey == "tokens":  # log x, ticks at the measured token counts (no crowded minor labels)
                ax.set_xscale("log")
                ax.set_xticks(sorted(xs), [str(t) for t in sorted(xs)])
                ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.set_yscale("log")
            ax.set_title(f"{model}: {ylabel}")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def script_env(argv: list[str] | None) -> dict:
    """``results_env`` of this script's command line (``argv``: ``main``'s, None: ``sys.argv[1:]``)."""
    return results_env("python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]))


def compile_modes(values: list[str] | None) -> list[str | None]:
    """``--compile``'s values as the modes to run: absent -> [None] (eager), given without a mode -> ["default"],
    "none" -> None (eager)."""
    if values is None:
        return [None]
    return [None if m == "none" else m for m in values or ["default"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", choices=("deit", "dit", "all"), default="all")
    parser.add_argument("--attentions", nargs="*", help="subset of attentions (default: all of the family)")
    parser.add_argument("--sizes", nargs="*", type=int, help="subset of image sizes in px")
    parser.add_argument("--dit-sizes", nargs="*", default=["b", "xl"], choices=("s", "b", "l", "xl"))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--compile",
        nargs="*",
        choices=("none", "default", "reduce-overhead", "max-autotune"),
        help="torch.compile each model (custom ops stay in the graph) in this mode (no mode: 'default'); "
        "'reduce-overhead' replays the steps as CUDA graphs; several modes measure each model once per mode "
        "('none': eager), side by side",
    )
    parser.add_argument(
        "--memory-batch",
        type=int,
        default=0,
        help="also record inference memory at this fixed batch at every size (mode infer_memory; "
        "default 8 with --memory-only)",
    )
    parser.add_argument(
        "--memory-only",
        action="store_true",
        help="only the fixed-batch inference memory (no timing) and its growth with the token count",
    )
    parser.add_argument(
        "--train-only", action="store_true", help="time training steps only (compiled: one graph to compile, not two)"
    )
    parser.add_argument("--out", default="models.json", help="JSON path; .md and .png are written beside it")
    args = parser.parse_args(argv)
    if args.memory_batch < 0:
        parser.error(f"--memory-batch must be >= 0 (0: no memory records), got {args.memory_batch}")
    if args.memory_only:
        args.memory_batch = args.memory_batch or 8
    if not torch.cuda.is_available():
        parser.error("bench_models.py measures GPU throughput and memory and needs CUDA")

    plan = []
    if args.family in ("deit", "all"):
        for attention in args.attentions or DEIT_ATTENTIONS:
            for px, batch in DEIT_BATCH.items():
                if not args.sizes or px in args.sizes:
                    plan.append(("deit", attention, "s", px, batch))
    if args.family in ("dit", "all"):
        for size in args.dit_sizes:
            for attention in args.attentions or DIT_ATTENTIONS:
                for px, batch in DIT_BATCH.get(size, DIT_BATCH["b"]).items():
                    if not args.sizes or px in args.sizes:
                        plan.append(("dit", attention, size, px, batch))
    if not plan:
        parser.error("nothing to run: check --family / --attentions / --sizes")

    modes = compile_modes(args.compile)
    torch.backends.cuda.matmul.allow_tf32 = True
    records = []
    for family, attention, size, px, batch in plan:
        batch_now = args.memory_batch if args.memory_only else batch
        for mode in modes:
            records.extend(bench_one(family, attention, size, px, batch_now, args, mode))

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    env = script_env(argv)
    table = markdown_table(records)
    growth = memory_growth(records)
    if growth:
        table += "\n\nInference memory against the token count (growth exponent 1 = linear, 2 = quadratic):\n\n"
        table += memory_growth_table(growth)
    against = ratios(records)
    if against:
        table += "\n\nAgainst softmax (same model, px, mode and compile mode):\n\n" + ratio_table(against)
    extra = {**({"memory_growth": growth} if growth else {}), **({"vs_softmax": against} if against else {})}
    out.write_text(json.dumps({"env": env, "records": records, **extra}, indent=1))
    out.with_suffix(".md").write_text(table + "\n")
    plot(records, out.with_suffix(".png"))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
