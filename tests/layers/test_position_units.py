"""Position units: every grid-coordinate signal (sin-cos embedding, MD-LRPE, MD-TPE, LION decays) in units of the
training grid ("image") or of the grid at hand ("token"), through the layers and both model families."""

import math

import pytest
import timm
import torch

import lightvision  # noqa: F401  (registers the models)
from helpers import rel
from lightvision.layers import MDTPE, POS_UNITS, LionAttention, build_attention, position_scale, sincos_pos_embed
from lightvision.ops import lion_attention, lion_feature_map, md_lrpe, md_tpe, split_heads
from lightvision.ops.md_lrpe import lrpe_angles


def test_position_scale_and_errors():
    assert POS_UNITS == ("image", "token")
    assert position_scale((16, 12), (8, 8), "image") == (0.5, 8 / 12)
    assert position_scale((8, 8), (8, 8), "image") is None  # the training grid: nothing to rescale
    assert position_scale((16, 16), (8, 8), "token") is None
    with pytest.raises(ValueError, match="unknown position unit 'pixel'; valid: 'image', 'token'"):
        position_scale((8, 8), (8, 8), "pixel")
    with pytest.raises(ValueError, match="one positive float per grid axis"):
        lrpe_angles((4, 4), 8, pos_scale=(0.5,))
    with pytest.raises(ValueError, match="one positive float per grid axis"):
        lrpe_angles((4, 4), 8, pos_scale=(0.5, -1.0))


@pytest.mark.parametrize("variant", ["per_axis", "mixed", "global"])
def test_md_lrpe_offsets_in_image_units(variant):
    """q~_s . k~_t depends on the offset in image fractions: a pair of tokens one training cell apart on the 4 x 6
    training grid scores as the pair two cells apart on the 8 x 12 grid in image units (and not in token units)."""
    torch.manual_seed(0)
    d = 12
    q, k = torch.rand(d, dtype=torch.float64), torch.rand(d, dtype=torch.float64)
    x = torch.stack([q, k])[None]  # [1, 2, d] rows q and k, placed at two grid cells below

    def score(grid, cells, scale):
        n = math.prod(grid)
        feats = torch.zeros(1, n, d, dtype=torch.float64)
        idx = [r * grid[1] + c for r, c in cells]
        feats[0, idx] = x[0]
        rot = md_lrpe(feats, grid, variant=variant, pos_scale=scale)[0]
        return float(rot[idx[0]] @ rot[idx[1]])

    train = score((4, 6), [(1, 2), (2, 3)], None)
    at_2x = score((8, 12), [(2, 4), (4, 6)], (0.5, 0.5))
    shifted = score((8, 12), [(0, 0), (2, 2)], (0.5, 0.5))  # same offset elsewhere: relative position only
    tokens = score((8, 12), [(2, 4), (4, 6)], None)
    assert abs(train - at_2x) < 1e-12 and abs(at_2x - shifted) < 1e-12
    assert abs(train - tokens) > 1e-4


def test_sincos_in_image_units():
    """At 2x the training grid in image units, token (2i, 2j) gets the code of training token (i, j)."""
    train = sincos_pos_embed(32, (4, 6)).view(4, 6, 32)
    big = sincos_pos_embed(32, (8, 12), pos_scale=(0.5, 0.5)).view(8, 12, 32)
    torch.testing.assert_close(big[::2, ::2], train, rtol=0, atol=1e-6)
    assert not torch.allclose(sincos_pos_embed(32, (8, 12)).view(8, 12, 32)[::2, ::2], train)


@pytest.mark.parametrize("form", ["two_sided", "pair"])
def test_mdtpe_in_image_units(form):
    """MD-TPE at position scale a: axis j's kernel sampled every a_j training cells, lambda^(a |n|), with the
    coefficients times a_j (the same mass); a = 1 is the unscaled layer."""
    torch.manual_seed(0)
    layer = MDTPE(16, form=form)
    torch.nn.init.normal_(layer.proj.weight, std=0.1)
    x = torch.randn(2, 1 + 6 * 10, 16)
    scale = (0.5, 0.25)
    got = layer(x, (6, 10), 1, scale)
    torch.testing.assert_close(layer(x, (6, 10), 1, (1.0, 1.0)), layer(x, (6, 10), 1))
    if form == "two_sided":  # the layer rebuilt by hand from the op
        a = torch.tensor(scale)
        log_lam = torch.nn.functional.logsigmoid(layer.lam_logit[0]) * a[:, None]
        want = x + layer.proj(md_tpe(x, (6, 10), layer.coeffs[0] * a[:, None, None], log_lam, num_prefix_tokens=1))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert rel(got, layer(x, (6, 10), 1)) > 1e-3


