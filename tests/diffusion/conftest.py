"""``vae_dir``: a tiny autoencoder for the latent paths (the root conftest keeps every test off the hub)."""

import pytest
import torch


@pytest.fixture(scope="module")
def vae_dir(tmp_path_factory):
    """A tiny random AutoencoderKL saved as a diffusers folder: 4 latent channels, downsampling 2, scaling 0.5."""
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(
        block_out_channels=(8, 16),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        latent_channels=4,
        layers_per_block=1,
        norm_num_groups=4,
        sample_size=16,
        scaling_factor=0.5,
    )
    path = tmp_path_factory.mktemp("vae") / "tiny-vae"
    vae.save_pretrained(path)
    return path
