"""The fused Triton RMSNorm (x sigmoid gate), SiLU x mul, modulated LayerNorm, gated residual, LION feature
map and 2-D MD-TPE against their plain references in ``lightvision.ops.norm`` / ``.adaln`` / ``.lion`` / ``.md_tpe``:
forward and every gradient vs fp64, odd row counts and widths, non-square grids with prefix tokens, causal and
two-sided, weak and strong decay, fp32 / bf16 / fp16, fp32 parameters with 16-bit activations (autocast),
NaN-poisoned outputs; custom ops under opcheck and torch.compile. On CPU the kernels run in the Triton interpreter."""

import importlib

import pytest
import torch
import torch.nn.functional as F

import lightvision.kernels.fused  # noqa: F401  (registers the kernels)
from helpers import TOL, rel
from lightvision.kernels import _launch
from lightvision.kernels.fused import adaln as aop, feature_map as fmap, md_tpe as kop, op as fop
from lightvision.layers import GLU, MDTPE, ModulatedLayerNorm, RMSNorm
from lightvision.ops import gated_residual, lion_feature_map, md_tpe, modulated_layer_norm, rms_norm, silu_mul
from lightvision.ops.heads import split_heads

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setattr(_launch, "POISON_OUTPUTS", True)


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
    errs = [rel(y, y_ref)] + [rel(g, r) for g, r in zip(grads, ref_grads)]
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
    assert y.dtype == torch.bfloat16 and rel(y, y_ref) < 4e-3
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, w, g), dy)
    ref = torch.autograd.grad(y_ref, (x, w, g), dy.double())
    assert [t.dtype for t in grads] == [torch.float32] * 3
    assert max(rel(a, b) for a, b in zip(grads, ref)) < 1e-5
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
    _grads_vs_fp64(
        lambda h_, backend: silu_mul(h_, backend=backend), [h], TOL[dtype], out_shape=(*shape[:-1], shape[-1] // 2)
    )
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
    assert (
        fop.rms_norm_triton(x, torch.ones(x.shape[-1], device=DEV), None, eps=1e-6, out_dtype=x.dtype) is NotImplemented
    )


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
    # eager: the kernels once each way, and SiLU x mul's forward again in the backward (GLU rebuilds its product)
    assert sorted(launches) == [
        "rms_norm_bwd_launch",
        "rms_norm_fwd_launch",
        "silu_mul_bwd_launch",
        "silu_mul_fwd_launch",
        "silu_mul_fwd_launch",
    ]
    launches.clear()
    for p in (*norm.parameters(), *glu.parameters()):
        p.grad = None
    torch._dynamo.reset()
    with torch.device(DEV):
        compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(x, g)
    compiled.backward()
    assert sorted(launches) == [
        "rms_norm_bwd_launch",
        "rms_norm_fwd_launch",
        "silu_mul_bwd_launch",
        "silu_mul_fwd_launch",
    ]
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
@pytest.mark.parametrize(
    "dtypes",
    [
        (torch.float32,) * 3,
        (torch.bfloat16,) * 3,
        (torch.float16,) * 3,
        (torch.bfloat16, torch.float32, torch.bfloat16),
        (torch.float32, torch.bfloat16, torch.bfloat16),
    ],
)
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
    assert y.dtype == torch.bfloat16 and rel(y, y_ref) < 4e-3
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, shift, scale), dy)
    ref = torch.autograd.grad(y_ref, ref_in, dy.double())
    assert [t.dtype for t in grads] == [torch.float32] * 3
    assert max(rel(a, r) for a, r in zip(grads, ref)) < 1e-5
    _grads_vs_fp64(
        lambda x_, g_, y_, backend: gated_residual(x_, g_, y_, backend=backend),
        [x.detach(), shift.detach(), torch.randn_like(x)],
        1e-5,
    )
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
    assert sorted(launches) == [
        "adaln_bwd_launch",
        "adaln_fwd_launch",
        "gated_residual_bwd_launch",
        "gated_residual_fwd_launch",
    ]
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
@pytest.mark.parametrize(
    "make",
    [
        lambda dtype: _qk_view(2, 197, 3, 64, dtype),  # strided view, N = 197 (cls + 14 x 14)
        lambda dtype: _qk_view(1, 5, 1, 24, dtype),  # B = H = 1, d = 24 (padded to 32)
        lambda dtype: (torch.randn(3, 50, 48, device=DEV) * 3).to(dtype),  # 3-D, contiguous
        lambda dtype: (torch.randn(2, 1, 9, 128, device=DEV)).to(dtype).transpose(1, 2),  # [2, 9, 1, 128] view
    ],
    ids=["qk_view-n197-d64", "qk_view-b1-h1-d24", "3d-contiguous", "transposed-d128"],
)
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


