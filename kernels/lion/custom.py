"""torch.library custom ops around the LION kernels, with autograd, so models torch.compile without graph breaks.

    torch.ops.lightvision.lion_fwd(q, k, v, g, normalize, form) -> (out, den, saved)
        out: Y [B, H, N, d_v] in q.dtype (normalize) or num in fp32; den: A 1 [B, H, N] fp32;
        saved: what the backward reuses: the masked form's gate table (parallel.gate_table: in-tile gate cumsums,
        tile totals and their prefix sums; empty for LIT) or the scan's key states (scan.scan_forward)
    torch.ops.lightvision.lion_bwd(dout, dden, q, k, v, g, out, den, saved, normalize, form) -> (dq, dk, dv, dg)
        dg: fp32 of g's shape, empty when g is None (LIT); dden is read only without normalize
g: fp32 log-gates, per token [B, H, N] (S) or per head [H] (D), or None; form: "parallel" (parallel.py) or
"scan" (scan.py).

The layer's form on a fused projection, either form, phi = LION's feature map ``kind``:
    torch.ops.lightvision.lion_packed_fwd(qkv, g, num_heads, kind, gates_in_qkv, num_prefix, form)
        -> (y, fqk, den, saved)
        qkv [B, N, 3 * H * d]; y [B, N, H * d] (the output projection's layout); fqk = [phi(q), phi(k)]
        [B, 2H, N, d] (one feature-map launch; saved for the backward); den, saved: lion_fwd's den and saved.
        One feature-map launch rather than phi inside the forward kernel's tile loads, which is slower
        (docs/kernels_lion.md, "Launch rules and their measurements").
        gates_in_qkv (g None): qkv is [B, N, 3 * H * d + G] (G = gate_columns(H)) and its columns 3 H d .. + H - 1
        are gate logits z, log a = logsigmoid(z), 0 on the first num_prefix tokens (LION-S's gate Linear folded
        into the qkv projection; the masked form's gate table reads them in place, the scan takes log a as fp32
        [B, H, N], B * H * N values made from them)
    torch.ops.lightvision.lion_packed_bwd(dy, qkv, g, fqk, y, den, saved, num_heads, kind, gates_in_qkv, num_prefix,
        form) -> (dqkv, dg)
        dqkv like qkv: the backward kernels write dL/dphi(q), dL/dphi(k), dv into its slices, then one feature-map
        pass turns the first two into dq, dk in place (no stack of dq, dk, dv, no copy of dy); with gates_in_qkv,
        dL/dz goes into its gate columns and zeros into the G - H padding columns (dg empty).
        One pass rather than phi's gradient inside the kernels' epilogues, which is slower
        (docs/kernels_lion.md, "Launch rules and their measurements").
:func:`lion_core` and :func:`lion_packed` are the differentiable entry points used by op.py: the custom ops while
torch.compile traces, else eager autograd.Functions over the same launchers (both pairs from ``kernels/_autograd``).
"""

from __future__ import annotations

import torch

from lightvision.ops.heads import split_heads
from lightvision.ops.lion import log_gates, split_gate_logits

from .._autograd import autograd_ops
from .._launch import empty
from ..fused.feature_map import feature_map_bwd_inplace, feature_map_fwd_launch
from .parallel import gate_table_like, parallel_backward, parallel_forward, row_grads
from .scan import key_states_like, scan_backward, scan_forward


