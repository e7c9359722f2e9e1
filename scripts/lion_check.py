"""GPU correctness sweep of the LION kernels against the fp64 reference (``python scripts/lion_check.py``).

Forward and every gradient (q, k, v, log-decay / gates) as relative L2 errors vs lightvision.ops in fp64 on
upcast inputs, fresh random inputs per case, every kernel output NaN-poisoned. Cases: N in {50, 197, 577,
1024, 4096} (197 / 577 with a cls token, 221 = a 13 x 17 grid), B = 1 and 2, H = 1 and 3, d = 64 and 48,
fp32 and bf16, LIT / D / S, weak (lambda ~ 0.98) and strong (lambda ~ 0.5) decay, both kernel forms;
then the packed layer core (lion_attention_qkvpacked from raw qkv, phi inside; N in {50, 197, 577}, H = 6, d = 64,
both forms), snake orders on 13 x 17 + cls and the two-scan baseline. docs/spec.md 2 tolerances; D's per-head decay
gradient is measured against the summed magnitudes of its per-token terms (tests/kernels/test_lion_kernel.py).
Writes JSON with --out; exit status 1 when a case fails.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

from lightvision.kernels import _launch
from lightvision.kernels.lion import scan
from lightvision.ops import lion_attention, lion_attention_qkvpacked, lion_snake_attention, two_scan_attention
from lightvision.tools.results import results_env

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _rel(a, b, scale=None):
    if not torch.isfinite(a).all():
        return float("nan")
    return ((a.double() - b).norm() / (b.norm() if scale is None else scale)).item()


def _record(rows: list, case, n, prefix, b, h, d, dtype, mask, decay, form, errs, ok, **extra) -> None:
    """Append one case's row (its errors after the case fields and ``extra``) and print it (``_show``)."""
    rows.append(
        dict(case=case, N=n, prefix=prefix, B=b, H=h, d=d, dtype=str(dtype)[6:], mask=mask, decay=decay, form=form)
        | extra
        | errs
        | dict(ok=ok)
    )
    _show(rows[-1])


def _show(row: dict) -> None:
    """Print one case as soon as it is done (a run cut off by a time limit still reports what it did)."""
    errs = " ".join(f"{k}={v:.1e}" for k, v in row.items() if isinstance(v, float))
    head = " ".join(f"{k}={row[k]}" for k in ("case", "N", "B", "H", "d", "dtype", "mask", "decay", "form")) + (
        " sequential" if row.get("sequential") else ""
    )
    print(f"{head} {errs} {'ok' if row['ok'] else 'FAIL'}", flush=True)


def _case(fn, tensors, d_mass_fn=None, names=("y", "dq", "dk", "dv", "dlog", "dlog2")):
    """Errors of fn(*tensors, backend='triton') vs fn in fp64 (backend='torch'): outputs and all grads, named by
    names; the one named "dlog" is measured against d_mass_fn(upstream) when given (D's per-head gradient)."""
    leaves = [t.detach().requires_grad_() for t in tensors]
    out = fn(*leaves, backend="triton")
    ups = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, ups)
    ref_leaves = [t.detach().double().requires_grad_() for t in tensors]
    ref = fn(*ref_leaves, backend="torch")
    ref_grads = torch.autograd.grad(ref, ref_leaves, ups.double())
    errs = {}
    for n, a, b in zip(names, (out, *grads), (ref, *ref_grads)):
        scale = d_mass_fn(ups) if (n == "dlog" and d_mass_fn is not None) else None
        errs[n] = _rel(a, b, scale)
    return errs


def _d_mass(run, ld, b, n, ups):
    """Norm over heads of the summed |per-token gradient| of D run as S with constant gates (fp64): run(g) is the
    reference output for per-token gates g [B, H, N] (here ld [H] expanded)."""
    g = ld.detach().double()[None, :, None].expand(b, ld.shape[0], n).clone().requires_grad_()
    (dg,) = torch.autograd.grad(run(g), g, ups.double())
    return dg.abs().sum((0, 2)).norm()


def _log_decay(mask, strength, b, h, n, prefix, dev):
    """Random log-decays: None (LIT), [H] (D) or [B, H, N] (S, prefix gates 1); weak lambda ~ 0.98, strong ~ 0.5."""
    shift = 4.0 if strength == "weak" else 0.0
    if mask == "d":
        return F.logsigmoid(0.5 * torch.randn(h, device=dev) + shift)
    if mask == "s":
        ld = F.logsigmoid(torch.randn(b, h, n, device=dev) + shift)
        ld[..., :prefix] = 0.0
        return ld
    return None


