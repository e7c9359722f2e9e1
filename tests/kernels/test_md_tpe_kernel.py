"""The MD-TPE Triton kernel (2-D grids) against the plain reference ``lightvision.ops.md_tpe``: forward and the
gradients of x, coeffs and log-lambda vs fp64, non-square grids, prefix tokens, B = 1, causal and two-sided kernels,
weak and strong decay, fp32 / bf16 / fp16, strided inputs, NaN-poisoned outputs; the custom op under opcheck and
the MD-TPE layer under torch.compile. On CPU the kernel runs in the Triton interpreter."""

import importlib

import pytest
import torch
import torch.nn.functional as F

from lightvision.kernels import _launch
from lightvision.kernels.fused import md_tpe as kop
from lightvision.layers import MDTPE
from lightvision.ops import md_tpe

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}  # SPEC 2, relative L2 vs fp64


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setattr(_launch, "POISON_OUTPUTS", True)


def _rel(a, ref):
    assert torch.isfinite(a).all(), "non-finite element: an output was not written"
    return ((a.double() - ref).norm() / ref.norm()).item()


def _params(c, lam_lo, lam_hi):
    coeffs = torch.randn(2, c, 4, device=DEV) / 4
    log_lambda = torch.log(torch.linspace(lam_lo, lam_hi, 4, device=DEV)).repeat(2, 1)
    return coeffs, log_lambda


def _check(x, grid, coeffs, log_lambda, prefix, causal):
    leaves = [t.detach().requires_grad_() for t in (x, coeffs, log_lambda)]
    y = md_tpe(*leaves[:1], grid, *leaves[1:], num_prefix_tokens=prefix, causal=causal, backend="triton")
    assert y.dtype == x.dtype and y.shape == x.shape
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, leaves, dy)
    ref_leaves = [t.detach().double().requires_grad_() for t in (x, coeffs, log_lambda)]
    y_ref = md_tpe(ref_leaves[0], grid, *ref_leaves[1:], num_prefix_tokens=prefix, causal=causal, backend="torch")
    ref_grads = torch.autograd.grad(y_ref, ref_leaves, dy.double())
    assert (y[:, :prefix] == 0).all() and (grads[0][:, :prefix] == 0).all()  # prefix tokens neither mix nor mix in
    errs = [_rel(y, y_ref)] + [_rel(g, r) for g, r in zip(grads, ref_grads)]
    assert max(errs) < TOL[x.dtype], f"relative errors (y, dx, dcoeffs, dlog_lambda) = {errs}"
    for g, t in zip(grads, (x, coeffs, log_lambda)):
        assert g.dtype == t.dtype and g.shape == t.shape


