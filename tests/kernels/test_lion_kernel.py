"""The Triton LION kernels (parallel flash-style and bidirectional scan) against the plain references
``lightvision.ops.lion_attention`` / ``lion_snake_attention`` / ``two_scan_attention`` evaluated in fp64.

Forward and every gradient (q, k, v, log-decay or per-token gates), fresh random inputs per case, odd
sizes, fp32 / bf16, weak and strong decay, all kernel outputs and workspaces NaN-poisoned. On CPU the
kernels run in the Triton interpreter (tests/conftest.py): shapes stay tiny.
"""

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import lightvision.kernels.lion as lk
from helpers import TOL, load_script, rel
from lightvision.kernels import _launch
from lightvision.kernels.lion.parallel import _gate_row, _span
from lightvision.ops import (
    get_kernel,
    lion_attention,
    lion_attention_qkvpacked,
    lion_snake_attention,
    two_scan_attention,
)
from lightvision.ops.lion import gate_columns

DEV = "cuda" if torch.cuda.is_available() else "cpu"
_case, _d_mass = (getattr(load_script("lion_check"), name) for name in ("_case", "_d_mass"))  # the GPU sweep's measures


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setattr(_launch, "POISON_OUTPUTS", True)


def _inputs(b, h, n, d, dv, dtype):
    """Positive feature-mapped q, k (LION's normalised shifted SiLU), v; fresh each call."""
    q = F.normalize(F.silu(torch.randn(b, h, n, d, device=DEV)) + 0.5, dim=-1).to(dtype)
    k = F.normalize(F.silu(torch.randn(b, h, n, d, device=DEV)) + 0.5, dim=-1).to(dtype)
    return q, k, torch.randn(b, h, n, dv, device=DEV).to(dtype)


def _log_decay(mask, b, h, n, strength, prefix):
    """Weak: lambda ~ 0.98; strong: lambda ~ 0.5 (D: sigmoid(N(0, 0.5^2)) per head; S: sigmoid(N(0, 1))
    per token). Nearly diagonal masks (lambda -> 0) make dq, dk ill-conditioned in bf16 (a small difference
    of large terms, as for a peaked softmax); docs/kernels_lion.md gives the measured errors."""
    if mask == "lit":
        return None
    shift = 4.0 if strength == "weak" else 0.0
    if mask == "d":
        return F.logsigmoid(0.5 * torch.randn(h, device=DEV) + shift)
    la = F.logsigmoid(torch.randn(b, h, n, device=DEV) + shift)
    la[..., :prefix] = 0.0  # prefix / cls gate 1
    return la


def _check(fn, tensors, dtype, normalize=True, scales=None, grad_names=("dq", "dk", "dv", "dlog_decay")):
    """fn(*tensors) on Triton vs fn in fp64 on the reference: outputs and all gradients (named grad_names) under
    random upstream gradients. ``scales`` maps an output name to a function of the upstream gradients giving the
    norm its error is measured against instead of the reference's own norm (reductions that cancel)."""
    leaves = [t.detach().requires_grad_() for t in tensors]
    out = fn(*leaves, backend="triton")
    outs = out if isinstance(out, tuple) else (out,)
    ups = [torch.randn_like(o) for o in outs]  # in the output dtype: both sides get the same upstream
    grads = torch.autograd.grad(outs, leaves, ups)
    ref_leaves = [t.detach().double().requires_grad_() for t in tensors]
    ref = fn(*ref_leaves, backend="torch")
    refs = ref if isinstance(ref, tuple) else (ref,)
    ref_grads = torch.autograd.grad(refs, ref_leaves, [u.double() for u in ups])
    tol = TOL[dtype]
    if normalize:
        assert outs[0].dtype == dtype
    names = [f"out{i}" for i in range(len(outs))] + list(grad_names[: len(leaves)])
    errs = {n: rel(a, b) for n, a, b in zip(names, (*outs, *grads), (*refs, *ref_grads))}
    for n, scale in (scales or {}).items():
        errs[n] = errs[n] * ref_grads[names.index(n) - len(outs)].norm().item() / scale(ups)
    bad = {n: e for n, e in errs.items() if not e < tol}
    assert not bad, f"errors over {tol}: {bad} (all: {errs})"


