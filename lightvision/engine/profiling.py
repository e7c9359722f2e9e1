"""Profiling a window of training steps: a Chrome trace and a summary of where a step's time goes.

``Trainer(profile_steps=(first, count))`` (recipes: ``train.profile_steps: [first, count]``) runs optimizer steps
``first`` .. ``first + count - 1`` under ``torch.profiler``, every thread included where this torch can (the thread
that prepares the next batch, :data:`PREPARE`, is the one that matters), and writes into ``RUN/profile/``:

- ``trace_<process>.json``: the timeline (chrome://tracing or https://ui.perfetto.dev);
- ``summary_<process>.json``: per step, the training loop's wall milliseconds, ``prepare_batch``'s host milliseconds
  on its thread, the device milliseconds of the kernels each of them launched, and the largest host ops (self time)
  and kernels of each; and the device's timeline (:func:`device_timeline`): how much of a step the device ran
  something, and how long it sat idle in gaps.

``Trainer(profile_host=False)`` (``train.profile_host: false``, CUDA) records the device's activity alone: the host
then runs at its own pace (recording every host op makes each step's host time several times longer), so the
summary's idle time is the run's own - the time the device waited for the host to issue the next work.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

log = logging.getLogger(__name__)

PREPARE = "prepare_batch"  # the record_function range around each call of the Trainer's prepare_batch
LOOP = "loop"  # everything else: the training loop's own thread (and the autograd engine's)
TOP = 12  # ops and kernels listed per group
DEVICE_EVENTS = ("kernel", "gpu_memcpy", "gpu_memset")  # the trace's categories of work on the device
GAP_US = 50  # an idle stretch at least this long counts as a gap (shorter ones: launch spacing between kernels)


def check_profile_steps(value: Any, last_step: int) -> tuple[int, int] | None:
    """``[first, count]`` (whole numbers from 1, the window ending by ``last_step``) as a tuple, or None; ValueError
    naming what is wrong otherwise."""
    if value is None:
        return None
    ok = isinstance(value, list | tuple) and len(value) == 2 and all(isinstance(v, int) and v >= 1 for v in value)
    if not ok:
        raise ValueError(f"train.profile_steps must be [first, count], two whole numbers from 1, got {value!r}")
    first, count = int(value[0]), int(value[1])
    if first + count - 1 > last_step:
        raise ValueError(
            f"train.profile_steps {[first, count]} ends after the run's last step ({last_step}): profile earlier steps"
        )
    return first, count


def _all_threads() -> dict[str, Any]:
    """``experimental_config`` that profiles every thread, where this torch has the switch (else {})."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return {"experimental_config": _ExperimentalConfig(profile_all_threads=True)}
    except (ImportError, TypeError):
        return {}


def check_profile_host(host: Any, device: torch.device | None) -> bool:
    """``train.profile_host``: True, or False (the device's activity alone) where the profile runs on a CUDA
    ``device`` (None: no profile); ValueError otherwise."""
    if not isinstance(host, bool):
        raise ValueError(f"train.profile_host must be true or false, got {host!r}")
    if not host and device is not None and device.type != "cuda":
        raise ValueError(
            f"train.profile_host=false records the device's activity alone, which needs CUDA (here: {device.type})"
        )
    return host


def step_profiler(first: int, count: int, done: int, out_dir: Path, process: int, host: bool = True) -> profile | None:
    """A ``torch.profiler.profile`` to enter around the training loop and ``.step()`` after each optimizer step, whose
    active steps are ``first`` .. ``first + count - 1`` when ``done`` steps were trained before the loop starts (one
    warm-up step before them where there is room); None (and a warning) when ``first`` is already past. ``host``
    False records the device's activity only (CUDA)."""
    lead = first - done - 1  # profiler steps before the first active one
    if lead < 0:
        log.warning("train.profile_steps starts at step %d, this run resumes after step %d: not profiled", first, done)
        return None
    activities = ([ProfilerActivity.CPU] if host else []) + (
        [ProfilerActivity.CUDA] if torch.cuda.is_available() else []
    )
    threads = _all_threads() if host else {}

    def write(prof: profile) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        trace = out_dir / f"trace_{process}.json"
        prof.export_chrome_trace(str(trace))
        summary = {"steps": [first, first + count - 1], "host_profiled": host, "all_threads": bool(threads)}
        if host:
            summary.update(summarize(prof.events(), count))
        summary["device_timeline"] = device_timeline(json.loads(trace.read_text()), count)
        (out_dir / f"summary_{process}.json").write_text(json.dumps(summary, indent=2))
        log.info("profiled steps %d-%d: %s", first, first + count - 1, out_dir)

    return profile(
        activities=activities,
        schedule=schedule(wait=max(0, lead - 1), warmup=min(1, lead), active=count, repeat=1),
        on_trace_ready=write,
        **threads,
    )