def _packed_cases(dev: str, max_n: int, sizes: set[int]) -> list[dict]:
    """The packed layer core on raw qkv against phi + lion_attention + merge_heads in fp64 (N <= ``max_n``, and in
    ``sizes`` when given)."""
    rows = []
    for n, prefix, b in ((50, 0, 2), (197, 1, 2), (577, 1, 1)):
        if n > max_n or (sizes and n not in sizes):
            continue
        h, d = 6, 64
        for dtype in (torch.float32, torch.bfloat16):
            for mask in ("lit", "d", "s"):
                for strength in ("weak", "strong") if mask != "lit" else ("-",):
                    for form in ("parallel", "scan"):
                        qkv = torch.randn(b, n, 3 * h * d, device=dev).to(dtype)
                        ld = _log_decay(mask, strength, b, h, n, prefix, dev)

                        def fn(qkv, *ld, backend, mask=mask, form=form):
                            return lion_attention_qkvpacked(
                                qkv, h, mask=mask, log_decay=ld[0] if ld else None, form=form, backend=backend
                            )

                        def run(g, qkv=qkv):
                            return lion_attention_qkvpacked(qkv.double(), h, mask="s", log_decay=g, backend="torch")

                        mass = (lambda ups, run=run, ld=ld: _d_mass(run, ld, b, n, ups)) if mask == "d" else None
                        errs = _case(fn, (qkv,) if ld is None else (qkv, ld), mass, names=("y", "dqkv", "dlog"))
                        ok = all(e < TOL[dtype] for e in errs.values())
                        _record(rows, "packed", n, prefix, b, h, d, dtype, mask, strength, form, errs, ok)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="")
    ap.add_argument("--max-n", type=int, default=1 << 30, help="only cases with N <= this (CPU smoke runs)")
    ap.add_argument(
        "--sizes",
        default="",
        help="comma list of N: only these LION and packed cases (default: all); several "
        "processes with disjoint sizes share the Triton compile work of a fresh machine",
    )
    ap.add_argument("--no-extras", action="store_true", help="skip the snake-order and two-scan cases")
    ap.add_argument("--packed-only", action="store_true", help="only the packed layer-core cases")
    args = ap.parse_args(argv)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    _launch.POISON_OUTPUTS = True
    default_pairs = scan.SEQUENTIAL_MIN_PAIRS
    rows = []
    # (N, prefix, B, H, d, sequential): the scan builds its states in one sequential pass from
    # scan.SEQUENTIAL_MIN_PAIRS (b, h) pairs on; the cases marked sequential lower that to 1 so that small
    # batches take that path too (the fp64 reference of a batch big enough to reach it is slow)
    cases = [
        (50, 0, 2, 3, 64, False),
        (197, 1, 1, 3, 64, False),
        (221, 0, 1, 1, 48, False),
        (577, 1, 2, 1, 64, False),
        (577, 1, 2, 3, 64, True),
        (1024, 0, 1, 3, 64, False),
        (1024, 0, 1, 3, 64, True),
        (4096, 0, 1, 1, 64, False),
    ]
    sizes = {int(x) for x in args.sizes.split(",") if x}
    rows += _packed_cases(dev, args.max_n, sizes)
    if args.packed_only:
        cases, args.no_extras = [], True
    for n, prefix, b, h, d, sequential in [c for c in cases if c[0] <= args.max_n and (not sizes or c[0] in sizes)]:
        scan.SEQUENTIAL_MIN_PAIRS = 1 if sequential else default_pairs
        for dtype in (torch.float32, torch.bfloat16):
            for mask in ("lit", "d", "s"):
                for strength in ("weak", "strong") if mask != "lit" else ("-",):
                    for form in ("parallel", "scan"):
                        q = F.normalize(F.silu(torch.randn(b, h, n, d, device=dev)) + 0.5, dim=-1).to(dtype)
                        k = F.normalize(F.silu(torch.randn(b, h, n, d, device=dev)) + 0.5, dim=-1).to(dtype)
                        v = torch.randn(b, h, n, d, device=dev).to(dtype)
                        ld = _log_decay(mask, strength, b, h, n, prefix, dev)

                        def fn(q, k, v, *ld, backend, mask=mask, form=form):
                            return lion_attention(
                                q, k, v, mask=mask, log_decay=ld[0] if ld else None, form=form, backend=backend
                            )

                        tensors = (q, k, v) if ld is None else (q, k, v, ld)

                        def run(g, q=q, k=k, v=v):
                            return lion_attention(
                                q.double(), k.double(), v.double(), mask="s", log_decay=g, backend="torch"
                            )

                        mass = (lambda ups, run=run, ld=ld: _d_mass(run, ld, b, n, ups)) if mask == "d" else None
                        errs = _case(fn, tensors, mass)
                        ok = all(e < TOL[dtype] for e in errs.values())  # NaN fails
                        _record(
                            rows, "lion", n, prefix, b, h, d, dtype, mask, strength, form, errs, ok,
                            sequential=sequential and form == "scan",
                        )  # fmt: skip
    scan.SEQUENTIAL_MIN_PAIRS = default_pairs
    grid, prefix = (13, 17), 1
    n = grid[0] * grid[1] + prefix
    for dtype in (torch.float32, torch.bfloat16) if not args.no_extras else ():
        for mask in ("d", "s"):
            q = F.normalize(F.silu(torch.randn(2, 3, n, 64, device=dev)) + 0.5, dim=-1).to(dtype)
            k = F.normalize(F.silu(torch.randn(2, 3, n, 64, device=dev)) + 0.5, dim=-1).to(dtype)
            v = torch.randn(2, 3, n, 64, device=dev).to(dtype)
            if mask == "d":
                lr, lc = F.logsigmoid(torch.randn(3, device=dev) + 3), F.logsigmoid(torch.randn(3, device=dev) + 1)
            else:
                lr, lc = (
                    F.logsigmoid(torch.randn(2, 3, n, device=dev) + 3),
                    F.logsigmoid(torch.randn(2, 3, n, device=dev)),
                )
                lr[..., 0] = lc[..., 0] = 0.0

            def snake(q, k, v, lr, lc, backend, mask=mask):
                return lion_snake_attention(
                    q, k, v, grid=grid, num_prefix_tokens=prefix, mask=mask, log_decay_row=lr, log_decay_col=lc,
                    backend=backend,
                )  # fmt: skip

            errs = _case(snake, (q, k, v, lr, lc))
            errs = {{"dlog": "dlog_row", "dlog2": "dlog_col"}.get(kk, kk): e for kk, e in errs.items()}
            # per-head D gradients cancel (see _d_mass): reported, not judged, for the snake D case
            ok = all(e < TOL[dtype] for kk, e in errs.items() if mask == "s" or not kk.startswith("dlog"))
            _record(rows, "snake", n, prefix, 2, 3, 64, dtype, mask, "mixed", "auto", errs, ok)
    nt = min(1024, args.max_n)
    for per_token in (False, True) if not args.no_extras else ():
        q = F.normalize(F.silu(torch.randn(1, 3, nt, 64, device=dev)) + 0.5, dim=-1)
        k = F.normalize(F.silu(torch.randn(1, 3, nt, 64, device=dev)) + 0.5, dim=-1)
        v = torch.randn(1, 3, nt, 64, device=dev)
        ld = (
            F.logsigmoid(torch.randn(1, 3, nt, device=dev) + 2)
            if per_token
            else F.logsigmoid(torch.randn(3, device=dev) + 2)
        )

        def two(q, k, v, ld, backend):
            return two_scan_attention(q, k, v, ld, backend=backend)

        def run(g, q=q, k=k, v=v):
            return two_scan_attention(q.double(), k.double(), v.double(), g, backend="torch")

        mass = None if per_token else (lambda ups, run=run, ld=ld: _d_mass(run, ld, 1, nt, ups))
        errs = _case(two, (q, k, v, ld), mass)
        mask = "s" if per_token else "d"
        ok = all(e < 1e-5 for e in errs.values())
        _record(rows, "two_scan", nt, 0, 1, 3, 64, torch.float32, mask, "medium", "scan", errs, ok)
    _launch.POISON_OUTPUTS = False
    worst = {}
    for r in rows:
        key = (r["case"], r["dtype"], r["form"])
        w = worst.setdefault(key, {"n": 0, "fail": 0})
        w["n"] += 1
        w["fail"] += not r["ok"]
        for kk, e in r.items():
            if kk in ("y", "dq", "dk", "dv", "dqkv", "dlog", "dlog_row", "dlog_col"):
                w[kk] = max(w.get(kk, 0.0), e) if e == e else float("nan")
    print("worst relative L2 error per (case, dtype, form):")
    for key, w in worst.items():
        print(
            f"  {key[0]:8s} {key[1]:8s} {key[2]:8s} cases={w['n']:3d} fail={w['fail']:2d} "
            + " ".join(
                f"{kk}={w[kk]:.1e}" for kk in ("y", "dq", "dk", "dv", "dqkv", "dlog", "dlog_row", "dlog_col") if kk in w
            )
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                dict(env=results_env(" ".join(["python scripts/lion_check.py", *sys.argv[1:]])), checks=rows),
                f,
                indent=1,
            )
    return 1 if any(not r["ok"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
