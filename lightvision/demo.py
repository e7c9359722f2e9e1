"""``lightvision demo``: every attention core on a real photo's patch grid, checking that equivalent forms agree."""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from .ops import lightnet_attention, lion_attention, lion_snake_attention, md_tpe, normalized_attention

GRID = (12, 17)  # non-square patch grid
PATCH = 8
TOL_FP32 = 1e-5


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative L2 error ||a - b|| / ||b||, in fp64."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def _image_tokens(device: torch.device) -> torch.Tensor:
    """china.jpg (scikit-learn's bundled photo) resized to 12x17 patches of 8x8 px -> [1, 1 + 204, 192] with a
    mean 'cls' token first."""
    from sklearn.datasets import load_sample_image

    img = torch.tensor(load_sample_image("china.jpg")).permute(2, 0, 1)[None].float() / 255.0
    img = F.interpolate(img, size=(GRID[0] * PATCH, GRID[1] * PATCH), mode="bilinear", align_corners=False)
    patches = F.unfold(img, kernel_size=PATCH, stride=PATCH).transpose(1, 2)  # [1, 204, 3*8*8]
    patches = (patches - patches.mean()) / patches.std()
    return torch.cat([patches.mean(1, keepdim=True), patches], 1).to(device)


def run_demo(device: str = "cpu") -> int:
    """Run the checks, print a table (check, max relative L2 error, PASS/FAIL); return 0 if all pass, else 1.
    device: "auto", "cpu", "cuda" or "cuda:N"."""
    from lightvision.engine.device import resolve_device

    dev = torch.device(resolve_device(device))
    t0 = time.time()
    gen = torch.Generator().manual_seed(0)
    tokens = _image_tokens(dev)  # [1, N, 192]
    b, h, d = 2, 3, 16
    n = tokens.shape[1]
    x = torch.cat([tokens, tokens.flip(1)], 0)  # B = 2: the photo in raster and reversed order

    def project(scale: float = 1.0) -> torch.Tensor:
        w = torch.randn(tokens.shape[-1], h * d, generator=gen).to(dev) * scale / tokens.shape[-1] ** 0.5
        return (x @ w).view(b, n, h, d).transpose(1, 2).contiguous()

    q_raw, k_raw, v = project(), project(), project()
    q_fm = F.normalize(F.silu(q_raw) + 0.5, dim=-1)
    k_fm = F.normalize(F.silu(k_raw) + 0.5, dim=-1)
    q_lit, k_lit = F.elu(q_raw) + 1, F.elu(k_raw) + 1
    prefix = torch.arange(n, device=dev) < 1
    log_d = F.logsigmoid(torch.linspace(2.0, 4.0, h, device=dev))  # lambda in ~[0.88, 0.98]
    log_s = F.logsigmoid(-project(0.5).mean(-1) + 2.5).masked_fill(prefix, 0.0)  # [B, H, N]
    log_s2 = F.logsigmoid(-project(0.5).mean(-1) + 2.0).masked_fill(prefix, 0.0)

    rows: list[tuple[str, float, float]] = []
    for mask, qq, kk, ld in (("lit", q_lit, k_lit, None), ("d", q_fm, k_fm, log_d), ("s", q_fm, k_fm, log_s)):
        ref = lion_attention(qq, kk, v, mask=mask, log_decay=ld, form="parallel")
        err = max(
            _rel(lion_attention(qq, kk, v, mask=mask, log_decay=ld, form=f, chunk_size=32), ref)
            for f in ("chunk", "recurrent", "scan")
        )
        rows.append((f"LION-{mask.upper()}: chunk / recurrent / scan vs parallel", err, TOL_FP32))
    for mask, ld_r, ld_c in (("d", log_d, log_d.flip(0)), ("s", log_s, log_s2)):
        snake = {
            f: lion_snake_attention(
                q_fm, k_fm, v, grid=GRID, num_prefix_tokens=1, mask=mask, log_decay_row=ld_r, log_decay_col=ld_c, form=f
            )
            for f in ("parallel", "chunk", "scan")
        }
        err = max(_rel(snake[f], snake["parallel"]) for f in ("chunk", "scan"))
        rows.append((f"LION-{mask.upper()} snake: chunk / scan vs parallel", err, TOL_FP32))

    log_eta = project(0.5).mean(-1) + math.log(n)  # [B, H, N], a normaliser per token
    linear = normalized_attention(q_raw, k_raw, v, log_eta)
    rows.append(
        (
            "Normalized: q (K^T V) vs materialised (q k^T / eta) V",
            _rel(linear, normalized_attention(q_raw, k_raw, v, log_eta, form="parallel")),
            TOL_FP32,
        )
    )

    xt = tokens.expand(b, -1, -1)
    coeffs = torch.randn(2, xt.shape[-1], 4, generator=gen).to(dev)
    log_lam = F.logsigmoid(torch.linspace(0.0, 3.0, 4, device=dev)).repeat(2, 1)
    dense = md_tpe(xt, GRID, coeffs, log_lam, num_prefix_tokens=1, impl="dense")
    rows.append(
        (
            "MD-TPE: scan vs dense Toeplitz",
            _rel(md_tpe(xt, GRID, coeffs, log_lam, num_prefix_tokens=1, impl="scan"), dense),
            TOL_FP32,
        )
    )

    kw = dict(grid=GRID, num_prefix_tokens=1, backend="torch")
    full = lightnet_attention(q_raw, k_raw, v, **kw)
    causal = lightnet_attention(q_raw, k_raw, v, causal=True, **kw)
    rows.append(("LightNet: causal final state vs one scan", _rel(causal[:, :, -1], full[:, :, -1]), TOL_FP32))
    full64 = lightnet_attention(q_raw.double(), k_raw.double(), v.double(), **kw)
    rows.append(("LightNet: fp32 vs fp64", _rel(full, full64), TOL_FP32))
    if dev.type == "cuda":
        bf = lightnet_attention(q_raw.bfloat16(), k_raw.bfloat16(), v.bfloat16(), grid=GRID, num_prefix_tokens=1)
        rows.append(("LightNet: bf16 (backend auto) vs fp64", _rel(bf, full64), 1e-2))

    print(
        f"lightvision demo: china.jpg as a {GRID[0]}x{GRID[1]} patch grid + 1 prefix token "
        f"(N={n}), B={b}, H={h}, d={d}, device={dev}"
    )
    width = max(len(r[0]) for r in rows)
    print(f"{'check':<{width}}  {'rel. L2 err':>11}  {'tol':>7}  result")
    failed = 0
    for name, err, tol in rows:
        ok = err < tol
        failed += not ok
        print(f"{name:<{width}}  {err:11.2e}  {tol:7.0e}  {'PASS' if ok else 'FAIL'}")
    print(f"{len(rows) - failed}/{len(rows)} checks passed in {time.time() - t0:.1f} s")
    return 0 if failed == 0 else 1
