"""DiT converters: diffusers' DiTTransformer2DModel and the facebookresearch/DiT layout give the same noise predictions
as the converted softmax DiT; a file of another model is refused naming its keys; save / from_pretrained round trip."""

import argparse

import pytest
import torch
from diffusers import DiTTransformer2DModel
from diffusers.models.embeddings import get_2d_sincos_pos_embed
from safetensors.torch import save_file

from lightvision.diffusion.convert import checkpoint_filter_fn, detect_layout, load_pretrained
from lightvision.diffusion.dit import DiT
from lightvision.engine.checkpoint import CheckpointError

DEPTH, HEADS, HEAD_DIM, CLASSES, LATENT, CHANNELS = 2, 2, 8, 5, 8, 4


def tiny_diffusers(channels: int = CHANNELS) -> DiTTransformer2DModel:
    """A random diffusers DiT whose blocks share one timestep / label embedder, as converted DiT weights do, with
    DiT's timestep frequencies (diffusers' default divides by F/2 - 1; convert.py's docstring) and DiT's eps."""
    torch.manual_seed(0)
    ref = DiTTransformer2DModel(
        num_attention_heads=HEADS,
        attention_head_dim=HEAD_DIM,
        in_channels=channels,
        out_channels=2 * channels,
        num_layers=DEPTH,
        sample_size=LATENT,
        patch_size=2,
        num_embeds_ada_norm=CLASSES,
        norm_eps=1e-6,
    ).eval()
    for p in ref.parameters():  # away from adaLN-Zero's zeros, so every modulation and the head matter
        torch.nn.init.normal_(p, std=0.2)
    first = ref.transformer_blocks[0].norm1.emb
    for block in ref.transformer_blocks:
        block.norm1.emb.load_state_dict(first.state_dict())
        block.norm1.emb.time_proj.downscale_freq_shift = 0
    return ref


def dit_layout(ref: DiTTransformer2DModel) -> dict[str, torch.Tensor]:
    """The facebookresearch/DiT models.py names of the diffusers model's weights (diffusers' conversion, inverted)."""
    s = ref.state_dict()
    emb = "transformer_blocks.0.norm1.emb."
    out = {
        "x_embedder.proj.weight": s["pos_embed.proj.weight"],
        "x_embedder.proj.bias": s["pos_embed.proj.bias"],
        "pos_embed": ref.pos_embed.pos_embed.clone(),
        "y_embedder.embedding_table.weight": s[emb + "class_embedder.embedding_table.weight"],
    }
    for ours, theirs in (
        ("t_embedder.mlp.0", "timestep_embedder.linear_1"),
        ("t_embedder.mlp.2", "timestep_embedder.linear_2"),
        ("final_layer.adaLN_modulation.1", "proj_out_1"),
        ("final_layer.linear", "proj_out_2"),
    ):
        for p in ("weight", "bias"):
            out[f"{ours}.{p}"] = s[f"{emb if ours.startswith('t_') else ''}{theirs}.{p}"]
    for n in range(DEPTH):
        b = f"transformer_blocks.{n}."
        for p in ("weight", "bias"):
            out[f"blocks.{n}.attn.qkv.{p}"] = torch.cat([s[b + f"attn1.to_{x}.{p}"] for x in "qkv"])
            out[f"blocks.{n}.attn.proj.{p}"] = s[b + f"attn1.to_out.0.{p}"]
            out[f"blocks.{n}.mlp.fc1.{p}"] = s[b + f"ff.net.0.proj.{p}"]
            out[f"blocks.{n}.mlp.fc2.{p}"] = s[b + f"ff.net.2.{p}"]
            out[f"blocks.{n}.adaLN_modulation.1.{p}"] = s[b + f"norm1.linear.{p}"]
    return out


def tiny_dit(**kw) -> DiT:
    args = dict(
        input_size=LATENT,
        patch_size=2,
        in_channels=CHANNELS,
        hidden_size=HEADS * HEAD_DIM,
        depth=DEPTH,
        num_heads=HEADS,
        num_classes=CLASSES,
        class_dropout_prob=0.0,
    )
    return DiT(**{**args, **kw}).eval()


def inputs():
    g = torch.Generator().manual_seed(1)
    return (
        torch.randn(3, CHANNELS, LATENT, LATENT, generator=g),
        torch.tensor([0, 17, 999]),
        torch.tensor([1, 4, CLASSES]),
    )  # the last label is the null class of guidance


