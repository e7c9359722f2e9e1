"""LION bidirectional masked linear attention: masks LIT / D / S, four equivalent forms, snake orders.

LION Theorem 3.3 and Sec. 4; docs/spec.md 1.5. Per head, with q, k already feature-mapped (positive):
    A = (Q K^T) * M,    Y = (A V) / (A 1 + 1e-6)
    LIT: M = 1;  D: M_ij = lambda^|i-j| (log lambda per head);
    S:   M_ij = prod_{m=j}^{i-1} a_m (i > j), prod_{m=i+1}^{j} a_m (i < j), 1 (i = j), log a_m given per token.
As a pair of causal scalar-decay RNNs (S_i = lam_i S_{i-1} + k_i v_i^T): forward lam_i = a_{i-1},
backward (on the reversed sequence) lam_i = a_{i+1} (the one-position gate shift), D: lam = lambda.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ._checks import check_choice, check_grid, check_qkv, compute_dtype
from ._dispatch import dispatch, warn_once
from ._scan import bidirectional_scan, segsum
from .heads import merge_heads, split_heads

MASKS = ("lit", "d", "s")
FEATURE_MAPS = ("elu", "silu_norm")
MASK_FEATURE_MAP = {"lit": "elu", "d": "silu_norm", "s": "silu_norm"}  # phi of each mask's layer (LION Sec. 4)
FORMS = ("parallel", "chunk", "recurrent", "scan", "auto")
AUTO_PARALLEL_MAX_N = 1024  # form="auto": parallel (materialised mask) up to this N, the linear-time scan beyond
EPS = 1e-6
# A gate Linear run alone is padded to a multiple of GATE_ALIGN outputs: rows of 6 or 12 bf16 (12 / 24 bytes) put
# cuBLAS on its unaligned kernels, about twice as slow for these products. Gate logits folded into the qkv
# projection take QKV_GATE_ALIGN columns, so that the projection's row stride stays a multiple of 64 elements
# (128 bytes of bf16) when 3C is: with rows of 1160 Inductor padded the stride and copied the tensor into and out of
# the packed custom op, about 3 ms per DeiT-S step (docs/kernels_lion.md).
GATE_ALIGN = 8
QKV_GATE_ALIGN = 64


def gate_columns(num_heads: int, align: int = QKV_GATE_ALIGN) -> int:
    """Columns that per-token gate logits of ``num_heads`` heads take at the end of a packed qkv projection
    (num_heads rounded up to ``align``; the extra columns are padding)."""
    return -(-num_heads // align) * align


def split_gate_logits(qkv: torch.Tensor, num_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv [B, N, 3 * H * d + gate_columns(H)] with gate logits z in columns 3 H d .. 3 H d + H - 1 -> views
    (the q, k, v columns [B, N, 3 * H * d], z [B, N, H])."""
    c3 = qkv.shape[-1] - gate_columns(num_heads)
    return qkv[..., :c3], qkv[..., c3 : c3 + num_heads]


