"""Diffusion training data: cached latent moments, pixel-space image folders, and the bundled digits.

Cached latents (``lightvision diffusion extract-latents``): for every image of an ImageFolder the autoencoder's
posterior moments of the image and of its horizontal flip, stored in safetensors shards

    shard_NNNNN.safetensors: mean, mean_flip [n, c, h, w] float16; logvar, logvar_flip (stochastic encoders); labels [n]
    meta.json: count, classes, image_size, latent shape, codec description, shard list

so every training step samples a fresh z = scaling_factor * (mean + exp(logvar / 2) * eps) of a randomly flipped
image (:func:`draw_latents`), exactly as encoding on the fly would, at a fraction of the cost.
Pixel datasets return images in [-1, 1] on the 8-bit grid (what the discretised decoder of the VLB assumes).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from lightvision.diffusion.autoencoder import Codec
from lightvision.engine.batch_random import batch_random
from lightvision.engine.data import SafeImageFolder, loader_workers, unpack_hint


def image_transform(image_size: int, flip: bool):
    """Resize the short side to ``image_size`` (bicubic), center-crop, optional random flip; [3, S, S] in [-1, 1]."""
    from torchvision import transforms as T

    steps = [T.Resize(image_size, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(image_size)]
    if flip:
        steps.append(T.RandomHorizontalFlip())
    return T.Compose(steps + [T.ToTensor(), T.Normalize([0.5] * 3, [0.5] * 3)])


def image_folder(root: str | Path, image_size: int, flip: bool):
    """RGB images of ``root/<class>/`` through :func:`image_transform`; items ([3, S, S], label). Read by the shared
    :class:`~lightvision.engine.data.SafeImageFolder`: an unreadable image is skipped with a warning naming it."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {str(root)!r} does not exist{unpack_hint(root)}")
    return SafeImageFolder(root, transform=image_transform(image_size, flip))


