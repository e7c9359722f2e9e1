"""MD-TPE (docs/spec.md 1.3): dense Toeplitz vs explicit definition vs scan, causal option, prefix tokens, gradients."""

import math

import pytest
import torch

from lightvision.ops import md_tpe

F64 = torch.float64


def _params(num_axes, c, e):
    return torch.randn(num_axes, c, e, dtype=F64), torch.log(torch.rand(num_axes, e, dtype=F64) * 0.9 + 0.05)


def _loop_ref(x, grid, coeffs, log_lambda, prefix, causal, combine="sum"):
    """sum: y[p] = sum_axes sum_{p' on p's line} sum_r coeffs[j, :, r] lambda_r^|p_j - p'_j| x[p'];
    product: y[p] = sum_{p'} prod_j t^j_{p_j - p'_j} x[p'] over the whole grid; by loops."""
    b, n, c = x.shape
    xs = x[:, prefix:].reshape(b, *grid, c)
    y = torch.zeros_like(xs)
    lam = torch.exp(log_lambda)
    points = torch.cartesian_prod(*[torch.arange(g) for g in grid]).reshape(-1, len(grid)).tolist()
    for idx in points:
        if combine == "product":
            for src in points:
                offs = [a - s for a, s in zip(idx, src)]
                if causal and min(offs) < 0:
                    continue
                t = math.prod((coeffs[j] * lam[j] ** abs(o)).sum(-1) for j, o in enumerate(offs))
                y[(slice(None), *idx)] += t * xs[(slice(None), *src)]
            continue
        for j, length in enumerate(grid):
            for src in range(length):
                off = idx[j] - src
                if causal and off < 0:
                    continue
                other = list(idx)
                other[j] = src
                t = (coeffs[j] * lam[j] ** abs(off)).sum(-1)  # [C]
                y[(slice(None), *idx)] += t * xs[(slice(None), *other)]
    return torch.cat([torch.zeros(b, prefix, c, dtype=x.dtype), y.reshape(b, -1, c)], 1)


@pytest.mark.parametrize("grid,prefix,b,c,e", [((7, 11), 1, 2, 3, 4), ((5,), 0, 1, 2, 1), ((2, 3, 4), 2, 1, 2, 3)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("combine", ["sum", "product"])
def test_dense_and_scan_equal_definition(grid, prefix, b, c, e, causal, combine, rel):
    x = torch.randn(b, math.prod(grid) + prefix, c, dtype=F64)
    coeffs, log_lambda = _params(len(grid), c, e)
    ref = _loop_ref(x, grid, coeffs, log_lambda, prefix, causal, combine)
    for impl in ("dense", "scan"):
        y = md_tpe(x, grid, coeffs, log_lambda, num_prefix_tokens=prefix, causal=causal, impl=impl, combine=combine)
        assert rel(y, ref) < 1e-12, impl
        assert (y[:, :prefix] == 0).all()


@pytest.mark.parametrize("causal,combine", [(False, "sum"), (True, "sum"), (False, "product")])
def test_scan_equals_dense_fp32_and_grads(causal, combine, rel):
    grid, prefix = (12, 17), 1
    x = torch.randn(2, 205, 8, dtype=F64, requires_grad=True)
    coeffs, log_lambda = (t.requires_grad_(True) for t in _params(2, 8, 3))
    outs, grads = {}, {}
    for impl in ("dense", "scan"):
        y = md_tpe(x, grid, coeffs, log_lambda, num_prefix_tokens=prefix, causal=causal, impl=impl, combine=combine)
        grads[impl] = torch.autograd.grad((y * torch.cos(y)).sum(), (x, coeffs, log_lambda))
        outs[impl] = y
    assert rel(outs["scan"], outs["dense"]) < 1e-12
    for g_s, g_d in zip(grads["scan"], grads["dense"]):
        assert g_d.abs().sum() > 0 and rel(g_s, g_d) < 1e-12
    y32 = md_tpe(
        x.detach().float(),
        grid,
        coeffs.detach().float(),
        log_lambda.detach().float(),
        num_prefix_tokens=prefix,
        causal=causal,
        impl="scan",
        combine=combine,
    )
    assert y32.dtype == torch.float32 and rel(y32, outs["dense"]) < 1e-5
    ybf = md_tpe(
        x.detach().bfloat16(),
        grid,
        coeffs.detach().float(),
        log_lambda.detach().float(),
        num_prefix_tokens=prefix,
        causal=causal,
        combine=combine,
    )
    assert ybf.dtype == torch.bfloat16 and rel(ybf, outs["dense"]) < 1e-2


def test_errors():
    x = torch.randn(1, 10, 4)
    coeffs, log_lambda = _params(2, 4, 3)
    with pytest.raises(ValueError, match="sequence has N=10"):
        md_tpe(x, (3, 4), coeffs, log_lambda)
    with pytest.raises(ValueError, match="coeffs must be"):
        md_tpe(x, (10,), coeffs, log_lambda)
    with pytest.raises(ValueError, match="log_lambda must be"):
        md_tpe(x, (2, 5), coeffs, log_lambda[:, :2])
    with pytest.raises(ValueError, match="unknown md_tpe impl"):
        md_tpe(x, (2, 5), coeffs, log_lambda, impl="fft")
    with pytest.raises(ValueError, match="unknown md_tpe combine 'max'; valid: 'sum', 'product'"):
        md_tpe(x, (2, 5), coeffs, log_lambda, combine="max")
    with pytest.raises(ValueError, match=r"\[B, N, C\]"):
        md_tpe(x[0], (2, 5), coeffs, log_lambda)
