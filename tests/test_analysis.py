"""lightvision.analysis: the effective attention matrix of every core and layer kind reproduces its output."""

import pytest
import torch

from lightvision.analysis import core_matrix, effective_attention
from lightvision.layers import ATTENTION_KINDS, RMSNorm, build_attention
from lightvision.ops import merge_heads, two_scan_attention

F64 = torch.float64


def _layer_output_from(layer, x, a):
    """The layer's forward rebuilt from A: merge(A v), LightNet's norm and gate, the output projection."""
    _, _, v = layer.split(x)
    o = merge_heads(a @ v)
    if isinstance(getattr(layer, "norm", None), RMSNorm):
        o = layer.norm(o, layer.gate(x))
    return layer.proj(o)


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_matrix_reproduces_the_layer(kind):
    """A v, through the layer's own norm / gate / projection, is the layer's output (fp64, a non-square grid with a
    cls token); the rows of the kinds normalised over the keys sum to 1."""
    torch.manual_seed(0)
    layer = build_attention(kind, 16, 2, **({} if kind in ("softmax", "normalized") else {"backend": "torch"}))
    layer = layer.double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    grid, prefix = (3, 5), 1
    x = torch.randn(2, prefix + 15, 16, dtype=F64)
    a = effective_attention(layer, x, grid, prefix)
    assert a.shape == (2, 2, 16, 16) and a.dtype == F64
    with torch.no_grad():
        torch.testing.assert_close(_layer_output_from(layer, x, a), layer(x, grid, prefix), rtol=1e-10, atol=1e-10)
    if kind not in ("lightnet", "normalized"):
        torch.testing.assert_close(a.sum(-1), torch.ones(2, 2, 16, dtype=F64))
    assert (a >= 0).all() or kind in ("lightnet", "normalized")


def test_normalized_matrix_is_the_scores_over_eta():
    """Normalized attention: A_ij = (q_i . k_j) / eta_i with eta_i = N exp(w_h^T x_i + b_h), from the layer's own
    projections (trained-like w, so eta differs between tokens)."""
    torch.manual_seed(0)
    layer = build_attention("normalized", 16, 2).double()
    with torch.no_grad():
        layer.normalizer.weight.normal_(0, 0.5)
    x = torch.randn(2, 1 + 12, 16, dtype=F64)
    q, k, _ = layer.split(x)
    eta = 13 * torch.exp(layer.normalizer(x)).transpose(1, 2)  # [B, H, N]
    want = (q @ k.transpose(-1, -2)) / eta[..., None]
    torch.testing.assert_close(effective_attention(layer, x, (3, 4), 1), want.detach(), rtol=1e-12, atol=1e-12)
    assert eta.std() > 0.1 * eta.mean()


def test_two_scan_matrix_is_the_decay_masked_scores():
    """The two-scan baseline: A_ij = lambda^|i-j| q_i . k_j (no normalisation)."""
    q, k = torch.rand(2, 1, 2, 9, 4, dtype=F64).unbind(0)
    log_decay = torch.tensor([-0.3, -1.2], dtype=F64)
    a = core_matrix(two_scan_attention, q, k, log_decay=log_decay, backend="torch")
    pos = torch.arange(9)
    mask = torch.exp(log_decay[:, None, None] * (pos[:, None] - pos[None, :]).abs())
    torch.testing.assert_close(a, (q @ k.transpose(-1, -2)) * mask)


def test_memory_guard_refuses_large_grids():
    layer = build_attention("softmax", 16, 2)
    with pytest.raises(ValueError, match=r"effective attention of 4097 tokens needs .* GiB .*use fewer tokens"):
        effective_attention(layer, torch.randn(32, 4097, 16), (64, 64), 1)
    with pytest.raises(ValueError, match="takes SoftmaxAttention, LightNetAttention, LionAttention, Normalized"):
        effective_attention(torch.nn.Linear(16, 16), torch.randn(1, 4, 16))
