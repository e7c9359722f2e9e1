"""What a DiT training step costs per attention, counted on the CPU: parameters, matrix FLOPs, the Linear layers of a
block and the activation bytes a block keeps for its backward.

    python scripts/block_costs.py                                   # DiT-B/2: softmax, lightnet, lion_s at 192 px
    python scripts/block_costs.py --size s --px 128 --attentions softmax lightnet --out costs.json

Per attention, the model as ``bench_models.py`` builds it (``{attention}_dit_{size}_2`` on the latent of ``--px``):
- parameters (all, and in the blocks) and the depth;
- the Linear layers of one block: weight shape and whether it runs per token or once per sample (the modulation);
- matrix FLOPs of one forward + backward per image (``torch.utils.flop_counter``; mm / addmm are the Linear layers,
  bmm the cores' PyTorch references; SDPA's own FLOPs are not counted on the CPU);
- the tensors one block saves for its backward that grow with the tokens (bytes per token and channel, by the
  op that produced them), with bf16 autocast and the fused kernels the model runs on CUDA: these run here in
  the Triton interpreter (TRITON_INTERPRET=1), so the saved set is the GPU's; ``--plain`` counts the PyTorch
  references instead. The block's share of peak training memory is about depth x this x tokens x width x batch.
Prints a table per attention and writes the numbers as JSON to ``--out``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are decorated: before any kernel import

import argparse
import contextlib
import importlib
import json
import pkgutil
import sys

import torch
from torch.utils.flop_counter import FlopCounterMode

from bench_models import DIT_ATTENTIONS, build_dit, script_env  # scripts/ (this script's folder) is on sys.path


@contextlib.contextmanager
def kernels_on_cpu(enabled: bool = True):
    """Inside, every op's ``backend="auto"`` picks its Triton kernel on any device (the interpreter runs it on the
    CPU), as it does on CUDA."""
    import lightvision.ops as ops
    from lightvision.ops import _dispatch

    dispatch = _dispatch.dispatch

    def on_any_device(op_name, backend, device, args, kwargs):
        return dispatch(op_name, backend, torch.device("cuda"), args, kwargs)

    modules = [importlib.import_module(f"lightvision.ops.{info.name}") for info in pkgutil.iter_modules(ops.__path__)]
    modules = [m for m in modules if enabled and getattr(m, "dispatch", None) is dispatch]
    for module in modules:
        module.dispatch = on_any_device
    try:
        yield
    finally:
        for module in modules:
            module.dispatch = dispatch


def linear_layers(block: torch.nn.Module) -> list[dict]:
    """The block's Linear layers: name, weight [out, in], bias, and per token or once per sample (the modulation)."""
    return [
        {
            "name": name,
            "weight": list(m.weight.shape),
            "bias": m.bias is not None,
            "per": "sample" if name.startswith("modulation") else "token",
        }
        for name, m in block.named_modules()
        if isinstance(m, torch.nn.Linear)
    ]