def log_gates(z: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    """LION-S gate logits z [B, N, ...] -> log a = logsigmoid(z) [B, ..., N] in the compute dtype, 0 (a = 1) on the
    first num_prefix_tokens tokens."""
    log_a = F.logsigmoid(z.to(compute_dtype(z))).movedim(1, -1)
    return log_a.masked_fill(torch.arange(z.shape[1], device=z.device) < num_prefix_tokens, 0.0)


def lion_feature_map(x: torch.Tensor, kind: str = "silu_norm", *, backend: str = "auto") -> torch.Tensor:
    """LION's positive feature map phi over the last (head) dim (LION Sec. 4; docs/spec.md 1.5), applied to q and k.

    "silu_norm" (LION-D / S): normalize(SiLU(x) + 0.5) in L2, so q . k lies in (0, 1];  "elu" (LIT): elu(x) + 1.
    Computed in fp32 (fp64 inputs stay fp64).

    Args:
        x: [..., d], e.g. q or k [B, H, N, d] (the Triton kernel reads strided views in place).
        kind: one of ``FEATURE_MAPS``.
        backend: "torch" | "auto" | "triton" (:mod:`lightvision.ops._dispatch`).

    Returns:
        phi(x), x's shape and dtype.

    Example:
        >>> y = lion_feature_map(torch.randn(2, 3, 10, 16))
        >>> bool((y > 0).all()), torch.allclose(y.norm(dim=-1), torch.ones(2, 3, 10))
        (True, True)
    """
    check_choice(kind, FEATURE_MAPS, "LION feature map")
    out = dispatch("lion_feature_map", backend, x.device, (x,), dict(kind=kind))
    if out is not NotImplemented:
        return out
    xf = x.to(compute_dtype(x))
    y = F.elu(xf) + 1 if kind == "elu" else F.normalize(F.silu(xf) + 0.5, dim=-1)
    return y.to(x.dtype)


def lion_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: str = "lit",
    log_decay: torch.Tensor | None = None,
    form: str = "parallel",
    chunk_size: int = 64,
    normalize: bool = True,
    backend: str = "auto",
):
    """LION attention (module docstring) on feature-mapped q, k.

    ``form`` (all compute the same function, LION Theorem 3.3):
      "parallel"  materialised [N, N] mask, log M from segment sums, exp of finite values only;
      "chunk"     blocks of ``chunk_size`` keys, O(N * chunk) memory (log-gate prefix sums in fp64);
      "recurrent" forward and backward RNNs, y_i = q_i^T (S^F_i - k_i v_i^T/2) + q_i^T (S^B_i - k_i v_i^T/2),
                  normaliser q_i^T (z^F_i - k_i/2) + q_i^T (z^B_i - k_i/2), one state S [B, H, d, d_v] per
                  direction (a Python loop over tokens: for checking, not speed);
      "scan"      two chunked causal scalar-decay scans (forward, reversed), diagonal once, normaliser from
                  a ones column appended to V;
      "auto"      "parallel" for N <= AUTO_PARALLEL_MAX_N, else "scan".
    Differentiable in q, k, v and log_decay. The Triton kernels run "recurrent" as their chunked scan (the same
    function) and say so in a warning.

    Args:
        q, k: [B, H, N, d], feature-mapped (positive, e.g. :func:`lion_feature_map`).
        v: [B, H, N, d_v].
        mask: "lit" | "d" | "s" (``MASKS``).
        log_decay: None for "lit"; [H] = log lambda per head for "d"; [B, H, N] = log a_m per token for "s"
            (the caller sets prefix gates to 1, i.e. log 0). Used in fp32 (fp64 stays fp64).
        form: one of ``FORMS`` (above).
        chunk_size: keys per block of the "chunk" and "scan" forms.
        normalize: False returns the numerator and the normaliser instead of their ratio.
        backend: "torch" | "auto" | "triton" (:mod:`lightvision.ops._dispatch`).

    Returns:
        Y [B, H, N, d_v] in q's dtype; with ``normalize=False`` the pair (A V [B, H, N, d_v], A 1 [B, H, N]) in the
        fp32 compute dtype, so that masks can be summed before dividing.

    Example:
        >>> q, k = (lion_feature_map(torch.randn(2, 3, 50, 16)) for _ in range(2))
        >>> v = torch.randn(2, 3, 50, 16)
        >>> y = lion_attention(q, k, v, mask="d", log_decay=torch.full((3,), -0.1))
        >>> torch.allclose(y, lion_attention(q, k, v, mask="d", log_decay=torch.full((3,), -0.1), form="scan"),
        ...                atol=1e-5)
        True
    """
    check_qkv(q, k, v, "lion_attention")
    check_choice(mask, MASKS, "mask")
    check_choice(form, FORMS, "form")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"lion_attention: chunk_size must be a positive int, got {chunk_size!r}")
    check_log_decay(mask, log_decay, q, "lion_attention")
    kwargs = dict(mask=mask, log_decay=log_decay, form=form, chunk_size=chunk_size, normalize=normalize)
    out = dispatch("lion_attention", backend, q.device, (q, k, v), kwargs)
    if out is not NotImplemented:
        _note_kernel_form("lion_attention", form)
        return out
    dt = compute_dtype(q, k, v)
    qf, kf, vf = q.to(dt), k.to(dt), v.to(dt)
    log_fwd, log_bwd = step_log_decays(mask, log_decay, q.shape, dt, q.device)
    n = q.shape[2]
    if form == "auto":
        form = "parallel" if n <= AUTO_PARALLEL_MAX_N else "scan"
    if form == "parallel":
        logm = segsum(log_fwd) + segsum(log_bwd.flip(-1)).flip(-1, -2)  # lower + upper triangle, diagonal 0
        a = (qf @ kf.transpose(-1, -2)) * torch.exp(logm)
        num, den = a @ vf, a.sum(-1)
    elif form == "chunk":
        num, den = _chunk_form(qf, kf, vf, log_fwd, log_bwd, chunk_size)
    elif form == "recurrent":
        num, den = _recurrent_form(qf, kf, vf, log_fwd, log_bwd)
    else:
        out = bidirectional_scan(
            qf, kf, torch.cat([vf, vf.new_ones(*vf.shape[:3], 1)], -1), log_fwd, log_bwd, chunk_size
        )
        num, den = out[..., :-1], out[..., -1]
    if not normalize:
        return num, den
    return (num / (den[..., None] + EPS)).to(q.dtype)


