"""Sample grids of a diffusion comparison side by side, each titled with its name, bits/dim and streak share.

    python scripts/plot_sample_grids.py REPORT.json [REPORT.json ...] --grids DIR [DIR ...] --out FIGURE.png \
        [--names softmax lightnet ...]

Each REPORT.json is a ``lightvision.diffusion.benchmark`` / ``scripts/run_variants.py`` report and the DIR at the same
position holds its ``grid_<name>.png`` files (a name found in several reports is taken from the first). The first
report's real-image streak share goes in the figure's title.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reports", nargs="+")
    p.add_argument("--grids", nargs="+", required=True)
    p.add_argument("--out", required=True)
    p.add_argument(
        "--names",
        nargs="*",
        help="which results, in this order, each NAME or NAME=TITLE (default: every one with a grid)",
    )
    args = p.parse_args(argv)
    if len(args.grids) != len(args.reports):
        p.error(f"give one --grids folder per report: {len(args.reports)} reports, {len(args.grids)} folders")
    results, folder = {}, {}
    for path, grids in zip(args.reports, args.grids):
        for name, r in json.loads(Path(path).read_text())["results"].items():
            if "grid" in r and name not in results:
                results[name], folder[name] = r, Path(grids)
    report = json.loads(Path(args.reports[0]).read_text())
    titles = dict(entry.partition("=")[::2] for entry in (args.names or list(results)))
    names = list(titles)
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.7), squeeze=False)
    for ax, name in zip(axes[0], names):
        r = results[name]
        ax.imshow(Image.open(folder[name] / r["grid"]))
        ax.set_title(
            f"{titles[name] or name}\n{r['test_bits_per_dim']:.3f} bits/dim, streaks {r['streak_share']['mean']:.3f}",
            fontsize=8,
        )
        ax.axis("off")
    real = (report.get("real_streak_share") or {}).get("mean")
    steps = {results[n]["steps"] for n in names}
    fig.suptitle(
        f"CIFAR-10 DiT-S/2, {'/'.join(map(str, sorted(steps)))} steps; streak share of real test images {real:.3f}"
        if real is not None
        else "",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(args.out, dpi=110)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
