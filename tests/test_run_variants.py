"""scripts/run_variants.py: names trained side by side in their own processes, their reports merged into one."""

from __future__ import annotations

import json

from helpers import load_script, write_dark_light_folder


def test_gpu_ids_keep_the_callers_list(monkeypatch):
    module = load_script("run_variants")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3")
    assert module.gpu_ids(None) == ["2", "3"] and module.gpu_ids(1) == ["2"] and module.gpu_ids(0) == []


def test_classify_names_side_by_side(tmp_path):
    module = load_script("run_variants")
    data = tmp_path / "data"
    write_dark_light_folder(data)
    (data / "val").rename(data / "test")
    out = tmp_path / "out"
    tiny = "model.args={patch_size: 4, embed_dim: 16, depth: 1, num_heads: 2}"
    code = module.main(
        [
            *("--family", "classify", "softmax", "lightnet", "no_such_kind", "--data", str(data), "--out", str(out)),
            *("--work", str(tmp_path / "work"), "--tag", "pair", "--workers", "0", "--gpus", "0", "--"),
            *("--epochs", "1", "--warmup-epochs", "0", "--batch-size", "4", "--img-size", "32"),
            *("--set", tiny, "train.mixed_precision=no"),
        ]
    )
    assert code == 1  # no_such_kind failed; the others are kept
    report = json.loads((out / "classify_cifar10_pair.json").read_text())
    assert report["concurrent_runs"] == 3 and report["settings"]["kinds"] == ["softmax", "lightnet", "no_such_kind"]
    for kind in ("softmax", "lightnet"):
        result = report["results"][kind]
        assert result["model"] == f"{kind}_deit_tiny_patch16_224" and result["final"]["steps_run"] == 2
        assert len(result["loss_per_epoch"]) == 1
        assert (tmp_path / "work" / kind / kind / "metrics.jsonl").is_file()
    assert "error" in report["results"]["no_such_kind"]
