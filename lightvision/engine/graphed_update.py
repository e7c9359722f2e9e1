"""``train.graph_update``: the update after the backward, captured once as a CUDA graph and replayed every step.

After its backward, an optimizer step runs the finite watch (a norm per gradient), gradient clipping and the
optimizer: a few multi-tensor kernels, and on the host a walk over every parameter (the optimizer's state lookups) and
some twenty tensor calls, at each of which the training loop's thread gives up the interpreter lock to the threads
that prepare the input and must then win it back. Replayed as one CUDA graph, the update is a single launch. (The
EMA's update follows it eagerly: one multi-tensor lerp, whose weight changes every step; taken into the graph, it would
need the weight in device memory and three passes over the weights instead of one.)

What changes from step to step reaches the graph in device memory: the step number (a device counter that the update
advances), each parameter group's learning rate (written from the group's float before each step, read by the fused
AdamW from the device) and the loss (copied in). The gradients are read where the backward leaves them: a graph
replays only for the addresses it was captured with. The backward's CUDA graphs (``train.compile_mode=reduce-overhead``)
leave every gradient at the same address each step; the caching allocator of an eager backward may cycle through a few
sets of addresses, so a set is captured the second time it comes, up to ``MAX_GRAPHS`` graphs sharing one memory pool,
and a step whose gradients lie elsewhere runs the same update eagerly. Eager and replayed steps compute the same
values, so a resumed run matches an uninterrupted one whichever of its steps were replayed.

It applies on CUDA to torch's Adam and AdamW with ``fused=True`` (the recipes' default there), with
``nan_policy=stop``, without the fp16 grad scaler, on one process or with DDP (:func:`graph_update_blocker`).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Sequence

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType

__all__ = ["GraphedUpdate", "graph_update_blocker"]

log = logging.getLogger(__name__)

MAX_GRAPHS = 4  # graphs per fit, one per set of gradient addresses; steps at other addresses run eagerly


def graph_update_blocker(accelerator: Accelerator, optimizer: torch.optim.Optimizer, nan_policy: str) -> str | None:
    """Why the update of a run cannot be captured (a phrase for the log), or None when it can.

    Args:
        accelerator: the run's accelerator (device, grad scaler, distribution).
        optimizer: the optimizer, or accelerate's wrapper of it.
        nan_policy: the Trainer's ``nan_policy``.
    """
    inner = getattr(optimizer, "optimizer", optimizer)
    if accelerator.device.type != "cuda":
        return f"the run is on {accelerator.device.type}, not CUDA"
    if nan_policy != "stop":
        return f"nan_policy={nan_policy} decides every step on the host"
    if accelerator.scaler is not None:
        return "the fp16 grad scaler decides every step on the host"
    if accelerator.distributed_type not in (DistributedType.NO, DistributedType.MULTI_GPU):
        return f"the update of {accelerator.distributed_type.value} is not captured"
    if type(inner) not in (torch.optim.Adam, torch.optim.AdamW) or not all(g["fused"] for g in inner.param_groups):
        return f"the optimizer is {type(inner).__name__} without fused=True, not torch's fused Adam or AdamW"
    return None


class GraphedUpdate:
    """``update(loss, step)`` with its per-step values in device memory: eager at first, captured as a CUDA graph for a
    set of gradient addresses the second time the gradients lie there, replayed whenever they lie there again.

    Args:
        update: ``update(loss, step)`` -> a tensor or None (e.g. the gradient norm): the step's update, given the loss
            and the 1-based step as 0-d device tensors; it must read nothing else that changes between steps but the
            gradients of ``params`` and the parameter groups' ``lr``, and must call ``optimizer``'s ``step``.
        optimizer: torch's fused Adam or AdamW (:func:`graph_update_blocker`); during ``update`` each group's ``lr`` is
            a device scalar and ``capturable`` is true, both restored after.
        params: the parameters whose gradients ``update`` reads.
        step: the optimizer steps done so far; the first call runs step ``step + 1``.
        device: the CUDA device.
    """

    def __init__(
        self,
        update: Callable[[torch.Tensor, torch.Tensor], torch.Tensor | None],
        optimizer: torch.optim.Optimizer,
        params: Sequence[torch.Tensor],
        step: int,
        device: torch.device,
    ):
        self._update, self._optimizer, self._params = update, optimizer, list(params)
        self._loss = torch.zeros((), device=device)
        self._step = torch.full((), step, dtype=torch.int64, device=device)
        self._lrs = torch.zeros(len(optimizer.param_groups), device=device)
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor | None]] = {}  # key: (graph, its output)
        self._seen: collections.deque[tuple] = collections.deque(maxlen=2 * MAX_GRAPHS)  # recent eager steps' keys
        self._pool: tuple | None = None  # the graphs' shared memory pool: one runs at a time, its outputs kept
        self._capturing = True  # False after a capture failed or MAX_GRAPHS are taken
        self.replays = self.eager_steps = 0

    def _key(self) -> tuple:
        """What a captured graph assumes: the optimizer's state and hyperparameters, and where each gradient lies."""
        groups = self._optimizer.param_groups
        hyper = tuple((g["betas"], g["weight_decay"], g["eps"], g["amsgrad"], g["maximize"]) for g in groups)
        grads = tuple(0 if p.grad is None else p.grad.data_ptr() for p in self._params)
        return id(self._optimizer.state), hyper, grads

    def __call__(self, loss: torch.Tensor) -> torch.Tensor | None:
        """Run the next step's update for ``loss`` (a 0-d tensor on the device); returns what ``update`` returns (a
        tensor the next replay of its graph overwrites: read it first)."""
        key = self._key()
        lrs = torch.tensor([g["lr"] for g in self._optimizer.param_groups], dtype=torch.float32)
        self._lrs.copy_(lrs, non_blocking=True)  # from pageable memory: staged at once, no wait for the device
        self._loss.copy_(loss.detach().reshape(()))
        graph = self._graphs.get(key)
        if graph is None and self._capturing and key in self._seen:
            graph = self._capture(key)
        if graph is None:
            self._seen.append(key)
            self.eager_steps += 1
            return self._run()
        graph[0].replay()
        self.replays += 1
        return graph[1]

    def _run(self) -> torch.Tensor | None:
        """The update with the device scalars: eager, or recorded while a capture is under way."""
        self._step.add_(1)
        groups = self._optimizer.param_groups
        saved = [(g["lr"], g["capturable"]) for g in groups]
        for i, group in enumerate(groups):
            group["lr"], group["capturable"] = self._lrs[i], True
        try:
            return self._update(self._loss, self._step)
        finally:
            for group, (lr, capturable) in zip(groups, saved):
                group["lr"], group["capturable"] = lr, capturable

    def _capture(self, key: tuple) -> tuple[torch.cuda.CUDAGraph, torch.Tensor | None] | None:
        """Capture ``_run`` as the graph for ``key`` on a stream of the current one's priority, or None: past
        ``MAX_GRAPHS``, or when the capture fails (the update stays eager for the rest of the fit, with a warning
        naming the reason)."""
        if len(self._graphs) == MAX_GRAPHS:
            self._capturing = False
            log.warning(
                "train.graph_update: the gradients came back at more than %d sets of addresses; the steps at the "
                "others run the update eagerly",
                MAX_GRAPHS,
            )
            return None
        device = self._step.device
        graph = torch.cuda.CUDAGraph()
        try:
            stream = torch.cuda.Stream(device, priority=torch.cuda.current_stream(device).priority)
            with torch.cuda.graph(graph, pool=self._pool, stream=stream, capture_error_mode="thread_local"):
                out = self._run()
        except RuntimeError as error:
            self._capturing = False
            torch.cuda.synchronize(device)
            log.warning("train.graph_update: the update runs eagerly, its capture failed: %s", error)
            return None
        self._pool = graph.pool()
        self._graphs[key] = (graph, out)
        return self._graphs[key]
