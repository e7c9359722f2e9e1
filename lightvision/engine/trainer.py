"""The step-based training loop shared by ``lightvision classify train`` and ``lightvision diffusion train``.

Determinism and exact resume:

* data order is a pure function of ``(seed, epoch)`` (accelerate's seedable sampler); a resumed run skips
  the micro-batches of the current epoch that were already consumed;
* before each micro-batch the python / numpy / torch / CUDA generators are seeded from
  ``(seed, step, micro-batch, process)``, so dropout, drop path, mixup... are a pure function of the
  position too, whatever hooks (eval, sampling) or data loading drew in between. This replaces saving and
  restoring generator states and is exact across resumes by construction;
* per-sample draws of the loss (diffusion timesteps and noise) go through
  :func:`~lightvision.engine.batch_random.batch_random`: around each ``loss_fn`` call the trainer makes current a
  :class:`~lightvision.engine.batch_random.BatchRandom` seeded from ``(seed, step, micro-batch)`` only, which
  draws the rows of the whole global micro-batch and hands each process its own. They are then the same for
  any number of processes at a fixed global batch (and as exact across resumes);
* the train state (optimizer, scheduler, grad scaler, step, epoch, position in the epoch, the partial
  logging window, best metric) is checkpointed with the model and EMA weights.

SIGTERM (preemption, ``scancel``) during ``fit`` finishes the current step, checkpoints it on every process
and returns with ``interrupted=True``; a second SIGTERM terminates at once.

Randomness inside DataLoader workers (augmentations) follows the worker seeds, and is replayed after a resume only
when the loader keys it by the sample's slot (:mod:`lightvision.engine.sample_draws`, as the classifier's cpu
pipeline does); the order of samples always is.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, GradientAccumulationPlugin
from torch import nn
from torch.profiler import record_function
from tqdm.auto import tqdm

from lightvision.engine.batch_random import BatchRandom, batch_seed, hashed_seed, use_batch_random
from lightvision.engine.checkpoint import (
    CheckpointError,
    CheckpointManager,
    metric_is_better,
    resolve_checkpoint,
)
from lightvision.engine.compiled import CUDA_GRAPH_MODES, compile_model
from lightvision.engine.config import save_config
from lightvision.engine.ema import ModelEma
from lightvision.engine.gc_pauses import GcPauses
from lightvision.engine.graphed_update import GraphedUpdate, graph_update_blocker
from lightvision.engine.guards import NAN_POLICIES, FiniteWatch, NonFiniteError, check_finite, nonfinite_error
from lightvision.engine.metrics import MetricsLogger
from lightvision.engine.profiling import PREPARE, check_profile_host, check_profile_steps, step_profiler
from lightvision.engine.sample_draws import seed_generators

log = logging.getLogger(__name__)
READ_EVERY = 10  # steps between the host's reads of the device state (nan_policy stop, stop agreement)
PREFETCH_PRIORITIES = ("high", "low")  # of the prefetch threads' CUDA streams against the training step's
TIMING_KEYS = (  # log record keys that vary run to run
    "steps_per_s",
    "input_wait_share",
    "input_prepare_ms",
    "input_prepare_cpu_ms",
    "input_stage_ms",
    "input_stage_cpu_ms",
    "input_wait_max_ms",
    "input_prepare_max_ms",
    "loop_cpu_ms",
    "gc_ms",
    "update_replayed",
)

LossFn = Callable[[nn.Module, Any], "torch.Tensor | dict[str, torch.Tensor]"]
Hook = Callable[["Trainer"], "dict[str, Any] | None"]


def _record_stream(tree: Any, stream: torch.cuda.Stream) -> None:
    """``record_stream`` on every CUDA tensor of a nested batch (dicts, lists, tuples, dataclass fields): its memory
    stays reserved until ``stream`` is done."""
    if isinstance(tree, torch.Tensor):
        if tree.is_cuda:
            tree.record_stream(stream)
    elif isinstance(tree, dict):
        for value in tree.values():
            _record_stream(value, stream)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            _record_stream(value, stream)
    elif dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        for item in dataclasses.fields(tree):
            _record_stream(getattr(tree, item.name), stream)


def set_loader_epoch(loader: Any, epoch: int) -> None:
    """``loader.set_epoch(epoch)``, and ``set_epoch`` of the sampler under every level of nested batch samplers:
    accelerate's stops two levels down, short of the sampler of a multi-process loader that skips batches (the rest
    of an epoch after a resume), which would then draw another epoch's order."""
    loader.set_epoch(epoch)
    node = getattr(loader, "batch_sampler", None)
    while node is not None:
        sampler = getattr(node, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        node = getattr(node, "batch_sampler", None)


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def make_accelerator(
    mixed_precision: str = "no", grad_accum_steps: int = 1, seed: int = 0, cpu: bool = False
) -> Accelerator:
    """The ``Accelerator`` a :class:`Trainer` needs: accumulation without data-loader sync, a sampler seeded with
    ``seed``, so data order is a function of (seed, epoch) and resume is exact, and batches moved to the device
    without waiting for it (from the loaders' page-locked memory: a blocking copy would wait for every step queued
    on the device before the host could queue the next)."""
    return Accelerator(
        mixed_precision=mixed_precision,
        gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=grad_accum_steps, sync_with_dataloader=False),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=seed, non_blocking=True),
        cpu=cpu,
    )


