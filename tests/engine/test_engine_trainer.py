"""Trainer: exact in-process resume, damaged-checkpoint fallback, hooks and best checkpoint; EMA; metrics log."""

from __future__ import annotations

import json
import time

import pytest
import torch
from torch import nn

from lightvision.engine import (
    CheckpointError,
    CheckpointManager,
    MetricsLogger,
    ModelEma,
    load_model_weights,
    read_checkpoint_config,
)
from lightvision.engine.profiling import busy_and_gaps, device_timeline
from lightvision.engine.trainer import _record_stream
from lightvision.kernels.resize import PackedImages
from train_tiny import MODEL_CONFIG, TinyNet, build


def losses(run_dir) -> list[tuple]:
    return [(r["step"], r["loss"], r["rmse"], r["lr"]) for r in MetricsLogger(run_dir).records() if "loss" in r]


def weights(module: nn.Module) -> dict:
    return {k: v.clone() for k, v in module.state_dict().items()}


def test_resume_matches_uninterrupted_run(tmp_path):
    reference = build(tmp_path / "ref", 10, log_every=4)
    reference.fit()
    build(tmp_path / "run", 7, log_every=4).fit()
    resumed = build(tmp_path / "run", 10, log_every=4)
    resumed.fit(resume=tmp_path / "run" / "checkpoints" / "step_0000006")  # mid-epoch, mid logging window
    assert losses(tmp_path / "run") == losses(tmp_path / "ref")
    assert [s for s, *_ in losses(tmp_path / "ref")] == [4, 8, 10]
    for a, b in [(reference.unwrapped_model, resumed.unwrapped_model), (reference.ema.module, resumed.ema.module)]:
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert (resumed.epoch, resumed.step) == (reference.epoch, reference.step)
    ema = TinyNet()
    load_model_weights(tmp_path / "run", ema)
    trained_ema = resumed.ema.module.state_dict().values()
    assert all(torch.equal(x, y.cpu()) for x, y in zip(ema.state_dict().values(), trained_ema))
    assert read_checkpoint_config(tmp_path / "run")["model_config"] == MODEL_CONFIG
    assert json.loads((tmp_path / "run" / "config.json").read_text()) == {"recipe": "tiny"}


def test_resume_true_skips_damaged_latest(tmp_path, caplog):
    build(tmp_path, 6).fit()
    model_file = tmp_path / "checkpoints" / "step_0000006" / "model.safetensors"
    model_file.write_bytes(model_file.read_bytes()[:-3])
    trainer = build(tmp_path, 8)
    trainer.fit(resume=True)
    assert "cannot resume from" in caplog.text and "truncated" in caplog.text
    assert [r["step"] for r in MetricsLogger(tmp_path).records()] == list(range(1, 9))
    assert trainer.step == 8


def test_fresh_start_refuses_existing_run(tmp_path):
    build(tmp_path, 3).fit()
    with pytest.raises(CheckpointError, match="already holds checkpoint step_0000003; resume it"):
        build(tmp_path, 6).fit()


def test_resume_true_without_checkpoint_starts_fresh(tmp_path):
    assert build(tmp_path, 2).fit(resume=True)["step"] == 2


def test_eval_hook_metric_saves_best(tmp_path):
    scores = iter([0.5, 0.9, 0.7])
    calls = []

    def evaluate(trainer):
        calls.append(trainer.step)
        return {"metric": next(scores), "top1": 1.0}

    build(tmp_path, 6, ckpt_every=100, hooks=[(2, evaluate)], metric_mode="max").fit()
    manager = CheckpointManager(tmp_path)
    assert calls == [2, 4, 6]
    assert [p.name for p in manager.checkpoints()] == ["step_0000002", "step_0000004", "step_0000006"]
    assert manager.best_metric() == 0.9
    assert json.loads((manager.best() / "manifest.json").read_text())["step"] == 4
    assert [r["metric"] for r in MetricsLogger(tmp_path).records() if "metric" in r] == [0.5, 0.9, 0.7]