def _unit_stride(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None, normalize: bool, form: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, den, saved) of the LION core; see the module docstring."""
    fwd = parallel_forward if form == "parallel" else scan_forward
    return fwd(_unit_stride(q), _unit_stride(k), _unit_stride(v), g, normalize)


def _fwd_fake(q, k, v, g, normalize, form):
    b, h, n, _ = q.shape
    out = q.new_empty(b, h, n, v.shape[-1], dtype=q.dtype if normalize else torch.float32)
    saved = gate_table_like(q, g is not None) if form == "parallel" else key_states_like(q, v)
    return out, q.new_empty(b, h, n, dtype=torch.float32), saved


def _bwd(
    dout: torch.Tensor,
    dden: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    out: torch.Tensor,
    den: torch.Tensor,
    saved: torch.Tensor,
    normalize: bool,
    form: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dg) of the LION core; see the module docstring."""
    dout = dout.contiguous()
    inputs = (_unit_stride(q), _unit_stride(k), _unit_stride(v), g, dout)
    if normalize and form == "parallel":  # the dq kernel derives 1 / Z and dL/d den itself
        dq, dk, dv, dg = parallel_backward(*inputs, None, None, saved, out_den=(out, den))
    else:
        zinv, delta = row_grads(dout, out, den) if normalize else (torch.ones_like(den), dden.float())
        bwd = parallel_backward if form == "parallel" else scan_backward
        dq, dk, dv, dg = bwd(*inputs, zinv.contiguous(), delta.contiguous(), saved)
    return dq, dk, dv, den.new_empty(0) if dg is None else dg


def _bwd_fake(dout, dden, q, k, v, g, out, den, saved, normalize, form):
    # contiguous, as the kernels allocate them, whatever the strides of q, k, v, g (views of a qkv projection)
    dg = den.new_empty(0) if g is None else g.new_empty(g.shape)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dg


def _saved(inputs, output):
    q, k, v, g, normalize, form = inputs
    return (q, k, v, g, *output), (normalize, form)


# custom ops lightvision::lion_fwd / _bwd (torch.compile) and the eager Function over the same launchers; out and den
# are both results (the pair (num, den) without normalize)
lion_fwd, lion_bwd, _, _lion = autograd_ops("lion", _fwd, _fwd_fake, _bwd, _bwd_fake, _saved, results=2)


def lion_core(q, k, v, g, normalize: bool, form: str):
    """Differentiable LION core: Y (normalize) or the fp32 pair (num, den); g, form as lion_fwd."""
    out, den = _lion(q, k, v, g, normalize, form)
    return out if normalize else (out, den)