def lion_attention_qkvpacked(
    qkv: torch.Tensor,
    num_heads: int,
    *,
    mask: str = "lit",
    log_decay: torch.Tensor | None = None,
    gates_in_qkv: bool = False,
    num_prefix_tokens: int = 0,
    form: str = "parallel",
    backend: str = "auto",
) -> torch.Tensor:
    """LION layer core on a fused projection, feature map included.

    The same math as ``merge_heads(lion_attention(phi(q), phi(k), v, ...))`` with q, k, v = ``split_heads(qkv)``
    and phi = ``lion_feature_map`` of the mask's kind (``MASK_FEATURE_MAP``: LIT elu(x) + 1, D / S
    normalize(SiLU(x) + 0.5)). With ``gates_in_qkv`` one Linear makes q, k, v and LION-S's gates. The masked
    Triton kernel reads q, k, v and the gates in place, writes Y in the [B, N, H, d] layout of the output
    projection and the gradient straight into one tensor laid out as qkv (no stack of dq, dk, dv, no transposing
    copies, no concatenation with the gates' gradient).

    Args:
        qkv: [B, N, 3 * H * d], or [B, N, 3 * H * d + gate_columns(H)] with ``gates_in_qkv``.
        num_heads: H.
        mask, form, backend: as in :func:`lion_attention`.
        log_decay: [H] or [B, H, N] of the split heads, as in :func:`lion_attention`.
        gates_in_qkv: (mask "s", no log_decay) columns 3 H d .. 3 H d + H - 1 of qkv are the per-token gate
            logits z: log a = logsigmoid(z), 0 on the first ``num_prefix_tokens`` tokens (:func:`log_gates`; the
            padding columns get gradient 0).
        num_prefix_tokens: leading tokens whose gate is 1 (``gates_in_qkv`` only).

    Returns:
        Y [B, N, H * d] in qkv's dtype.

    Example:
        >>> lion_attention_qkvpacked(torch.randn(2, 50, 3 * 48), 3).shape
        torch.Size([2, 50, 48])
    """
    if not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    check_choice(mask, MASKS, "mask")
    check_choice(form, FORMS, "form")
    if gates_in_qkv:
        _check_gates_in_qkv(qkv, num_heads, mask, log_decay, num_prefix_tokens)
        qkv3, z = split_gate_logits(qkv, num_heads)
        q, k, v = split_heads(qkv3, num_heads)
    else:
        q, k, v = split_heads(qkv, num_heads)
        check_log_decay(mask, log_decay, q, "lion_attention_qkvpacked")
    kwargs = dict(
        mask=mask, log_decay=log_decay, gates_in_qkv=gates_in_qkv, num_prefix_tokens=num_prefix_tokens, form=form
    )
    out = dispatch("lion_attention_qkvpacked", backend, qkv.device, (qkv, num_heads), kwargs)
    if out is not NotImplemented:
        _note_kernel_form("lion_attention_qkvpacked", form)
        return out
    if gates_in_qkv:
        log_decay = log_gates(z, num_prefix_tokens)
    kind = MASK_FEATURE_MAP[mask]
    fq, fk = (lion_feature_map(t, kind, backend=backend) for t in (q, k))
    return merge_heads(lion_attention(fq, fk, v, mask=mask, log_decay=log_decay, form=form, backend=backend))