@pytest.mark.parametrize("b, grid, prefix, c", [(2, (14, 14), 1, 24), (1, (5, 7), 0, 40), (3, (32, 9), 2, 12),
                                                (2, (1, 6), 1, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_md_tpe_kernel_matches_reference(b, grid, prefix, c, dtype, causal):
    x = torch.randn(b, prefix + grid[0] * grid[1], c, device=DEV).to(dtype)
    _check(x, grid, *_params(c, 0.5, 0.95), prefix, causal)


@pytest.mark.parametrize("lam", [(0.05, 0.2), (0.99, 0.999)])  # strong and weak decay
def test_md_tpe_kernel_decay_range(lam):
    x = torch.randn(2, 1 + 7 * 11, 16, device=DEV)
    _check(x, (7, 11), *_params(16, *lam), 1, False)


def test_md_tpe_kernel_strided_input_and_many_grad_programs(monkeypatch):
    """x read in place through its row stride (a channel slice of a wider tensor); the dT partials spread over
    several programs, each summing several batches, the last one partly past the batch."""
    monkeypatch.setattr(kop, "num_sms", lambda device: 1)
    wide = torch.randn(9, 1 + 6 * 5, 56, device=DEV)
    x = wide[..., 8:40]
    assert not x.is_contiguous() and x.stride(-1) == 1
    _check(x, (6, 5), *_params(32, 0.5, 0.95), 1, False)


def test_md_tpe_kernel_fallbacks():
    coeffs, log_lambda = _params(8, 0.5, 0.9)
    big = (kop.MAX_AXIS + 1, 2)
    x = torch.randn(1, big[0] * big[1], 8, device=DEV)
    kw = dict(num_prefix_tokens=0, causal=False, impl="dense")
    assert kop.md_tpe_triton(x, coeffs, log_lambda, grid=big, **kw) is NotImplemented
    assert kop.md_tpe_triton(x[:, :6], coeffs, log_lambda, grid=(2, 3), num_prefix_tokens=0, causal=False,
                             impl="scan") is NotImplemented
    x3 = torch.randn(1, 8, 8, device=DEV)
    c3 = torch.randn(3, 8, 4, device=DEV)
    assert kop.md_tpe_triton(x3, c3, log_lambda.repeat(2, 1)[:3], grid=(2, 2, 2), **kw) is NotImplemented
    with pytest.raises(RuntimeError, match="does not support"):  # "triton" insists; "auto" falls back
        md_tpe(x, big, coeffs, log_lambda, backend="triton")
    y = md_tpe(x, big, coeffs, log_lambda, backend="auto")
    torch.testing.assert_close(y, md_tpe(x, big, coeffs, log_lambda, backend="torch"))


def test_md_tpe_custom_op_and_layer_compile(monkeypatch):
    """opcheck, and the MD-TPE layer under torch.compile(fullgraph=True) through the custom op: same values and
    gradients as the eager kernel and the reference."""
    md_tpe_module = importlib.import_module("lightvision.ops.md_tpe")  # the module, not the function of that name
    x = torch.randn(2, 1 + 4 * 3, 8, device=DEV, requires_grad=True)
    t0, t1 = torch.randn(8, 4, 4, device=DEV), torch.randn(8, 3, 3, device=DEV)
    torch.library.opcheck(kop.md_tpe2d_fwd, (x, t0.requires_grad_(), t1.requires_grad_(), 1))
    launches = []
    for name in ("_apply", "_grad_t"):
        real = getattr(kop, name)
        monkeypatch.setattr(kop, name, lambda *a, _r=real, _n=name, **k: launches.append(_n) or _r(*a, **k))
    real_dispatch = md_tpe_module.dispatch
    monkeypatch.setattr(md_tpe_module, "dispatch", lambda op, backend, *a: real_dispatch(op, "triton", *a))
    layer = MDTPE(16).to(DEV)
    torch.nn.init.normal_(layer.proj.weight, std=0.2)
    tokens = torch.randn(2, 1 + 5 * 6, 16, device=DEV)

    def f(t):
        return F.gelu(layer(t, (5, 6), 1)).square().mean()

    eager = f(tokens)
    eager.backward()
    grads = [p.grad.clone() for p in layer.parameters()]
    assert sorted(launches) == ["_apply", "_apply", "_grad_t", "_grad_t"]  # forward, dx, dT^0, dT^1
    monkeypatch.setattr(md_tpe_module, "dispatch", real_dispatch)
    layer.zero_grad()
    ref = f(tokens)
    if DEV == "cpu":  # "auto" on CPU is the reference
        ref.backward()
        for p, g in zip(layer.parameters(), grads):
            torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)
    monkeypatch.setattr(md_tpe_module, "dispatch", lambda op, backend, *a: real_dispatch(op, "triton", *a))
    launches.clear()
    layer.zero_grad()
    torch._dynamo.reset()
    with torch.device(DEV):
        compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(tokens)
    compiled.backward()
    assert sorted(launches) == ["_apply", "_apply", "_grad_t", "_grad_t"]
    torch.testing.assert_close(compiled, eager)
    for p, g in zip(layer.parameters(), grads):
        torch.testing.assert_close(p.grad, g)
