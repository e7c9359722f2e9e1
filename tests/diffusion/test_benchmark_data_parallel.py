"""The CIFAR-10 diffusion benchmark under ``accelerate launch`` with two processes (gloo on the CPU): the global batch
split over them, the same run as one process, final numbers from the evaluation during training."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from lightvision.tools.launch import free_port


def test_two_processes_train_the_run_of_one(tmp_path):
    from lightvision.diffusion import benchmark
    from lightvision.engine.yardstick_net import YardstickNet, save_yardstick

    rng = np.random.default_rng(1)
    for split in ("train", "test"):
        for label in ("a", "b"):
            (tmp_path / "data" / split / label).mkdir(parents=True)
            for i in range(4):
                image = Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
                image.save(tmp_path / "data" / split / label / f"{i}.png")
    torch.manual_seed(0)
    yardstick = save_yardstick(YardstickNet([8, 8, 16, 16], 2), tmp_path / "yardstick.safetensors")
    args = ["softmax", "--data", str(tmp_path / "data"), "--feature-extractor", str(yardstick), "--steps", "4"]
    args += ["--batch-size", "4", "--eval-every", "2", "--bpd-images", "3", "--samples", "6", "--sample-steps", "2"]
    args += ["--sample-batch", "3", "--recipe", str(benchmark.CONFIGS / "diffusion" / "cifar10_paper.yaml")]
    args += ["--set", "data.num_workers=0", "train.mixed_precision=no", "data.num_classes=2"]
    args += ["model.args={depth: 1, hidden_size: 32, num_heads: 2}", "train.ckpt_every_steps=100"]

    def report(out):
        return json.loads((out / "diffusion_cifar10.json").read_text())["results"]["softmax"]

    assert benchmark.main([*args, "--out", str(tmp_path / "one"), "--work", str(tmp_path / "one" / "work")]) == 0
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--multi_gpu"]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    launch += ["--main_process_port", str(free_port()), "-m", "lightvision.diffusion.benchmark", *args]
    two = tmp_path / "two"
    done = subprocess.run([*launch, "--out", str(two), "--work", str(two / "work")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    one, both = report(tmp_path / "one"), report(two)
    assert both["processes"] == 2 and "processes" not in one and both["batch_size"] == one["batch_size"] == 4
    assert [c["step"] for c in both["curve"]] == [c["step"] for c in one["curve"]] == [2, 4]
    np.testing.assert_allclose(both["final_loss"], one["final_loss"], rtol=1e-5)
    for a, b in zip(both["curve"], one["curve"]):
        np.testing.assert_allclose(a["test_bits_per_dim"], b["test_bits_per_dim"], rtol=1e-5)
    assert both["test_bits_per_dim"] == round(both["curve"][-1]["test_bits_per_dim"], 4)
    assert both["fid"] == round(both["curve"][-1]["fid"], 4) and (two / "grid_softmax.png").is_file()


def test_a_launch_without_an_evaluation_at_the_last_step_is_refused(tmp_path, monkeypatch, capsys):
    """Several processes report the evaluation during training at the last step: --eval-every must divide --steps,
    and --batch-size must split over the processes; both refused with one line before any work."""
    from types import SimpleNamespace

    from lightvision.diffusion import benchmark

    monkeypatch.setattr(benchmark, "PartialState", lambda cpu: SimpleNamespace(num_processes=2, is_main_process=True))
    base = ["softmax", "--data", str(tmp_path), "--out", str(tmp_path / "out"), "--steps", "4"]
    for extra, message in (
        (["--eval-every", "3"], "give --eval-every dividing --steps 4"),
        (["--eval-every", "2", "--batch-size", "5"], "--batch-size 5 does not split over 2 processes"),
    ):
        with pytest.raises(SystemExit):
            benchmark.main([*base, *extra])
        assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