def _note_kernel_form(op_name: str, form: str) -> None:
    """The Triton kernels have no token-by-token form: say once that "recurrent" ran as their chunked scan."""
    if form == "recurrent":
        warn_once(
            (op_name, "recurrent"),
            f"{op_name}: form='recurrent' ran as the Triton kernel's chunked "
            "bidirectional scan (the same function, O(N) memory); backend='torch' runs the token-by-token "
            "recurrence",
        )


def _check_gates_in_qkv(qkv: torch.Tensor, num_heads: int, mask: str, log_decay, num_prefix_tokens: int) -> None:
    """gates_in_qkv needs mask "s", no log_decay, qkv [B, N, 3 * H * d + gate_columns(H)] and 0 <= prefix <= N."""
    name = "lion_attention_qkvpacked(gates_in_qkv=True)"
    if mask != "s" or log_decay is not None:
        raise ValueError(
            f"{name}: per-token gates in qkv are LION-S's: use mask='s' and no log_decay, got "
            f"mask={mask!r}" + ("" if log_decay is None else " and a log_decay")
        )
    width = qkv.shape[-1] - gate_columns(num_heads) if qkv.dim() == 3 else -1
    if width <= 0 or width % (3 * num_heads):
        raise ValueError(
            f"{name}: qkv must be [B, N, 3 * num_heads * d + {gate_columns(num_heads)}] (gate logits "
            f"padded to gate_columns({num_heads})), got {tuple(qkv.shape)}"
        )
    if not isinstance(num_prefix_tokens, int) or not 0 <= num_prefix_tokens <= qkv.shape[1]:
        raise ValueError(
            f"{name}: num_prefix_tokens must be an int in [0, N = {qkv.shape[1]}], got {num_prefix_tokens!r}"
        )