def test_registered():
    assert get_kernel("lion_attention") is lk.lion_attention
    assert get_kernel("two_scan_attention") is lk.two_scan_attention
    assert get_kernel("lion_attention_qkvpacked") is lk.lion_attention_qkvpacked


def _d_grad_mass(fn, tensors, ld, ups):
    """D's per-head gradient is a sum over B * N tokens that cancels: its error is measured against the
    norm over heads of the summed magnitudes of the per-token terms (the gradient of the same mask run as
    S with constant gates [B, H, N], through the reference fn(*tensors, gates); B, N from tensors[0], which is
    q [B, H, N, d] or qkv [B, N, 3 * H * d]), the conditioning-aware version of docs/spec.md 2's relative error."""
    leaves = [t.detach().double() for t in tensors]
    return _d_mass(
        lambda g: fn(*leaves, g, backend="torch"), ld, tensors[0].shape[0], tensors[0].shape[-2], ups[0]
    ).item()


def _check_lion(q, k, v, ld, mask, form, dtype):
    """_check of lion_attention(mask, form) with log-decays ld (None for LIT); D's decay gradient against the
    summed magnitudes of its per-token terms (_d_grad_mass)."""
    tensors = (q, k, v) if ld is None else (q, k, v, ld)

    def fn(q, k, v, *ld, backend):
        return lion_attention(q, k, v, mask=mask, log_decay=ld[0] if ld else None, form=form, backend=backend)

    def fn_s(q, k, v, g, backend):
        return lion_attention(q, k, v, mask="s", log_decay=g, form=form, backend=backend)

    scales = {"dlog_decay": lambda ups: _d_grad_mass(fn_s, (q, k, v), ld, ups)} if mask == "d" else None
    _check(fn, tensors, dtype, scales=scales)


