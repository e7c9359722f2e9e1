"""Effective attention: every core as the matrix it applies to the values (the Dynamical Systems Framework view,
Sieber et al., "Understanding the differences in Foundation Models: Attention, State Space Models, and Recurrent
Neural Networks", y = Phi u).

Each core is linear in v once q, k (and LION's gates) are fixed: O = A v with A [B, H, N, N]. Feeding the identity
as v gives A column by column, O(I) = A, through the plain PyTorch reference of the core itself, so A is exactly the
map the layer applies (MD-LRPE, decay masks, snake orders and normalisation included):

* softmax: A = softmax(q k^T / sqrt(d));
* LightNet: A = q~ k~^T with q~, k~ the MD-LRPE-rotated SiLU(q) and key softmax (rows do not sum to 1);
* LION LIT / D / S (and snake orders): the masked, row-normalised matrix;
* normalized attention: A = (q k^T) / eta, eta_i = exp(log eta_i) per query token (rows do not sum to 1);
* the two-scan baseline (``two_scan_attention``): the unnormalised decay-masked q k^T.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .layers.attention import LightNetAttention, LionAttention, NormalizedAttention, SoftmaxAttention
from .ops import lightnet_attention, lion_attention, lion_snake_attention, normalized_attention, softmax_attention
from .ops._checks import check_grid

LAYERS = (SoftmaxAttention, LightNetAttention, LionAttention, NormalizedAttention)
MAX_BYTES = 2 * 2**30  # the identity and the matrix are each B * H * N * N elements


def core_matrix(
    core: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor, *, max_bytes: int = MAX_BYTES, **kwargs
) -> torch.Tensor:
    """The matrix A of a core that is linear in its values, core(q, k, v) = A v.

    Args:
        core: a lightvision core taking (q, k, v, **kwargs), e.g. ``two_scan_attention``.
        q, k: [B, H, N, d] as the core takes them.
        max_bytes: refuse when the identity [B, H, N, N] would take more memory than this.
        kwargs: the core's other arguments (grid, masks, decays, backend="torch" for the plain reference, ...).

    Returns:
        A [B, H, N, N] in q's dtype: row i holds the weights of output token i over the N value tokens.

    Example:
        >>> from lightvision.ops import two_scan_attention
        >>> q, k = torch.rand(2, 2, 1, 10, 8).unbind(0)
        >>> core_matrix(two_scan_attention, q, k, log_decay=torch.full((1,), -0.1), backend="torch").shape
        torch.Size([2, 1, 10, 10])
    """
    b, h, n, _ = q.shape
    need = b * h * n * n * q.element_size()
    if need > max_bytes:
        raise ValueError(
            f"effective attention of {n} tokens needs {need / 2**30:.1f} GiB per matrix (B={b}, H={h}); "
            f"use fewer tokens or images, or raise max_bytes (now {max_bytes / 2**30:.1f} GiB)"
        )
    eye = torch.eye(n, dtype=q.dtype, device=q.device).expand(b, h, n, n)
    return core(q, k, eye, **kwargs)


def effective_attention(
    layer: torch.nn.Module,
    x: torch.Tensor,
    grid: Sequence[int] | None = None,
    num_prefix_tokens: int = 0,
    pos_scale: Sequence[float] | None = None,
    *,
    max_bytes: int = MAX_BYTES,
) -> torch.Tensor:
    """The matrix A with which an attention layer's core mixes its values: core output = A v (module docstring).

    Args:
        layer: a ``SoftmaxAttention``, ``LightNetAttention``, ``LionAttention`` (any mask, snake or not) or
            ``NormalizedAttention``.
        x: [B, N, C] the layer's input (after the block's norm).
        grid: token grid as the layer is called with; num_prefix_tokens: leading tokens without a position;
            pos_scale: the position scale it is called with (None: token units).
        max_bytes: memory guard for the [B, H, N, N] matrices.

    Returns:
        A [B, H, N, N]; v is the layer's value projection split into heads.
    """
    if not isinstance(layer, LAYERS):
        raise ValueError(
            f"effective_attention takes {', '.join(c.__name__ for c in LAYERS)} layers, got {type(layer).__name__}"
        )
    with torch.no_grad():
        q, k, _ = layer.split(x)
        if isinstance(layer, SoftmaxAttention):
            return core_matrix(softmax_attention, q, k, max_bytes=max_bytes)
        if isinstance(layer, LightNetAttention):
            return core_matrix(
                lightnet_attention,
                q,
                k,
                max_bytes=max_bytes,
                grid=grid,
                num_prefix_tokens=num_prefix_tokens,
                lrpe=layer.lrpe,
                pos_scale=pos_scale,
                key_softmax=layer.key_softmax,
                backend="torch",
            )
        if isinstance(layer, NormalizedAttention):
            return core_matrix(
                normalized_attention, q, k, max_bytes=max_bytes, log_eta=layer.log_eta(x), form="parallel"
            )
        factors = layer.decay_factors(pos_scale, check_grid(grid, x.shape[1], num_prefix_tokens))
        decays = layer._log_decays(x, num_prefix_tokens, factors)  # LION: its feature map and decays
        q, k = layer._phi(q), layer._phi(k)
        if layer.snake:
            return core_matrix(
                lion_snake_attention,
                q,
                k,
                max_bytes=max_bytes,
                grid=grid,
                num_prefix_tokens=num_prefix_tokens,
                mask=layer.mask,
                log_decay_row=decays[0],
                log_decay_col=decays[1],
                form="parallel",
                backend="torch",
            )
        return core_matrix(
            lion_attention,
            q,
            k,
            max_bytes=max_bytes,
            mask=layer.mask,
            log_decay=decays[0],
            form="parallel",
            backend="torch",
        )


def attention_maps(model: torch.nn.Module, *inputs: torch.Tensor, max_bytes: int = MAX_BYTES) -> list[torch.Tensor]:
    """The effective attention of every block of a model whose blocks call ``block.attn(x, grid=..., ...)`` (the
    DeiT and DiT families), for one forward pass ``model(*inputs)``.

    Args:
        model: a DeiT (``model(images)``) or a DiT (``model(x_t, t, y)``); its blocks' attention layers are read
            through forward pre-hooks.
        inputs: what the model's forward takes, e.g. images [B, C, H, W], or a DiT's x_t [B, C, H, W], t [B], y [B].
        max_bytes: memory guard of each layer's matrix.

    Returns:
        One A [B, H, N, N] per block, in block order.
    """
    maps, handles = [], []

    def capture(layer, args, kwargs):
        x = args[0]
        grid = kwargs.get("grid", args[1] if len(args) > 1 else None)
        prefix = kwargs.get("num_prefix_tokens", args[2] if len(args) > 2 else 0)
        scale = kwargs.get("pos_scale", args[3] if len(args) > 3 else None)
        maps.append(effective_attention(layer, x, grid, prefix, scale, max_bytes=max_bytes))

    for block in model.blocks:
        handles.append(block.attn.register_forward_pre_hook(capture, with_kwargs=True))
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return maps


def mean_attention_distance(a: torch.Tensor, grid: Sequence[int], num_prefix_tokens: int = 0) -> torch.Tensor:
    """Mean attention distance (the ViT diagnostic), in patches: sum_j w_ij ||p_i - p_j|| averaged over the grid
    queries i, with w_i the query's weights over the grid keys, |A| renormalised to sum 1 (LightNet's A has signed
    entries).

    Args:
        a: [B, H, N, N] effective attention (``effective_attention``).
        grid: (h, w) of the N - num_prefix_tokens grid tokens, row-major.
        num_prefix_tokens: leading tokens, left out as queries and keys.

    Returns:
        [B, H] distances.
    """
    h, w = grid
    p = num_prefix_tokens
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    pos = torch.stack([rows.reshape(-1), cols.reshape(-1)], -1).to(a.device, torch.float64)
    dist = torch.cdist(pos, pos)  # [n, n]
    wts = a[..., p:, p:].abs().double()
    wts = wts / wts.sum(-1, keepdim=True).clamp_min(1e-30)
    return (wts * dist).sum(-1).mean(-1).to(a.dtype)
