"""scripts/plot_classify.py: a PNG from a classification comparison's JSON; one clear line for a file without runs."""

from __future__ import annotations

import json

import pytest

from helpers import load_script


def test_plot_from_results(tmp_path):
    evals = [{"img_size": 32, "top1": 60.0}, {"img_size": 48, "top1": 50.0}]
    result = {"loss_per_epoch": [2.0, 1.5, 1.2], "top1_per_eval": [[1, 40.0], [3, 60.0]], "eval": evals}
    stopped = {"loss_per_epoch": [2.1, 1.6], "top1_per_eval": [[1, 38.0]]}  # no final evaluation
    data = {
        "results": {
            "softmax": result,
            "lion_s": {**result, "loss_per_epoch": [], "top1_per_eval": []},
            "lion_d": stopped,
            "broken": {"error": "x"},
        }
    }
    (tmp_path / "r.json").write_text(json.dumps(data))
    assert load_script("plot_classify").main([str(tmp_path / "r.json"), "--out", str(tmp_path / "r.png")]) == 0
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_refuses_a_file_without_runs(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"results": {"softmax": {"error": "CheckpointError: ..."}}}))
    with pytest.raises(SystemExit, match="holds no finished run"):
        load_script("plot_classify").main([str(tmp_path / "r.json"), "--out", str(tmp_path / "r.png")])
