"""DeiT family: parameter counts vs docs/spec.md 3, timm registration and the checks timm applies to its own models."""

from __future__ import annotations

import pytest
import timm
import torch
from safetensors.torch import save_file
from torch import nn

import lightvision  # noqa: F401  registers the models
from lightvision.classify.deit import FAMILIES, MODEL_NAMES, SIZES, DeiT, model_name

# docs/spec.md 3 (paper figures, millions); LION-* are "as DeiT".
PAPER_PARAMS_M = {
    "softmax": (5.7, 22.0, 86.0),
    "lightnet": (6.0, 22.64, 87.74),
    **{kind: (5.7, 22.0, 86.0) for kind in ("lion_lit", "lion_d", "lion_s", "lion_d_snake", "lion_s_snake")},
    "normalized": (5.7, 22.0, 86.0),  # DeiT's block with a Linear(dim, heads) more per layer
}
TINY = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=7)


def tiny(attention: str, **kwargs) -> DeiT:
    torch.manual_seed(0)
    return timm.create_model(model_name(attention, "tiny"), **{**TINY, **kwargs})


def test_registered_names():
    assert sorted(timm.list_models("*_deit_*")) == sorted(MODEL_NAMES)
    assert len(MODEL_NAMES) == len(FAMILIES) * len(SIZES) == 24


def test_param_counts_match_spec(capsys):
    rows = []
    for attention, targets in PAPER_PARAMS_M.items():
        for size, target in zip(SIZES, targets):
            with torch.device("meta"):
                model = timm.create_model(model_name(attention, size))
            count = sum(p.numel() for p in model.parameters()) / 1e6
            rows.append((model_name(attention, size), count, target, 100 * (count / target - 1)))
    with capsys.disabled():
        print("\nmodel | params (M) | docs/spec.md 3 (M) | diff (%)")
        for name, count, target, diff in rows:
            print(f"{name} | {count:.2f} | {target} | {diff:+.1f}")
    bad = [r for r in rows if abs(r[3]) > 5]
    assert not bad, f"more than 5% off docs/spec.md 3: {bad}"


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_create_model_every_name(name):
    with torch.device("meta"):
        model = timm.create_model(name, num_classes=10, img_size=64)
    cfg = model.pretrained_cfg
    assert model.num_classes == 10 and model.head.out_features == 10
    assert cfg["crop_pct"] == 0.875 and cfg["interpolation"] == "bicubic" and len(cfg["mean"]) == 3
    assert model.grid_size(model.img_size) == (4, 4)


@pytest.mark.parametrize("attention", list(FAMILIES))
def test_forward_backward_every_param_gets_grad(attention):
    model = tiny(attention)
    x = torch.randn(2, 3, 16, 16)
    out = model(x)
    assert out.shape == (2, 7) and torch.isfinite(out).all()
    out.square().mean().backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not no_grad, f"parameters without a finite gradient: {no_grad}"
    # MD-TPE's zero-initialised projection is the one tensor whose gradient may be zero only through its
    # output; everything else must receive signal
    zero = [n for n, p in model.named_parameters() if p.grad.abs().sum() == 0 and "tpe" not in n]
    assert not zero, f"parameters with an all-zero gradient: {zero}"


@pytest.mark.parametrize("attention", list(FAMILIES))
def test_default_cfg_and_classifier_reset(attention):
    """What timm's test_model_default_cfgs checks: features, pre_logits, first conv, classifier, reset."""
    model = tiny(attention).eval()
    cfg = model.pretrained_cfg
    state = model.state_dict()
    assert cfg["first_conv"] + ".weight" in state and cfg["classifier"] + ".weight" in state
    x = torch.randn(2, 3, 16, 16)
    feats = model.forward_features(x)
    assert feats.shape == (2, 1 + 16, model.num_features) and model.head_hidden_size == model.num_features
    assert model.forward_head(feats, pre_logits=True).shape == (2, model.num_features)
    model.reset_classifier(0)
    assert model(x).shape == (2, model.num_features)
    model.reset_classifier(3, global_pool="avg")
    assert model(x).shape == (2, 3) and model.get_classifier().out_features == 3
    pooled = model.forward_head(model.forward_features(x), pre_logits=True)
    torch.testing.assert_close(pooled, model.forward_features(x)[:, 1:].mean(1))
    nwd = model.no_weight_decay()
    assert all(any(n == k or n.startswith(k + ".") for n, _ in model.named_parameters()) for k in nwd - {"pos_embed"})
    groups = model.group_matcher()
    assert "blocks" in groups and "stem" in groups


