"""The comparison helper of the whole suite: relative L2 error against a reference (docs/spec.md 2).

Tests import it as ``from helpers import TOL, assert_close, rel`` (pytest puts ``tests/`` on ``sys.path``
through the root conftest)."""

import torch

# Relative L2 error allowed against an fp64 reference, per dtype of the tested output (docs/spec.md 2).
TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    """||a - ref|| / ||ref|| in fp64, on the CPU.

    Args:
        a: the tested tensor; must be finite (a NaN marks an output element a kernel never wrote).
        ref: the reference, same shape as ``a``, any dtype or device.

    Returns:
        The relative error as a Python float.
    """
    assert a.shape == ref.shape, (a.shape, ref.shape)
    assert torch.isfinite(a).all(), "non-finite element: an output was not written"
    a, ref = a.detach().double().cpu(), ref.detach().double().cpu()
    return float((a - ref).norm() / ref.norm())


def assert_close(a: torch.Tensor, ref: torch.Tensor, tol: float | None = None, name: str = "") -> None:
    """Assert ``rel(a, ref) < tol``; ``tol`` defaults to ``TOL[a.dtype]``. ``name`` labels the failure."""
    tol = TOL[a.dtype] if tol is None else tol
    err = rel(a, ref)
    assert err < tol, f"{name or 'output'}: relative error {err:.3g} >= {tol:g}"
