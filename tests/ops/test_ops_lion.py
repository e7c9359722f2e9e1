"""LION (docs/spec.md 1.5): masks vs explicit loops, the four forms agree (values and gradients), snake orders,
the two-scan baseline, validation."""

import math

import pytest
import torch
import torch.nn.functional as F

from lightvision.ops import (
    lion_attention,
    lion_attention_qkvpacked,
    lion_snake_attention,
    snake_permutation,
    two_scan_attention,
)
from lightvision.ops.lion import gate_columns

FORMS = ("chunk", "recurrent", "scan")
F64 = torch.float64


def _feat(b, h, n, d, dtype=F64):
    """Positive feature-mapped q, k (LION's normalised shifted SiLU) and v."""
    q = F.normalize(F.silu(torch.randn(b, h, n, d, dtype=F64)) + 0.5, dim=-1).to(dtype)
    k = F.normalize(F.silu(torch.randn(b, h, n, d, dtype=F64)) + 0.5, dim=-1).to(dtype)
    return q, k, torch.randn(b, h, n, d + 1, dtype=F64).to(dtype)


def _log_decay(mask, b, h, n, strength, prefix=1):
    """'weak' decay keeps lambda near 1, 'strong' near 0.5."""
    if mask == "lit":
        return None
    shift = 4.0 if strength == "weak" else 0.0
    if mask == "d":
        return F.logsigmoid(torch.randn(h, dtype=F64) + shift)
    la = F.logsigmoid(torch.randn(b, h, n, dtype=F64) + shift)
    la[..., :prefix] = 0.0
    return la


def _mask_loop(mask, ld, b, h, n):
    """M from its definition with Python loops: D lambda^|i-j|; S products of gates between i and j."""
    m = torch.ones(b, h, n, n, dtype=F64)
    if mask == "lit":
        return m
    for bi in range(b):
        for hi in range(h):
            if mask == "d":
                lam = math.exp(float(ld[hi]))
                for i in range(n):
                    for j in range(n):
                        m[bi, hi, i, j] = lam ** abs(i - j)
                continue
            a = [math.exp(float(x)) for x in ld[bi, hi]]
            for i in range(n):
                p = 1.0
                for j in range(i - 1, -1, -1):  # prod_{m=j}^{i-1} a_m
                    p *= a[j]
                    m[bi, hi, i, j] = p
                p = 1.0
                for j in range(i + 1, n):  # prod_{m=i+1}^{j} a_m
                    p *= a[j]
                    m[bi, hi, i, j] = p
    return m


def _masked_ref(q, k, v, m):
    a = (q.double() @ k.double().transpose(-1, -2)) * m
    return (a @ v.double()) / (a.sum(-1, keepdim=True) + 1e-6)


@pytest.mark.parametrize("mask", ["lit", "d", "s"])
@pytest.mark.parametrize("b,h,n", [(1, 1, 13), (2, 3, 20)])
def test_parallel_equals_loop_mask(mask, b, h, n, rel):
    q, k, v = _feat(b, h, n, 5)
    ld = _log_decay(mask, b, h, n, "strong")
    ref = _masked_ref(q, k, v, _mask_loop(mask, ld, b, h, n))
    assert rel(lion_attention(q, k, v, mask=mask, log_decay=ld, form="parallel"), ref) < 1e-12


@pytest.mark.parametrize("mask", ["lit", "d", "s"])
@pytest.mark.parametrize("strength", ["strong", "weak"])
@pytest.mark.parametrize("b,h,n,chunk", [(1, 1, 197, 64), (2, 3, 78, 16)])
def test_forms_agree_fp64_and_fp32(mask, strength, b, h, n, chunk, rel):
    q, k, v = _feat(b, h, n, 8)
    ld = _log_decay(mask, b, h, n, strength)
    ref = lion_attention(q, k, v, mask=mask, log_decay=ld, form="parallel")
    for form in FORMS + ("parallel", "auto"):
        kw = dict(mask=mask, form=form, chunk_size=chunk)
        assert rel(lion_attention(q, k, v, log_decay=ld, **kw), ref) < 1e-12, form
        y32 = lion_attention(q.float(), k.float(), v.float(), log_decay=None if ld is None else ld.float(), **kw)
        assert y32.dtype == torch.float32
        assert rel(y32, ref) < 1e-5, form


