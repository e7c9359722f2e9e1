"""The Triton one-scan LightNet kernel against the plain reference ``lightvision.ops.lightnet_attention``.

Forward and all three gradients vs the reference evaluated in fp64, fresh random inputs per case, odd
sizes, fp32 / bf16 / fp16, every kernel output and workspace NaN-poisoned before the launches.
On CPU the kernels run in the Triton interpreter (tests/conftest.py); shapes stay tiny.
"""

import functools
import math

import pytest
import torch

import lightvision.kernels.lightnet as lk
from helpers import TOL, rel
from lightvision.kernels import _launch
from lightvision.kernels.lightnet import op as lop
from lightvision.ops._dispatch import get_kernel
from lightvision.ops.lightnet import lightnet_attention
from lightvision.ops.md_lrpe import lrpe_angles

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setattr(_launch, "POISON_OUTPUTS", True)
    # 16-bit matrix-product operands as on the GPU: conftest.py repairs the interpreter's bf16 dot
    monkeypatch.setattr(lop, "_lowp", lambda dtype: dtype != torch.float32)
    lop._config.cache_clear()  # launch configs cache LOWP
    yield
    lop._config.cache_clear()


def _inputs(b, h, n, d, dv, dtype, k_scale=2.0):
    q = torch.randn(b, h, n, d, device=DEV, dtype=dtype)
    k = (torch.randn(b, h, n, d, device=DEV) * k_scale).to(dtype)
    v = torch.randn(b, h, n, dv, device=DEV, dtype=dtype)
    return q, k, v