def lion_snake_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    grid: Sequence[int],
    num_prefix_tokens: int = 0,
    mask: str = "d",
    log_decay_row: torch.Tensor,
    log_decay_col: torch.Tensor,
    form: str = "parallel",
    chunk_size: int = 64,
    backend: str = "auto",
) -> torch.Tensor:
    """LION-D/S with snake patch orders ("natural" variants, docs/spec.md 1.5): M = (M_row + M_col) / 2.

    M_row (M_col) is the D or S mask built along the row-snake (column-snake) order of the 2-D grid
    (:func:`snake_permutation`) and permuted back to raster order. Computed by gathering tokens into each
    order, running :func:`lion_attention` with normalize=False, scattering back, averaging numerators and
    denominators, then Y = num / (den + 1e-6). Prefix tokens stay first in both orders. ``backend`` is
    passed to each :func:`lion_attention` call, so a registered LION kernel runs both orders.

    Args:
        q, k: [B, H, N, d] feature-mapped; v: [B, H, N, d_v].
        grid: (h, w) with h * w + num_prefix_tokens = N.
        num_prefix_tokens: leading tokens, first in both orders.
        mask: "d" or "s".
        log_decay_row, log_decay_col: one per order, [H] (mask "d") or [B, H, N] in RASTER order (mask "s").
        form, chunk_size, backend: as in :func:`lion_attention`.

    Returns:
        Y [B, H, N, d_v] in q's dtype.

    Example:
        >>> q, k = (lion_feature_map(torch.randn(1, 2, 1 + 4 * 5, 8)) for _ in range(2))
        >>> ld = torch.full((2,), -0.2)
        >>> lion_snake_attention(q, k, torch.randn(1, 2, 21, 8), grid=(4, 5), num_prefix_tokens=1,
        ...                      log_decay_row=ld, log_decay_col=ld).shape
        torch.Size([1, 2, 21, 8])
    """
    check_qkv(q, k, v, "lion_snake_attention")
    grid = check_grid(grid, q.shape[2], num_prefix_tokens)
    if len(grid) != 2:
        raise ValueError(f"lion_snake_attention needs a 2-D grid (h, w), got {grid}")
    check_choice(mask, ("d", "s"), "snake mask")
    check_log_decay(mask, log_decay_row, q, "lion_snake_attention (log_decay_row)")
    check_log_decay(mask, log_decay_col, q, "lion_snake_attention (log_decay_col)")
    num = den = 0.0
    for order, ld in (("row", log_decay_row), ("col", log_decay_col)):
        perm = snake_permutation(grid, num_prefix_tokens, order, device=q.device)
        inv = torch.argsort(perm)
        ld_perm = ld[..., perm] if mask == "s" else ld
        n_o, d_o = lion_attention(
            q[:, :, perm],
            k[:, :, perm],
            v[:, :, perm],
            mask=mask,
            log_decay=ld_perm,
            form=form,
            chunk_size=chunk_size,
            normalize=False,
            backend=backend,
        )
        num = num + n_o[:, :, inv]
        den = den + d_o[:, :, inv]
    return ((num / 2) / (den[..., None] / 2 + EPS)).to(q.dtype)


def snake_permutation(
    grid: Sequence[int], num_prefix_tokens: int = 0, order: str = "row", device: torch.device | str | None = None
) -> torch.Tensor:
    """Raster indices [N] listed in snake order: perm[t] = raster index of the t-th token of the order.

    "row": rows top to bottom, even rows left to right, odd rows right to left.
    "col": columns left to right, even columns top to bottom, odd columns bottom to top.
    The prefix tokens come first (indices 0..num_prefix_tokens-1), grid indices are offset by them.
    """
    check_choice(order, ("row", "col"), "snake order")
    h, w = grid
    idx = torch.arange(h * w, device=device).view(h, w)
    if order == "col":
        idx = idx.t()
    idx = idx.clone()
    idx[1::2] = idx[1::2].flip(-1)
    return torch.cat([torch.arange(num_prefix_tokens, device=device), idx.reshape(-1) + num_prefix_tokens])


def check_log_decay(mask: str, log_decay: torch.Tensor | None, q: torch.Tensor, name: str) -> None:
    """log_decay must be None for "lit", [H] for "d", [B, H, N] for "s" (a floating tensor on q's device)."""
    b, h, n, _ = q.shape
    if mask == "lit":
        if log_decay is not None:
            raise ValueError(f"{name}: mask='lit' has no decay; got log_decay of shape {tuple(log_decay.shape)}")
        return
    want = (h,) if mask == "d" else (b, h, n)
    if not isinstance(log_decay, torch.Tensor):
        raise ValueError(
            f"{name}: mask={mask!r} needs log_decay, a tensor of shape {want}; got {type(log_decay).__name__}"
        )
    if tuple(log_decay.shape) != want:
        layout = "[H] (log lambda per head)" if mask == "d" else "[B, H, N] (log gate per token)"
        raise ValueError(
            f"{name}: mask={mask!r} needs log_decay of shape {layout} = {want}, got {tuple(log_decay.shape)}"
        )
    if not log_decay.is_floating_point() or log_decay.device != q.device:
        raise ValueError(
            f"{name}: log_decay must be a floating tensor on {q.device}, got {log_decay.dtype} on {log_decay.device}"
        )


