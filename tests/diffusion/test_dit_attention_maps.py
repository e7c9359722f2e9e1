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


def _tiny_run(run_dir, attention, vae=None):
    """A checkpoint of a 16 px, 10-class DiT with random weights (adaLN-Zero's zeros perturbed, so that t and y reach
    the attention inputs): pixel space with 1 channel, or 3-channel images through the autoencoder folder ``vae``
    (8 x 8 x 4 latents)."""
    latent = [] if vae is None else ["data.channels=3", "autoencoder.kind=kl", f"autoencoder.path={vae}"]
    cfg = load_recipe(
        None,
        [
            *DIGITS_OVERRIDES,
            f"model.name={attention}_dit_s_2",
            "model.args={depth: 2, hidden_size: 32, num_heads: 2}",
            *latent,
        ],
    )
    mcfg = model_config(cfg, *((1, 16) if vae is None else (4, 8)))
    torch.manual_seed(0)
    model = build_model(mcfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    CheckpointManager(run_dir).save(
        1, models={"model": model, "ema": model}, model_config=mcfg, train_state={"step": 1}, config=cfg
    )
    return model.eval(), cfg


@pytest.mark.parametrize(
    "attention,latent",
    [("normalized", False), ("lightnet", False), ("normalized", True)],
    ids=["normalized-pixels", "lightnet-pixels", "normalized-latents"],
)
def test_maps_at_chosen_timesteps(tmp_path, attention, latent, request):
    """Figures and distances per timestep; the distances are those of the model's effective attention on
    x_t = sqrt(abar_t) z_0 + sqrt(1 - abar_t) eps (z_0 the pixels in [-1, 1] or the scaled latent mean, eps from the
    seed) with the given label, and differ between timesteps."""
    from lightvision.cli import main
    from lightvision.diffusion.train import build_codec

    model, cfg = _tiny_run(tmp_path / "run", attention, request.getfixturevalue("vae_dir") if latent else None)
    pixels = np.random.default_rng(0).integers(0, 256, (16, 16, 3 if latent else 1), dtype=np.uint8)
    Image.fromarray(pixels.squeeze(-1) if not latent else pixels).save(tmp_path / "image.png")
    out = tmp_path / "maps"
    assert (
        main(
            [
                "diffusion",
                "attention-maps",
                "--checkpoint",
                str(tmp_path / "run"),
                "--image",
                str(tmp_path / "image.png"),
                "--timestep",
                "10",
                "900",
                "--label",
                "3",
                "--query",
                "1,2",
                "--seed",
                "5",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads((out / "attention_maps.json").read_text())
    side = 4 if latent else 8
    assert report["grid"] == [side, side] and report["query"] == [1, 2] and report["label"] == 3
    assert (out / "mean_distance.png").is_file()
    x0 = torch.from_numpy(pixels.astype(np.float32) / 127.5 - 1).permute(2, 0, 1)[None]
    codec = build_codec(cfg)
    with torch.no_grad():
        z0 = codec.scaling_factor * codec.moments(x0)[0]
    eps = torch.randn(z0.shape, generator=torch.Generator().manual_seed(5))
    abar = build_diffusion(cfg).alphas_cumprod
    for step in (10, 900):
        entry = report["timesteps"][str(step)]
        assert (out / entry["figure"]).is_file()
        xt = (abar[step].sqrt() * z0 + (1 - abar[step]).sqrt() * eps).float()
        maps = attention_maps(model, xt, torch.tensor([step]), torch.tensor([3]))
        want = [mean_attention_distance(a, (side, side))[0].tolist() for a in maps]
        np.testing.assert_allclose(entry["mean_distance"], want, rtol=1e-4)
        assert all(0 <= d <= math.hypot(side - 1, side - 1) for row in entry["mean_distance"] for d in row)
    assert not np.allclose(report["timesteps"]["10"]["mean_distance"], report["timesteps"]["900"]["mean_distance"])


def test_bad_timestep_label_and_query_are_one_line_errors(tmp_path, cli_error):
    _tiny_run(tmp_path / "run", "normalized")
    Image.fromarray(np.zeros((16, 16), dtype=np.uint8)).save(tmp_path / "digit.png")
    args = [
        "diffusion",
        "attention-maps",
        "--checkpoint",
        str(tmp_path / "run"),
        "--image",
        str(tmp_path / "digit.png"),
        "--out",
        str(tmp_path / "maps"),
    ]
    assert "outside the run's schedule: use 0 .. 999" in cli_error([*args, "--timestep", "1000"])
    assert "--label 10 is not a class of this model: use 0 .. 9" in cli_error(
        [*args, "--timestep", "1", "--label", "10"]
    )
    assert "lies outside the token grid 8x8" in cli_error([*args, "--timestep", "1", "--query", "8,0"])
    assert "--query must be ROW,COL" in cli_error([*args, "--timestep", "1", "--query", "centre"])