@pytest.mark.parametrize("mask", ["lit", "d", "s"])
def test_forms_agree_gradients(mask, rel):
    b, h, n = 2, 1, 45
    q, k, v = _feat(b, h, n, 4)
    ld = _log_decay(mask, b, h, n, "strong")
    inputs = [q, k, v] + ([ld] if ld is not None else [])
    grads = {}
    for form in ("parallel",) + FORMS:
        leaves = [t.clone().requires_grad_(True) for t in inputs]
        y = lion_attention(
            *leaves[:3], mask=mask, log_decay=leaves[3] if ld is not None else None, form=form, chunk_size=8
        )
        (y * torch.linspace(-1, 1, y.numel(), dtype=F64).view_as(y)).sum().backward()
        grads[form] = [t.grad for t in leaves]
    for form in FORMS:
        for g, g_ref in zip(grads[form], grads["parallel"]):
            assert g.abs().sum() > 0
            assert rel(g, g_ref) < 1e-10, form


@pytest.mark.parametrize("mask", ["d", "s"])
def test_gradcheck_log_decay(mask):
    b, h, n = 1, 2, 6
    q, k, v = _feat(b, h, n, 3)
    ld = _log_decay(mask, b, h, n, "strong").requires_grad_(True)
    for form in ("parallel", "scan"):
        assert torch.autograd.gradcheck(
            lambda x: lion_attention(q, k, v, mask=mask, log_decay=x, form=form, chunk_size=4), (ld,)
        )


def test_normalize_false_pair(rel):
    q, k, v = _feat(1, 2, 30, 4)
    ld = _log_decay("s", 1, 2, 30, "strong")
    m = _mask_loop("s", ld, 1, 2, 30)
    a = (q @ k.transpose(-1, -2)) * m
    for form in ("parallel", "chunk", "recurrent", "scan"):
        num, den = lion_attention(q, k, v, mask="s", log_decay=ld, form=form, normalize=False, chunk_size=7)
        assert num.shape == (1, 2, 30, 5) and den.shape == (1, 2, 30)
        assert rel(num, a @ v) < 1e-12 and rel(den, a.sum(-1)) < 1e-12


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("form", ["parallel", "chunk", "scan"])
def test_low_precision_inputs(dtype, form, rel):
    b, h, n = 2, 2, 78
    q, k, v = _feat(b, h, n, 8, dtype)
    ld = _log_decay("s", b, h, n, "weak")
    ref = _masked_ref(q, k, v, _mask_loop("s", ld, b, h, n))
    y = lion_attention(q, k, v, mask="s", log_decay=ld.to(dtype).float(), form=form, chunk_size=32)
    assert y.dtype == dtype
    assert rel(y, ref) < 1e-2


def _snake_positions_loop(h, w, order, prefix):
    """pos[raster index] = position in the snake order, built with loops (prefix tokens first)."""
    seq = list(range(prefix))
    if order == "row":
        for r in range(h):
            for c in range(w) if r % 2 == 0 else range(w - 1, -1, -1):
                seq.append(prefix + r * w + c)
    else:
        for c in range(w):
            for r in range(h) if c % 2 == 0 else range(h - 1, -1, -1):
                seq.append(prefix + r * w + c)
    pos = [0] * len(seq)
    for t, idx in enumerate(seq):
        pos[idx] = t
    return seq, pos


def _snake_mask_loop(mask, ld, b, h, n, grid, prefix, order):
    """M in raster order: the order's mask evaluated at the two tokens' snake positions."""
    seq, pos = _snake_positions_loop(*grid, order, prefix)
    m = torch.ones(b, h, n, n, dtype=F64)
    for bi in range(b):
        for hi in range(h):
            for i in range(n):
                for j in range(n):
                    pi, pj = pos[i], pos[j]
                    if mask == "d":
                        m[bi, hi, i, j] = math.exp(float(ld[hi]) * abs(pi - pj))
                    else:  # gates of the tokens strictly after min(pi, pj) up to ... as in _mask_loop, in snake order
                        span = range(pj, pi) if pi > pj else range(pi + 1, pj + 1)
                        m[bi, hi, i, j] = math.exp(sum(float(ld[bi, hi, seq[t]]) for t in span))
    return m


