"""Batched random-resized-crop resampling: every image's crop box resized to one size in one launch."""

from .op import PackedImages, image_sizes, resize, resized_crops, resized_crops_reference

__all__ = ["PackedImages", "image_sizes", "resize", "resized_crops", "resized_crops_reference"]
