"""scripts/bench_attention.py's registered forms compute the op they time (Triton interpreter on the CPU)."""

import torch

from helpers import assert_close, load_script


def test_value_halves_are_the_one_call_op():
    """Two kernel calls on the halves of v's columns (q, k shared) give LightNet's output and all three gradients:
    each output column reads only its own value column; dq and dk sum over the halves."""
    bench = load_script("bench_attention")
    torch.manual_seed(0)
    one_fn, inputs = bench.REGISTRY[("lightnet", "triton")](2, 1, 16, 32, torch.float32, "cpu")
    halves_fn, _ = bench.REGISTRY[("lightnet", "triton_value_halves")](2, 1, 16, 32, torch.float32, "cpu")
    leaves = [x.clone().requires_grad_() for x in inputs]
    copies = [x.clone().requires_grad_() for x in inputs]
    out, ref = halves_fn(*leaves), one_fn(*copies)
    assert_close(out, ref, name="fwd")
    grad = torch.randn_like(ref)
    out.backward(grad)
    ref.backward(grad)
    for name, a, b in zip("qkv", leaves, copies):
        assert_close(a.grad, b.grad, name=f"d{name}")
