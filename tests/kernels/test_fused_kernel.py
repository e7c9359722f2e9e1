"""The fused Triton RMSNorm (x sigmoid gate), SiLU x mul, modulated LayerNorm, gated residual and LION feature
map against their plain references in ``lightvision.ops.norm`` / ``.adaln`` / ``.lion``: forward and every gradient vs fp64, odd row counts and
widths, fp32 / bf16 / fp16, fp32 parameters with 16-bit activations (autocast), NaN-poisoned outputs; custom ops
under opcheck and torch.compile. On CPU the kernels run in the Triton interpreter."""

import pytest
import torch

import lightvision.kernels.fused  # noqa: F401  (registers the kernels)
from lightvision.kernels import _launch
from lightvision.kernels.fused import adaln as aop
from lightvision.kernels.fused import feature_map as fmap
from lightvision.kernels.fused import op as fop
from lightvision.layers import GLU, ModulatedLayerNorm, RMSNorm
from lightvision.ops import gated_residual, lion_feature_map, modulated_layer_norm, rms_norm, silu_mul
from lightvision.ops.heads import split_heads

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}  # SPEC 2, relative L2 vs fp64


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setattr(_launch, "POISON_OUTPUTS", True)


def _rel(a, ref):
    assert torch.isfinite(a).all(), "non-finite element: an output was not written"
    return ((a.double() - ref).norm() / ref.norm()).item()


def _grads_vs_fp64(fn, inputs, tol, out_dtype=None, out_shape=None):
    """fn(*inputs, backend="triton") vs fn on fp64 copies (backend="torch"): output and every input grad."""
    leaves = [t.detach().requires_grad_() for t in inputs]
    y = fn(*leaves, backend="triton")
    assert y.dtype == (out_dtype or inputs[0].dtype) and y.shape == (out_shape or inputs[0].shape)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, leaves, dy)
    ref_leaves = [t.detach().double().requires_grad_() for t in inputs]
    y_ref = fn(*ref_leaves, backend="torch")
    ref_grads = torch.autograd.grad(y_ref, ref_leaves, dy.double())
    errs = [_rel(y, y_ref)] + [_rel(g, r) for g, r in zip(grads, ref_grads)]
    assert max(errs) < tol, f"relative errors (y, grads...) = {errs}"
    for g, t in zip(grads, inputs):
        assert g.dtype == t.dtype and g.shape == t.shape


@pytest.mark.parametrize("shape", [(1, 197, 24), (3, 33, 384), (100, 1000), (5, 7, 1, 48)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gated", [False, True])
def test_rms_norm_matches_reference(shape, dtype, gated):
    x = (torch.randn(shape, device=DEV) * 3 + 0.5).to(dtype)
    weight = 1 + 0.3 * torch.randn(shape[-1], device=DEV)  # fp32, as an autocast model's parameter
    inputs = [x, weight]
    fn = lambda x_, w_, backend: rms_norm(x_, w_, eps=1e-6, backend=backend)  # noqa: E731
    if gated:
        inputs.append((torch.randn(shape, device=DEV) * 2).to(dtype))
        fn = lambda x_, w_, g_, backend: rms_norm(x_, w_, g_, eps=1e-6, backend=backend)  # noqa: E731
    _grads_vs_fp64(fn, inputs, TOL[dtype])


def test_rms_norm_out_dtype():
    """fp32 residual stream in, bf16 out (the autocast path of the RMSNorm layer): y rounds once; dx stays fp32."""
    x = torch.randn(3, 29, 96, device=DEV, requires_grad=True)
    w, g = torch.randn(96, device=DEV, requires_grad=True), torch.randn(3, 29, 96, device=DEV, requires_grad=True)
    y = rms_norm(x, w, g, out_dtype=torch.bfloat16, backend="triton")
    y_ref = rms_norm(x.double(), w.double(), g.double(), backend="torch")
    assert y.dtype == torch.bfloat16 and _rel(y, y_ref) < 4e-3
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, w, g), dy)
    ref = torch.autograd.grad(y_ref, (x, w, g), dy.double())
    assert [t.dtype for t in grads] == [torch.float32] * 3
    assert max(_rel(a, b) for a, b in zip(grads, ref)) < 1e-5
    with torch.autocast(DEV, dtype=torch.bfloat16):
        assert RMSNorm(96).to(DEV)(x).dtype == torch.bfloat16