@pytest.mark.parametrize("attention", ["softmax", "lightnet", "lion_s_snake"])
def test_grad_checkpointing_matches(attention):
    x = torch.randn(2, 3, 16, 16)
    ref_model, ckpt_model = tiny(attention), tiny(attention)
    ckpt_model.set_grad_checkpointing(True)
    outs, grads = [], []
    for model in (ref_model, ckpt_model):
        out = model(x)
        out.sum().backward()
        outs.append(out)
        grads.append({n: p.grad for n, p in model.named_parameters()})
    torch.testing.assert_close(outs[0], outs[1])
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], msg=name)


@pytest.mark.parametrize("attention", list(FAMILIES))
def test_any_resolution_non_square(attention):
    """The same weights run on other grids (non-square too); the grid reaches the layers."""
    model = tiny(attention).eval()
    x = torch.randn(1, 3, 24, 40)
    assert model(x).shape == (1, 7)
    assert model.forward_features(x).shape == (1, 1 + 6 * 10, 32)


def test_grid_reaches_attention():
    """Position-aware LightNet: transposing the image changes the features (the grid is not ignored)."""
    model = tiny("lightnet").eval()
    x = torch.randn(1, 3, 16, 32)
    seen = []
    hook = model.blocks[0].attn.register_forward_hook(
        lambda m, args, kwargs, out: seen.append(kwargs["grid"]), with_kwargs=True
    )
    model(x)
    hook.remove()
    assert seen == [(4, 8)]


def test_not_divisible_error():
    model = tiny("lion_s")
    with pytest.raises(ValueError, match=r"not divisible by the patch size 4.*multiple of 4"):
        model(torch.randn(1, 3, 18, 16))
    with pytest.raises(ValueError, match="not divisible"):
        tiny("softmax", img_size=18)


@pytest.mark.parametrize("attention", ["softmax", "normalized"])
def test_learned_pos_embed_resampled(attention):
    model = tiny(attention).eval()
    x = torch.randn(1, 3, 32, 32)
    on_the_fly = model(x)
    model.set_input_size(32)
    assert model.pos_embed.shape == (1, 1 + 64, 32)
    assert model.pretrained_cfg["input_size"] == (3, 32, 32)
    torch.testing.assert_close(model(x), on_the_fly)
    assert tiny("lightnet").pos_embed is None and tiny("lion_d").pos_embed is None
    assert tiny("lion_lit").pos_embed is not None and tiny("normalized").pos_embed is not None


@pytest.mark.parametrize("attention", ["softmax", "lightnet", "normalized"])
def test_pretrained_cfg_overlay_loads_local_safetensors(tmp_path, attention):
    source = tiny(attention).eval()
    file = tmp_path / "weights.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, file)
    x = torch.randn(2, 3, 16, 16)
    # timm drops the head unless the overlay says the file's class count (the cfg default is 1000)
    overlay = dict(file=str(file), num_classes=TINY["num_classes"])
    loaded = timm.create_model(
        model_name(attention, "tiny"), pretrained=True, pretrained_cfg_overlay=overlay, **TINY
    ).eval()
    torch.testing.assert_close(loaded(x), source(x))
    # fine-tuning at another size and class count: head dropped, pos_embed resampled, rest kept
    ft = timm.create_model(
        model_name(attention, "tiny"),
        pretrained=True,
        pretrained_cfg_overlay=overlay,
        **{**TINY, "num_classes": 3, "img_size": 32},
    )
    assert ft.head.out_features == 3
    torch.testing.assert_close(ft.patch_embed.proj.weight, source.patch_embed.proj.weight)
    if attention != "lightnet":
        assert ft.pos_embed.shape == (1, 1 + 64, 32)