def _heads(y: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[B, N, H * d] -> its [B, H, N, d] view (also the q, k slices of qkv [B, N, 3 * H * d] as 2H heads)."""
    b, n, c = y.shape
    return y.view(b, n, num_heads, c // num_heads).transpose(1, 2)


def _qk_heads(qkv: torch.Tensor, num_heads: int) -> torch.Tensor:
    """The q and k slices of qkv [B, N, 3 * H * d] as one [B, 2H, N, d] view (q's heads first)."""
    return _heads(qkv, 3 * num_heads)[:, : 2 * num_heads]


def _scan_gates(qkv: torch.Tensor, g: torch.Tensor | None, num_heads: int, gates_in_qkv: bool, num_prefix: int):
    """The scan kernels' log-gates: g, or with gates_in_qkv logsigmoid of qkv's gate logits (0 on the prefix),
    fp32 [B, H, N]."""
    if not gates_in_qkv:
        return g
    return log_gates(split_gate_logits(qkv, num_heads)[1], num_prefix).float().contiguous()


def _packed_fwd(
    qkv: torch.Tensor,
    g: torch.Tensor | None,
    num_heads: int,
    kind: str,
    gates_in_qkv: bool,
    num_prefix: int,
    form: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, fqk, den, saved) of the packed LION core; see the module docstring."""
    qkv3, logits = split_gate_logits(qkv, num_heads) if gates_in_qkv else (qkv, g)
    b, n, c3 = qkv3.shape
    y = empty((b, n, c3 // 3), qkv.dtype, qkv.device)
    fqk = feature_map_fwd_launch(_qk_heads(qkv3, num_heads), kind)
    fq, fk, v = fqk[:, :num_heads], fqk[:, num_heads:], split_heads(qkv3, num_heads)[2]
    if form == "scan":
        gates = _scan_gates(qkv, g, num_heads, gates_in_qkv, num_prefix)
        _, den, saved = scan_forward(fq, fk, v, gates, True, out=_heads(y, num_heads))
    else:
        prefix = num_prefix if gates_in_qkv else None
        _, den, saved = parallel_forward(fq, fk, v, logits, True, out=_heads(y, num_heads), logits_prefix=prefix)
    return y, fqk, den, saved


def _packed_fwd_fake(qkv, g, num_heads, kind, gates_in_qkv, num_prefix, form):
    b, n, c3 = (split_gate_logits(qkv, num_heads)[0] if gates_in_qkv else qkv).shape
    fqk = qkv.new_empty(b, 2 * num_heads, n, c3 // (3 * num_heads))
    fq = fqk[:, :num_heads]
    if form == "scan":
        saved = key_states_like(fq, fq)
    else:
        saved = gate_table_like(fq, g is not None or gates_in_qkv)
    return qkv.new_empty(b, n, c3 // 3), fqk, fq.new_empty(fq.shape[:3], dtype=torch.float32), saved


def _packed_bwd(
    dy: torch.Tensor,
    qkv: torch.Tensor,
    g: torch.Tensor | None,
    fqk: torch.Tensor,
    y: torch.Tensor,
    den: torch.Tensor,
    saved: torch.Tensor,
    num_heads: int,
    kind: str,
    gates_in_qkv: bool,
    num_prefix: int,
    form: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dqkv, dg) of the packed LION core; see the module docstring."""
    do, out = _heads(_unit_stride(dy), num_heads), _heads(y, num_heads)
    qkv = qkv.contiguous()  # the in-place feature-map pass reads x with the strides of dqkv
    dqkv = empty(qkv.shape, qkv.dtype, qkv.device)
    qkv3, logits = split_gate_logits(qkv, num_heads) if gates_in_qkv else (qkv, g)
    c3 = qkv3.shape[-1]
    dqkv3 = dqkv[..., :c3]
    grads = split_heads(dqkv3, num_heads)
    fq, fk, v = fqk[:, :num_heads], fqk[:, num_heads:], split_heads(qkv3, num_heads)[2]
    if form == "scan":
        zinv, delta = row_grads(do, out, den)
        into = dict(logits=(logits, num_prefix, dqkv[..., c3:])) if gates_in_qkv else {}
        gates = _scan_gates(qkv, g, num_heads, gates_in_qkv, num_prefix)
        _, _, _, dg = scan_backward(fq, fk, v, gates, do, zinv, delta, saved, grads=grads, **into)
    else:
        into = dict(logits_prefix=num_prefix, dlogits=dqkv[..., c3:]) if gates_in_qkv else {}
        _, _, _, dg = parallel_backward(
            fq, fk, v, logits, do, None, None, saved, grads=grads, out_den=(out, den), **into
        )
    feature_map_bwd_inplace(_qk_heads(qkv3, num_heads), _qk_heads(dqkv3, num_heads), kind)
    return dqkv, den.new_empty(0) if dg is None else dg


def _packed_bwd_fake(dy, qkv, g, fqk, y, den, saved, num_heads, kind, gates_in_qkv, num_prefix, form):
    return qkv.new_empty(qkv.shape), den.new_empty(0) if g is None else g.new_empty(g.shape)


def _packed_saved(inputs, output):
    qkv, g, num_heads, kind, gates_in_qkv, num_prefix, form = inputs
    y, fqk, den, saved = output
    return (qkv, g, fqk, y, den, saved), (num_heads, kind, gates_in_qkv, num_prefix, form)


# custom ops lightvision::lion_packed_fwd / _bwd (torch.compile) and the eager Function over the same launchers
lion_packed_fwd, lion_packed_bwd, _, _lion_packed = autograd_ops(
    "lion_packed", _packed_fwd, _packed_fwd_fake, _packed_bwd, _packed_bwd_fake, _packed_saved
)


def lion_packed(
    qkv, g, num_heads: int, kind: str, gates_in_qkv: bool = False, num_prefix: int = 0, form: str = "parallel"
) -> torch.Tensor:
    """Differentiable packed LION core: Y [B, N, H * d] from qkv with phi = ``kind``; g as lion_fwd, or None with
    gates_in_qkv (gate logits in qkv's last gate_columns(H) columns; lion_packed_fwd); form as lion_fwd."""
    return _lion_packed(qkv, g, num_heads, kind, gates_in_qkv, num_prefix, form)
