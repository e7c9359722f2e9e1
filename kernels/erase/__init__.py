"""Normalisation with random erasing of a uint8 batch in one pass: every image's pixels normalised per channel, its
erasing boxes filled with the noise (given, or drawn in the program from a seed per image), optionally mixed with the
reversed batch (Mixup / CutMix) in the same pass."""

from .op import normalize_erase, normalize_erase_reference

__all__ = ["normalize_erase", "normalize_erase_reference"]
