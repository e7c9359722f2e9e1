"""Attention layers: x [B, N, C] -> [B, N, C], all called as ``attn(x, grid, num_prefix_tokens, pos_scale)``."""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import (
    check_grid,
    lightnet_attention,
    lightnet_attention_qkvpacked,
    lion_attention_qkvpacked,
    lion_feature_map,
    lion_snake_attention,
    merge_heads,
    normalized_attention,
    rebuilt_in_backward,
    softmax_attention,
    split_heads,
)
from ..ops._checks import BACKENDS, check_choice, check_options, check_pos_scale, compute_dtype
from ..ops.lion import FORMS, GATE_ALIGN, MASK_FEATURE_MAP, gate_columns, log_gates
from ..ops.md_lrpe import lrpe_variant
from ..ops.normalized import FORMS as NORMALIZED_FORMS
from .norm import RMSNorm

ATTENTION_KINDS = (
    "softmax",
    "lightnet",
    "lion_lit",
    "lion_d",
    "lion_s",
    "lion_d_snake",
    "lion_s_snake",
    "normalized",
)


def _check_tokens(x: torch.Tensor, grid: Sequence[int] | None, num_prefix_tokens: int, dim: int, name: str):
    """x must be [B, N, dim] and grid must cover N - num_prefix_tokens tokens; returns the grid as a tuple."""
    if x.dim() != 3 or x.shape[-1] != dim:
        raise ValueError(f"{name}: x must be [B, N, {dim}], got shape {tuple(x.shape)}")
    return check_grid(grid, x.shape[1], num_prefix_tokens)


class _QKV(nn.Module):
    """Fused qkv Linear; splits x [B, N, C] into strided [B, H, N, C/H] views q, k, v."""

    def __init__(self, dim: int, num_heads: int, bias: bool):
        super().__init__()
        if not isinstance(num_heads, int) or num_heads < 1 or dim % num_heads:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return split_heads(self.qkv(x), self.num_heads)

    merge = staticmethod(merge_heads)

    def forward(
        self,
        x: torch.Tensor,
        grid: Sequence[int] | None = None,
        num_prefix_tokens: int = 0,
        pos_scale: Sequence[float] | None = None,
    ) -> torch.Tensor:
        """Attend over the tokens.

        Args:
            x: [B, N, C] tokens, N = num_prefix_tokens + prod(grid).
            grid: the patch grid (h, w) (or any number of axes); None for a plain sequence.
            num_prefix_tokens: leading tokens (cls, registers, conditions) without a grid position.
            pos_scale: per-axis position scale of the grid (``lightvision.layers.position``: training grid / grid in
                image units), read by the kinds whose signals count grid steps (LightNet's MD-LRPE, LION's decays);
                None: token units.

        Returns:
            [B, N, C].
        """
        raise NotImplementedError  # each attention kind implements it (``inspect.getdoc`` gives them this text)