def test_each_micro_batch_seeds_what_accelerate_set_seed_seeds(tmp_path):
    """The Trainer's own per-step seeding leaves python's, numpy's and torch's generators as accelerate's ``set_seed``
    of the same hashed seed does (dropout draws as before), and a step after an evaluation trains in train mode."""
    import random

    import numpy as np
    from accelerate.utils import set_seed

    from lightvision.engine.batch_random import hashed_seed

    trainer = build(tmp_path, 4)
    trainer.step = 3
    states = []
    same = hashed_seed(trainer.seed, 3, 1, trainer.accelerator.process_index, nbytes=4)
    for seed in (lambda: trainer._seed_micro_batch(1), lambda: set_seed(same)):
        random.seed(99)  # other states first
        np.random.seed(99)
        torch.manual_seed(99)
        seed()
        states.append((random.random(), np.random.rand(), torch.rand(3)))
    (a, b, c), (x, y, z) = states
    assert (a, b) == (x, y) and torch.equal(c, z)
    trainer._seed_micro_batch(0)
    assert torch.rand(3).tolist() != c.tolist()  # another micro-batch, other draws

    modes = []
    hooked = build(tmp_path / "hooked", 4, hooks=[(2, lambda tr: tr.model.eval() and None)])
    inner = hooked.loss_fn
    hooked.loss_fn = lambda model, batch: modes.append(model.training) or inner(model, batch)
    hooked.fit()
    assert len(modes) >= 4 and all(modes) and not hooked.model.training  # train mode again after each hook


def test_log_says_how_long_the_loop_waited_for_its_input(tmp_path):
    """input_wait_share: the share of a log window's wall time spent getting the next batch - most of it when the
    batch's preparation is slower than the step (prefetched or not), little when the step is the slow part.
    input_prepare_ms / input_prepare_cpu_ms: prepare_batch's wall and CPU time per batch on its thread - a
    preparation that waits (sleeps) shows wall time without CPU time, one that computes shows both. loop_cpu_ms: the
    same for the training loop's own thread, per step."""
    import time

    from train_tiny import tiny_loss

    def slow_input(batch):
        time.sleep(0.03)
        return batch

    def busy_input(batch):
        end = time.perf_counter() + 0.03
        while time.perf_counter() < end:
            pass
        return batch

    def slow_step(model, batch):
        time.sleep(0.03)
        return tiny_loss(model, batch)

    def busy_step(model, batch):
        end = time.perf_counter() + 0.03
        while time.perf_counter() < end:
            pass
        return tiny_loss(model, batch)

    runs = {}
    cases = (
        ("input", {"prepare_batch": slow_input}),
        ("busy", {"prepare_batch": busy_input, "prefetch": False}),
        ("step", {"loss_fn": slow_step}),
        ("busy_step", {"loss_fn": busy_step}),
    )
    for name, kwargs in cases:
        build(tmp_path / name, 4, log_every=2, ckpt_every=100, **kwargs).fit()
        runs[name] = [r for r in MetricsLogger(tmp_path / name).records() if "loss" in r]
        shares = [r["input_wait_share"] for r in runs[name]]
        assert [r["step"] for r in runs[name]] == [2, 4] and all(0.0 <= s <= 1.0 for s in shares)
    assert runs["input"][-1]["input_wait_share"] > 0.6  # (on a GPU the first window also holds its start-up)
    assert max(r["input_wait_share"] for r in runs["step"]) < 0.4
    # CPU time: near none while sleeping; while spinning, the thread's share of a busy test machine's cores
    prepared = {
        name: [(r["input_prepare_ms"], r["input_prepare_cpu_ms"]) for r in runs[name]] for name in ("input", "busy")
    }
    assert all(wall >= 29 and cpu < 5 for wall, cpu in prepared["input"]), prepared
    assert all(wall >= 29 and cpu > 8 for wall, cpu in prepared["busy"]), prepared
    assert all("input_prepare_ms" not in r for r in runs["step"])  # no prepare_batch: nothing to time
    # the longest wait and preparation of a window: each prefetched 30 ms preparation is waited for in part
    assert all(r["input_prepare_max_ms"] >= r["input_prepare_ms"] >= 29 for r in runs["input"]), runs["input"]
    assert all(r["input_wait_max_ms"] > 10 for r in runs["input"]), runs["input"]
    assert all(r["input_wait_max_ms"] < 25 for r in runs["step"]), runs["step"]  # the loader's batches are ready
    # the loop thread's CPU per step (two micro-batches of 30 ms): little while its step sleeps, most while it spins
    assert all(r["loop_cpu_ms"] < 30 for r in runs["step"]), runs["step"]
    assert all(r["loop_cpu_ms"] > 16 for r in runs["busy_step"]), runs["busy_step"]


