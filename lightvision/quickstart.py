"""``lightvision quickstart``: the built-in default job of the README, offline, a few minutes on a CPU.

1. the core demo: every attention core on a real image grid, equivalent forms checked to agree;
2. a small LightNet classifier on scikit-learn's bundled handwritten digits, evaluated at its training
   resolution and a higher one (table, JSON, PNG plot);
3. a small pixel-space class-conditional diffusion model on the same digits: sample grid and test bits/dim.
"""

from __future__ import annotations

import json
import time
from pathlib import Path


def run_quickstart(out_dir: str = "runs/quickstart", device: str = "auto") -> int:
    """Run the three stages, print a summary and write ``summary.json``; returns the exit code."""
    from lightvision.classify.default import run_default as run_classifier
    from lightvision.demo import run_demo
    from lightvision.diffusion.default import run_default as run_diffusion
    from lightvision.engine.device import resolve_device

    device = resolve_device(device)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"device": device}

    start = time.time()
    print(f"== 1/3 attention cores on a real image grid ({device})")
    demo_status = run_demo(device=device)
    summary["demo"] = {"all_forms_agree": demo_status == 0, "seconds": round(time.time() - start, 1)}

    start = time.time()
    print("\n== 2/3 LightNet classifier on the bundled digits")
    summary["classify"] = run_classifier(str(out / "classify"), device)
    summary["classify"]["seconds"] = round(time.time() - start, 1)

    start = time.time()
    print("\n== 3/3 pixel-space diffusion on the bundled digits")
    summary["diffusion"] = run_diffusion(str(out / "diffusion"), device)
    summary["diffusion"]["seconds"] = round(time.time() - start, 1)

    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"\nquickstart done: {out / 'summary.json'}")
    print(json.dumps(summary, indent=2, default=str))
    return demo_status
