"""Attention-core benchmark: a registry of (op, impl) implementations timed over docs/spec.md 4 shapes.

    python3 scripts/bench_attention.py [--check [--check-d 64,128]] [--ops lightnet,softmax]
                                       [--impls triton,sdpa] [--shapes 196x256,4096x12] [--modes fwd,fwdbwd]
                                       [--sweep 196x256,65536x1] [--out FILE.json]

Registry API (for kernel families that plug in): ``REGISTRY`` maps (op, impl) -> make, where

    make(B, H, N, d, dtype, device) -> (fn, inputs)

builds everything for one shape: ``inputs`` is a list of tensors (the differentiable ones: q, k, v and any
learnable per-head parameters) and ``fn(*inputs)`` runs the core and returns its output tensor. The
runner times ``fn(*inputs)`` under no_grad ("fwd") and ``fn(*inputs).backward(dO)`` with the inputs
requiring grad ("fwdbwd"), medians of ``triton.testing.do_bench``. A module registers more entries with

    def register(add):                      # add(op=..., impl=..., make=...)
        add(op="lion_d", impl="triton_scan", make=make_lion_d_scan)

This script calls ``register(add)`` of its neighbour ``scripts/bench_lion.py`` (which also registers
flash-linear-attention, ``fla``, an optional benchmark-only dependency, as the two-scan anchor when installed).
op in softmax / lightnet / lion_lit / lion_d / lion_s / normalized; impl names the implementation (sdpa, torch,
triton...; ``triton_packed``: LightNet on one fused qkv tensor, the models' path, where small heads share a program).

Memory floor: the forward reads q, k, v and writes o (4 tensors of B*H*N*d elements at d = d_v), the
forward + backward touches 11 (q, k, v, o; then q, k, v, dO read, dq, dk, dv written); each record
carries the achieved GB/s against that count and the floor time at the --peak-gbs copy bandwidth, for
eager calls ("ms", do_bench) and CUDA-graph replays ("ms_graph", do_bench_cudagraph: no host overhead).

--check first runs the Triton LightNet kernel against the fp64 reference (forward and dq, dk, dv, relative
L2 error, outputs NaN-poisoned beforehand) on image grids with and without a cls token (CHECK_CASES,
--check-d keeps the cases of the listed head dims), as one (b, h), fused-qkv views, and B*H = 288 (the
kernel's fused plan on an H100; N <= 1024); each row names the plan that ran. --sweep also times the kernel's
launch-plan variants
(SWEEP) at the listed shapes.
Results: JSON {"env": {gpu, torch, triton, command, date}, "checks": [...], "records": [...]} with a
table printed last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
import triton

from lightvision.tools.results import results_env

REGISTRY: dict[tuple[str, str], object] = {}

# docs/spec.md 4: (N, B) at about 50k tokens, H = 6, d = 64 (--head-dim changes d, H = 384 / d); square patch grids, no
# prefix token
SHAPES = [(196, 256), (576, 96), (1024, 48), (4096, 12), (16384, 3), (65536, 1)]
H, D = 6, 64

# --check cases: (grid, prefix tokens, head dim, dtypes); N = prod(grid) + prefix
_ALL = (torch.float32, torch.bfloat16, torch.float16)
_TWO = (torch.float32, torch.bfloat16)
CHECK_CASES = [
    ((7, 7), 1, 64, _ALL),
    ((14, 14), 1, 64, _ALL),
    ((24, 24), 1, 64, _ALL),
    ((32, 32), 0, 64, _TWO),
    ((64, 64), 0, 64, _ALL),
    ((13, 17), 0, 64, _TWO),
    ((256, 256), 0, 64, _TWO),
    ((13, 17), 1, 48, _TWO),
    ((14, 14), 1, 24, _TWO),
    ((24, 24), 1, 128, _TWO),
    ((7, 7), 1, 16, _TWO),
    ((24, 24), 1, 32, _TWO),
    ((16, 16), 0, 72, _TWO),
    ((64, 64), 0, 72, _TWO),
]


def add(op: str, impl: str, make) -> None:
    """Register ``make(B, H, N, d, dtype, device) -> (fn, inputs)`` under (op, impl)."""
    REGISTRY[(op, impl)] = make


def _qkv(B, H, N, d, dtype, device):
    return [torch.randn(B, H, N, d, device=device, dtype=dtype) for _ in range(3)]


def _grid(N):
    side = math.isqrt(N)
    return (side, side) if side * side == N else (N,)


def make_sdpa(B, H, N, d, dtype, device):
    """Softmax attention through SDPA's default dispatch, the fastest backend the machine has (cuDNN on Hopper)."""

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    return fn, _qkv(B, H, N, d, dtype, device)


