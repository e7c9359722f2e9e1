"""Layers: shapes on any grid, grid validation, gradients reach decays and gates, composition vs the ops,
bf16, the factory, MD-TPE residual, patch embedding, RMSNorm, GLU."""

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import rel
from lightvision.layers import (
    ATTENTION_KINDS,
    GLU,
    MDTPE,
    LightNetAttention,
    LionAttention,
    NormalizedAttention,
    PatchEmbed,
    RMSNorm,
    build_attention,
)
from lightvision.ops import lightnet_attention, lion_attention, normalized_attention


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
@pytest.mark.parametrize("b,heads,grid,prefix", [(1, 1, (7, 11), 1), (2, 2, (3, 2), 0), (1, 2, (14, 14), 1)])
def test_shapes_and_grid_validation(kind, b, heads, grid, prefix):
    dim = 8 * heads
    attn = build_attention(kind, dim, heads)
    x = torch.randn(b, math.prod(grid) + prefix, dim)
    y = attn(x, grid, prefix)
    assert y.shape == x.shape and torch.isfinite(y).all()
    with pytest.raises(ValueError, match="sequence has N"):
        attn(x, (grid[0] + 1, grid[1]), prefix)
    with pytest.raises(ValueError, match="x must be"):
        attn(x[0], grid, prefix)


@pytest.mark.parametrize("kind", ["lion_d", "lion_s", "lion_d_snake", "lion_s_snake"])
def test_decay_and_gate_get_gradients(kind):
    attn = build_attention(kind, 12, 3)
    x = torch.randn(2, 1 + 35, 12)
    (attn(x, (5, 7), 1) ** 2).sum().backward()
    param = attn.decay if kind.startswith("lion_d") else attn.gate.weight
    assert param.grad is not None
    assert (param.grad.abs().view(2 if "snake" in kind else 1, -1).sum(-1) > 0).all()  # every order trains
    if kind.startswith("lion_s"):
        assert (attn.gate.bias.grad.abs() > 0).all()


@pytest.mark.parametrize("qkv_bias", [True, False])
def test_lion_layer_composition(qkv_bias):
    """The layer against the composition of its parts (feature maps, gate, LION core, projection); the gradients
    of the gate and qkv Linears too, as the layer runs them as one projection (gate rows negated, padded)."""
    torch.manual_seed(0)
    attn = LionAttention(12, 3, mask="s", form="scan", qkv_bias=qkv_bias).double()
    x = torch.randn(2, 21, 12, dtype=torch.float64)
    q, k, v = attn.qkv(x).view(2, 21, 3, 3, 4).permute(2, 0, 3, 1, 4)
    phi = lambda t: F.normalize(F.silu(t) + 0.5, dim=-1)  # noqa: E731
    la = F.logsigmoid(-attn.gate(x)).transpose(1, 2).clone()
    la[..., 0] = 0.0  # prefix gate = 1
    o = lion_attention(phi(q), phi(k), v, mask="s", log_decay=la)
    ref = attn.proj(o.transpose(1, 2).reshape(2, 21, 12))
    out = attn(x, (4, 5), 1)
    assert rel(out, ref) < 1e-12
    up = torch.randn_like(ref)
    for p in (attn.gate.weight, attn.gate.bias, attn.qkv.weight, *([attn.qkv.bias] if qkv_bias else [])):
        assert (
            rel(
                torch.autograd.grad(out, p, up, retain_graph=True)[0],
                torch.autograd.grad(ref, p, up, retain_graph=True)[0],
            )
            < 1e-12
        )
    lam = torch.sigmoid(LionAttention(12, 4, mask="d").decay)
    assert torch.allclose(lam, torch.linspace(0.9, 0.99, 4)[None], atol=1e-6)


