"""Where a training step's GPU time goes: torch.profiler over DeiT-S or DiT training steps, grouped by op.

    python scripts/profile_model.py --attentions softmax lightnet --img-size 224 --batch 256 --out prof.json
    python scripts/profile_model.py --model dit_b --attentions softmax lightnet --img-size 512 --batch 16
    python scripts/profile_model.py --attentions softmax lightnet --compile reduce-overhead   # the compiled step
    python scripts/profile_model.py --cases dit_b:256 dit_b:512 deit_s:224 --attentions softmax lightnet lion_s \
        --compile none reduce-overhead --out split.json          # every case eager and compiled, a split table last

Per attention: DeiT-S (or DiT-B/2 / DiT-XL/2 on the latent of ``--img-size``) and its training step, as
``bench_models.py`` builds them (bf16 autocast,
fused AdamW); ``--warmup`` steps, then ``--steps`` profiled steps. Prints, per model, the GPU time of a step (sum
of its kernels), the ``--top`` ops (aten ops and autograd functions) by the GPU time of the kernels they launch
(ms per step, share of the step) and the ``--top`` kernels by name, and writes them as JSON (with the env block) to
``--out``. ``--compile MODE`` profiles the model compiled as ``bench_models.py --compile`` compiles it; its kernels are
then mostly Inductor's fused ones (``triton_*_fused_<ops>``), which the kernel table names; ``--compile none MODE``
profiles each case eager and compiled.

Each profile also splits the step's GPU time (``split``) into matrix work (GEMM / GEMV kernels: cuBLAS, CUTLASS,
cuDNN convolutions, Inductor's extern mm and its mm templates), the attention core (SDPA's kernels, the LightNet
and LION Triton kernels) and the rest, and names the largest parts of the rest (``rest_top``): by op in eager mode,
by kernel (Inductor's fused kernels, launch index dropped) when compiled. ``--cases MODEL:PX[:BATCH]`` profiles
several models and sizes in one process (batch: ``--batch``, else ``bench_models.py``'s batch at that size); the
split of every profile is printed as one table last.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

import torch
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from bench_models import (  # scripts/ (this script's folder) is on sys.path
    DEIT_BATCH,
    DIT_BATCH,
    build_deit,
    build_dit,
    compile_modes,
    make_train_step,
    script_env,
)
from lightvision.engine.compiled import compile_model
from lightvision.tools.speed_tables import split_table

MODELS = ("deit_s", "dit_b", "dit_xl")
MATRIX_OPS = frozenset(
    f"aten::{op}" for op in ("mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "mv", "addmv", "_scaled_mm")
)
MATRIX_KERNEL_WORDS = ("gemm", "gemv", "nvjet", "cutlass", "xmma", "splitk", "cublas", "triton_tem_")
ATTENTION_WORDS = ("sdpa", "flash", "fmha", "attention", "lightnet", "lion")


def core_kernel_names() -> frozenset[str]:
    """Names of the LightNet and LION attention-core Triton kernels (the ``@triton.jit`` functions of their modules)."""
    from triton.runtime.jit import KernelInterface

    from lightvision.kernels.lightnet import _triton as lightnet
    from lightvision.kernels.lion import parallel, scan

    return frozenset(
        name
        for module in (lightnet, parallel, scan)
        for name, f in vars(module).items()
        if isinstance(f, KernelInterface)
    )


def category(name: str, core_kernels: frozenset[str]) -> str:
    """ "attention" (an attention core's op or kernel), "matrix" (a GEMM / GEMV op or kernel) or "rest"."""
    low = name.lower()
    if name in core_kernels or any(w in low for w in ATTENTION_WORDS):
        return "attention"
    if name in MATRIX_OPS or any(w in low for w in MATRIX_KERNEL_WORDS):
        return "matrix"
    return "rest"


def kernel_group(name: str) -> str:
    """A kernel's name without what varies between launches of one operation: Inductor's trailing index
    (``triton_poi_fused_add_mul_3`` -> ``triton_poi_fused_add_mul``), an ATen kernel's template arguments."""
    return re.sub(r"_\d+$", "", name.split("<")[0].removeprefix("void ").strip())


def split_step(ops: list[dict], kernels: list[dict], compiled: bool, top: int) -> dict:
    """ms per step of matrix work, attention core and the rest (from the kernel rows, ``{"name", "ms"}``), and the
    ``top`` largest parts of the rest: op rows in eager mode, kernel groups (``kernel_group``) when compiled."""
    cores = core_kernel_names()
    split = {"matrix": 0.0, "attention": 0.0, "rest": 0.0}
    groups: dict[str, float] = {}
    for k in kernels:
        kind = category(k["name"], cores)
        split[kind] += k["ms"]
        if compiled and kind == "rest":
            groups[kernel_group(k["name"])] = groups.get(kernel_group(k["name"]), 0.0) + k["ms"]
    if not compiled:
        for o in ops:
            if category(o["name"], cores) == "rest":
                groups[o["name"]] = groups.get(o["name"], 0.0) + o["ms"]
    rest_top = sorted(({"name": n, "ms": ms} for n, ms in groups.items()), key=lambda r: -r["ms"])[:top]
    return {**{f"{k}_ms": v for k, v in split.items()}, "rest_top": rest_top}


def profile_step(
    model_name: str,
    attention: str,
    img_size: int,
    batch: int,
    warmup: int,
    steps: int,
    top: int,
    compile_mode: str | None = None,
) -> dict:
    """Self CUDA time per op and per kernel (ms per step) of ``steps`` training steps of ``model_name`` (deit_s, dit_b,
    dit_xl) with ``attention``; compiled in ``compile_mode`` when given."""
    if model_name == "deit_s":
        model = build_deit(attention, img_size).cuda().train()
        labels = torch.randint(0, 1000, (batch,), device="cuda")
        inputs = (torch.randn(batch, 3, img_size, img_size, device="cuda"),)
        loss_of = lambda out: F.cross_entropy(out.float(), labels)  # noqa: E731
    else:
        model = build_dit(attention, model_name.split("_")[1], img_size).cuda().train()
        latent = img_size // 8
        inputs = (
            torch.randn(batch, 4, latent, latent, device="cuda"),
            torch.randint(0, 1000, (batch,), device="cuda"),
            torch.randint(0, 1000, (batch,), device="cuda"),
        )
        loss_of = lambda out: out.float().square().mean()  # noqa: E731
    if compile_mode:
        torch._dynamo.reset()  # each model compiles fresh
        model = compile_model(model, mode=compile_mode)
    step = make_train_step(model, inputs, loss_of)

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    # GPU time appears twice: on the kernel rows and on the CPU-side op rows that launched them; the total comes from
    # the kernels, one table from the ops (aten ops, autograd functions: readable names), one from the kernels
    total = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA) / 1e3 / steps
    per_step = {
        on_device: [
            {"name": e.key, "ms": e.self_device_time_total / 1e3 / steps}
            for e in events
            if (e.device_type == DeviceType.CUDA) == on_device and e.self_device_time_total > 0
        ]
        for on_device in (False, True)
    }

    def table(key: str, on_device: bool) -> list[dict]:
        rows = [
            {key: e.key, "ms": e.self_device_time_total / 1e3 / steps, "calls": e.count // steps}
            for e in events
            if (e.device_type == DeviceType.CUDA) == on_device and e.self_device_time_total > 0
        ]
        rows.sort(key=lambda r: -r["ms"])
        return [{**r, "share": r["ms"] / total} for r in rows[:top]]

    return {
        "model": model_name,
        "attention": attention,
        "img_size": img_size,
        "batch": batch,
        "compile": compile_mode,
        "cuda_ms_per_step": total,
        "ops": table("op", False),
        "kernels": table("kernel", True),
        "split": split_step(per_step[False], per_step[True], bool(compile_mode), 5),
    }


def parse_case(text: str, batch: int | None) -> tuple[str, int, int]:
    """ "MODEL:PX[:BATCH]" -> (model, px, batch); the batch defaults to ``batch``, else bench_models.py's at PX."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or parts[0] not in MODELS or not all(p.isdigit() for p in parts[1:]):
        names = f"{', '.join(MODELS[:-1])} or {MODELS[-1]}"
        raise ValueError(f"a case is MODEL:PX[:BATCH] with MODEL {names}, got {text!r}")
    model, px = parts[0], int(parts[1])
    table = DEIT_BATCH if model == "deit_s" else DIT_BATCH[model.split("_")[1]]
    if len(parts) == 3:
        return model, px, int(parts[2])
    if batch is None and px not in table:
        raise ValueError(f"no default batch for {model} at {px} px (known: {sorted(table)}); give MODEL:PX:BATCH")
    return model, px, batch or table[px]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="deit_s", choices=MODELS)
    p.add_argument("--attentions", nargs="+", default=["softmax", "lightnet"])
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--batch", type=int, help="default: bench_models.py's batch at the size")
    p.add_argument(
        "--cases", nargs="+", metavar="MODEL:PX[:BATCH]", help="several models / sizes (replace --model, --img-size)"
    )
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--top", type=int, default=25)
    p.add_argument(
        "--compile",
        nargs="*",
        choices=("none", "default", "reduce-overhead", "max-autotune"),
        help="torch.compile each model in this mode first (as bench_models.py --compile; no mode: 'default'); "
        "several modes profile each case once per mode, 'none' eager",
    )
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    try:
        cases = [parse_case(c, args.batch) for c in args.cases or [f"{args.model}:{args.img_size}"]]
    except ValueError as err:
        p.error(str(err))
    modes = compile_modes(args.compile)
    if not torch.cuda.is_available():
        p.error("profile_model.py profiles CUDA time and needs a GPU")
    results = []
    for model, img_size, batch in cases:
        for mode in modes:
            for attention in args.attentions:
                r = profile_step(model, attention, img_size, batch, args.warmup, args.steps, args.top, mode)
                results.append(r)
                print(
                    f"\n{model} {attention} {img_size}px batch {batch}"
                    f"{', compiled ' + mode if mode else ''}: {r['cuda_ms_per_step']:.1f} ms CUDA per step"
                )
                for table, key in (("ops", "op"), ("kernels", "kernel")):
                    print(f" {table}:")
                    for row in r[table]:
                        print(f"  {row['ms']:8.2f} ms {100 * row['share']:5.1f}% x{row['calls']:<5d} {row[key][:110]}")
                torch.cuda.empty_cache()
    if args.out:
        env = script_env(argv)
        with open(args.out, "w") as f:
            json.dump({"env": env, "profiles": results}, f, indent=1)
    print("\n" + split_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