def _make_lightnet(backend):
    def make(B, H, N, d, dtype, device):
        from lightvision.ops.lightnet import lightnet_attention

        grid = _grid(N)

        def fn(q, k, v):
            return lightnet_attention(q, k, v, grid=grid, backend=backend)

        return fn, _qkv(B, H, N, d, dtype, device)

    return make


def make_lightnet_packed(B, H, N, d, dtype, device):
    """The model's path: one fused qkv projection output [B, N, 3 * H * d] (small heads run several to a program)."""
    from lightvision.ops.lightnet import lightnet_attention_qkvpacked

    grid = _grid(N)

    def fn(qkv):
        return lightnet_attention_qkvpacked(qkv, H, grid=grid, backend="triton")

    return fn, [torch.randn(B, N, 3 * H * d, device=device, dtype=dtype)]


def make_lightnet_value_halves(B, H, N, d, dtype, device):
    """LightNet with the value columns in two halves, q and k shared: two kernel calls whose states are [2d, d / 2]
    (with MD-LRPE) instead of one [2d, d], outputs concatenated; the same values (each column of o reads only its own
    column of v). For wide heads (d = 128), whose one-call state is 128 KB of fp32 a program."""
    from lightvision.ops.lightnet import lightnet_attention

    grid = _grid(N)

    def fn(q, k, v):
        half = v.shape[-1] // 2
        parts = [
            lightnet_attention(q, k, v[..., s], grid=grid, backend="triton") for s in (slice(half), slice(half, None))
        ]
        return torch.cat(parts, -1)

    return fn, _qkv(B, H, N, d, dtype, device)


def make_normalized(B, H, N, d, dtype, device):
    """Normalized attention's fast form, q (K^T V) / eta (two batched matmuls), with a fp32 log-normaliser input."""
    from lightvision.ops.normalized import normalized_attention

    def fn(q, k, v, log_eta):
        return normalized_attention(q, k, v, log_eta)

    log_eta = torch.full((B, H, N), math.log(N), device=device) + torch.randn(B, H, N, device=device)
    return fn, [*_qkv(B, H, N, d, dtype, device), log_eta]


add("softmax", "sdpa", make_sdpa)
add("lightnet", "torch", _make_lightnet("torch"))
add("lightnet", "triton", _make_lightnet("triton"))
add("lightnet", "triton_packed", make_lightnet_packed)
add("lightnet", "triton_value_halves", make_lightnet_value_halves)
add("normalized", "torch", make_normalized)


def _load_plugins() -> None:
    import bench_lion  # scripts/ (this script's folder) is on sys.path

    bench_lion.register(add)


def check_lightnet(device, head_dims=()) -> list[dict]:
    """Triton LightNet vs the fp64 reference: forward and all gradients, fresh inputs, poisoned outputs."""
    from lightvision.kernels import _launch
    from lightvision.kernels.lightnet import op as lop
    from lightvision.ops.lightnet import lightnet_attention

    _launch.POISON_OUTPUTS = True
    tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}
    rows = []
    for grid, prefix, d, dtypes in CHECK_CASES:
        if head_dims and d not in head_dims:
            continue
        for dtype in dtypes:
            for layout in ("contiguous", "fused_qkv", "batched"):
                n = math.prod(grid) + prefix
                if layout == "fused_qkv" and (dtype == torch.float16 or d != 64):
                    continue
                if layout == "batched" and n > 1024:
                    continue
                if layout == "contiguous":
                    q, k, v = _qkv(1, 1, n, d, dtype, device)
                elif layout == "batched":  # B*H = 288 >= 2 per SM on an H100: the kernel's fused plan (d <= 64)
                    q, k, v = _qkv(48, 6, n, d, dtype, device)
                else:  # slices of one [B, N, 3, H, d] projection, strided
                    q, k, v = torch.randn(2, n, 3, 2, d, device=device, dtype=dtype).permute(2, 0, 3, 1, 4)
                k = k * 2
                leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                o = lightnet_attention(*leaves, grid=grid, num_prefix_tokens=prefix, backend="triton")
                do = torch.randn_like(o)
                grads = torch.autograd.grad(o, leaves, do)
                ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
                o_ref = lightnet_attention(*ref, grid=grid, num_prefix_tokens=prefix, backend="torch")
                ref_grads = torch.autograd.grad(o_ref, ref, do.double())
                errs = {}
                for name, a, b in zip(("o", "dq", "dk", "dv"), (o, *grads), (o_ref, *ref_grads)):
                    fin = bool(torch.isfinite(a).all())
                    errs[name] = ((a.double() - b).norm() / b.norm()).item() if fin else float("nan")
                ok = all(e < tol[dtype] for e in errs.values())  # NaN fails
                fused = lop._plan(n, q.shape[0] * q.shape[1], d, d, device, dtype == torch.float32)["fused"]
                plan = "fused" if fused else "split"
                rows.append(
                    dict(
                        grid=list(grid),
                        prefix=prefix,
                        N=n,
                        d=d,
                        dtype=str(dtype).split(".")[-1],
                        layout=layout,
                        plan=plan,
                        **errs,
                        ok=ok,
                    )
                )
                print(
                    f"check {layout:10s} {plan} grid={grid!s:10s} +{prefix} N={n:6d} d={d:3d} {rows[-1]['dtype']:8s} "
                    + " ".join(f"{k}={e:.1e}" for k, e in errs.items())
                    + ("  ok" if ok else "  FAIL")
                )
    _launch.POISON_OUTPUTS = False
    return rows


