"""Tiny AutoencoderKL -> extract-latents -> train through the engine -> exact resume -> sample command."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from lightvision.diffusion.autoencoder import load_codec
from lightvision.diffusion.latents import LatentDataset, draw_latents, extract_latents, image_folder
from lightvision.diffusion.sample import sample_main
from lightvision.diffusion.train import load_recipe, train
from lightvision.engine.checkpoint import CheckpointManager


@pytest.fixture(scope="module")
def latents_dir(tmp_path_factory, vae_dir):
    root = tmp_path_factory.mktemp("data") / "images"
    rng = np.random.default_rng(0)
    for c in ("cat", "dog"):
        (root / c).mkdir(parents=True)
        for i in range(6):
            Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(root / c / f"{i}.png")
    out = root.parent / "latents"
    meta = extract_latents(root, out, load_codec("kl", str(vae_dir)), 16, batch_size=5, shard_size=5, progress=False)
    assert meta["count"] == 12 and meta["latent_shape"] == [4, 8, 8] and len(meta["shards"]) == 3
    return out


def recipe(run_dir, latents_dir, vae_dir, steps, extra=()):
    return load_recipe(
        None,
        [
            f"run.dir={run_dir}",
            "model.name=softmax_dit_s_2",
            "model.args={depth: 1, hidden_size: 32, num_heads: 2}",
            "data.source=latents",
            f"data.root={latents_dir}",
            "data.num_classes=2",
            "train.batch_size=4",
            "data.num_workers=0",
            f"autoencoder.path={vae_dir}",
            f"train.max_steps={steps}",
            "train.mixed_precision='no'",
            "train.ckpt_every_steps=2",
            "train.log_every=1",
            "train.ema_decay=0.9",
            "sample.every=4",
            "sample.num=2",
            "sample.steps=3",
            "optim.lr=1e-3",
            *extra,
        ],
    )


def test_latent_cache_holds_the_posterior_of_image_and_flip(latents_dir, vae_dir):
    data = LatentDataset(latents_dir)
    moments, label = data[7]
    assert moments.shape == (2, 2, 4, 8, 8) and label == 1 and data.scaling_factor == 0.5
    codec = load_codec("kl", str(vae_dir))
    x, _ = image_folder(latents_dir.parent / "images", 16, flip=False)[7]
    for view, image in enumerate((x, x.flip(-1))):
        mean, logvar = codec.moments(image[None])
        torch.testing.assert_close(moments[view, 0], mean[0], atol=2e-3, rtol=2e-3)  # float16 storage
        torch.testing.assert_close(moments[view, 1], logvar[0], atol=2e-3, rtol=2e-3)
    torch.manual_seed(0)
    z = draw_latents(moments[None].expand(4096, -1, -1, -1, -1, -1), 0.5)  # mixture of the two posteriors, scaled
    torch.testing.assert_close(z.mean(0), 0.5 * moments[:, 0].mean(0), atol=0.05, rtol=0)


def test_train_resume_and_sample(tmp_path, latents_dir, vae_dir):
    straight = train(recipe(tmp_path / "a", latents_dir, vae_dir, 4))
    assert straight["step"] == 4 and (tmp_path / "a" / "samples" / "step_0000004.png").is_file()
    records = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert {"loss", "mse", "vlb"} <= set(records[0])
    results = json.loads((tmp_path / "a" / "results.json").read_text())
    assert (results["step"], results["processes"], results["global_batch"], results["per_process_batch"]) == (
        4,
        1,
        4,
        4,
    )
    train(recipe(tmp_path / "b", latents_dir, vae_dir, 2))
    train(recipe(tmp_path / "b", latents_dir, vae_dir, 4), resume=True)
    from safetensors.torch import load_file

    a = load_file(CheckpointManager(tmp_path / "a").latest() / "ema.safetensors")
    b = load_file(CheckpointManager(tmp_path / "b").latest() / "ema.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    out = tmp_path / "samples"
    summary = sample_main(str(tmp_path / "a"), str(out), num_samples=3, batch_size=2, steps=4, cfg_scale=1.5)
    arr = np.load(out / "samples.npz")["arr_0"]
    assert arr.shape == (3, 16, 16, 3) and arr.dtype == np.uint8 and summary["processes"] == 1
    assert (out / "grid.png").is_file() and len(list((out / "images").glob("*.png"))) == 3
    again = tmp_path / "again"
    sample_main(str(tmp_path / "a"), str(again), num_samples=2, batch_size=1, steps=4, cfg_scale=1.5)
    np.testing.assert_array_equal(np.load(again / "samples.npz")["arr_0"], arr[:2])  # per-sample seeds
    with pytest.raises(ValueError, match="not divisible"):
        sample_main(str(tmp_path / "a"), str(tmp_path / "bad" / "out"), num_samples=1, image_size=10, steps=2)
    assert not (tmp_path / "bad").exists()  # no empty folders left behind


def test_a_sample_folder_is_read_by_fid_and_a_rerun_replaces_it(tmp_path, latents_dir, vae_dir, capsys):
    from lightvision.diffusion.fid import compute_fid
    from lightvision.engine.yardstick_net import YardstickNet, save_yardstick

    train(recipe(tmp_path / "run", latents_dir, vae_dir, 1, ["sample.every=100"]))
    out = tmp_path / "samples"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    sample_main(str(tmp_path / "run"), str(out), num_samples=6, batch_size=6, steps=2)
    sample_main(str(tmp_path / "run"), str(out), num_samples=4, batch_size=4, steps=2)
    assert "replacing an earlier run's samples" in capsys.readouterr().err
    assert sorted(p.name for p in (out / "images").iterdir()) == [f"00000{i}.png" for i in range(4)]
    assert (out / "notes.txt").read_text() == "mine" and np.load(out / "samples.npz")["arr_0"].shape[0] == 4
    yardstick = save_yardstick(YardstickNet([8, 8, 16, 16]), tmp_path / "y.safetensors")
    metrics = compute_fid(out, out / "samples.npz", feature_extractor=str(yardstick), cache_dir=tmp_path / "c")
    assert metrics["num_samples"] == 4 and abs(metrics["fid"]) < 1e-6  # the grid beside the images is no sample


def test_unconditional_model_refuses_guidance(tmp_path, latents_dir, vae_dir):
    train(recipe(tmp_path / "u", latents_dir, vae_dir, 1, ["data.num_classes=0", "sample.every=100"]))
    with pytest.raises(ValueError, match="guidance scale"):
        sample_main(str(tmp_path / "u"), str(tmp_path / "s"), num_samples=1, steps=2, cfg_scale=4.0)
    assert not (tmp_path / "s").exists()


def test_missing_autoencoder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_codec("kl", str(tmp_path / "no-such-vae"))
    with pytest.raises(FileNotFoundError, match="cannot load"):
        load_codec("kl", "nobody-here/no-such-vae")


def test_missing_image_folder_names_the_archive_beside_it(tmp_path):
    from lightvision.diffusion.latents import image_folder

    with pytest.raises(FileNotFoundError, match=r"'.*train' does not exist$"):
        image_folder(tmp_path / "train", 32, flip=False)
    (tmp_path / "cifar10-train-jpg.tar.gz").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"does not exist; unpack cifar10-train-jpg\.tar\.gz there first"):
        image_folder(tmp_path / "train", 32, flip=False)


def test_every_recipe_resolves_to_a_registered_model():
    from pathlib import Path

    from lightvision.diffusion.default import DIGITS_OVERRIDES
    from lightvision.diffusion.dit import size_preset

    recipes = sorted(Path(__file__).parents[2].joinpath("configs", "diffusion").glob("*.yaml"))
    assert {p.name for p in recipes} >= {f"imagenet256_{size}.yaml" for size in ("s", "b", "l", "xl")}
    for path in recipes:
        cfg = load_recipe(path)
        size_preset(cfg["model"]["name"])
        assert "base" not in cfg and cfg["optim"]["lr"] > 0
    lightnet = load_recipe(recipes[0].parent / "imagenet256_xl.yaml", ["data.root=/x", "model.name=lightnet_dit_xl_2"])
    assert size_preset(lightnet["model"]["name"])["attention"] == "lightnet"
    assert lightnet["train"]["ema_decay"] == 0.9999
    assert lightnet["train"]["batch_size"] == 32 and lightnet["data"]["root"] == "/x"
    assert load_recipe(None, DIGITS_OVERRIDES)["data"]["source"] == "digits"


def test_digits_pixels_are_8_bit_in_range():
    from lightvision.diffusion.latents import DigitsPixels

    train_set, test_set = DigitsPixels("train"), DigitsPixels("val")
    assert (len(train_set), len(test_set)) == (1437, 360)
    x, y = test_set[0]
    levels = (x + 1) * 127.5
    assert (
        x.shape == (1, 16, 16) and x.min() >= -1 and x.max() <= 1 and torch.allclose(levels, levels.round(), atol=1e-4)
    )


def test_pixel_flips_can_be_switched_off(tmp_path):
    from torchvision import transforms as T

    from lightvision.diffusion.latents import build_dataset

    for split in ("train", "test"):
        (tmp_path / split / "a").mkdir(parents=True)
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / split / "a" / "0.png")
    data = {
        "source": "imagefolder",
        "root": str(tmp_path),
        "image_size": 8,
        "train_split": "train",
        "val_split": "test",
    }

    def flips(dataset) -> bool:
        return any(isinstance(t, T.RandomHorizontalFlip) for t in dataset.transform.transforms)

    assert flips(build_dataset(data, "train")) and not flips(build_dataset(data, "val"))
    assert not flips(build_dataset({**data, "flip": False}, "train"))


@pytest.mark.slow
def test_compiled_lightnet_dit_trains_and_saves_plain_weights(tmp_path, latents_dir, vae_dir):
    """``train.compile=true`` on a LightNet-DiT (MD-TPE, MD-LRPE, the lightvision ops): finite losses, checkpoints
    without ``_orig_mod.`` prefixes that load into the plain model."""
    from safetensors.torch import load_file

    run = tmp_path / "run"
    out = train(
        recipe(run, latents_dir, vae_dir, 2, ["model.name=lightnet_dit_s_2", "train.compile=true", "sample.every=100"])
    )
    assert type(out["trainer"].model).__name__ == "OptimizedModule"
    assert np.isfinite(out["last_record"]["loss"])
    ckpt = CheckpointManager(run).latest()
    keys = set(load_file(ckpt / "model.safetensors"))
    assert keys == set(out["trainer"].unwrapped_model.state_dict()) and not any("_orig_mod" in k for k in keys)


def test_sample_refuses_bad_counts_before_writing(tmp_path):
    for bad in (0, -3):
        with pytest.raises(ValueError, match=f"--num-samples must be a positive integer, got {bad}"):
            sample_main(str(tmp_path / "no-run"), str(tmp_path / "out"), num_samples=bad)
    with pytest.raises(ValueError, match="--batch-size must be a positive integer"):
        sample_main(str(tmp_path / "no-run"), str(tmp_path / "out"), batch_size=0)
    assert not (tmp_path / "out").exists()


def test_pixel_training_resumes_with_the_same_flips(tmp_path):
    """Random flips of the pixel reader are keyed by the sample's slot: 2 steps + resume to 4 = 4 steps straight."""
    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (tmp_path / "train" / c).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(tmp_path / "train" / c / f"{i}.png")

    def run(name: str, steps: int, **kwargs):
        keys = ["model.name=softmax_dit_s_2", "model.args={depth: 1, hidden_size: 16, num_heads: 2}"]
        keys += ["data.source=imagefolder", f"data.root={tmp_path}", "data.image_size=8", "data.num_classes=2"]
        keys += ["train.batch_size=4", "data.num_workers=0", "autoencoder.kind=pixel", f"train.max_steps={steps}"]
        keys += ["train.mixed_precision='no'", "sample.every=100", f"run.dir={tmp_path / name}"]
        train(load_recipe(None, keys), **kwargs)
        return CheckpointManager(tmp_path / name).latest() / "model.safetensors"

    from safetensors.torch import load_file

    straight = load_file(run("straight", 4))
    run("stopped", 2)
    resumed = load_file(run("stopped", 4, resume=True))
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_corrupt_image_is_skipped_in_pixel_training(tmp_path):
    """Pixel-space training reads image folders through the same reader as classification: a truncated JPEG is
    skipped with a warning that names it, training goes on."""
    import io

    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (tmp_path / "train" / c).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(tmp_path / "train" / c / f"{i}.png")
    jpeg = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(jpeg, format="JPEG")
    (tmp_path / "train" / "a" / "broken.jpg").write_bytes(jpeg.getvalue()[:200])  # truncated: fails on decode
    cfg = load_recipe(
        None,
        [
            f"run.dir={tmp_path / 'run'}",
            "model.name=softmax_dit_s_2",
            "model.args={depth: 1, hidden_size: 16, num_heads: 2}",
            "data.source=imagefolder",
            f"data.root={tmp_path}",
            "data.image_size=8",
            "data.num_classes=2",
            "train.batch_size=5",
            "data.num_workers=0",
            "autoencoder.kind=pixel",
            "train.max_steps=1",
            "train.mixed_precision='no'",
            "sample.every=100",
        ],
    )
    with pytest.warns(UserWarning, match=r"skipping unreadable image .*broken\.jpg"):
        result = train(cfg)  # one batch of all 5 images: the broken one is read
    assert result["step"] == 1 and result["skipped_images"] >= 1


