"""One RandAugment layer on a uint8 batch, each image through its own op, in two launches (statistics, apply)."""

from .op import (
    COLOR,
    COPY,
    KINDS,
    MODES,
    SHARPNESS,
    TABLE,
    WARP,
    apply_table,
    augment_layer,
    augment_layer_reference,
    blend,
    image_stats,
    image_stats_reference,
    luma,
    smooth,
    warp,
)

__all__ = [
    "COLOR",
    "COPY",
    "KINDS",
    "MODES",
    "SHARPNESS",
    "TABLE",
    "WARP",
    "apply_table",
    "augment_layer",
    "augment_layer_reference",
    "blend",
    "image_stats",
    "image_stats_reference",
    "luma",
    "smooth",
    "warp",
]