@contextlib.contextmanager
def switch_interval(ms: float | None) -> Iterator[None]:
    """Python's thread switch interval (``sys.setswitchinterval``) at ``ms`` milliseconds inside the block, the
    previous one restored after; None leaves it as it is."""
    if ms is None:
        yield
        return
    previous = sys.getswitchinterval()
    sys.setswitchinterval(ms / 1000)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


class Trainer:
    """Step-based accelerate training loop with checkpoints, EMA, NaN guard, metrics and exact resume.

    Args:
        run_dir: run folder (``config.json``, ``metrics.jsonl``, ``checkpoints/``).
        config: resolved run config, saved in the run folder and in every checkpoint.
        model, optimizer: unprepared; the trainer prepares them with the accelerator.
        scheduler: stepped once per optimizer step (e.g. ``LambdaLR``); ``state_dict`` is checkpointed. May be None.
        train_loader: a map-style ``DataLoader`` (``shuffle=True`` for random order); prepared by the trainer.
        loss_fn: ``loss_fn(model, batch)`` -> loss tensor, or dict with ``"loss"`` plus other scalars to log.
        prepare_batch: ``prepare_batch(batch)`` -> what ``loss_fn`` receives, run on each loader batch under that
            micro-batch's :func:`~lightvision.engine.batch_random.batch_random` draws (e.g. decoding and augmenting
            on the GPU); it must draw from ``batch_random()`` only, not from the global generators. A ``stages``
            attribute (callables applied in turn, e.g. decode then augment) lets ``prefetch`` run them side by side.
        prefetch: run ``prepare_batch`` ahead in background threads (each on a CUDA stream of its own on a GPU), so
            its host work overlaps the running step: one thread per stage, the first stage as many micro-batches
            ahead as there are stages; the results are the same as without.
        prefetch_priority: "low": the training step runs on a CUDA stream of high priority and the prefetch
            threads' kernels take the SMs the step's kernels leave free; "high": the prefetch threads' streams rank
            above the step's (the input's blocks take SMs as soon as any of the step's retire, ahead of the step's
            own). The results are the same either way.
        switch_interval_ms: Python's thread switch interval (``sys.setswitchinterval``) while ``fit`` trains with
            ``prefetch`` threads, restored after; how long the loop's thread may wait for the interpreter lock
            while a prefetch thread holds it. None leaves Python's (5 ms).
        max_steps: optimizer steps to train for; each consumes ``grad_accum_steps`` batches per process.
        model_config: architecture description, stored with checkpoints and checked on resume.
        clip_grad: max gradient norm (None: no clipping; the norm is logged when set).
        ema_decay: keep an fp32 EMA of the weights (None: no EMA), with the warm-up of ``ModelEma``.
        nan_policy: "stop" raises :class:`NonFiniteError` (nothing saved): the device notes the first non-finite
            step and the host reads it every ``READ_EVERY`` steps and before every log, hook and checkpoint, so
            steps run without waiting for the device; "skip" drops the update and goes on (the host waits for the
            device at every step to decide).
        metric_mode: "max" or "min": which hook metric is better (best checkpoint).
        hooks: ``(every, fn)``: ``fn(trainer)`` runs every ``every`` steps on every process and may return
            metrics to log; a ``"metric"`` entry (same value on every process) tracks the best checkpoint,
            and a new best is checkpointed at once.
        accelerator: a ready ``Accelerator`` (e.g. with DDP kwargs or trackers): gradient accumulation of
            ``grad_accum_steps`` not synced with the data loader, seedable sampler; ``mixed_precision`` is then
            the accelerator's. Default: built from ``mixed_precision``, ``grad_accum_steps`` and ``seed``.
        torch_compile: run the prepared model through :func:`~lightvision.engine.compiled.compile_model`
            (checkpoints, EMA and ``unwrapped_model`` see the plain module); a string is the compile mode, e.g.
            "reduce-overhead" (CUDA graphs: one launch per forward / backward for host-bound steps).
        profile_steps: ``(first, count)``: profile optimizer steps first .. first + count - 1 into ``run_dir/profile``
            (a Chrome trace and a summary per process: :mod:`lightvision.engine.profiling`); None: no profile.
        profile_host: False records the device's activity alone in that profile (CUDA): the host keeps its own pace,
            so the summary's device idle time is the run's.
        graph_update: capture the update after the backward (finite watch, clipping, optimizer) as a CUDA graph and
            replay it every step, where it applies (:mod:`lightvision.engine.graphed_update`: CUDA, torch's fused Adam
            or AdamW, ``nan_policy`` stop, no fp16 grad scaler); the same values as the eager update.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        config: dict,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        train_loader: torch.utils.data.DataLoader,
        loss_fn: LossFn,
        *,
        max_steps: int,
        prepare_batch: Callable[[Any], Any] | None = None,
        prefetch: bool = True,
        prefetch_priority: str = "low",
        switch_interval_ms: float | None = None,
        model_config: dict,
        grad_accum_steps: int = 1,
        clip_grad: float | None = None,
        ema_decay: float | None = None,
        mixed_precision: str = "no",
        log_every: int = 50,
        ckpt_every: int = 1000,
        keep_last: int = 3,
        nan_policy: str = "stop",
        seed: int = 0,
        metric_mode: str = "max",
        hooks: Sequence[tuple[int, Hook]] = (),
        accelerator: Accelerator | None = None,
        torch_compile: bool | str = False,
        profile_steps: Sequence[int] | None = None,
        profile_host: bool = True,
        graph_update: bool = True,
    ):
        for name, value in [
            ("max_steps", max_steps),
            ("grad_accum_steps", grad_accum_steps),
            ("log_every", log_every),
            ("ckpt_every", ckpt_every),
        ]:
            _positive(name, value)
        for every, _ in hooks:
            _positive("hook interval", every)
        if nan_policy not in NAN_POLICIES:
            raise ValueError(f"nan_policy must be one of {NAN_POLICIES}, got {nan_policy!r}")
        if graph_update not in (True, False):
            raise ValueError(f"graph_update must be true or false, got {graph_update!r}")
        if prefetch_priority not in PREFETCH_PRIORITIES:
            raise ValueError(f"prefetch_priority must be one of {PREFETCH_PRIORITIES}, got {prefetch_priority!r}")
        self.profile_steps = check_profile_steps(profile_steps, max_steps)
        self._gc_pauses: GcPauses | None = None  # set while fit runs
        if accelerator is None:
            accelerator = make_accelerator(mixed_precision, grad_accum_steps, seed, cpu=not torch.cuda.is_available())
        elif (
            accelerator.gradient_accumulation_steps != grad_accum_steps
            or accelerator.gradient_state.sync_with_dataloader
            or not accelerator.dataloader_config.use_seedable_sampler
        ):
            raise ValueError(
                "the accelerator passed to Trainer must use GradientAccumulationPlugin(num_steps=grad_accum_steps, "
                "sync_with_dataloader=False) and DataLoaderConfiguration(use_seedable_sampler=True, data_seed=...); "
                f"it has num_steps={accelerator.gradient_accumulation_steps}, "
                f"sync_with_dataloader={accelerator.gradient_state.sync_with_dataloader}, "
                f"use_seedable_sampler={accelerator.dataloader_config.use_seedable_sampler}"
            )
        self.accelerator = accelerator
        self.profile_host = check_profile_host(profile_host, accelerator.device if self.profile_steps else None)
        self.run_dir = Path(run_dir)
        self.config = config
        self.model_config = model_config
        self.model, self.optimizer, self.train_loader = accelerator.prepare(model, optimizer, train_loader)
        if torch_compile:
            self.model = compile_model(self.model, None if torch_compile is True else torch_compile)
        self._params = list(self.unwrapped_model.parameters())  # the model's, gathered once for the per-step work
        # the backward's gradients live in CUDA-graph memory that the next micro-batch's replay takes back
        self._grads_in_graphs = (
            torch_compile in CUDA_GRAPH_MODES and grad_accum_steps > 1 and accelerator.device.type == "cuda"
        )
        self.scheduler = scheduler
        self.loss_fn, self.prepare_batch, self.prefetch = loss_fn, prepare_batch, prefetch
        self.prefetch_priority = prefetch_priority
        if switch_interval_ms is not None and not switch_interval_ms > 0:
            raise ValueError(f"switch_interval_ms must be a positive number of milliseconds, got {switch_interval_ms}")
        self.switch_interval_ms = switch_interval_ms
        self.ema = ModelEma(self.unwrapped_model, ema_decay) if ema_decay is not None else None
        self.max_steps, self.grad_accum_steps, self.clip_grad = max_steps, grad_accum_steps, clip_grad
        self.log_every, self.ckpt_every, self.nan_policy = log_every, ckpt_every, nan_policy
        self.seed, self.metric_mode, self.hooks = seed, metric_mode, list(hooks)
        self.checkpoints = CheckpointManager(run_dir, keep_last=keep_last, mode=metric_mode)
        self.metrics = MetricsLogger(run_dir, is_main_process=accelerator.is_main_process)
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.skipped_steps = 0
        self.best_metric: float | None = None
        self._window: dict[str, float | torch.Tensor] = {}  # per-process sums (fp64 on the device between reads)
        self._window_steps = 0
        self.graph_update = graph_update
        self._graphed: GraphedUpdate | None = None  # set while fit runs, where the update is captured
        self._start_timing(time.monotonic())
        self._last_lr = math.nan
        self._stop_requested = False
        self._stop_agreed = False
        stop_watch = nan_policy == "stop"
        self._watch = FiniteWatch(None if accelerator.scaler is not None else self.model) if stop_watch else None

    @property
    def unwrapped_model(self) -> nn.Module:
        return self.accelerator.unwrap_model(self.model, keep_torch_compile=False)

    def _models(self) -> dict[str, nn.Module]:
        models = {"model": self.unwrapped_model}
        if self.ema is not None:
            models["ema"] = self.ema.module
        return models

    def _data_signature(self) -> list[int]:
        """What the meaning of a saved data position depends on."""
        return [self.seed, len(self.train_loader), self.accelerator.num_processes, self.grad_accum_steps]

    def _train_state(self, window: dict[str, float]) -> dict:
        scaler = self.accelerator.scaler
        return {
            "step": self.step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "skipped_steps": self.skipped_steps,
            "best_metric": self.best_metric,
            "window": {"steps": self._window_steps, "sums": window},
            "data_signature": self._data_signature(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": scaler.state_dict() if scaler is not None else None,
        }

    def _restore(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.accelerator.scaler is not None and state["scaler"] is not None:
            self.accelerator.scaler.load_state_dict(state["scaler"])
        self.step, self.epoch, self.batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        self.skipped_steps, self.best_metric = state["skipped_steps"], state["best_metric"]
        self._window, self._window_steps = dict(state["window"]["sums"]), state["window"]["steps"]
        if list(state["data_signature"]) != self._data_signature():
            log.warning(
                "resuming with a different (seed, batches per epoch, processes, grad_accum_steps): %s -> %s; "
                "the data order after resume will not match the original run",
                state["data_signature"],
                self._data_signature(),
            )

    def _resume(self, resume: str | os.PathLike | bool | None) -> None:
        """Load the checkpoint named by ``resume`` (True: the newest loadable one of the run folder)."""
        if resume is None or resume is False:
            existing = self.checkpoints.latest()
            if existing is not None:
                raise CheckpointError(
                    f"{self.run_dir} already holds checkpoint {existing.name}; resume it (resume=True / --resume) "
                    "or choose a new run folder"
                )
            self.metrics.resume(0)
            return
        if resume is True:
            latest = self.checkpoints.latest()
            if latest is None:
                log.info("no checkpoint in %s; starting from scratch", self.run_dir)
                self.metrics.resume(0)
                return
            candidates = [latest] + [p for p in reversed(self.checkpoints.checkpoints()) if p != latest]
        else:
            candidates = [resolve_checkpoint(resume)]
        errors = []
        for ckpt in candidates:
            try:
                state = self.checkpoints.load(
                    ckpt,
                    models=self._models(),
                    expected_model_config=self.model_config,
                    map_location=self.accelerator.device,
                )
            except CheckpointError as e:
                errors.append(str(e))
                log.warning("cannot resume from %s: %s", ckpt, e)
                continue
            self._restore(state)
            self.metrics.resume(self.step)
            log.info("resumed from %s at step %d (epoch %d)", ckpt, self.step, self.epoch)
            return
        raise CheckpointError("no loadable checkpoint to resume from:\n" + "\n".join(errors))

    def _batches(self) -> Iterator[tuple[Any, tuple[int, int]]]:
        """Endless stream of ``(batch, (epoch, batch_in_epoch))`` over epochs from the saved position; the position
        is the data state once the batch is consumed (:meth:`_train_step` records it then)."""
        epoch, index = self.epoch, self.batch_in_epoch
        while True:
            loader = self.train_loader
            if index:
                loader = self.accelerator.skip_first_batches(loader, index)
            set_loader_epoch(loader, epoch)
            empty = True
            for batch in loader:
                empty = False
                index += 1
                yield batch, (epoch, index)
            if empty and index == 0:
                raise ValueError("train_loader yields no batches (dataset smaller than one batch with drop_last?)")
            epoch, index = epoch + 1, 0

    def _draws(self, step: int, micro: int) -> BatchRandom:
        acc = self.accelerator
        return BatchRandom(batch_seed(self.seed, step, micro), acc.process_index, acc.num_processes)

    def _prepared(self, batches: Iterator[tuple[Any, tuple[int, int]]], count: int) -> Iterator[tuple[Any, Any]]:
        """The next ``count`` micro-batches of ``batches`` through ``prepare_batch``, each under the draws of the
        (step, micro-batch) it will train (:meth:`_stages` in turn, sharing those draws).

        With ``prefetch`` each stage runs on a background thread of its own (and a CUDA stream of its own on a GPU,
        above the step's where ``prefetch_priority`` is "high"): a batch's stages follow one another, consecutive
        batches' stages overlap (stage 1 of batch j + 1 beside stage 2 of batch j), and the first stage runs as many
        batches ahead as there are stages. The loader is read on this thread only (its iteration may synchronise
        processes)."""
        if self.prepare_batch is None:
            for _ in range(count):
                yield next(batches)
            return
        first, accum, stages = self.step, self.grad_accum_steps, self._stages()

        def run(i: int, value: Any, draws: BatchRandom, spent: tuple) -> tuple[Any, tuple]:
            """Stage i of a batch, and ``spent`` (the (wall, CPU) seconds of each earlier stage) with this stage's on
            the calling thread appended."""
            wall, cpu = time.perf_counter(), time.thread_time()
            with use_batch_random(draws), record_function(PREPARE):
                out = stages[i](value)
            return out, (*spent, (time.perf_counter() - wall, time.thread_time() - cpu))

        def draws(j: int) -> BatchRandom:
            return self._draws(first + j // accum, j % accum)

        if not self.prefetch:
            for j in range(count):
                value, position = next(batches)
                drawn, spent = draws(j), ()
                for i in range(len(stages)):
                    value, spent = run(i, value, drawn, spent)
                self._note_prepare(spent)
                yield value, position
            return
        device = self.accelerator.device
        # low: the step's stream ranks above these (_step_stream), so the input's kernels fill the SMs the step's
        # kernels leave free; high: they take SMs as the step's blocks retire, ahead of the step's own blocks
        priority = -1 if self.prefetch_priority == "high" else 0
        streams = [torch.cuda.Stream(device, priority=priority) if device.type == "cuda" else None for _ in stages]

        def on_stream(i: int, value: Any, after: Any, drawn: BatchRandom, spent: tuple) -> tuple:
            """Stage i on its stream once ``after`` (the previous stage's event, or the loader's copies) is reached
            -> (output, seconds so far, its own event)."""
            stream = streams[i]
            if stream is None:
                return *run(i, value, drawn, spent), None
            with torch.cuda.stream(stream):
                stream.wait_event(after)
                _record_stream(value, stream)
                out, spent = run(i, value, drawn, spent)
                done = torch.cuda.Event()
                done.record(stream)
            return out, spent, done

        def after_previous(i: int, previous: Any, drawn: BatchRandom) -> tuple:
            value, spent, after = previous.result()  # the same batch's stage i - 1, on its thread
            return on_stream(i, value, after, drawn, spent)

        def submit(pools: list[ThreadPoolExecutor], j: int) -> tuple[Any, Any]:
            batch, position = next(batches)
            loaded = None
            if streams[0] is not None:
                loaded = torch.cuda.Event()
                loaded.record(torch.cuda.current_stream(device))
            drawn = draws(j)
            future = pools[0].submit(on_stream, 0, batch, loaded, drawn, ())
            for i in range(1, len(stages)):
                future = pools[i].submit(after_previous, i, future, drawn)
            return future, position

        with contextlib.ExitStack() as stack:
            pools = [
                stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix=f"prepare_batch_{i}"))
                for i in range(len(stages))
            ]
            pending = collections.deque(submit(pools, j) for j in range(min(len(stages), count)))
            for j in range(count):
                future, position = pending.popleft()
                batch, seconds, ready = future.result()
                self._note_prepare(seconds)
                if j + len(stages) < count:
                    pending.append(submit(pools, j + len(stages)))
                if ready is not None:  # the step's stream waits for the batch and keeps its memory while in use
                    current = torch.cuda.current_stream(device)
                    current.wait_event(ready)
                    _record_stream(batch, current)
                yield batch, position

    def _stages(self) -> tuple[Callable[[Any], Any], ...]:
        """``prepare_batch.stages`` (callables applied in turn, together equal to the call) or the one call."""
        stages = tuple(getattr(self.prepare_batch, "stages", ()) or (self.prepare_batch,))
        if not all(callable(stage) for stage in stages):
            raise TypeError(f"prepare_batch.stages must be callables, got {stages!r}")
        return stages

    def _note_prepare(self, seconds: tuple[tuple[float, float], ...]) -> None:
        """Add one ``prepare_batch`` call's (wall, thread CPU) seconds, stage by stage, to the log window."""
        walls, cpus, calls, longest = self._prepare_times
        self._prepare_times = [
            [a + b for a, b in itertools.zip_longest(walls, (w for w, _ in seconds), fillvalue=0.0)],
            [a + b for a, b in itertools.zip_longest(cpus, (c for _, c in seconds), fillvalue=0.0)],
            calls + 1,
            max(longest, sum(w for w, _ in seconds)),
        ]

    def _seed_micro_batch(self, micro: int) -> None:
        """Seed python's, numpy's and torch's CPU and CUDA generators from (seed, step, micro-batch, process), so
        dropout and drop path draw the same after a resume: what ``accelerate.utils.set_seed`` seeds on a CPU or CUDA
        run, without its per-call cost (about 0.1 ms a step, most of it in ``torch.manual_seed``'s compile guard)."""
        seed = hashed_seed(self.seed, self.step, micro, self.accelerator.process_index, nbytes=4)
        seed_generators(seed)
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(seed)

    def _train_step(self, batches: Iterator[Any]) -> None:
        """One optimizer step over ``grad_accum_steps`` micro-batches; updates the logging window."""
        acc = self.accelerator
        if not self.model.training:  # after an evaluation hook; walking every module each step costs host time
            self.model.train()
        totals: dict[str, torch.Tensor] = {}
        for micro in range(self.grad_accum_steps):
            waited = time.perf_counter()
            batch, (self.epoch, self.batch_in_epoch) = next(batches)
            waited = time.perf_counter() - waited
            self._input_wait += waited
            self._input_wait_max = max(self._input_wait_max, waited)
            self._seed_micro_batch(micro)
            with acc.accumulate(self.model), use_batch_random(self._draws(self.step, micro)):
                out = self.loss_fn(self.model, batch)
                losses = out if isinstance(out, dict) else {"loss": out}
                if "loss" not in losses:
                    raise KeyError(f"loss_fn returned a dict without 'loss' (keys: {sorted(losses)})")
                acc.backward(losses["loss"])
            if self._grads_in_graphs and micro < self.grad_accum_steps - 1:
                self._own_grads()
            for key, value in losses.items():
                value = torch.as_tensor(value, device=acc.device).detach().float().mean() / self.grad_accum_steps
                totals[key] = totals[key] + value if key in totals else value
        step = self.step + 1
        lr = self.optimizer.param_groups[0]["lr"]
        finite = True
        if self._graphed is not None:
            norm = self._graphed(totals["loss"])
        elif self._watch is not None:  # the watch is read at the next boundary (_read_device_state)
            norm = self._update(totals["loss"], step)
        else:  # nan_policy skip: every process decides from the mean loss and its (all-reduced) gradients
            loss = acc.reduce(totals["loss"].detach().reshape(1), reduction="mean")[0]
            finite = check_finite(loss, None if acc.scaler is not None else self.model, step, "skip")
            norm = self._update(None, step) if finite else None
        if finite:
            if self.ema is not None and not acc.optimizer_step_was_skipped:  # one multi-tensor lerp, after the update
                self.ema.update(self.model, self.step)
            if norm is not None:
                totals["grad_norm"] = norm.detach().float()
            for key, value in totals.items():
                self._window[key] = self._window.get(key, 0.0) + value.detach().double()
            self._window_steps += 1
        else:
            self.skipped_steps += 1
            log.warning(
                "step %d: non-finite loss or gradients (loss=%s); skipping the update (nan_policy=skip, "
                "%d skipped so far)",
                step,
                float(loss),
                self.skipped_steps,
            )
        self.optimizer.zero_grad(set_to_none=True)
        if self.scheduler is not None:
            self.scheduler.step()
        self.step = step
        self._last_lr = lr

    def _own_grads(self) -> None:
        """Copy the gradients out of the memory of the compiled backward's CUDA graph (one multi-tensor program):
        torch's CUDA-graph trees hand that memory to the next micro-batch's forward and fail the backward that
        accumulates into it."""
        params = [p for p in self._params if p.grad is not None]
        for param, grad in zip(params, torch._foreach_mul([p.grad for p in params], 1.0)):
            param.grad = grad

    def _update(self, loss: torch.Tensor | None, step: int | torch.Tensor) -> torch.Tensor | None:
        """The update of optimizer step ``step`` (1-based; an int, or a 0-d device tensor where it is captured) after
        its backward: the finite watch's note of ``loss`` (policy stop), gradient clipping and the optimizer. Returns
        the gradient norm where ``clip_grad`` is set, else None."""
        acc = self.accelerator
        if self._watch is not None:
            self._watch.note(loss, step)
        norm = acc.clip_grad_norm_(self.model.parameters(), self.clip_grad) if self.clip_grad is not None else None
        self.optimizer.step()
        return norm

    def _graphed_update(self) -> GraphedUpdate | None:
        """The captured update for this ``fit`` (``graph_update``), or None where it does not apply (logged on CUDA)."""
        if not self.graph_update:
            return None
        acc = self.accelerator
        blocker = graph_update_blocker(acc, self.optimizer, self.nan_policy)
        if blocker is not None:
            if acc.device.type == "cuda":
                log.info("train.graph_update: the update runs eagerly: %s", blocker)
            return None
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)  # torch's, inside accelerate's wrapper
        return GraphedUpdate(self._update, optimizer, self._params, self.step, acc.device)

    def _window_sums(self) -> dict[str, float]:
        """The logged values' sums since the last record, each the mean over the processes (one device read)."""
        if not self._window:
            return {}
        keys, device = list(self._window), self.accelerator.device
        sums = torch.stack([torch.as_tensor(self._window[k], dtype=torch.float64, device=device) for k in keys])
        return dict(zip(keys, self.accelerator.reduce(sums, reduction="mean").tolist()))

    def _read_device_state(self) -> None:
        """The host's read of what the steps since the last one left on the device, at a boundary every process
        reaches at the same step: the first non-finite step (policy stop: logged and raised, nothing saved) and
        whether any process asked to stop."""
        acc = self.accelerator
        first = self._watch.first() if self._watch is not None else None
        self._stop_agreed = self._stop_requested
        if acc.num_processes > 1:
            flags = torch.tensor([float(self._stop_requested), float(first is not None)], device=acc.device)
            any_stop, any_bad = acc.reduce(flags, reduction="sum").tolist()
            self._stop_agreed = any_stop > 0
            if any_bad and first is None:
                error = NonFiniteError(
                    f"non-finite training state on another process by step {self.step}; this state was not saved"
                )
                log.error("%s", error)
                raise error
        if first is not None:
            error = nonfinite_error(*first)
            self.metrics.log(first[0], {"event": "non_finite", "error": str(error)})
            log.error("%s", error)
            raise error

    def _at_boundary(self) -> bool:
        """Whether the host reads the device state after this step: every ``READ_EVERY`` steps, before a log, hook
        or checkpoint, at the last step, and (one process) when a stop was asked for."""
        s = self.step
        return (
            s % READ_EVERY == 0
            or s % self.log_every == 0
            or s % self.ckpt_every == 0
            or s == self.max_steps
            or any(s % every == 0 for every, _ in self.hooks)
            or (self.accelerator.num_processes == 1 and self._stop_requested)
        )

    def _flush_window(self) -> dict[str, Any]:
        """Mean of the logged values since the last record, the rate and ``input_wait_share``: the share of the
        window's wall time this process's loop spent waiting for its next batch (the loader's, and the batch's
        preparation where it is not ready ahead): near 0 the model sets the rate, near 1 the input does, and
        ``input_wait_max_ms``, the longest of those waits (one stall, or a wait spread over the steps). With a
        ``prepare_batch``: ``input_prepare_ms``, its mean wall time per batch on the threads that run it (its
        stages summed), ``input_prepare_max_ms`` the longest, and ``input_prepare_cpu_ms``, those threads' CPU time
        in it (the rest they waited: for the GIL, or for the device where they synchronise), and with ``stages``
        ``input_stage_ms`` / ``input_stage_cpu_ms``, the same per stage (each on a thread of its own with prefetch:
        the slowest sets the pace the input can keep); ``loop_cpu_ms``: the training loop thread's CPU milliseconds
        per step (near the wall time per step, the host sets the rate; the autograd engine's device thread and the
        preparation's threads are not in it); ``gc_ms``: the garbage
        collector's collections in the window (wall milliseconds, every thread waits for them); ``update_replayed``
        (``graph_update``): the share of the window's steps whose update was the captured graph's replay."""
        now = time.monotonic()
        start_step, start_time = self._window_start
        elapsed = max(now - start_time, 1e-9)
        loop_cpu = time.thread_time() - self._loop_cpu_start
        record = (
            {k: total / self._window_steps for k, total in self._window_sums().items()} if self._window_steps else {}
        )
        record.update(
            epoch=self.epoch,
            lr=self._last_lr,
            skipped_steps=self.skipped_steps,
            steps_per_s=(self.step - start_step) / elapsed,
            input_wait_share=round(min(self._input_wait / elapsed, 1.0), 4),
            input_wait_max_ms=round(1000 * self._input_wait_max, 3),
            loop_cpu_ms=round(1000 * loop_cpu / max(self.step - start_step, 1), 3),
        )
        walls, cpus, calls, longest = self._prepare_times
        if calls:
            record.update(
                input_prepare_ms=round(1000 * sum(walls) / calls, 3),
                input_prepare_max_ms=round(1000 * longest, 3),
                input_prepare_cpu_ms=round(1000 * sum(cpus) / calls, 3),
            )
            if len(walls) > 1:  # stage by stage: which of the prefetch threads sets the pace
                record.update(
                    input_stage_ms=[round(1000 * w / calls, 3) for w in walls],
                    input_stage_cpu_ms=[round(1000 * c / calls, 3) for c in cpus],
                )
        if self._gc_pauses is not None:
            record.update(gc_ms=round(1000 * self._gc_pauses.take(), 3))
        if self._graphed is not None:
            replays = self._graphed.replays - self._replays_start
            record.update(update_replayed=round(replays / max(self.step - start_step, 1), 4))
        self._window, self._window_steps = {}, 0
        self._start_timing(now)
        return record

    def _start_timing(self, now: float) -> None:
        """Start the timed part of a log window at ``now`` (``time.monotonic()``) and the current step."""
        self._window_start = (self.step, now)
        self._loop_cpu_start = time.thread_time()  # of the calling thread: the training loop's
        self._input_wait = 0.0  # host seconds the steps of the window waited for their next batch
        self._input_wait_max = 0.0  # the longest of those waits
        # prepare_batch's wall and thread CPU seconds per stage, calls and longest wall seconds, of the window
        self._prepare_times: list = [[], [], 0, 0.0]
        self._replays_start = self._graphed.replays if self._graphed is not None else 0

    def _save(self, metric: float | None = None, is_best: bool = False) -> None:
        acc = self.accelerator
        acc.wait_for_everyone()
        window = self._window_sums()
        if acc.is_main_process:
            path = self.checkpoints.save(
                self.step,
                models=self._models(),
                model_config=self.model_config,
                train_state=self._train_state(window),
                metric=metric,
                is_best=is_best,
                config=self.config,
            )
            log.info("saved %s", path)
        acc.wait_for_everyone()

    def fit(self, resume: str | os.PathLike | bool | None = None) -> dict[str, Any]:
        """Train until ``max_steps``.

        ``resume``: None/False starts fresh (refused if the run folder has checkpoints); True continues from
        the newest loadable checkpoint if any (falling back to older ones if it is damaged); a path continues
        from that checkpoint or run folder. Returns the final step, ``steps_run`` (steps trained by this call: 0
        when the run was already finished), epoch, best metric, the last logged record and ``interrupted``: True
        when a SIGTERM stopped training early (after checkpointing).
        """
        acc = self.accelerator
        self._resume(resume)
        if acc.is_main_process:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            save_config(self.config, self.run_dir / "config.json")
        in_main_thread = threading.current_thread() is threading.main_thread()
        previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm) if in_main_thread else None
        try:
            return self._fit()
        finally:
            if in_main_thread:
                signal.signal(signal.SIGTERM, previous_handler)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        """First SIGTERM: checkpoint after the current step and stop; a second one terminates (default action)."""
        log.warning("SIGTERM: checkpointing after the current step, then stopping")
        self._stop_requested = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    @property
    def _prefetch_threads(self) -> bool:
        """Whether ``fit`` prepares batches on background threads."""
        return self.prefetch and self.prepare_batch is not None

    def _switch_interval(self) -> contextlib.AbstractContextManager:
        """``switch_interval_ms`` in force while prefetch threads run, Python's own restored after."""
        return switch_interval(self.switch_interval_ms if self._prefetch_threads else None)

    @contextlib.contextmanager
    def _step_stream(self) -> Iterator[None]:
        """With ``prefetch_priority`` "low" on CUDA (and prefetch threads): the training loop's work on a stream of
        high priority, ordered after the work queued before it and before the work queued after it."""
        device = self.accelerator.device
        if not (self._prefetch_threads and self.prefetch_priority == "low" and device.type == "cuda"):
            yield
            return
        before, stream = torch.cuda.current_stream(device), torch.cuda.Stream(device, priority=-1)
        stream.wait_stream(before)
        try:
            with torch.cuda.stream(stream):
                yield
        finally:
            before.wait_stream(stream)

    def _fit(self) -> dict[str, Any]:
        acc = self.accelerator
        remaining = max(0, self.max_steps - self.step) * self.grad_accum_steps
        record: dict[str, Any] = {}
        first_step = self.step
        self._graphed = self._graphed_update()
        self._start_timing(time.monotonic())
        profiler = None
        if self.profile_steps is not None:
            profile_dir = self.run_dir / "profile"
            profiler = step_profiler(*self.profile_steps, self.step, profile_dir, acc.process_index, self.profile_host)
        with (
            GcPauses() as self._gc_pauses,
            self._switch_interval(),
            self._step_stream(),
            profiler if profiler is not None else contextlib.nullcontext(),
            contextlib.closing(self._prepared(self._batches(), remaining)) as batches,
            tqdm(
                total=self.max_steps,
                initial=self.step,
                disable=not acc.is_main_process,
                desc="train",
                dynamic_ncols=True,
            ) as progress,
        ):
            while self.step < self.max_steps:
                self._train_step(batches)
                if profiler is not None:
                    profiler.step()
                progress.update(1)
                if self._at_boundary():
                    self._read_device_state()
                if self.step % self.log_every == 0 or self.step == self.max_steps:
                    record = self._flush_window()
                    self.metrics.log(self.step, record)
                    if "loss" in record:
                        progress.set_postfix(loss=f"{record['loss']:.4g}", lr=f"{record['lr']:.3g}")
                metric, is_best = None, False
                for every, hook in self.hooks:
                    if self.step % every == 0:
                        out = hook(self) or {}
                        if out:
                            self.metrics.log(self.step, out)
                        if out.get("metric") is not None:
                            metric = float(out["metric"])
                            is_best = metric_is_better(metric, self.best_metric, self.metric_mode)
                if is_best:
                    self.best_metric = metric
                if is_best or self.step % self.ckpt_every == 0 or self.step == self.max_steps or self._stop_agreed:
                    self._save(metric, is_best)
                if self._stop_agreed:
                    log.warning("stopped at step %d on SIGTERM; checkpoint saved, resume to continue", self.step)
                    break
        self._gc_pauses = self._graphed = None
        return {
            "step": self.step,
            "steps_run": self.step - first_step,
            "epoch": self.epoch,
            "skipped_steps": self.skipped_steps,
            "best_metric": self.best_metric,
            "interrupted": self._stop_agreed,
            "last_record": record,
        }