def test_default_job_takes_overrides_and_reports_a_reused_run(tmp_path, monkeypatch, capsys):
    """`lightvision diffusion train` without --config: key=value overrides apply to the built-in digits job; running
    it again reuses the finished run and says so instead of reporting a training time."""
    from lightvision import cli
    from lightvision.diffusion import train as diffusion_train

    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")  # restored afterwards (run_default sets it for device cpu)
    # the 360-image bits/dim measurement is not under test here (a minute on two cores): a constant stands in
    monkeypatch.setattr(diffusion_train, "evaluate_bits_per_dim", lambda *args, **kwargs: {"test_bits_per_dim": 7.0})
    args = [
        "diffusion",
        "train",
        "--out",
        str(tmp_path / "d"),
        "--device",
        "cpu",
        "train.max_steps=2",
        "model.args={depth: 1, hidden_size: 16, num_heads: 2, class_dropout_prob: 0.1}",
        "sample.num=2",
        "sample.steps=2",
    ]
    assert cli.run(args) == 0
    summary = json.loads((tmp_path / "d" / "summary.json").read_text())
    assert summary["steps"] == summary["steps_run"] == 2
    assert (tmp_path / "d" / "run" / "samples" / "step_0000002.png").is_file()  # the grid at the overridden last step
    assert "digits diffusion: 2 steps in" in capsys.readouterr().out
    assert cli.run(args) == 0
    assert "reused the finished run" in capsys.readouterr().out
    assert json.loads((tmp_path / "d" / "summary.json").read_text())["steps_run"] == 0

    # --resume-from PATH: a longer run in a new folder continues from that run's checkpoint (an override may follow)
    resume_from = ["--resume-from", str(tmp_path / "d" / "run")]
    assert cli.run([*args[:3], str(tmp_path / "e"), *args[4:], *resume_from, "train.max_steps=3"]) == 0
    summary = json.loads((tmp_path / "e" / "summary.json").read_text())
    assert (summary["steps"], summary["steps_run"]) == (3, 1)
    assert (tmp_path / "e" / "run" / "checkpoints" / "latest").is_file()

    # a run.dir= override trains there; the job's own folder (its summary) is made for it
    assert cli.run([*args[:3], str(tmp_path / "f"), *args[4:], f"run.dir={tmp_path / 'elsewhere'}"]) == 0
    assert json.loads((tmp_path / "f" / "summary.json").read_text())["steps_run"] == 2
    assert (tmp_path / "elsewhere" / "checkpoints" / "latest").is_file()