def _check(q, k, v, dtype, **kw):
    """Kernel (backend='triton') vs fp64 reference: output and dq, dk, dv under a random upstream grad."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    o = lightnet_attention(*leaves, backend="triton", **kw)
    assert o.dtype == dtype and o.shape == (*q.shape[:3], v.shape[-1])
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, leaves, do)
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    o_ref = lightnet_attention(*ref_leaves, backend="torch", **kw)
    ref_grads = torch.autograd.grad(o_ref, ref_leaves, do.double())
    tol = TOL[dtype]
    errs = [rel(o, o_ref)] + [rel(g, r) for g, r in zip(grads, ref_grads)]
    assert max(errs) < tol, f"rel errors o, dq, dk, dv = {errs}"
    for g, t in zip(grads, (q, k, v)):
        assert g.dtype == t.dtype and g.shape == t.shape


def _check_packed(b, n, d, dtype, **kw):
    """The packed entry (two heads of d features) against the fp64 reference: output and the qkv gradient; returns
    the reference output."""
    from lightvision.ops import lightnet_attention_qkvpacked

    qkv = (torch.randn(b, n, 3 * 2 * d, device=DEV) * 1.5).to(dtype).requires_grad_()
    o = lightnet_attention_qkvpacked(qkv, 2, backend="triton", **kw)
    do = torch.randn_like(o)
    (g,) = torch.autograd.grad(o, qkv, do)
    ref_qkv = qkv.detach().double().requires_grad_()
    o_ref = lightnet_attention_qkvpacked(ref_qkv, 2, backend="torch", **kw)
    (g_ref,) = torch.autograd.grad(o_ref, ref_qkv, do.double())
    assert max(rel(o, o_ref), rel(g, g_ref)) < TOL[dtype]
    return o_ref


def _path(b, h, n, d, dv, dtype) -> str:
    """Launch plan the kernel picks: "fused" (one program per (b, h), one launch each way) or "split"."""
    return "fused" if lop._plan(n, b * h, d, dv, torch.device(DEV), dtype == torch.float32)["fused"] else "split"


def _check_path(b, h, n, d, dv, dtype, path):
    # on CPU (2 "SMs", so 4 resident programs in ``_split_cost``; 16-token tiles) the plans of these small cases
    # are fixed; the GPU plans differ
    if DEV == "cpu":
        assert _path(b, h, n, d, dv, dtype) == path


# (B, H, grid, prefix, d, d_v, dtype, path): both launch plans, several tiles per program, non-power-of-2 d,
# 1-D and 2-D grids, prefix tokens.
CASES = [
    (1, 2, (3, 4), 1, 16, 24, torch.float32, "fused"),
    (2, 1, (5, 7), 1, 24, 16, torch.float32, "split"),
    (1, 1, (7, 7), 1, 16, 16, torch.float32, "split"),
    (1, 2, (23,), 0, 24, 24, torch.float32, "split"),
    (1, 2, (5, 7), 1, 24, 16, torch.bfloat16, "split"),
    (2, 1, (3, 3), 2, 16, 16, torch.float16, "fused"),
    (1, 1, (3, 5), 1, 48, 32, torch.float32, "fused"),
    (2, 2, (5, 7), 1, 24, 16, torch.float32, "fused"),
    (4, 1, (41,), 0, 16, 24, torch.float32, "fused"),
    (2, 3, (5, 7), 1, 24, 16, torch.bfloat16, "fused"),
    (1, 4, (6, 6), 2, 48, 32, torch.float16, "fused"),
    (1, 1, (3, 3), 1, 128, 64, torch.float32, "split"),  # d = 128: the split plan even with one split
    (1, 1, (3, 5), 0, 72, 72, torch.float32, "split"),  # d = 72 (LightNet-DiT-XL/2): padded to 128, split plan
    (1, 2, (2, 5), 1, 72, 72, torch.bfloat16, "split"),
    (2, 1, (3, 4), 1, 40, 40, torch.float32, "fused"),  # d = 40: padded to 64
]


@pytest.mark.parametrize("b,h,grid,prefix,d,dv,dtype,path", CASES)
def test_matches_reference_with_lrpe(b, h, grid, prefix, d, dv, dtype, path):
    n = math.prod(grid) + prefix
    _check_path(b, h, n, d, dv, dtype, path)
    _check(*_inputs(b, h, n, d, dv, dtype), dtype, grid=grid, num_prefix_tokens=prefix)


VARIANT_CASES = [
    (v, dtype, path)
    for v in ("global", "mixed", "per_axis")
    for dtype, path in ((torch.float32, "split"), (torch.bfloat16, "fused"))
]


@pytest.mark.parametrize(
    "variant,dtype,path", VARIANT_CASES, ids=[f"{v}-{str(t)[6:]}-{p}" for v, t, p in VARIANT_CASES]
)
def test_lrpe_variants_match_reference(variant, dtype, path):
    """Every MD-LRPE variant's tables through both entries (separate q, k, v and the packed projection): output and
    every gradient against the fp64 reference on a non-square grid with a prefix token."""

    grid, prefix, d = (5, 7), 1, 24
    n = math.prod(grid) + prefix
    b = 2 if path == "fused" else 1
    _check_path(b, 2, n, d, d, dtype, path)
    _check(*_inputs(b, 2, n, d, d, dtype), dtype, grid=grid, num_prefix_tokens=prefix, lrpe=variant)
    _check_packed(b, n, d, dtype, grid=grid, num_prefix_tokens=prefix, lrpe=variant)


SCALE_CASES = [
    ((14, 14), (0.5, 0.5), torch.float32, "split"),  # N = 197: a 7 x 7 training grid evaluated at 2x
    ((6, 9), (4 / 6, 4 / 9), torch.bfloat16, "fused"),  # a 4 x 4 training grid at a non-square size
    ((4, 4), (2.0, 2.0), torch.float32, "fused"),  # a smaller grid than the training one
]


@pytest.mark.parametrize(
    "grid,scale,dtype,path", SCALE_CASES, ids=[f"{g[0]}x{g[1]}-{str(t)[6:]}-{p}" for g, _, t, p in SCALE_CASES]
)
def test_position_scale_matches_reference(grid, scale, dtype, path):
    """MD-LRPE in image units (``pos_scale`` = training grid / grid): the kernels' tables, both entries, output and
    every gradient against the fp64 reference at grids other than the training one, weak and strong key softmax."""
    from lightvision.ops import lightnet_attention_qkvpacked

    prefix, d = 1, 16
    n = math.prod(grid) + prefix
    b = 2 if path == "fused" else 1
    _check_path(b, 2, n, d, d, dtype, path)
    for k_scale in (0.3, 4.0):
        _check(*_inputs(b, 2, n, d, d, dtype, k_scale), dtype, grid=grid, num_prefix_tokens=prefix, pos_scale=scale)
    o_ref = _check_packed(1, n, d, dtype, grid=grid, num_prefix_tokens=prefix, pos_scale=scale)
    qkv = torch.randn(1, n, 3 * 2 * d, device=DEV, dtype=torch.float64)
    scaled = lightnet_attention_qkvpacked(qkv, 2, backend="torch", grid=grid, num_prefix_tokens=1, pos_scale=scale)
    unscaled = lightnet_attention_qkvpacked(qkv, 2, backend="torch", grid=grid, num_prefix_tokens=1)
    assert rel(unscaled, scaled) > 1e-3 and o_ref.shape == scaled.shape  # token units give another output


@pytest.mark.parametrize("b,n,grid,path", [(1, 7, None, "fused"), (1, 37, (37,), "split"), (2, 37, None, "fused")])
def test_matches_reference_without_lrpe(b, n, grid, path):
    # lrpe=False, or no grid (the reference then applies no rotation either)
    _check_path(b, 2, n, 16, 24, torch.float32, path)
    _check(*_inputs(b, 2, n, 16, 24, torch.float32), torch.float32, grid=grid, lrpe=False)


@pytest.mark.parametrize("b,path", [(1, "split"), (4, "fused")])
def test_large_keys_across_tiles(b, path):
    # keys offset by +100 (exp overflows fp32 without the max subtracted) on the first tiles for half the
    # features and on the last tiles for the other half: the per-feature max of each chunk (fused: all tiles
    # of one program; split: each split, then the merge of the split partials rescales) must catch both
    n = 41
    _check_path(b, 1, n, 16, 16, torch.float32, path)
    q, k, v = _inputs(b, 1, n, 16, 16, torch.float32, k_scale=1.0)
    k[:, 0, :9, :8] += 100.0
    k[:, 0, 32:, 8:] += 100.0
    _check(q, k, v, torch.float32, grid=(5, 8), num_prefix_tokens=1)


def test_combine_reads_the_splits_in_chunks(monkeypatch):
    # The combine programs read COMBINE_SPLITS split partials per step: 7 splits in steps of 2 (the last one half
    # empty), with +100 key offsets in the first and last splits, so a chunk's max, the rescale between chunks and
    # the masked split slots all count; the backward combine sums the dS partials the same way.
    monkeypatch.setattr(lop, "COMBINE_SPLITS", 2)
    monkeypatch.setattr(lop, "_plan", functools.lru_cache(functools.partial(lop._plan.__wrapped__, splits=7)))
    lop._config.cache_clear()
    n = 7 * 64  # 7 tiles or more on either device (64-token tiles on the GPU, 16 in the interpreter)
    config = lop._config(n, 2, 16, 16, torch.device(DEV), torch.float32, True)
    assert config.splits == 7 and config.small["SB"] == 2
    q, k, v = _inputs(1, 2, n, 16, 16, torch.float32, k_scale=1.0)
    k[:, :, :64, :8] += 100.0
    k[:, :, -64:, 8:] += 100.0
    _check(q, k, v, torch.float32, grid=(n - 1,), num_prefix_tokens=1)


@pytest.mark.parametrize("b,h,path", [(1, 2, "split"), (2, 2, "fused")])
def test_fused_qkv_strided_views(b, h, path):
    # q, k, v as slices of one projection: [B, N, 3, H, d] permuted, neither contiguous nor copied
    grid, d = (4, 5), 16
    n = math.prod(grid) + 1
    _check_path(b, h, n, d, d, torch.float32, path)
    qkv = torch.randn(b, n, 3, h, d, device=DEV).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    assert not q.is_contiguous()
    _check(q, k, v, torch.float32, grid=grid, num_prefix_tokens=1)


def test_plan_fills_waves(monkeypatch):
    # an H100's 132 SMs, 2 programs resident each: one program per (b, h) when B*H fills the waves (N = 196,
    # B*H = 1536: 5.8 waves of 264), splits when one wave would run nearly empty (N = 1024, B*H = 288 is 1.09
    # waves fused), and one full wave rather than 2.2 at N = 4096, B*H = 72
    monkeypatch.setattr(lop, "num_sms", lambda device: 132)
    monkeypatch.setattr(lop, "interpreting", lambda: False)
    plan = functools.partial(lop._plan.__wrapped__, d=64, dv=64, device=torch.device("cuda"), fp32=False)
    assert plan(196, 1536)["fused"] and plan(576, 576)["fused"]
    assert plan(1024, 288)["splits"] == 2 and not plan(1024, 288)["fused"]
    assert plan(4096, 72)["splits"] == 3
    assert plan(65536, 6)["splits"] == 43  # 258 programs of 24 tiles
    assert plan(1024, 288, splits=1)["fused"]


def test_saved_state_is_the_normalised_reduction():
    # S = k~^T v with k~ = MD-LRPE(softmax_N(k)), lse = logsumexp_N(k): the only state kept for backward
    b, h, grid, d, dv = 1, 2, (3, 5), 16, 24
    q, k, v = _inputs(b, h, 16, d, dv, torch.float32)
    o, s, lse = lk.lightnet_attn_fwd(q, k, v, *lop.rotation_tables(grid, 1, d, 1, q.dtype, q.device), True)
    ang = lrpe_angles(grid, d, 1, device=DEV).double()
    kh = torch.softmax(k.double(), dim=2)
    kt = torch.cat([kh * torch.cos(ang), kh * torch.sin(ang)], -1)
    assert rel(s, kt.transpose(-1, -2) @ v.double()) < 1e-6
    assert rel(lse, torch.logsumexp(k.double(), dim=2)) < 1e-6


def test_dispatch_registration_and_fallbacks():
    assert get_kernel("lightnet_attention") is lk.lightnet_attention_triton
    q, k, v = _inputs(1, 1, 9, 16, 16, torch.float32)
    # configurations the kernel does not cover are declined, so "auto" runs the reference
    assert lk.lightnet_attention_triton(q, k, v, causal=True) is NotImplemented
    assert lk.lightnet_attention_triton(q, k, v, key_softmax=False) is NotImplemented
    assert lk.lightnet_attention_triton(q[..., :10], k[..., :10], v) is NotImplemented
    assert lk.lightnet_attention_triton(q[:0], k[:0], v[:0]) is NotImplemented
    with pytest.raises(RuntimeError):
        lightnet_attention(q, k, v, causal=True, backend="triton")
    o = lightnet_attention(q, k, v, causal=True, backend="auto")
    assert torch.isfinite(o).all()


def test_custom_op_opcheck():
    # schema, fake (meta) kernels and autograd registration of lightvision::lightnet_attn_fwd / _bwd
    q, k, v = _inputs(1, 2, 10, 16, 16, torch.float32)
    args = [t.requires_grad_() for t in (q, k, v)] + [*lop.rotation_tables((3, 3), 1, 16, 1, q.dtype, q.device), True]
    torch.library.opcheck(
        torch.ops.lightvision.lightnet_attn_fwd.default,
        args,
        test_utils=("test_schema", "test_faketensor", "test_autograd_registration"),
    )
    # the custom op's own autograd formula (the path torch.compile takes) agrees with the eager path
    o = torch.ops.lightvision.lightnet_attn_fwd(*args)[0]
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, args[:3], do)
    eager = [t.detach().requires_grad_() for t in (q, k, v)]
    o_eager = lk.lightnet_attention_triton(*eager, grid=(3, 3), num_prefix_tokens=1)
    torch.testing.assert_close(o, o_eager)
    for g, r in zip(grads, torch.autograd.grad(o_eager, eager, do)):
        torch.testing.assert_close(g, r)


def test_compiles_without_graph_breaks():
    # the custom ops are opaque to dynamo: fullgraph capture through forward and backward
    q, k, v = _inputs(1, 2, 10, 16, 16, torch.float32)

    def f(q, k, v):
        return lightnet_attention(q, k, v, grid=(3, 3), num_prefix_tokens=1, backend="triton").square().sum()

    torch._dynamo.reset()
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    loss = torch.compile(f, backend="aot_eager", fullgraph=True)(*leaves)
    grads = torch.autograd.grad(loss, leaves)
    ref_leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    ref_grads = torch.autograd.grad(f(*ref_leaves), ref_leaves)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


@pytest.mark.parametrize(
    "b,h,grid,prefix,d,dtype,group,path",
    [
        (2, 2, (4, 5), 1, 16, torch.float32, 2, "split"),
        (4, 2, (4, 5), 1, 16, torch.float32, 2, "fused"),
        (1, 1, (5, 7), 1, 24, torch.float32, 1, "split"),
        (1, 3, (3, 7), 0, 24, torch.bfloat16, 1, "fused"),
        (4, 2, (3, 7), 1, 24, torch.float32, 2, "fused"),
        (1, 4, (5, 7), 1, 24, torch.bfloat16, 2, "split"),
        (2, 8, (3, 5), 1, 16, torch.bfloat16, 4, "fused"),
        (1, 4, (4, 9), 0, 32, torch.float32, 2, "split"),
        (4, 1, (3, 3), 1, 48, torch.float16, 1, "fused"),
        (1, 2, (3, 5), 0, 72, torch.bfloat16, 1, "split"),  # LightNet-DiT-XL/2's head dim
    ],
)
def test_qkvpacked_matches_reference(b, h, grid, prefix, d, dtype, group, path):
    """The packed entry (o written as [B, N, H, d], dqkv written in place) vs the fp64 reference on the same
    views: output and the one gradient, NaN-poisoned outputs, both launch plans; small heads run ``group`` to a
    program (block-diagonal S, ``head_group``), so cross-head terms would show as errors."""
    from lightvision.ops import lightnet_attention_qkvpacked

    n = math.prod(grid) + prefix
    assert lop.head_group(h, d) == group
    _check_path(b, h // group, n, d * group, d * group, dtype, path)
    qkv = (torch.randn(b, n, 3 * h * d, device=DEV) * 1.5).to(dtype).requires_grad_()
    o = lightnet_attention_qkvpacked(qkv, h, grid=grid, num_prefix_tokens=prefix, backend="triton")
    assert o.shape == (b, n, h * d) and o.dtype == dtype and o.is_contiguous()
    do = torch.randn_like(o)
    (g,) = torch.autograd.grad(o, qkv, do)
    ref_qkv = qkv.detach().double().requires_grad_()
    o_ref = lightnet_attention_qkvpacked(ref_qkv, h, grid=grid, num_prefix_tokens=prefix, backend="torch")
    (g_ref,) = torch.autograd.grad(o_ref, ref_qkv, do.double())
    assert max(rel(o, o_ref), rel(g, g_ref)) < TOL[dtype]
    assert g.dtype == dtype and g.shape == qkv.shape


def test_qkvpacked_custom_ops_and_compile():
    from lightvision.ops import lightnet_attention_qkvpacked

    qkv = torch.randn(2, 10, 3 * 2 * 16, device=DEV, requires_grad=True)
    tables = lop.rotation_tables((3, 3), 1, 16, lop.head_group(2, 16), qkv.dtype, qkv.device)  # two heads a program
    torch.library.opcheck(
        torch.ops.lightvision.lightnet_attn_packed_fwd.default,
        [qkv, 2, *tables, True],
        test_utils=("test_schema", "test_faketensor", "test_autograd_registration"),
    )

    def f(t):
        return lightnet_attention_qkvpacked(t, 2, grid=(3, 3), num_prefix_tokens=1, backend="triton").square().sum()

    torch._dynamo.reset()
    lop._cached_rotation_tables.cache_clear()
    (g,) = torch.autograd.grad(torch.compile(f, backend="aot_eager", fullgraph=True)(qkv), qkv)
    # compiled, the rotation tables are computed by the graph: a cached table made during a CUDA-graph warm-up
    # (mode="reduce-overhead") would stay in the graph's memory pool, owned by no output
    assert lop._cached_rotation_tables.cache_info().currsize == 0
    (g_eager,) = torch.autograd.grad(f(qkv), qkv)
    torch.testing.assert_close(g, g_eager)
    assert get_kernel("lightnet_attention_qkvpacked") is lk.lightnet_attention_qkvpacked_triton
    assert lk.lightnet_attention_qkvpacked_triton(qkv[..., :90], 2) is NotImplemented  # d = 15


_KERNEL_PATH_GRAPHS = """
import os, sys
if sys.argv[1] == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"
import torch, timm
import lightvision  # noqa: F401  (the models; no kernel family imported yet)
import gc
gc.freeze()  # the imported objects stay out of the children's collections
failed = 0
for mode in ("preload", "lazy"):  # each in a forked process: both start with no kernel family imported
    if os.fork():
        failed |= os.wait()[1]
        continue
    from lightvision.ops import _dispatch, preload_kernels
    real = _dispatch.dispatch
    for mod in ("lightnet", "norm", "md_tpe", "lion"):
        m = sys.modules.get("lightvision.ops." + mod)
        if m is not None and hasattr(m, "dispatch"):
            m.dispatch = lambda op, backend, *a: real(op, "triton" if backend == "auto" else backend, *a)
    if mode == "preload":
        preload_kernels()
    model = timm.create_model("lightnet_deit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=32, depth=2,
                              num_heads=2, num_classes=7).eval().to(sys.argv[1])
    x = torch.randn(1, 3, 16, 16, device=sys.argv[1])
    print(mode, torch._dynamo.explain(model)(x).graph_break_count)
    sys.exit(0)
