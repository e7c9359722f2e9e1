"""FID and test bits/dim during training: fixed-seed EMA samples and a fixed test subset scored every
train.eval_every_steps steps, logged and plotted, identical after a resume; the per-process split of the samples
counts each one once."""

import json

import numpy as np
import pytest
import torch

from lightvision.diffusion.default import DIGITS_OVERRIDES
from lightvision.diffusion.train import load_recipe, merge_by_index, sample_features, train


@pytest.fixture(scope="module")
def yardstick(tmp_path_factory):
    from lightvision.engine.yardstick_net import YardstickNet, save_yardstick

    torch.manual_seed(0)
    return str(save_yardstick(YardstickNet([8, 8, 16, 16]), tmp_path_factory.mktemp("yardstick") / "y.safetensors"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """40 held-out digits as an ADM .npz batch (uint8 [N, 16, 16, 3])."""
    from lightvision.diffusion.latents import DigitsPixels
    from lightvision.diffusion.sample import to_uint8

    images = torch.stack([DigitsPixels("val")[i][0] for i in range(40)])
    path = tmp_path_factory.mktemp("reference") / "digits.npz"
    np.savez(path, arr_0=to_uint8(images))
    return path


def recipe(run_dir, yardstick, reference, steps, extra=()):
    return load_recipe(
        None,
        [
            *DIGITS_OVERRIDES,
            f"run.dir={run_dir}",
            "model.args={depth: 1, hidden_size: 32, num_heads: 2}",
            f"train.max_steps={steps}",
            "train.ckpt_every_steps=2",
            "train.log_every=1",
            "sample.every=100",
            "train.eval_every_steps=2",
            "train.eval_samples=6",
            "eval.steps=2",
            "eval.batch_size=4",
            f"eval.feature_extractor={yardstick}",
            f"eval.reference={reference}",
            f"eval.cache_dir={run_dir}/cache",
            "eval.bpd_images=5",
            "eval.bpd_t_samples=3",
            "eval.bpd_buckets=2",
            *extra,
        ],
    )


def evals(run_dir):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in records if "fid" in r}


def test_fid_is_logged_plotted_and_survives_resume(tmp_path, yardstick, reference):
    straight = train(recipe(tmp_path / "a", yardstick, reference, 4))
    assert straight["step"] == 4
    logged = evals(tmp_path / "a")
    assert sorted(logged) == [2, 4]
    for record in logged.values():
        assert {"fid", "sfid", "precision", "recall", "kid"} <= set(record) and record["eval_samples"] == 6
        assert np.isfinite(record["fid"]) and record["fid"] > 0 and record["feature_space"].startswith("yardstick-")
        assert record["bpd_images"] == 5 and record["test_bits_per_dim"] > record["test_prior_bits_per_dim"] >= 0
        buckets = record["test_bits_per_dim_t"]
        assert [b["t"] for b in buckets] == [[0, 500], [500, 1000]]
        parts = record["test_prior_bits_per_dim"] + sum(b["bits_per_dim"] for b in buckets)
        assert parts == pytest.approx(record["test_bits_per_dim"], rel=1e-6)  # float32 sums
    assert logged[2]["test_bits_per_dim"] != logged[4]["test_bits_per_dim"]  # the trained weights are measured
    assert (tmp_path / "a" / "fid.png").is_file() and len(list((tmp_path / "a" / "cache").glob("ref-*.npz"))) == 1

    train(recipe(tmp_path / "b", yardstick, reference, 2))
    train(recipe(tmp_path / "b", yardstick, reference, 4), resume=True)
    resumed = evals(tmp_path / "b")
    assert sorted(resumed) == [2, 4]  # one record per evaluation, none repeated by the resume
    for step in (2, 4):  # fixed seeds, EMA weights restored exactly: the same samples, the same scores
        assert resumed[step]["fid"] == pytest.approx(logged[step]["fid"], rel=1e-6)
        assert resumed[step]["precision"] == logged[step]["precision"]
        assert resumed[step]["test_bits_per_dim"] == pytest.approx(logged[step]["test_bits_per_dim"], rel=1e-6)


def test_eval_settings_are_checked_before_training(tmp_path, yardstick, reference):
    with pytest.raises(ValueError, match="eval.reference=PATH"):
        train(recipe(tmp_path / "r", yardstick, None, 1, ["eval.reference=null"]))
    with pytest.raises(ValueError, match="precision / recall need more than 3 samples"):
        train(recipe(tmp_path / "r", yardstick, reference, 1, ["train.eval_samples=3"]))
    with pytest.raises(ValueError, match="eval.bpd_buckets=1001 is more than the diffusion.steps=1000"):
        train(recipe(tmp_path / "r", yardstick, reference, 1, ["eval.bpd_buckets=1001"]))
    with pytest.raises(ValueError, match="eval.bpd_images needs pixel-space training"):
        train(recipe(tmp_path / "r", yardstick, reference, 1, ["autoencoder.kind=kl"]))
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_samples_split_over_processes_count_once(tmp_path, yardstick, reference):
    """Three ranks' shares (rank_indices) merged by index are the one-process feature set, row for row."""
    from lightvision.diffusion.features import YardstickFeatures
    from lightvision.diffusion.sample import rank_indices
    from lightvision.diffusion.train import build_codec, build_diffusion, build_model, model_config

    cfg = recipe(tmp_path / "s", yardstick, reference, 1)
    torch.manual_seed(0)
    model = build_model(model_config(cfg, 1, 16)).eval()
    torch.nn.init.normal_(model.final_linear.weight, std=0.5)  # adaLN-Zero starts at zero output: make samples differ
    diffusion, codec = build_diffusion(cfg).respace(2), build_codec(cfg)
    net = YardstickFeatures(yardstick)
    e = cfg["eval"]
    whole = sample_features(model, diffusion, codec, rank_indices(7, 0, 1), e, net, "cpu")
    shares = [rank_indices(7, r, 3) for r in range(3)]
    assert sorted(i for share in shares for i in share) == list(range(7))
    merged = merge_by_index(
        [(share, sample_features(model, diffusion, codec, share, e, net, "cpu")) for share in shares]
    )
    assert merged.keys() == whole.keys() and not np.allclose(whole["pool"][0], whole["pool"][1])
    for name in whole:
        np.testing.assert_allclose(merged[name], whole[name], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="two processes"):
        merge_by_index([([0, 1], {"pool": whole["pool"][:2]}), ([1], {"pool": whole["pool"][1:2]})])