def test_recipe_run_folder_from_out(tmp_path, monkeypatch):
    """`diffusion train --config R --out D` trains into D, as `classify train` does; overrides may follow options."""
    from lightvision import cli

    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    recipe_file = tmp_path / "r.yaml"
    recipe_file.write_text(
        f"run: {{dir: {tmp_path / 'recipe_dir'}}}\nmodel:\n  name: softmax_dit_s_2\n"
        "  args: {depth: 1, hidden_size: 16, num_heads: 2}\n"
        "data: {source: digits, image_size: 8, channels: 1, num_classes: 10, num_workers: 0}\n"
        "autoencoder: {kind: pixel, path: null}\ntrain: {mixed_precision: 'no', ckpt_every_steps: 1, batch_size: 4}\n"
        "sample: {every: 100}\n"
    )
    out = tmp_path / "out"
    args = ["diffusion", "train", "--config", str(recipe_file), "train.log_every=1", "--out", str(out)]
    assert cli.run([*args, "--device", "cpu", "train.max_steps=1"]) == 0
    assert json.loads((out / "results.json").read_text())["step"] == 1 and not (tmp_path / "recipe_dir").exists()
    assert cli.run([*args, "--resume", "train.max_steps=2", "--device", "cpu"]) == 0  # --resume leaves the override
    assert json.loads((out / "results.json").read_text())["step"] == 2


