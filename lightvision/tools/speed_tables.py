"""Markdown tables of the speed drivers' records (``scripts/bench_models.py``, ``scripts/profile_model.py``), shared by
those scripts, ``benchmarks/run_checks.sh`` and the report (``scripts/make_report.py``). Plain Python: no torch."""

from __future__ import annotations

__all__ = ["md_table", "ratio_table", "ratios", "split_table", "train_table"]


def md_table(header: list[str], rows: list[list]) -> str:
    """A markdown table of ``rows`` (cells turned into strings) under ``header``."""
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def train_table(records: list[dict]) -> str:
    """Markdown: one row per training record (model, attention, px, compile mode, batch), images/s and peak GB."""
    rows = [
        [
            r["model"],
            r["attention"],
            r["img_size"],
            r.get("compile") or "eager",
            r["batch"],
            *(("OOM", "OOM") if r.get("oom") else (f"{r['img_per_s']:.1f}", f"{r['peak_mem_gb']:.2f}")),
        ]
        for r in records
        if r["mode"] == "train"
    ]
    return md_table(["model", "attention", "px", "compile", "batch", "train img/s", "peak GB"], rows)


def ratios(records: list[dict]) -> list[dict]:
    """Each timed record's images/s and peak GB against softmax's record of the same model, px, mode and compile
    mode (None where softmax was not measured or ran out of memory)."""
    key = lambda r: (r["model"], r["img_size"], r["mode"], r.get("compile"))  # noqa: E731
    base = {key(r): r for r in records if r["attention"] == "softmax" and not r.get("oom") and "img_per_s" in r}
    rows = []
    for r in records:
        b = base.get(key(r))
        if r["attention"] != "softmax" and "img_per_s" in r and b is not None:
            rows.append(
                {
                    "model": r["model"],
                    "attention": r["attention"],
                    "img_size": r["img_size"],
                    "mode": r["mode"],
                    "compile": r.get("compile") or "eager",
                    "speed_vs_softmax": r["img_per_s"] / b["img_per_s"],
                    "memory_vs_softmax": r["peak_mem_gb"] / b["peak_mem_gb"],
                }
            )
    return rows


def ratio_table(rows: list[dict]) -> str:
    """Markdown of :func:`ratios`."""
    header = ["model", "attention", "px", "mode", "compile", "images/s vs softmax", "peak memory vs softmax"]
    keys = ("model", "attention", "img_size", "mode", "compile")
    cells = [[*(r[k] for k in keys), f"{r['speed_vs_softmax']:.2f}x", f"{r['memory_vs_softmax']:.2f}x"] for r in rows]
    return md_table(header, cells)


def split_table(results: list[dict]) -> str:
    """Markdown: per profile the step's GPU ms, matrix / attention core / rest ms (share) and the rest's top three."""
    rows = []
    for r in results:
        s, total = r["split"], r["cuda_ms_per_step"]
        parts = [f"{s[k + '_ms']:.1f} ({100 * s[k + '_ms'] / total:.0f}%)" for k in ("matrix", "attention", "rest")]
        rest = ", ".join(f"{t['name'][:40]} {t['ms']:.1f}" for t in s["rest_top"][:3])
        rows.append(
            [
                r["model"],
                r["img_size"],
                r["batch"],
                r["attention"],
                r["compile"] or "eager",
                f"{total:.1f}",
                *parts,
                rest,
            ]
        )
    header = ["model", "px", "batch", "attention", "compile", "step ms", "matrix ms", "attention core ms", "rest ms"]
    return md_table([*header, "largest rest"], rows)
