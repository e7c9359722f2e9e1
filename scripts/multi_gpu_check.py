"""Multi-GPU check: 1 vs 2 processes under ``accelerate launch`` give the same training run.

    source scripts/device_env.sh && cd /tmp && \
        python3 /path/to/repo/scripts/multi_gpu_check.py --data /tmp/cifar --out $OUT/multi_gpu.json

Every stage is one ``accelerate launch -m lightvision ...`` subprocess (``python3 -m accelerate.commands.launch``,
so accelerate only needs to be importable); its output goes to ``<work>/logs/<stage>.log``, and a failing or hanging
stage (``--stage-timeout``) is recorded without losing the others. Stages:

* ``classify_1`` / ``classify_2``: ``lightvision classify train`` with ``configs/classify/cifar10.yaml`` (CIFAR-10
  ImageFolder ``--data`` with train/ and test/), ``lightnet_deit_tiny_patch16_224`` with patch 4, global batch
  ``--classify-batch`` as 1 x B and 2 x B/2 (``train.batch_size`` is per process), ``--steps`` optimizer steps, a
  loss record every step, deterministic inputs (``aug.no_aug``, no mixup / cutmix / drop path / repeated
  augmentation), evaluation on the test split at the end;
* ``diffusion_1`` / ``diffusion_2``: ``lightvision diffusion train`` with ``configs/diffusion/cifar10.yaml`` (pixel
  space, ``lightnet_dit_s_2``), global batch ``--diffusion-batch`` as 1 x B and 2 x B/2 (``train.batch_size`` is
  per process), no flips, no sampling hook;
* ``classify_eval_2``: ``lightvision classify eval`` of the 1-process classifier on 2 processes: every test image
  counted once, the same top-1 as the 1-process run's own evaluation (up to bf16 ties);
* ``sample_2``: ``lightvision diffusion sample`` of the 2-process diffusion run on 2 processes, ``--num-samples``
  (37) samples: as many PNGs and npz rows, all distinct;
* ``classify_2_weak`` / ``diffusion_2_weak`` (``--weak-steps`` > 0): 2 processes at the per-GPU batch of the
  1-process run (global batch doubled), for weak scaling of throughput.

Reported (``--out`` JSON with the ``lightvision.tools.results.results_env`` block, written after every stage; a table
printed last): per-step loss and lr of the 1- and 2-process runs and their max abs / rel difference over the first
1 / 10 / 20 / all steps, global batch and lr, evaluated images vs test-set size, throughput (images/s from the
per-step ``steps_per_s`` of the metrics log after warm-up) and scaling 1 -> 2 (strong: same global batch; weak:
same per-GPU batch), the sample checks, the wall time of each stage.

The stages share ``--time-budget`` seconds (the weak-scaling runs come last, so they are the first to be skipped);
the exit status is 0 when every check passed. Child processes get NVLink multicast switched off
(``NCCL_NVLS_ENABLE=0`` ...).

Dry run without GPUs: ``--cpu`` (gloo, fp32; ``accelerate launch --cpu`` starts a single process without MPI, so the
2-process launch uses ``--multi_gpu``, which accelerate runs as MULTI_CPU on a machine without GPUs), e.g. on a
few hundred CIFAR images with small models::

    python3 scripts/multi_gpu_check.py --cpu --data /tmp/mgc_data --out /tmp/mgc_out/multi_gpu_cpu.json \
        --work /tmp/mgc_work --steps 6 --weak-steps 3 --warmup-steps 2 --classify-batch 16 --diffusion-batch 8 \
        --eval-batch 32 --num-workers 1 --classify-args '{patch_size: 4, depth: 2}' \
        --diffusion-kwargs '{depth: 2, hidden_size: 64, num_heads: 2}' --sample-steps 3 --sample-batch 8
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from lightvision.tools.launch import NO_MULTICAST, free_port

REPO = Path(__file__).resolve().parent.parent


class Check:
    """Runs the stages and collects everything into one report, saved after every stage."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.work = Path(args.work).resolve()
        self.logs = self.work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.out = Path(args.out).resolve()
        self.precision = "no" if args.cpu else "bf16"
        self.deadline = time.monotonic() + args.time_budget
        from lightvision.tools.results import results_env

        command = shlex.join(["python3", "scripts/multi_gpu_check.py", *sys.argv[1:]])
        self.report: dict[str, Any] = {
            "env": results_env(command),
            "settings": vars(args),
            "stages": {},
            "classify": {},
            "diffusion": {},
            "sample": {},
            "checks": {},
        }
        import torch

        self.report["env"]["gpus"] = torch.cuda.device_count()
        if not args.cpu and torch.cuda.device_count() < 2:
            print(f"warning: {torch.cuda.device_count()} GPU(s) visible; the 2-process stages need 2", flush=True)

    # ------------------------------------------------------------------ running
    def save(self) -> None:
        from lightvision.engine.fsio import atomic_write

        self.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.out, (json.dumps(self.report, indent=2, default=str) + "\n").encode())

    def launch_cmd(self, nproc: int, lightvision_args: list[str]) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--num_processes",
            str(nproc),
            "--num_machines",
            "1",
            "--mixed_precision",
            self.precision,
            "--dynamo_backend",
            "no",
        ]
        if nproc > 1:
            cmd += ["--multi_gpu", "--main_process_port", str(free_port())]  # on CPU: MULTI_CPU with gloo
        elif self.args.cpu:
            cmd += ["--cpu"]
        return cmd + ["-m", "lightvision", *lightvision_args]

    def run(self, name: str, nproc: int, lightvision_args: list[str]) -> dict:
        """One launch; returns (and records) its stage entry. Raises on failure (after recording it)."""
        cmd = self.launch_cmd(nproc, lightvision_args)
        log_path = self.logs / f"{name}.log"
        entry: dict[str, Any] = {"processes": nproc, "cmd": shlex.join(cmd), "log": str(log_path)}
        self.report["stages"][name] = entry
        left = self.deadline - time.monotonic()
        if left < 15:
            entry.update(ok=False, skipped=f"time budget (--time-budget {self.args.time_budget} s) spent")
            raise RuntimeError(f"stage {name} skipped: {entry['skipped']}")
        timeout = min(self.args.stage_timeout, left)
        print(f"[{name}] {shlex.join(cmd)}", flush=True)
        start = time.monotonic()
        with open(log_path, "w") as log:
            env = {**os.environ, **NO_MULTICAST, "PYTHONUNBUFFERED": "1"}
            proc = subprocess.Popen(
                cmd, cwd=self.work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                code = None
        entry["wall_s"] = round(time.monotonic() - start, 1)
        entry["returncode"] = code
        entry["ok"] = code == 0
        print(f"[{name}] {'ok' if code == 0 else 'FAILED'} in {entry['wall_s']} s (exit {code})", flush=True)
        if code != 0:
            entry["log_tail"] = log_path.read_text(errors="replace")[-4000:]
            print(entry["log_tail"][-1500:], flush=True)
            raise RuntimeError(f"stage {name} {'timed out' if code is None else f'exited with {code}'}: see {log_path}")
        return entry

    def stage(self, name: str, fn) -> Any:
        """Run ``fn`` (which may launch several things); a failure is recorded, never raised."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - one failed stage must not lose the others
            self.report.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"
            if not isinstance(e, RuntimeError):
                traceback.print_exc()
            return None
        finally:
            self.save()

    # ------------------------------------------------------------------ runs
    def classify_run(self, name: str, nproc: int, per_process: int, steps: int) -> Path:
        a = self.args
        run = self.work / name
        self.run(
            name,
            nproc,
            [
                "classify",
                "train",
                "--config",
                str(REPO / "configs" / "classify" / "cifar10.yaml"),
                "--out",
                str(run),
                "--device",
                "cpu" if a.cpu else "cuda",
                f"data.root={a.data}",
                f"data.num_workers={a.num_workers}",
                f"model.name={a.classify_model}",
                f"model.args={a.classify_args}",
                "model.drop_path=0",
                "aug.no_aug=true",
                "aug.mixup=0",
                "aug.cutmix=0",
                "aug.repeated_aug=1",
                f"train.batch_size={per_process}",
                f"train.max_steps={steps}",
                "train.log_every=1",
                f"train.eval_batch_size={a.eval_batch}",
                f"train.mixed_precision='{self.precision}'",
                "train.keep_last=1",
                f"train.seed={a.seed}",
                *a.classify_extra,
            ],
        )
        return run

    def diffusion_run(self, name: str, nproc: int, global_batch: int, steps: int) -> Path:
        a = self.args
        run = self.work / name
        self.run(
            name,
            nproc,
            [
                "diffusion",
                "train",
                "--config",
                str(REPO / "configs" / "diffusion" / "cifar10.yaml"),
                f"run.dir={run}",
                f"data.root={a.data}",
                f"data.num_workers={a.num_workers}",
                "data.flip=false",
                f"train.batch_size={global_batch // nproc}",
                f"model.name={a.diffusion_model}",
                f"model.args={a.diffusion_kwargs}",
                f"train.max_steps={steps}",
                "train.log_every=1",
                f"train.ckpt_every_steps={steps}",
                "train.keep_last=1",
                f"train.mixed_precision='{self.precision}'",
                "sample.every=1000000000",
                f"train.seed={a.seed}",
                *a.diffusion_extra,
            ],
        )
        return run

    # ------------------------------------------------------------------ analysis
    @staticmethod
    def curve(run: Path) -> dict[int, dict]:
        """The run's per-step training records (``metrics.jsonl``) by step."""
        from lightvision.engine import MetricsLogger

        return {r["step"]: r for r in MetricsLogger(run).records() if "loss" in r}

    def throughput(self, run: Path, global_batch: int) -> dict:
        """images/s after warm-up: total images / total time of the per-step windows (and the median step)."""
        curve = self.curve(run)
        steps = sorted(curve)
        warm = min(max(self.args.warmup_steps, 0), max(len(steps) - 1, 0))
        timed = [curve[s]["steps_per_s"] for s in steps[warm:] if curve[s].get("steps_per_s")]
        if not timed:
            return {"global_batch": global_batch, "images_per_s": None}
        seconds = sum(1.0 / r for r in timed)
        return {
            "global_batch": global_batch,
            "timed_steps": len(timed),
            "warmup_steps": warm,
            "images_per_s": round(global_batch * len(timed) / seconds, 1),
            "images_per_s_median_step": round(global_batch * statistics.median(timed), 1),
            "step_ms_median": round(1000.0 / statistics.median(timed), 2),
        }

    def compare(self, run1: Path, run2: Path) -> dict:
        """Per-step loss / lr of both runs and their differences over the first 1 / 10 / 20 / all steps."""
        c1, c2 = self.curve(run1), self.curve(run2)
        steps = sorted(set(c1) & set(c2))
        rows = []
        for s in steps:
            l1, l2 = c1[s]["loss"], c2[s]["loss"]
            rows.append(
                {
                    "step": s,
                    "loss_1": l1,
                    "loss_2": l2,
                    "abs": abs(l1 - l2),
                    "rel": abs(l1 - l2) / max(abs(l1), 1e-12),
                    "lr_1": c1[s]["lr"],
                    "lr_2": c2[s]["lr"],
                }
            )
        windows = {}
        for label, n in (("first_1", 1), ("first_10", 10), ("first_20", 20), ("all", len(rows))):
            part = rows[:n]
            if part:
                windows[label] = {
                    "steps": len(part),
                    "max_abs": max(r["abs"] for r in part),
                    "max_rel": max(r["rel"] for r in part),
                }
        lr_rel = max((abs(r["lr_1"] - r["lr_2"]) / max(abs(r["lr_1"]), 1e-30) for r in rows), default=None)
        at = sorted({s for s in (1, 10, 20, steps[-1] if steps else 0) if s in c1 and s in c2})
        return {
            "steps_compared": len(rows),
            "steps_1": len(c1),
            "steps_2": len(c2),
            "loss_diff": windows,
            "lr_max_rel_diff": lr_rel,
            "lr_at": {s: [c1[s]["lr"], c2[s]["lr"]] for s in at},
            "per_step": rows,
        }

    def tolerances(self) -> tuple[float, float]:
        a = self.args
        step1 = a.tol_step1 if a.tol_step1 is not None else (1e-4 if a.cpu else 2e-3)
        first10 = a.tol_first10 if a.tol_first10 is not None else (1e-4 if a.cpu else 1e-2)
        return step1, first10

    def judge(self, family: str, comparison: dict) -> None:
        tol1, tol10 = self.tolerances()
        diffs = comparison["loss_diff"]
        checks = self.report["checks"]
        checks[f"{family}_steps_complete"] = (
            comparison["steps_1"] == comparison["steps_2"] == comparison["steps_compared"] > 0
        )
        checks[f"{family}_loss_step1"] = bool(diffs) and diffs["first_1"]["max_rel"] <= tol1
        checks[f"{family}_loss_first10"] = bool(diffs) and diffs.get("first_10", diffs["first_1"])["max_rel"] <= tol10
        checks[f"{family}_lr_equal"] = (
            comparison["lr_max_rel_diff"] is not None and comparison["lr_max_rel_diff"] <= 1e-9
        )

    # ------------------------------------------------------------------ stages
    def pair(self, family: str, one) -> dict[int, Path | None]:
        """The 1- and 2-process stages ``{family}_{n}`` (``one(n)`` launches and records a run, returns its folder);
        when both ran, their loss curves are compared and judged and the scaling recorded. Returns the folders."""
        res = self.report[family]
        runs = {nproc: self.stage(f"{family}_{nproc}", lambda n=nproc: one(n)) for nproc in (1, 2)}
        if runs.get(1) and runs.get(2):
            res["comparison"] = self.compare(runs[1], runs[2])
            self.judge(family, res["comparison"])
            self.scaling(res)
        self.save()
        return runs

    def weak(self, family: str, run: Path, per_process: int) -> None:
        """Record the weak-scaling run ``run`` of ``family`` (``per_process`` rows per GPU) and the scaling."""
        res = self.report[family]
        results = json.loads((run / "results.json").read_text())
        res["run_2_weak"] = {
            "processes": results["processes"],
            "global_batch": results["global_batch"],
            "per_process_batch": per_process,
            "throughput": self.throughput(run, results["global_batch"]),
        }
        self.scaling(res)

    def classify_pair(self) -> None:
        a, res = self.args, self.report["classify"]
        if a.classify_batch % 2:
            raise ValueError("--classify-batch must be even (2 x batch / 2)")

        def one(nproc: int) -> Path:
            run = self.classify_run(f"classify_{nproc}", nproc, a.classify_batch // nproc, a.steps)
            results = json.loads((run / "results.json").read_text())
            res[f"run_{nproc}"] = {
                "processes": results["processes"],
                "global_batch": results["global_batch"],
                "per_process_batch": a.classify_batch // nproc,
                "lr": results["lr"],
                "steps": results["step"],
                "val_images": results["val_images"],
                "val_set_size": results["val_set_size"],
                "val_top1": results["val_top1"],
                "throughput": self.throughput(run, results["global_batch"]),
            }
            self.report["checks"][f"classify_{nproc}_eval_count"] = results["val_images"] == results["val_set_size"]
            self.report["checks"][f"classify_{nproc}_processes"] = results["processes"] == nproc
            return run

        runs = self.pair("classify", one)
        if runs.get(1) and runs.get(2):
            r1, r2 = res["run_1"], res["run_2"]
            self.report["checks"]["classify_same_global_batch_lr"] = (
                r1["global_batch"] == r2["global_batch"] and r1["lr"] == r2["lr"]
            )
        if runs.get(1):
            self.stage("classify_eval_2", lambda: self.classify_eval(runs[1]))

    def classify_weak(self) -> None:
        """2 processes at the 1-process run's per-GPU batch (global batch doubled): weak-scaling throughput."""
        a = self.args
        self.weak("classify", self.classify_run("classify_2_weak", 2, a.classify_batch, a.weak_steps), a.classify_batch)

    def classify_eval(self, run1: Path) -> None:
        """The 1-process classifier evaluated on 2 processes: same image count and top-1 as its own evaluation."""
        a, res = self.args, self.report["classify"]
        out = self.work / "classify_eval_2"
        img_size = json.loads((run1 / "config.json").read_text())["data"]["image_size"]
        self.run(
            "classify_eval_2",
            2,
            [
                "classify",
                "eval",
                "--checkpoint",
                str(run1),
                "--img-size",
                str(img_size),
                "--weights",
                "model",
                "--batch-size",
                str(a.eval_batch),
                "--num-workers",
                str(a.num_workers),
                "--out",
                str(out),
                "--device",
                "cpu" if a.cpu else "cuda",
            ],
        )
        result = json.loads((out / "eval.json").read_text())["results"][0]
        reference = res.get("run_1", {})
        res["eval_2_of_run_1"] = {
            "images": result["images"],
            "top1": result["top1"],
            "run_1_val_top1": reference.get("val_top1"),
            "val_set_size": reference.get("val_set_size"),
        }
        self.report["checks"]["classify_eval_2_count"] = result["images"] == reference.get("val_set_size")
        if reference.get("val_top1") is not None:
            # the same weights: top-1 may move only by bf16 ties between near-equal logits (a few images)
            tol = 0.0 if a.cpu else 0.1
            self.report["checks"]["classify_eval_2_top1"] = abs(result["top1"] - reference["val_top1"]) <= tol

    def diffusion_pair(self) -> None:
        a, res = self.args, self.report["diffusion"]

        def one(nproc: int) -> Path:
            run = self.diffusion_run(f"diffusion_{nproc}", nproc, a.diffusion_batch, a.steps)
            results = json.loads((run / "results.json").read_text())
            lrs = [r["lr"] for _, r in sorted(self.curve(run).items())]
            res[f"run_{nproc}"] = {
                "processes": results["processes"],
                "global_batch": results["global_batch"],
                "per_process_batch": results["per_process_batch"],
                "steps": results["step"],
                "lr_last": lrs[-1] if lrs else None,
                "throughput": self.throughput(run, results["global_batch"]),
            }
            self.report["checks"][f"diffusion_{nproc}_processes"] = results["processes"] == nproc
            return run

        runs = self.pair("diffusion", one)
        if runs.get(1) and runs.get(2):
            self.report["checks"]["diffusion_same_global_batch"] = (
                res["run_1"]["global_batch"] == res["run_2"]["global_batch"]
            )
        if runs.get(2):
            self.stage("sample_2", lambda: self.sample(runs[2]))

    def diffusion_weak(self) -> None:
        """2 processes at the 1-process run's per-GPU batch (global batch doubled): weak-scaling throughput."""
        a = self.args
        run = self.diffusion_run("diffusion_2_weak", 2, 2 * a.diffusion_batch, a.weak_steps)
        self.weak("diffusion", run, a.diffusion_batch)

    @staticmethod
    def scaling(res: dict) -> None:
        """Speed-up 1 -> 2 processes: strong (same global batch) and weak (same per-GPU batch)."""
        base = res.get("run_1", {}).get("throughput", {}).get("images_per_s")
        out = {}
        for key, label in (("run_2", "strong"), ("run_2_weak", "weak")):
            ips = res.get(key, {}).get("throughput", {}).get("images_per_s")
            if base and ips:
                out[label] = {
                    "images_per_s_1": base,
                    "images_per_s_2": ips,
                    "speedup": round(ips / base, 3),
                    "efficiency": round(ips / base / 2, 3),
                }
        res["scaling"] = out

    def sample(self, run2: Path) -> None:
        """2-process sampling: exactly ``--num-samples`` PNGs and npz rows, no two identical."""
        import numpy as np

        a, res = self.args, self.report["sample"]
        out = self.work / "samples_2"
        if out.exists():
            import shutil

            shutil.rmtree(out)
        self.run(
            "sample_2",
            2,
            [
                "diffusion",
                "sample",
                str(run2),
                "--out",
                str(out),
                "--num-samples",
                str(a.num_samples),
                "--batch-size",
                str(a.sample_batch),
                "--steps",
                str(a.sample_steps),
                "--cfg-scale",
                "1.5",
                "--weights",
                "model",
                "--seed",
                str(a.seed),
            ],
        )
        pngs = sorted(p.name for p in (out / "images").glob("*.png"))
        arr = np.load(out / "samples.npz")["arr_0"]
        flat = arr.reshape(arr.shape[0], -1)
        distinct = len(np.unique(flat, axis=0))
        summary = json.loads((out / "summary.json").read_text())
        expected = [f"{i:06d}.png" for i in range(a.num_samples)]
        res.update(
            requested=a.num_samples,
            pngs=len(pngs),
            npz_rows=int(arr.shape[0]),
            npz_shape=list(arr.shape),
            distinct_rows=int(distinct),
            processes=summary.get("processes"),
            names_match=pngs == expected,
        )
        self.report["checks"]["sample_count"] = len(pngs) == arr.shape[0] == a.num_samples and pngs == expected
        self.report["checks"]["sample_distinct"] = distinct == a.num_samples
        self.report["checks"]["sample_processes"] = summary.get("processes") == 2

    # ------------------------------------------------------------------ table
    def table(self) -> str:
        lines = []
        tol1, tol10 = self.tolerances()
        lines.append(f"loss tolerance (rel): step 1 {tol1:g}, first 10 steps {tol10:g}; precision {self.precision}")
        lines.append(
            "| run | global batch = procs x batch | loss step 1 (1 / 2) | max rel diff 1 / 10 / 20 / all "
            "| lr rel diff | images/s 1 -> 2 (strong) | weak |"
        )
        lines.append("| --- | --- | --- | --- | --- | --- | --- |")
        for family in ("classify", "diffusion"):
            res = self.report[family]
            r1, r2, cmp_ = res.get("run_1", {}), res.get("run_2", {}), res.get("comparison", {})
            diffs = cmp_.get("loss_diff", {})
            rel = " / ".join(
                f"{diffs[k]['max_rel']:.2e}" if k in diffs else "-" for k in ("first_1", "first_10", "first_20", "all")
            )
            first = cmp_.get("per_step", [{}])[0] if cmp_.get("per_step") else {}
            loss1 = f"{first['loss_1']:.5f} / {first['loss_2']:.5f}" if first else "-"
            sc = res.get("scaling", {})
            strong = (
                (
                    f"{sc['strong']['images_per_s_1']:.0f} -> {sc['strong']['images_per_s_2']:.0f} "
                    f"(x{sc['strong']['speedup']:.2f})"
                )
                if "strong" in sc
                else "-"
            )
            weak = (f"{sc['weak']['images_per_s_2']:.0f} (x{sc['weak']['speedup']:.2f})") if "weak" in sc else "-"
            lr = f"{cmp_['lr_max_rel_diff']:.1e}" if cmp_.get("lr_max_rel_diff") is not None else "-"
            batches = " / ".join(
                f"{r['global_batch']} = {r['processes']}x{r['per_process_batch']}" if r else "-" for r in (r1, r2)
            )
            lines.append(f"| {family} | {batches} | {loss1} | {rel} | {lr} | {strong} | {weak} |")
        c = self.report["classify"]
        for nproc in (1, 2):
            r = c.get(f"run_{nproc}")
            if r:
                lines.append(
                    f"classify eval, {nproc} proc: {r['val_images']} images of {r['val_set_size']}, "
                    f"top-1 {r['val_top1']:.2f}"
                )
        e = c.get("eval_2_of_run_1")
        if e:
            lines.append(
                f"classify eval of the 1-proc weights on 2 proc: {e['images']} images, top-1 {e['top1']:.2f} "
                f"(1-proc run: {e['run_1_val_top1']})"
            )
        s = self.report["sample"]
        if s:
            lines.append(
                f"sample on 2 proc: requested {s['requested']}, PNGs {s['pngs']}, npz rows {s['npz_rows']}, "
                f"distinct {s['distinct_rows']}, processes {s['processes']}"
            )
        lines.append(
            "stage wall times (s): "
            + ", ".join(
                f"{k} {v.get('wall_s', '-')}{'' if v.get('ok') else ' SKIPPED' if v.get('skipped') else ' FAILED'}"
                for k, v in self.report["stages"].items()
            )
        )
        checks = self.report["checks"]
        failed = [k for k, v in checks.items() if not v]
        lines.append(
            f"checks: {sum(map(bool, checks.values()))}/{len(checks)} passed"
            + (f"; FAILED: {', '.join(failed)}" if failed else "")
        )
        if self.report.get("errors"):
            lines.append("errors: " + "; ".join(f"{k}: {v}" for k, v in self.report["errors"].items()))
        return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data", required=True, help="CIFAR-10 ImageFolder root with train/ and test/")
    p.add_argument("--out", required=True, help="report JSON")
    p.add_argument("--work", default="/tmp/multi_gpu_check", help="scratch: runs, logs, samples (emptied first)")
    p.add_argument("--cpu", action="store_true", help="dry run without GPUs: gloo, fp32 (tiny settings advised)")
    p.add_argument("--steps", type=int, default=80, help="optimizer steps of each 1- / 2-process run")
    p.add_argument("--weak-steps", type=int, default=40, help="steps of the weak-scaling runs (0: skip them)")
    p.add_argument("--warmup-steps", type=int, default=20, help="steps left out of the throughput")
    p.add_argument("--classify-batch", type=int, default=256, help="global batch (1 x B vs 2 x B/2)")
    p.add_argument("--diffusion-batch", type=int, default=256, help="global batch")
    p.add_argument("--eval-batch", type=int, default=256, help="classifier evaluation batch per process")
    p.add_argument("--num-workers", type=int, default=8, help="data loader workers per process")
    p.add_argument("--classify-model", default="lightnet_deit_tiny_patch16_224")
    p.add_argument("--classify-args", default="{patch_size: 4}", help="model.args override (YAML mapping)")
    p.add_argument("--diffusion-model", default="lightnet_dit_s_2")
    p.add_argument("--diffusion-kwargs", default="{}", help="model.args override (YAML mapping)")
    p.add_argument("--classify-extra", nargs="*", default=[], metavar="KEY=VALUE", help="more classify overrides")
    p.add_argument("--diffusion-extra", nargs="*", default=[], metavar="KEY=VALUE", help="more diffusion overrides")
    p.add_argument("--num-samples", type=int, default=37)
    p.add_argument("--sample-batch", type=int, default=16, help="per process")
    p.add_argument("--sample-steps", type=int, default=50, help="respaced DDPM steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tol-step1", type=float, help="max rel loss diff at step 1 (default 2e-3 bf16, 1e-4 CPU)")
    p.add_argument("--tol-first10", type=float, help="max rel loss diff over 10 steps (default 1e-2 bf16, 1e-4 CPU)")
    p.add_argument("--stage-timeout", type=int, default=180, help="seconds before a stage is killed")
    p.add_argument(
        "--time-budget",
        type=int,
        default=330,
        help="seconds for all stages: a stage gets at most what is left; none starts with under 15 s left",
    )
    p.add_argument("--skip", nargs="*", default=[], choices=["classify", "diffusion"], help="families to leave out")
    args = p.parse_args(argv)
    args.data = str(Path(args.data).resolve())
    for split in ("train", "test"):
        if not (Path(args.data) / split).is_dir():
            p.error(
                f"--data {args.data} has no {split}/ folder (CIFAR-10 ImageFolder: train/<class>/*, test/<class>/*)"
            )
    work = Path(args.work)
    marker = work / ".multi_gpu_check"
    if work.exists() and any(work.iterdir()):
        if not marker.exists():
            p.error(f"--work {work} is not empty and was not made by this script: choose another folder")
        import shutil

        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    marker.touch()
    check = Check(args)
    start = time.monotonic()
    families = [f for f in ("classify", "diffusion") if f not in args.skip]
    for family in families:  # the required checks first, the weak-scaling runs last (first to go if time is short)
        check.stage(family, getattr(check, f"{family}_pair"))
    if args.weak_steps > 0:
        for family in families:
            if check.report[family].get("run_1"):
                check.stage(f"{family}_2_weak", getattr(check, f"{family}_weak"))
    check.report["total_wall_s"] = round(time.monotonic() - start, 1)
    required_errors = [k for k in check.report.get("errors", {}) if not k.endswith("_weak")]  # weak scaling: optional
    check.report["ok"] = bool(check.report["checks"]) and all(check.report["checks"].values()) and not required_errors
    check.save()
    print(f"\nwrote {check.out} in {check.report['total_wall_s']} s\n")
    print(check.table())
    return 0 if check.report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
