"""Kernel registry and backend selection; softmax_attention; the demo."""

import warnings

import pytest
import torch

from lightvision.ops import _dispatch, lightnet_attention, lion_attention, register_kernel, softmax_attention


@pytest.fixture
def empty_registry(monkeypatch):
    """No kernel registered and every family marked as already imported."""
    monkeypatch.setattr(_dispatch, "_KERNELS", {})
    monkeypatch.setattr(_dispatch, "_IMPORTED", set(_dispatch._FAMILY.values()))


def _qkv(n=9):
    return torch.rand(2, 1, n, 4), torch.rand(2, 1, n, 4), torch.randn(2, 1, n, 3)


def test_triton_without_kernel_raises(empty_registry):
    q, k, v = _qkv()
    with pytest.raises(RuntimeError, match="no Triton kernel is registered"):
        lightnet_attention(q, k, v, backend="triton")
    with pytest.raises(RuntimeError, match="no Triton kernel is registered"):
        lion_attention(q, k, v, backend="triton")


def test_registered_kernel_dispatch(empty_registry):
    q, k, v = _qkv()
    calls = []

    def fake(q_, k_, v_, **kw):
        calls.append(kw)
        return NotImplemented if kw["causal"] else torch.zeros_like(v_)

    register_kernel("lightnet_attention", fake)
    ref = lightnet_attention(q, k, v, backend="torch")
    assert not calls
    assert torch.equal(lightnet_attention(q, k, v, backend="auto"), ref)  # CPU tensors: auto keeps the reference
    assert not calls
    assert (lightnet_attention(q, k, v, grid=(3, 3), backend="triton") == 0).all()
    want = dict(grid=(3, 3), num_prefix_tokens=0, lrpe="per_axis", pos_scale=None, causal=False, key_softmax=True)
    assert calls[-1] == want
    with pytest.raises(RuntimeError, match="does not support"):
        lightnet_attention(q, k, v, causal=True, backend="triton")
    with pytest.raises(ValueError, match="unknown op name"):
        register_kernel("lightnet", fake)


def test_auto_under_compile_leaves_fusable_pointwise_to_inductor(empty_registry, monkeypatch):
    """Under torch.compile, "auto" on CUDA runs the reference of RMSNorm / SiLU x mul (Inductor fuses it with the
    residual adds around it) and the kernel of the other ops; "triton" always runs the kernel."""
    calls = []
    for name in ("rms_norm", "silu_mul", "modulated_layer_norm"):
        register_kernel(name, lambda *a, _n=name, **kw: calls.append(_n) or "kernel")
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert _dispatch.dispatch("rms_norm", "auto", cuda, (), {}) is NotImplemented
    assert _dispatch.dispatch("silu_mul", "auto", cuda, (), {}) is NotImplemented
    assert _dispatch.dispatch("modulated_layer_norm", "auto", cuda, (), {}) == "kernel"
    assert _dispatch.dispatch("rms_norm", "triton", cuda, (), {}) == "kernel"
    assert calls == ["modulated_layer_norm", "rms_norm"]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    assert _dispatch.dispatch("rms_norm", "auto", cuda, (), {}) == "kernel"


@pytest.mark.parametrize("b,h,n", [(1, 1, 197), (2, 3, 10)])
def test_softmax_attention(b, h, n, rel):
    q, k, v = (torch.randn(b, h, n, 8, dtype=torch.float64) for _ in range(3))
    ref = torch.softmax(q @ k.transpose(-1, -2) / 8**0.5, -1) @ v
    assert rel(softmax_attention(q, k, v), ref) < 1e-12
    ref2 = torch.softmax(q @ k.transpose(-1, -2) * 0.3, -1) @ v
    assert rel(softmax_attention(q, k, v, scale=0.3), ref2) < 1e-12
    with pytest.raises(ValueError, match="4-D"):
        softmax_attention(q[0], k[0], v[0])


def test_demo_passes(capsys):
    from lightvision.demo import run_demo

    assert run_demo("cpu") == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and out.count("PASS") >= 9 and "Normalized: q (K^T V)" in out


def test_auto_fallback_on_cuda_warns_once_per_reason(empty_registry, monkeypatch):
    """backend="auto" with CUDA inputs that no kernel covers runs the reference and says so, once per reason."""
    monkeypatch.setattr(_dispatch, "_WARNED", set())
    monkeypatch.setattr(_dispatch, "_IMPORT_ERRORS", {"lightvision.kernels.lion": "ImportError: no triton"})
    cuda = torch.device("cuda")  # the device the dispatcher is told about; the tensors stay on the CPU
    q, k, v = _qkv()
    with pytest.warns(RuntimeWarning, match=r"lion_attention: no Triton kernel is available \(ImportError: no triton"):
        assert _dispatch.dispatch("lion_attention", "auto", cuda, (q, k, v), {}) is NotImplemented
    register_kernel("lightnet_attention", lambda q_, k_, v_, **kw: NotImplemented)
    with pytest.warns(RuntimeWarning, match=r"lightnet_attention: the Triton kernel does not cover .*torch.float32"):
        assert _dispatch.dispatch("lightnet_attention", "auto", cuda, (q, k, v), dict(causal=True)) is NotImplemented
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same reasons again: silent
        assert _dispatch.dispatch("lion_attention", "auto", cuda, (q, k, v), {}) is NotImplemented
        assert _dispatch.dispatch("lightnet_attention", "auto", cuda, (q, k, v), dict(causal=True)) is NotImplemented
    with pytest.warns(RuntimeWarning, match="does not cover"):  # another unsupported configuration
        _dispatch.dispatch("lightnet_attention", "auto", cuda, (q.double(), k, v), dict(causal=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # CPU inputs: the reference is the expected path, nothing to say
        assert _dispatch.dispatch("lion_attention", "auto", torch.device("cpu"), (q, k, v), {}) is NotImplemented