def test_rms_norm_many_backward_programs(monkeypatch):
    """Rows spread over several backward programs, each over several tiles: dw partials must all be summed."""
    monkeypatch.setattr(fop, "num_sms", lambda device: 1)  # 4 backward programs on any device
    fop._norm_plan.cache_clear()
    x = torch.randn(517, 40, device=DEV)
    plan = fop._norm_plan(517, 40, x.device)
    assert plan["bwd_progs"] > 1 and plan["bwd_per"] > 1
    _grads_vs_fp64(lambda x_, w_, backend: rms_norm(x_, w_, backend=backend), [x, torch.randn(40, device=DEV)], 1e-5)
    fop._norm_plan.cache_clear()


@pytest.mark.parametrize("shape", [(1, 197, 1024), (3, 5, 7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_silu_mul_matches_reference(shape, dtype):
    a = (torch.randn(shape, device=DEV) * 4).to(dtype)
    b = torch.randn(shape, device=DEV).to(dtype)
    _grads_vs_fp64(lambda a_, b_, backend: silu_mul(a_, b_, backend=backend), [a, b], TOL[dtype])


@pytest.mark.parametrize("shape", [(1, 197, 2 * 1024), (3, 5, 2 * 7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_silu_mul_packed_matches_reference(shape, dtype):
    """Packed [..., 2C] input (GLU's fused W_1 | W_2 output): y [..., C], and one [..., 2C] gradient whose both
    halves are written (NaN-poisoned beforehand)."""
    h = (torch.randn(shape, device=DEV) * 4).to(dtype)
    _grads_vs_fp64(lambda h_, backend: silu_mul(h_, backend=backend), [h], TOL[dtype],
                   out_shape=(*shape[:-1], shape[-1] // 2))
    a, b = h.chunk(2, dim=-1)
    torch.testing.assert_close(silu_mul(h, backend="triton"), silu_mul(a, b, backend="triton"), rtol=0, atol=0)


def test_non_contiguous_inputs():
    x = torch.randn(4, 48, 10, device=DEV).transpose(1, 2)  # [4, 10, 48] view, last dim strided
    w = torch.randn(48, device=DEV)
    torch.testing.assert_close(rms_norm(x, w, backend="triton"), rms_norm(x, w, backend="torch"))
    a, b = torch.randn(2, 6, 9, device=DEV).unbind(0)
    torch.testing.assert_close(silu_mul(a.t(), b.t(), backend="triton"), silu_mul(a.t(), b.t(), backend="torch"))
    h = torch.randn(10, 6, device=DEV).t()  # packed [6, 10] view
    torch.testing.assert_close(silu_mul(h, backend="triton"), silu_mul(h, backend="torch"))


def test_bad_inputs_named():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="weight must be"):
        rms_norm(x, torch.ones(7))
    with pytest.raises(ValueError, match="gate must have"):
        rms_norm(x, torch.ones(8), torch.ones(2, 7))
    with pytest.raises(ValueError, match="one shape"):
        silu_mul(x, torch.ones(2, 7))
    with pytest.raises(ValueError, match="even last dim"):
        silu_mul(torch.ones(2, 7))


def test_wide_rows_fall_back_to_reference():
    x = torch.randn(2, fop.MAX_C + 1, device=DEV)
    assert fop.rms_norm_triton(x, torch.ones(x.shape[-1], device=DEV), None, eps=1e-6, out_dtype=x.dtype) is NotImplemented


def test_custom_ops_opcheck():
    x = torch.randn(6, 24, device=DEV, requires_grad=True)
    w = torch.randn(24, device=DEV, requires_grad=True)
    g = torch.randn(6, 24, device=DEV, requires_grad=True)
    torch.library.opcheck(fop.rms_norm_fwd, (x, w, g, 1e-6, torch.float32))
    torch.library.opcheck(fop.rms_norm_fwd, (x, w, None, 1e-6, torch.bfloat16))
    torch.library.opcheck(fop.silu_mul_fwd, (x, g))
    torch.library.opcheck(fop.silu_mul_fwd, (x, None))


def test_layers_compile_without_graph_breaks(monkeypatch):
    """RMSNorm with a gate and GLU under torch.compile(fullgraph=True) take the custom ops; same values and grads."""
    from lightvision.ops import norm as norm_ops

    real_dispatch = norm_ops.dispatch
    monkeypatch.setattr(norm_ops, "dispatch", lambda op, backend, *a: real_dispatch(op, "triton", *a))
    launches = []
    for name in ("rms_norm_fwd_launch", "rms_norm_bwd_launch", "silu_mul_fwd_launch", "silu_mul_bwd_launch"):
        real = getattr(fop, name)
        monkeypatch.setattr(fop, name, lambda *a, _r=real, _n=name: launches.append(_n) or _r(*a))
    torch.manual_seed(0)
    norm, glu = RMSNorm(16).to(DEV), GLU(16, 40).to(DEV)

    def f(x, g):
        return glu(norm(x, g)).square().mean()

    x, g = torch.randn(3, 5, 16, device=DEV), torch.randn(3, 5, 16, device=DEV)
    eager = f(x, g)
    eager.backward()
    ref_grads = [p.grad.clone() for p in (*norm.parameters(), *glu.parameters())]
    assert len(launches) == 4  # eager: the kernels, once each way
    launches.clear()
    for p in (*norm.parameters(), *glu.parameters()):
        p.grad = None
    torch._dynamo.reset()
    with torch.device(DEV):
        compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(x, g)
    compiled.backward()
    assert sorted(launches) == ["rms_norm_bwd_launch", "rms_norm_fwd_launch", "silu_mul_bwd_launch", "silu_mul_fwd_launch"]
    torch.testing.assert_close(compiled, eager)
    for p, r in zip((*norm.parameters(), *glu.parameters()), ref_grads):
        torch.testing.assert_close(p.grad, r)


def _modulation(b, c, dtype=torch.float32):
    """A per-sample [B, C] vector as the DiT block gets it: a strided chunk of a [B, 6, C] modulation output."""
    return (torch.randn(b, 6, c, device=DEV) * 0.7).to(dtype)[:, 2]


@pytest.mark.parametrize("shape", [(1, 197, 24), (3, 33, 384), (2, 256, 768), (4, 5, 7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_modulated_layer_norm_matches_reference(shape, dtype):
    b, _, c = shape
    x = (torch.randn(shape, device=DEV) * 3 + 0.5).to(dtype)
    fn = lambda x_, sh_, sc_, backend: modulated_layer_norm(x_, sh_, sc_, backend=backend)  # noqa: E731
    _grads_vs_fp64(fn, [x, _modulation(b, c), _modulation(b, c)], TOL[dtype])  # fp32 vectors, as in autocast
    _grads_vs_fp64(fn, [x, _modulation(b, c, dtype), _modulation(b, c, dtype)], TOL[dtype])


@pytest.mark.parametrize("shape", [(1, 197, 24), (3, 33, 384), (4, 5, 7)])
@pytest.mark.parametrize("dtypes", [(torch.float32,) * 3, (torch.bfloat16,) * 3, (torch.float16,) * 3,
                                    (torch.bfloat16, torch.float32, torch.bfloat16),
                                    (torch.float32, torch.bfloat16, torch.bfloat16)])
def test_gated_residual_matches_reference(shape, dtypes):
    """x + gate * y in PyTorch's promoted dtype (fp32 as soon as one input is fp32); grads in each input's dtype."""
    x_dt, g_dt, y_dt = dtypes
    b, _, c = shape
    x, y = torch.randn(shape, device=DEV).to(x_dt), torch.randn(shape, device=DEV).to(y_dt)
    out_dtype = torch.promote_types(x_dt, torch.promote_types(g_dt, y_dt))
    fn = lambda x_, g_, y_, backend: gated_residual(x_, g_, y_, backend=backend)  # noqa: E731
    _grads_vs_fp64(fn, [x, _modulation(b, c, g_dt), y], TOL[min(dtypes, key=lambda t: t.itemsize)], out_dtype)


def test_adaln_out_dtype_and_many_programs(monkeypatch):
    """An fp32 stream normed to bf16 (the autocast path) rounds once; with several programs per sample, each over
    several tiles, every partial sum over tokens is counted."""
    monkeypatch.setattr(aop, "num_sms", lambda device: 1)  # P = 2 runs per sample at B = 2
    aop._sample_plan.cache_clear()
    x = torch.randn(2, 61, 40, device=DEV, requires_grad=True)
    shift, scale = _modulation(2, 40).requires_grad_(), _modulation(2, 40).requires_grad_()
    plan = aop._sample_plan(2, 61, 40, x.device)
    assert plan["grid"][1] > 1 and plan["per"] > 1
    y = modulated_layer_norm(x, shift, scale, out_dtype=torch.bfloat16, backend="triton")
    ref_in = [t.detach().double().requires_grad_() for t in (x, shift, scale)]
    y_ref = modulated_layer_norm(*ref_in, backend="torch")
    assert y.dtype == torch.bfloat16 and _rel(y, y_ref) < 4e-3
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, shift, scale), dy)
    ref = torch.autograd.grad(y_ref, ref_in, dy.double())
    assert [t.dtype for t in grads] == [torch.float32] * 3
    assert max(_rel(a, r) for a, r in zip(grads, ref)) < 1e-5
    _grads_vs_fp64(lambda x_, g_, y_, backend: gated_residual(x_, g_, y_, backend=backend),
                   [x.detach(), shift.detach(), torch.randn_like(x)], 1e-5)
    aop._sample_plan.cache_clear()
    with torch.autocast(DEV, dtype=torch.bfloat16):
        assert ModulatedLayerNorm()(x, shift, scale).dtype == torch.bfloat16


def test_adaln_bad_inputs_named():
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match=r"scale must be \[B, C\]"):
        modulated_layer_norm(x, torch.zeros(2, 8), torch.zeros(2, 1, 8))
    with pytest.raises(ValueError, match=r"x must be \[B, N, C\]"):
        modulated_layer_norm(x[0], torch.zeros(2, 8), torch.zeros(2, 8))
    with pytest.raises(ValueError, match="y must be x's shape"):
        gated_residual(x, torch.zeros(2, 8), torch.zeros(2, 5, 7))


def test_adaln_custom_ops_opcheck():
    x = torch.randn(2, 6, 24, device=DEV, requires_grad=True)
    shift, scale = (torch.randn(2, 24, device=DEV, requires_grad=True) for _ in range(2))
    torch.library.opcheck(aop.adaln_fwd, (x, shift, scale, 1e-6, torch.float32))
    torch.library.opcheck(aop.adaln_fwd, (x, shift, scale, 1e-6, torch.bfloat16))
    torch.library.opcheck(aop.gated_residual_fwd, (x, shift, torch.randn_like(x).requires_grad_()))


def test_adaln_compiles_without_graph_breaks(monkeypatch):
    """A DiT-style modulated norm + gated residual under torch.compile(fullgraph=True) takes the custom ops, with the
    eager kernels' values and gradients."""
    from lightvision.ops import adaln

    real_dispatch = adaln.dispatch
    monkeypatch.setattr(adaln, "dispatch", lambda op, backend, *a: real_dispatch(op, "triton", *a))
    launches = []
    for name in ("adaln_fwd_launch", "adaln_bwd_launch", "gated_residual_fwd_launch", "gated_residual_bwd_launch"):
        real = getattr(aop, name)
        monkeypatch.setattr(aop, name, lambda *a, _r=real, _n=name: launches.append(_n) or _r(*a))
    torch.manual_seed(0)
    norm, lin = ModulatedLayerNorm(), torch.nn.Linear(16, 16).to(DEV)

    def f(x, mod):
        shift, scale, gate = mod.unbind(1)
        return gated_residual(x, gate, lin(norm(x, shift, scale))).square().mean()

    x = torch.randn(3, 5, 16, device=DEV, requires_grad=True)
    mod = torch.randn(3, 3, 16, device=DEV, requires_grad=True)
    eager = f(x, mod)
    ref_grads = torch.autograd.grad(eager, (x, mod))
    assert len(launches) == 4
    launches.clear()
    torch._dynamo.reset()
    with torch.device(DEV):
        compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(x, mod)
    grads = torch.autograd.grad(compiled, (x, mod))
    assert sorted(launches) == ["adaln_bwd_launch", "adaln_fwd_launch", "gated_residual_bwd_launch",
                                "gated_residual_fwd_launch"]
    torch.testing.assert_close(compiled, eager)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


# ---- LION feature map phi ----

def _qk_view(b, n, h, d, dtype, scale=2.0):
    """q of a fused qkv projection: a strided [B, H, N, d] view, as LionAttention gets it."""
    qkv = (torch.randn(b, n, 3 * h * d, device=DEV) * scale).to(dtype)
    return split_heads(qkv, h)[0]


@pytest.mark.parametrize("kind", ["silu_norm", "elu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("make", [
    lambda dtype: _qk_view(2, 197, 3, 64, dtype),  # strided view, N = 197 (cls + 14 x 14)
    lambda dtype: _qk_view(1, 5, 1, 24, dtype),  # B = H = 1, d = 24 (padded to 32)
    lambda dtype: (torch.randn(3, 50, 48, device=DEV) * 3).to(dtype),  # 3-D, contiguous
    lambda dtype: (torch.randn(2, 1, 9, 128, device=DEV)).to(dtype).transpose(1, 2),  # [2, 9, 1, 128] view
])
def test_lion_feature_map_matches_reference(kind, dtype, make):
    x = make(dtype)
    _grads_vs_fp64(lambda x_, backend: lion_feature_map(x_, kind, backend=backend), [x], TOL[dtype])


def test_lion_feature_map_values_and_fallbacks():
    x = _qk_view(2, 7, 2, 16, torch.float32)
    y = lion_feature_map(x, "silu_norm", backend="triton")
    torch.testing.assert_close(y.norm(dim=-1), torch.ones(2, 2, 7, device=DEV))  # unit rows: q . k in (0, 1]
    assert (y > 0).all() and y.is_contiguous() and not x.is_contiguous()
    assert (lion_feature_map(x, "elu", backend="triton") > 0).all()
    wide = torch.randn(3, fmap.MAX_D + 8, device=DEV)
    assert fmap.lion_feature_map_triton(wide, kind="elu") is NotImplemented
    with pytest.raises(ValueError, match="LION feature map"):
        lion_feature_map(x, "relu")


def test_lion_feature_map_custom_ops_and_compile(monkeypatch):
    """opcheck, and a LION-S layer's feature maps under torch.compile(fullgraph=True) through the custom ops:
    same values and gradients as eager, both through the kernels."""
    from lightvision.layers.attention import LionAttention

    x = _qk_view(1, 6, 2, 16, torch.float32).detach().requires_grad_()
    torch.library.opcheck(fmap.lion_feature_map_fwd, (x, "silu_norm"))
    torch.library.opcheck(fmap.lion_feature_map_fwd, (x, "elu"))
    launches = []
    for name in ("feature_map_fwd_launch", "feature_map_bwd_launch"):
        real = getattr(fmap, name)
        monkeypatch.setattr(fmap, name, lambda *a, _r=real, _n=name: launches.append(_n) or _r(*a))
    torch.manual_seed(0)
    layer = LionAttention(32, 2, mask="s", backend="triton").to(DEV)
    tokens = torch.randn(2, 10, 32, device=DEV)

    def f(t):
        q, k, _ = layer.split(t)
        return (layer._phi(q) * layer._phi(k)).sum(-1).square().mean()

    eager = f(tokens)
    eager.backward()
    ref = layer.qkv.weight.grad.clone()
    assert sorted(launches) == ["feature_map_bwd_launch"] * 2 + ["feature_map_fwd_launch"] * 2
    launches.clear()
    layer.qkv.weight.grad = None
    torch._dynamo.reset()
    with torch.device(DEV):
        compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(tokens)
    compiled.backward()
    assert sorted(launches) == ["feature_map_bwd_launch"] * 2 + ["feature_map_fwd_launch"] * 2
    torch.testing.assert_close(compiled, eager)
    torch.testing.assert_close(layer.qkv.weight.grad, ref)