@pytest.mark.parametrize("source", ["latents", "imagefolder"])
def test_recipe_without_data_root_is_named(source):
    from lightvision.diffusion.latents import build_dataset

    with pytest.raises(ValueError, match="data.root is not set: pass data.root=PATH"):
        build_dataset({"source": source, "root": None, "image_size": 8})


@pytest.mark.parametrize(
    "override, message",
    [
        ("sample.sampler=ddimm", r"unknown sample\.sampler 'ddimm'; valid: 'ddpm', 'ddim'"),
        ("diffusion.steps=0", r"diffusion\.steps must be a whole number at least 1, got 0"),
        ("sample.steps=2000", r"sample\.steps=2000 is more than the diffusion\.steps=1000 of training"),
        ("optim.lr=", r"optim\.lr has no value \(an empty 'optim\.lr=' reads as null\)"),
        ("optim.fused=2", r"optim\.fused must be true, false or null, got 2"),
        ("train.batch_size=0", r"train\.batch_size must be a whole number at least 1, got 0"),
        ("data.num_classes=1", r"data\.num_classes=1 is smaller than the 10 classes of the training data"),
    ],
)
def test_recipe_is_checked_before_training(tmp_path, override, message):
    """Every choice and count is refused at start-up, naming its key, before the run folder is written (a sampler
    typo used to surface only at the first sample grid, and that step's checkpoint was lost)."""
    from lightvision.diffusion.default import DIGITS_OVERRIDES

    cfg = load_recipe(None, [*DIGITS_OVERRIDES, f"run.dir={tmp_path / 'run'}", override])
    with pytest.raises(ValueError, match=message):
        train(cfg)
    assert not (tmp_path / "run").exists()