def test_log_times_each_stage_of_a_staged_preparation(tmp_path):
    """input_stage_ms / input_stage_cpu_ms: a staged prepare_batch's wall and CPU time per batch, stage by stage (each
    on a prefetch thread of its own): a stage that sleeps shows wall time without CPU time, one that spins both; they
    sum to input_prepare_ms. A preparation of one stage logs no per-stage times."""
    import time

    class SleepThenSpin:
        def sleep(self, batch):
            time.sleep(0.03)
            return batch

        def spin(self, batch):
            end = time.perf_counter() + 0.015
            while time.perf_counter() < end:
                pass
            return batch

        @property
        def stages(self):
            return self.sleep, self.spin

        def __call__(self, batch):
            return self.spin(self.sleep(batch))

    build(tmp_path / "staged", 4, log_every=2, ckpt_every=100, prepare_batch=SleepThenSpin()).fit()
    records = [r for r in MetricsLogger(tmp_path / "staged").records() if "loss" in r]
    for r in records:
        (sleep, spin), (sleep_cpu, spin_cpu) = r["input_stage_ms"], r["input_stage_cpu_ms"]
        assert sleep >= 29 and sleep_cpu < 5 and spin >= 14 and spin_cpu > 4, r
        assert sleep + spin == pytest.approx(r["input_prepare_ms"], abs=0.01)
    build(tmp_path / "one", 2, log_every=2, ckpt_every=100, prepare_batch=SleepThenSpin().sleep).fit()
    assert "input_stage_ms" not in MetricsLogger(tmp_path / "one").records()[-1]


def test_model_ema_update():
    model = nn.Linear(3, 2)
    ema = ModelEma(model, decay=0.75, warmup=False)
    start = weights(ema.module)
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update(model, step=0)
    assert torch.allclose(ema.module.weight, 0.75 * start["weight"] + 0.25 * model.weight)
    assert ema.module.weight.dtype == torch.float32 and not ema.module.weight.requires_grad
    with pytest.raises(ValueError, match="decay"):
        ModelEma(model, 1.0)


def test_model_ema_gathers_its_lists_once_and_follows_in_place_updates(monkeypatch):
    """The update walks the modules at its first call only; later steps follow the optimizer's in-place updates,
    copy the buffers, cast a bf16 model's parameters, and a new source model is walked anew."""
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    ema = ModelEma(model, decay=0.5, warmup=False)
    ema.update(model, step=0)
    walks = []
    monkeypatch.setattr(nn.Module, "parameters", lambda *a, **k: walks.append(1) or iter(()))
    for step in range(1, 3):
        start = weights(ema.module)
        with torch.no_grad():
            model[0].weight.add_(1.0)
            model[1].running_mean.add_(2.0)
        ema.update(model, step=step)
        assert torch.allclose(ema.module[0].weight, 0.5 * start["0.weight"] + 0.5 * model[0].weight)
        assert torch.equal(ema.module[1].running_mean, model[1].running_mean)
    assert not walks
    monkeypatch.undo()
    other = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2)).to(torch.bfloat16)
    start = weights(ema.module)
    ema.update(other, step=3)
    assert torch.allclose(ema.module[0].weight, 0.5 * start["0.weight"] + 0.5 * other[0].weight.float())
    assert ema.module[0].weight.dtype == torch.float32