def test_mdtpe_kernel_mass_is_kept():
    """A one-axis two-sided kernel sampled twice as finely in image units sums to about the same mass: the samples
    approximate the same integral (their decay alone, without the coefficient factor, would double it)."""
    layer = MDTPE(4, num_axes=1, decay=(0.5, 0.7), expand=2)
    with torch.no_grad():
        layer.coeffs.fill_(1.0)
        layer.proj.weight.copy_(torch.eye(4))
        impulse = torch.zeros(1, 128, 4)
        impulse[0, 64] = 1.0
        mass = {s: float((layer(impulse, (128,), 0, s) - impulse).sum()) for s in [None, (0.5,)]}
    assert abs(mass[(0.5,)] / mass[None] - 1) < 0.06


@pytest.mark.parametrize("mask,snake", [("d", False), ("s", False), ("d", True), ("s", True)])
def test_lion_decays_in_image_units(mask, snake):
    """LionAttention at position scale a equals the same core with every log-decay times f = (a_0 a_1)^(p / 2); token
    units and the training grid leave the decays as they are."""
    torch.manual_seed(0)
    power = (1.0, 2.0) if snake else 1.5
    layer = LionAttention(16, 2, mask=mask, snake=snake, decay_power=power, form="parallel", backend="torch")
    grid, scale = (6, 4), (0.5, 0.75)
    x = torch.randn(2, 1 + 24, 16)
    factors = layer.decay_factors(scale, grid)
    powers = power if snake else (power,)
    assert factors == pytest.approx([(0.5 * 0.75) ** (p / 2) for p in powers])
    got = layer(x, grid, 1, scale)
    if not snake:
        q, k, v = split_heads(layer.qkv(x), 2)
        q, k = (lion_feature_map(t) for t in (q, k))
        log_decay = layer._log_decays(x, 1, factors)[0]
        y = lion_attention(q, k, v, mask=mask, log_decay=log_decay, form="parallel")
        torch.testing.assert_close(got, layer.proj(y.transpose(1, 2).flatten(2)), rtol=1e-5, atol=1e-6)
    assert rel(got, layer(x, grid, 1)) > 1e-4
    torch.testing.assert_close(layer(x, grid, 1, (1.0, 1.0)), layer(x, grid, 1))


def test_lion_decay_power_is_checked():
    with pytest.raises(ValueError, match=r"decay_power must be a number in \[0, 4\] or a \(row, column\) pair"):
        LionAttention(16, 2, mask="d", snake=True, decay_power=(1.0, 2.0, 3.0))
    with pytest.raises(ValueError, match=r"decay_power must be a number in \[0, 4\], got 'x'"):
        build_attention("lion_s", 16, 2, decay_power="x")


def _deit(kind, **kw):
    torch.manual_seed(0)
    return timm.create_model(
        f"{kind}_deit_tiny_patch16_224", img_size=16, patch_size=4, num_classes=3, depth=2, **kw
    ).eval()


@pytest.mark.parametrize("kind", ["lightnet", "lion_d", "lion_s_snake", "softmax"])
def test_deit_units(kind):
    """At the training size the two units are one model; at 2x they differ for the families whose signals count
    grid steps (softmax's learned embedding is resampled either way)."""
    image, token = _deit(kind), _deit(kind, pos_unit="token")
    token.load_state_dict(image.state_dict())
    x16, x32 = torch.randn(2, 3, 16, 16), torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(image(x16), token(x16))
        differ = rel(image(x32), token(x32))
    assert (differ < 1e-6) if kind == "softmax" else (differ > 1e-4)
    assert image.pos_grid == (4, 4) and image.position_scale((8, 8)) == (0.5, 0.5)
    image.set_input_size(32)
    assert image.pos_grid == (4, 4)  # the weights were trained on the 4 x 4 grid