@pytest.mark.parametrize("layout", ["diffusers", "dit"])
def test_converted_dit_predicts_the_same_noise_as_diffusers(layout):
    ref = tiny_diffusers()
    state = ref.state_dict() if layout == "diffusers" else dit_layout(ref)
    assert detect_layout(state) == layout
    model = tiny_dit()
    model.load_state_dict(checkpoint_filter_fn(state, model))
    x, t, y = inputs()
    with torch.no_grad():
        expected = ref(x, timestep=t, class_labels=y).sample
        got = model(x, t, y)
    assert expected.shape == got.shape == (3, 2 * CHANNELS, LATENT, LATENT)
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_position_tables_differ_by_swapped_halves():
    """The reason for the residual permutation: DiT's table is this project's with its halves swapped."""
    from lightvision.layers import sincos_pos_embed

    dit = torch.as_tensor(get_2d_sincos_pos_embed(16, 4, base_size=4, output_type="pt")).float()
    ours = sincos_pos_embed(16, (4, 4))
    assert not torch.allclose(dit, ours)
    torch.testing.assert_close(dit, ours.roll(8, dims=1))


def test_load_pretrained_reads_a_dit_training_checkpoint_and_picks_ema(tmp_path):
    ref = tiny_diffusers()
    ema = dit_layout(ref)
    raw = {k: v if k == "pos_embed" else torch.zeros_like(v) for k, v in ema.items()}
    args = argparse.Namespace(model="DiT-XL/2", image_size=256, global_batch_size=256, ckpt=None)  # train.py's args
    torch.save({"model": raw, "ema": ema, "opt": {}, "args": args}, tmp_path / "0400000.pt")
    model = tiny_dit()
    report = load_pretrained(model, tmp_path / "0400000.pt", which="ema")
    assert report["layout"] == "dit"
    x, t, y = inputs()
    with torch.no_grad():
        torch.testing.assert_close(model(x, t, y), ref(x, timestep=t, class_labels=y).sample, rtol=1e-5, atol=1e-5)
    load_pretrained(model, tmp_path / "0400000.pt", which="model")
    assert model.final_linear.weight.abs().max() == 0


def test_a_file_of_another_model_is_refused_naming_the_keys(tmp_path):
    save_file(dit_layout(tiny_diffusers()), tmp_path / "dit.safetensors")
    with pytest.raises(
        CheckpointError, match=r"shape mismatches \['blocks.0.attn.proj.bias: checkpoint \(16,\), model \(32,\)"
    ):
        load_pretrained(tiny_dit(hidden_size=32, num_heads=2), tmp_path / "dit.safetensors")
    with pytest.raises(CheckpointError, match="2 blocks, the model 3"):
        load_pretrained(tiny_dit(depth=3), tmp_path / "dit.safetensors")
    learned = dict(dit_layout(tiny_diffusers()), pos_embed=torch.randn(1, 16, 16))
    with pytest.raises(CheckpointError, match="not DiT's fixed 2-D sin-cos table"):
        checkpoint_filter_fn(learned, tiny_dit())
    with pytest.raises(CheckpointError, match="converts to a softmax DiT"):
        load_pretrained(tiny_dit(attention="lightnet"), tmp_path / "dit.safetensors")
    save_file({"encoder.weight": torch.zeros(2)}, tmp_path / "other.safetensors")
    with pytest.raises(ValueError, match="not a DiT state dict"):
        load_pretrained(tiny_dit(), tmp_path / "other.safetensors")


def test_diffusers_blocks_with_different_embedders_are_refused():
    ref = tiny_diffusers()
    state = ref.state_dict()
    state["transformer_blocks.1.norm1.emb.timestep_embedder.linear_1.weight"] += 1
    with pytest.raises(CheckpointError, match="block 1's timestep_embedder.linear_1.weight differs"):
        checkpoint_filter_fn(state, tiny_dit())


def test_save_pretrained_round_trip_offline(tmp_path):
    """diffusers' ModelMixin / ConfigMixin persistence: safetensors + config.json in a local folder."""
    torch.manual_seed(0)
    model = tiny_dit(attention="lightnet")
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    model.save_pretrained(tmp_path / "dit")
    assert {p.name for p in (tmp_path / "dit").iterdir()} >= {"config.json", "diffusion_pytorch_model.safetensors"}
    loaded = DiT.from_pretrained(tmp_path / "dit", local_files_only=True).eval()
    assert loaded.config.attention == "lightnet" and loaded.config.adaln == "shared"
    x, t, y = inputs()
    with torch.no_grad():
        torch.testing.assert_close(loaded(x, t, y), model(x, t, y), rtol=0, atol=0)