@pytest.mark.parametrize("grid,prefix", [((3, 5), 1), ((4, 3), 0)])
def test_snake_permutation(grid, prefix):
    for order in ("row", "col"):
        seq, _ = _snake_positions_loop(*grid, order, prefix)
        assert snake_permutation(grid, prefix, order).tolist() == seq


@pytest.mark.parametrize("mask", ["d", "s"])
@pytest.mark.parametrize("b,h,grid,prefix", [(1, 1, (3, 5), 1), (2, 2, (4, 3), 0)])
def test_snake_equals_definition(mask, b, h, grid, prefix, rel):
    n = grid[0] * grid[1] + prefix
    q, k, v = _feat(b, h, n, 4)
    ld_r = _log_decay(mask, b, h, n, "strong", prefix)
    ld_c = _log_decay(mask, b, h, n, "strong", prefix)
    m = (
        _snake_mask_loop(mask, ld_r, b, h, n, grid, prefix, "row")
        + _snake_mask_loop(mask, ld_c, b, h, n, grid, prefix, "col")
    ) / 2
    ref = _masked_ref(q, k, v, m)
    for form in ("parallel", "chunk", "recurrent", "scan"):
        y = lion_snake_attention(
            q, k, v, grid=grid, num_prefix_tokens=prefix, mask=mask, log_decay_row=ld_r, log_decay_col=ld_c, form=form
        )
        assert rel(y, ref) < 1e-12, form


def test_snake_large_grid_fp32(rel):
    b, h, grid = 1, 2, (7, 11)
    n = 78
    q, k, v = _feat(b, h, n, 8)
    lds = [_log_decay("s", b, h, n, "weak") for _ in range(2)]
    kw = dict(grid=grid, num_prefix_tokens=1, mask="s")
    ref = lion_snake_attention(q, k, v, log_decay_row=lds[0], log_decay_col=lds[1], **kw)
    y = lion_snake_attention(
        q.float(), k.float(), v.float(), log_decay_row=lds[0].float(), log_decay_col=lds[1].float(), form="scan", **kw
    )
    assert rel(y, ref) < 1e-5


@pytest.mark.parametrize("shape", ["d", "s"])
def test_two_scan_is_unnormalised_lion(shape, rel):
    b, h, n = 2, 3, 50
    q, k, v = _feat(b, h, n, 4)
    ld = _log_decay(shape, b, h, n, "strong")
    num, _ = lion_attention(q, k, v, mask=shape, log_decay=ld, normalize=False)
    assert rel(two_scan_attention(q, k, v, ld, chunk_size=16), num) < 1e-12
    y32 = two_scan_attention(q.float(), k.float(), v.float(), ld.float())
    assert y32.dtype == torch.float32 and rel(y32, num) < 1e-5


@pytest.mark.parametrize("h", [3, 64])
def test_qkvpacked_gates_in_qkv(h):
    """Gate logits in qkv's last gate_columns(H) columns: the same Y as log_decay = logsigmoid(z) (prefix 0) given
    separately, the gradient of z is logsigmoid's chain rule, the padding columns (none for H = 64) get 0."""
    b, n, d, prefix = 2, 11, 4, 2
    c3, cols = 3 * h * d, gate_columns(h)
    assert cols == 64
    x = torch.randn(b, n, c3 + cols, dtype=F64, requires_grad=True)
    y = lion_attention_qkvpacked(x, h, mask="s", gates_in_qkv=True, num_prefix_tokens=prefix, form="chunk")
    la = F.logsigmoid(x[..., c3 : c3 + h]).transpose(1, 2).clone()
    la[..., :prefix] = 0.0
    ref = lion_attention_qkvpacked(x[..., :c3], h, mask="s", log_decay=la, form="chunk")
    assert torch.allclose(y, ref, rtol=1e-12, atol=1e-12)
    up = torch.randn_like(y)
    (gx,) = torch.autograd.grad(y, x, up)
    (gr,) = torch.autograd.grad(ref, x, up)
    assert torch.allclose(gx, gr, rtol=1e-10, atol=1e-12)
    assert (
        (gx[..., c3 + h :] == 0).all() and (gx[:, :prefix, c3:] == 0).all() and (gx[:, prefix:, c3 : c3 + h] != 0).all()
    )


