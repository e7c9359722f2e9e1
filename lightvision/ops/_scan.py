"""Log-space segment sums and chunked causal scalar-decay scans shared by LION and the two-scan baseline."""

from __future__ import annotations

import torch


def segsum(x: torch.Tensor) -> torch.Tensor:
    """x [..., N] -> [..., N, N] with out[i, j] = sum_{m=j+1}^{i} x_m for i >= j and 0 above the diagonal.

    Built by a cumulative sum down each column (a segment sum, not a difference of global cumsums), so
    long sequences do not lose precision; the invalid triangle holds 0 in log space, never +-inf.
    """
    n = x.shape[-1]
    strict = torch.ones(n, n, dtype=torch.bool, device=x.device).tril(-1)
    cols = x[..., :, None].expand(*x.shape, n).masked_fill(~strict, 0.0)  # cols[i, j] = x_i if i > j
    return cols.cumsum(-2)


def causal_decay_scan(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_lam: torch.Tensor, chunk_size: int
) -> torch.Tensor:
    """Causal scalar-decay linear attention o_i = sum_{j<=i} exp(sum_{m=j+1}^{i} log_lam_m) (q_i . k_j) v_j.

    Equivalent to the RNN S_i = lam_i S_{i-1} + k_i v_i^T, o_i = S_i^T q_i. q, k: [B, H, N, d];
    v: [B, H, N, d_v]; log_lam: [B or 1, H, N] (log lam_i, fp32). Chunked: intra-chunk decays from
    segment sums, the d x d_v state carried between chunks. Memory O(N * chunk_size).
    """
    n = q.shape[2]
    state = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1])
    outs = []
    for s in range(0, n, chunk_size):
        e = min(s + chunk_size, n)
        qc, kc, vc, ll = q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], log_lam[..., s:e]
        tri = torch.ones(e - s, e - s, dtype=torch.bool, device=q.device).tril()
        decay = torch.exp(segsum(ll)).masked_fill(~tri, 0.0)  # [., H, c, c]
        b = ll.cumsum(-1)  # b_t = sum_{m=s}^{t} log_lam_m (within the chunk)
        o = ((qc @ kc.transpose(-1, -2)) * decay) @ vc + (qc * torch.exp(b)[..., None]) @ state
        b_last = b[..., -1:]
        state = torch.exp(b_last)[..., None] * state + (kc * torch.exp(b_last - b)[..., None]).transpose(-1, -2) @ vc
        outs.append(o)
    return torch.cat(outs, 2)


def bidirectional_scan(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_fwd: torch.Tensor, log_bwd: torch.Tensor, chunk_size: int
) -> torch.Tensor:
    """Forward scan + scan on the reversed sequence, diagonal counted once: sum_j M_ij (q_i . k_j) v_j.

    M_ij = exp(sum_{m=j+1}^{i} log_fwd_m) for i > j, exp(sum_{m=i}^{j-1} log_bwd_m) for i < j, 1 for i = j
    (the backward RNN is S_i = exp(log_bwd_i) S_{i+1} + k_i v_i^T). Shapes as :func:`causal_decay_scan`.
    """
    fwd = causal_decay_scan(q, k, v, log_fwd, chunk_size)
    bwd = causal_decay_scan(q.flip(2), k.flip(2), v.flip(2), log_bwd.flip(-1), chunk_size).flip(2)
    return fwd + bwd - (q * k).sum(-1, keepdim=True) * v
