"""scripts/run_variants.py: names trained side by side in their own processes, their reports merged into one."""

from __future__ import annotations

import json
import signal

import pytest

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


def test_resume_keeps_finished_reports_without_running_them(tmp_path):
    """--resume: a name with a complete part report is merged as it is (no process started); one whose report holds
    an error (e.g. paused by SIGTERM) is not finished."""
    module = load_script("run_variants")
    parts = tmp_path / "out" / "parts"
    parts.mkdir(parents=True)
    done = {"params": 1e6, "steps": 4, "test_bits_per_dim": 3.0, "streak_share": {"mean": 0.1}, "train_steps_per_s": 2}
    (parts / "diffusion_cifar10_softmax.json").write_text(
        json.dumps({"settings": {"steps": 4}, "results": {"softmax": done}})
    )
    (parts / "diffusion_cifar10_lightnet.json").write_text(json.dumps({"results": {"lightnet": {"error": "stopped"}}}))
    assert module.finished(tmp_path / "out", "diffusion", "softmax")
    assert not module.finished(tmp_path / "out", "diffusion", "lightnet")
    assert not module.finished(tmp_path / "out", "diffusion", "lion_s")
    code = module.main(["softmax", "--resume", "--data", "unused", "--out", str(tmp_path / "out"), "--tag", "t"])
    report = json.loads((tmp_path / "out" / "diffusion_cifar10_t.json").read_text())
    assert code == 0 and report["results"]["softmax"] == done and report["paused"] == []
    assert not (tmp_path / "out" / "log_softmax.txt").exists()


def test_table_takes_a_data_parallel_record_without_streak_share():
    """A data-parallel run reports the evaluation during training (no samples after it, so no streak share)."""
    module = load_script("run_variants")
    single = {"params": 1e6, "steps": 4, "test_bits_per_dim": 3.0, "train_steps_per_s": 2}
    single["streak_share"] = {"mean": 0.1}
    parallel = {"params": 2e6, "steps": 4, "test_bits_per_dim": 2.5, "train_steps_per_s": 3, "fid": 500.0}
    rows = module.table({"results": {"softmax": single, "lightnet": parallel}}).splitlines()
    assert rows[3].startswith("| softmax | 1.0 | 4 | 3.000 |") and "| 0.100 | 2.00 |" in rows[3]
    assert rows[4] == "| lightnet | 2.0 | 4 | 2.500 | 500.00 | nan | nan | - | 3.00 |"


def test_data_parallel_names_take_their_own_gpus():
    module = load_script("run_variants")
    names = ["softmax", "lion_s", "lightnet"]
    procs = module.parse_procs(["lightnet=2"], names)
    assert procs == {"lightnet": 2}
    assert module.assign_gpus(names, procs, ["0", "1", "2", "3"]) == {"softmax": "0", "lion_s": "1", "lightnet": "2,3"}
    assert module.assign_gpus(names, procs, ["4", "5"]) == {"softmax": "4", "lion_s": "5", "lightnet": "4,5"}
    one, two = module.benchmark_command("diffusion", "softmax", 1), module.benchmark_command("diffusion", "lightnet", 2)
    assert one[1:] == ["-m", "lightvision.diffusion.benchmark", "softmax"]
    assert two[1:5] == ["-m", "accelerate.commands.launch", "--num_processes", "2"] and two[-2:] == [
        "lightvision.diffusion.benchmark",
        "lightnet",
    ]
    for bad in (["lightnet"], ["lightnet=0"], ["other=2"]):
        with pytest.raises(ValueError, match="give NAME=K"):
            module.parse_procs(bad, names)


def test_main_gives_the_callers_sigterm_handler_back(tmp_path):
    """main() pauses its runs on SIGTERM only while it watches them: a caller's process keeps its own handler after
    (a process forked later by the caller, e.g. a multiprocessing pool, must stay killable by SIGTERM)."""
    module = load_script("run_variants")
    parts = tmp_path / "out" / "parts"
    parts.mkdir(parents=True)
    done = {"params": 1e6, "steps": 4, "test_bits_per_dim": 3.0, "streak_share": {"mean": 0.1}, "train_steps_per_s": 2}
    report = {"settings": {"steps": 4}, "results": {"softmax": done}}
    (parts / "diffusion_cifar10_softmax.json").write_text(json.dumps(report))
    before = signal.getsignal(signal.SIGTERM)
    module.main(["softmax", "--resume", "--data", "unused", "--out", str(tmp_path / "out"), "--tag", "t"])
    assert signal.getsignal(signal.SIGTERM) is before