def _group(event: Any) -> str:
    """:data:`PREPARE` when ``event`` ran inside a ``prepare_batch`` range, else :data:`LOOP`."""
    while event is not None:
        if event.name == PREPARE:
            return PREPARE
        event = event.cpu_parent
    return LOOP


def _top(totals: dict[str, float], steps: int) -> list[list]:
    """[name, milliseconds per step] of the largest ``TOP`` entries of ``totals`` (microseconds)."""
    ranked = sorted(totals.items(), key=lambda item: -item[1])[:TOP]
    return [[name, round(us / 1000 / steps, 4)] for name, us in ranked]


def summarize(events: Any, steps: int) -> dict[str, Any]:
    """Per step: the device ms of everything that ran on the device, and per group the host ms (the loop: the
    profiler's step ranges, wall; ``prepare_batch``: its ranges on its thread), the device ms of the kernels its ops
    launched (a kernel the profiler links to no op, e.g. inside a replayed CUDA graph, counts in the total only) and
    its largest host ops (self time) and kernels; from the profiler's events (``prof.events()``) of ``steps`` steps."""
    host: dict[str, float] = defaultdict(float)
    ops: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    device: dict[str, float] = defaultdict(float)
    kernels: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    device_total = 0.0
    for event in events:
        if event.device_type != torch.autograd.DeviceType.CPU:
            device_total += event.time_range.elapsed_us()
            continue
        if event.name.startswith("ProfilerStep"):
            host[LOOP] += event.cpu_time_total
            continue
        group = _group(event)
        if event.name == PREPARE:
            host[PREPARE] += event.cpu_time_total
            continue
        ops[group][event.name] += event.self_cpu_time_total
        for kernel in event.kernels:
            device[group] += kernel.duration
            kernels[group][kernel.name] += kernel.duration
    out: dict[str, Any] = {"device_ms_per_step": round(device_total / 1000 / steps, 4)}  # kernels, copies, all streams
    for group in (LOOP, PREPARE):
        out[group] = {
            "host_ms_per_step": round(host[group] / 1000 / steps, 4),
            "device_ms_per_step": round(device[group] / 1000 / steps, 4),
            "top_host_ops": _top(ops[group], steps),
            "top_kernels": _top(kernels[group], steps),
        }
    return out


def busy_and_gaps(intervals: list[tuple[float, float]]) -> tuple[float, float, list[float]]:
    """(span, busy time, idle gaps) of ``intervals`` [(start, end)], in their unit: span from the first start to the
    last end, busy the length of their union, the gaps the idle stretches between its pieces."""
    if not intervals:
        return 0.0, 0.0, []
    ordered = sorted(intervals)
    busy, gaps = 0.0, []
    start, end = ordered[0]
    for a, b in ordered[1:]:
        if a > end:
            busy += end - start
            gaps.append(a - end)
            start, end = a, b
        else:
            end = max(end, b)
    busy += end - start
    return end - ordered[0][0], busy, gaps


def device_timeline(trace: dict[str, Any], steps: int) -> dict[str, float] | None:
    """From a Chrome trace of ``steps`` steps (:meth:`torch.profiler.profile.export_chrome_trace`'s JSON): per step,
    the milliseconds from the device's first work to its last (``span``), those it ran something on any stream
    (``busy``), those it sat idle, and those of idle gaps of at least ``GAP_US`` microseconds (the rest is the
    spacing of back-to-back launches), with the longest gaps; None without device work in the trace."""
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    spans = [
        (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        for e in events
        if e.get("ph") == "X" and e.get("cat") in DEVICE_EVENTS and "dur" in e
    ]
    if not spans:
        return None
    span, busy, gaps = busy_and_gaps(spans)
    per_step = 1000.0 * steps
    return {
        "span_ms_per_step": round(span / per_step, 4),
        "busy_ms_per_step": round(busy / per_step, 4),
        "idle_ms_per_step": round((span - busy) / per_step, 4),
        "gaps_ms_per_step": round(sum(g for g in gaps if g >= GAP_US) / per_step, 4),
        "longest_gaps_ms": [round(g / 1000.0, 3) for g in sorted(gaps, reverse=True)[:5]],
    }
