"""scripts/plot_resolution.py and the report's resolution tables: runs merged from several files (each name from the
first file that finished it), the head from the recipe or the family default."""

from __future__ import annotations

import json

from helpers import load_script


def _run(global_pool=None, top1=80.0):
    args = {"patch_size": 4, **({"global_pool": global_pool} if global_pool else {})}
    units = (("image", 5), ("token", 9))
    evals = [{"pos": pos, "img_size": s, "top1": top1 - (s != 32) * d} for pos, d in units for s in (32, 48, 64)]
    return {"recipe": {"model": {"name": "lion_s_snake_deit_tiny_patch16_224", "args": args}}, "eval": evals}


def test_classify_plot_merges_files_keeping_the_first_finished_run(tmp_path, monkeypatch):
    first = {"results": {"softmax": _run(top1=70.0), "lion_s_snake": {"error": "stopped"}}}
    second = {"results": {"lion_s_snake": _run(top1=90.0), "softmax": _run(top1=10.0)}}
    paths = []
    for i, report in enumerate((first, second)):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps(report))
    load_script("make_report")  # plot_resolution imports it from scripts/
    plot = load_script("plot_resolution")
    seen = {}
    monkeypatch.setattr(plot, "plot_classify", lambda table, screen, out, power: seen.update(table["results"]))
    assert plot.main(["classify", *map(str, paths), "--out", str(tmp_path / "f.png")]) == 0
    assert list(seen) == ["softmax", "lion_s_snake"]
    assert seen["softmax"]["eval"][0]["top1"] == 70.0 and seen["lion_s_snake"]["eval"][0]["top1"] == 90.0


def test_report_head_is_the_recipe_or_the_family_default():
    report = load_script("make_report")
    assert report.head_of(_run()) == "avg_all"  # LION's family default
    assert report.head_of(_run(global_pool="token")) == "token"
