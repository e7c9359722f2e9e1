"""scikit-learn's bundled 8x8 handwritten digits (1797 images, 10 classes, no download) as a small image set shared by
the classifiers' and the diffusion models' built-in jobs, with the per-channel statistics it is normalised with."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

__all__ = ["DIGITS_MEAN", "DIGITS_STD", "DigitsDataset"]

DIGITS_MEAN = (0.3,)
DIGITS_STD = (0.4,)


class DigitsDataset(Dataset):
    """scikit-learn's 8x8 digits, upsampled to ``img_size`` (bilinear), normalised; no download.

    split: "train" (1437 images) or "val" (360), a fixed stratified split. Items: ([in_chans, S, S], label).
    Training adds a random shift of up to one source pixel, so the model does not memorise positions.
    """

    def __init__(self, split: str, img_size: int, in_chans: int = 1, train: bool | None = None) -> None:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        if split not in ("train", "val"):
            raise ValueError(f"digits split must be 'train' or 'val', got {split!r}")
        digits = load_digits()
        images = torch.tensor(digits.images, dtype=torch.float32) / 16.0  # [1797, 8, 8] in [0, 1]
        labels = torch.tensor(digits.target, dtype=torch.long)
        idx_train, idx_val = train_test_split(range(len(labels)), test_size=0.2, random_state=0, stratify=digits.target)
        idx = torch.tensor(idx_train if split == "train" else idx_val)
        self.images, self.labels = images[idx], labels[idx]
        self.img_size, self.in_chans = img_size, in_chans
        self.train = split == "train" if train is None else train
        self.classes = [str(i) for i in range(10)]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        img = self.images[index][None, None]  # [1, 1, 8, 8]
        size = self.img_size
        if self.train:  # random zoom in [1, 1.5] and crop: scale jitter, like RandomResizedCrop
            big = int(torch.randint(size, size + size // 2 + 1, ()).item())
            img = F.interpolate(img, size=(big, big), mode="bilinear", align_corners=False)
            top, left = torch.randint(0, big - size + 1, (2,)).tolist()
            img = img[..., top : top + size, left : left + size]
        else:
            img = F.interpolate(img, size=(size, size), mode="bilinear", align_corners=False)
        img = img[0]
        img = (img - DIGITS_MEAN[0]) / DIGITS_STD[0]
        return img.expand(self.in_chans, -1, -1).contiguous(), int(self.labels[index])