@torch.no_grad()
def extract_latents(
    image_dir: str | Path,
    out_dir: str | Path,
    codec: Codec,
    image_size: int,
    *,
    batch_size: int = 64,
    shard_size: int = 8192,
    num_workers: int = 0,
    progress: bool = True,
) -> dict:
    """Encode every image of ``image_dir`` (ImageFolder) and its flip; write shards + meta.json to ``out_dir``.
    Returns the meta dict."""
    from safetensors.torch import save_file
    from tqdm.auto import tqdm

    if codec.vae is None:
        raise ValueError(
            "extract-latents needs an autoencoder (kind 'kl' or 'tiny'); pixel space trains on images directly"
        )
    dataset = image_folder(image_dir, image_size, flip=False)
    if len(dataset) == 0:
        raise ValueError(f"no images found under {str(image_dir)!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=loader_workers(num_workers))
    buffer: dict[str, list[torch.Tensor]] = {}
    shards: list[str] = []

    def flush() -> None:
        if buffer:
            name = f"shard_{len(shards):05d}.safetensors"
            save_file({k: torch.cat(v).contiguous() for k, v in buffer.items()}, str(out / name))
            shards.append(name)
            buffer.clear()

    latent_shape = None
    for images, labels in tqdm(loader, desc="extracting latents", disable=not progress):
        parts = {"labels": labels.long()}
        for suffix, x in (("", images), ("_flip", images.flip(-1))):
            mean, logvar = codec.moments(x)
            parts["mean" + suffix] = mean.half().cpu()
            if logvar is not None:
                parts["logvar" + suffix] = logvar.half().cpu()
        latent_shape = list(parts["mean"].shape[1:])
        for k, v in parts.items():
            buffer.setdefault(k, []).append(v)
        if sum(len(v) for v in buffer["labels"]) >= shard_size:
            flush()
    flush()
    meta = {
        "count": len(dataset),
        "skipped_images": dataset.skipped_images(),
        "classes": dataset.classes,
        "image_size": image_size,
        "latent_shape": latent_shape,
        "codec": codec.describe(),
        "shards": shards,
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    return meta


class LatentDataset(Dataset):
    """Items (moments [2, 2, c, h, w] float32, label): [image, flipped image] x [mean, logvar] (logvar = -inf for a
    deterministic encoder). Sampling happens in :func:`draw_latents` inside the training step, where the Trainer has
    seeded the generators, so the drawn z are reproducible and exactly resumable. Shards are opened lazily
    (memory-mapped), so the cache may be larger than memory."""

    def __init__(self, root: str | Path):
        from safetensors import safe_open

        self.root = Path(root)
        meta_path = self.root / "meta.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"{str(meta_path)!r} not found: run `lightvision diffusion extract-latents` first")
        self.meta = json.loads(meta_path.read_text())
        self.scaling_factor = float(self.meta["codec"]["scaling_factor"])
        self.classes = self.meta["classes"]
        self.index: list[tuple[int, int]] = []
        self.labels: list[int] = []
        for s, name in enumerate(self.meta["shards"]):
            with safe_open(str(self.root / name), framework="pt") as f:
                labels = f.get_tensor("labels").tolist()
            self.index += [(s, r) for r in range(len(labels))]
            self.labels += labels
        self._handles: dict[int, object] = {}

    def __len__(self) -> int:
        return len(self.index)

    def _shard(self, s: int):
        if s not in self._handles:
            from safetensors import safe_open

            self._handles[s] = safe_open(str(self.root / self.meta["shards"][s]), framework="pt")
        return self._handles[s]

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_handles"] = {}
        return state

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        s, r = self.index[i]
        f = self._shard(s)
        views = []
        for suffix in ("", "_flip"):
            mean = f.get_slice("mean" + suffix)[r].float()
            has_logvar = "logvar" + suffix in f.keys()
            logvar = f.get_slice("logvar" + suffix)[r].float() if has_logvar else torch.full_like(mean, float("-inf"))
            views.append(torch.stack([mean, logvar]))
        return torch.stack(views), self.labels[i]


def draw_latents(moments: torch.Tensor, scaling_factor: float) -> torch.Tensor:
    """z [B, c, h, w] = scaling_factor * (mean + exp(logvar / 2) * eps) of the image or its flip (p = 1/2 each),
    from moments [B, 2, 2, c, h, w] of :class:`LatentDataset`. Flip and eps come from the engine's
    :func:`~lightvision.engine.batch_random.batch_random` (inside a Trainer step: the same for any number of
    processes at a fixed global batch; elsewhere: torch's default generators)."""
    draws = batch_random()
    flip = draws.rand(moments.shape[0], device=moments.device) < 0.5
    mean, logvar = torch.where(flip.view(-1, 1, 1, 1, 1), moments[:, 1], moments[:, 0]).unbind(1)
    return scaling_factor * (mean + torch.exp(0.5 * logvar) * draws.randn_like(mean))


class DigitsPixels(Dataset):
    """scikit-learn's digits (:class:`~lightvision.engine.digits.DigitsDataset`'s fixed split, "train" 1437 / "val"
    360) as 1-channel images [1, S, S] in [-1, 1], bilinearly upsampled from 8x8 and rounded to the 8-bit grid."""

    def __init__(self, split: str, image_size: int = 16):
        from lightvision.engine.digits import DIGITS_MEAN, DIGITS_STD, DigitsDataset

        self.base = DigitsDataset(split, image_size, in_chans=1, train=False)
        self.mean, self.std = DIGITS_MEAN[0], DIGITS_STD[0]
        self.classes = self.base.classes

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img, label = self.base[i]
        pixels = torch.round((img * self.std + self.mean).clamp(0, 1) * 255.0)
        return pixels / 127.5 - 1.0, label


def build_dataset(data: dict, split: str = "train") -> Dataset:
    """Dataset from a recipe's ``data`` block: ``source`` "latents" (``root``: extract-latents output),
    "imagefolder" (``root``/``split`` folder, ``image_size``; pixel space; training images randomly flipped unless
    ``flip`` is false), or "digits" (``image_size``)."""
    source = data.get("source")
    if source in ("latents", "imagefolder") and data.get("root") is None:
        what = "the extract-latents output" if source == "latents" else "a folder with train/ and val/ image folders"
        raise ValueError(
            f"data.root is not set: pass data.root=PATH ({what}), or run `lightvision diffusion train` "
            "without --config for the built-in digits default"
        )
    if source == "latents":
        return LatentDataset(data["root"])
    if source == "imagefolder":
        flip = split == "train" and bool(data.get("flip", True))
        return image_folder(Path(data["root"]) / data.get(f"{split}_split", split), int(data["image_size"]), flip=flip)
    if source == "digits":
        return DigitsPixels("train" if split == "train" else "val", int(data.get("image_size", 16)))
    raise ValueError(f"unknown data.source {source!r}: use 'latents', 'imagefolder' or 'digits'")