@pytest.mark.parametrize("attention", ["lightnet", "lion_s_snake", "normalized"])
def test_traces_as_one_graph(attention):
    # torch.compile sees the whole model as one graph on the reference path (the MD-LRPE angles once broke it
    # at every layer: a repeat_interleave with tensor repeats has a data-dependent shape)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(tiny(attention).eval())(torch.randn(1, 3, 16, 16))
    assert explained.graph_break_count == 0, [str(b.reason)[:200] for b in explained.break_reasons]


DEIT_ABLATIONS = {  # switch -> (create_model kwargs, what it must change in the built model)
    "tpe_embed": (dict(tpe_placement="embed", pos_embed="none"), lambda m: m.tpe is not None and m.pos_embed is None),
    "tpe_block": (
        dict(tpe_placement="block", tpe_kwargs={"combine": "product"}),
        lambda m: m.tpe is None and all(b.tpe.combine == "product" for b in m.blocks),
    ),
    "tpe_one_sided": (
        dict(tpe_placement="embed", tpe_kwargs={"form": "one_sided", "decay": (0.3, 0.6)}),
        lambda m: m.tpe.form == "one_sided",
    ),
    "no_pos_embed": (dict(pos_embed="none"), lambda m: m.pos_embed is None and m.pos_embed_kind == "none"),
    "learned": (dict(pos_embed="learned"), lambda m: m.pos_embed is not None),
    "lrpe_mixed": (dict(attn_kwargs={"lrpe": "mixed"}), lambda m: m.blocks[0].attn.lrpe == "mixed"),
    "no_lrpe": (dict(attn_kwargs={"lrpe": "none"}), lambda m: m.blocks[1].attn.lrpe is None),
    "no_decay": (dict(attn_kwargs={"key_softmax": False}), lambda m: not m.blocks[0].attn.key_softmax),
    "full_gate": (
        dict(attn_kwargs={"gate_rank": "full", "norm": False}),
        lambda m: isinstance(m.blocks[0].attn.gate, nn.Linear) and isinstance(m.blocks[0].attn.norm, nn.Identity),
    ),
}


@pytest.mark.parametrize("switch", sorted(DEIT_ABLATIONS))
def test_ablation_switches_reach_their_layer(switch):
    """Each ablation is a ``create_model`` (= recipe ``model.args``) switch reaching the layer it names; the model
    runs at its size and at another; with the default's parameters it gives another output."""
    kwargs, check = DEIT_ABLATIONS[switch]
    model = tiny("lightnet", **kwargs).eval()
    assert check(model)
    x = torch.randn(2, 3, 16, 24)
    out = model(x)
    assert out.shape == (2, 7) and torch.isfinite(out).all()
    default = tiny("lightnet").eval()
    if default.state_dict().keys() == model.state_dict().keys():
        with torch.no_grad():  # MD-TPE's zero output projection would hide its switches
            for name, p in model.named_parameters():
                if name.endswith("tpe.proj.weight"):
                    p.normal_(std=0.1)
        default.load_state_dict(model.state_dict())
        assert not torch.allclose(default(x), model(x), atol=1e-5)


def test_ablation_values_refused_with_the_allowed_ones():
    with pytest.raises(ValueError, match="unknown pos_embed 'rope'; valid: 'learned', 'sincos', 'none'"):
        tiny("lightnet", pos_embed="rope")
    with pytest.raises(ValueError, match="unknown MD-TPE form 'two-sided'; valid: 'two_sided', 'one_sided', 'pair'"):
        tiny("lightnet", tpe_placement="embed", tpe_kwargs={"form": "two-sided"})
    with pytest.raises(ValueError, match=r"MD-TPE options \['form'\] given without MD-TPE"):
        tiny("lightnet", tpe_kwargs={"form": "pair"})
    with pytest.raises(ValueError, match="attention kind 'lightnet' has no option 'lrp'"):
        tiny("lightnet", attn_kwargs={"lrp": "global"})


