"""Mixup / CutMix of a batch with its reverse in one pass: every image blended with, or given a box of, the image at
the mirrored place of the batch."""

from .op import mix_reversed, mix_reversed_reference

__all__ = ["mix_reversed", "mix_reversed_reference"]