def test_sample_command_takes_external_weights(tmp_path, capsys, cli_error):
    """``diffusion sample --pretrained FILE --model NAME`` converts, says what it loaded, samples; the file of another
    model is refused in one line naming the keys."""
    import json
    import re

    from lightvision.cli import main

    torch.save(dit_layout(tiny_diffusers(channels=3)), tmp_path / "DiT-tiny.pt")
    recipe = (
        "data: {{image_size: {size}, channels: 3, num_classes: {classes}}}\n"
        "autoencoder: {{kind: pixel, path: null}}\n"
        "model: {{args: {{depth: {depth}, hidden_size: {width}, num_heads: {heads}}}}}\n"
    )
    (tmp_path / "tiny.yaml").write_text(
        recipe.format(size=LATENT, classes=CLASSES, depth=DEPTH, width=HEADS * HEAD_DIM, heads=HEADS)
    )
    args = [
        "diffusion",
        "sample",
        "--pretrained",
        str(tmp_path / "DiT-tiny.pt"),
        "--model",
        "softmax_dit_s_2",
        "--config",
        str(tmp_path / "tiny.yaml"),
        "--num-samples",
        "2",
        "--steps",
        "2",
        "--cfg-scale",
        "1.5",
    ]
    assert main([*args, "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "loaded " + str(tmp_path / "DiT-tiny.pt") + " (dit layout" in out
    summary = json.loads(out[out.index("{") :])
    assert summary["loaded"]["layout"] == "dit" and summary["num_samples"] == 2
    (tmp_path / "wide.yaml").write_text(recipe.format(size=LATENT, classes=CLASSES, depth=DEPTH, width=32, heads=HEADS))
    wrong = [a if a != str(tmp_path / "tiny.yaml") else str(tmp_path / "wide.yaml") for a in args]
    assert re.search(
        r"DiT-tiny.pt holds another model: shape mismatches \['blocks.0.attn.proj.bias",
        cli_error([*wrong, "--out", str(tmp_path / "bad")]),
    )
    assert "--pretrained FILE with --model NAME" in cli_error(
        ["diffusion", "sample", "--pretrained", str(tmp_path / "DiT-tiny.pt"), "--out", str(tmp_path / "x")]
    )


def test_init_from_copies_what_another_attention_shares(tmp_path):
    """model.init_from: a softmax DiT file (DiT layout) into a softmax DiT predicts like the source, into LION-D and
    LightNet DiTs copies every tensor of the same name and shape (residual permuted) and reports the rest."""
    from lightvision.diffusion.convert import init_from, to_project_names

    ref = tiny_diffusers()
    torch.save(dit_layout(ref), tmp_path / "dit.pt")
    softmax = tiny_dit()
    report = init_from(softmax, tmp_path / "dit.pt")
    assert report["skipped"] == [] and report["unused"] == []
    x, t, y = inputs()
    with torch.no_grad():
        torch.testing.assert_close(softmax(x, t, y), ref(x, timestep=t, class_labels=y).sample, rtol=1e-5, atol=1e-5)

    source = to_project_names(dit_layout(ref))
    lion = tiny_dit(attention="lion_d")
    report = init_from(lion, tmp_path / "dit.pt")
    assert report["skipped"] == ["blocks.0.attn.decay", "blocks.1.attn.decay"] and report["unused"] == []
    lightnet = tiny_dit(attention="lightnet", depth=3)
    report = init_from(lightnet, tmp_path / "dit.pt")
    assert {"blocks.0.attn.qkv.weight", "blocks.1.attn.proj.weight", "t_embedder.mlp.0.weight"} <= set(report["copied"])
    assert {"blocks.0.ffn.w12.weight", "blocks.2.attn.qkv.weight", "shared_modulation.1.weight"} <= set(
        report["skipped"]
    )
    assert "blocks.0.attn.qkv.bias" in report["unused"]  # LightNet's projections have no bias
    for model in (lion, lightnet):
        own = model.state_dict()
        for key in ("blocks.0.attn.qkv.weight", "final_linear.weight", "patch_embed.proj.weight"):
            assert torch.equal(own[key], source[key])


def test_train_recipe_starts_from_a_checkpoint(tmp_path):
    """``model.init_from`` in a diffusion recipe: the run records what it copied (results and init_from.json)."""
    import json

    from lightvision.diffusion.train import load_recipe, train

    torch.save(dit_layout(tiny_diffusers(channels=1)), tmp_path / "dit.pt")
    cfg = load_recipe(
        None,
        [
            f"run.dir={tmp_path / 'run'}",
            "model.name=lion_s_dit_s_2",
            f"model.args={{depth: {DEPTH}, hidden_size: {HEADS * HEAD_DIM}, num_heads: {HEADS}}}",
            f"model.init_from={tmp_path / 'dit.pt'}",
            "data.source=digits",
            "data.channels=1",
            "data.image_size=16",
            "data.num_classes=10",
            "train.batch_size=4",
            "data.num_workers=0",
            "autoencoder.kind=pixel",
            "train.max_steps=1",
            "train.mixed_precision='no'",
            "train.ckpt_every_steps=1",
            "sample.every=100",
        ],
    )
    out = train(cfg)
    record = json.loads((tmp_path / "run" / "init_from.json").read_text())
    assert out["init_from"]["copied"] == len(record["copied"]) > 10
    assert "y_embedder.weight" in record["skipped"]  # 5 classes in the file, 10 here
    assert "blocks.0.attn.gate.weight" in out["init_from"]["skipped_names"]
