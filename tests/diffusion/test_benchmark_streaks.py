"""The streak share (lightvision.diffusion.streaks) and the CIFAR-10 diffusion benchmark driver on tiny data."""

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from lightvision.diffusion.streaks import streak_share


def _independent_share(img: np.ndarray) -> float:
    """The module's definition by loops over channels (uint8 [H, W, C]): high-pass by the in-image 3x3 mean, then the
    row + column (two-way ANOVA) energy share."""
    x = img.astype(np.float64)
    h, w, c = x.shape
    explained = total = 0.0
    for ch in range(c):
        blur = np.empty((h, w))
        for i in range(h):
            for j in range(w):
                blur[i, j] = x[max(i - 1, 0) : i + 2, max(j - 1, 0) : j + 2, ch].mean()
        r = x[:, :, ch] - blur
        r = r - r.mean()
        explained += w * (r.mean(1) ** 2).sum() + h * (r.mean(0) ** 2).sum()
        total += (r**2).sum()
    return explained / total


def test_streak_share_definition_and_extremes():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (3, 9, 11, 3), dtype=np.uint8)
    np.testing.assert_allclose(streak_share(images), [_independent_share(i) for i in images], rtol=1e-12)
    # the same images as float [N, C, H, W] give the same shares
    np.testing.assert_allclose(
        streak_share(torch.from_numpy(images).permute(0, 3, 1, 2).float()), streak_share(images), rtol=1e-6
    )
    noise = streak_share(rng.integers(0, 256, (64, 32, 32, 3), dtype=np.uint8))
    rows = rng.normal(size=(64, 32, 1, 3)) + rng.normal(size=(64, 1, 32, 3))  # a pure plaid: rows + columns
    plaid = streak_share(np.clip(128 + 40 * rows, 0, 255).astype(np.uint8))
    assert 0.03 < noise.mean() < 0.07 and plaid.min() > 0.9
    with pytest.raises(ValueError, match="at least 3 x 3"):
        streak_share(np.zeros((1, 2, 8, 3), np.uint8))


def _cifar_like(root, per_class=3):
    rng = np.random.default_rng(1)
    for split in ("train", "test"):
        for label in ("a", "b"):
            folder = root / split / label
            folder.mkdir(parents=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / f"{i}.png")


def test_benchmark_runs_kinds_and_variants(tmp_path):
    """Three names (two kinds and a variant of a variants file) train, report bits/dim and the streak share of their
    samples next to the real images', and FID / precision / recall in a yardstick's features; the variant's overrides
    reach the model; an unknown name is reported."""
    from lightvision.diffusion import benchmark
    from lightvision.engine.yardstick_net import YardstickNet, save_yardstick

    _cifar_like(tmp_path / "data")
    variants = tmp_path / "variants.yaml"
    variants.write_text(
        "lightnet_pair_tpe:\n  attention: lightnet\n  about: a one-sided MD-TPE pair after the embedding\n"
        "  set: [model.args.tpe_placement=embed, 'model.args.tpe_kwargs={form: pair, combine: product}',\n"
        "        'model.args.attn_kwargs={lrpe: mixed}']\n"
    )
    torch.manual_seed(0)
    yardstick = save_yardstick(YardstickNet([8, 8, 16, 16], 2), tmp_path / "yardstick.safetensors")
    out = tmp_path / "out"
    tiny = ["model.args.depth=1", "model.args.hidden_size=32", "model.args.num_heads=2"]
    code = benchmark.main(
        [
            "softmax",
            "normalized",
            "lightnet_pair_tpe",
            "nope",
            "--data",
            str(tmp_path / "data"),
            "--out",
            str(out),
            "--work",
            str(tmp_path / "work"),
            "--variants",
            str(variants),
            "--tag",
            "tiny",
            "--feature-extractor",
            str(yardstick),
            "--steps",
            "2",
            "--batch-size",
            "4",
            "--bpd-images",
            "2",
            "--samples",
            "5",
            "--sample-steps",
            "2",
            "--sample-batch",
            "2",
            "--save-samples",
            "--set",
            "data.num_workers=0",
            "train.mixed_precision=no",
            "data.num_classes=2",
            *tiny,
        ]
    )
    assert code == 0
    report = json.loads((out / "diffusion_cifar10_tiny.json").read_text())
    assert report["real_streak_share"]["images"] == 5 and 0 < report["real_streak_share"]["mean"] < 1
    variant = report["results"]["lightnet_pair_tpe"]
    assert variant["model"] == "lightnet_dit_s_2" and variant["steps"] == 2
    assert (
        variant["model_config"]["tpe_placement"] == "embed" and variant["model_config"]["tpe_kwargs"]["form"] == "pair"
    )
    assert variant["model_config"]["attention_kwargs"] == {"lrpe": "mixed"}
    assert report["results"]["normalized"]["model"] == "normalized_dit_s_2"
    for name in ("softmax", "normalized", "lightnet_pair_tpe"):
        r = report["results"][name]
        assert r["streak_share"]["images"] == 5 and 0 < r["streak_share"]["mean"] < 1
        assert math.isfinite(r["test_bits_per_dim"]) and (out / r["grid"]).is_file()
        assert r["fid"] >= 0 and 0 <= r["precision"] <= 1 and 0 <= r["recall"] <= 1, r
        assert r["feature_space"].startswith("yardstick-")
    assert "unknown attention kind or variant 'nope'" in report["results"]["nope"]["error"]
    saved = np.load(out / "samples_lightnet_pair_tpe.npz")["arr_0"]
    assert saved.shape == (5, 32, 32, 3) and saved.dtype == np.uint8
    np.testing.assert_allclose(streak_share(saved).mean(), variant["streak_share"]["mean"], atol=1e-4)