@pytest.mark.parametrize("gate_rank,norm", [(None, True), ("full", True), (0, False), (2, True)])
def test_lightnet_layer_composition(gate_rank, norm):
    attn = LightNetAttention(12, 3, gate_rank=gate_rank, norm=norm).double()
    x = torch.randn(2, 21, 12, dtype=torch.float64)
    q, k, v = attn.qkv(x).view(2, 21, 3, 3, 4).permute(2, 0, 3, 1, 4)
    o = lightnet_attention(q, k, v, grid=(4, 5), num_prefix_tokens=1).transpose(1, 2).reshape(2, 21, 12)
    if norm:
        o = o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6)
    if gate_rank != 0:
        o = o * torch.sigmoid(attn.gate(x))
    assert rel(attn(x, (4, 5), 1), attn.proj(o)) < 1e-12
    rank = {None: 4, "full": None, 0: 0, 2: 2}[gate_rank]
    n_gate = 12 * 12 if rank is None else 2 * 12 * rank
    assert sum(p.numel() for p in attn.parameters()) == 4 * 12 * 12 + n_gate + (12 if norm else 0)


def test_normalized_layer_composition():
    """The layer against its parts: eta = N exp(w^T x + b) from the layer input, the core, the projection; the
    normaliser's Linear gets gradients; permuting the tokens permutes the output (no position information)."""
    torch.manual_seed(0)
    attn = NormalizedAttention(12, 3).double()
    assert (attn.normalizer.weight == 0).all()
    torch.testing.assert_close(attn.normalizer.bias, torch.full((3,), math.log(2), dtype=torch.float64))  # log sqrt 4
    with torch.no_grad():
        attn.normalizer.weight.normal_(0, 0.3)
    x = torch.randn(2, 21, 12, dtype=torch.float64)
    q, k, v = attn.qkv(x).view(2, 21, 3, 3, 4).permute(2, 0, 3, 1, 4)
    eta = 21 * torch.exp(attn.normalizer(x)).transpose(1, 2)[..., None]  # [B, H, N, 1]
    ref = attn.proj(((q @ k.transpose(-1, -2) @ v) / eta).transpose(1, 2).reshape(2, 21, 12))
    out = attn(x, (4, 5), 1)
    assert rel(out, ref) < 1e-12
    (out**2).sum().backward()
    assert (attn.normalizer.weight.grad.abs().sum(-1) > 0).all() and (attn.normalizer.bias.grad.abs() > 0).all()
    perm = torch.randperm(21)
    assert rel(attn(x[:, perm], (4, 5), 1), out[:, perm]) < 1e-12


def test_normalized_layer_forms_and_autocast():
    """Both forms give one layer output; under bf16 autocast log eta stays fp32 and the output is bf16 and close to
    the fp32 one."""
    torch.manual_seed(0)
    attn = NormalizedAttention(16, 2)
    parallel = NormalizedAttention(16, 2, form="parallel")
    parallel.load_state_dict(attn.state_dict())
    x = torch.randn(2, 1 + 35, 16)
    out = attn(x, (5, 7), 1)
    assert rel(parallel(x, (5, 7), 1), out) < 1e-5
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert attn.log_eta(x).dtype == torch.float32
        y = attn(x, (5, 7), 1)
    assert y.dtype == torch.bfloat16 and rel(y, out) < 1e-2
    q, k, v = attn.split(x)
    torch.testing.assert_close(attn.proj(attn.merge(normalized_attention(q, k, v, attn.log_eta(x)))), out)


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_bf16(kind):
    torch.manual_seed(1)
    attn = build_attention(kind, 16, 2)
    x = torch.randn(2, 1 + 35, 16)
    ref = attn.double()(x.double(), (5, 7), 1)
    y = attn.bfloat16()(x.bfloat16(), (5, 7), 1)
    assert y.dtype == torch.bfloat16 and rel(y, ref) < 1e-2