def test_qkvpacked_gates_in_qkv_errors():
    x = torch.randn(2, 10, 3 * 3 * 4 + 64, dtype=F64)
    with pytest.raises(ValueError, match="LION-S's: use mask='s' and no log_decay, got mask='d'"):
        lion_attention_qkvpacked(x, 3, mask="d", gates_in_qkv=True)
    with pytest.raises(ValueError, match="and a log_decay"):
        lion_attention_qkvpacked(x, 3, mask="s", log_decay=torch.zeros(2, 3, 10), gates_in_qkv=True)
    with pytest.raises(ValueError, match=r"3 \* num_heads \* d \+ 64\] \(gate logits padded"):
        lion_attention_qkvpacked(x[..., :-1], 3, mask="s", gates_in_qkv=True)
    with pytest.raises(ValueError, match=r"num_prefix_tokens must be an int in \[0, N = 10\], got 11"):
        lion_attention_qkvpacked(x, 3, mask="s", gates_in_qkv=True, num_prefix_tokens=11)


def test_errors():
    q, k, v = _feat(2, 3, 10, 4)
    with pytest.raises(ValueError, match="unknown mask"):
        lion_attention(q, k, v, mask="x")
    with pytest.raises(ValueError, match="unknown form"):
        lion_attention(q, k, v, form="fast")
    with pytest.raises(ValueError, match=r"\[H\]"):
        lion_attention(q, k, v, mask="d", log_decay=torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"\[B, H, N\]"):
        lion_attention(q, k, v, mask="s", log_decay=torch.zeros(2, 3, 9))
    with pytest.raises(ValueError, match="needs log_decay"):
        lion_attention(q, k, v, mask="d")
    with pytest.raises(ValueError, match="no decay"):
        lion_attention(q, k, v, mask="lit", log_decay=torch.zeros(3))
    with pytest.raises(ValueError, match="4-D"):
        lion_attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="sequence has N=10"):
        lion_snake_attention(
            q,
            k,
            v,
            grid=(3, 4),
            num_prefix_tokens=0,
            mask="d",
            log_decay_row=torch.zeros(3),
            log_decay_col=torch.zeros(3),
        )
    with pytest.raises(ValueError, match="2-D grid"):
        lion_snake_attention(
            q,
            k,
            v,
            grid=(9,),
            num_prefix_tokens=1,
            mask="d",
            log_decay_row=torch.zeros(3),
            log_decay_col=torch.zeros(3),
        )
    with pytest.raises(ValueError, match=r"\[H\] or \[B, H, N\]"):
        two_scan_attention(q, k, v, torch.zeros(2, 3))


def test_recurrent_form_keeps_one_state_per_direction():
    """form="recurrent" never materialises k_i v_i^T for every token: no intermediate reaches N d d_v elements."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class LargestTensor(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            sizes = [t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            self.largest = max([self.largest, *sizes])
            return out

    n, d = 64, 16
    q, k, v = _feat(1, 1, n, d)
    ld = _log_decay("s", 1, 1, n, "strong")
    with torch.no_grad(), LargestTensor() as probe:
        lion_attention(q, k, v, mask="s", log_decay=ld, form="recurrent", backend="torch")
    assert probe.largest <= n * (d + 1) * 2, probe.largest  # outputs and gates; N d d_v would be 17408


def test_kernel_names_the_form_it_runs_for_recurrent(monkeypatch):
    """A kernel runs form="recurrent" as its chunked scan: a warning says so, once."""
    import warnings

    from lightvision.ops import _dispatch, register_kernel

    monkeypatch.setattr(_dispatch, "_KERNELS", {})
    monkeypatch.setattr(_dispatch, "_WARNED", set())
    register_kernel("lion_attention", lambda q_, k_, v_, **kw: torch.zeros_like(v_))
    q, k, v = _feat(1, 1, 8, 4)
    with pytest.warns(RuntimeWarning, match="form='recurrent' ran as the Triton kernel's chunked bidirectional scan"):
        lion_attention(q, k, v, form="recurrent", backend="triton")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lion_attention(q, k, v, form="recurrent", backend="triton")
        lion_attention(q, k, v, form="scan", backend="triton")