def _timed(bench_fn, run, **kw) -> float:
    try:
        return bench_fn(run, **kw)
    except (torch.OutOfMemoryError, RuntimeError) as e:
        print(f"  timing failed: {type(e).__name__}: {str(e).splitlines()[0]}")
        torch.cuda.synchronize()
        return float("nan")


def bench(ops, impls, shapes, modes, dtype, device, peak_gbs, graphs=True, saved=None) -> list[dict]:
    """Median ms per call: "ms" from do_bench (eager: host launch overhead included when it exceeds the
    GPU time), "ms_graph" from do_bench_cudagraph (the calls replayed from a CUDA graph: device time).
    ``saved(records)`` runs after every timing, so a run stopped part way keeps what it measured."""
    records = []
    for (op, impl), make in REGISTRY.items():
        if (ops and op not in ops) or (impls and impl not in impls):
            continue
        for N, B in shapes:
            fn, inputs = make(B, H, N, D, dtype, device)
            elem = inputs[0].element_size()
            for mode in modes:
                case = dict(op=op, impl=impl, B=B, H=H, N=N, d=D, dtype=str(dtype).split(".")[-1], mode=mode)
                if mode == "fwd":

                    def run():
                        with torch.no_grad():
                            fn(*inputs)  # noqa: F821  (bound in this iteration; deleted after it)

                    tensors = 4
                else:
                    for t in inputs:
                        t.requires_grad_(True)
                    try:
                        out = fn(*inputs)
                    except torch.OutOfMemoryError as e:  # recorded as a failed timing (ms NaN), not a crash
                        print(f"{op:8s} {impl:12s} N={N:6d} B={B:4d} {mode:6s} out of memory: {str(e).splitlines()[0]}")
                        torch.cuda.empty_cache()
                        records.append(dict(case, ms=float("nan"), ms_graph=float("nan"), oom=True))
                        continue
                    dout = torch.randn_like(out)
                    del out

                    def run():
                        fn(*inputs).backward(dout)  # noqa: F821  (bound in this iteration; deleted after it)

                    tensors = 11
                ms = _timed(
                    triton.testing.do_bench,
                    run,
                    warmup=25,
                    rep=100,
                    return_mode="median",
                    grad_to_none=inputs if mode == "fwdbwd" else None,
                )
                ms_graph = (
                    _timed(
                        triton.testing.do_bench_cudagraph,
                        run,
                        rep=50,
                        return_mode="median",
                        grad_to_none=inputs if mode == "fwdbwd" else None,
                    )
                    if graphs
                    else float("nan")
                )
                nbytes = tensors * B * H * N * D * elem
                floor_ms = nbytes / (peak_gbs * 1e9) * 1e3
                records.append(
                    dict(
                        case,
                        ms=ms,
                        ms_graph=ms_graph,
                        gbs=nbytes / (ms * 1e-3) / 1e9,
                        gbs_graph=nbytes / (ms_graph * 1e-3) / 1e9,
                        floor_ms=floor_ms,
                        x_floor=ms / floor_ms,
                        x_floor_graph=ms_graph / floor_ms,
                    )
                )
                print(f"{op:8s} {impl:12s} N={N:6d} B={B:4d} {mode:6s} {ms:8.3f} ms  graph {ms_graph:8.3f} ms")
                if saved is not None:
                    saved(records)
            del fn, inputs
            torch.cuda.empty_cache()
    return records


# --sweep: launch-plan variants of the Triton LightNet kernel (keyword knobs of kernels.lightnet.op._plan)
SWEEP = [
    dict(block_n=32, num_warps=4),
    dict(block_n=32, num_warps=2),
    dict(block_n=64, num_warps=4),
    dict(block_n=64, num_warps=8),
    dict(block_n=128, num_warps=8),
    dict(splits=2),
    dict(splits=3),
    dict(splits=4),
    dict(splits=8),
]