def test_every_shipped_variant_builds_the_model_it_describes():
    """configs/variants/diffusion_cifar10.yaml: each entry names a kind and overrides that the recipe accepts and the
    model takes (built on the meta device)."""
    from pathlib import Path

    import yaml

    from lightvision.diffusion.dit import ATTENTION_KINDS
    from lightvision.diffusion.train import build_model, load_recipe, model_config
    from lightvision.tools.results import resolve_variant

    root = Path(__file__).parents[2] / "configs"
    path = root / "variants" / "diffusion_cifar10.yaml"
    names = yaml.safe_load(path.read_text())
    assert {"lightnet_earlier", "lightnet_paper"} <= set(names)
    for name, entry in names.items():
        kind, overrides = resolve_variant(name, path, ATTENTION_KINDS)
        assert entry["about"] and overrides
        cfg = load_recipe(root / "diffusion" / "cifar10.yaml", [f"model.name={kind}_dit_s_2", *overrides])
        with torch.device("meta"):
            model = build_model(model_config(cfg, 3, 32))
        assert model.config.attention == kind
    paper = load_recipe(
        root / "diffusion" / "cifar10.yaml",
        ["model.name=lightnet_dit_s_2", *resolve_variant("lightnet_paper", path, ATTENTION_KINDS)[1]],
    )
    with torch.device("meta"):
        model = build_model(model_config(paper, 3, 32))
    assert (model.config.pos_embed, model.tpe.form, model.blocks[0].attn.lrpe) == ("none", "one_sided", "global")


def test_ablation_variants_keep_the_parameters_and_place_the_tpe():
    """lightnet_s_head128: 3 heads of 128 at S/2 with exactly the parameters of the 6-head default (lightnet_b_head64:
    12 heads of 64 at B/2, likewise); lightnet_block_tpe_pair: a one-sided MD-TPE pair at the start of every block and
    none after the embedding."""
    from pathlib import Path

    from lightvision.diffusion import benchmark
    from lightvision.diffusion.dit import ATTENTION_KINDS
    from lightvision.diffusion.train import build_model, load_recipe, model_config

    root = Path(__file__).parents[2] / "configs"
    path = root / "variants" / "diffusion_cifar10.yaml"

    def build(name, size="s"):
        kind, overrides = benchmark.resolve_variant(name, path, ATTENTION_KINDS)
        cfg = load_recipe(root / "diffusion" / "cifar10.yaml", [f"model.name={kind}_dit_{size}_2", *overrides])
        with torch.device("meta"):
            return build_model(model_config(cfg, 3, 32))

    default, wide = build("lightnet"), build("lightnet_s_head128")
    assert (default.blocks[0].attn.num_heads, default.blocks[0].attn.head_dim) == (6, 64)
    assert (wide.blocks[0].attn.num_heads, wide.blocks[0].attn.head_dim) == (3, 128)
    assert wide.blocks[0].attn.gate[0].out_features == default.blocks[0].attn.gate[0].out_features == 64
    assert sum(p.numel() for p in wide.parameters()) == sum(p.numel() for p in default.parameters())
    base, narrow = build("lightnet", "b"), build("lightnet_b_head64", "b")
    heads = (base.blocks[0].attn.num_heads, narrow.blocks[0].attn.num_heads, narrow.blocks[0].attn.head_dim)
    assert heads == (6, 12, 64)
    assert narrow.blocks[0].attn.gate[0].out_features == base.blocks[0].attn.gate[0].out_features == 128
    assert sum(p.numel() for p in narrow.parameters()) == sum(p.numel() for p in base.parameters())
    block = build("lightnet_block_tpe_pair")
    assert block.tpe is None and all(b.tpe is not None and b.tpe.form == "pair" for b in block.blocks)
    assert default.tpe is not None and all(b.tpe is None for b in default.blocks)


