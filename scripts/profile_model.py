"""Where a training step's GPU time goes: torch.profiler over DeiT-S or DiT training steps, grouped by op.

    python scripts/profile_model.py --attentions softmax lightnet --img-size 224 --batch 256 --out prof.json
    python scripts/profile_model.py --model dit_b --attentions softmax lightnet --img-size 512 --batch 16
    python scripts/profile_model.py --attentions softmax lightnet --compile reduce-overhead   # the compiled step

Per attention: DeiT-S (or DiT-B/2 / DiT-XL/2 on the latent of ``--img-size``) and its training step, as
``bench_models.py`` builds them (bf16 autocast,
fused AdamW); ``--warmup`` steps, then ``--steps`` profiled steps. Prints, per model, the GPU time of a step (sum
of its kernels), the ``--top`` ops (aten ops and autograd functions) by the GPU time of the kernels they launch
(ms per step, share of the step) and the ``--top`` kernels by name, and writes them as JSON (with the env block) to
``--out``. ``--compile MODE`` profiles the model compiled as ``bench_models.py --compile`` compiles it; its kernels are
then mostly Inductor's fused ones (``triton_*_fused_<ops>``), which the kernel table names.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from bench_models import build_deit, build_dit, make_train_step  # scripts/ (this script's folder) is on sys.path
from lightvision.engine.compiled import compile_model
from lightvision.tools.results import results_env


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
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="deit_s", choices=("deit_s", "dit_b", "dit_xl"))
    p.add_argument("--attentions", nargs="+", default=["softmax", "lightnet"])
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--top", type=int, default=25)
    p.add_argument(
        "--compile",
        nargs="?",
        const="default",
        choices=("default", "reduce-overhead", "max-autotune"),
        help="torch.compile each model in this mode first (as bench_models.py --compile)",
    )
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("profile_model.py profiles CUDA time and needs a GPU")
    results = []
    for attention in args.attentions:
        r = profile_step(
            args.model, attention, args.img_size, args.batch, args.warmup, args.steps, args.top, args.compile
        )
        results.append(r)
        print(
            f"\n{args.model} {attention} {args.img_size}px batch {args.batch}"
            f"{', compiled ' + args.compile if args.compile else ''}: {r['cuda_ms_per_step']:.1f} ms CUDA per step"
        )
        for table, key in (("ops", "op"), ("kernels", "kernel")):
            print(f" {table}:")
            for row in r[table]:
                print(f"  {row['ms']:8.2f} ms {100 * row['share']:5.1f}% x{row['calls']:<5d} {row[key][:110]}")
        torch.cuda.empty_cache()
    if args.out:
        env = results_env("python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]))
        with open(args.out, "w") as f:
            json.dump({"env": env, "profiles": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
