"""FID between a folder of samples and a reference: torch-fidelity Inception metrics, or any classifier's features.

Frechet distance between Gaussians fitted to features (Heusel et al.):

    FID = ||mu_1 - mu_2||^2 + tr(S_1) + tr(S_2) - 2 tr((S_1^{1/2} S_2 S_1^{1/2})^{1/2})

computed with symmetric eigen-decompositions (S_1^{1/2} S_2 S_1^{1/2} is symmetric PSD, so its trace square root is
the sum of the square roots of its eigenvalues; torch-fidelity's general eigvals of the 2048 x 2048 product takes
~20 s on a CPU, this ~1 s). Reference statistics are cached as ``.npz`` (mu, sigma) named by the content hash of the
reference files and of the feature extractor's weights (not by folder name), and such an ``.npz`` can be passed as
the reference. Two feature spaces:

* Inception: torch-fidelity's InceptionV3 (``inception_weights`` = its ``feature_extractor_weights_path`` for machines
  without internet); with a reference folder, IS and KID also come from ``torch_fidelity.calculate_metrics``.
* ``feature_extractor`` = a ``lightvision classify`` checkpoint (engine format): pooled pre-logit features, FID only.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
INCEPTION_LAYER = "2048"


def image_files(folder: str | Path) -> list[Path]:
    """Image files under ``folder`` (recursive, sorted); raises if it is missing or holds none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"image folder {str(folder)!r} does not exist")
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
    if not files:
        raise ValueError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) found under {str(folder)!r}")
    return files


def content_hash(paths: list[Path]) -> str:
    """sha256 over the sorted sha256 digests of the files' bytes: independent of names and order."""
    digests = sorted(hashlib.sha256(p.read_bytes()).hexdigest() for p in paths)
    return hashlib.sha256("".join(digests).encode()).hexdigest()[:24]


def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray) -> float:
    """FID of N(mu1, sigma1) and N(mu2, sigma2) (formula above), in float64."""
    mu1, mu2, sigma1, sigma2 = (np.asarray(a, dtype=np.float64) for a in (mu1, mu2, sigma1, sigma2))
    if mu1.shape != mu2.shape or sigma1.shape != sigma2.shape:
        raise ValueError(f"statistics of different feature sizes: {mu1.shape} vs {mu2.shape}")
    w, v = np.linalg.eigh((sigma1 + sigma1.T) / 2)
    root1 = (v * np.sqrt(np.clip(w, 0, None))) @ v.T
    inner = root1 @ sigma2 @ root1
    tr_sqrt = np.sqrt(np.clip(np.linalg.eigvalsh((inner + inner.T) / 2), 0, None)).sum()
    diff = mu1 - mu2
    return float(diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2.0 * tr_sqrt)


def statistics(features: np.ndarray) -> dict[str, np.ndarray]:
    """mu [D] and unbiased covariance sigma [D, D] of features [N, D] (float64)."""
    features = np.asarray(features, dtype=np.float64)
    if features.shape[0] < 2:
        raise ValueError("FID needs at least two images per set")
    return {"mu": features.mean(0), "sigma": np.cov(features, rowvar=False)}


def _load_stats(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        if "mu" not in f or "sigma" not in f:
            raise ValueError(f"{path} is not a statistics file (needs arrays 'mu' and 'sigma')")
        return {"mu": f["mu"], "sigma": f["sigma"]}


class ClassifierFeatures:
    """Pooled pre-logit features of a ``lightvision classify`` checkpoint (EMA weights when present).

    The model is rebuilt with :func:`lightvision.classify.deit.create_from_config` from the checkpoint's
    ``model_config``; uint8 images [B, 3, H, W] are resized to its ``img_size``, scaled to [0, 1], averaged to grey
    for a 1-channel model, and normalised with the recipe's ``data.mean`` / ``data.std`` (else the model's).
    """

    def __init__(self, checkpoint: str | Path, device: str | torch.device = "cpu"):
        from lightvision.classify.deit import create_from_config
        from lightvision.engine.checkpoint import CheckpointError, load_model_weights, read_checkpoint_config

        info = read_checkpoint_config(checkpoint)
        model_config, data = info["model_config"], (info.get("config") or {}).get("data", {})
        model = create_from_config(model_config)
        try:
            self.checkpoint = load_model_weights(checkpoint, model, which="ema")
        except CheckpointError:
            self.checkpoint = load_model_weights(checkpoint, model, which="model")
        self.model = model.to(device).eval()
        self.device = torch.device(device)
        cfg = model.pretrained_cfg or {}
        mean, std = data.get("mean") or cfg.get("mean", (0.5,)), data.get("std") or cfg.get("std", (0.5,))
        self.in_chans = int(model_config["in_chans"])
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1).to(self.device)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1).to(self.device)
        size = model_config["img_size"]
        self.size = tuple(size) if isinstance(size, (list, tuple)) else (int(size), int(size))
        self.id = f"{model_config['name']}-{content_hash(sorted(Path(self.checkpoint).glob('*.safetensors')))}"

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        x = images.to(self.device).float() / 255.0
        if self.in_chans == 1:
            x = x.mean(1, keepdim=True)
        if tuple(x.shape[-2:]) != self.size:
            x = torch.nn.functional.interpolate(x, size=self.size, mode="bilinear", align_corners=False)
        x = (x - self.mean) / self.std
        return self.model.forward_head(self.model.forward_features(x), pre_logits=True).flatten(1).float().cpu()


