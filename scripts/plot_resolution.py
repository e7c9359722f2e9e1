"""Figures of resolution transfer: classifier top-1 against image size, and diffusion samples at other sizes.

    python scripts/plot_resolution.py classify TABLE.json [MORE.json ...] --screen SCREEN.json --out FIG.png
    python scripts/plot_resolution.py samples SAMPLES.json --grids OUT/resolution_dit/parts --out FIG.png

(TABLE, SCREEN and SAMPLES: the classify_cifar10_resolution_{table,screen}_* and diffusion_cifar10_resolution_samples_*
files of benchmarks/results/.)

``classify``: top-1 against size per attention in image units (LION at ``--lion-power``) and, dashed, token units;
with ``--screen`` a second panel with each training switch's top-1 at 64 px. ``samples``: per attention a row of
sample crops (the first 4 x 4 samples of each ``grid_<name>_<size>px_<unit>.png``), image units at every size, then
token units above the first (training) size.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from make_report import SCREEN_SWITCHES, sample_columns, screen_kinds, top1, unit_curves  # scripts/ is on sys.path


def plot_classify(table: dict, screen: dict | None, out: Path, lion_power: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2 if screen else 1, figsize=(13 if screen else 7, 4.5), squeeze=False)
    ax = axes[0][0]
    for i, (name, result) in enumerate(r for r in table["results"].items() if "error" not in r[1]):
        for unit, acc in unit_curves(result, lion_power):
            style, label = ("--", f"{name} (token units)") if unit == "token" else ("-", f"{name} (image units)")
            ax.plot(list(acc), list(acc.values()), style, marker="o", color=f"C{i}", label=label, ms=4)
    ax.set(xlabel="evaluation size (px), trained at 32", ylabel="test top-1 (%)", title="CIFAR-10, DeiT-T, 200 epochs")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({e["img_size"] for r in table["results"].values() for e in r.get("eval", [])}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    if screen:
        ax = axes[0][1]
        results = screen["results"]
        kinds = screen_kinds(results)
        width = 0.8 / len(SCREEN_SWITCHES)
        for j, (suffix, label) in enumerate(SCREEN_SWITCHES):
            values = [top1(results.get(k + suffix, {}), "image").get(64, np.nan) for k in kinds]
            at32 = [top1(results.get(k + suffix, {}), "image").get(32, np.nan) for k in kinds]
            x = np.arange(len(kinds)) + (j - 1) * width
            ax.bar(x, values, width, label=f"{label}: 64 px")
            ax.plot(x, at32, "k_", ms=12, label="32 px" if j == 0 else None)
        ax.set_xticks(np.arange(len(kinds)), kinds)
        ax.set(ylabel="test top-1 (%)", title="training switches, 15 epochs, image units")
        ax.legend(fontsize=7, loc="lower right")
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def crop(grid: np.ndarray, size: int, count: int = 4) -> np.ndarray:
    """The first count x count samples of a grid of ``lightvision.diffusion.sample.save_grid`` (2 px borders)."""
    side = 2 + count * (size + 2)
    return grid[:side, :side]


def plot_samples(report: dict, grids: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    names = [n for n, r in report["results"].items() if r.get("sizes")]
    columns = sample_columns(report)
    fig, axes = plt.subplots(len(names), len(columns), figsize=(1.9 * len(columns), 2.0 * len(names)), squeeze=False)
    for i, name in enumerate(names):
        shares = {(r["img_size"], r["pos_unit"]): r["streak_share"]["mean"] for r in report["results"][name]["sizes"]}
        for j, (size, unit) in enumerate(columns):
            ax = axes[i][j]
            grid = np.asarray(Image.open(grids / f"grid_{name}_{size}px_{unit}.png").convert("RGB"))
            ax.imshow(crop(grid, size))
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"{size} px, {unit}: streaks {shares[(size, unit)]:.2f}", fontsize=7)
            if j == 0:
                ax.set_ylabel(name, fontsize=9)
    real = report.get("real_streak_share", {}).get("mean")
    fig.suptitle(f"trained at 32 px; streak share of real test images {real:.2f}" if real else "trained at 32 px")
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=("classify", "samples"))
    p.add_argument(
        "results", nargs="+", help="the benchmark JSON; classify: several, each name from the first that finished it"
    )
    p.add_argument("--out", required=True)
    p.add_argument("--screen", help="classify: the training-switch screen JSON (a second panel)")
    p.add_argument("--lion-power", default="1", help="classify: LION's decay power of the image-unit curves")
    p.add_argument("--grids", help="samples: the folder holding grid_<name>_<size>px_<unit>.png")
    args = p.parse_args(argv)
    reports = [json.loads(Path(path).read_text()) for path in args.results]
    results = {}
    for name, result in ((k, v) for r in reports for k, v in r["results"].items()):
        if "error" in results.get(name, {"error": ""}):  # the first run of a name that finished
            results[name] = result
    report = {**reports[0], "results": results}
    if args.kind == "classify":
        screen = json.loads(Path(args.screen).read_text()) if args.screen else None
        plot_classify(report, screen, Path(args.out), args.lion_power)
    else:
        if not args.grids:
            p.error("samples needs --grids FOLDER")
        plot_samples(report, Path(args.grids), Path(args.out))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
