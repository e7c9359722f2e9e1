"""The Example blocks in the ops' docstrings run and print what they show."""

import doctest
import importlib

import pytest
import torch

MODULES = ["adaln", "lightnet", "lion", "md_lrpe", "md_tpe", "norm", "softmax", "two_scan"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(f"lightvision.ops.{name}")
    result = doctest.testmod(module, extraglobs={"torch": torch}, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"lightvision.ops.{name} has no Example"
    assert result.failed == 0
