"""MD-TPE (SPEC 1.3): dense Toeplitz vs explicit definition vs scan, causal option, prefix tokens, gradients."""

import math

import pytest
import torch

from lightvision.ops import md_tpe

F64 = torch.float64


def _params(num_axes, c, e):
    return torch.randn(num_axes, c, e, dtype=F64), torch.log(torch.rand(num_axes, e, dtype=F64) * 0.9 + 0.05)


def _loop_ref(x, grid, coeffs, log_lambda, prefix, causal):
    """y[p] = sum_axes sum_{p' on p's line} sum_r coeffs[j, :, r] lambda_r^|p_j - p'_j| x[p'], by loops."""
    b, n, c = x.shape
    xs = x[:, prefix:].reshape(b, *grid, c)
    y = torch.zeros_like(xs)
    lam = torch.exp(log_lambda)
    for idx in torch.cartesian_prod(*[torch.arange(g) for g in grid]).reshape(-1, len(grid)).tolist():
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
def test_dense_and_scan_equal_definition(grid, prefix, b, c, e, causal, rel):
    x = torch.randn(b, math.prod(grid) + prefix, c, dtype=F64)
    coeffs, log_lambda = _params(len(grid), c, e)
    ref = _loop_ref(x, grid, coeffs, log_lambda, prefix, causal)
    for impl in ("dense", "scan"):
        y = md_tpe(x, grid, coeffs, log_lambda, num_prefix_tokens=prefix, causal=causal, impl=impl)
        assert rel(y, ref) < 1e-12, impl
        assert (y[:, :prefix] == 0).all()


@pytest.mark.parametrize("causal", [False, True])
def test_scan_equals_dense_fp32_and_grads(causal, rel):
    grid, prefix = (12, 17), 1
    x = torch.randn(2, 205, 8, dtype=F64, requires_grad=True)
    coeffs, log_lambda = (t.requires_grad_(True) for t in _params(2, 8, 3))
    outs, grads = {}, {}
    for impl in ("dense", "scan"):
        y = md_tpe(x, grid, coeffs, log_lambda, num_prefix_tokens=prefix, causal=causal, impl=impl)
        grads[impl] = torch.autograd.grad((y * torch.cos(y)).sum(), (x, coeffs, log_lambda))
        outs[impl] = y
    assert rel(outs["scan"], outs["dense"]) < 1e-12
    for g_s, g_d in zip(grads["scan"], grads["dense"]):
        assert g_d.abs().sum() > 0 and rel(g_s, g_d) < 1e-12
    y32 = md_tpe(x.detach().float(), grid, coeffs.detach().float(), log_lambda.detach().float(),
                 num_prefix_tokens=prefix, causal=causal, impl="scan")
    assert y32.dtype == torch.float32 and rel(y32, outs["dense"]) < 1e-5
    ybf = md_tpe(x.detach().bfloat16(), grid, coeffs.detach().float(), log_lambda.detach().float(),
                 num_prefix_tokens=prefix, causal=causal)
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
    with pytest.raises(ValueError, match=r"\[B, N, C\]"):
        md_tpe(x[0], (2, 5), coeffs, log_lambda)
