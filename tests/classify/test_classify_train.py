"""End to end: `lightvision classify train` / `eval` on a tiny ImageFolder of real PNGs, the digits default,
and the errors bad input gets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers import tiny_classify_recipe, write_dark_light_folder
from lightvision import cli
from lightvision.classify.data import image_folder
from lightvision.engine import CheckpointError, ConfigError

TINY_ARGS = "model.args={patch_size: 4, embed_dim: 16, depth: 1, num_heads: 2}"


def write_image_folder(root: Path, per_class: int = 4, corrupt: bool = True) -> None:
    """root/{train,val}/{dark,light}/*.png: dark vs light 20x20 images (a learnable task), one corrupt file."""
    write_dark_light_folder(root, per_class)
    if corrupt:
        (root / "train" / "dark" / "0.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not an image")


def recipe(tmp_path: Path, data: Path) -> Path:
    return tiny_classify_recipe(tmp_path, data)


def test_train_then_eval_imagefolder(tmp_path, capsys):
    data, run = tmp_path / "data", tmp_path / "run"
    write_image_folder(data)
    with pytest.warns(UserWarning, match=r"skipping unreadable image .*0\.png"):
        assert (
            cli.run(
                ["classify", "train", "--config", str(recipe(tmp_path, data)), "--out", str(run), "--device", "cpu"]
            )
            == 0
        )
    config = json.loads((run / "config.json").read_text())
    assert config["run"]["dir"] == str(run) and config["model"]["args"]["embed_dim"] == 16
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4]  # 8 images / batch 4 x 2 epochs
    results = json.loads((run / "results.json").read_text())
    assert results["step"] == 4 and 0 <= results["val_top1"] <= 100 and "val_ema_top1" in results
    assert results["skipped_images"] >= 1  # the corrupt PNG, every epoch
    assert (run / "checkpoints" / "latest").is_file()

    capsys.readouterr()
    assert (
        cli.run(
            [
                "classify",
                "eval",
                "--checkpoint",
                str(run),
                "--data",
                str(data / "val"),
                "--img-size",
                "16",
                "24",
                "--device",
                "cpu",
                "--num-workers",
                "0",
            ]
        )
        == 0
    )
    table = capsys.readouterr().out
    assert "| 16 |" in table and "| 24 |" in table
    report = json.loads((run / "eval" / "eval.json").read_text())
    assert [r["img_size"] for r in report["results"]] == [16, 24] and report["weights"] == "ema"
    assert all(r["images"] == 8 and 0 <= r["top1"] <= r["top5"] <= 100 for r in report["results"])
    assert (run / "eval" / "eval.png").stat().st_size > 1000 and (run / "eval" / "eval.md").is_file()
    argv = ["classify", "eval", "--checkpoint", str(run), "--img-size", "24", "--device", "cpu", "--num-workers", "0"]
    assert cli.run([*argv, "--data", str(data / "val"), "--pos-unit", "token", "--out", str(tmp_path / "t")]) == 0
    assert json.loads((tmp_path / "t" / "eval.json").read_text())["model_args"] == {"pos_unit": "token"}
    positional = ["classify", "eval", str(run), *argv[4:], "--out", str(tmp_path / "p")]  # the run as RUN, as `sample`
    assert cli.run(positional) == 0 and json.loads((tmp_path / "p" / "eval.json").read_text())["results"]
    with pytest.raises(ValueError, match="two runs given"):
        cli.run([*positional, "--checkpoint", str(tmp_path)])

    # a validation folder with other classes than the training data
    other = tmp_path / "other"
    for label in ("a", "b", "c"):
        (other / label).mkdir(parents=True)
        Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(other / label / "0.png")
    with pytest.raises(ValueError, match="has 3 classes but the model was trained on 2"):
        cli.run(
            [
                "classify",
                "eval",
                "--checkpoint",
                str(run),
                "--data",
                str(other),
                "--img-size",
                "16",
                "--device",
                "cpu",
                "--num-workers",
                "0",
            ]
        )

    # the same run again without --resume is refused; a resume with another architecture too
    with pytest.raises(CheckpointError, match="already holds checkpoint"):
        cli.run(["classify", "train", "--config", str(recipe(tmp_path, data)), "--out", str(run), "--device", "cpu"])
    with pytest.raises(CheckpointError, match="another architecture"):
        cli.run(
            [
                "classify",
                "train",
                "--config",
                str(recipe(tmp_path, data)),
                "--out",
                str(run),
                "--device",
                "cpu",
                "--resume",
                "model.name=softmax_deit_tiny_patch16_224",
            ]
        )


def test_default_digits_job(tmp_path, capsys, monkeypatch):
    """`lightvision classify train` without --config: the digits default (shortened here), eval at 2 sizes."""
    monkeypatch.chdir(tmp_path)  # where the default runs/classify_default would go
    out = tmp_path / "default"
    assert (
        cli.run(
            [
                "classify",
                "train",
                "--out",
                str(out),
                "--device",
                "cpu",
                "sched.epochs=1",
                "aug.repeated_aug=2",
                TINY_ARGS,
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    result = json.loads(printed[printed.rindex('{\n  "model"') :])
    assert result["model"] == "lightnet_deit_tiny_patch16_224" and result["run_dir"] == str(out)
    report = json.loads((out / "eval" / "eval.json").read_text())
    assert [r["img_size"] for r in report["results"]] == [16, 24]
    assert all(r["images"] == 360 for r in report["results"])  # the held-out digits
    assert (out / "eval" / "eval.png").is_file()

    # running it again (the folder given as run.dir=) reuses the finished run, says so and evaluates that folder
    (out / "eval" / "eval.json").unlink()
    recipe_args = ["sched.epochs=1", "aug.repeated_aug=2", TINY_ARGS]
    assert cli.run(["classify", "train", "--device", "cpu", f"run.dir={out}", *recipe_args]) == 0
    printed = capsys.readouterr().out
    assert "reusing the finished run" in printed and '"steps_run": 0' in printed
    assert (out / "eval" / "eval.json").is_file() and not (tmp_path / "runs").exists()

    eval_args = ["classify", "eval", "--checkpoint", str(out), "--device", "cpu", "--num-workers", "0"]
    with pytest.raises(ValueError, match="trained on the bundled digits.*leave out --data"):  # not silently ignored
        cli.run([*eval_args, "--img-size", "16", "--data", str(tmp_path / "no-such-folder")])
    with pytest.raises(ValueError, match=r"--img-size 18: image size 18x18 is not divisible by the patch size 4"):
        cli.run([*eval_args, "--img-size", "16", "18", "--out", str(tmp_path / "eval18")])
    assert not (tmp_path / "eval18").exists()  # refused before 16 px ran
    with pytest.raises(ValueError, match=r"--img-size 1000000: sizes go up to 8192 px"):  # not a 4 TB allocation
        cli.run([*eval_args, "--img-size", "16", "1000000"])
    with pytest.raises(CheckpointError, match=r"has no EMA weights .*: use --weights model"):  # trained without EMA
        cli.run([*eval_args, "--img-size", "16", "--weights", "ema"])


def test_run_default_returns_metrics(tmp_path):
    from lightvision.classify.default import run_default

    metrics = run_default(str(tmp_path / "d"), "cpu", overrides=["sched.epochs=1", TINY_ARGS])
    assert set(metrics["eval"]) == {16, 24} and 0 <= metrics["top1"] <= 100
    assert metrics["top1"] == metrics["eval"][16]["top1"]
    assert Path(metrics["plot"]).is_file()


def test_digits_recipe_takes_a_precision_override():
    from lightvision.classify.default import DIGITS_RECIPE
    from lightvision.classify.train import load_recipe

    assert load_recipe(None, DIGITS_RECIPE)["train"]["mixed_precision"] == "no"
    assert load_recipe(None, [*DIGITS_RECIPE, "train.mixed_precision=bf16"])["train"]["mixed_precision"] == "bf16"


def test_data_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist: pass data.root"):
        image_folder(tmp_path / "nope", "train", None)
    with pytest.raises(FileNotFoundError, match="no 'val' folder"):
        image_folder(tmp_path, "val", None)
    (tmp_path / "cifar10-train-jpg.tar.gz").write_bytes(b"")  # the archive beside the missing folder is named
    with pytest.raises(FileNotFoundError, match=r"no 'train' folder .*; unpack cifar10-train-jpg\.tar\.gz there first"):
        image_folder(tmp_path, "train", None)
    (tmp_path / "val").mkdir()
    with pytest.raises(FileNotFoundError, match="has no class sub-folders"):
        image_folder(tmp_path, "val", None)
    (tmp_path / "val" / "cat").mkdir()
    with pytest.raises(FileNotFoundError, match="Every class folder needs images"):
        image_folder(tmp_path, "val", None)


def test_all_images_unreadable_is_an_error(tmp_path):
    folder = tmp_path / "train" / "a"
    folder.mkdir(parents=True)
    for i in range(3):
        (folder / f"{i}.jpg").write_bytes(b"garbage")
    ds = image_folder(tmp_path, "train", None)
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="unreadable images in a row"):
        ds[0]
    assert ds.skipped_images() >= 3


def test_a_failing_transform_is_raised_not_skipped(tmp_path):
    write_dark_light_folder(tmp_path, per_class=2)

    def broken(img):
        raise ValueError("augmentation bug")

    ds = image_folder(tmp_path, "train", broken)
    with pytest.raises(ValueError, match="augmentation bug"):
        ds[0]
    assert ds.skipped_images() == 0


def test_eval_refuses_other_checkpoints(tmp_path):
    from torch import nn

    from lightvision.engine import CheckpointManager

    CheckpointManager(tmp_path).save(
        1,
        models={"model": nn.Linear(2, 2)},
        model_config={"name": "dit_s_2"},
        train_state={"step": 1},
        config={"model": {}},
    )
    with pytest.raises(ValueError, match="not written by `lightvision classify train`"):
        cli.run(["classify", "eval", "--checkpoint", str(tmp_path), "--img-size", "16", "--device", "cpu"])


def test_recipe_errors(tmp_path):
    with pytest.raises(ConfigError, match="unknown config key 'optim.lrr'.*optim.lr"):
        cli.run(["classify", "train", "--config", str(recipe(tmp_path, tmp_path)), "optim.lrr=1"])
    with pytest.raises(ValueError, match="data.root is not set"):
        cli.run(["classify", "train", "--config", str(recipe(tmp_path, tmp_path)), "data.root=null", "--device", "cpu"])
    with pytest.raises(ValueError, match="unknown model 'vit_nope'; choose one of: softmax_deit_tiny"):
        cli.run(
            ["classify", "train", "--config", str(recipe(tmp_path, tmp_path)), "model.name=vit_nope", "--device", "cpu"]
        )
    with pytest.raises(CheckpointError, match="no latest checkpoint"):
        cli.run(["classify", "eval", "--checkpoint", str(tmp_path), "--img-size", "16", "--device", "cpu"])
    for override, message in [
        ("sched.epochs=0", r"sched\.epochs must be a whole number at least 1, got 0"),
        ("optim.opt=sgdd", r"unknown optim\.opt 'sgdd'; valid: .*'adamw'.*'sgd'"),
        ("train.batch_size=0", r"train\.batch_size must be a whole number at least 1, got 0"),
        ("optim.lr=", r"optim\.lr has no value"),
        ("train.mixed_precision=fp8", r"unknown train\.mixed_precision 'fp8'; valid: 'no', 'bf16', 'fp16'"),
        ("optim.fused=maybe", r"optim\.fused must be true, false or null, got 'maybe'"),
        ("optim.opt=lamb optim.fused=true", r"optimizer 'lamb' has no fused form; set optim\.fused to null or false"),
    ]:
        with pytest.raises(ValueError, match=message):  # before anything is built or written
            cli.run(["classify", "train", "--out", str(tmp_path / "e"), "--device", "cpu", *override.split()])
        assert not (tmp_path / "e").exists()


def test_eval_workers_fit_the_cores():
    from lightvision.engine.data import available_cpus, loader_workers

    assert loader_workers(10_000) == available_cpus() >= 1 and loader_workers(0) == 0
    with pytest.raises(ValueError, match=">= 0"):
        loader_workers(-1)


def test_no_aug_is_deterministic_and_runs_repeat_exactly(tmp_path):
    """aug.no_aug: resize + center crop only; with it (and no mixup / drop path) a run is a pure function of the
    seed, init included; train.max_steps stops early; the final eval counts every validation image once."""
    from lightvision.classify.data import train_transform

    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 24, 3), dtype=np.uint8))
    aug = {"no_aug": True, "auto_augment": "rand-m9-mstd0.5-inc1", "reprob": 1.0}
    fixed = train_transform(aug, 16, (0.5,) * 3, (0.5,) * 3)
    assert fixed(image).shape == (3, 16, 16) and all(fixed(image).equal(fixed(image)) for _ in range(3))
    randomised = train_transform({**aug, "no_aug": False}, 16, (0.5,) * 3, (0.5,) * 3)
    assert any(not randomised(image).equal(randomised(image)) for _ in range(3))

    data = tmp_path / "data"
    write_image_folder(data, per_class=6, corrupt=False)
    overrides = ["aug.no_aug=true", "aug.mixup=0", "aug.cutmix=0", "train.max_steps=2", "--device", "cpu"]
    curves = []
    for name in ("a", "b"):
        run = tmp_path / name
        assert (
            cli.run(["classify", "train", "--config", str(recipe(tmp_path, data)), "--out", str(run), *overrides]) == 0
        )
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        curves.append([(r["step"], r["loss"], r["lr"]) for r in records if "loss" in r])
        results = json.loads((run / "results.json").read_text())
        assert results["step"] == 2 and results["val_images"] == results["val_set_size"] == 12
        assert results["global_batch"] == 4 and results["processes"] == 1
    assert [s for s, *_ in curves[0]] == [1, 2] and curves[0] == curves[1]


def benchmark_args(tmp_path: Path, data: Path) -> list[str]:
    """classify.benchmark arguments: one epoch of a tiny model at batch 4, evaluated at 32 and 48 px."""
    return [
        *("--data", str(data), "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")),
        *("--epochs", "1", "--warmup-epochs", "0", "--batch-size", "4", "--workers", "0", "--img-size", "32", "48"),
        *("--set", TINY_ARGS, "train.mixed_precision=no"),
    ]


def test_cifar10_benchmark_runs_every_kind(tmp_path):
    """classify.benchmark: one recipe per kind, evaluated at every size; a failing kind is reported, not fatal."""
    from lightvision.classify import benchmark

    data = tmp_path / "data"
    write_image_folder(data, corrupt=False)
    (data / "val").rename(data / "test")  # the CIFAR-10 recipe validates on test/
    out = tmp_path / "out"
    code = benchmark.main(["softmax", "lightnet", "normalized", "no_such_kind", *benchmark_args(tmp_path, data)])
    assert code == 1  # one name failed
    report = json.loads((out / "classify_cifar10.json").read_text())
    assert report["env"]["command"].startswith("python -m lightvision.classify.benchmark")
    for kind in ("softmax", "lightnet", "normalized"):
        result = report["results"][kind]
        assert result["model"] == f"{kind}_deit_tiny_patch16_224"
        assert [e["img_size"] for e in result["eval"]] == [32, 48]
        assert all(e["images"] == 8 and 0 <= e["top1"] <= 100 for e in result["eval"])
        assert result["params"] > 0 and result["epochs"] == 1
        assert len(result["loss_per_epoch"]) == 1 and 0 < result["loss_per_epoch"][0] < 10
    assert "error" in report["results"]["no_such_kind"]


def test_cifar10_benchmark_resume(tmp_path, monkeypatch):
    """--resume continues a run from its checkpoints (a finished one trains no more and evaluates the same);
    without it a run folder with checkpoints fails the name; a run stopped by SIGTERM is an error, not a result."""
    from lightvision.classify import benchmark, train

    data = tmp_path / "data"
    write_image_folder(data, corrupt=False)
    (data / "val").rename(data / "test")
    report = tmp_path / "out" / "classify_cifar10.json"
    assert benchmark.main(["softmax", *benchmark_args(tmp_path, data)]) == 0
    first = json.loads(report.read_text())["results"]["softmax"]
    assert first["final"]["steps_run"] == first["final"]["step"] > 0

    assert benchmark.main(["softmax", *benchmark_args(tmp_path, data)]) == 1
    assert "already holds checkpoint" in json.loads(report.read_text())["results"]["softmax"]["error"]

    assert benchmark.main(["softmax", "--resume", *benchmark_args(tmp_path, data)]) == 0
    again = json.loads(report.read_text())["results"]["softmax"]
    assert again["final"]["steps_run"] == 0 and again["final"]["step"] == first["final"]["step"]
    accuracy = [[(e["top1"], e["top5"]) for e in r["eval"]] for r in (first, again)]
    assert accuracy[0] == accuracy[1]

    stopped = {**first["final"], "interrupted": True}
    monkeypatch.setattr(train, "train", lambda cfg, resume=False: stopped)
    assert benchmark.main(["softmax", "--resume", *benchmark_args(tmp_path, data)]) == 1
    assert "stopped by SIGTERM" in json.loads(report.read_text())["results"]["softmax"]["error"]


def test_benchmark_loss_per_epoch(tmp_path):
    """Mean of each epoch's logged windows, in epoch order; records without a window (results, evaluations) skipped."""
    from lightvision.classify.benchmark import loss_per_epoch
    from lightvision.engine import MetricsLogger

    log = MetricsLogger(tmp_path)
    for step, epoch, loss in ((1, 0, 2.0), (2, 0, 1.0), (3, 1, 0.5)):
        log.log(step, {"loss": loss, "epoch": epoch, "steps_per_s": 1.0})
    log.log(3, {"loss": 9.0, "epoch": 1, "val_top1": 50.0})
    assert loss_per_epoch(tmp_path) == [1.5, 0.5]


def test_benchmark_top1_per_eval(tmp_path):
    """[epoch, top-1] of every evaluation record in step order; a repeat of a step (the final record) counted once."""
    from lightvision.classify.benchmark import top1_per_eval
    from lightvision.engine import MetricsLogger

    log = MetricsLogger(tmp_path)
    log.log(2, {"loss": 1.0, "epoch": 0, "steps_per_s": 1.0})
    for step, top1 in ((4, 31.234), (8, 55.0), (8, 55.0), (12, 61.5)):
        log.log(step, {"val_top1": top1})
    assert top1_per_eval(tmp_path, 4) == [[1.0, 31.23], [2.0, 55.0], [3.0, 61.5]]


def test_benchmark_position_settings_and_mixed_sizes(tmp_path):
    """--eval-pos evaluates the same weights in each position setting (a LION decay power only where there are LION
    decays), and aug.sizes trains each step at one drawn size."""
    from lightvision.classify import benchmark

    data = tmp_path / "data"
    write_image_folder(data, corrupt=False)
    (data / "val").rename(data / "test")
    args = benchmark_args(tmp_path, data) + ["aug.sizes=[16, 32]", "--eval-pos", "image", "token", "image:p=1"]
    assert benchmark.main(["lion_d", "softmax", *args]) == 0
    results = json.loads((tmp_path / "out" / "classify_cifar10.json").read_text())["results"]
    lion = [(e["pos"], e["img_size"]) for e in results["lion_d"]["eval"]]
    assert lion == [(p, s) for p in ("image", "token", "image:p=1") for s in (32, 48)]
    assert [e["pos"] for e in results["softmax"]["eval"]] == ["image"] * 2 + ["token"] * 2
    assert results["lion_d"]["recipe"]["aug"]["sizes"] == [16, 32]
    assert benchmark.pos_setting("image:p=1,2", "lion_s_snake") == {
        "pos_unit": "image",
        "attn_kwargs": {"decay_power": [1.0, 2.0]},
    }
    assert benchmark.pos_setting("image:blocks=token:p=2", "lion_d") == {
        "pos_unit": {"embed": "image", "blocks": "token"},
        "attn_kwargs": {"decay_power": 2.0},
    }
    assert benchmark.pos_setting("token:embed=token", "lightnet") == {"pos_unit": "token"}
    assert benchmark.pos_setting("image:p=2", "lightnet") is None
    for bad in ("pixels", "image:q=1", "image:embed=", "image:embed=cells"):
        with pytest.raises(ValueError, match="write a unit"):
            benchmark.pos_setting(bad, "lion_d")


def test_step_size_is_drawn_per_step(tmp_path):
    """aug.sizes: one size per optimizer step from the step's BatchRandom (the same draw on a rerun), the batch
    resized on its device; sizes the patch does not divide are refused before training."""
    import torch

    from lightvision.classify.train import step_size
    from lightvision.engine.batch_random import BatchRandom, batch_seed, use_batch_random

    images = torch.rand(2, 3, 32, 32)
    picks = []
    for step in range(12):
        with use_batch_random(BatchRandom(batch_seed(0, step, 0))):
            picks.append(step_size(images, [16, 24, 32]).shape[-1])
            with use_batch_random(BatchRandom(batch_seed(0, step, 0))):
                assert step_size(images, [16, 24, 32]).shape[-1] == picks[-1]
    assert set(picks) == {16, 24, 32}
    assert step_size(images, None) is images
    data = tmp_path / "data"
    write_image_folder(data, corrupt=False)
    with pytest.raises(ValueError, match=r"aug.sizes: image size 18x18 is not divisible"):
        cli.run(["classify", "train", "--config", str(recipe(tmp_path, data)), "aug.sizes=[16, 18]"])


def test_checkpoint_with_a_config_of_the_old_layout_evaluates(tmp_path):
    """A classifier saved before the shared recipe schema (``model.img_size``) is read back in the current layout
    (``data.image_size``) and evaluates; the old key in a recipe is refused naming the new one."""
    from lightvision.classify.default import DIGITS_RECIPE
    from lightvision.classify.deit import create_from_config
    from lightvision.classify.evaluate import evaluate_checkpoint, load_classifier
    from lightvision.classify.train import load_recipe, model_config
    from lightvision.engine.checkpoint import CheckpointManager

    cfg = load_recipe(None, DIGITS_RECIPE)
    old = json.loads(json.dumps(cfg))
    old["model"]["img_size"] = old["data"].pop("image_size")
    mcfg = model_config(cfg, 10)
    CheckpointManager(tmp_path / "run").save(
        1, models={"model": create_from_config(mcfg)}, model_config=mcfg, train_state={"step": 1}, config=old
    )
    assert load_classifier(tmp_path / "run")[2] == cfg
    report = evaluate_checkpoint(tmp_path / "run", [16], out_dir=tmp_path / "eval", num_workers=0, device="cpu")
    assert report["results"][0]["images"] == 360
    with pytest.raises(ConfigError, match="'model.img_size' in override 'model.img_size=32' was renamed: use "):
        load_recipe(None, ["model.img_size=32"])