def folder_features(files: list[Path], extractor: Callable[[torch.Tensor], torch.Tensor], batch_size: int = 64) -> np.ndarray:
    """Features [N, D] of image files through ``extractor`` (uint8 [B, C, H, W] -> [B, D]); RGB, same size per batch."""
    from PIL import Image

    out = []
    for i in range(0, len(files), batch_size):
        arrays = [np.asarray(Image.open(p).convert("RGB")) for p in files[i:i + batch_size]]
        out.append(extractor(torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2)).numpy())
    return np.concatenate(out)


def reference_statistics(reference: str | Path, extractor: Callable[[torch.Tensor], torch.Tensor], cache_dir: str | Path | None,
                         batch_size: int = 64) -> dict[str, np.ndarray]:
    """Statistics of a reference folder (cached under ``cache_dir`` by content hash) or of an ``.npz`` file."""
    reference = Path(reference)
    if reference.is_file():
        return _load_stats(reference)
    files = image_files(reference)
    cache = Path(cache_dir) / f"ref-{content_hash(files)}-{extractor.id}.npz" if cache_dir else None
    if cache is not None and cache.is_file():
        return _load_stats(cache)
    stats = statistics(folder_features(files, extractor, batch_size))
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp.npz")
        np.savez(tmp, **stats)
        os.replace(tmp, cache)
    return stats


class InceptionFeatures:
    """torch-fidelity's InceptionV3 pool features [B, 2048] (its TF-compatible port) of uint8 images [B, 3, H, W].
    ``weights``: a local weights file (``feature_extractor_weights_path``); None lets torch-fidelity download them."""

    def __init__(self, weights: str | None, device: str | torch.device = "cpu"):
        from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

        if weights and not Path(weights).is_file():
            raise FileNotFoundError(f"Inception weights {weights!r} not found")
        self.device = torch.device(device)
        self.net = FeatureExtractorInceptionV3("inception-v3-compat", [INCEPTION_LAYER],
                                               feature_extractor_weights_path=weights).to(self.device)
        self.id = "inception-" + (content_hash([Path(weights)]) if weights else "torch-fidelity-default")

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images.to(self.device))[0].double().cpu()


def inception_score_and_kid(samples: Path, reference: Path, *, weights: str | None, weights_id: str, cache_dir: str | Path | None,
                            device: str, batch_size: int, kid_subset_size: int) -> dict:
    """IS (samples) and KID (samples vs reference folder) via ``torch_fidelity.calculate_metrics``; the reference
    features are cached by torch-fidelity under the content hash of its files and of the weights."""
    import torch_fidelity

    n, n_ref = len(image_files(samples)), image_files(reference)
    metrics = torch_fidelity.calculate_metrics(
        input1=str(samples), input2=str(reference), isc=True, kid=True, kid_subset_size=min(kid_subset_size, n, len(n_ref)),
        cuda=torch.device(device).type == "cuda", batch_size=batch_size, verbose=False, save_cpu_ram=True,
        feature_extractor_weights_path=weights, samples_find_deep=True, cache=cache_dir is not None,
        cache_root=str(cache_dir) if cache_dir else None, input2_cache_name=f"ref-{content_hash(n_ref)}-{weights_id}")
    names = {"inception_score_mean": "isc", "inception_score_std": "isc_std", "kernel_inception_distance_mean": "kid",
             "kernel_inception_distance_std": "kid_std"}
    return {names[k]: float(v) for k, v in metrics.items() if k in names}


def compute_fid(samples: str | Path, reference: str | Path, *, inception_weights: str | None = None,
                feature_extractor: str | None = None, cache_dir: str | Path | None = None, device: str = "cpu",
                batch_size: int = 64, isc_kid: bool = True, kid_subset_size: int = 1000) -> dict:
    """Metrics of the ``samples`` folder against ``reference`` (folder, or ``.npz`` statistics in the same space).

    ``fid`` always (our Frechet distance, reference statistics cached by content hash), in the space of
    ``feature_extractor`` (classifier checkpoint) or of torch-fidelity's Inception; with Inception and a reference
    folder also ``isc`` / ``kid`` (+ std) from torch-fidelity unless ``isc_kid=False``.
    """
    samples, reference = Path(samples), Path(reference)
    files = image_files(samples)
    if not reference.exists():
        raise FileNotFoundError(f"reference {str(reference)!r} does not exist (a folder of images or a .npz of mu/sigma)")
    extractor = ClassifierFeatures(feature_extractor, device) if feature_extractor else InceptionFeatures(inception_weights, device)
    ref = reference_statistics(reference, extractor, cache_dir, batch_size)
    mine = statistics(folder_features(files, extractor, batch_size))
    out = {"fid": frechet_distance(mine["mu"], mine["sigma"], ref["mu"], ref["sigma"]), "feature_space": extractor.id,
           "num_samples": len(files)}
    if not feature_extractor and isc_kid and reference.is_dir():
        out.update(inception_score_and_kid(samples, reference, weights=inception_weights, weights_id=extractor.id,
                                           cache_dir=cache_dir, device=device, batch_size=batch_size,
                                           kid_subset_size=kid_subset_size))
    return out
