"""Sample quality and likelihood against training steps for DiT runs side by side (``scripts/run_variants.py
... -- --eval-every N``): one JSON of per-run curves and one plot, FID, test bits/dim and precision / recall
against steps, one line per run.

    python scripts/plot_dit_curves.py OUT/diffusion_cifar10_dit_curves_b.json --work /tmp/lightvision_dit_curves_b \\
        --out OUT/dit_curves_b

Each run's curve is its report's ``curve``; a run without a finished report (paused, stopped or failed) is read from
its run folder under ``--work`` (``metrics.jsonl``), so a partial curve is kept and marked ``finished: false``.
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

    names = report.get("settings", {}).get("kinds") or list(report["results"])
    runs = {}
    for name in names:
        r = report["results"].get(name, {})
        curve = r.get("curve")
        if curve is None and work is not None and (work / name / "runs" / name).is_dir():
            curve = eval_curve(work / name / "runs" / name)
        if curve:
            runs[name] = {
                "model": r.get("model"),
                "params": r.get("params"),
                "finished": "error" not in r and bool(r),
                "train_steps_per_s": r.get("train_steps_per_s"),
                "curve": curve,
            }
    return runs


def plot(runs: dict, path: Path) -> None:
    """FID, bits/dim and precision / recall against steps, one colour per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(16, 4.2))
    for i, (name, run) in enumerate(runs.items()):
        label = name if run["finished"] else f"{name} (unfinished)"
        for ax, (key, _) in zip(axes, PANELS):
            points = [(c["step"], c[key]) for c in run["curve"] if key in c]
            if points:
                ax.plot(*zip(*points), marker=".", color=f"C{i}", label=label)
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
    p.add_argument("results", help="diffusion_cifar10_TAG.json of scripts/run_variants.py")
    p.add_argument("--work", help="run_variants' --work: curves of runs without a finished report")
    p.add_argument("--out", required=True, help="path stem of the JSON and PNG to write")
    args = p.parse_args(argv)
    report = json.loads(Path(args.results).read_text())
    runs = curves(report, Path(args.work) if args.work else None)
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
