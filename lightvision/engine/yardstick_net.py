"""The CIFAR-10 yardstick network and its weights file: the offline feature network of CIFAR-10 FID
(``lightvision.diffusion.features``), trained by ``lightvision classify train-yardstick``
(:mod:`lightvision.classify.yardstick`, where the network and its training are described).

:class:`YardstickNet` takes RGB in [0, 1] and normalises it inside with the CIFAR-10 channel statistics, so the weights
file alone (:func:`save_yardstick`, :func:`load_yardstick`) is a feature network. The packaged weights
(:func:`packaged_yardstick`) are ``lightvision/weights/cifar10_yardstick.safetensors``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = [
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "PACKAGED",
    "YardstickNet",
    "load_yardstick",
    "packaged_yardstick",
    "save_yardstick",
]

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
PACKAGED = Path(__file__).resolve().parents[1] / "weights" / "cifar10_yardstick.safetensors"


class ConvBN(nn.Sequential):
    """3x3 convolution (no bias), BatchNorm, GELU."""

    def __init__(self, cin: int, cout: int):
        super().__init__(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.GELU())


class Residual(nn.Module):
    """x + ConvBN(ConvBN(x))."""

    def __init__(self, channels: int):
        super().__init__()
        self.body = nn.Sequential(ConvBN(channels, channels), ConvBN(channels, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class YardstickNet(nn.Module):
    """ResNet-9-style CIFAR classifier (module docstring).

    Args:
        widths: channels of the stem and of the three stages.
        num_classes: classes of the head.
        residual: per stage, whether a residual pair follows its pooling.
        flip_average: in eval mode, average the features over the image and its mirror image.
    """

    def __init__(
        self,
        widths: tuple[int, int, int, int] | list[int] = (64, 128, 256, 512),
        num_classes: int = 10,
        residual: tuple[bool, bool, bool] | list[bool] = (True, False, True),
        flip_average: bool = False,
    ):
        super().__init__()
        w0, w1, w2, w3 = (int(w) for w in widths)
        if len(residual) != 3:
            raise ValueError(f"model.residual needs one flag per stage (3), got {list(residual)}")
        self.widths, self.num_classes, self.residual = [w0, w1, w2, w3], num_classes, [bool(r) for r in residual]
        self.flip_average = bool(flip_average)
        self.register_buffer("mean", torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(CIFAR10_STD).view(1, 3, 1, 1), persistent=False)
        self.stem = ConvBN(3, w0)
        self.stage1, self.stage2, self.stage3 = (
            nn.Sequential(ConvBN(cin, cout), nn.MaxPool2d(2), *([Residual(cout)] if res else []))
            for cin, cout, res in zip((w0, w1, w2), (w1, w2, w3), self.residual)
        )
        self.head = nn.Linear(w3, num_classes, bias=False)

    def _features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        spatial = self.stage2(self.stage1(self.stem((x - self.mean) / self.std)))
        return torch.amax(self.stage3(spatial), dim=(2, 3)), spatial

    def forward_features(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """x: RGB [B, 3, H, W] in [0, 1] -> {"pool": [B, w3], "spatial": [B, w2, H / 4, W / 4]}; the mean over x
        and its mirror image in eval mode with ``flip_average``."""
        if self.training or not self.flip_average:
            pool, spatial = self._features(x)
            return {"pool": pool, "spatial": spatial}
        pool, spatial = self._features(torch.cat([x, x.flip(-1)]))
        b = x.shape[0]
        return {"pool": 0.5 * (pool[:b] + pool[b:]), "spatial": 0.5 * (spatial[:b] + spatial[b:].flip(-1))}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits [B, num_classes] of RGB [B, 3, H, W] in [0, 1]."""
        return self.head(self.forward_features(x)["pool"]) * 0.125


def save_yardstick(model: YardstickNet, path: str | Path, meta: dict[str, Any] | None = None) -> Path:
    """Write the weights as safetensors with the architecture (and ``meta``) in the header: convolution and linear
    weights in float16 (18 MB at the default widths), BatchNorm parameters and statistics in float32."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {
        k: v.detach().to("cpu", torch.float16 if v.is_floating_point() and v.ndim > 1 else v.dtype).contiguous()
        for k, v in model.state_dict().items()
    }
    header = {
        "format": "lightvision-yardstick",
        "widths": json.dumps(model.widths),
        "residual": json.dumps(model.residual),
        "flip_average": json.dumps(model.flip_average),
        "num_classes": str(model.num_classes),
        **{k: json.dumps(v) for k, v in (meta or {}).items()},
    }
    save_file(tensors, str(path), metadata=header)
    return path


def load_yardstick(path: str | Path) -> tuple[YardstickNet, Path]:
    """A :class:`YardstickNet` (float32, eval mode) from a yardstick file or a folder holding ``yardstick.safetensors``;
    returns it with the file's path."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = Path(path)
    if path.is_dir():
        path = path / "yardstick.safetensors"
    if not path.is_file():
        raise FileNotFoundError(
            f"yardstick weights {str(path)!r} not found: train them with "
            "`lightvision classify train-yardstick --data ROOT --out DIR`"
        )
    with safe_open(str(path), "pt") as f:
        header = f.metadata() or {}
    if header.get("format") != "lightvision-yardstick":
        raise ValueError(
            f"{path} is not a yardstick file (no 'lightvision-yardstick' header): pass the "
            "yardstick.safetensors that `lightvision classify train-yardstick` wrote"
        )
    residual = json.loads(header.get("residual", "[true, false, true]"))
    flip_average = json.loads(header.get("flip_average", "false"))
    model = YardstickNet(json.loads(header["widths"]), int(header["num_classes"]), residual, flip_average)
    state = {k: v.float() if v.is_floating_point() else v for k, v in load_file(str(path)).items()}
    model.load_state_dict(state)
    return model.eval(), path


def packaged_yardstick() -> Path | None:
    """The CIFAR-10 yardstick weights shipped with the package, when present."""
    return PACKAGED if PACKAGED.is_file() else None