def test_factory_errors():
    with pytest.raises(ValueError, match="unknown attention kind 'lion'.*'lion_d'"):
        build_attention("lion", 8, 2)
    with pytest.raises(ValueError, match="divisible"):
        build_attention("lightnet", 10, 3)
    with pytest.raises(ValueError, match="fixes"):
        build_attention("lion_d", 8, 2, mask="s")
    with pytest.raises(ValueError, match="2-D grid"):
        build_attention("lion_d_snake", 8, 2)(torch.randn(1, 10, 8), (10,), 0)
    with pytest.raises(ValueError, match="gate_rank"):
        build_attention("lightnet", 8, 2, gate_rank="low")
    with pytest.raises(ValueError, match="unknown LION form"):
        build_attention("lion_s", 8, 2, form="fast")
    with pytest.raises(ValueError, match="unknown backend"):
        build_attention("lightnet", 8, 2, backend="cuda")
    assert build_attention("lion_s", 8, 2, form="chunk", backend="torch").form == "chunk"
    with pytest.raises(ValueError, match="unknown normalized attention form 'scan'"):
        build_attention("normalized", 8, 2, form="scan")
    with pytest.raises(ValueError, match="attention kind 'normalized' has no option 'backend'; valid: form, qkv_bias"):
        build_attention("normalized", 8, 2, backend="torch")


def test_mdtpe_residual():
    tpe = MDTPE(16, expand=3)
    x = torch.randn(2, 1 + 77, 16)
    assert torch.equal(tpe(x, (7, 11), 1), x)  # zero-initialised projection: identity at init
    torch.nn.init.normal_(tpe.proj.weight)
    y = tpe(x, (7, 11), 1)
    assert torch.equal(y[:, :1], x[:, :1]) and not torch.allclose(y[:, 1:], x[:, 1:])
    y.square().sum().backward()
    assert all(p.grad.abs().sum() > 0 for p in tpe.parameters())
    assert sum(p.numel() for p in MDTPE(192).parameters()) < 40_000
    with pytest.raises(ValueError, match="2 axes"):
        tpe(x, (78,), 0)
    with pytest.raises(ValueError, match="sequence has N"):
        tpe(x, (7, 10), 1)


@pytest.mark.parametrize(
    "form,combine,norm",
    [("two_sided", "sum", False), ("one_sided", "product", False), ("pair", "sum", True), ("pair", "product", False)],
    ids=["two_sided-sum", "one_sided-product", "pair-sum-norm", "pair-product"],
)
def test_mdtpe_forms_match_the_op(form, combine, norm):
    """Each form is the op's kernel on (the normalised) x: two_sided |n|, one_sided n >= 0, pair = the one-sided
    mixing plus the one-sided mixing of the grid read backwards with the second coefficient set; every parameter
    gets a gradient."""
    from lightvision.ops import md_tpe, rms_norm

    tpe = MDTPE(8, expand=2, form=form, combine=combine, norm=norm).double()
    torch.nn.init.normal_(tpe.proj.weight)
    if norm:
        torch.nn.init.normal_(tpe.norm.weight)
    x = torch.randn(2, 1 + 4 * 5, 8, dtype=torch.float64)
    u = rms_norm(x, tpe.norm.weight, eps=tpe.norm.eps) if norm else x
    lam = torch.nn.functional.logsigmoid(tpe.lam_logit)
    kw = dict(num_prefix_tokens=1, causal=form != "two_sided", combine=combine, backend="torch")
    y = md_tpe(u, (4, 5), tpe.coeffs[0], lam[0], **kw)
    if form == "pair":
        rev = torch.cat([u[:, :1], u[:, 1:].reshape(2, 4, 5, 8).flip(1, 2).reshape(2, 20, 8)], 1)
        back = md_tpe(rev, (4, 5), tpe.coeffs[1], lam[1], **kw)
        y = y + torch.cat([back[:, :1], back[:, 1:].reshape(2, 4, 5, 8).flip(1, 2).reshape(2, 20, 8)], 1)
    out = tpe(x, (4, 5), 1)
    torch.testing.assert_close(out, x + tpe.proj(y))
    out.square().sum().backward()
    assert all(p.grad.abs().sum() > 0 for p in tpe.parameters())


