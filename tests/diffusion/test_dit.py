"""DiT family: parameter counts (docs/spec.md 3), every attention kind on a non-square latent, errors, save/load,
learning."""

import pytest
import torch

from lightvision.diffusion import create_model
from lightvision.diffusion.dit import DiT, size_preset
from lightvision.diffusion.gaussian import GaussianDiffusion
from lightvision.layers import ATTENTION_KINDS, GLU

# docs/spec.md 3 (LightNet XL: the paper gives 672M and 680M; the midpoint)
PAPER_PARAMS = {
    "softmax": {"s": 33e6, "b": 130e6, "l": 458e6, "xl": 675e6},
    "lightnet": {"s": 33e6, "b": 131e6, "l": 470e6, "xl": 676e6},
    "normalized": {"s": 33e6, "b": 130e6, "l": 458e6, "xl": 675e6},  # DiT's blocks with a Linear(D, heads) more
}


def tiny(attention: str, **kw) -> DiT:
    args = dict(
        input_size=8,
        patch_size=2,
        in_channels=3,
        hidden_size=32,
        depth=2,
        num_heads=2,
        attention=attention,
        num_classes=5,
    )
    args.update(kw)
    return DiT(**args)


@pytest.mark.parametrize("family", sorted(PAPER_PARAMS))
def test_parameter_counts_match_the_papers(family):
    for size, paper in PAPER_PARAMS[family].items():
        with torch.device("meta"):
            model = create_model(f"{family}_dit_{size}_2")
        count = sum(p.numel() for p in model.parameters())
        print(
            f"{family}_dit_{size}_2: {count / 1e6:.2f}M (paper {paper / 1e6:.0f}M, {100 * (count / paper - 1):+.1f}%)"
        )
        assert abs(count / paper - 1) < 0.05
    assert size_preset(f"{family}_dit_xl_8")["patch_size"] == 8


@pytest.mark.parametrize("kind", ["softmax", "lightnet"])
def test_fused_adaln_kernels_match_the_reference_in_the_model(kind, monkeypatch):
    """The DiT block's modulated norms and gated residuals as Triton kernels (the interpreter on CPU; "block" and
    "shared" modulation) give the reference model's output and parameter gradients."""
    import lightvision.kernels.fused  # noqa: F401  (registers the kernels)
    from lightvision.ops import adaln

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = tiny(kind, class_dropout_prob=0.0).to(dev)
    for p in model.parameters():  # leave adaLN-Zero's all-zero start, so every gate and shift matters
        torch.nn.init.normal_(p, std=0.2)
    x, t, y = torch.randn(2, 3, 8, 12, device=dev), torch.tensor([3, 900], device=dev), torch.tensor([1, 5], device=dev)
    real_dispatch = adaln.dispatch
    results = {}
    for backend in ("torch", "triton"):
        monkeypatch.setattr(adaln, "dispatch", lambda op, _b, *a, _backend=backend: real_dispatch(op, _backend, *a))
        model.zero_grad()
        out = model(x, t, y)
        out.square().mean().backward()
        results[backend] = [out.detach()] + [p.grad.clone() for p in model.parameters()]
    for ref, fused in zip(*results.values()):
        torch.testing.assert_close(fused, ref, rtol=1e-4, atol=1e-5)
    assert results["torch"][0].abs().max() > 0.1


