"""Shared helpers for the ops tests: relative L2 error vs an fp64 reference (SPEC 2 tolerances)."""

import pytest
import torch

TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    assert a.shape == ref.shape, (a.shape, ref.shape)
    assert torch.isfinite(a).all()
    a, ref = a.detach().double(), ref.detach().double()
    return float((a - ref).norm() / ref.norm())


@pytest.fixture
def rel():
    return _rel
