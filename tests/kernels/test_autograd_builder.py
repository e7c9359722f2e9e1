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


def _pair_fwd(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return x * y, x + y, y.clone()  # two results, then a tensor only the backward reads


def _pair_fwd_fake(x, y):
    return torch.empty_like(x), torch.empty_like(x), torch.empty_like(y)


def _pair_bwd(
    d_prod: torch.Tensor, d_sum: torch.Tensor, x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return d_prod * y + d_sum, d_prod * x + d_sum


def _pair_bwd_fake(d_prod, d_sum, x, y):
    return torch.empty_like(x), torch.empty_like(y)


PAIR = autograd_ops(
    "builder_probe_pair",
    _pair_fwd,
    _pair_fwd_fake,
    _pair_bwd,
    _pair_bwd_fake,
    lambda i, o: ((i[0], o[2]), ()),
    results=2,
)


@pytest.mark.parametrize("path", ["eager", "custom_op", "compiled"])
@pytest.mark.parametrize("used", ["both", "second"])
def test_several_results_each_carry_their_gradient(path, used):
    """With results=2 the backward gets both results' gradients, a zero one for a result the loss does not use
    (inside the compiled graph too)."""
    torch.manual_seed(0)
    x, y = (torch.randn(3, 4, requires_grad=True) for _ in range(2))
    d_prod, d_sum = torch.randn(3, 4), torch.randn(3, 4)
    if used == "second":
        d_prod = torch.zeros_like(d_prod)
    op = PAIR.eager.apply if path == "eager" else PAIR.fwd

    def loss(x, y):
        prod, total = op(x, y)[:2]
        return (total * d_sum).sum() if used == "second" else (prod * d_prod + total * d_sum).sum()

    fn = torch.compile(loss, fullgraph=True, backend="aot_eager") if path == "compiled" else loss
    dx, dy = torch.autograd.grad(fn(x, y), (x, y))
    torch.testing.assert_close(dx, d_prod * y + d_sum)
    torch.testing.assert_close(dy, d_prod * x + d_sum)


def test_several_results_pass_opcheck():
    x, y = (torch.randn(3, 4, requires_grad=True) for _ in range(2))
    torch.library.opcheck(PAIR.fwd, (x, y))


@pytest.mark.parametrize("compiled", [False, True])
def test_call_returns_the_results_on_either_path(compiled):
    """``call`` gives the eager Function's results in eager mode and the forward op's leading results (the tensor
    only the backward reads dropped) under torch.compile, with the same gradients."""
    torch.manual_seed(0)
    x, y = (torch.randn(3, 4, requires_grad=True) for _ in range(2))
    fn = torch.compile(PAIR.call, fullgraph=True, backend="aot_eager") if compiled else PAIR.call
    prod, total = fn(x, y)
    dx, dy = torch.autograd.grad((prod + total).sum(), (x, y))
    torch.testing.assert_close(prod, x * y)
    torch.testing.assert_close(dx, y + 1)
    torch.testing.assert_close(dy, x + 1)
