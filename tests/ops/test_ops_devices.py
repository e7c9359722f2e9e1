"""Every core on every available device (CPU; CUDA when present) in fp32 / bf16 / fp16 with backend="torch",
against the CPU fp64 reference; forward and backward."""

import pytest
import torch
import torch.nn.functional as F

from helpers import TOL, assert_close
from lightvision.ops import (
    lightnet_attention,
    lion_attention,
    lion_snake_attention,
    md_lrpe,
    md_tpe,
    normalized_attention,
    softmax_attention,
    two_scan_attention,
)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
GRID, P = (7, 11), 1
N = 78


def _cases():
    b, h, d = 2, 3, 8
    q, k, v = (torch.randn(b, h, N, d, dtype=torch.float64) for _ in range(3))
    qf, kf = F.normalize(F.silu(q) + 0.5, dim=-1), F.normalize(F.silu(k) + 0.5, dim=-1)
    ld = F.logsigmoid(torch.randn(h, dtype=torch.float64) + 3)
    ls = F.logsigmoid(torch.randn(b, h, N, dtype=torch.float64) + 3)
    x = torch.randn(b, N, d, dtype=torch.float64)
    le = torch.randn(b, h, N, dtype=torch.float64) + torch.log(torch.tensor(float(N), dtype=torch.float64))
    co, ll = torch.randn(2, d, 3, dtype=torch.float64), F.logsigmoid(torch.randn(2, 3, dtype=torch.float64))
    fp32 = lambda t: t.float()  # noqa: E731  (decays / parameters stay fp32)
    return {
        "lightnet": (
            (q, k, v),
            {},
            lambda a, b_, c: lightnet_attention(a, b_, c, grid=GRID, num_prefix_tokens=P, backend="torch"),
        ),
        "lightnet_causal": (
            (q, k, v),
            {},
            lambda a, b_, c: lightnet_attention(a, b_, c, grid=GRID, num_prefix_tokens=P, causal=True, backend="torch"),
        ),
        "lion_s_scan": (
            (qf, kf, v),
            {"ls": ls},
            lambda a, b_, c, ls: lion_attention(
                a, b_, c, mask="s", log_decay=ls, form="scan", chunk_size=32, backend="torch"
            ),
        ),
        "lion_d_chunk": (
            (qf, kf, v),
            {"ld": ld},
            lambda a, b_, c, ld: lion_attention(
                a, b_, c, mask="d", log_decay=ld, form="chunk", chunk_size=32, backend="torch"
            ),
        ),
        "lion_s_recurrent": (
            (qf, kf, v),
            {"ls": ls},
            lambda a, b_, c, ls: lion_attention(a, b_, c, mask="s", log_decay=ls, form="recurrent", backend="torch"),
        ),
        "lion_lit": ((F.elu(q) + 1, F.elu(k) + 1, v), {}, lambda a, b_, c: lion_attention(a, b_, c, backend="torch")),
        "snake_s": (
            (qf, kf, v),
            {"ls": ls},
            lambda a, b_, c, ls: lion_snake_attention(
                a,
                b_,
                c,
                grid=GRID,
                num_prefix_tokens=P,
                mask="s",
                log_decay_row=ls,
                log_decay_col=ls.flip(-1),
                backend="torch",
            ),
        ),
        "two_scan": ((qf, kf, v), {"ld": ld}, lambda a, b_, c, ld: two_scan_attention(a, b_, c, ld, backend="torch")),
        "softmax": ((q, k, v), {}, softmax_attention),
        "normalized": ((q, k, v), {"le": le}, lambda a, b_, c, le: normalized_attention(a, b_, c, le)),
        "normalized_parallel": (
            (q, k, v),
            {"le": le},
            lambda a, b_, c, le: normalized_attention(a, b_, c, le, form="parallel"),
        ),
        "md_lrpe": ((q,), {}, lambda a: md_lrpe(a, GRID, P)),
        "md_tpe": ((x,), {"co": co, "ll": ll}, lambda a, co, ll: md_tpe(a, GRID, co, ll, num_prefix_tokens=P)),
    }, fp32


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_cores(device, dtype):
    cases, fp32 = _cases()
    for name, (args, params, fn) in cases.items():
        ref = fn(*args, **params)
        ins = [a.to(device, dtype).requires_grad_(True) for a in args]
        ps = {key: fp32(p).to(device).requires_grad_(True) for key, p in params.items()}
        y = fn(*ins, **ps)
        assert y.dtype == dtype and y.device.type == device, name
        assert_close(y, ref, TOL[dtype], name)
        y.float().square().sum().backward()
        for t in ins + list(ps.values()):
            assert t.grad is not None and torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0, name