def test_paper_recipe_trains_with_lightnets_optimiser(tmp_path):
    """configs/diffusion/cifar10_paper.yaml: AdamW at a constant lr 1e-4 from the first step, betas (0.9, 0.98),
    no warm-up and no gradient clipping (no grad_norm logged)."""
    from pathlib import Path

    from lightvision.diffusion.default import DIGITS_OVERRIDES
    from lightvision.diffusion.train import load_recipe, train

    recipe = Path(__file__).parents[2] / "configs" / "diffusion" / "cifar10_paper.yaml"
    keep = ("optim.", "sched.", "model.name")
    cfg = load_recipe(
        recipe,
        [
            *(o for o in DIGITS_OVERRIDES if not o.startswith(keep)),
            "model.args={depth: 1, hidden_size: 16, num_heads: 2}",
            f"run.dir={tmp_path / 'run'}",
            "train.max_steps=2",
            "train.log_every=1",
            "train.mixed_precision=no",
            "sample.every=100",
        ],
    )
    assert cfg["optim"] == {"lr": 1e-4, "weight_decay": 0.0, "betas": [0.9, 0.98], "clip_grad": None, "fused": None}
    assert cfg["sched"] == {"warmup_steps": 0}
    trainer = train(cfg, device="cpu")["trainer"]
    group = trainer.optimizer.param_groups[0]
    assert isinstance(trainer.optimizer.optimizer, torch.optim.AdamW) and group["betas"] == (0.9, 0.98)
    assert trainer.scheduler is None and trainer.clip_grad is None
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert [r["lr"] for r in steps] == [1e-4, 1e-4] and not any("grad_norm" in r for r in steps)


def test_recipe_refuses_bad_betas(tmp_path):
    from lightvision.diffusion.train import check_recipe, load_recipe

    for bad in ("[0.9]", "[0.9, 1.0]", "[0.9, true]"):
        with pytest.raises(ValueError, match=r"optim.betas must be two numbers in \[0, 1\)"):
            check_recipe(load_recipe(None, [f"optim.betas={bad}"]))


def test_benchmark_curves_are_exact_across_a_pause(tmp_path, monkeypatch):
    """--eval-every: FID / precision / recall and test bits/dim (split by ranges of t) at every N steps as the
    record's ``curve``; a run stopped by SIGTERM is reported as such, and --resume finishes it with the very curve of
    an uninterrupted run (same data order, noise and samples)."""
    import os
    import signal

    from lightvision.classify.yardstick import YardstickNet, save_yardstick
    from lightvision.diffusion import benchmark
    from lightvision.engine.trainer import Trainer

    _cifar_like(tmp_path / "data")
    torch.manual_seed(0)
    yardstick = save_yardstick(YardstickNet([8, 8, 16, 16], 2), tmp_path / "yardstick.safetensors")

    def run(out, *extra):
        args = ["softmax", "--data", str(tmp_path / "data"), "--out", str(out), "--work", str(out / "work")]
        args += ["--feature-extractor", str(yardstick), "--steps", "4", "--batch-size", "4", "--eval-every", "2"]
        args += ["--bpd-images", "3", "--bpd-buckets", "2", "--samples", "5", "--sample-steps", "2"]
        args += ["--sample-batch", "5", "--recipe", str(benchmark.CONFIGS / "diffusion" / "cifar10_paper.yaml")]
        args += ["--set", "data.num_workers=0", "train.mixed_precision=no", "data.num_classes=2"]
        args += ["model.args={depth: 1, hidden_size: 32, num_heads: 2}", "train.ckpt_every_steps=100", *extra]
        code = benchmark.main(args)
        return code, json.loads((out / "diffusion_cifar10.json").read_text())["results"]["softmax"]

    code, straight = run(tmp_path / "a")
    assert code == 0 and [c["step"] for c in straight["curve"]] == [2, 4]
    for point in straight["curve"]:
        assert {"fid", "precision", "recall", "test_bits_per_dim"} <= set(point)
        assert [b["t"] for b in point["test_bits_per_dim_t"]] == [[0, 500], [500, 1000]]
    assert straight["fid"] == round(straight["curve"][-1]["fid"], 4)
    assert straight["test_bits_per_dim"] == round(straight["curve"][-1]["test_bits_per_dim"], 4)
    assert straight["recipe"]["optim"]["betas"] == [0.9, 0.98] and straight["recipe"]["sched"]["warmup_steps"] == 0

    train_step = Trainer._train_step

    def stop_at_three(trainer, batches):  # a SIGTERM as step 3 begins: checkpoint after it, then stop
        if trainer.step + 1 == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return train_step(trainer, batches)

    monkeypatch.setattr(Trainer, "_train_step", stop_at_three)
    code, paused = run(tmp_path / "b")
    assert code == 0 and "stopped by SIGTERM at step 3; run again with --resume" in paused["error"]
    monkeypatch.setattr(Trainer, "_train_step", train_step)
    code, resumed = run(tmp_path / "b", "--resume")
    assert code == 0 and resumed["steps"] == 4 and len(resumed["curve"]) == 2
    for a, b in zip(straight["curve"], resumed["curve"]):
        assert b["fid"] == pytest.approx(a["fid"], rel=1e-6) and b["precision"] == a["precision"]
        assert b["test_bits_per_dim"] == pytest.approx(a["test_bits_per_dim"], rel=1e-6)