class SoftmaxAttention(_QKV):
    """Multi-head softmax attention (SDPA), DeiT / DiT style (qkv bias, projection with bias). Ignores the grid
    but validates it.

    Args:
        dim, num_heads: width C and heads H (head dim C / H).
        qkv_bias: bias on the q / k / v projection.

    Example:
        >>> SoftmaxAttention(64, 4)(torch.randn(2, 1 + 4 * 4, 64), (4, 4), 1).shape
        torch.Size([2, 17, 64])
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True):
        super().__init__(dim, num_heads, qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, grid=None, num_prefix_tokens: int = 0, pos_scale=None) -> torch.Tensor:
        _check_tokens(x, grid, num_prefix_tokens, self.dim, type(self).__name__)
        q, k, v = self.split(x)
        return self.proj(self.merge(softmax_attention(q, k, v)))


class LightNetAttention(_QKV):
    """LNA (LightNet Fig. 3, Eq. 9; docs/spec.md 1.4): q, k, v = x W (one fused Linear, no bias);
    O = lightnet_attention(q, k, v) with MD-LRPE on the grid; O = RMSNorm(O) * sigmoid(x W_u1 W_u2); out = O W_o.
    With the key softmax (the model), the core runs as ``lightnet_attention_qkvpacked`` on the Linear's output
    and the norm and gate as one fused ``rms_norm`` (Triton on CUDA).

    Args:
        dim, num_heads: width C and heads H (head dim C / H).
        lrpe: MD-LRPE variant, one of ``lightvision.ops.md_lrpe.LRPE_VARIANTS`` ("per_axis" default, "global" the
            printed Eq. 14, "mixed" directions), or "none" / False (the "no LRPE" ablation).
        key_softmax: False is the "no decay" ablation (SiLU keys instead of the softmax over tokens).
        norm: False drops the RMSNorm ("no extra norm").
        gate_rank: None = low rank with rank = head dim (paper); "full" = one full-rank Linear; 0 = no gate;
            an int r > 0 = rank r.
        backend: "auto" | "torch" | "triton".

    Example:
        >>> LightNetAttention(64, 4)(torch.randn(2, 1 + 4 * 4, 64), (4, 4), 1).shape
        torch.Size([2, 17, 64])
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        lrpe: bool | str | None = "per_axis",
        key_softmax: bool = True,
        norm: bool = True,
        gate_rank: int | str | None = None,
        backend: str = "auto",
    ):
        super().__init__(dim, num_heads, bias=False)
        check_choice(backend, BACKENDS, "backend")
        self.lrpe, self.key_softmax, self.backend = lrpe_variant(lrpe), key_softmax, backend
        self.norm = RMSNorm(dim) if norm else nn.Identity()
        if gate_rank is None:
            gate_rank = self.head_dim
        if gate_rank == "full":
            self.gate = nn.Linear(dim, dim, bias=False)
        elif isinstance(gate_rank, int) and not isinstance(gate_rank, bool) and gate_rank >= 0:
            self.gate = (
                nn.Sequential(nn.Linear(dim, gate_rank, bias=False), nn.Linear(gate_rank, dim, bias=False))
                if gate_rank > 0
                else None
            )
        else:
            raise ValueError(f"gate_rank must be None, 'full', 0 or a positive int, got {gate_rank!r}")
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, grid=None, num_prefix_tokens: int = 0, pos_scale=None) -> torch.Tensor:
        grid = _check_tokens(x, grid, num_prefix_tokens, self.dim, type(self).__name__)
        kw = dict(
            grid=grid, num_prefix_tokens=num_prefix_tokens, lrpe=self.lrpe, pos_scale=pos_scale, backend=self.backend
        )
        if self.key_softmax:
            o = lightnet_attention_qkvpacked(self.qkv(x), self.num_heads, **kw)
        else:
            o = self.merge(lightnet_attention(*self.split(x), key_softmax=False, **kw))
        g = self.gate(x) if self.gate is not None else None
        if isinstance(self.norm, RMSNorm):
            y = self.norm(o, g)  # RMSNorm x sigmoid gate, one fused kernel on CUDA
            with rebuilt_in_backward(y, self.norm, o, g):  # the norm keeps o and g: proj keeps no copy of y
                return self.proj(y)
        if g is not None:
            o = o * torch.sigmoid(g)
        return self.proj(o)


