"""Image <-> diffusion space: a diffusers AutoencoderKL / AutoencoderTiny, or pixel space (no autoencoder).

Every codec maps images x [B, 3|C, H, W] in [-1, 1] to moments of the latent posterior and decodes scaled latents:

    moments(x) -> (mean, logvar) [B, c, H/f, W/f], unscaled; logvar is None for deterministic encoders
    z = scaling_factor * (mean + exp(logvar / 2) * eps)             (what the diffusion model sees)
    decode(z) -> x_hat [B, 3|C, H, W] in [-1, 1]

``scaling_factor`` comes from the autoencoder's config (0.18215 for stabilityai/sd-vae-ft-ema). Pixel space is the
identity with f = 1, scaling 1 and no noise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

DEFAULT_VAE = "stabilityai/sd-vae-ft-ema"
KINDS = ("kl", "tiny", "pixel")


@dataclass
class Codec:
    """An autoencoder (or none) with its latent geometry: ``channels`` c, ``downsample`` f, ``scaling_factor``."""

    kind: str
    channels: int
    downsample: int
    scaling_factor: float
    vae: torch.nn.Module | None = None
    source: str | None = None

    def moments(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Posterior moments (mean, logvar) of images x in [-1, 1]; logvar None when the encoder is deterministic."""
        if self.vae is None:
            return x, None
        x = x.to(device=self.vae.device, dtype=self.vae.dtype)
        if self.kind == "tiny":
            return self.vae.encode(x).latents.float(), None
        dist = self.vae.encode(x).latent_dist
        return dist.mean.float(), dist.logvar.float()

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Images in [-1, 1] (clamped) from scaled latents z [B, c, h, w]."""
        if self.vae is None:
            return z.clamp(-1.0, 1.0)
        z = (z / self.scaling_factor).to(device=self.vae.device, dtype=self.vae.dtype)
        return self.vae.decode(z).sample.float().clamp(-1.0, 1.0)

    def latent_size(self, image_size: int) -> int:
        """Latent side for an image side (must divide exactly)."""
        if image_size % self.downsample:
            raise ValueError(
                f"image size {image_size} is not divisible by the autoencoder's downsampling {self.downsample}"
            )
        return image_size // self.downsample

    def describe(self) -> dict:
        """JSON-able record of this codec (stored with latents and runs)."""
        return {
            "kind": self.kind,
            "source": self.source,
            "channels": self.channels,
            "downsample": self.downsample,
            "scaling_factor": self.scaling_factor,
        }


def load_codec(
    kind: str = "kl",
    path: str | None = DEFAULT_VAE,
    *,
    channels: int = 3,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Codec:
    """Load a codec: ``kind`` "kl" (AutoencoderKL) or "tiny" (AutoencoderTiny) from ``path`` (local folder or hub id),
    or "pixel" (``channels`` image channels, no autoencoder). A missing local folder, or a hub id that is not cached
    while offline, raises FileNotFoundError naming it."""
    if kind not in KINDS:
        raise ValueError(f"unknown autoencoder kind {kind!r}; choose from {KINDS}")
    if kind == "pixel":
        return Codec("pixel", channels, 1, 1.0)
    if not path:
        raise ValueError(f"autoencoder kind {kind!r} needs a path (local folder or hub id, e.g. {DEFAULT_VAE})")
    from diffusers import AutoencoderKL, AutoencoderTiny

    looks_local = path.startswith((".", "/", "~")) or os.path.exists(os.path.expanduser(path)) or path.count("/") != 1
    if looks_local and not os.path.isdir(os.path.expanduser(path)):
        raise FileNotFoundError(f"autoencoder folder {path!r} does not exist")
    cls = AutoencoderTiny if kind == "tiny" else AutoencoderKL
    try:
        vae = cls.from_pretrained(os.path.expanduser(path) if looks_local else path)
    except (OSError, ValueError) as err:
        raise FileNotFoundError(
            f"cannot load the {kind} autoencoder {path!r} (not a diffusers folder, or a hub id that "
            f"is not cached while offline; pass a local folder): {err}"
        ) from err
    vae = (
        (vae.to(device) if dtype == torch.float32 else vae.to(device=device, dtype=dtype)).eval().requires_grad_(False)
    )
    cfg = vae.config
    channels_out = cfg.latent_channels
    downsample = (
        2 ** (len(cfg.block_out_channels) - 1)
        if kind == "kl"
        else cfg.upsampling_scaling_factor ** (len(cfg.encoder_block_out_channels) - 1)
    )
    return Codec(kind, channels_out, downsample, float(cfg.scaling_factor), vae, path)