def test_every_shipped_variant_builds_the_model_it_describes():
    """configs/variants/classify_cifar10.yaml: each entry's overrides pass the recipe and build its model."""
    from pathlib import Path

    import yaml

    from lightvision.classify.deit import create_from_config
    from lightvision.classify.train import load_recipe, model_config
    from lightvision.tools.results import resolve_variant

    root = Path(__file__).parents[2] / "configs"
    path = root / "variants" / "classify_cifar10.yaml"
    built = {}
    for name in yaml.safe_load(path.read_text()):
        kind, overrides = resolve_variant(name, path, FAMILIES)
        cfg = load_recipe(
            root / "classify" / "cifar10.yaml",
            [f"model.name={kind}_deit_tiny_patch16_224", "model.args.depth=1", *overrides],
        )
        built[name] = model = create_from_config(model_config(cfg, 10))
        assert model.attention == kind and model(torch.randn(1, 3, 32, 32)).shape == (1, 10)
    assert built["lightnet_tpe"].tpe is not None and built["lightnet_tpe"].pos_embed_kind == "none"
    assert built["lightnet_sincos_tpe_pair"].tpe.form == "pair" and built["lightnet_mixed"].tpe is None


@pytest.mark.parametrize("attention", ["softmax", "lightnet", "lion_s_snake"])
def test_features_only_through_timm(attention):
    """timm.create_model(..., features_only=True): feature maps [B, D, H/p, W/p] of the chosen blocks, the blocks
    after the last one pruned; the maps are the plain model's block outputs (same seed, same weights)."""
    x = torch.randn(2, 3, 16, 24)
    feats_model = tiny(attention, depth=3, features_only=True, out_indices=(0, 1))
    assert feats_model.feature_info.channels() == [32, 32] and feats_model.feature_info.reduction() == [4, 4]
    assert len(feats_model.model.blocks) == 2 and isinstance(feats_model.model.head, torch.nn.Identity)
    feats = feats_model.eval()(x)
    assert [tuple(f.shape) for f in feats] == [(2, 32, 4, 6)] * 2

    model = tiny(attention, depth=3).eval()
    with torch.no_grad():
        final, inter = model.forward_intermediates(x, indices=[0, 1, -1], output_fmt="NLC")
        for got, want in zip(feats, inter):
            torch.testing.assert_close(got, want.transpose(1, 2).reshape(got.shape))
        torch.testing.assert_close(final, model.forward_features(x))
        torch.testing.assert_close(model.norm(inter[-1]), final[:, 1:])  # the last block's patch tokens, normed
        ((maps, cls),) = model.forward_intermediates(
            x, indices=1, norm=True, return_prefix_tokens=True, intermediates_only=True
        )
    assert maps.shape == (2, 32, 4, 6) and cls.shape == (2, 1, 32)
    torch.testing.assert_close(cls, final[:, :1])
    assert len(tiny(attention, depth=4, features_only=True)(x)) == 3  # timm ViT default: the last 3 blocks
    with pytest.raises(ValueError, match="output_fmt"):
        model.forward_intermediates(x, output_fmt="NHWC")


def test_intermediates_in_depth_order_like_timm_vit():
    """Indices in any order (or repeated) give the blocks in depth order, each once, as timm's VisionTransformer."""
    x = torch.randn(2, 3, 16, 16)
    vit = timm.models.VisionTransformer(**{**TINY, "depth": 3}).eval()
    model = tiny("softmax", depth=3).eval()
    with torch.no_grad():
        for net in (vit, model):
            ordered = net.forward_intermediates(x, indices=[0, 2], intermediates_only=True)
            for indices in ([2, 0], [-1, 0, 2]):
                got = net.forward_intermediates(x, indices=indices, intermediates_only=True)
                assert len(got) == 2, (type(net).__name__, indices)
                for a, b in zip(got, ordered):
                    torch.testing.assert_close(a, b)
