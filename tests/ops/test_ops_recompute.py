"""recomputed_input_linear: the plain Linear(act(h)) values and gradients, keeping only h for the backward."""

import contextlib

import pytest
import torch
import torch.nn.functional as F

from helpers import rel
from lightvision.layers import GLU, GeluMlp
from lightvision.ops import recomputed_input_linear, silu_mul

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
GELU = torch.nn.GELU(approximate="tanh")
ACTS = {"silu_mul": (silu_mul, 2), "gelu": (GELU, 1)}  # act, width of h per output column of act(h)


def _run(fn, leaves, dout):
    out = fn(*leaves)
    out.backward(dout)
    return [out.detach()] + [t.grad.clone() for t in leaves]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("act_name", sorted(ACTS))
@pytest.mark.parametrize("dtype,autocast", [(torch.float32, False), (torch.bfloat16, False), (torch.float32, True)])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_the_plain_linear(device, act_name, dtype, autocast, bias):
    """Output and the gradients of h, weight and bias against F.linear(act(h)), odd sizes; under bf16 autocast
    (fp32 weights, bf16 h) as in training."""
    act, widen = ACTS[act_name]
    k, c = 37, 19
    h_dtype = torch.bfloat16 if autocast else dtype
    h = torch.randn(3, 5, widen * k, device=device, dtype=h_dtype)
    w = torch.randn(c, k, device=device, dtype=dtype) / k**0.5
    b = torch.randn(c, device=device, dtype=dtype) if bias else None
    dout = torch.randn(3, 5, c, device=device, dtype=torch.bfloat16 if autocast or dtype == torch.bfloat16 else dtype)
    results = []
    for fn in (lambda h, w, *b: F.linear(act(h), w, *b), lambda h, w, *b: recomputed_input_linear(act, h, w, *b)):
        leaves = [t.clone().requires_grad_() for t in (h, w, *([b] if bias else []))]
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            results.append(_run(fn, leaves, dout))
    tol = 1e-6 if dtype == torch.float32 and not autocast else 1e-2
    for name, ref, got in zip(["out", "dh", "dw", "db"], *results):
        assert got.dtype == ref.dtype and got.shape == ref.shape, name
        assert rel(got, ref) < tol, (name, rel(got, ref))


def test_keeps_only_the_input_for_the_backward():
    """Autograd keeps GELU(h) besides h (and the weight) in the plain form, only h in the recomputed one; a
    FlopCounterMode (module backward hooks) around the backward still works."""
    from torch.utils.flop_counter import FlopCounterMode

    h = torch.randn(4, 6, 24, requires_grad=True)
    w = torch.randn(8, 24, requires_grad=True)
    own = {h.untyped_storage().data_ptr(), w.untyped_storage().data_ptr()}

    def other_storages(fn):
        kept = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t.untyped_storage().data_ptr()) or t, id):
            fn()
        return set(kept) - own

    assert len(other_storages(lambda: F.linear(GELU(h), w))) == 1
    assert other_storages(lambda: recomputed_input_linear(GELU, h, w)) == set()
    with FlopCounterMode(display=False) as counter:
        recomputed_input_linear(silu_mul, torch.cat([h, h], -1), w).sum().backward()
    assert counter.get_total_flops() == 3 * 2 * 4 * 6 * 24 * 8


def test_plain_form_without_grad_and_when_compiling(monkeypatch):
    """No saved-tensor hooks without grad (inference) and while torch.compile traces (its partitioner recomputes)."""
    h, w = torch.randn(2, 8, requires_grad=True), torch.randn(3, 4, requires_grad=True)
    monkeypatch.setattr(torch.autograd.graph, "saved_tensors_hooks", lambda *a: pytest.fail("hooks installed"))
    with torch.no_grad():
        recomputed_input_linear(silu_mul, h, w)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    recomputed_input_linear(silu_mul, h, w).sum().backward()
    assert w.grad is not None


def test_layers_keep_their_state_dicts():
    """GeluMlp loads timm Mlp's weights and gives its output; GLU keeps w12 / w3."""
    from timm.layers import Mlp

    ref = Mlp(16, 40, act_layer=lambda: torch.nn.GELU(approximate="tanh"))
    mlp = GeluMlp(16, 40)
    mlp.load_state_dict(ref.state_dict())
    x = torch.randn(2, 7, 16)
    torch.testing.assert_close(mlp(x), ref(x))
    assert sorted(GLU(16, 32).state_dict()) == ["w12.weight", "w3.weight"]


@pytest.mark.parametrize("layer", ["glu", "gelu_mlp"])
@pytest.mark.parametrize("autocast", [False, True])
def test_ffn_with_its_norm_recomputed(layer, autocast):
    """ffn(x, pre=norm) gives ffn(norm(x))'s output and the gradients of x, the norm's shift / scale and the weights,
    without keeping the norm's output for the first Linear."""
    from lightvision.layers import ModulatedLayerNorm

    torch.manual_seed(0)
    ffn = GLU(24, 40) if layer == "glu" else GeluMlp(24, 56)
    norm = ModulatedLayerNorm()
    x, shift, scale = torch.randn(2, 7, 24), torch.randn(2, 24), torch.randn(2, 24)
    results, norm_outputs_kept = [], []
    for fused in (False, True):
        ffn.zero_grad()
        leaves = [t.clone().requires_grad_() for t in (x, shift, scale)]
        kept = []
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t.numel()) or t, lambda t: t):
                pre = lambda t: norm(t, leaves[1], leaves[2])  # noqa: E731
                out = ffn(leaves[0], pre=pre) if fused else ffn(pre(leaves[0]))
        out.float().square().sum().backward()
        results.append([out.detach()] + [t.grad for t in leaves] + [p.grad.clone() for p in ffn.parameters()])
        norm_outputs_kept.append(kept.count(2 * 7 * 24))
    assert norm_outputs_kept[1] == norm_outputs_kept[0] - 1  # the Linear's input, the norm's output, is not kept
    tol = 1e-2 if autocast else 1e-6
    for ref, got in zip(*results):
        assert rel(got, ref) < tol


def test_rebuilt_in_backward_serves_every_op_that_saved_a_view():
    """Two matmuls save views of y: neither keeps y's storage, the backward rebuilds y once, gradients as plain."""
    from lightvision.ops import rebuilt_in_backward

    x, w1, w2 = torch.randn(6, 8), torch.randn(5, 8), torch.randn(3, 4)
    grads = []
    for rebuilt in (False, True):
        leaves = [t.clone().requires_grad_() for t in (x, w1, w2)]
        y = F.gelu(leaves[0])
        calls, kept = [], []
        ctx = rebuilt_in_backward(y, lambda t: calls.append(1) or F.gelu(t), leaves[0])
        with torch.autograd.graph.saved_tensors_hooks(
            lambda t: kept.append(t.untyped_storage().data_ptr()) or t, lambda t: t
        ):
            with ctx if rebuilt else contextlib.nullcontext():
                out = y @ leaves[1].t() + (y[:, :4] @ leaves[2].t()).sum()
        assert (y.untyped_storage().data_ptr() in kept) is not rebuilt
        out.square().sum().backward()
        assert len(calls) == rebuilt
        grads.append([t.grad for t in leaves])
    for ref, got in zip(*grads):
        torch.testing.assert_close(got, ref)
