"""Plot a CIFAR-10 classification comparison (``python -m lightvision.classify.benchmark``'s JSON): per attention the
mean training loss of every epoch, test top-1 during training (``top1_per_eval``, where recorded) and test top-1
against the evaluation size (the models trained at the first size; runs without a final evaluation are left out there).

    python scripts/plot_classify.py benchmarks/results/classify_cifar10_deit_t_patch4_200epochs_h200x2_20261126.json \\
        --out benchmarks/results/classify_cifar10_deit_t_patch4_200epochs_h200x2_20261126.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", help="classify_cifar10*.json with loss_per_epoch per attention")
    p.add_argument("--out", required=True, help="PNG to write")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = {k: r for k, r in json.loads(Path(args.results).read_text())["results"].items() if "error" not in r}
    if not results:
        sys.exit(f"plot_classify: {args.results} holds no finished run")
    fig, (loss_ax, curve_ax, top1_ax) = plt.subplots(1, 3, figsize=(16, 4))
    for i, (kind, r) in enumerate(results.items()):
        style = {"label": kind, "color": f"C{i}"}  # one colour per attention in every panel
        if r.get("loss_per_epoch"):
            loss_ax.plot(range(1, len(r["loss_per_epoch"]) + 1), r["loss_per_epoch"], **style)
        if r.get("top1_per_eval"):
            epochs, top1 = zip(*r["top1_per_eval"])
            curve_ax.plot(epochs, top1, marker=".", **style)
        if r.get("eval"):
            sizes = [e["img_size"] for e in r["eval"]]
            label = f"{kind} ({r['eval'][0]['top1']:.1f}%)"
            top1_ax.plot(sizes, [e["top1"] for e in r["eval"]], marker="o", **{**style, "label": label})
            top1_ax.set_xticks(sizes)
    loss_ax.set(xlabel="epoch", ylabel="training loss (epoch mean)", title="Training loss")
    curve_ax.set(xlabel="epoch", ylabel="test top-1 (%)", title="Top-1 during training (training size)")
    top1_ax.set(xlabel="evaluation size (px)", ylabel="test top-1 (%)", title="Top-1 at the training size and above")
    for ax in (loss_ax, curve_ax, top1_ax):
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
