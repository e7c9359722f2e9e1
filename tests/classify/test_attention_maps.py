"""Attention maps of trained classifiers: per-block effective attention, mean attention distance, the command."""

import json
import math

import numpy as np
import pytest
import timm
import torch
from PIL import Image

import lightvision  # noqa: F401  (registers the DeiT family)
from helpers import digits_classifier
from lightvision.analysis import attention_maps, effective_attention, mean_attention_distance


def test_mean_attention_distance_by_loops():
    torch.manual_seed(0)
    grid, prefix = (3, 4), 1
    a = torch.randn(2, 3, 13, 13, dtype=torch.float64)
    got = mean_attention_distance(a, grid, prefix)
    want = torch.zeros(2, 3, dtype=torch.float64)
    coords = [(r, c) for r in range(3) for c in range(4)]
    for b in range(2):
        for h in range(3):
            total = 0.0
            for i, (ri, ci) in enumerate(coords):
                w = a[b, h, prefix + i, prefix:].abs()
                w = w / w.sum()
                total += sum(float(w[j]) * math.dist((ri, ci), (rj, cj)) for j, (rj, cj) in enumerate(coords))
            want[b, h] = total / len(coords)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("attention", ["softmax", "lightnet", "lion_s", "normalized"])
def test_maps_are_each_blocks_effective_attention(attention):
    """One matrix per block; the first equals the effective attention of the first block's attention input."""
    torch.manual_seed(0)
    model = timm.create_model(
        f"{attention}_deit_tiny_patch16_224",
        img_size=16,
        patch_size=4,
        embed_dim=32,
        depth=2,
        num_heads=2,
        num_classes=3,
    ).eval()
    x = torch.randn(1, 3, 16, 24)
    maps = attention_maps(model, x)
    assert len(maps) == 2 and all(a.shape == (1, 2, 1 + 4 * 6, 1 + 4 * 6) for a in maps)
    with torch.no_grad():
        tokens, grid = model.embed(x)
        scale = model.position_scale(grid)  # a 4 x 6 grid against the 4 x 4 training grid
        first = effective_attention(model.blocks[0].attn, model.blocks[0].norm1(tokens), grid, 1, scale)
    torch.testing.assert_close(maps[0], first)


def test_attention_maps_command(tmp_path, capsys, cli_error):
    from lightvision.cli import main

    run = digits_classifier(tmp_path / "run")
    image = tmp_path / "digit.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 20), dtype=np.uint8)).save(image)
    out = tmp_path / "maps"
    args = ["classify", "attention-maps", "--checkpoint", run, "--image", str(image), "--out", str(out)]
    assert main([*args, "--img-size", "16", "24", "--query", "1,2"]) == 0
    report = json.loads((out / "attention_maps.json").read_text())
    depth, heads = len(report["sizes"]["16"]["mean_distance"]), len(report["sizes"]["16"]["mean_distance"][0])
    assert depth >= 1 and heads >= 1
    for size, grid in (("16", 4), ("24", 6)):
        entry = report["sizes"][size]
        assert entry["grid"] == [grid, grid] and (out / entry["figure"]).is_file()
        assert all(0 <= d <= math.hypot(grid - 1, grid - 1) for row in entry["mean_distance"] for d in row)
    assert report["sizes"]["24"]["query"] == [1, 3] and (out / "mean_distance.png").is_file()
    assert "--query must be ROW,COL" in cli_error([*args, "--img-size", "16", "--query", "middle"])
    assert "outside the training grid" in cli_error([*args, "--img-size", "16", "--query", "9,0"])
    assert "not found" in cli_error(
        [*args[:-4], "--image", str(tmp_path / "none.png"), "--out", str(out), "--img-size", "16"]
    )
    fresh = tmp_path / "new" / "maps"
    assert "not found" in cli_error(
        [*args[:-4], "--image", str(tmp_path / "none.png"), "--out", str(fresh), "--img-size", "16"]
    )
    assert not (tmp_path / "new").exists()  # a failed run leaves no empty folders


def test_attention_maps_side_by_side(tmp_path, capsys, cli_error):
    """Several runs: each one's figures in its own folder, one comparison figure, every report in one JSON."""
    from lightvision.cli import main

    runs = [
        digits_classifier(tmp_path / "softmax", **{"model.name": "softmax_deit_tiny_patch16_224"}),
        digits_classifier(tmp_path / "lightnet"),
    ]
    image = tmp_path / "digit.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (20, 20), dtype=np.uint8)).save(image)
    out = tmp_path / "maps"
    args = ["classify", "attention-maps", "--checkpoint", *runs, "--image", str(image), "--img-size", "16", "24"]
    assert main([*args, "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["runs"] == ["softmax", "lightnet"]
    report = json.loads((out / "attention_maps.json").read_text())
    depth = len(report["runs"]["softmax"]["sizes"]["16"]["mean_distance"])
    assert report["layers"] == sorted({0, depth // 2, depth - 1}) and (out / "comparison.png").is_file()
    assert report["runs"]["softmax"]["model"].startswith("softmax_deit")
    assert report["runs"]["lightnet"]["model"].startswith("lightnet_deit")
    for run in ("softmax", "lightnet"):
        assert (out / run / "attention_maps_24px.png").is_file() and (out / run / "attention_maps.json").is_file()
    assert main([*args, "--out", str(tmp_path / "last"), "--layers", "-1"]) == 0
    assert json.loads((tmp_path / "last" / "attention_maps.json").read_text())["layers"] == [depth - 1]
    assert "out of range" in cli_error([*args, "--out", str(out), "--layers", str(depth)])
    assert "two or more" in cli_error([*args[:3], runs[0], *args[5:], "--out", str(out), "--layers", "0"])
