"""One builder for a kernel's differentiable entry: the forward / backward custom ops that torch.compile traces
without graph breaks, and the eager ``torch.autograd.Function`` over the same launchers (the custom-op dispatch
costs tens of microseconds of host time per call, longer than the kernels at ViT sizes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch


class AutogradOps(NamedTuple):
    """The two custom ops (``lightvision::<name>_fwd`` / ``_bwd``), the eager Function (``eager.apply``) and the
    differentiable entry ``call(*inputs)`` -> the results: the forward op while torch.compile traces, else the eager
    Function."""

    fwd: torch.library.CustomOpDef
    bwd: torch.library.CustomOpDef
    eager: type[torch.autograd.Function]
    call: Callable


def _as_tuple(x) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def autograd_ops(
    name: str,
    fwd: Callable,
    fwd_fake: Callable,
    bwd: Callable,
    bwd_fake: Callable,
    save: Callable[[tuple, tuple], tuple[tuple, tuple]],
    passthrough: int = 0,
    results: int = 1,
) -> AutogradOps:
    """Custom ops over ``fwd`` and ``bwd`` (their type annotations are the op schemas; ``*_fake`` their meta
    implementations), the forward op's autograd formula, the eager Function, and the entry that picks between them.

    ``fwd(*inputs)`` returns the result, or a tuple whose first ``results`` elements are the results (the outputs
    with gradients; the eager Function returns them, one tensor or a tuple) and the rest what the backward needs.
    ``save(inputs, outputs)`` (outputs always a tuple) -> (tensors to save, other arguments); the backward is
    ``bwd(*d_results, *tensors, *arguments)`` (a result unused downstream gets a zero gradient), whose output (one
    tensor or a tuple) holds the gradients of the leading inputs; the remaining inputs, and those that are not tensors
    (an optional tensor passed as None), get None.

    The first ``passthrough`` inputs are added to the first result as they are (a residual): their gradient is that
    result's gradient cast to their dtypes, here (a custom op may not return its input, so ``bwd`` would have to copy
    it), and ``bwd``'s output starts with the gradient of the input after them."""
    fwd_op = torch.library.custom_op(f"lightvision::{name}_fwd", fwd, mutates_args=())
    fwd_op.register_fake(fwd_fake)
    bwd_op = torch.library.custom_op(f"lightvision::{name}_bwd", bwd, mutates_args=())
    bwd_op.register_fake(bwd_fake)

    def setup_context(ctx, inputs, output):
        tensors, ctx.args = save(tuple(inputs), _as_tuple(output))
        ctx.save_for_backward(*tensors)
        ctx.is_tensor = tuple(isinstance(x, torch.Tensor) for x in inputs)
        ctx.passthrough_dtypes = tuple(x.dtype for x in inputs[:passthrough])

    def gradients(ctx, d_result, grads) -> tuple:
        grads = tuple(d_result.to(dtype) for dtype in ctx.passthrough_dtypes) + _as_tuple(grads)
        return tuple(grads[i] if i < len(grads) and t else None for i, t in enumerate(ctx.is_tensor))

    def backward(ctx, *d_outputs):
        d_results = d_outputs[:results]
        return gradients(ctx, d_results[0], bwd_op(*d_results, *ctx.saved_tensors, *ctx.args))

    fwd_op.register_autograd(backward, setup_context=setup_context)

    class Eager(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            output = _as_tuple(fwd(*inputs))
            setup_context(ctx, inputs, output)
            return output[0] if results == 1 else output[:results]

        @staticmethod
        def backward(ctx, *d_results):
            return gradients(ctx, d_results[0], bwd(*d_results, *ctx.saved_tensors, *ctx.args))

    Eager.__name__ = Eager.__qualname__ = f"{name}_eager"

    def call(*inputs):
        if torch.compiler.is_compiling():
            output = _as_tuple(fwd_op(*inputs))
            return output[0] if results == 1 else output[:results]
        return Eager.apply(*inputs)

    return AutogradOps(fwd_op, bwd_op, Eager, call)