def step_log_decays(
    mask: str, log_decay: torch.Tensor | None, shape: torch.Size, dt: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-step log decays (log_fwd, log_bwd), each [B or 1, H, N], of the forward and backward RNNs.

    LIT: 0. D: log lambda at every step. S: forward lam_i = a_{i-1}, backward lam_i = a_{i+1}
    (the one-position gate shift; the unused boundary step gets 0).
    """
    b, h, n, _ = shape
    if mask == "lit":
        zero = torch.zeros(1, h, n, dtype=dt, device=device)
        return zero, zero
    ld = log_decay.to(dt)
    if mask == "d":
        lam = ld[None, :, None].expand(1, h, n)
        return lam, lam
    return F.pad(ld[..., :-1], (1, 0)), F.pad(ld[..., 1:], (0, 1))


def _chunk_form(q, k, v, log_fwd, log_bwd, chunk_size):
    """Blocks of keys; log M[i, j] from fp64 prefix sums (i > j: P_i - P_j of log_fwd; i < j: Q_j - Q_i of log_bwd)."""
    n = q.shape[2]
    pf = log_fwd.double().cumsum(-1)  # inclusive: sum_{m<=i} log_fwd_m
    qb = log_bwd.double().cumsum(-1) - log_bwd.double()  # exclusive: sum_{m<i} log_bwd_m
    rows = torch.arange(n, device=q.device)[:, None]
    num = q.new_zeros(*q.shape[:3], v.shape[-1])
    den = q.new_zeros(*q.shape[:3])
    for s in range(0, n, chunk_size):
        e = min(s + chunk_size, n)
        cols = torch.arange(s, e, device=q.device)[None, :]
        lower = pf[..., :, None] - pf[..., None, s:e]
        upper = qb[..., None, s:e] - qb[..., :, None]
        logm = torch.where(rows > cols, lower, torch.where(rows < cols, upper, torch.zeros_like(lower)))
        a = (q @ k[:, :, s:e].transpose(-1, -2)) * torch.exp(logm).to(q.dtype)
        num = num + a @ v[:, :, s:e]
        den = den + a.sum(-1)
    return num, den


def _recurrent_form(q, k, v, log_fwd, log_bwd):
    """Forward and backward RNNs (S, z) run token by token, as docs/spec.md 1.5 states them.

    Each direction carries one state S [B, H, d, d_v] and z [B, H, d]: k_i v_i^T is formed at its step only, so
    the forward pass holds O(d d_v) state besides the [B, H, N, d_v] outputs (autograd still keeps one S per step
    for the backward). The diagonal counted by both directions is removed as (q_i . k_i) v_i / 2.
    """
    n = q.shape[2]
    qk_half = (q * k).sum(-1) / 2  # q_i^T k_i / 2: the diagonal of A, once per direction
    num, den = 0.0, 0.0
    for lam, steps in ((torch.exp(log_fwd), range(n)), (torch.exp(log_bwd), range(n - 1, -1, -1))):
        s_state = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1])
        z_state = q.new_zeros(*q.shape[:2], q.shape[-1])
        nums, dens = [None] * n, [None] * n
        for i in steps:
            s_state = lam[..., i, None, None] * s_state + k[:, :, i, :, None] * v[:, :, i, None, :]
            z_state = lam[..., i, None] * z_state + k[:, :, i]
            nums[i] = (q[:, :, i, :, None] * s_state).sum(-2) - qk_half[:, :, i, None] * v[:, :, i]
            dens[i] = (q[:, :, i] * z_state).sum(-1) - qk_half[:, :, i]
        num, den = num + torch.stack(nums, 2), den + torch.stack(dens, 2)
    return num, den
