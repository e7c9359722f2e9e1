"""Without a CUDA device, Triton kernels run in the Triton interpreter (CPU) throughout the suite; nothing may reach
the Hugging Face hub.

TRITON_INTERPRET is read when a kernel is decorated (module import), and the hub's offline switches when
huggingface_hub is first imported (timm imports it), so both are set here, at the root, before any test module
imports a kernel family or timm."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["DIFFUSERS_OFFLINE"] = "1"

import pytest
import torch

from helpers import rel as _rel

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


def _fix_interpreter_bf16() -> None:
    """Two Triton interpreter (3.x, numpy backend) bf16 bugs that the GPU does not have: tl.dot multiplies
    bf16 tiles as their raw uint16 bits (upcast the operands to fp32 first: exact, what the tensor cores
    do), and fp32 -> bf16 casts truncate (the GPU rounds to nearest even)."""
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_lv_bf16_dot", False):
        return
    raw_dot = builder.create_dot
    raw_cast = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            bits = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32).astype(np.uint64)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even (finite inputs)
            return interpreter.TensorHandle(bits.astype(np.uint16), dst_type.scalar)
        return raw_cast(self, src, dst_type)

    def create_dot(self, a, b, d, *args):
        a = self.cast_impl(a, tl.float32) if a.dtype.scalar == tl.bfloat16 else a
        b = self.cast_impl(b, tl.float32) if b.dtype.scalar == tl.bfloat16 else b
        return raw_dot(self, a, b, d, *args)

    builder.create_dot = create_dot
    builder.cast_impl = cast_impl
    builder._lv_bf16_dot = True


if os.environ.get("TRITON_INTERPRET") == "1":
    _fix_interpreter_bf16()


@pytest.fixture(autouse=True)
def _seed():
    """Every test draws its random inputs from the same seed, so a run is reproducible (and a failure too)."""
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """accelerate keeps one device state per process; every test leaves none behind, so a run on the CPU may follow
    a run on a GPU in one test process (as two commands of a user would run)."""
    yield
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture
def cli_error(capsys):
    """Run the ``lightvision`` command on bad input: it must return 1 and end its stderr with one error line (warnings
    may come before it), no traceback; returns that line (``cli_error(argv)``)."""
    from lightvision.cli import main

    def run(argv: list[str]) -> str:
        capsys.readouterr()
        assert main(argv) == 1
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert lines and lines[-1].startswith("lightvision: error: ") and "Traceback" not in err, err
        return lines[-1]

    return run


@pytest.fixture
def rel():
    """The suite's relative L2 error (tests/helpers.py), for tests that take it as a fixture."""
    return _rel


def pytest_make_parametrize_id(config, val, argname):
    """Readable ids for parametrised cases that pass no ``ids=``: ``dtype=bfloat16``, ``grid=7x11``, ``b=2``.

    Strings stay as they are; values without a short form (callables, dicts) keep pytest's default id."""
    if isinstance(val, torch.dtype):
        return f"{argname}={str(val).removeprefix('torch.')}"
    if val is None or isinstance(val, bool | int | float):
        return f"{argname}={val}"
    if isinstance(val, tuple | list) and all(isinstance(v, int) for v in val):
        return f"{argname}={'x'.join(map(str, val))}"
    if isinstance(val, tuple | list) and all(isinstance(v, torch.dtype) for v in val):
        return f"{argname}=" + ",".join(str(v).removeprefix("torch.") for v in val)
    if isinstance(val, tuple | list) and all(isinstance(v, float | int) for v in val):
        return f"{argname}=" + ",".join(map(str, val))
    return None