def test_deit_units_per_signal():
    """A per-signal unit puts the absolute embedding and the blocks' signals in different units: the embedding of
    {"embed": "token"} is the token model's, its blocks scale as the image model's, so its output is neither."""
    image = _deit("lightnet")
    token, mixed = _deit("lightnet", pos_unit="token"), _deit("lightnet", pos_unit={"embed": "token"})
    for model in (token, mixed):
        model.load_state_dict(image.state_dict())
    x32 = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(mixed.embed(x32)[0], token.embed(x32)[0])
        assert rel(mixed.embed(x32)[0], image.embed(x32)[0]) > 1e-3
        assert rel(mixed(x32), image(x32)) > 1e-4 and rel(mixed(x32), token(x32)) > 1e-4
    assert mixed.position_scale((8, 8)) == image.position_scale((8, 8)) == (0.5, 0.5)
    assert mixed.position_scale((8, 8), "embed") is None
    with pytest.raises(ValueError, match="pos_unit has no option 'heads'; valid: embed, blocks"):
        _deit("lightnet", pos_unit={"heads": "token"})
    with pytest.raises(ValueError, match=r"unknown pos_unit\['embed'\] 'cells'"):
        _deit("lightnet", pos_unit={"embed": "cells"})


def test_deit_pos_unit_errors_and_record():
    from lightvision.classify.deit import create_from_config, recorded_args

    with pytest.raises(ValueError, match="unknown pos_unit 'pixels'; valid: 'image', 'token'"):
        _deit("lightnet", pos_unit="pixels")
    assert recorded_args("lion_s_deit_tiny_patch16_224", {"attn_kwargs": {"form": "scan"}}) == {
        "pos_unit": "image",
        "global_pool": "avg_all",
        "attn_kwargs": {"decay_power": 1.0, "form": "scan"},  # the decay power it was trained with, recorded
    }
    assert recorded_args("softmax_deit_tiny_patch16_224", {"pos_unit": "token"})["pos_unit"] == "token"
    config = {"name": "lion_d_deit_tiny_patch16_224", "num_classes": 3, "in_chans": 3, "img_size": 16}
    old = create_from_config({**config, "args": {"patch_size": 4, "depth": 1}})  # a checkpoint before units
    assert old.pos_unit == "image" and old.pos_grid == (4, 4)
    assert old.global_pool == "token"  # how LION classifiers were trained before the mean of every token
    new = create_from_config({**config, "args": recorded_args(config["name"], {"patch_size": 4, "depth": 1})})
    assert new.global_pool == "avg_all" and _deit("lion_s").global_pool == "avg_all"
    assert _deit("lightnet").global_pool == "token"


def test_dit_units_travel_with_the_config(tmp_path):
    from lightvision.diffusion.dit import DiT, create_model

    torch.manual_seed(0)
    model = create_model("lightnet_dit_s_2", input_size=8, in_channels=3, num_classes=2, depth=2).eval()
    for p in model.parameters():  # leave adaLN-Zero so the blocks and the head act
        torch.nn.init.normal_(p, std=0.05)
    x, t, y = torch.randn(2, 3, 12, 12), torch.tensor([3, 7]), torch.tensor([0, 1])
    assert model.config.pos_unit == "image" and model.position_scale((6, 6)) == (4 / 6, 4 / 6)
    with torch.no_grad():
        image = model(x, t, y)
        model.save_pretrained(tmp_path / "m")
        loaded = DiT.from_pretrained(tmp_path / "m").eval()
        torch.testing.assert_close(loaded(x, t, y), image)
        model.register_to_config(pos_unit="token")
        assert rel(model(x, t, y), image) > 1e-4
    with pytest.raises(ValueError, match="unknown pos_unit"):
        create_model("softmax_dit_s_2", input_size=8, pos_unit="cells")
    assert create_model("lion_d_dit_s_2", input_size=8, depth=1).config.attention_kwargs == {"decay_power": 1.0}
