"""Classifier converters: timm's DeiT and the LION authors' classifier layout give the same logits as the converted
DeiT family; distilled and S-curve files are refused clearly; a wrong model's file is refused naming its keys;
Hub-style save / from_pretrained round trip offline."""

import argparse
import json
import math
import re

import pytest
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

import lightvision  # noqa: F401  (registers the DeiT family in timm)
from lightvision.classify.convert import (
    create_pretrained,
    detect_layout,
    from_pretrained,
    load_pretrained,
    pretrained_kwargs,
    save_pretrained,
)
from lightvision.engine.checkpoint import CheckpointError

IMG, PATCH, DIM, HEADS, DEPTH, CLASSES = 32, 8, 24, 2, 2, 7


def images(n: int = 3, size: int = IMG) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(1))


def randomize(model: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(0)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return model.eval()


def test_timm_deit_tiny_and_the_authors_checkpoint_give_the_same_logits(tmp_path):
    ref = randomize(timm.create_model("deit_tiny_patch16_224", img_size=64, num_classes=CLASSES))
    args = argparse.Namespace(model="deit_tiny_patch16_224", lr=5e-4, input_size=224, resume="")  # main.py's args
    torch.save({"model": ref.state_dict(), "epoch": 299, "args": args}, tmp_path / "deit_tiny.pth")  # DeiT's format
    model, report = create_pretrained("softmax_deit_tiny_patch16_224", tmp_path / "deit_tiny.pth")
    assert report["layout"] == "deit" and model.img_size == (64, 64) and model.num_classes == CLASSES
    x = images(2, 64)
    with torch.no_grad():
        expected, got = ref(x), model.eval()(x)
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_distilled_deit_is_refused():
    state = timm.create_model("deit_tiny_distilled_patch16_224", img_size=32).state_dict()
    with pytest.raises(CheckpointError, match="distilled DeiT .* non-distilled deit_"):
        detect_layout(state)


# ----------------------------------------------------------------------------- the LION authors' layout
def lion_authors_state(mask: str, pos_embed: bool, order: str = "Normal") -> dict[str, torch.Tensor]:
    """Random tensors under the names and shapes of the LION authors' ``Lion_VisionTransformer``
    (their img_classification/lion/models_lion.py): mask "Lit" | "Decay" | "Selective", order "Normal" | "S"."""
    g = torch.Generator().manual_seed(2)
    shapes = {
        "cls_token": (1, 1, DIM),
        "patch_embed.proj.weight": (DIM, 3, PATCH, PATCH),
        "patch_embed.proj.bias": (DIM,),
        "norm.weight": (DIM,),
        "norm.bias": (DIM,),
        "head.weight": (CLASSES, DIM),
        "head.bias": (CLASSES,),
    }
    if pos_embed:
        shapes["pos_embed"] = (1, 1 + (IMG // PATCH) ** 2, DIM)
    for n in range(DEPTH):
        b = f"blocks.{n}."
        shapes.update(
            {
                b + "norm1.weight": (DIM,),
                b + "norm1.bias": (DIM,),
                b + "norm2.weight": (DIM,),
                b + "norm2.bias": (DIM,),
                b + "attn.qkv.weight": (3 * DIM, DIM),
                b + "attn.qkv.bias": (3 * DIM,),
                b + "attn.proj.weight": (DIM, DIM),
                b + "attn.proj.bias": (DIM,),
                b + "mlp.fc1.weight": (4 * DIM, DIM),
                b + "mlp.fc1.bias": (4 * DIM,),
                b + "mlp.fc2.weight": (DIM, 4 * DIM),
                b + "mlp.fc2.bias": (DIM,),
            }
        )
        for name in ("a_i", "a2_i") if order == "S" else ("a_i",):
            if mask == "Decay":
                shapes[b + f"attn.{name}"] = (HEADS,)
            elif mask == "Selective":
                shapes.update({b + f"attn.{name}.weight": (HEADS, DIM), b + f"attn.{name}.bias": (HEADS,)})
    state = {k: 0.3 * torch.randn(s, generator=g) for k, s in shapes.items()}
    for k in state:
        if k.endswith(("norm1.weight", "norm2.weight", "norm.weight")):
            state[k] = 1 + state[k]
    return state


def lion_mask(log_a: torch.Tensor) -> torch.Tensor:
    """The LION paper's selective mask from per-token log gates [B, H, N]: M_ij = prod_{m=j}^{i-1} a_m (i > j),
    prod_{m=i+1}^{j} a_m (i < j), 1 on the diagonal; written from the paper, not from any implementation."""
    p = F.pad(log_a.cumsum(-1), (1, 0))  # p_k = sum_{m < k} log a_m
    n = log_a.shape[-1]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    lower = p[..., i] - p[..., j]  # i > j: sum_{m=j}^{i-1}
    upper = p[..., (j + 1).clamp(max=n)] - p[..., (i + 1).clamp(max=n)]  # i < j: sum_{m=i+1}^{j}
    return torch.where(i > j, lower, torch.where(i < j, upper, 0.0)).exp()


def curve(side: int, order: str) -> torch.Tensor:
    """Token indices (class token first) along the authors' S curves: "row" (rows top to bottom, odd rows right to
    left; their "s") or "col" (the transposed curve, columns left to right; their "sr")."""
    cells = [(y, x if y % 2 == 0 else side - 1 - x) for y in range(side) for x in range(side)]
    raster = [y * side + x if order == "row" else x * side + y for y, x in cells]
    return torch.tensor([0] + [1 + r for r in raster])


def lion_authors_mask(state: dict[str, torch.Tensor], p: str, mask: str, h: torch.Tensor, names: tuple[str, ...]):
    """The mean of the masks of the given orders (("a_i",) for Normal, ("a_i", "a2_i") for their S curves) [.., N, N]
    in raster order: each built along its order's token sequence (D: lambda^|t - u|; S: ``lion_mask``)."""
    n = h.shape[1]
    orders = [torch.arange(n)] if len(names) == 1 else [curve(math.isqrt(n - 1), o) for o in ("row", "col")]
    total = 0
    for name, perm in zip(names, orders):
        pos = torch.argsort(perm)  # raster index -> place along the curve
        if mask == "Decay":
            dist = (torch.arange(n)[:, None] - torch.arange(n)[None]).abs()
            m = torch.sigmoid(state[p + f"attn.{name}"])[:, None, None] ** dist
        else:
            a = 1 - torch.sigmoid(F.linear(h, state[p + f"attn.{name}.weight"], state[p + f"attn.{name}.bias"]))
            a = a.transpose(1, 2)
            a = torch.cat([torch.ones_like(a[..., :1]), a[..., 1:]], -1)  # the cls token does not decay
            m = lion_mask(a[..., perm].log())
        total = total + m[..., pos[:, None], pos[None, :]]
    return total / len(names)


def lion_authors_forward(
    state: dict[str, torch.Tensor], mask: str, x: torch.Tensor, order: str = "Normal"
) -> torch.Tensor:
    """The authors' classifier (attention form, no cls_tok: mean of every token) from the paper's equations, over
    their state dict."""
    s = state
    x = F.conv2d(x, s["patch_embed.proj.weight"], s["patch_embed.proj.bias"], stride=PATCH).flatten(2).transpose(1, 2)
    x = torch.cat([s["cls_token"].expand(x.shape[0], -1, -1), x], 1)
    if "pos_embed" in s:
        x = x + s["pos_embed"]
    b_, n, _ = x.shape
    for blk in range(DEPTH):
        p = f"blocks.{blk}."
        h = F.layer_norm(x, (DIM,), s[p + "norm1.weight"], s[p + "norm1.bias"], 1e-6)
        qkv = F.linear(h, s[p + "attn.qkv.weight"], s[p + "attn.qkv.bias"])
        q, k, v = qkv.view(b_, n, 3, HEADS, -1).permute(2, 0, 3, 1, 4)
        phi = (lambda t: F.elu(t) + 1) if mask == "Lit" else (lambda t: F.normalize(F.silu(t) + 0.5, dim=-1))
        attn = phi(q) @ phi(k).transpose(-1, -2) * q.shape[-1] ** -0.5
        if mask != "Lit":
            attn = attn * lion_authors_mask(s, p, mask, h, ("a_i", "a2_i") if order == "S" else ("a_i",))
        attn = attn / (attn.sum(-1, keepdim=True) + 1e-6)
        y = (attn @ v).transpose(1, 2).reshape(b_, n, DIM)
        x = x + F.linear(y, s[p + "attn.proj.weight"], s[p + "attn.proj.bias"])
        h = F.layer_norm(x, (DIM,), s[p + "norm2.weight"], s[p + "norm2.bias"], 1e-6)
        h = F.linear(
            F.gelu(F.linear(h, s[p + "mlp.fc1.weight"], s[p + "mlp.fc1.bias"])),
            s[p + "mlp.fc2.weight"],
            s[p + "mlp.fc2.bias"],
        )
        x = x + h
    x = F.layer_norm(x, (DIM,), s["norm.weight"], s["norm.bias"], 1e-6).mean(1)
    return F.linear(x, s["head.weight"], s["head.bias"])


@pytest.mark.parametrize(
    "mask, name, pos_embed, order",
    [
        ("Lit", "lion_lit", True, "Normal"),
        ("Decay", "lion_d", False, "Normal"),
        ("Selective", "lion_s", False, "Normal"),
        ("Selective", "lion_s", True, "Normal"),
        ("Decay", "lion_d_snake", False, "S"),
        ("Selective", "lion_s_snake", False, "S"),
    ],
    ids=["lit-pos", "d", "s", "s-pos", "d-curve", "s-curve"],
)
def test_lion_authors_classifier_gives_the_same_logits(tmp_path, mask, name, pos_embed, order):
    state = lion_authors_state(mask, pos_embed, order)
    save_file(state, tmp_path / "lion.safetensors")
    # a LIT file has no mask parameters, so nothing tells it from a DeiT: its pooling is given by hand; without a
    # learned embedding nothing tells the training grid: positions count patches, as the authors' model does
    assert pretrained_kwargs(state).get("global_pool") == (None if mask == "Lit" else "avg_all")
    assert pretrained_kwargs(state).get("pos_unit") == (None if pos_embed else "token")
    model, report = create_pretrained(
        f"{name}_deit_tiny_patch16_224",
        tmp_path / "lion.safetensors",
        embed_dim=DIM,
        num_heads=HEADS,
        depth=DEPTH,
        **({"global_pool": "avg_all"} if mask == "Lit" else {}),
    )
    assert report["layout"] == ("deit" if mask == "Lit" else "lion")
    x = images()
    with torch.no_grad():
        expected, got = lion_authors_forward(state, mask, x, order), model.eval()(x)
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_a_file_of_another_model_is_refused_naming_the_keys(tmp_path):
    save_file(lion_authors_state("Decay", False), tmp_path / "lion_d.safetensors")
    model = timm.create_model(
        "lion_s_deit_tiny_patch16_224",
        embed_dim=DIM,
        num_heads=HEADS,
        depth=DEPTH,
        patch_size=PATCH,
        img_size=IMG,
        num_classes=CLASSES,
    )
    with pytest.raises(
        CheckpointError,
        match=r"missing keys \['blocks.0.attn.gate.bias'.*unexpected keys "
        r"\['blocks.0.attn.decay'",
    ):
        load_pretrained(model, tmp_path / "lion_d.safetensors")
    with pytest.raises(CheckpointError, match=r"shape mismatches \['blocks.0.attn.proj.bias"):
        create_pretrained("lion_d_deit_tiny_patch16_224", tmp_path / "lion_d.safetensors", num_heads=HEADS, depth=DEPTH)


def test_save_pretrained_round_trip_offline(tmp_path):
    """timm's Hub folder: model.safetensors + config.json with the model arguments, read back from a local folder."""
    model = randomize(
        timm.create_model(
            "lion_s_deit_tiny_patch16_224",
            img_size=IMG,
            patch_size=PATCH,
            num_classes=CLASSES,
            depth=DEPTH,
            global_pool="token",
        )
    )
    model.set_input_size(2 * IMG)  # the training grid stays, and travels with the folder
    save_pretrained(model, tmp_path / "hub")
    config = json.loads((tmp_path / "hub" / "config.json").read_text())
    assert config["architecture"] == "lion_s_deit_tiny_patch16_224"
    assert (tmp_path / "hub" / "model.safetensors").is_file()
    loaded = from_pretrained(tmp_path / "hub").eval()
    assert loaded.global_pool == "token" and len(loaded.blocks) == DEPTH
    assert loaded.pos_grid == model.pos_grid == (IMG // PATCH,) * 2 and loaded.pos_unit == "image"
    x = images(size=2 * IMG)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)


def test_eval_command_takes_external_weights(tmp_path, capsys, cli_error):
    """``classify eval --pretrained FILE --model NAME`` converts, says what it loaded and evaluates; a file of another
    model is refused in one line naming the keys."""
    import numpy as np
    from PIL import Image

    from lightvision.cli import main

    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (tmp_path / "val" / c).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(tmp_path / "val" / c / f"{i}.png")
    ref = randomize(timm.create_model("deit_tiny_patch16_224", img_size=32, num_classes=2))
    torch.save({"model": ref.state_dict()}, tmp_path / "deit.pth")
    args = [
        "classify",
        "eval",
        "--pretrained",
        str(tmp_path / "deit.pth"),
        "--data",
        str(tmp_path / "val"),
        "--img-size",
        "32",
        "--device",
        "cpu",
        "--num-workers",
        "0",
        "--out",
        str(tmp_path / "eval"),
    ]
    assert main([*args, "--model", "softmax_deit_tiny_patch16_224"]) == 0
    assert f"loaded {tmp_path / 'deit.pth'} (deit layout" in capsys.readouterr().out
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert report["loaded"]["layout"] == "deit" and report["results"][0]["images"] == 6
    message = cli_error([*args, "--model", "softmax_deit_small_patch16_224"])
    assert re.search(
        r"deit.pth holds another model: shape mismatches "
        r"\['blocks.0.attn.proj.bias: checkpoint \(192,\), model \(384,\)",
        message,
    )


def test_init_from_copies_what_another_attention_shares(tmp_path):
    """A trained softmax DeiT into LION-S and LightNet DeiTs: every tensor of the same name and shape is copied (the
    position embedding resampled where the model keeps one), the rest is reported."""
    from lightvision.classify.convert import init_from

    kw = dict(img_size=IMG, patch_size=PATCH, num_classes=CLASSES, embed_dim=DIM, depth=DEPTH, num_heads=HEADS)
    source = randomize(timm.create_model("softmax_deit_tiny_patch16_224", **kw))
    save_file(source.state_dict(), tmp_path / "softmax.safetensors")
    lion = timm.create_model("lion_s_deit_tiny_patch16_224", **kw)
    report = init_from(lion, tmp_path / "softmax.safetensors")
    assert report["skipped"] == [
        "blocks.0.attn.gate.bias",
        "blocks.0.attn.gate.weight",
        "blocks.1.attn.gate.bias",
        "blocks.1.attn.gate.weight",
    ]
    assert report["unused"] == ["pos_embed"]  # LION-S has no absolute position embedding
    lightnet = timm.create_model("lightnet_deit_tiny_patch16_224", **kw)
    report = init_from(lightnet, tmp_path / "softmax.safetensors")
    assert {k for k in report["skipped"] if k.startswith("blocks.0.")} == {
        "blocks.0.attn.gate.0.weight",
        "blocks.0.attn.gate.1.weight",
        "blocks.0.attn.norm.weight",
        "blocks.0.mlp.w12.weight",
        "blocks.0.mlp.w3.weight",
    }  # LightNet's own: output gate, norm, GLU
    assert "blocks.0.mlp.fc1.weight" in report["unused"]
    lit = timm.create_model("lion_lit_deit_tiny_patch16_224", **{**kw, "img_size": 2 * IMG})
    report = init_from(lit, tmp_path / "softmax.safetensors")
    assert report["skipped"] == [] and lit.pos_embed.shape[1] == 1 + (2 * IMG // PATCH) ** 2  # resampled
    for model in (lion, lightnet, lit):
        for key in ("blocks.0.attn.qkv.weight", "head.weight", "patch_embed.proj.weight", "cls_token"):
            assert torch.equal(model.state_dict()[key], source.state_dict()[key])


def test_train_recipe_starts_from_a_checkpoint(tmp_path):
    """``model.init_from`` in a classify recipe: the run records what it copied (results and init_from.json)."""
    import numpy as np
    from PIL import Image

    from lightvision.classify.train import load_recipe, train

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in ("a", "b"):
            folder = tmp_path / "data" / split / c
            folder.mkdir(parents=True)
            for i in range(2):
                Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    args = dict(patch_size=4, embed_dim=16, depth=1, num_heads=2)
    source = timm.create_model("softmax_deit_tiny_patch16_224", img_size=16, num_classes=2, **args)
    save_pretrained(source, tmp_path / "softmax")
    cfg = load_recipe(
        None,
        [
            "model.name=lion_s_deit_tiny_patch16_224",
            "data.image_size=16",
            "model.drop_path=0.0",
            "model.args={patch_size: 4, embed_dim: 16, depth: 1, num_heads: 2}",
            f"model.init_from={tmp_path / 'softmax'}",
            f"data.root={tmp_path / 'data'}",
            "data.num_workers=0",
            "aug.repeated_aug=1",
            "aug.mixup=0",
            "aug.cutmix=0",
            "train.batch_size=2",
            "train.max_steps=1",
            "train.mixed_precision='no'",
            "train.ema_decay=null",
            f"run.dir={tmp_path / 'run'}",
        ],
    )
    results = train(cfg, device="cpu")
    record = json.loads((tmp_path / "run" / "init_from.json").read_text())
    assert results["init_from"]["copied"] == len(record["copied"]) > 10
    assert record["skipped"] == ["blocks.0.attn.gate.bias", "blocks.0.attn.gate.weight"]
    # the run folder itself is a starting point (without EMA: its raw weights): everything fits the same model
    from lightvision.classify.convert import init_from

    same = timm.create_model("lion_s_deit_tiny_patch16_224", img_size=16, num_classes=2, **args)
    assert init_from(same, tmp_path / "run")["skipped"] == []
