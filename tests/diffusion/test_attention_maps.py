"""``lightvision diffusion attention-maps`` on a tiny randomly initialised pixel-space DiT checkpoint."""

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from lightvision.analysis import attention_maps, mean_attention_distance
from lightvision.diffusion.default import DIGITS_OVERRIDES
from lightvision.diffusion.train import build_diffusion, build_model, load_recipe, model_config
from lightvision.engine.checkpoint import CheckpointManager


def _tiny_run(run_dir, attention):
    """A checkpoint of a 16 px, 1-channel, 10-class DiT with random weights (adaLN-Zero's zeros perturbed, so that
    t and y reach the attention inputs)."""
    cfg = load_recipe(None, [*DIGITS_OVERRIDES, f"model.name={attention}_dit_s_2",
                             "model.kwargs={depth: 2, hidden_size: 32, num_heads: 2}"])
    mcfg = model_config(cfg, 1, 16)
    torch.manual_seed(0)
    model = build_model(mcfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    CheckpointManager(run_dir).save(1, models={"model": model, "ema": model}, model_config=mcfg,
                                    train_state={"step": 1}, config=cfg)
    return model.eval(), cfg


@pytest.mark.parametrize("attention", ["normalized", "lightnet"])
def test_maps_at_chosen_timesteps(tmp_path, attention):
    """Figures and distances per timestep; the distances are those of the model's effective attention on
    x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps (eps from the seed) with the given label, and differ between
    timesteps."""
    from lightvision.cli import main

    model, cfg = _tiny_run(tmp_path / "run", attention)
    pixels = np.random.default_rng(0).integers(0, 256, (16, 16), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "digit.png")
    out = tmp_path / "maps"
    assert main(["diffusion", "attention-maps", "--checkpoint", str(tmp_path / "run"), "--image",
                 str(tmp_path / "digit.png"), "--timestep", "10", "900", "--label", "3", "--query", "1,2", "--seed",
                 "5", "--out", str(out)]) == 0
    report = json.loads((out / "attention_maps.json").read_text())
    assert report["grid"] == [8, 8] and report["query"] == [1, 2] and report["label"] == 3
    assert (out / "mean_distance.png").is_file()
    x0 = torch.from_numpy(pixels.astype(np.float32) / 127.5 - 1)[None, None]
    eps = torch.randn(x0.shape, generator=torch.Generator().manual_seed(5))
    abar = build_diffusion(cfg).alphas_cumprod
    for step in (10, 900):
        entry = report["timesteps"][str(step)]
        assert (out / entry["figure"]).is_file()
        xt = (abar[step].sqrt() * x0 + (1 - abar[step]).sqrt() * eps).float()
        maps = attention_maps(model, xt, torch.tensor([step]), torch.tensor([3]))
        want = [mean_attention_distance(a, (8, 8))[0].tolist() for a in maps]
        np.testing.assert_allclose(entry["mean_distance"], want, rtol=1e-4)
        assert all(0 <= d <= math.hypot(7, 7) for row in entry["mean_distance"] for d in row)
    assert not np.allclose(report["timesteps"]["10"]["mean_distance"], report["timesteps"]["900"]["mean_distance"])


def test_bad_timestep_label_and_query_are_one_line_errors(tmp_path, cli_error):
    _tiny_run(tmp_path / "run", "normalized")
    Image.fromarray(np.zeros((16, 16), dtype=np.uint8)).save(tmp_path / "digit.png")
    args = ["diffusion", "attention-maps", "--checkpoint", str(tmp_path / "run"), "--image",
            str(tmp_path / "digit.png"), "--out", str(tmp_path / "maps")]
    assert "outside the run's schedule: use 0 .. 999" in cli_error([*args, "--timestep", "1000"])
    assert "--label 10 is not a class of this model: use 0 .. 9" in cli_error([*args, "--timestep", "1", "--label",
                                                                               "10"])
    assert "lies outside the token grid 8x8" in cli_error([*args, "--timestep", "1", "--query", "8,0"])
    assert "--query must be ROW,COL" in cli_error([*args, "--timestep", "1", "--query", "centre"])