@pytest.mark.parametrize("form", ["parallel", "scan"])
@pytest.mark.parametrize("mask", ["lit", "d", "s"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,prefix,strength", [(7, 0, "weak"), (33, 1, "strong")])
def test_lion_attention(form, mask, dtype, n, prefix, strength):
    b, h, d, dv = 2, 3, 16, 24
    q, k, v = _inputs(b, h, n, d, dv, dtype)
    ld = _log_decay(mask, b, h, n, strength, prefix)
    _check_lion(q, k, v, ld, mask, form, dtype)


def _check_packed(b, n, h, d, mask, form, dtype, strength, prefix):
    """_check of lion_attention_qkvpacked on a raw (un-feature-mapped) qkv [B, N, 3 * H * d]: Y and the gradients
    of qkv and the log-decays; D's decay gradient as in _check_lion."""
    qkv = torch.randn(b, n, 3 * h * d, device=DEV).to(dtype)
    ld = _log_decay(mask, b, h, n, strength, prefix)
    tensors = (qkv,) if ld is None else (qkv, ld)

    def fn(qkv, *ld, backend, mask=mask):
        return lion_attention_qkvpacked(qkv, h, mask=mask, log_decay=ld[0] if ld else None, form=form, backend=backend)

    def fn_s(qkv, g, backend):
        return fn(qkv, g, backend=backend, mask="s")

    scales = {"dlog_decay": lambda ups: _d_grad_mass(fn_s, (qkv,), ld, ups)} if mask == "d" else None
    _check(fn, tensors, dtype, scales=scales, grad_names=("dqkv", "dlog_decay"))


def _check_gates_in_qkv(b, n, h, d, form, dtype, strength, prefix):
    """_check of lion_attention_qkvpacked(mask="s", gates_in_qkv=True) on [qkv, gate logits z, padding]: Y and the
    gradients of qkv and z (weak: z ~ N(4, 1), a ~ 0.98; strong: z ~ N(0, 1))."""
    qkv = torch.randn(b, n, 3 * h * d, device=DEV).to(dtype)
    z = (torch.randn(b, n, h, device=DEV) + (4.0 if strength == "weak" else 0.0)).to(dtype)
    pad = torch.randn(b, n, gate_columns(h) - h, device=DEV).to(dtype)

    def fn(qkv, z, backend):
        return lion_attention_qkvpacked(
            torch.cat([qkv, z, pad.to(z.dtype)], -1),
            h,
            mask="s",
            gates_in_qkv=True,
            num_prefix_tokens=prefix,
            form=form,
            backend=backend,
        )

    _check(fn, (qkv, z), dtype, grad_names=("dqkv", "dgate_logits"))


@pytest.mark.parametrize("form", ["parallel", "scan"])
@pytest.mark.parametrize("mask", ["lit", "d", "s", "s_in_qkv"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,prefix,strength", [(7, 0, "weak"), (33, 1, "strong")])
def test_qkvpacked(form, mask, dtype, n, prefix, strength):
    """The packed layer core (phi inside, Y in [B, N, H * d], dqkv written in place by the masked or scan kernels
    and the in-place feature-map pass) against phi + lion_attention + merge_heads in fp64, from raw qkv; s_in_qkv:
    LION-S's gate logits in qkv's last columns (their gradient written into dqkv)."""
    if mask == "s_in_qkv":
        _check_gates_in_qkv(2, n, 3, 16, form, dtype, strength, prefix)
    else:
        _check_packed(2, n, 3, 16, mask, form, dtype, strength, prefix)


@pytest.mark.parametrize("mask", ["lit", "d", "s", "s_in_qkv"])
def test_qkvpacked_many_tiles_and_scan(monkeypatch, mask):
    """The packed masked kernels over 13 tiles of 16 (N = 197, B = 1, H = 1, bf16), and the packed scan over 13
    chunks of 16 on the same shape in fp32."""
    monkeypatch.setattr(lk.parallel, "TILE", 16)
    check = (
        (lambda form, dtype: _check_gates_in_qkv(1, 197, 1, 16, form, dtype, "weak", 1))
        if mask == "s_in_qkv"
        else (lambda form, dtype: _check_packed(1, 197, 1, 16, mask, form, dtype, "weak", 1))
    )
    check("parallel", torch.bfloat16)
    monkeypatch.setattr(lk.scan, "CHUNK", 16)
    check("scan", torch.float32)


@pytest.mark.parametrize("form,tile", [("parallel", 64), ("parallel", 32), ("scan", 64)])
def test_unnormalized_pair_and_tile_skip(monkeypatch, form, tile):
    """normalize=False returns fp32 (A V, A 1) with gradients through both. Strong S gates over N = 150: in 3
    tiles of 64 the parallel kernels visit every tile (below SKIP_MIN_TILES), some with a mask that is 0 in
    fp32; in 5 tiles of 32 they skip those (exact)."""
    monkeypatch.setattr(lk.parallel, "TILE", tile)
    assert lk.parallel._skips(True, 150, tile) == (tile == 32)
    b, h, n, d = 1, 2, 150, 16
    q, k, v = _inputs(b, h, n, d, d, torch.float32)
    ld = F.logsigmoid(torch.randn(b, h, n, device=DEV) - 3.0)

    def fn(q, k, v, ld, backend):
        return lion_attention(q, k, v, mask="s", log_decay=ld, form=form, normalize=False, backend=backend)

    _check(fn, (q, k, v, ld), torch.float32, normalize=False)
    num, den = fn(q, k, v, ld, backend="triton")
    assert num.dtype == den.dtype == torch.float32 and den.shape == (b, h, n)


@pytest.mark.parametrize("form,sequential", [("parallel", False), ("scan", False), ("scan", True)])
@pytest.mark.parametrize("mask", ["lit", "d", "s"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_across_many_tiles(monkeypatch, form, sequential, mask, dtype):
    """Both forms with 16-token tiles / chunks: N = 197 has 13 (a partial last one). The parallel kernels
    walk up to 12 off-diagonal tiles each way. The scan builds its states either in one sequential pass or
    from local terms and a cross-chunk scan of 2 chunks per step (7 steps), so every state path (local terms,
    carried scan, both directions, the four backward states) is exercised; B = 1, H = 1, d != d_v."""
    monkeypatch.setattr(lk.parallel, "TILE", 16)
    monkeypatch.setattr(lk.scan, "SEQUENTIAL_MIN_PAIRS", 1 if sequential else 2)
    monkeypatch.setattr(lk.scan, "CHUNK", 16)
    monkeypatch.setattr(lk.scan, "SCAN_CHUNKS", 2)
    monkeypatch.setattr(lk.scan, "SCAN_BLOCK", 128)
    b, h, n, d, dv = 1, 1, 197, 16, 32
    q, k, v = _inputs(b, h, n, d, dv, dtype)
    ld = _log_decay(mask, b, h, n, "weak", 1)
    _check_lion(q, k, v, ld, mask, form, dtype)


def test_masked_gate_gradient_accuracy_long():
    """The masked form's bf16 gate gradient at N = 1024 (16 tiles) keeps the accuracy of W sums taken from the
    fp32 tiles: 2.4-3.2e-3 over these three draws. Sums taken from the bf16-rounded dP give 3.0e-3 to
    1.2e-2 on the same draws: the prefix-sum differences of the gate gradient amplify that rounding with N."""
    worst = 0.0
    for _ in range(3):
        q, k, v = _inputs(1, 1, 1024, 64, 64, torch.bfloat16)
        ld = _log_decay("s", 1, 1, 1024, "weak", 0)

        def fn(q, k, v, ld, backend):
            return lion_attention(q, k, v, mask="s", log_decay=ld, form="parallel", backend=backend)

        worst = max(worst, _case(fn, (q, k, v, ld))["dlog"])
    assert worst < 5e-3, worst


@triton.jit
def _span_probe(TAB, stab, OUT, N, NT, T: tl.constexpr):
    """OUT[side, bh, t] = the number of tiles the parallel kernels visit from tile t on each side."""
    t = tl.program_id(0)
    bh = tl.program_id(1)
    cs = _gate_row(TAB, stab, bh, N, T)[2]
    tl.store(OUT + bh * NT + t, _span(cs, t, 0, NT, True))
    tl.store(OUT + (tl.num_programs(1) + bh) * NT + t, _span(cs, t, 1, NT, True))


def test_gate_table_and_spans():
    """The gate table (in-tile inclusive / exclusive cumsums, tile totals, their negated prefix sums) against
    PyTorch, and the parallel kernels' per-tile skip counts against walking outward tile by tile until the whole
    tiles in between sum below SKIP_LOG; gates from weak to strong so that counts range from none to all."""
    tile, n, nt = 8, 203, 26
    g = F.logsigmoid(torch.randn(2, 3, n, device=DEV) + torch.linspace(-4.0, 6.0, n, device=DEV))
    g[1, 2] = 0.0  # no decay: every tile is visited
    tab = torch.full((6, lk.parallel.table_width(n, tile)), float("nan"), device=DEV)
    tab.copy_(lk.parallel.gate_table(g, (2, 3, n, 16), tile))
    used = lk.parallel.table_columns(n, tile)  # then padding to 16 columns, not written
    assert not tab[:, :used].isnan().any()
    gp = F.pad(g, (0, nt * tile - n)).view(6, nt, tile)
    tot = gp.sum(-1)
    inc, exc, tot_k, cs = tab[:, :used].split([nt * tile, nt * tile, nt, nt + 1], 1)
    assert torch.allclose(inc, gp.cumsum(-1).view(6, -1), rtol=1e-6, atol=1e-5)
    assert torch.allclose(exc, (gp.cumsum(-1) - gp).view(6, -1), rtol=1e-6, atol=1e-5)
    assert torch.allclose(tot_k, tot, rtol=1e-6, atol=1e-5)
    assert torch.allclose(cs, F.pad(-tot.double().cumsum(-1), (1, 0)).float(), rtol=1e-6, atol=1e-4)
    spans = torch.full((2, 6, nt), -1, dtype=torch.int32, device=DEV)
    _span_probe[(nt, 6)](tab, tab.stride(0), spans, n, nt, T=tile)
    skip = lk.parallel.SKIP_LOG.value
    for bh in range(6):
        for i in range(nt):
            for side, step in ((0, -1), (1, 1)):
                count, seg, t = 0, 0.0, i + step
                while 0 <= t < nt and seg > skip:
                    seg += tot[bh, t].item()
                    count += 1
                    t += step
                assert spans[side, bh, i].item() == count, (side, bh, i)
    assert spans[:, 5].tolist() == [list(range(nt)), list(range(nt - 1, -1, -1))]
    assert 0 < spans.sum() < spans[:, 5].sum() * 6


def test_gate_table_from_logits():
    """The gate table built from gate logits in place (columns of a wider [B, N, C] projection, any float dtype;
    logsigmoid in the kernel, prefix tokens 0) equals the table of F.logsigmoid's gates, extreme logits included."""
    tile, n, h, prefix = 8, 45, 3, 2
    proj = torch.randn(2, n, 20, device=DEV) * 4
    proj[0, :, 5] = torch.linspace(-60.0, 60.0, n)
    z = proj[..., 4 : 4 + h]
    g = F.logsigmoid(z.double()).transpose(1, 2).clone()
    g[..., :prefix] = 0.0
    used = lk.parallel.table_columns(n, tile)
    for dtype in (torch.float32, torch.bfloat16):
        zt = proj.to(dtype)[..., 4 : 4 + h]
        want = lk.parallel.gate_table(
            F.logsigmoid(zt.float())
            .transpose(1, 2)
            .masked_fill(torch.arange(n, device=DEV) < prefix, 0.0)
            .contiguous(),
            (2, h, n, 16),
            tile,
        )
        got = lk.parallel.gate_table(zt, (2, h, n, 16), tile, logits_prefix=prefix)
        torch.testing.assert_close(got[:, :used], want[:, :used], rtol=1e-6, atol=1e-5)
    got = lk.parallel.gate_table(z, (2, h, n, 16), tile, logits_prefix=prefix)[:, : 6 * tile]
    inc = F.pad(g, (0, 6 * tile - n)).view(6, 6, tile).cumsum(-1).view(6, -1)
    torch.testing.assert_close(got.double(), inc, rtol=1e-6, atol=1e-5)


def test_per_head_gates():
    """LION-D's gates stay [H] (zero token stride): their gate table and the summed gate gradient equal those of
    the same gates expanded to every token."""
    b, h, n, tile = 2, 3, 203, 8
    lam = F.logsigmoid(torch.randn(h, device=DEV))
    per_token = lam[None, :, None].expand(b, h, n).contiguous()
    shape = (b, h, n, 16)
    used = lk.parallel.table_columns(n, tile)  # the padding columns are not written
    one, every = (lk.parallel.gate_table(x, shape, tile)[:, :used] for x in (lam, per_token))
    assert torch.allclose(one, every, rtol=1e-6, atol=1e-6)
    sums = torch.randn(4, b, h, n, device=DEV)
    want = lk.parallel.gate_grad(sums).double().sum((0, 2))
    assert torch.allclose(lk.parallel.gate_grad(sums, per_head=True).double(), want, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("mask", ["d", "s"])
def test_snake(mask):
    """Snake orders on a 3 x 5 grid with a cls token (the kernels run unnormalised per order)."""
    b, h, grid, prefix, d = 1, 2, (3, 5), 1, 16
    n = grid[0] * grid[1] + prefix
    q, k, v = _inputs(b, h, n, d, d, torch.float32)
    ld_row = _log_decay(mask, b, h, n, "weak", prefix)
    ld_col = _log_decay(mask, b, h, n, "strong", prefix)

    def fn(q, k, v, lr, lc, backend):
        return lion_snake_attention(
            q, k, v, grid=grid, num_prefix_tokens=prefix, mask=mask, log_decay_row=lr, log_decay_col=lc, backend=backend
        )

    _check(fn, (q, k, v, ld_row, ld_col), torch.float32)


@pytest.mark.parametrize("per_token", [False, True])
def test_two_scan(per_token):
    """Two-scan baseline (docs/spec.md 1.6, unnormalised) through the scan kernel; [H] and [B, H, N] decays."""
    b, h, n, d = 2, 2, 70, 16
    q, k, v = _inputs(b, h, n, d, d, torch.float32)
    ld = F.logsigmoid(torch.randn(b, h, n, device=DEV) + 1.0) if per_token else F.logsigmoid(torch.randn(h, device=DEV))

    def fn(q, k, v, ld, backend):
        return two_scan_attention(q, k, v, ld, backend=backend)

    scales = None if per_token else {"dlog_decay": lambda ups: _d_grad_mass(fn, (q, k, v), ld, ups)}
    _check(fn, (q, k, v, ld), torch.float32, scales=scales)


def test_auto_form_and_fallback():
    """form='auto' follows choose_form (by N and mask, the measured crossovers); fp64 inputs are not a kernel
    case (the reference runs)."""
    assert lk.choose_form(196, needs_grad=True) == "parallel" and lk.choose_form(1024) == "scan"
    assert lk.choose_form(1 << 16, mask="d") == "scan" and lk.choose_form(576, mask="lit") == "scan"
    assert lk.choose_form(196, needs_grad=False) == "parallel" and lk.choose_form(576, needs_grad=False) == "scan"
    assert lk.choose_form(576, needs_grad=False, mask="lit") == "parallel"
    assert (
        lk.choose_form(1024, needs_grad=False, mask="lit") == "scan" and lk.choose_form(511, mask="lit") == "parallel"
    )
    q, k, v = _inputs(1, 1, 9, 16, 16, torch.float64)
    assert lk.lion_attention(q, k, v, mask="lit", form="auto") is NotImplemented


@pytest.mark.parametrize("form", ["parallel", "scan"])
def test_torch_compile_fullgraph(form):
    """The kernels sit behind torch.library custom ops: a model using them compiles without graph breaks (inductor
    on a GPU, aot_eager under the CPU interpreter) and gives the eager values and gradients."""
    q, k, v = _inputs(1, 2, 20, 16, 16, torch.float32)
    a = torch.randn(2, device=DEV)

    def f(q, k, v, a):
        y = lion_attention(q, k, v, mask="d", log_decay=F.logsigmoid(a), form=form, backend="triton")
        return (y * y).sum()

    leaves = [t.requires_grad_() for t in (q, k, v, a)]
    eager = torch.autograd.grad(f(*leaves), leaves)
    backend = "inductor" if DEV == "cuda" else "aot_eager"
    compiled = torch.autograd.grad(torch.compile(f, fullgraph=True, backend=backend)(*leaves), leaves)
    for x, y in zip(eager, compiled):
        torch.testing.assert_close(x, y)


@pytest.mark.parametrize("form", ["parallel", "scan"])
def test_custom_op_fakes_match_strided_views(form):
    """The fake kernels give the real outputs' shapes and strides when q, k, v, g are views of a qkv projection
    ([B, N, H, d] memory): Inductor asserts those strides, so a wrong fake failed compiled LION-S training."""
    b, n, h, d = 1, 9, 2, 16
    q, k, v = (t.transpose(1, 2) for t in torch.randn(b, n, 3, h, d, device=DEV).unbind(2))
    q, k = (F.normalize(F.silu(t) + 0.5, dim=-1) for t in (q, k))
    g = F.logsigmoid(torch.randn(b, n, h, device=DEV) + 2).transpose(1, 2)
    checks = ("test_schema", "test_faketensor")
    torch.library.opcheck(torch.ops.lightvision.lion_fwd.default, (q, k, v, g, True, form), test_utils=checks)
    out, den, saved = torch.ops.lightvision.lion_fwd(q, k, v, g, True, form)
    args = (torch.randn_like(out), torch.randn_like(den), q, k, v, g, out, den, saved, True, form)
    torch.library.opcheck(torch.ops.lightvision.lion_bwd.default, args, test_utils=checks)


@pytest.mark.parametrize("form", ["parallel", "scan"])
@pytest.mark.parametrize("gates_in_qkv", [False, True])
def test_packed_custom_op_fakes(gates_in_qkv, form):
    """The packed ops' fakes give the real outputs' shapes and strides (Y [B, N, H * d], [phi(q), phi(k)] as
    [B, 2H, N, d], dqkv like qkv, every element written; with gates_in_qkv zeros in the gate padding columns), and
    the packed op compiles without graph breaks with the eager values and gradients."""
    b, n, h, d = 1, 9, 2, 16
    c3 = 3 * h * d
    qkv = torch.randn(b, n, c3 + (gate_columns(h) if gates_in_qkv else 0), device=DEV)
    g = None if gates_in_qkv else F.logsigmoid(torch.randn(b, n, h, device=DEV) + 2).transpose(1, 2)
    checks = ("test_schema", "test_faketensor")
    fwd_args = (qkv, g, h, "silu_norm", gates_in_qkv, 1, form)
    torch.library.opcheck(torch.ops.lightvision.lion_packed_fwd.default, fwd_args, test_utils=checks)
    y, fqk, den, cs = torch.ops.lightvision.lion_packed_fwd(*fwd_args)
    args = (torch.randn_like(y), qkv, g, fqk, y, den, cs, h, "silu_norm", gates_in_qkv, 1, form)
    torch.library.opcheck(torch.ops.lightvision.lion_packed_bwd.default, args, test_utils=checks)
    dqkv, _ = torch.ops.lightvision.lion_packed_bwd(*args)
    assert torch.isfinite(dqkv).all()  # every element written (outputs are NaN-poisoned)
    if gates_in_qkv:
        assert (dqkv[..., c3 + h :] == 0).all() and (dqkv[:, 0, c3:] == 0).all()  # padding; the prefix token's gate
        assert (dqkv[:, 1:, c3 : c3 + h] != 0).all()

    def f(qkv, a):
        if gates_in_qkv:
            y = lion_attention_qkvpacked(
                torch.cat([qkv[..., :c3], a.transpose(1, 2), qkv[..., c3 + h :]], -1),
                h,
                mask="s",
                gates_in_qkv=True,
                num_prefix_tokens=1,
                form=form,
                backend="triton",
            )
        else:
            y = lion_attention_qkvpacked(qkv, h, mask="s", log_decay=F.logsigmoid(a), form=form, backend="triton")
        return (y * y).sum()

    a = torch.randn(b, h, n, device=DEV) + 2
    leaves = [t.requires_grad_() for t in (qkv, a)]
    eager = torch.autograd.grad(f(*leaves), leaves)
    backend = "inductor" if DEV == "cuda" else "aot_eager"
    compiled = torch.autograd.grad(torch.compile(f, fullgraph=True, backend=backend)(*leaves), leaves)
    for x, y in zip(eager, compiled):
        torch.testing.assert_close(x, y)


def test_lion_s_layer_kernels_match_reference():
    """A LION-S layer (qkv and gate Linears run as one projection, gate logits read in place by the packed kernel)
    against the same layer on the PyTorch reference: output and the gradients of every parameter and the input,
    with a prefix token on a non-square grid."""
    from lightvision.layers.attention import LionAttention

    torch.manual_seed(0)
    layers = [LionAttention(32, 2, mask="s", backend=b).to(DEV) for b in ("triton", "torch")]
    layers[1].load_state_dict(layers[0].state_dict())
    x = torch.randn(2, 1 + 4 * 5, 32, device=DEV)
    up = torch.randn_like(x)
    res = []
    for layer in layers:
        xi = x.clone().requires_grad_()
        y = layer(xi, (4, 5), 1)
        y.backward(up)
        res.append([y, xi.grad] + [p.grad for p in layer.parameters()])
    assert len(res[0]) == 2 + 6
    for a, b in zip(*res):
        assert rel(a, b) < 1e-5
