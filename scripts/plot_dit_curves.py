"""Sample quality and likelihood against training steps for DiT runs side by side (``scripts/run_variants.py
... -- --eval-every N``): one JSON of per-run curves and one plot, FID, test bits/dim and precision / recall
against steps, one line per run.

    python scripts/plot_dit_curves.py OUT/diffusion_cifar10_dit_curves_b.json --work /tmp/lightvision_dit_curves_b \\
        --out OUT/dit_curves_b

Each run's curve is its report's ``curve``; a run without a finished report (paused, stopped or failed) is read from
its run folder under ``--work`` (``metrics.jsonl``, with the median of its logged rates), so a partial curve is kept,
marked ``finished: false`` and labelled with the step it reached (``finished: true`` where its last evaluation is at
the ``train.max_steps`` of the folder's ``config.json``); without the report (a call that ended before
run_variants did) every run folder under ``--work`` is read. ``--previous`` adds the runs of curve JSONs written
before (a run measured in an earlier call) for names the report and ``--work`` lack.
Writes ``--out``.json ({"source", "runs": {name: {"model", "params", "finished", "train_steps_per_s", "curve":
[{"step", "fid", "precision", "recall", "test_bits_per_dim", ...}]}}}) and ``--out``.png.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PANELS = (("fid", "FID"), ("test_bits_per_dim", "test bits/dim"), ("precision", "precision (solid), recall (dashed)"))


def curves(report: dict, work: Path | None) -> dict:
    """{name: run summary with its curve} for every name of a run_variants report (see the module docstring)."""
    from lightvision.diffusion.benchmark import eval_curve

    names = report.get("settings", {}).get("kinds") or list(report.get("results", {}))
    if not names and work is not None and work.is_dir():  # no report: every run folder under work
        names = sorted(p.name for p in work.iterdir() if (p / "runs" / p.name).is_dir())
    runs = {}
    for name in names:
        r = report.get("results", {}).get(name, {})
        curve, rate = r.get("curve"), r.get("train_steps_per_s")
        folder = None if work is None else work / name / "runs" / name
        finished = "error" not in r and bool(r)
        if curve is None and folder is not None and folder.is_dir():
            curve, rate = eval_curve(folder), logged_rate(folder)
            finished = bool(curve) and curve[-1]["step"] >= planned_steps(folder)
        if curve:
            runs[name] = {
                "model": r.get("model"),
                "params": r.get("params"),
                "finished": finished,
                "train_steps_per_s": rate,
                "curve": curve,
            }
    return runs


def planned_steps(run: Path) -> float:
    """``train.max_steps`` of a run folder's ``config.json`` (inf without one): a run whose last evaluation is at that
    step finished training, even where the call ended before its report was written."""
    config = run / "config.json"
    steps = json.loads(config.read_text()).get("train", {}).get("max_steps") if config.is_file() else None
    return float(steps) if steps else float("inf")


def logged_rate(run: Path) -> float | None:
    """Median of the ``steps_per_s`` a run folder's ``metrics.jsonl`` logged (the rate of a run without a report;
    the windows holding an evaluation are the slow outliers the median leaves out)."""
    from lightvision.engine import MetricsLogger

    rates = sorted(r["steps_per_s"] for r in MetricsLogger(run).records() if "steps_per_s" in r)
    return round(rates[len(rates) // 2], 2) if rates else None


def label(name: str, run: dict) -> str:
    """The legend's name of a run: an unfinished run says the step its curve reached."""
    return name if run["finished"] else f"{name} (to step {run['curve'][-1]['step']:,})"


def plot(runs: dict, path: Path) -> None:
    """FID, bits/dim and precision / recall against steps, one colour per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(16, 4.2))
    for i, (name, run) in enumerate(runs.items()):
        for ax, (key, _) in zip(axes, PANELS):
            points = [(c["step"], c[key]) for c in run["curve"] if key in c]
            if points:
                ax.plot(*zip(*points), marker=".", color=f"C{i}", label=label(name, run))
            if key == "precision":
                points = [(c["step"], c["recall"]) for c in run["curve"] if "recall" in c]
                if points:
                    ax.plot(*zip(*points), marker=".", linestyle="--", color=f"C{i}")
    for ax, (_, title) in zip(axes, PANELS):
        ax.set(xlabel="training step", title=title)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", help="diffusion_cifar10_TAG.json of scripts/run_variants.py (may not exist with --work)")
    p.add_argument("--work", help="run_variants' --work: curves of runs without a finished report")
    p.add_argument("--out", required=True, help="path stem of the JSON and PNG to write")
    p.add_argument(
        "--previous",
        nargs="*",
        default=[],
        help="curve JSONs this script wrote before (same recipe and seed): their runs join the plot where this "
        "report and --work have no run of that name",
    )
    args = p.parse_args(argv)
    source = Path(args.results)
    if not source.is_file() and not args.work:
        sys.exit(f"plot_dit_curves: {source} does not exist; give --work to read the run folders instead")
    report = json.loads(source.read_text()) if source.is_file() else {}
    runs = curves(report, Path(args.work) if args.work else None)
    for previous in args.previous:
        earlier = json.loads(Path(previous).read_text())["runs"]
        runs = {**{name: run for name, run in earlier.items() if name not in runs}, **runs}
    if not runs:
        sys.exit(f"plot_dit_curves: no run in {args.results} (or under --work) has an evaluation during training")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps({"source": str(args.results), "runs": runs}, indent=1))
    plot(runs, Path(f"{out}.png"))
    for name, run in runs.items():
        last = run["curve"][-1]
        print(
            f"{name}: step {last['step']}, FID {last.get('fid', float('nan')):.2f}, "
            f"bits/dim {last.get('test_bits_per_dim', float('nan')):.4f}{'' if run['finished'] else ' (unfinished)'}"
        )
    print(f"wrote {out}.json and {out}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
