"""The Example blocks in the docstrings of the ops and layers run and print what they show."""

import doctest
import importlib

import pytest
import torch

MODULES = [
    f"ops.{m}"
    for m in (
        "adaln",
        "lightnet",
        "lion",
        "md_lrpe",
        "md_tpe",
        "norm",
        "normalized",
        "recompute",
        "softmax",
        "two_scan",
    )
] + [f"layers.{m}" for m in ("attention", "mlp", "norm", "patch_embed", "position", "tpe")]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(f"lightvision.{name}")
    result = doctest.testmod(module, extraglobs={"torch": torch}, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"lightvision.{name} has no Example"
    assert result.failed == 0