def sweep(shapes, dtype, device, peak_gbs) -> list[dict]:
    """Time lightnet/triton fwd+bwd under each SWEEP plan variant (impl named triton[knob=value]), eager
    and CUDA-graph replays."""
    import functools

    from lightvision.kernels.lightnet import op as lop

    base = lop._plan
    records = []
    try:
        for knobs in SWEEP:
            lop._plan = functools.lru_cache(maxsize=64)(functools.partial(base.__wrapped__, **knobs))
            lop._config.cache_clear()
            name = "triton[" + ",".join(f"{k}={v}" for k, v in knobs.items()) + "]"
            add("lightnet", name, _make_lightnet("triton"))
            records += bench({"lightnet"}, {name}, shapes, ["fwdbwd"], dtype, device, peak_gbs)
            del REGISTRY[("lightnet", name)]
    finally:
        lop._plan = base
        lop._config.cache_clear()
    return records


def table(records) -> str:
    keys = sorted({(r["op"], r["impl"]) for r in records})
    shapes = sorted({(r["N"], r["B"]) for r in records})
    lines = []
    for mode in ("fwd", "fwdbwd"):
        for ms_key, x_key, label in (("ms", "x_floor", "eager"), ("ms_graph", "x_floor_graph", "graph")):
            by = {(r["op"], r["impl"], r["N"], r["B"]): r for r in records if r["mode"] == mode}
            if not any(r[ms_key] == r[ms_key] for r in by.values()):
                continue
            lines.append(
                f"[{mode}, {label}] ms (x memory floor)      " + " ".join(f"{f'N={n}/B={b}':>16s}" for n, b in shapes)
            )
            for op, impl in keys:
                cells = []
                for n, b in shapes:
                    r = by.get((op, impl, n, b))
                    ok = r is not None and r[ms_key] == r[ms_key]
                    cells.append(f"{r[ms_key]:8.3f} ({r[x_key]:4.1f}x)" if ok else "-")
                lines.append(f"{op + '/' + impl:36s} " + " ".join(f"{c:>16s}" for c in cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    global H, D
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="run the correctness checks first")
    ap.add_argument("--check-d", default="", help="comma list of head dims to check (default: all cases)")
    ap.add_argument("--ops", default="", help="comma list of ops (default: all)")
    ap.add_argument("--impls", default="", help="comma list of impls (default: all)")
    ap.add_argument("--shapes", default="", help="comma list of NxB (default: docs/spec.md 4 shapes)")
    ap.add_argument("--modes", default="fwd,fwdbwd")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--peak-gbs", type=float, default=3000.0, help="copy bandwidth for the floor (H100: 3000)")
    ap.add_argument("--sweep", default="", help="comma list of NxB: also time the SWEEP plan variants there")
    ap.add_argument(
        "--head-dim",
        type=int,
        default=D,
        help="d of the timed shapes, with H = 384 / d heads (default 64: docs/spec.md 4; LightNet-DeiT-S: 24)",
    )
    ap.add_argument(
        "--heads",
        type=int,
        default=0,
        help="H of the timed shapes (default 384 / d; LightNet-DiT-XL/2: --head-dim 72 --heads 16)",
    )
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    if not args.heads and 384 % args.head_dim:
        ap.error(f"--head-dim must divide 384 unless --heads is given, got {args.head_dim}")
    H, D = args.heads or 384 // args.head_dim, args.head_dim
    if not torch.cuda.is_available():
        print("bench_attention: needs a CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    _load_plugins()
    split = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    shapes = [tuple(int(x) for x in s.split("x")) for s in split(args.shapes)] or SHAPES
    checks = check_lightnet(device, {int(x) for x in split(args.check_d)}) if args.check else []
    env = results_env(" ".join(["python3", *sys.argv]))

    def save(records: list[dict]) -> None:
        """The results so far to --out, replaced atomically (a run stopped mid-write keeps the last whole file)."""
        if args.out:
            with open(args.out + ".tmp", "w") as f:
                json.dump(dict(env=env, checks=checks, records=records), f, indent=1)
            os.replace(args.out + ".tmp", args.out)

    records = bench(
        set(split(args.ops)),
        set(split(args.impls)),
        shapes,
        split(args.modes),
        getattr(torch, args.dtype),
        device,
        args.peak_gbs,
        saved=save,
    )
    sweep_shapes = [tuple(int(x) for x in s.split("x")) for s in split(args.sweep)]
    if sweep_shapes:
        records += sweep(sweep_shapes, getattr(torch, args.dtype), device, args.peak_gbs)
    save(records)
    if checks:
        bad = [c for c in checks if not c["ok"]]
        print(f"checks: {len(checks) - len(bad)}/{len(checks)} passed" + "".join(f"\n  FAIL {c}" for c in bad))
    print(table(records))
    return 1 if any(not c["ok"] for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