def test_model_ema_warmup_follows_a_short_run_then_reaches_the_decay():
    model = nn.Linear(3, 2)
    ema = ModelEma(model, decay=0.9999)
    assert ema.decay_at(0) == pytest.approx(0.1) and ema.decay_at(10) == pytest.approx(11 / 20)
    assert ema.decay_at(10**6) == 0.9999
    start = weights(ema.module)
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update(model, step=0)
    assert torch.allclose(ema.module.weight, 0.1 * start["weight"] + 0.9 * model.weight)


def test_metrics_logger_resume_drops_later_and_torn_records(tmp_path):
    logger = MetricsLogger(tmp_path)
    for step in range(1, 6):
        logger.log(step, {"loss": float(step)})
    with open(logger.path, "a") as f:
        f.write('{"step": 6, "lo')
    logger.resume(3)
    assert [r["step"] for r in logger.records()] == [1, 2, 3]
    MetricsLogger(tmp_path / "other", is_main_process=False).log(1, {"loss": 1.0})
    assert not (tmp_path / "other").exists()


def test_foreign_accelerator_must_match(tmp_path):
    from accelerate import Accelerator

    with pytest.raises(ValueError, match="sync_with_dataloader=False.*use_seedable_sampler=False"):
        build(tmp_path, 2, accelerator=Accelerator(cpu=True, gradient_accumulation_steps=2))


def test_compiled_model_trains_like_eager_and_saves_plain_weights(tmp_path):
    """``torch_compile=True``: the same losses as eager (Inductor told to draw dropout masks like eager), and
    checkpoints without ``_orig_mod.`` prefixes that load into a plain model and resume an eager run."""
    import torch._inductor.config as inductor_config
    from safetensors.torch import load_file

    eager = build(tmp_path / "eager", 6)
    eager.fit()
    compiled = build(tmp_path / "compiled", 6, torch_compile=True)
    with inductor_config.patch(fallback_random=True):
        compiled.fit()
    assert type(compiled.model).__name__ == "OptimizedModule" and type(compiled.unwrapped_model) is TinyNet
    for (step, *a), (step_c, *b) in zip(losses(tmp_path / "eager"), losses(tmp_path / "compiled"), strict=True):
        assert step == step_c and a == pytest.approx(b, rel=1e-5, abs=1e-7)
    keys = set(load_file(tmp_path / "compiled" / "checkpoints" / "step_0000006" / "model.safetensors"))
    assert keys == set(TinyNet().state_dict()) and not any("_orig_mod" in k for k in keys)
    resumed = build(tmp_path / "compiled", 8)
    resumed.fit(resume=True)
    assert resumed.step == 8


def test_compile_mode_reaches_torch_compile(tmp_path, monkeypatch):
    """``torch_compile="reduce-overhead"`` compiles in that mode (True: torch's default); the recipes' keys map to it,
    and a mode without ``train.compile`` or an unknown mode is one clear error."""
    from lightvision.engine import trainer as trainer_module
    from lightvision.engine.compiled import compile_setting

    modes = []
    monkeypatch.setattr(trainer_module, "compile_model", lambda model, mode=None: modes.append(mode) or model)
    build(tmp_path / "a", 2, torch_compile="reduce-overhead")
    build(tmp_path / "b", 2, torch_compile=True)
    assert modes == ["reduce-overhead", None]
    assert compile_setting(True, None) is True and compile_setting(False, None) is False
    assert compile_setting(True, "max-autotune") == "max-autotune"
    with pytest.raises(ValueError, match="set train.compile=true"):
        compile_setting(False, "reduce-overhead")
    with pytest.raises(ValueError, match="must be one of default, reduce-overhead"):
        compile_setting(True, "fast")


def noisy_inputs(threads: list[str]):
    """A ``prepare_batch`` that adds noise from the micro-batch's draws and records the thread it ran on."""
    import threading

    from lightvision.engine import batch_random

    def prepare(batch):
        threads.append(threading.current_thread().name)
        inputs, target = batch
        return inputs + 0.5 * batch_random().randn_like(inputs), target

    return prepare


