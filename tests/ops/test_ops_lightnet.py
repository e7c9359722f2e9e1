"""LightNet attention (docs/spec.md 1.1) vs explicit-loop references, causal Eq. 7, ablations, dtypes, gradients."""

import math

import pytest
import torch
import torch.nn.functional as F

from lightvision.ops import lightnet_attention

F64 = torch.float64


def _angles_loop(grid, d, prefix, variant="per_axis"):
    """Theta [N, d] by loops: contiguous feature groups, one per axis, row-major coords (docs/spec.md 1.2). Frequencies:
    global 10000^(-2i/d) over the global index i; per_axis / mixed 10000^(-2r/g) within a group of g; mixed
    rotates feature r of group j along the direction j pi / k + r (3 - sqrt 5) pi."""
    k = len(grid)
    sizes = [d // k + (1 if j < d % k else 0) for j in range(k)]
    feats = [(j, r, sum(sizes[:j]) + r) for j in range(k) for r in range(sizes[j])]
    rows = [[0.0] * d for _ in range(prefix)]
    for flat in range(math.prod(grid)):
        coord, rest = [], flat
        for g in reversed(grid):
            coord.append(rest % g)
            rest //= g
        coord = coord[::-1]
        row = []
        for j, r, i in feats:
            theta = 10000.0 ** (-2.0 * i / d) if variant == "global" else 10000.0 ** (-2.0 * r / sizes[j])
            if variant == "mixed" and k == 2:
                phi = j * math.pi / 2 + r * math.pi * (3 - math.sqrt(5))
                row.append(theta * (coord[0] * math.cos(phi) + coord[1] * math.sin(phi)))
            else:
                row.append(theta * coord[j])
        rows.append(row)
    return torch.tensor(rows, dtype=F64)


def _loop_ref(q, k, v, grid, prefix, lrpe="per_axis", key_softmax=True):
    """o_t = sum_s q^_t^T diag(cos(Theta_t - Theta_s)) k^_s v_s^T (LightNet App. A.2), loops over t and s."""
    b, h, n, d = q.shape
    qh = F.silu(q.double())
    kh = torch.softmax(k.double(), dim=2) if key_softmax else F.silu(k.double())
    ang = _angles_loop(grid, d, prefix, lrpe) if (lrpe and grid is not None) else torch.zeros(n, d, dtype=F64)
    out = torch.zeros(b, h, n, v.shape[-1], dtype=F64)
    for t in range(n):
        for s in range(n):
            w = (qh[:, :, t] * kh[:, :, s] * torch.cos(ang[t] - ang[s])).sum(-1)  # [B, H]
            out[:, :, t] += w[..., None] * v[:, :, s].double()
    return out


def _causal_loop(q, k, v, grid, prefix):
    """Eq. 7 as written: s_t = s_{t-1} + exp(k_t), kv_t = diag(1 - kbar_t) kv_{t-1} + kbar_t v_t^T (LRPE on k~)."""
    b, h, n, d = q.shape
    ang = _angles_loop(grid, d, prefix)
    rot = torch.cat([torch.cos(ang), torch.sin(ang)], -1)
    qt = torch.cat([F.silu(q.double())] * 2, -1) * rot
    kd = k.double()
    s = torch.zeros(b, h, d, dtype=F64)
    kv = torch.zeros(b, h, 2 * d, v.shape[-1], dtype=F64)
    out = []
    for t in range(n):
        s = s + torch.exp(kd[:, :, t])
        kbar = torch.cat([torch.exp(kd[:, :, t]) / s] * 2, -1)
        kv = (1 - kbar)[..., None] * kv + (kbar * rot[t])[..., None] * v[:, :, t, None, :].double()
        out.append((qt[:, :, t, :, None] * kv).sum(-2))
    return torch.stack(out, 2)


def _inputs(b, h, n, d, dv, dtype=F64, k_scale=2.0):
    return (
        torch.randn(b, h, n, d, dtype=F64).to(dtype),
        (torch.randn(b, h, n, d, dtype=F64) * k_scale).to(dtype),
        torch.randn(b, h, n, dv, dtype=F64).to(dtype),
    )


@pytest.mark.parametrize(
    "b,h,grid,prefix,d", [(1, 1, (7, 11), 1, 6), (2, 2, (4, 5), 0, 5), (1, 2, (23,), 2, 4), (1, 1, (2, 3, 4), 1, 7)]
)
@pytest.mark.parametrize(
    "lrpe,key_softmax",
    [("per_axis", True), ("global", True), ("mixed", True), (False, True), ("per_axis", False)],
    ids=["per_axis", "global", "mixed", "no_lrpe", "no_decay"],
)
def test_equals_loop_reference(b, h, grid, prefix, d, lrpe, key_softmax, rel):
    n = math.prod(grid) + prefix
    q, k, v = _inputs(b, h, n, d, d + 2)
    kw = dict(grid=grid, num_prefix_tokens=prefix, lrpe=lrpe, key_softmax=key_softmax, backend="torch")
    if lrpe == "mixed" and len(grid) > 2:
        with pytest.raises(ValueError, match="'mixed' directions are defined for 1-D and 2-D grids"):
            lightnet_attention(q, k, v, **kw)
        return
    ref = _loop_ref(q, k, v, grid, prefix, lrpe, key_softmax)
    assert rel(lightnet_attention(q, k, v, **kw), ref) < 1e-12
    y32 = lightnet_attention(q.float(), k.float(), v.float(), **kw)
    assert y32.dtype == torch.float32 and rel(y32, ref) < 1e-5


def test_no_grid_means_no_lrpe(rel):
    q, k, v = _inputs(2, 3, 19, 4, 4)
    ref = _loop_ref(q, k, v, None, 0)
    assert rel(lightnet_attention(q, k, v), ref) < 1e-12
    assert rel(lightnet_attention(q, k, v, grid=(19,), lrpe=False), ref) < 1e-12


@pytest.mark.parametrize("b,h,grid,prefix", [(1, 1, (14, 14), 1), (2, 3, (7, 11), 1), (1, 2, (150,), 0)])
def test_causal_matches_eq7_and_final_state(b, h, grid, prefix, rel):
    n = math.prod(grid) + prefix
    q, k, v = _inputs(b, h, n, 4, 3, k_scale=4.0)
    kw = dict(grid=grid, num_prefix_tokens=prefix, backend="torch")
    causal = lightnet_attention(q, k, v, causal=True, **kw)
    assert rel(causal, _causal_loop(q, k, v, grid, prefix)) < 1e-12
    full = lightnet_attention(q, k, v, **kw)
    assert rel(causal[:, :, -1], full[:, :, -1]) < 1e-12  # final state = the one-scan reduction
    c32 = lightnet_attention(q.float(), k.float(), v.float(), causal=True, **kw)
    assert rel(c32, causal) < 1e-5


def test_causal_no_decay_is_causal_linear_attention(rel):
    q, k, v = _inputs(1, 2, 30, 4, 4)
    qh, kh = F.silu(q), F.silu(k)
    ref = torch.stack(
        [(qh[:, :, t, None] * kh[:, :, : t + 1]).sum(-1)[..., None].mul(v[:, :, : t + 1]).sum(2) for t in range(30)], 2
    )
    assert rel(lightnet_attention(q, k, v, causal=True, key_softmax=False), ref) < 1e-12


def test_causal_extreme_logits_stay_finite():
    q, k, v = _inputs(1, 1, 100, 4, 4, dtype=torch.float32)
    k = k * 200.0  # exp would overflow without the running log-sum-exp
    y = lightnet_attention(q, k, v, causal=True)
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_low_precision(dtype, causal, rel):
    grid, prefix = (7, 11), 1
    q, k, v = _inputs(2, 2, 78, 8, 8, dtype)
    y = lightnet_attention(q, k, v, grid=grid, num_prefix_tokens=prefix, causal=causal)
    ref = lightnet_attention(q.double(), k.double(), v.double(), grid=grid, num_prefix_tokens=prefix, causal=causal)
    assert y.dtype == dtype and rel(y, ref) < 1e-2


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck(causal):
    q, k, v = (t.requires_grad_(True) for t in _inputs(1, 1, 7, 3, 2))
    assert torch.autograd.gradcheck(
        lambda a, b_, c: lightnet_attention(a, b_, c, grid=(2, 3), num_prefix_tokens=1, causal=causal), (q, k, v)
    )


def test_strided_views_from_fused_qkv(rel):
    b, n, h, d = 2, 21, 3, 4
    qkv = torch.randn(b, n, 3, h, d, dtype=F64)
    q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
    y = lightnet_attention(q, k, v, grid=(4, 5), num_prefix_tokens=1)
    assert (
        rel(y, lightnet_attention(q.contiguous(), k.contiguous(), v.contiguous(), grid=(4, 5), num_prefix_tokens=1))
        < 1e-14
    )


def test_errors():
    q, k, v = _inputs(1, 2, 10, 4, 4)
    with pytest.raises(ValueError, match="sequence has N=10"):
        lightnet_attention(q, k, v, grid=(3, 3), num_prefix_tokens=0)
    with pytest.raises(ValueError, match="4-D"):
        lightnet_attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="same shape"):
        lightnet_attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match="B, H, N"):
        lightnet_attention(q, k, v[:, :, :9])
    with pytest.raises(ValueError, match="unknown backend"):
        lightnet_attention(q, k, v, backend="cuda")
