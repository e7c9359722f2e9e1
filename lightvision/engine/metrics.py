"""JSON-lines metrics log (``metrics.jsonl``) that stays continuous across resumes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lightvision.engine.fsio import atomic_write


class MetricsLogger:
    """Append one JSON record per call to ``run_dir/metrics.jsonl``; a no-op off the main process."""

    def __init__(self, run_dir: str | os.PathLike, is_main_process: bool = True, filename: str = "metrics.jsonl"):
        self.path = Path(run_dir) / filename
        self.enabled = is_main_process

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Append ``{"step": step, **metrics}`` and flush."""
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": int(step), **metrics}) + "\n")
            f.flush()

    def records(self) -> list[dict[str, Any]]:
        """All complete records (a line torn by a crash is skipped)."""
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out

    def resume(self, step: int) -> None:
        """Drop records logged after ``step`` (and torn lines) so the curve continues without duplicates."""
        if not self.enabled or not self.path.exists():
            return
        kept = [r for r in self.records() if r.get("step", 0) <= step]
        atomic_write(self.path, "".join(json.dumps(r) + "\n" for r in kept).encode("utf-8"))
