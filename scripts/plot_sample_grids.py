"""Sample grids of a diffusion comparison side by side, each titled with its name, bits/dim and streak share.

    python scripts/plot_sample_grids.py REPORT.json GRID_DIR --out FIGURE.png [--names softmax lightnet ...]

REPORT.json is a ``lightvision.diffusion.benchmark`` / ``scripts/run_variants.py`` report; GRID_DIR holds its
``grid_<name>.png`` files. The real test images' streak share goes in the figure's title.
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
    p.add_argument("report")
    p.add_argument("grids")
    p.add_argument("--out", required=True)
    p.add_argument("--names", nargs="*", help="which results, in this order (default: every one with a grid)")
    args = p.parse_args(argv)
    report = json.loads(Path(args.report).read_text())
    names = args.names or [n for n, r in report["results"].items() if "grid" in r]
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.7), squeeze=False)
    for ax, name in zip(axes[0], names):
        r = report["results"][name]
        ax.imshow(Image.open(Path(args.grids) / r["grid"]))
        ax.set_title(f"{name}\n{r['test_bits_per_dim']:.3f} bits/dim, streaks {r['streak_share']['mean']:.3f}",
                     fontsize=8)
        ax.axis("off")
    real = (report.get("real_streak_share") or {}).get("mean")
    steps = {report["results"][n]["steps"] for n in names}
    fig.suptitle(f"CIFAR-10 DiT-S/2, {'/'.join(map(str, sorted(steps)))} steps; streak share of real test images "
                 f"{real:.3f}" if real is not None else "", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(args.out, dpi=110)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
