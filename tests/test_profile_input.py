"""scripts/profile_input.py on the CPU: stage timings and the operations one batch dispatches, in a JSON."""

from __future__ import annotations

import json

import pytest

from helpers import load_script, write_dark_light_folder


def test_profile_on_the_cpu(tmp_path):
    write_dark_light_folder(tmp_path / "data", per_class=3, suffix=".jpg", varied_sizes=True)
    out = tmp_path / "profile.json"
    args = ["--data", str(tmp_path / "data"), "--out", str(out), "--img-size", "16", "--batch", "4", "--device", "cpu"]
    script = load_script("profile_input")
    assert script.main([*args, "--warmup", "1", "--repeats", "2"]) == 0
    report = json.loads(out.read_text())
    assert report["images"] == 4 and report["env"]["command"].startswith("python scripts/profile_input.py")
    assert set(report["median_ms"]) == set(script.STAGES)  # every stage, decode from page-locked bytes included
    assert report["rand_augment_mismatch"] == {"fraction": 0.0, "max_levels": 0}  # on the CPU both are PyTorch ops
    assert report["ops_dispatched"] > report["rand_augment_ops"] > 20 and report["top_ops"][0][1] > 1


def test_profile_refuses_an_empty_folder(tmp_path):
    with pytest.raises(SystemExit, match="no images under"):
        load_script("profile_input").main(["--data", str(tmp_path), "--out", str(tmp_path / "p.json")])