sys.exit(1 if failed else 0)
"""


def test_model_kernel_path_traces_as_one_graph_after_preload(tmp_path):
    # in a fresh process (no kernel family imported; the kernels forced, on CPU in the Triton interpreter), forked
    # once per mode after the imports: the lazy family import of a first call is not traceable (a graph break per
    # op); lightvision.engine.compile_model calls preload_kernels first. The process runs in an empty folder, so
    # the installed package is imported, not a checkout's lightvision/ folder
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", _KERNEL_PATH_GRAPHS, DEV], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr[-2000:]
    breaks = dict(line.split() for line in run.stdout.strip().splitlines()[-2:])
    assert int(breaks["preload"]) == 0
    assert int(breaks["lazy"]) > 0


def test_tables_cached_in_inference_mode_serve_a_training_step():
    """Evaluate under torch.inference_mode(), then train: the cached rotation tables are saved for the backward, so
    they must not be inference tensors (a LightNet model's first training step after an evaluation failed so)."""
    from lightvision.ops import lightnet_attention_qkvpacked

    lop._cached_rotation_tables.cache_clear()
    qkv = torch.randn(1, 10, 3 * 2 * 16, device=DEV)
    with torch.inference_mode():
        lightnet_attention_qkvpacked(qkv, 2, grid=(3, 3), num_prefix_tokens=1, backend="triton")
        lightnet_attention(
            *_inputs(1, 2, 10, 16, 16, torch.float32), grid=(3, 3), num_prefix_tokens=1, backend="triton"
        )
    x = qkv.clone().requires_grad_()
    lightnet_attention_qkvpacked(x, 2, grid=(3, 3), num_prefix_tokens=1, backend="triton").sum().backward()
    leaves = [t.requires_grad_() for t in _inputs(1, 2, 10, 16, 16, torch.float32)]
    lightnet_attention(*leaves, grid=(3, 3), num_prefix_tokens=1, backend="triton").sum().backward()
    assert torch.isfinite(x.grad).all() and all(torch.isfinite(t.grad).all() for t in leaves)
