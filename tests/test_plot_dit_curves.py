"""scripts/plot_dit_curves.py: per-run curves (finished from the report, unfinished from the run folder) as one JSON
and one PNG; one clear line when no run has an evaluation."""

from __future__ import annotations

import json

import pytest

from helpers import load_script


def _point(step, fid, bpd):
    return {"step": step, "fid": fid, "precision": 0.5, "recall": 0.4, "test_bits_per_dim": bpd}


def test_curves_of_finished_and_paused_runs(tmp_path):
    report = {
        "settings": {"kinds": ["softmax", "lightnet", "lion_s"]},
        "results": {
            "softmax": {"model": "softmax_dit_b_2", "params": 5, "curve": [_point(2, 9.0, 4.0), _point(4, 7.0, 3.5)]},
            "lightnet": {"error": "RuntimeError: stopped by SIGTERM at step 3; run again with --resume to finish"},
            "lion_s": {"error": "no report"},  # and no run folder: left out
        },
    }
    (tmp_path / "r.json").write_text(json.dumps(report))
    run = tmp_path / "work" / "lightnet" / "runs" / "lightnet"
    run.mkdir(parents=True)
    records = [{"step": 1, "loss": 1.0}, {**_point(2, 8.0, 3.9), "feature_space": "yardstick-x", "sfid": 1.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "plots" / "curves"
    module = load_script("plot_dit_curves")
    assert module.main([str(tmp_path / "r.json"), "--work", str(tmp_path / "work"), "--out", str(out)]) == 0
    runs = json.loads((tmp_path / "plots" / "curves.json").read_text())["runs"]
    assert list(runs) == ["softmax", "lightnet"]
    assert runs["softmax"]["finished"] and [c["fid"] for c in runs["softmax"]["curve"]] == [9.0, 7.0]
    assert not runs["lightnet"]["finished"]
    assert runs["lightnet"]["curve"] == [{**_point(2, 8.0, 3.9), "feature_space": "yardstick-x"}]
    assert (tmp_path / "plots" / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_refuses_a_report_without_curves(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"results": {"softmax": {"error": "x"}}}))
    with pytest.raises(SystemExit, match="has an evaluation during training"):
        load_script("plot_dit_curves").main([str(tmp_path / "r.json"), "--out", str(tmp_path / "c")])


def test_run_folders_without_a_report(tmp_path):
    """A call that ended before run_variants did leaves no report: every run folder is read, its logged median rate
    kept and its legend saying the step it reached."""
    for name, steps in (("softmax", (2, 4)), ("lightnet", (2,))):
        run = tmp_path / "work" / name / "runs" / name
        run.mkdir(parents=True)
        (run / "config.json").write_text(json.dumps({"train": {"max_steps": 4}}))
        records = [{"step": 1, "steps_per_s": 3.0}, {"step": 2, "steps_per_s": 9.0}, {"step": 3, "steps_per_s": 10.0}]
        records += [_point(s, 8.0 - s, 3.9) for s in steps]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    module = load_script("plot_dit_curves")
    out = tmp_path / "c"
    assert module.main([str(tmp_path / "missing.json"), "--work", str(tmp_path / "work"), "--out", str(out)]) == 0
    runs = json.loads((tmp_path / "c.json").read_text())["runs"]
    assert list(runs) == ["lightnet", "softmax"]
    assert runs["softmax"]["train_steps_per_s"] == 9.0 and runs["softmax"]["finished"]  # evaluated at max_steps
    assert not runs["lightnet"]["finished"]
    assert [c["step"] for c in runs["softmax"]["curve"]] == [2, 4]
    assert module.label("lightnet", runs["lightnet"]) == "lightnet (to step 2)"
    with pytest.raises(SystemExit, match="does not exist; give --work"):
        module.main([str(tmp_path / "missing.json"), "--out", str(out)])


def test_previous_curves_join_where_the_run_is_missing(tmp_path):
    """--previous: an earlier file's runs are plotted beside this report's, and a run of the same name here wins."""
    earlier = {
        "runs": {
            "softmax": {"finished": True, "curve": [_point(2, 9.0, 4.0)], "train_steps_per_s": 5.0},
            "lightnet": {"finished": False, "curve": [_point(2, 1.0, 1.0)], "train_steps_per_s": 1.0},
        }
    }
    (tmp_path / "earlier.json").write_text(json.dumps(earlier))
    report = {"results": {"lightnet": {"model": "m", "params": 1, "curve": [_point(2, 8.0, 3.9), _point(4, 7.0, 3.8)]}}}
    (tmp_path / "r.json").write_text(json.dumps(report))
    module = load_script("plot_dit_curves")
    argv = [str(tmp_path / "r.json"), "--out", str(tmp_path / "c"), "--previous", str(tmp_path / "earlier.json")]
    assert module.main(argv) == 0
    runs = json.loads((tmp_path / "c.json").read_text())["runs"]
    assert list(runs) == ["softmax", "lightnet"]
    assert runs["softmax"]["curve"] == earlier["runs"]["softmax"]["curve"]
    assert [c["fid"] for c in runs["lightnet"]["curve"]] == [8.0, 7.0]
