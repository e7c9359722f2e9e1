"""LightNet Figure 2 on our kernels: attention time against sequence length, one scan versus two scans.

    python scripts/plot_attention.py benchmarks/results/attention_fwd_bwd_h100x1_20261125.json \
        --out benchmarks/results/attention_vs_length_h100x1_20261125

Reads result files of ``scripts/bench_attention.py`` (records with op, impl, N, B, mode, ms, ms_graph), merges
them (a later file wins for the same (op, impl, N, mode)), and writes ``OUT.md`` (one table per direction:
rows N, columns op/impl, medians in ms: CUDA-graph replays, the device time, by default; ``--timing eager``
for the eager calls, host overhead included), ``OUT.png`` (forward and forward + backward side by side, log-x, log-y),
and the ratio two-scan / one-scan per length: each LION scan kernel (``lion_d`` / ``lion_s``,
``triton_scan``) over the Triton one-scan (``lightnet``, ``triton``). The ratio table is printed last.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ONE_SCAN = ("lightnet", "triton")
TWO_SCANS = (("lion_d", "triton_scan"), ("lion_s", "triton_scan"))


def load_records(paths: list[str], key: str = "ms_graph") -> dict[tuple[str, str, int, str], dict]:
    """(op, impl, N, mode) -> record with its time under ``key`` copied to "t" (records without a finite one,
    e.g. out of memory, are left out), later files overriding earlier ones."""
    merged = {}
    for path in paths:
        for record in json.loads(Path(path).read_text())["records"]:
            if math.isfinite(record.get(key, math.nan)):
                merged[(record["op"], record["impl"], record["N"], record["mode"])] = dict(record, t=record[key])
    if not merged:
        raise SystemExit(f"no timing records in {', '.join(paths)}")
    return merged


def table(records: dict, mode: str) -> str:
    """Markdown table of the medians (ms) for one direction."""
    series = sorted({(op, impl) for op, impl, _, m in records if m == mode})
    lengths = sorted({n for _, _, n, m in records if m == mode})
    lines = [
        "| N | B | " + " | ".join(f"{op} {impl}" for op, impl in series) + " |",
        "| --- | --- | " + " | ".join("---" for _ in series) + " |",
    ]
    for n in lengths:
        batch = next(r["B"] for (_, _, rn, m), r in records.items() if rn == n and m == mode)
        cells = [
            f"{records[(op, impl, n, mode)]['t']:.3f}" if (op, impl, n, mode) in records else "-" for op, impl in series
        ]
        lines.append(f"| {n} | {batch} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio_table(records: dict) -> str:
    """Two-scan / one-scan time per length and direction."""
    lines = [
        "| N | mode | " + " | ".join(f"{op} scan / one scan" for op, _ in TWO_SCANS) + " |",
        "| --- | --- | --- | --- |",
    ]
    for mode in ("fwd", "fwdbwd"):
        for n in sorted({n for _, _, n, m in records if m == mode}):
            one = records.get((*ONE_SCAN, n, mode))
            if one is None:
                continue
            cells = [
                f"{records[(op, impl, n, mode)]['t'] / one['t']:.2f}x" if (op, impl, n, mode) in records else "-"
                for op, impl in TWO_SCANS
            ]
            lines.append(f"| {n} | {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(records: dict, path: Path, graph: bool) -> None:
    """Time against N for every (op, impl): forward and forward + backward side by side, log-x and log-y."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    colors = plt.get_cmap("tab20").colors  # one colour per series; dashed: outside references (PyTorch, fla, SDPA)
    series = sorted({(op, impl) for op, impl, _, _ in records})
    for ax, mode in zip(axes, ("fwd", "fwdbwd")):
        for idx, (op, impl) in enumerate(series):
            pts = sorted((n, r["t"]) for (o, i, n, m), r in records.items() if (o, i, m) == (op, impl, mode))
            if not pts:
                continue
            ax.plot(
                *zip(*pts),
                marker="o",
                color=colors[2 * idx % 20 + idx // 10 % 2],
                label=f"{op} {impl}",
                linestyle="-" if impl.startswith("triton") else "--",
                linewidth=2.5 if (op, impl) == ONE_SCAN else 1.5,
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N (B*N about 50k tokens, H = 6, d = 64, bf16)")
        ax.set_ylabel(f"ms (median{', CUDA graph' if graph else ', eager'})")
        ax.set_title({"fwd": "forward", "fwdbwd": "forward + backward"}[mode])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", help="JSON files written by scripts/bench_attention.py")
    parser.add_argument("--out", required=True, help="output path without suffix: writes OUT.md and OUT.png")
    parser.add_argument(
        "--timing",
        choices=["graph", "eager"],
        default="graph",
        help="CUDA-graph medians (device time, ms_graph) or eager calls (ms)",
    )
    args = parser.parse_args(argv)
    key = "ms_graph" if args.timing == "graph" else "ms"
    records = load_records(args.results, key)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    sections = []
    for mode in ("fwd", "fwdbwd"):
        sections.append(f"### {mode} ({args.timing} medians, ms)\n\n{table(records, mode)}")
    plot(records, out.with_suffix(".png"), args.timing == "graph")
    ratios = ratio_table(records)
    sections.append(f"### two scans / one scan\n\n{ratios}")
    out.with_suffix(".md").write_text("\n\n".join(sections) + "\n")
    print("\n\n".join(sections))
    return 0


if __name__ == "__main__":
    sys.exit(main())
