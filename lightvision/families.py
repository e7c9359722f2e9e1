"""What one model family takes from the other, so that the families never import each other: like the CLI and the
timm registration, this top-level module is a place that knows both. The diffusion metrics use a
``lightvision classify`` run as a feature network (:func:`load_classifier_run`)."""

from __future__ import annotations

from pathlib import Path

from torch import nn


def load_classifier_run(checkpoint: str | Path) -> tuple[nn.Module, dict, tuple[tuple[float, ...], tuple[float, ...]]]:
    """(model, meta {"checkpoint", "model", ...}, per-channel (mean, std) its inputs were normalised with) of a
    ``lightvision classify`` run or checkpoint folder, EMA weights when the run kept them
    (:func:`lightvision.classify.evaluate.load_classifier`, :func:`lightvision.classify.data.norm_stats`)."""
    from lightvision.classify.data import norm_stats
    from lightvision.classify.evaluate import load_classifier

    model, meta, config = load_classifier(checkpoint)
    return model, meta, norm_stats(config)