def test_mdtpe_options_and_old_checkpoints():
    tpe = MDTPE(8, expand=3, decay=(0.2, 0.6))
    torch.testing.assert_close(torch.sigmoid(tpe.lam_logit[0, 1]), torch.linspace(0.2, 0.6, 3))
    old = {"coeffs": torch.randn(2, 8, 3), "lam_logit": torch.randn(2, 3), "proj.weight": torch.randn(8, 8)}
    tpe.load_state_dict(old)  # one-order checkpoints load as order 0
    torch.testing.assert_close(tpe.coeffs[0], old["coeffs"])
    with pytest.raises(ValueError, match="unknown MD-TPE form 'causal'; valid: 'two_sided', 'one_sided', 'pair'"):
        MDTPE(8, form="causal")
    with pytest.raises(ValueError, match="unknown MD-TPE combine"):
        MDTPE(8, combine="max")
    with pytest.raises(ValueError, match="0 < lowest <= highest < 1"):
        MDTPE(8, decay=(0.5, 1.0))


def test_patch_embed():
    pe = PatchEmbed(224, 16, 3, 24)
    tokens, grid = pe(torch.randn(2, 3, 112, 176))
    assert grid == (7, 11) and tokens.shape == (2, 77, 24)
    assert pe.grid_size == (14, 14) and pe.num_patches == 196
    img = torch.randn(1, 3, 32, 48)
    tokens, _ = pe(img)
    torch.testing.assert_close(tokens[0, 4], pe.proj(img[..., 16:32, 16:32]).flatten())  # row-major (1, 1)
    # the Linear on patches is the stride = kernel convolution of its Conv2d parameters, gradients included
    lin = PatchEmbed(224, (4, 8), 5, 12).double()
    img = torch.randn(3, 5, 12, 40, dtype=torch.float64)
    tokens, grid = lin(img)
    conv = lin.proj(img).flatten(2).transpose(1, 2)
    torch.testing.assert_close(tokens, conv)
    g = torch.randn_like(tokens)
    grads = torch.autograd.grad(tokens, [lin.proj.weight, lin.proj.bias], g)
    for a, b in zip(grads, torch.autograd.grad(conv, [lin.proj.weight, lin.proj.bias], g)):
        torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match=r"image size \(100, 176\) is not divisible by patch size \(16, 16\)"):
        pe(torch.randn(1, 3, 100, 176))
    with pytest.raises(ValueError, match="expects images"):
        pe(torch.randn(1, 1, 32, 32))


def test_rmsnorm_and_glu():
    norm = RMSNorm(6)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(3, 5, 6, dtype=torch.float64)
    norm = norm.double()
    torch.testing.assert_close(norm(x), x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * norm.weight)
    assert norm.float()(x.bfloat16()).dtype == torch.bfloat16
    glu = GLU(6, 10).double()
    w1, w2 = glu.w12.weight.chunk(2)
    torch.testing.assert_close(glu(x), glu.w3(F.silu(x @ w1.T) * (x @ w2.T)))
    assert sum(p.numel() for p in glu.parameters()) == 3 * 6 * 10


def test_glu_loads_separate_w1_w2():
    """A state dict from before the fused W_1 | W_2 projection (keys w1, w2) loads into w12, same function."""
    glu = GLU(6, 10)
    w1, w2 = glu.w12.weight.detach().chunk(2)
    old = {"w1.weight": w1.clone(), "w2.weight": w2.clone(), "w3.weight": glu.w3.weight.detach().clone()}
    fresh = GLU(6, 10)
    fresh.load_state_dict(old)
    x = torch.randn(4, 6)
    torch.testing.assert_close(fresh(x), glu(x))
    with pytest.raises(RuntimeError, match="w12.weight"):
        GLU(6, 10).load_state_dict({"w3.weight": old["w3.weight"]})