class StagedNoise:
    """A two-stage ``prepare_batch`` (noise, then scaled noise, from the same draws) recording each stage's thread;
    calling it runs both stages in turn."""

    def __init__(self, threads: list[str]):
        self.noise, self.threads, self.scaled_on = noisy_inputs(threads), threads, set()

    def scaled(self, batch):
        import threading

        from lightvision.engine import batch_random

        self.threads.append(threading.current_thread().name)
        self.scaled_on.add(threading.current_thread().name)
        inputs, target = batch
        return inputs * (1 + 0.1 * batch_random().rand_like(inputs)), target

    @property
    def stages(self):
        return self.noise, self.scaled

    def __call__(self, batch):
        return self.scaled(self.noise(batch))


@pytest.mark.parametrize("staged", [False, True], ids=["one_call", "two_stages"])
@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "inline"])
def test_prepare_batch_ahead_trains_and_resumes_like_inline(tmp_path, prefetch, staged):
    """Prefetched batches (each stage of a staged prepare_batch on its own thread, its stages sharing the
    micro-batch's draws) train and resume exactly as the same preparation called inline on the loop's thread."""
    threads: list[str] = []
    prepared = StagedNoise if staged else noisy_inputs
    reference = build(tmp_path / "ref", 10, log_every=2, prepare_batch=prepared([]).__call__, prefetch=False)
    reference.fit()
    first = prepared(threads)
    build(tmp_path / "run", 6, log_every=2, prepare_batch=first, prefetch=prefetch).fit()
    resumed = build(tmp_path / "run", 10, log_every=2, prepare_batch=prepared(threads), prefetch=prefetch)
    resumed.fit(resume=True)  # from step 6: mid-epoch (7 batches per epoch, 2 per step)
    assert losses(tmp_path / "run") == losses(tmp_path / "ref")
    assert (resumed.epoch, resumed.batch_in_epoch) == (reference.epoch, reference.batch_in_epoch)
    assert all(
        torch.equal(a, b)
        for a, b in zip(reference.unwrapped_model.state_dict().values(), resumed.unwrapped_model.state_dict().values())
    )
    assert len(threads) == (40 if staged else 20)  # one call per stage and micro-batch trained, none beyond
    assert all(name.startswith("prepare_batch") for name in threads) == prefetch
    if prefetch and staged:  # stage i on thread i
        assert {name.rsplit("_", 1)[0] for name in first.scaled_on} == {"prepare_batch_1"}
        assert {name.rsplit("_", 1)[0] for name in threads} == {"prepare_batch_0", "prepare_batch_1"}
    plain = build(tmp_path / "plain", 10, log_every=2)
    plain.fit()
    assert losses(tmp_path / "plain") != losses(tmp_path / "ref")  # the prepared inputs were what trained


def test_prepare_batch_errors_reach_the_training_loop(tmp_path):
    def broken(batch):
        raise ValueError("no image of the batch could be decoded")

    with pytest.raises(ValueError, match="could be decoded"):
        build(tmp_path, 4, prepare_batch=broken).fit()