@pytest.mark.parametrize("kind", ["softmax", "lightnet"])
def test_residual_stream_keeps_the_autocast_dtype(kind):
    """Under bf16 autocast every block returns the tokens in bf16, with per-block ("block") and shared ("shared")
    modulation alike (an fp32 stream doubles what the norms save for backward)."""
    model = tiny(kind, class_dropout_prob=0.0)
    dtypes = []
    for block in model.blocks:
        block.register_forward_hook(lambda m, args, out: dtypes.append(out.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randn(2, 3, 8, 8), torch.tensor([3, 900]), torch.tensor([1, 5])).float().mean().backward()
    assert dtypes == [torch.bfloat16] * len(model.blocks)


@pytest.mark.parametrize("kind", ["softmax", "lightnet", "lion_s"])
def test_rebuilt_activations_give_the_plain_gradients(kind, monkeypatch):
    """What the blocks rebuild in the backward (the norms before the attention and the FFN, the FFN's activation)
    gives the output and parameter gradients of the plain form (the one torch.compile traces)."""
    x, t, y = torch.randn(2, 3, 8, 12), torch.tensor([3, 900]), torch.tensor([1, 4])
    results = []
    for plain in (False, True):
        torch.manual_seed(0)
        model = tiny(kind, class_dropout_prob=0.0)
        for p in model.parameters():  # leave adaLN-Zero's all-zero start, so every path carries gradient
            torch.nn.init.normal_(p, std=0.2)
        if plain:
            monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        out = model(x, t, y)
        out.square().mean().backward()
        results.append([out.detach()] + [p.grad.clone() for p in model.parameters()])
    for rebuilt, ref in zip(*results):
        torch.testing.assert_close(rebuilt, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_every_attention_kind_runs_on_a_non_square_latent(kind):
    torch.manual_seed(0)
    model = tiny(kind)
    # adaLN-Zero: the untrained model outputs exactly zero; perturb the head to see the whole path
    torch.nn.init.normal_(model.final_linear.weight, std=0.02)
    x = torch.randn(2, 3, 8, 12, requires_grad=True)
    out = model(x, torch.tensor([3, 900]), torch.tensor([1, 5]))
    assert out.shape == (2, 6, 8, 12) and torch.isfinite(out).all()
    out.square().sum().backward()
    assert x.grad.abs().sum() > 0


def test_clear_errors():
    model = tiny("softmax")
    with pytest.raises(ValueError, match="expected latents"):
        model(torch.randn(1, 4, 8, 8), torch.tensor([1]), torch.tensor([0]))
    with pytest.raises(ValueError, match="not divisible by the patch"):
        model(torch.randn(1, 3, 8, 7), torch.tensor([1]), torch.tensor([0]))
    with pytest.raises(ValueError, match="unknown model"):
        create_model("softmax_dit_m_2")
    with pytest.raises(ValueError, match="unknown attention"):
        tiny("mamba")


@pytest.mark.parametrize("kind", ["lightnet", "normalized"])
def test_save_pretrained_round_trip(tmp_path, kind):
    torch.manual_seed(0)
    model = tiny(kind).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.05)
    model.save_pretrained(tmp_path / "dit")
    loaded = DiT.from_pretrained(tmp_path / "dit").eval()
    assert loaded.config.attention == kind and loaded.null_class == 5
    x, t, y = torch.randn(2, 3, 8, 8), torch.tensor([1, 2]), torch.tensor([0, 5])
    torch.testing.assert_close(loaded(x, t, y), model(x, t, y), rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["softmax", "lightnet"])
def test_hybrid_loss_decreases_on_a_fixed_batch(kind):
    torch.manual_seed(0)
    model = tiny(kind, class_dropout_prob=0.0)
    diffusion = GaussianDiffusion.linear(1000)
    g = torch.Generator().manual_seed(0)
    x0 = torch.rand(8, 3, 8, 8, generator=g) * 2 - 1
    y, t = torch.randint(0, 5, (8,), generator=g), torch.randint(0, 1000, (8,), generator=g)
    noise = torch.randn(x0.shape, generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    def loss():
        return diffusion.training_losses(lambda xt, tt: model(xt, tt, y), x0, t, noise)["loss"].mean()

    first = loss().item()
    for _ in range(40):
        opt.zero_grad()
        loss().backward()
        opt.step()
    assert loss().item() < 0.7 * first


ABLATIONS = {  # switch -> (constructor kwargs, what it must change in the built model)
    "no_tpe": (dict(tpe_placement="none"), lambda m: m.tpe is None and all(b.tpe is None for b in m.blocks)),
    "tpe_embed": (dict(tpe_placement="embed"), lambda m: m.tpe is not None and all(b.tpe is None for b in m.blocks)),
    "tpe_block": (dict(tpe_placement="block"), lambda m: m.tpe is None and all(b.tpe is not None for b in m.blocks)),
    "tpe_form": (
        dict(tpe_placement="embed", tpe_kwargs={"form": "pair", "combine": "product", "norm": True}),
        lambda m: (
            (m.tpe.form, m.tpe.combine, m.tpe.coeffs.shape[0]) == ("pair", "product", 2) and m.tpe.norm is not None
        ),
    ),
    "no_lrpe": (dict(attention_kwargs={"lrpe": "none"}), lambda m: m.blocks[0].attn.lrpe is None),
    "lrpe_global": (dict(attention_kwargs={"lrpe": "global"}), lambda m: m.blocks[0].attn.lrpe == "global"),
    "lrpe_mixed": (dict(attention_kwargs={"lrpe": "mixed"}), lambda m: m.blocks[1].attn.lrpe == "mixed"),
    "no_decay": (dict(attention_kwargs={"key_softmax": False}), lambda m: not m.blocks[0].attn.key_softmax),
    "no_norm": (dict(attention_kwargs={"norm": False}), lambda m: isinstance(m.blocks[0].attn.norm, torch.nn.Identity)),
    "full_gate": (
        dict(attention_kwargs={"gate_rank": "full"}),
        lambda m: isinstance(m.blocks[0].attn.gate, torch.nn.Linear),
    ),
    "block_adaln": (dict(adaln="block"), lambda m: m.shared_modulation is None),
    "no_sincos": (dict(pos_embed="none"), lambda m: m.config.pos_embed == "none"),
    "mlp_ffn": (dict(ffn="mlp"), lambda m: not isinstance(m.blocks[0].ffn, GLU)),
}


def _settings(model: DiT) -> dict:
    return {k: v for k, v in model.config.items() if not k.startswith("_")}


@pytest.mark.parametrize("switch", sorted(ABLATIONS))
def test_ablation_switches_reach_their_layer(switch, tmp_path):
    """Each of the paper's ablations is a constructor (= recipe ``model.args``) switch that changes the layer it
    names; the model runs; where it keeps the default's parameters, the same weights give another output; a saved
    model rebuilds with the same switch."""
    kwargs, check = ABLATIONS[switch]
    model = tiny("lightnet", **kwargs)
    assert check(model)
    with torch.no_grad():
        for p in model.parameters():  # leave adaLN-Zero's identity so that every position signal shows in the output
            p.add_(torch.randn_like(p) * 0.02)
    x, t, y = torch.randn(2, 3, 8, 12), torch.tensor([3, 700]), torch.tensor([1, 4])
    out = model.eval()(x, t, y)
    assert out.shape == (2, 6, 8, 12) and torch.isfinite(out).all()
    default = tiny("lightnet").eval()
    if default.state_dict().keys() == model.state_dict().keys() and _settings(default) != _settings(model):
        default.load_state_dict(model.state_dict())
        assert not torch.allclose(default(x, t, y), out, atol=1e-5)
    model.save_pretrained(tmp_path)
    again = DiT.from_pretrained(tmp_path).eval()
    assert check(again)
    torch.testing.assert_close(again(x, t, y), out)


def test_position_defaults_and_refused_values():
    default = tiny("lightnet")
    assert (default.config.pos_embed, default.config.tpe_placement, default.blocks[0].attn.lrpe) == (
        "sincos",
        "embed",
        "per_axis",
    )
    assert (default.tpe.form, default.tpe.combine) == ("pair", "sum")
    torch.testing.assert_close(torch.sigmoid(default.tpe.lam_logit[0, 0, [0, -1]]), torch.tensor([0.2, 0.6]))
    assert tiny("softmax").config.tpe_placement == "none" and tiny("softmax").config.pos_embed == "sincos"
    with pytest.raises(ValueError, match="unknown pos_embed 'learned'; valid: 'sincos', 'none'"):
        tiny("lightnet", pos_embed="learned")
    with pytest.raises(ValueError, match="unknown MD-TPE placement 'everywhere'; valid: 'none', 'embed', 'block'"):
        tiny("lightnet", tpe_placement="everywhere")
    with pytest.raises(ValueError, match="MD-TPE has no option 'shape'; valid: num_axes, expand, form"):
        tiny("lightnet", tpe_placement="embed", tpe_kwargs={"shape": "cross"})
    with pytest.raises(ValueError, match="unknown MD-LRPE variant 'diagonal'"):
        tiny("lightnet", attention_kwargs={"lrpe": "diagonal"})
    with pytest.raises(ValueError, match="attention kind 'softmax' has no option 'lrpe'; valid: qkv_bias"):
        tiny("softmax", attention_kwargs={"lrpe": "global"})
    with pytest.raises(ValueError, match="unknown adaln 'layer'"):
        tiny("lightnet", adaln="layer")
    with pytest.raises(ValueError, match="unknown ffn 'swiglu'; valid: 'mlp', 'glu'"):
        tiny("softmax", ffn="swiglu")
    assert isinstance(tiny("softmax", ffn="glu").blocks[0].ffn, GLU)
