"""Normalized attention (Sieber et al. Eq. 21): an explicit loop, the two forms, dtypes, gradients, the clamp."""

import pytest
import torch

from helpers import TOL, assert_close, rel
from lightvision.ops import normalized_attention
from lightvision.ops.normalized import LOG_ETA_MAX

F64 = torch.float64
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _inputs(b, h, n, d, dtype, seed=0, device="cpu"):
    """q, k, v [B, H, N, d] in ``dtype`` and log eta [B, H, N] (fp32) around log N, leaves that require grad."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=g, dtype=F64) / d**0.25 for _ in range(3))
    log_eta = torch.log(torch.tensor(float(n), dtype=F64)) + torch.randn(b, h, n, generator=g, dtype=F64)
    return [t.to(device, dtype).requires_grad_() for t in (q, k, v)] + [log_eta.float().to(device).requires_grad_()]


def test_matches_the_equation_by_loops():
    """y_i = sum_j (q_i . k_j) v_j / exp(log eta_i), both forms, fp64."""
    q, k, v, log_eta = (t.detach().double() for t in _inputs(2, 3, 11, 5, F64))
    want = torch.zeros(2, 3, 11, 5, dtype=F64)
    for i in range(11):
        for j in range(11):
            want[:, :, i] += (q[:, :, i] * k[:, :, j]).sum(-1, keepdim=True) * v[:, :, j]
        want[:, :, i] /= torch.exp(log_eta[:, :, i])[..., None]
    for form in ("linear", "parallel"):
        assert rel(normalized_attention(q, k, v, log_eta, form=form), want) < 1e-13, form


CASES = [
    pytest.param(2, 3, 197, 16, id="B2-H3-N197-D16"),
    pytest.param(1, 1, 197, 64, id="B1-H1-N197-D64"),
    pytest.param(2, 2, 50, 24, id="B2-H2-N50-D24"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("b,h,n,d", CASES)
def test_linear_form_forward_and_gradients(b, h, n, d, dtype, device):
    """The fast form against the fp64 materialised reference on the CPU: output and the gradients of q, k, v and
    log eta."""
    q, k, v, log_eta = _inputs(b, h, n, d, dtype, device=device)
    ref_in = [t.detach().cpu().double().requires_grad_() for t in (q, k, v, log_eta)]
    out = normalized_attention(q, k, v, log_eta)
    ref = normalized_attention(*ref_in, form="parallel")
    assert out.dtype == dtype and out.device.type == device
    assert_close(out, ref, name="output")
    up = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    grads = torch.autograd.grad(out, (q, k, v, log_eta), up.to(device, dtype))
    ref_grads = torch.autograd.grad(ref, ref_in, up)
    for name, g, rg in zip(("dq", "dk", "dv", "dlog_eta"), grads, ref_grads):
        assert g.dtype == (torch.float32 if name == "dlog_eta" else dtype)
        assert_close(g, rg, TOL[dtype], name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_extreme_normalisers_stay_finite(dtype):
    """exp(-log eta) would overflow at log eta = -1000; the clamp keeps the scale at exp(LOG_ETA_MAX), finite in both
    forms, and passes no gradient to a clamped log eta while the unclamped ones get theirs."""
    q, k, v, _ = _inputs(1, 2, 9, 8, dtype)
    log_eta = torch.zeros(1, 2, 9)
    log_eta[0, 0, :3], log_eta[0, 1, :3] = -1000.0, 1000.0
    log_eta.requires_grad_()
    for form in ("linear", "parallel"):
        out = normalized_attention(q, k, v, log_eta, form=form)
        assert torch.isfinite(out).all()
        at_bound = normalized_attention(q, k, v, log_eta.detach().clamp(-LOG_ETA_MAX, LOG_ETA_MAX), form=form)
        torch.testing.assert_close(out, at_bound)
        (grad,) = torch.autograd.grad(out.float().sum(), log_eta)
        assert torch.isfinite(grad).all() and (grad[0, :, :3] == 0).all() and (grad[0, :, 3:] != 0).all()


def test_bad_inputs():
    q = torch.randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match=r"log_eta must be \[B, H, N\] = \(1, 2, 5\), got \(1, 5, 2\)"):
        normalized_attention(q, q, q, torch.zeros(1, 5, 2))
    with pytest.raises(ValueError, match="unknown normalized attention form 'chunk'"):
        normalized_attention(q, q, q, torch.zeros(1, 2, 5), form="chunk")
    with pytest.raises(ValueError, match="q and k must have the same shape"):
        normalized_attention(q, q[..., :3], q, torch.zeros(1, 2, 5))