def test_profile_steps_write_a_trace_and_a_summary_per_step(tmp_path, caplog):
    """train.profile_steps: the window's trace and summary; the prepare thread's time is its own group (where this
    torch profiles every thread); a window past the run is refused, a resumed run past its start is not profiled."""
    slow = noisy_inputs([])

    def prepare(batch):
        time.sleep(0.004)  # host time on the prepare thread, not in the loop's ops
        return slow(batch)

    trainer = build(tmp_path, 6, prepare_batch=prepare, prefetch=True, profile_steps=[3, 2])
    trainer.fit()
    out = tmp_path / "profile"
    trace = json.loads((out / "trace_0.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert any(str(n).startswith("ProfilerStep#") for n in names)
    summary = json.loads((out / "summary_0.json").read_text())
    assert summary["steps"] == [3, 4]
    loop, prepared = summary["loop"], summary["prepare_batch"]
    assert loop["host_ms_per_step"] > 0 and loop["top_host_ops"]
    if trainer.accelerator.device.type == "cpu":
        assert loop["device_ms_per_step"] == 0
    ops = [name for name, _ in loop["top_host_ops"]]
    assert "aten::addmm" in ops and "prepare_batch" not in ops
    if summary["all_threads"]:  # two micro-batches a step, each prepared after a 4 ms sleep (some cut by the window)
        assert prepared["host_ms_per_step"] >= 4 and prepared["top_host_ops"]
    with pytest.raises(ValueError, match=r"profile_steps \[5, 3\] ends after the run's last step \(6\)"):
        build(tmp_path / "late", 6, profile_steps=[5, 3])
    with pytest.raises(ValueError, match="must be \\[first, count\\], two whole numbers from 1"):
        build(tmp_path / "bad", 6, profile_steps=[0, 2])
    resumed = build(tmp_path, 8, profile_steps=[2, 2])
    with caplog.at_level("WARNING"):
        resumed.fit(resume=True)
    assert "resumes after step 6: not profiled" in caplog.text
    assert summary["host_profiled"] is True
    if trainer.accelerator.device.type == "cpu":  # no device work in the trace
        assert summary["device_timeline"] is None
        with pytest.raises(ValueError, match="profile_host=false records the device's activity alone, which needs"):
            build(tmp_path / "device_only", 6, profile_steps=[3, 2], profile_host=False)
    with pytest.raises(ValueError, match="profile_host must be true or false, got 'no'"):
        build(tmp_path / "word", 6, profile_host="no")
    assert build(tmp_path / "unprofiled", 6, profile_host=False).profile_host is False  # no profile: any device


def test_device_timeline_measures_busy_idle_and_gaps():
    """The device's timeline from a trace: the union of its work on every stream, idle time, and the gaps at least
    ``GAP_US`` long (host events and shorter spacing are not gaps)."""
    assert busy_and_gaps([]) == (0.0, 0.0, [])
    assert busy_and_gaps([(5.0, 7.0)]) == (2.0, 2.0, [])
    span, busy, gaps = busy_and_gaps([(0.0, 10.0), (4.0, 12.0), (100.0, 110.0), (30.0, 40.0), (111.0, 112.0)])
    assert (span, busy, gaps) == (112.0, 33.0, [18.0, 60.0, 1.0])
    events = [  # two steps: kernels on two streams, a copy, a memset, and host events that do not count
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0, "dur": 1000, "args": {"stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "crop", "ts": 500, "dur": 800, "args": {"stream": 20}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "copy", "ts": 1310, "dur": 90},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1400, "dur": 5000},
        {"ph": "X", "cat": "gpu_memset", "name": "zero", "ts": 3400, "dur": 600},
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 9000},
    ]
    timeline = device_timeline({"traceEvents": events}, 2)
    assert timeline == {
        "span_ms_per_step": 2.0,
        "busy_ms_per_step": 0.995,
        "idle_ms_per_step": 1.005,
        "gaps_ms_per_step": 1.0,
        "longest_gaps_ms": [2.0, 0.01],
    }
    assert device_timeline({"traceEvents": events[3:4]}, 2) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_profile_summary_splits_device_time_between_the_loop_and_prepare_batch(tmp_path):
    build(tmp_path, 6, prepare_batch=noisy_inputs([]), profile_steps=[3, 2], data_device="cuda").fit()
    summary = json.loads((tmp_path / "profile" / "summary_0.json").read_text())
    loop, prepared = summary["loop"], summary["prepare_batch"]
    assert loop["device_ms_per_step"] > 0 and loop["top_kernels"]
    assert summary["device_ms_per_step"] >= loop["device_ms_per_step"] + prepared["device_ms_per_step"] - 1e-3
    if summary["all_threads"]:  # the noise of the prepared batches is drawn on the device
        assert prepared["device_ms_per_step"] > 0 and prepared["top_kernels"]
    timeline = summary["device_timeline"]
    assert 0 < timeline["busy_ms_per_step"] <= timeline["span_ms_per_step"]
    device_only = tmp_path / "device_only"  # profile_host false: the device's timeline, no host ops
    build(
        device_only, 6, prepare_batch=noisy_inputs([]), profile_steps=[3, 2], data_device="cuda", profile_host=False
    ).fit()
    summary = json.loads((device_only / "profile" / "summary_0.json").read_text())
    assert summary["host_profiled"] is False and "loop" not in summary
    assert summary["device_timeline"]["busy_ms_per_step"] > 0
    trace = json.loads((device_only / "profile" / "trace_0.json").read_text())
    assert not any(e.get("cat") == "cpu_op" for e in trace["traceEvents"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_prefetch_priority_ranks_the_step_or_the_input_first(tmp_path):
    """prefetch_priority "high": the prefetch threads' streams rank above the step's; "low": the step runs on a stream
    ranking above theirs (a lower number is a higher priority). The losses are the same either way."""
    from train_tiny import tiny_loss

    seen: dict[str, set[int]] = {}
    noisy = noisy_inputs([])

    def prepare(batch):
        seen.setdefault("input", set()).add(torch.cuda.current_stream().priority)
        return noisy(batch)

    def loss(model, batch):
        seen.setdefault("step", set()).add(torch.cuda.current_stream().priority)
        return tiny_loss(model, batch)

    ranks = {}
    for priority in ("high", "low"):
        seen.clear()
        build(tmp_path / priority, 4, prepare_batch=prepare, loss_fn=loss, prefetch_priority=priority).fit()
        assert len(seen["input"]) == len(seen["step"]) == 1, seen
        ranks[priority] = (seen["input"].pop(), seen["step"].pop())
    assert ranks["high"][0] < ranks["high"][1] and ranks["low"][1] < ranks["low"][0], ranks
    assert losses(tmp_path / "high") == losses(tmp_path / "low")


def test_prefetch_priority_is_high_or_low(tmp_path):
    with pytest.raises(ValueError, match=r"prefetch_priority must be one of \('high', 'low'\), got 'urgent'"):
        build(tmp_path, 3, prefetch_priority="urgent")


def test_switch_interval_holds_while_prefetching_and_is_restored(tmp_path):
    import sys

    seen: list[float] = []
    noisy = noisy_inputs([])

    def prepare(batch):
        seen.append(sys.getswitchinterval())
        return noisy(batch)

    before = sys.getswitchinterval()
    build(tmp_path / "a", 3, prepare_batch=prepare, prefetch=True, switch_interval_ms=0.25).fit()
    assert seen and all(s == pytest.approx(0.00025) for s in seen) and sys.getswitchinterval() == before
    seen.clear()
    build(tmp_path / "b", 3, prepare_batch=prepare, prefetch=False, switch_interval_ms=0.25).fit()
    assert seen and all(s == before for s in seen)  # no prefetch threads: Python's own
    with pytest.raises(ValueError, match="switch_interval_ms must be a positive number of milliseconds, got 0"):
        build(tmp_path / "c", 3, prepare_batch=prepare, switch_interval_ms=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_record_stream_reaches_a_dataclass_batchs_tensors():
    """A batch field of a dataclass (the packed images the decode stage hands on) is recorded on the stream that
    reads it: freed while that stream is busy, its memory is not handed out again."""
    reader = torch.cuda.Stream()
    data = torch.empty(3 * 64 * 64, dtype=torch.uint8, device="cuda")
    address = data.data_ptr()
    with torch.cuda.stream(reader):
        torch.cuda._sleep(50_000_000)  # the reader's queued work outlasts what follows
    _record_stream({"images": PackedImages(data, torch.tensor([[64, 64]]))}, reader)
    del data
    again = torch.empty(3 * 64 * 64, dtype=torch.uint8, device="cuda")
    assert again.data_ptr() != address
    torch.cuda.synchronize()