def step_flops(model: torch.nn.Module, px: int) -> dict[str, float]:
    """Matrix GFLOP of one forward + backward of one image, by aten op."""
    x = torch.randn(1, 4, px // 8, px // 8)
    t, y = torch.randint(0, 1000, (1,)), torch.randint(0, 1000, (1,))
    counter = FlopCounterMode(display=False)
    with counter:
        model(x, t, y).float().square().mean().backward()
    model.zero_grad(set_to_none=True)
    return {str(op).removeprefix("aten."): v / 1e9 for op, v in counter.get_flop_counts()["Global"].items()}


def saved_per_token(model: torch.nn.Module, px: int) -> list[dict]:
    """Tensors that block 1 (fed block 0's output: the stream's dtype) saves for its backward and that have a token
    dim, one image, bf16 autocast, as autograd packs them (what a layer's own saved-tensor hooks rebuild in the
    backward is not counted; what they keep as it is is): the op that produced each, shape, dtype, bytes per token and
    channel (per storage: a saved view keeps its whole storage; the first one names it)."""
    block, width = model.blocks[1], model.config.hidden_size
    grid = (px // 16, px // 16)
    n = grid[0] * grid[1]
    x = torch.randn(1, n, width, dtype=torch.bfloat16)  # the patch embedding's output under autocast
    c = torch.randn(1, width) if model.shared_modulation is None else torch.randn(1, 6, width, dtype=torch.bfloat16)
    saved = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if n in t.shape:
            storage = t.untyped_storage()
            saved.setdefault(
                storage.data_ptr(),
                {
                    "made_by": t.grad_fn.name() if t.grad_fn is not None else "block input or no-grad output",
                    "shape": list(t.shape),
                    "dtype": str(t.dtype).removeprefix("torch."),
                    "bytes_per_token_channel": storage.nbytes() / n / width,
                },
            )
        return t

    hooks = torch.autograd.graph.saved_tensors_hooks

    def passing_on(inner_pack, inner_unpack):
        """A layer's own hooks hide what they pack from the outer ones: what they keep as it is is counted here."""

        def chained(t):
            packed = inner_pack(t)
            return pack(t) if packed is t else packed

        return hooks(chained, inner_unpack)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.no_grad():
            x = model.blocks[0](x, c, grid)  # the residual stream in the dtype the blocks give it
        torch.autograd.graph.saved_tensors_hooks = passing_on
        try:
            with hooks(pack, lambda t: t):
                block(x.requires_grad_(), c, grid)
        finally:
            torch.autograd.graph.saved_tensors_hooks = hooks
    return sorted(saved.values(), key=lambda r: -r["bytes_per_token_channel"])


def costs(attention: str, size: str, px: int, kernels: bool) -> dict:
    """The numbers of one attention (module docstring); ``kernels``: the saved tensors of the fused kernels."""
    torch.manual_seed(0)
    model = build_dit(attention, size, px).train()
    with kernels_on_cpu(kernels):
        saved = saved_per_token(model, px)
    return {
        "attention": attention,
        "depth": len(model.blocks),
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "block_params_m": sum(p.numel() for p in model.blocks.parameters()) / 1e6,
        "linears": linear_layers(model.blocks[0]),
        "gflop_per_image": step_flops(model, px),
        "saved": saved,
        "saved_bytes_per_token_channel": sum(r["bytes_per_token_channel"] for r in saved),
    }


def linear_gflop(result: dict) -> float:
    """GFLOP per image of the Linear layers (mm and addmm) of one ``costs`` result."""
    return result["gflop_per_image"].get("mm", 0) + result["gflop_per_image"].get("addmm", 0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="b", choices=("s", "b", "l", "xl"))
    p.add_argument(
        "--px", type=int, default=192, help="image size (latent px / 8; 192: 144 tokens, a count no weight dim has)"
    )
    p.add_argument("--attentions", nargs="+", default=list(DIT_ATTENTIONS))
    p.add_argument("--plain", action="store_true", help="count the PyTorch references' saved tensors, not the kernels'")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    if args.px % 16:
        p.error(f"--px must be a multiple of 16 (patch 2 on the latent of px / 8), got {args.px}")
    results = [costs(a, args.size, args.px, not args.plain) for a in args.attentions]
    base = results[0]
    base_gemm = linear_gflop(base)
    for r in results:
        gemm = linear_gflop(r)
        per_model = r["saved_bytes_per_token_channel"] * r["depth"]
        print(
            f"\n{r['attention']}: depth {r['depth']}, {r['params_m']:.1f} M parameters ({r['block_params_m']:.1f} M in "
            f"blocks); Linear GFLOP per image {gemm:.1f} ({gemm / base_gemm:.2f}x {base['attention']}), bmm "
            f"{r['gflop_per_image'].get('bmm', 0):.1f}; saved for backward {r['saved_bytes_per_token_channel']:.2f} "
            f"B per token and channel per block, {per_model:.0f} over the blocks "
            f"({per_model / (base['saved_bytes_per_token_channel'] * base['depth']):.2f}x {base['attention']})"
        )
        for layer in r["linears"]:
            print(f"  linear {layer['name']:14s} {str(layer['weight']):14s} per {layer['per']}")
        for s in r["saved"]:
            print(f"  saved {s['bytes_per_token_channel']:6.2f} {s['made_by']:48.48s} {s['dtype']} {s['shape']}")
    if args.out:
        with open(args.out, "w") as f:
            env = script_env(argv)
            json.dump({"env": env, "args": vars(args), "models": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
