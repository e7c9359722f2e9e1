"""The builder of a kernel's custom-op pair and eager Function (kernels/_autograd.py) on a plain PyTorch toy op,
out = x + g * y, whose x passes its gradient through (as the gated residual's does)."""

import pytest
import torch

from lightvision.kernels._autograd import autograd_ops


def _fwd(x: torch.Tensor, g: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + g * y


def _fwd_fake(x, g, y):
    return torch.empty_like(x, dtype=torch.promote_types(x.dtype, torch.promote_types(g.dtype, y.dtype)))


def _bwd(d: torch.Tensor, g: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (d * y).to(g.dtype), (d * g).to(y.dtype)


def _bwd_fake(d, g, y):
    return torch.empty_like(g), torch.empty_like(y)


OPS = autograd_ops(
    "builder_probe_residual", _fwd, _fwd_fake, _bwd, _bwd_fake, lambda i, o: ((i[1], i[2]), ()), passthrough=1
)


@pytest.mark.parametrize("path", ["eager", "custom_op", "compiled"])
def test_passthrough_input_gets_the_result_gradient_in_its_dtype(path):
    torch.manual_seed(0)
    x = torch.randn(3, 4, dtype=torch.bfloat16, requires_grad=True)
    g, y = (torch.randn(3, 4, requires_grad=True) for _ in range(2))
    fn = {
        "eager": OPS.eager.apply,
        "custom_op": OPS.fwd,
        "compiled": torch.compile(OPS.fwd, fullgraph=True, backend="aot_eager"),
    }[path]
    out = fn(x, g, y)
    d = torch.randn_like(out)
    grads = torch.autograd.grad(out, (x, g, y), d)
    assert out.dtype == torch.float32 and [t.dtype for t in grads] == [torch.bfloat16, torch.float32, torch.float32]
    torch.testing.assert_close(grads[0], d.to(torch.bfloat16))
    torch.testing.assert_close(grads[1], d * y)
    torch.testing.assert_close(grads[2], d * g)


def test_passthrough_op_passes_opcheck():
    x, g, y = (torch.randn(3, 4, requires_grad=True) for _ in range(3))
    torch.library.opcheck(OPS.fwd, (x, g, y))