def _tpe_params(c, lam_lo, lam_hi):
    coeffs = torch.randn(2, c, 4, device=DEV) / 4
    log_lambda = torch.log(torch.linspace(lam_lo, lam_hi, 4, device=DEV)).repeat(2, 1)
    return coeffs, log_lambda


def _check_md_tpe(x, grid, coeffs, log_lambda, prefix, causal):
    """Output and the gradients of x, coeffs, log-lambda vs fp64; prefix rows of y and dx exactly 0."""

    def fn(x_, c_, l_, backend):
        return md_tpe(x_, grid, c_, l_, num_prefix_tokens=prefix, causal=causal, backend=backend)

    _grads_vs_fp64(fn, [x, coeffs, log_lambda], TOL[x.dtype])
    leaf = x.detach().requires_grad_()
    y = fn(leaf, coeffs, log_lambda, "triton")
    (dx,) = torch.autograd.grad(y, leaf, torch.randn_like(y))
    assert (y[:, :prefix] == 0).all() and (dx[:, :prefix] == 0).all()  # prefix tokens neither mix nor mix in


@pytest.mark.parametrize(
    "b, grid, prefix, c", [(2, (14, 14), 1, 24), (1, (5, 7), 0, 40), (3, (32, 9), 2, 12), (2, (1, 6), 1, 8)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_md_tpe_kernel_matches_reference(b, grid, prefix, c, dtype, causal):
    x = torch.randn(b, prefix + grid[0] * grid[1], c, device=DEV).to(dtype)
    _check_md_tpe(x, grid, *_tpe_params(c, 0.5, 0.95), prefix, causal)


@pytest.mark.parametrize("lam", [(0.05, 0.2), (0.99, 0.999)])  # strong and weak decay
def test_md_tpe_kernel_decay_range(lam):
    x = torch.randn(2, 1 + 7 * 11, 16, device=DEV)
    _check_md_tpe(x, (7, 11), *_tpe_params(16, *lam), 1, False)


def test_md_tpe_kernel_strided_input_and_many_grad_programs(monkeypatch):
    """x read in place through its row stride (a channel slice of a wider tensor); the dT partials spread over
    several programs, each summing several batches, the last one partly past the batch."""
    monkeypatch.setattr(kop, "num_sms", lambda device: 1)
    wide = torch.randn(9, 1 + 6 * 5, 56, device=DEV)
    x = wide[..., 8:40]
    assert not x.is_contiguous() and x.stride(-1) == 1
    _check_md_tpe(x, (6, 5), *_tpe_params(32, 0.5, 0.95), 1, False)


def test_md_tpe_kernel_fallbacks():
    coeffs, log_lambda = _tpe_params(8, 0.5, 0.9)
    big = (kop.MAX_AXIS + 1, 2)
    x = torch.randn(1, big[0] * big[1], 8, device=DEV)
    kw = dict(num_prefix_tokens=0, causal=False, impl="dense", combine="sum")
    assert kop.md_tpe_triton(x, coeffs, log_lambda, grid=big, **kw) is NotImplemented
    assert kop.md_tpe_triton(x[:, :6], coeffs, log_lambda, grid=(2, 3), **dict(kw, impl="scan")) is NotImplemented
    assert kop.md_tpe_triton(x[:, :6], coeffs, log_lambda, grid=(2, 3), **dict(kw, combine="product")) is NotImplemented
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


def test_feature_map_bwd_inplace_checks_layouts():
    """The in-place backward (the packed LION core's dqkv) turns dy into dx where it lies, and refuses a gradient
    laid out differently from x."""
    x = torch.randn(2, 5, 3, 16, device=DEV).transpose(1, 2)  # [B, H, N, d] view of [B, N, H, d]
    dy = torch.randn(2, 5, 3, 16, device=DEV).transpose(1, 2)
    want = fmap.feature_map_bwd_launch(dy, x, "silu_norm")
    fmap.feature_map_bwd_inplace(x, dy, "silu_norm")
    torch.testing.assert_close(dy, want)
    with pytest.raises(ValueError, match="same strides"):
        fmap.feature_map_bwd_inplace(x, torch.randn(2, 3, 5, 16, device=DEV), "elu")