def test_checkpoint_with_a_config_of_the_old_layout_samples(tmp_path):
    """A run saved before the shared recipe schema (run_dir, seed, model.kwargs, data.batch_size, ...) is read back in
    the current layout and samples."""
    from lightvision.diffusion.default import DIGITS_OVERRIDES
    from lightvision.diffusion.sample import load_for_sampling
    from lightvision.diffusion.train import build_model, model_config

    cfg = load_recipe(None, [*DIGITS_OVERRIDES, "model.args={depth: 1, hidden_size: 16, num_heads: 2}"])
    old = json.loads(json.dumps(cfg))
    old.update(base=None, run_dir=str(tmp_path / "run"), seed=old["train"].pop("seed"))
    old["model"]["kwargs"] = old["model"].pop("args")
    old["data"].update(test_split=old["data"].pop("val_split"), batch_size=old["train"].pop("batch_size"))
    old["optim"]["warmup_steps"] = old.pop("sched")["warmup_steps"]
    old["train"].update(
        clip_grad=old["optim"].pop("clip_grad"),
        ckpt_every=old["train"].pop("ckpt_every_steps"),
        eval_every=old["train"].pop("eval_every_steps"),
    )
    old.pop("run")
    arch = model_config(cfg, 1, 16)
    CheckpointManager(tmp_path / "run").save(
        1, models={"model": build_model(arch), "ema": build_model(arch)}, model_config=arch, train_state={}, config=old
    )
    _, saved = load_for_sampling(tmp_path / "run", "cpu")
    assert saved == {**cfg, "run": {"dir": str(tmp_path / "run")}}
    sample_main(str(tmp_path / "run"), str(tmp_path / "out"), num_samples=2, batch_size=2, steps=2)
    assert np.load(tmp_path / "out" / "samples.npz")["arr_0"].shape == (2, 16, 16, 3)


def test_sampling_a_classifier_run_is_named(monkeypatch):
    """`diffusion sample` on a classifier's run folder says what the folder holds instead of "unknown model"."""
    from lightvision.diffusion import sample
    from lightvision.engine import checkpoint

    info = {"model_config": {"name": "lightnet_deit_tiny_patch16_224"}, "config": {}}
    monkeypatch.setattr(checkpoint, "read_checkpoint_config", lambda _: info)
    with pytest.raises(ValueError, match=r"runs/c holds a 'lightnet_deit_tiny_patch16_224', not a DiT"):
        sample.load_for_sampling("runs/c", "cpu")
