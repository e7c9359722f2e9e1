"""Run several CIFAR-10 benchmark names (``lightvision.{diffusion,classify}.benchmark``) side by side on the GPUs.

    python scripts/run_variants.py lightnet lightnet_paper softmax --steps 4000 --deadline 540 --data /tmp/cifar \\
        --out OUT --variants configs/variants/diffusion_cifar10.yaml -- --samples 1000 --sample-steps 50
    python scripts/run_variants.py --family classify softmax lightnet lion_d lion_s lion_s_snake --data /tmp/cifar \\
        --out OUT --tag deit_t_patch4_200epochs -- --set train.compile=true data.pipeline=gpu data.cache=device

Every name trains in its own process, all at once, spread round-robin over ``--gpus`` (default: every visible GPU;
CUDA MPS shares a GPU between processes when its daemon runs); arguments after ``--`` go to every benchmark process.
``--procs NAME=K`` trains NAME data-parallel on the next K GPUs instead (``accelerate launch``, K processes; the
diffusion benchmark then splits its global ``--batch-size`` over them).
Each process logs its step to ``metrics.jsonl``. With ``--steps`` (the diffusion runs' length) and ``--deadline`` the
driver predicts from the measured rates when each run ends (training plus ``--eval-seconds``), and while the slowest
would miss the deadline it stops the last-listed run still going (names are in priority order), which speeds up the
others. The per-name reports are merged into ``{family}_cifar10_<--tag>.json`` (``stopped`` lists the names cut for
time). Rates in it are rates under sharing, not one run's own speed.

Runs longer than one sitting: ``--stop-after S`` sends every run still going SIGTERM after S seconds (as does a
SIGTERM to this driver): each checkpoints and stops, and is listed under ``paused``. The same command with
``--resume`` continues every run from its checkpoints and does not rerun a name whose report is complete.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from lightvision.engine import MetricsLogger
from lightvision.tools.launch import NO_MULTICAST, free_port
from lightvision.tools.results import report_path, results_env


def last_step(run: Path) -> int:
    """The newest step in a run folder's ``metrics.jsonl`` (0 before the first record; a line being written is
    skipped)."""
    return max((r.get("step", 0) for r in MetricsLogger(run).records()), default=0)


def part_report(out: Path, family: str, name: str) -> Path:
    """The report the benchmark run of ``name`` writes (``--out out/parts --tag name``)."""
    return report_path(family, argparse.Namespace(out=out / "parts", tag=name))


def finished(out: Path, family: str, name: str) -> bool:
    """Whether ``name`` has a complete report under ``out/parts`` (one without an error)."""
    part = part_report(out, family, name)
    if not part.is_file():
        return False
    result = json.loads(part.read_text()).get("results", {}).get(name)
    return result is not None and "error" not in result


def gpu_ids(limit: int | None) -> list[str]:
    """The first ``limit`` (None: all) visible GPUs as ``CUDA_VISIBLE_DEVICES`` values: the caller's own list when
    that variable is set, else 0 .. device_count - 1."""
    visible = [g.strip() for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    return (visible or [str(i) for i in range(torch.cuda.device_count())])[:limit]


def parse_procs(items: list[str], names: list[str]) -> dict[str, int]:
    """``["NAME=K", ...]`` -> {name: K} (K >= 1) for names of this call; a bad item raises ``ValueError``."""
    procs = {}
    for item in items:
        name, _, count = item.partition("=")
        if name not in names or not count.isdigit() or int(count) < 1:
            raise ValueError(f"--procs {item!r}: give NAME=K with NAME one of {', '.join(names)} and K >= 1")
        procs[name] = int(count)
    return procs


def assign_gpus(names: list[str], procs: dict[str, int], gpus: list[str]) -> dict[str, str]:
    """``CUDA_VISIBLE_DEVICES`` of each name: its ``procs`` count (default 1) of GPUs, taken in turn from ``gpus``
    (wrapping round, so names share GPUs when there are fewer GPUs than processes)."""
    out, cursor = {}, 0
    for name in names:
        count = procs.get(name, 1)
        out[name] = ",".join(gpus[(cursor + j) % len(gpus)] for j in range(count))
        cursor += count
    return out


def benchmark_command(family: str, name: str, processes: int) -> list[str]:
    """The command line that starts the benchmark of ``name``: one process, or ``processes`` under accelerate."""
    if processes == 1:
        return [sys.executable, "-m", f"lightvision.{family}.benchmark", name]
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(processes), "--multi_gpu"]
    launch += ["--num_machines", "1", "--dynamo_backend", "no", "--main_process_port", str(free_port())]
    return [*launch, "-m", f"lightvision.{family}.benchmark", name]


def run_folder(work: Path, family: str, name: str) -> Path:
    """The run folder of the benchmark process of ``name`` (run with ``--work work/name``)."""
    return work / name / ("runs" if family == "diffusion" else "") / name


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="+")
    p.add_argument("--family", choices=("diffusion", "classify"), default="diffusion", help="which benchmark to run")
    p.add_argument("--steps", type=int, help="training steps of every run (diffusion; needed by --deadline)")
    p.add_argument("--deadline", type=float, help="seconds from now by which every run must end (with --steps)")
    p.add_argument("--eval-seconds", type=float, default=150.0, help="expected evaluation time after training")
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--work", default="/tmp/lightvision_variants")
    p.add_argument("--variants")
    p.add_argument("--tag", default="variants")
    p.add_argument("--workers", type=int, default=3, help="data loader workers per run")
    p.add_argument("--gpus", type=int, help="spread the runs over the first N visible GPUs (default: all; 0: none)")
    p.add_argument("--procs", nargs="*", default=[], metavar="NAME=K", help="train NAME data-parallel on K GPUs")
    p.add_argument("--resume", action="store_true", help="continue unfinished runs; keep the reports of finished ones")
    p.add_argument("--stop-after", type=float, help="seconds from now at which every run checkpoints and stops")
    args = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if args.deadline is not None and args.steps is None:
        p.error("--deadline needs --steps (the runs' length, to predict when they end)")
    gpus = gpu_ids(args.gpus)
    try:
        procs_of = parse_procs(args.procs, args.names)
    except ValueError as err:
        p.error(str(err))
    if procs_of and (args.family != "diffusion" or not gpus):
        p.error("--procs needs --family diffusion and visible GPUs")
    devices = assign_gpus(args.names, procs_of, gpus) if gpus else {}
    start = time.time()
    out, work = Path(args.out), Path(args.work)
    (out / "parts").mkdir(parents=True, exist_ok=True)
    procs, done = {}, [name for name in args.names if args.resume and finished(out, args.family, name)]
    for name in args.names:
        if name in done:
            continue
        cmd = [*benchmark_command(args.family, name, procs_of.get(name, 1)), "--data", args.data]
        cmd += ["--out", str(out / "parts"), "--work", str(work / name), "--tag", name]
        cmd += ["--steps", str(args.steps)] if args.steps else []
        cmd += [*extra, "--set", f"data.num_workers={args.workers}"]
        cmd += ["--variants", args.variants] if args.variants else []
        cmd += ["--resume"] if args.resume else []
        env = {**os.environ, **NO_MULTICAST, "CUDA_VISIBLE_DEVICES": devices[name]} if gpus else None
        log = open(out / f"log_{name}.txt", "a" if args.resume else "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        procs[name] = (proc, time.time())
    stopped, paused, seen = [], [], {name: [] for name in args.names}  # seen: (time, step) observations per run
    pause = []  # set on SIGTERM to this driver while it watches the runs: pause every run
    previous_handler = signal.signal(signal.SIGTERM, lambda *_: pause.append(True))

    def pause_due() -> bool:
        return not paused and bool(pause or (args.stop_after is not None and time.time() >= start + args.stop_after))

    while any(proc.poll() is None for proc, _ in procs.values()):
        for _ in range(10):  # ten seconds between looks, cut short when a pause falls due
            if pause_due():
                break
            time.sleep(1)
        now = time.time()
        if pause_due():
            paused = [n for n, (proc, _) in procs.items() if proc.poll() is None]
            for name in paused:
                with contextlib.suppress(ProcessLookupError):  # it may have ended since the poll
                    os.killpg(procs[name][0].pid, signal.SIGTERM)  # the Trainer checkpoints and stops
            print(f"[{now - start:.0f}s] paused {', '.join(paused)}: run again with --resume to continue", flush=True)
        finish = {}
        for name, (proc, _) in procs.items():
            if proc.poll() is None:
                step = last_step(run_folder(work, args.family, name))
                seen[name].append((now, step))
                if args.deadline is None:
                    continue
                # the rate over the last minute, counted from the first step (start-up and compilation excluded)
                window = [(t, s) for t, s in seen[name] if now - t <= 60 and s > 0]
                if step >= args.steps:
                    finish[name] = now + args.eval_seconds
                elif window and now - window[0][0] >= 40 and step > window[0][1]:
                    then = window[0]
                    finish[name] = now + (args.steps - step) * (now - then[0]) / (step - then[1]) + args.eval_seconds
        running = [n for n, (proc, _) in procs.items() if proc.poll() is None]
        decided = all(n in finish for n in running)
        training = [n for n in running if seen[n] and seen[n][-1][1] < (args.steps or 0)]
        late = max(finish.values(), default=0.0)
        if paused:
            continue
        if args.deadline is not None and len(running) > 1 and training and decided and late > start + args.deadline:
            victim = training[-1]
            os.killpg(procs[victim][0].pid, signal.SIGKILL)
            seen.update({n: [] for n in running})  # the survivors speed up: measure afresh
            stopped.append(victim)
            print(
                f"[{now - start:.0f}s] stopped {victim}: predicted end {late - start:.0f}s > deadline "
                f"{args.deadline:.0f}s",
                flush=True,
            )
        print(
            f"[{now - start:.0f}s] " + ", ".join(f"{n} {seen[n][-1][1] if seen[n] else '-'}" for n in running),
            flush=True,
        )
    # the caller's handler back: a process that calls main() (a test) and forks later must stay killable by SIGTERM
    signal.signal(signal.SIGTERM, previous_handler)
    merged = {
        "env": results_env("python scripts/run_variants.py " + " ".join(argv)),
        "results": {},
        "stopped": stopped,
        "paused": paused,
        "concurrent_runs": len(args.names),
    }
    for name in args.names:
        part = part_report(out, args.family, name)
        if part.is_file():
            report = json.loads(part.read_text())
            if "real_streak_share" in report:
                merged.setdefault("real_streak_share", report["real_streak_share"])
            merged["settings"] = report["settings"]
            merged["results"].update(report["results"])
        else:
            why = "stopped to meet the deadline" if name in stopped else f"no report (see {out / f'log_{name}.txt'})"
            merged["results"][name] = {"error": why}
    if "settings" in merged:
        merged["settings"].update(kinds=args.names, tag=args.tag, work=str(work))
    (out / f"{args.family}_cifar10_{args.tag}.json").write_text(json.dumps(merged, indent=2, default=str))
    if args.family == "classify":
        from lightvision.classify.benchmark import table as classify_table

        print(classify_table(merged["results"], merged.get("settings", {}).get("img_size", [32])))
    else:
        print(table(merged))
    failed = [n for n, r in merged["results"].items() if "error" in r and n not in stopped + paused]
    return 1 if failed else 0


def table(report: dict) -> str:
    """Diffusion runs as markdown: name, parameters, steps, bits/dim, FID, precision, recall, streak share, steps/s. A
    data-parallel run takes its numbers from the evaluation during training, which measures no streak share ("-")."""
    real, nan = report.get("real_streak_share") or {}, float("nan")
    lines = [
        "| name | params (M) | steps | test bits/dim | FID | precision | recall | streak share | steps/s (shared) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| real test images | | | | | | | {real.get('mean', nan):.3f} | |",
    ]
    for name, r in report["results"].items():
        if "error" in r:
            lines.append(f"| {name} | error: {r['error'][:80]} | | | | | | | |")
            continue
        streaks = f"{r['streak_share']['mean']:.3f}" if "streak_share" in r else "-"
        lines.append(
            f"| {name} | {r['params'] / 1e6:.1f} | {r['steps']} | {r['test_bits_per_dim']:.3f} | "
            f"{r.get('fid', nan):.2f} | {r.get('precision', nan):.3f} | {r.get('recall', nan):.3f} | {streaks} | "
            f"{r['train_steps_per_s']:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
