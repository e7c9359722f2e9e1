"""Feature networks of the sample-quality metrics: uint8 images [B, 3, H, W] -> named feature arrays.

Every network maps a batch to ``{"pool": [B, D], "spatial": [B, S], "logits": [B, K]}`` (``logits`` only where the
classes are ImageNet's, for IS) and has an ``id`` naming its weights, so cached statistics are never compared across
feature spaces.

* :class:`InceptionFeatures`: torch-fidelity's TF-compatible Inception-v3 (the ADM evaluator's network): ``pool`` =
  pool_3 [B, 2048] (FID, precision / recall), ``spatial`` = the first 7 channels of mixed_6/conv (the 1x1 branch of
  Mixed_6d, 17 x 17) flattened in (h, w, c) order [B, 2023] (sFID), ``logits`` = pool_3 @ W without bias [B, 1008] (IS).
* :class:`YardstickFeatures`: the CIFAR-10 yardstick (:mod:`lightvision.engine.yardstick_net`, one safetensors file):
  ``pool`` = its pooled last stage, ``spatial`` = the first 7 channels of its 8 x 8 stage (at 32 px) flattened.
* :class:`ClassifierFeatures`: a ``lightvision classify`` checkpoint: ``pool`` = pre-logit features only.

:func:`feature_network` picks one: an explicit classifier / yardstick, else Inception weights (given, or in torch's
hub cache), else for 32 x 32 images the packaged CIFAR-10 yardstick, else torch-fidelity's download; offline, that
ends in :class:`FeatureNetworkError` naming the options.
"""

from __future__ import annotations

from pathlib import Path

import torch

from lightvision.diffusion.fid import content_hash

INCEPTION_FILE = "weights-inception-2015-12-05-6726825d.pth"  # torch-fidelity's converted TF Inception weights
SPATIAL_CHANNELS = 7  # ADM: mixed_6/conv[..., :7]


class FeatureNetworkError(FileNotFoundError):
    """No usable feature network: the message is one line that says what to pass."""