class LionAttention(_QKV):
    """LION attention layer (LION Sec. 4; docs/spec.md 1.5): q, k = phi(x W_q), phi(x W_k); Y = lion_attention; out = Y
    W_o.

    phi: LIT elu(x) + 1; D / S normalize(SiLU(x) + 0.5) over the head dim (L2), computed in fp32. Without snake the
    layer runs ``lightvision.ops.lion_attention_qkvpacked`` on the qkv Linear's output (phi inside; its masked
    kernel fuses phi's gradient and the head layouts); with snake, ``lion_feature_map`` then the snake core.
    mask "d": one learnable a per head (per order when snake), lambda = sigmoid(a), log lambda = logsigmoid(a)
    in fp32; initialised with lambda evenly spread over [0.9, 0.99] across heads.
    mask "s": a_m = sigmoid(-(w^T x_m + b)) per head (a Linear(dim, num_heads) per order), log a_m =
    logsigmoid(-(w^T x_m + b)) in fp32; prefix tokens get a = 1 (log 0); b initialised to -logit(0.95) so a ~ 0.95
    at x = 0. Without snake the gate's rows (negated) and the qkv Linear's run as one projection, padded to
    gate_columns(H) gate outputs, whose gate columns the packed core reads (``gates_in_qkv``); with snake the gate
    Linear runs alone, padded to a multiple of GATE_ALIGN outputs. The gate stays in the autograd graph (it is never
    re-wrapped as a new tensor).
    snake: M = (M_row + M_col) / 2 over row- and column-snake orders (2-D grid required), own decays each.
    Position scale (other resolutions, ``lightvision.layers.position``): every log-decay is multiplied by
    f = (prod_j a_j)^(decay_power / k) over the k grid axes: a raster (or snake) step crosses 1 / a of a training
    cell along a row, and a row is 1 / a times longer, so an offset of one image fraction spans about a (power 1,
    along a row) to a^2 (power 2, across rows) times more steps; ``decay_power`` picks the exponent, with snake a pair
    gives the row- and the column-snake order their own. Power 1 is the default: on CIFAR-10 (DeiT-T, 200 epochs,
    trained at 32 px) it gave LION-D 83.4 / 68.3% and LION-S 85.1 / 75.1% top-1 at 48 / 64 px, against 80.0 / 63.6
    and 81.7 / 66.4 with power 2 (benchmarks/results/classify_cifar10_resolution_table_h200x4_20261127.json).
    form: passed to lion_attention ("auto": the kernels' measured rule, ``lightvision.kernels.lion.choose_form``;
    the reference: parallel for N <= 1024, linear-time scan beyond).

    Args:
        dim, num_heads: width C and heads H (head dim C / H).
        mask: "lit" | "d" | "s" (above).
        snake: average the row- and column-snake masks (mask "d" or "s", 2-D grids).
        form: one of ``lightvision.ops.lion.FORMS``.
        qkv_bias: bias on the q / k / v projection.
        decay_power: exponent of the position scale on the log-decays (above), or with snake a (row order, column
            order) pair; 0 keeps token units.
        backend: "auto" | "torch" | "triton".

    Example:
        >>> LionAttention(64, 4, mask="s")(torch.randn(2, 1 + 4 * 4, 64), (4, 4), 1).shape
        torch.Size([2, 17, 64])
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        mask: str = "lit",
        snake: bool = False,
        form: str = "auto",
        qkv_bias: bool = True,
        decay_power: float | Sequence[float] = 1.0,
        backend: str = "auto",
    ):
        super().__init__(dim, num_heads, qkv_bias)
        check_choice(mask, ("lit", "d", "s"), "LION mask")
        orders = 2 if snake else 1
        powers = decay_power if isinstance(decay_power, (list, tuple)) else [decay_power] * orders
        if len(powers) != orders or not all(
            isinstance(p, (int, float)) and not isinstance(p, bool) and 0 <= p <= 4 for p in powers
        ):
            raise ValueError(
                f"decay_power must be a number in [0, 4]{' or a (row, column) pair' if snake else ''}, "
                f"got {decay_power!r}"
            )
        self.decay_power = tuple(float(p) for p in powers)
        check_choice(form, FORMS, "LION form")
        check_choice(backend, BACKENDS, "backend")
        if snake and mask == "lit":
            raise ValueError("snake orders need a decaying mask: use mask='d' or 's' with snake=True")
        self.mask, self.snake, self.form, self.backend = mask, snake, form, backend
        if mask == "d":
            lam = torch.linspace(0.9, 0.99, num_heads) if num_heads > 1 else torch.tensor([0.95])
            self.decay = nn.Parameter(torch.logit(lam).repeat(orders, 1))  # [orders, H]
        elif mask == "s":
            self.gate = nn.Linear(dim, orders * num_heads)
            nn.init.constant_(self.gate.bias, -math.log(0.95 / 0.05))
        self.proj = nn.Linear(dim, dim)

    def _phi(self, x: torch.Tensor) -> torch.Tensor:
        return lion_feature_map(x, MASK_FEATURE_MAP[self.mask], backend=self.backend)

    def decay_factors(self, pos_scale: Sequence[float] | None, grid: tuple[int, ...] | None) -> list[float]:
        """The factor f on the log-decays of each order at a position scale of ``grid`` (class docstring, checked
        against the grid); 1 for None."""
        pos_scale = check_pos_scale(pos_scale, grid)
        if pos_scale is None:
            return [1.0] * len(self.decay_power)
        return [math.prod(pos_scale) ** (p / len(pos_scale)) for p in self.decay_power]

    def _log_decays(self, x: torch.Tensor, num_prefix_tokens: int, factors: list[float]) -> list[torch.Tensor | None]:
        """One log-decay per order, times its factor: [H] for "d", [B, H, N] for "s", None for "lit"."""
        if self.mask == "lit":
            return [None]
        if self.mask == "d":
            log_lam = F.logsigmoid(self.decay.to(compute_dtype(self.decay)))
            return [ld * f for ld, f in zip(log_lam.unbind(0), factors)]
        b, n, _ = x.shape
        w, bias = self.gate.weight, self.gate.bias
        pad = gate_columns(w.shape[0], GATE_ALIGN) - w.shape[0]
        z = F.linear(x, F.pad(w, (0, 0, 0, pad)), F.pad(bias, (0, pad)))[..., : w.shape[0]]
        log_a = log_gates(-z.view(b, n, -1, self.num_heads), num_prefix_tokens)
        return [la * f for la, f in zip(log_a.unbind(1), factors)]  # [B, H, N] each

    def _qkv_gates(self, x: torch.Tensor) -> torch.Tensor:
        """One projection x -> [q, k, v, -(w^T x + b), 0 padding]: [B, N, 3C + gate_columns(H)] (mask "s", no
        snake; the packed core reads the gate logits in place, lion_attention_qkvpacked's gates_in_qkv)."""
        w, b = self.gate.weight, self.gate.bias
        pad = gate_columns(self.num_heads) - self.num_heads
        qkv_b = self.qkv.bias if self.qkv.bias is not None else b.new_zeros(3 * self.dim)
        weight = torch.cat([self.qkv.weight, -w, w.new_zeros(pad, self.dim)])
        return F.linear(x, weight, torch.cat([qkv_b, -b, b.new_zeros(pad)]))

    def forward(self, x: torch.Tensor, grid=None, num_prefix_tokens: int = 0, pos_scale=None) -> torch.Tensor:
        grid = _check_tokens(x, grid, num_prefix_tokens, self.dim, type(self).__name__)
        factors = self.decay_factors(pos_scale, grid)
        if not self.snake:  # phi (and S's gates) inside the packed core: Y and dqkv in the projections' layouts
            if self.mask == "s" and factors == [1.0]:
                y = lion_attention_qkvpacked(
                    self._qkv_gates(x),
                    self.num_heads,
                    mask="s",
                    gates_in_qkv=True,
                    num_prefix_tokens=num_prefix_tokens,
                    form=self.form,
                    backend=self.backend,
                )
            else:
                y = lion_attention_qkvpacked(
                    self.qkv(x),
                    self.num_heads,
                    mask=self.mask,
                    log_decay=self._log_decays(x, num_prefix_tokens, factors)[0],
                    form=self.form,
                    backend=self.backend,
                )
            return self.proj(y)
        if grid is None or len(grid) != 2:
            raise ValueError(f"LionAttention(snake=True) needs a 2-D grid (h, w), got {grid}")
        lds = self._log_decays(x, num_prefix_tokens, factors)
        q, k, v = self.split(x)
        q, k = self._phi(q), self._phi(k)
        o = lion_snake_attention(
            q,
            k,
            v,
            grid=grid,
            num_prefix_tokens=num_prefix_tokens,
            mask=self.mask,
            log_decay_row=lds[0],
            log_decay_col=lds[1],
            form=self.form,
            backend=self.backend,
        )
        return self.proj(self.merge(o))


class NormalizedAttention(_QKV):
    """Normalized attention layer (Sieber et al. Eq. 21, :mod:`lightvision.ops.normalized`): q, k, v = x W (one
    fused Linear), O_i = sum_j (q_i . k_j) v_j / eta_i, out = O W_o.

    eta_i = N exp(w_h^T x_i + b_h) per head h: w_h is the paper's W_eta (a Linear(dim, num_heads), x the layer's
    input token); the bias b_h (not in the paper) lets each head learn its overall scale and starts at
    log sqrt(head_dim), the usual attention scale; the fixed factor N (the token count) makes the sum over tokens a
    mean, so the output scale does not change with the resolution. w starts at zero: every token starts with the
    same normaliser and learns to differ. log eta is computed in fp32 (fp64 stays fp64), also under autocast.
    Prefix tokens are ordinary tokens (their own eta; the grid is validated, not used: no position information).

    Args:
        dim, num_heads: width C and heads H (head dim C / H).
        form: "linear" (q (K^T V), default) or "parallel" (the materialised [N, N] matrix).
        qkv_bias: bias on the q / k / v projection.

    Example:
        >>> NormalizedAttention(64, 4)(torch.randn(2, 1 + 4 * 4, 64), (4, 4), 1).shape
        torch.Size([2, 17, 64])
    """

    def __init__(self, dim: int, num_heads: int, *, form: str = "linear", qkv_bias: bool = True):
        super().__init__(dim, num_heads, qkv_bias)
        check_choice(form, NORMALIZED_FORMS, "normalized attention form")
        self.form = form
        self.normalizer = nn.Linear(dim, num_heads)
        nn.init.zeros_(self.normalizer.weight)
        nn.init.constant_(self.normalizer.bias, 0.5 * math.log(self.head_dim))
        self.proj = nn.Linear(dim, dim)

    def log_eta(self, x: torch.Tensor) -> torch.Tensor:
        """log eta_i = w_h^T x_i + b_h + log N: x [B, N, C] -> [B, H, N] in fp32 (fp64 for fp64 inputs)."""
        dt = compute_dtype(x, self.normalizer.weight)
        with torch.autocast(x.device.type, enabled=False):
            z = F.linear(x.to(dt), self.normalizer.weight.to(dt), self.normalizer.bias.to(dt))
        return (z + math.log(x.shape[1])).transpose(1, 2)

    def forward(self, x: torch.Tensor, grid=None, num_prefix_tokens: int = 0, pos_scale=None) -> torch.Tensor:
        _check_tokens(x, grid, num_prefix_tokens, self.dim, type(self).__name__)
        q, k, v = self.split(x)
        return self.proj(self.merge(normalized_attention(q, k, v, self.log_eta(x), form=self.form)))


_KINDS = {
    "softmax": (SoftmaxAttention, {}),
    "lightnet": (LightNetAttention, {}),
    "lion_lit": (LionAttention, {"mask": "lit"}),
    "lion_d": (LionAttention, {"mask": "d"}),
    "lion_s": (LionAttention, {"mask": "s"}),
    "lion_d_snake": (LionAttention, {"mask": "d", "snake": True}),
    "lion_s_snake": (LionAttention, {"mask": "s", "snake": True}),
    "normalized": (NormalizedAttention, {}),
}


def attention_options(kind: str) -> list[str]:
    """The options an attention kind takes: its class's arguments after (dim, num_heads) that the kind does not fix."""
    check_choice(kind, ATTENTION_KINDS, "attention kind")
    cls, fixed = _KINDS[kind]
    return [name for name in list(inspect.signature(cls.__init__).parameters)[3:] if name not in fixed]


def position_options(kind: str) -> dict:
    """The options of an attention kind that set how its position signals scale with the grid, at their defaults
    (LION's decayed masks: ``decay_power``), for models to record with their weights."""
    check_choice(kind, ATTENTION_KINDS, "attention kind")
    cls, fixed = _KINDS[kind]
    if cls is not LionAttention or fixed["mask"] == "lit":
        return {}
    return {"decay_power": inspect.signature(cls.__init__).parameters["decay_power"].default}


def build_attention(kind: str, dim: int, num_heads: int, **kwargs) -> nn.Module:
    """The attention layer of ``kind``; an option the kind does not take is refused with the ones it does.

    Args:
        kind: one of ``ATTENTION_KINDS``.
        dim, num_heads: width C and heads H.
        **kwargs: options of the kind's class (:func:`attention_options`), e.g. form / backend for LION,
            lrpe / gate_rank for LightNet.

    Returns:
        The layer, ``forward(x [B, N, C], grid, num_prefix_tokens) -> [B, N, C]``.

    Example:
        >>> type(build_attention("lion_d_snake", 64, 4)).__name__
        'LionAttention'
    """
    check_choice(kind, ATTENTION_KINDS, "attention kind")
    cls, fixed = _KINDS[kind]
    clash = set(fixed) & set(kwargs)
    if clash:
        raise ValueError(f"attention kind {kind!r} fixes {sorted(clash)}; do not pass them")
    check_options(kwargs, attention_options(kind), f"attention kind {kind!r}")
    return cls(dim, num_heads, **fixed, **kwargs)