def _flatten_spatial(x: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> the first ``SPATIAL_CHANNELS`` channels in (h, w, c) order, [B, H * W * 7] float64."""
    return x[:, :SPATIAL_CHANNELS].permute(0, 2, 3, 1).flatten(1).double().cpu()


def cached_inception_weights() -> Path | None:
    """torch-fidelity's Inception weights in torch's hub cache (where its download puts them), if present."""
    path = Path(torch.hub.get_dir()) / "checkpoints" / INCEPTION_FILE
    return path if path.is_file() else None


class InceptionFeatures:
    """torch-fidelity's Inception-v3 (299 px, TF1-compatible resize) with the ADM evaluator's three outputs.

    Args:
        weights: a local weights file (torch-fidelity's ``feature_extractor_weights_path``); None: torch's hub cache,
            else torch-fidelity's download (offline: :class:`FeatureNetworkError`).
        device: where the network runs.
    """

    def __init__(self, weights: str | Path | None, device: str | torch.device = "cpu"):
        from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

        if weights is not None and not Path(weights).is_file():
            raise FeatureNetworkError(
                f"Inception weights {str(weights)!r} not found: pass an existing file "
                f"({INCEPTION_FILE} from torch-fidelity's releases)"
            )
        weights = weights or cached_inception_weights()
        try:
            net = FeatureExtractorInceptionV3(
                "inception-v3-compat",
                ["2048", "logits_unbiased"],
                feature_extractor_weights_path=str(weights) if weights else None,
            )
        except OSError as err:  # urllib's URLError is an OSError: no network
            raise FeatureNetworkError(
                f"cannot download the Inception weights ({type(err).__name__}): pass --inception-weights FILE "
                f"(torch-fidelity's {INCEPTION_FILE}), or --feature-extractor RUN|YARDSTICK for a classifier's "
                "features"
            ) from None
        except Exception as err:  # pickle's errors for a file that is no torch file, torch's for other weights
            raise FeatureNetworkError(
                f"{weights} holds no Inception-v3 weights ({type(err).__name__}): pass torch-fidelity's "
                f"{INCEPTION_FILE} as --inception-weights"
            ) from None
        self.device = torch.device(device)
        self.net = net.to(self.device)
        self._spatial: list[torch.Tensor] = []
        self.net.Mixed_6d.branch1x1.register_forward_hook(lambda _m, _i, out: self._spatial.append(out))
        self.id = "inception-" + (content_hash([Path(weights)])[:16] if weights else "torch-fidelity")

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        self._spatial.clear()
        pool, logits = self.net(images.to(self.device))
        return {
            "pool": pool.double().cpu(),
            "spatial": _flatten_spatial(self._spatial.pop()),
            "logits": logits.double().cpu(),
        }


class YardstickFeatures:
    """The CIFAR-10 yardstick classifier (a safetensors file of ``lightvision classify train-yardstick``).

    Args:
        path: the ``.safetensors`` file, or the folder holding ``yardstick.safetensors``.
        device: where the network runs.
    """

    def __init__(self, path: str | Path, device: str | torch.device = "cpu"):
        from lightvision.engine.yardstick_net import load_yardstick

        self.model, self.path = load_yardstick(path)
        self.device = torch.device(device)
        self.model = self.model.to(self.device).eval()
        self.id = f"yardstick-{content_hash([self.path])[:16]}"

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        feats = self.model.forward_features(images.to(self.device).float() / 255.0)
        return {"pool": feats["pool"].double().cpu(), "spatial": _flatten_spatial(feats["spatial"])}


class ClassifierFeatures:
    """Pooled pre-logit features of a ``lightvision classify`` checkpoint (EMA weights when present).

    The model comes from :func:`lightvision.families.load_classifier_run`; uint8 images [B, 3, H, W] are resized to
    its ``img_size``, scaled to [0, 1], averaged to grey for a 1-channel model, and normalised as its training data
    was.
    """

    def __init__(self, checkpoint: str | Path, device: str | torch.device = "cpu"):
        from lightvision.families import load_classifier_run

        model, meta, (mean, std) = load_classifier_run(checkpoint)
        self.checkpoint = meta["checkpoint"]
        self.model = model.to(device).eval()
        self.device = torch.device(device)
        self.in_chans = model.patch_embed.proj.in_channels
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1).to(self.device)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1).to(self.device)
        self.size = tuple(model.img_size)
        weights = sorted(Path(self.checkpoint).glob("*.safetensors"))
        self.id = f"{meta['model']}-{content_hash(weights)[:16]}"

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        x = images.to(self.device).float() / 255.0
        if self.in_chans == 1:
            x = x.mean(1, keepdim=True)
        if tuple(x.shape[-2:]) != self.size:
            x = torch.nn.functional.interpolate(x, size=self.size, mode="bilinear", align_corners=False)
        x = (x - self.mean) / self.std
        pool = self.model.forward_head(self.model.forward_features(x), pre_logits=True).flatten(1)
        return {"pool": pool.double().cpu()}


def is_yardstick(path: str | Path) -> bool:
    """Whether ``path`` is a yardstick file (``.safetensors``) or a folder holding ``yardstick.safetensors``."""
    path = Path(path)
    return path.suffix == ".safetensors" or (path / "yardstick.safetensors").is_file()


def feature_network(
    *,
    feature_extractor: str | Path | None = None,
    inception_weights: str | Path | None = None,
    image_size: tuple[int, int] | None = None,
    device: str | torch.device = "cpu",
):
    """The feature network of an evaluation (see the module docstring for the order of choice).

    Args:
        feature_extractor: a yardstick file / folder, ``"yardstick"`` (the packaged one), or a
            ``lightvision classify`` run or checkpoint folder.
        inception_weights: torch-fidelity Inception weights file.
        image_size: (H, W) of the evaluated images: 32 x 32 falls back on the packaged CIFAR-10 yardstick when no
            Inception weights are at hand.
        device: where the network runs.
    Returns:
        An :class:`InceptionFeatures`, :class:`YardstickFeatures` or :class:`ClassifierFeatures`.
    """
    from lightvision.engine.yardstick_net import packaged_yardstick

    if feature_extractor == "yardstick":
        if packaged_yardstick() is None:
            raise FeatureNetworkError(
                "no packaged CIFAR-10 yardstick in this install: train one with `lightvision "
                "classify train-yardstick` and pass its yardstick.safetensors"
            )
        return YardstickFeatures(packaged_yardstick(), device)
    if feature_extractor:
        if not Path(feature_extractor).exists():
            raise FeatureNetworkError(
                f"feature extractor {str(feature_extractor)!r} does not exist: pass a yardstick "
                ".safetensors file or a `lightvision classify` run folder"
            )
        if is_yardstick(feature_extractor):
            return YardstickFeatures(feature_extractor, device)
        return ClassifierFeatures(feature_extractor, device)
    if inception_weights or cached_inception_weights():
        return InceptionFeatures(inception_weights, device)
    if image_size is not None and tuple(image_size) == (32, 32) and packaged_yardstick() is not None:
        return YardstickFeatures(packaged_yardstick(), device)
    return InceptionFeatures(None, device)
