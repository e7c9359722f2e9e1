"""Sample-quality metrics: the Frechet distance against closed forms; FID, sFID, IS and precision / recall with
generated Inception weights against numpy; identities; reference statistics (fid-ref, caches, .npz batches); feature
networks
(yardstick, classifier checkpoints) and their errors."""

import json
import re
import urllib.error
from unittest import mock

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import digits_classifier
from lightvision.cli import main
from lightvision.diffusion.fid import compute_fid, frechet_distance, inception_score, load_statistics


def write_set(folder, seed, n, shift=0.0, size=16):
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 200, size)[None, :, None] * np.ones((size, 1, 3))
    for i in range(n):
        img = np.clip(ramp + rng.normal(0, 25, (size, size, 3)) + shift, 0, 255).astype(np.uint8)
        Image.fromarray(img).save(folder / f"{i:03d}.png")
    return folder


def test_frechet_distance_closed_forms():
    mu1, mu2 = np.array([0.0, 1.0, 2.0]), np.array([1.0, 1.0, 0.0])
    s1, s2 = np.diag([1.0, 4.0, 9.0]), np.diag([4.0, 1.0, 1.0])
    expected = 1 + 4 + ((np.sqrt([1, 4, 9]) - np.sqrt([4, 1, 1])) ** 2).sum()
    assert frechet_distance(mu1, s1, mu2, s2) == pytest.approx(expected, rel=1e-10)
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(50, 5)), rng.normal(size=(50, 5))
    s1, s2 = a.T @ a / 50, b.T @ b / 50
    from scipy.linalg import sqrtm

    ref = np.trace(s1 + s2 - 2 * sqrtm(s1 @ s2).real)
    assert frechet_distance(mu1[:1].repeat(5), s1, mu1[:1].repeat(5), s2) == pytest.approx(ref, rel=1e-6)
    assert abs(frechet_distance(mu1, s1, mu1, s1)) < 1e-9


def test_inception_score_averages_consecutive_splits_with_a_short_last_one():
    logits = np.random.default_rng(0).normal(0, 3, (12, 10))

    def score(part):  # exp of the mean KL(p(y|x) || p(y)) over one split
        p = np.exp(part - part.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        return np.exp((p * (np.log(p) - np.log(p.mean(0, keepdims=True)))).sum(1).mean())

    expected = np.mean([score(logits[:5]), score(logits[5:10]), score(logits[10:])])  # 5 / 5 / 2, as ADM splits
    equal_thirds = np.mean([score(part) for part in np.split(logits, 3)])
    assert abs(expected - equal_thirds) > 1e-3
    assert inception_score(logits, split_size=5) == pytest.approx(expected, rel=1e-10)
    assert inception_score(logits[:4], split_size=5) == pytest.approx(score(logits[:4]), rel=1e-10)


@pytest.fixture(scope="module")
def inception_weights(tmp_path_factory):
    """Randomly initialised torch-fidelity InceptionV3 weights (Kaiming convs so that features are not degenerate)."""
    import torch_fidelity.feature_extractor_inceptionv3 as fe_mod

    with (
        mock.patch.object(fe_mod, "load_state_dict_from_url", lambda *a, **k: {}),
        mock.patch.object(fe_mod.FeatureExtractorInceptionV3, "load_state_dict", lambda self, sd: None),
    ):
        torch.manual_seed(0)
        net = fe_mod.FeatureExtractorInceptionV3("inception-v3-compat", ["2048"])
    for m in net.modules():
        if isinstance(m, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
    path = tmp_path_factory.mktemp("inception") / "weights.pth"
    torch.save(net.state_dict(), path)
    return str(path)


@pytest.fixture(scope="module")
def yardstick(tmp_path_factory):
    """A randomly initialised narrow yardstick saved as the trainer saves it (a fast feature network)."""
    from lightvision.engine.yardstick_net import YardstickNet, save_yardstick

    torch.manual_seed(0)
    return str(save_yardstick(YardstickNet([8, 8, 16, 16]), tmp_path_factory.mktemp("yardstick") / "y.safetensors"))


@pytest.fixture
def no_hub_weights(tmp_path, monkeypatch):
    """An empty torch hub cache and no packaged yardstick: nothing to fall back on."""
    import lightvision.engine.yardstick_net as ys

    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    monkeypatch.setattr(ys, "PACKAGED", tmp_path / "absent.safetensors")


RGB_DATA = {
    "data.in_chans": 3,
    "data.source": "imagefolder",
    "data.mean": "[0.5, 0.5, 0.5]",
    "data.std": "[0.5, 0.5, 0.5]",
}


def numpy_reference_metrics(sample_files, ref_files, weights):
    """FID, sFID, IS and k = 3 precision / recall written out in numpy / scipy from the raw torch-fidelity network."""
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    net = FeatureExtractorInceptionV3(
        "inception-v3-compat", ["2048", "logits_unbiased"], feature_extractor_weights_path=weights
    )
    grabbed = []
    net.Mixed_6d.branch1x1.conv.register_forward_hook(lambda m, i, o: grabbed.append(o))

    def run(files):
        x = torch.from_numpy(np.stack([np.asarray(Image.open(f).convert("RGB")) for f in files])).permute(0, 3, 1, 2)
        grabbed.clear()
        with torch.no_grad():
            pool, logits = net(x)
        conv = net.Mixed_6d.branch1x1
        spatial = torch.relu(conv.bn(grabbed[0]))[:, :7].permute(0, 2, 3, 1).reshape(len(files), -1)  # mixed_6/conv
        return pool.double().numpy(), spatial.double().numpy(), logits.double().numpy()

    def fid(a, b):  # S_a = A A^T (A = centred rows / sqrt(n - 1)): tr sqrt(S_a S_b) = nuclear norm of A^T B
        ca, cb = (a - a.mean(0)) / np.sqrt(len(a) - 1), (b - b.mean(0)) / np.sqrt(len(b) - 1)
        nuclear = np.linalg.svd(ca @ cb.T, compute_uv=False).sum()
        return ((a.mean(0) - b.mean(0)) ** 2).sum() + (ca**2).sum() + (cb**2).sum() - 2 * nuclear

    def radii(a):  # squared distance to the 3rd nearest other point
        d = ((a[:, None] - a[None]) ** 2).sum(-1)
        return np.sort(d, axis=1)[:, 3]

    def covered(points, centres):
        d = ((points[:, None] - centres[None]) ** 2).sum(-1)
        return (d <= radii(centres)[None]).any(1).mean()

    (sp, ss, sl), (rp, rs, _) = run(sample_files), run(ref_files)
    p = np.exp(sl - sl.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    isc = np.exp((p * (np.log(p) - np.log(p.mean(0, keepdims=True)))).sum(1).mean())
    return {
        "fid": fid(sp, rp),
        "sfid": fid(ss, rs),
        "isc": isc,
        "precision": covered(sp, rp),
        "recall": covered(rp, sp),
    }


@pytest.mark.slow
def test_inception_metrics_match_numpy(tmp_path, inception_weights):
    ref = write_set(tmp_path / "ref", 0, 5)  # Inception runs at 299 px: a few images keep the CPU test short
    samples = write_set(tmp_path / "samples", 1, 5, shift=30)
    cache = tmp_path / "cache"
    ours = compute_fid(samples, ref, inception_weights=inception_weights, cache_dir=cache, num_samples=None)
    expected = numpy_reference_metrics(sorted(samples.glob("*.png")), sorted(ref.glob("*.png")), inception_weights)
    for key, value in expected.items():
        assert ours[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert ours["fid"] > 1 and ours["sfid"] > 1 and 1 <= ours["isc"] and {"kid", "kid_std"} <= set(ours)
    assert (ours["num_samples"], ours["num_reference"]) == (5, 5) and ours["feature_space"].startswith("inception-")


@pytest.mark.slow
def test_an_adm_reference_batch_scores_fid_with_its_stored_gaussians(tmp_path, inception_weights, yardstick, capsys):
    """As the ADM evaluator: FID / sFID against the batch's stored mu / sigma, mu_s / sigma_s; precision / recall
    from its images (arr_0)."""
    arr = np.stack([np.asarray(Image.open(p)) for p in sorted(write_set(tmp_path / "imgs", 0, 5, size=32).iterdir())])
    rng = np.random.default_rng(1)
    stored = {}
    for mu, sigma, dim in (("mu", "sigma", 2048), ("mu_s", "sigma_s", 2023)):
        a = rng.normal(size=(dim, 8))
        stored[mu], stored[sigma] = rng.normal(size=dim), a @ a.T / 8
    adm = tmp_path / "VIRTUAL_tiny_labeled.npz"
    np.savez(adm, arr_0=arr, **stored)
    cache = tmp_path / "cache"
    out = compute_fid(adm, adm, inception_weights=inception_weights, cache_dir=cache, num_samples=None)
    own = load_statistics(next(cache.glob("ref-*.npz")))  # the Gaussians of arr_0: the samples' too
    for metric, mu, sigma in (("fid", "mu", "sigma"), ("sfid", "mu_s", "sigma_s")):
        expected = frechet_distance(own[mu], own[sigma], stored[mu], stored[sigma])
        assert out[metric] == pytest.approx(expected, rel=1e-9) and expected > 1, metric  # arr_0's own: 0
    assert out["precision"] == out["recall"] == 1.0 and out["num_reference"] == 5

    stats = tmp_path / "stats.npz"
    main(["diffusion", "fid-ref", str(adm), "--out", str(stats), "--inception-weights", inception_weights])
    with np.load(stats) as f:
        assert all(np.array_equal(f[k], v) for k, v in stored.items()) and f["features"].shape == (5, 2048)
    other_space = compute_fid(adm, adm, feature_extractor=yardstick, cache_dir=cache)  # not the stored ones' space
    assert abs(other_space["fid"]) < 1e-6 and abs(other_space["sfid"]) < 1e-6


def test_reference_statistics_are_computed_once_and_read_back(tmp_path, yardstick, capsys, cli_error):
    ref = write_set(tmp_path / "ref", 0, 12, size=32)
    samples = write_set(tmp_path / "samples", 1, 10, size=32, shift=40)
    cache = tmp_path / "cache"
    folder = compute_fid(samples, ref, feature_extractor=yardstick, cache_dir=cache)
    assert "fewer than 50000" in capsys.readouterr().err
    assert {"fid", "sfid", "precision", "recall", "kid"} <= set(folder) and "isc" not in folder
    cached = sorted(cache.glob("ref-*.npz"))
    renamed = ref.rename(tmp_path / "renamed")  # same content, other name: the cache answers
    with mock.patch(
        "lightvision.diffusion.fid.extract_features",
        wraps=__import__("lightvision.diffusion.fid", fromlist=["x"]).extract_features,
    ) as spy:
        again = compute_fid(samples, renamed, feature_extractor=yardstick, cache_dir=cache)
    assert spy.call_count == 1 and sorted(cache.glob("ref-*.npz")) == cached and again["fid"] == folder["fid"]

    stats = tmp_path / "stats.npz"
    main(["diffusion", "fid-ref", str(renamed), "--out", str(stats), "--feature-extractor", yardstick])
    summary = json.loads(capsys.readouterr().out)
    assert summary["num_images"] == 12 and "sfid" in summary["metrics"]
    with np.load(stats) as f:
        assert {"mu", "sigma", "mu_s", "sigma_s", "features", "feature_space"} <= set(f.files)
        assert f["features"].shape == (12, 16) and f["mu_s"].shape == (8 * 8 * 7,)
    arr = np.stack([np.asarray(Image.open(p)) for p in sorted(renamed.glob("*.png"))])
    np.savez(tmp_path / "ref_batch.npz", arr_0=arr)  # the ADM layout
    samples_npz = tmp_path / "samples.npz"
    np.savez(samples_npz, arr_0=np.stack([np.asarray(Image.open(p)) for p in sorted(samples.glob("*.png"))]))
    for reference in (stats, tmp_path / "ref_batch.npz"):
        out = compute_fid(samples_npz, reference, feature_extractor=yardstick, cache_dir=cache)
        for key in ("fid", "sfid", "precision", "recall", "kid"):
            assert out[key] == pytest.approx(folder[key], rel=1e-9), (reference.name, key)
    itself = compute_fid(tmp_path / "ref_batch.npz", stats, feature_extractor=yardstick)  # the identities
    assert abs(itself["fid"]) < 1e-6 and abs(itself["sfid"]) < 1e-6 and itself["precision"] == itself["recall"] == 1.0

    other = tmp_path / "other.safetensors"
    from lightvision.engine.yardstick_net import YardstickNet, save_yardstick

    save_yardstick(YardstickNet([8, 8, 16, 16]), other)
    assert re.search(
        "feature space 'yardstick-.*', not 'yardstick-",
        cli_error(["diffusion", "fid", str(samples), "--reference", str(stats), "--feature-extractor", str(other)]),
    )
    assert re.search(
        "is neither an image folder nor an .npz",
        cli_error(
            ["diffusion", "fid-ref", str(tmp_path / "nothing"), "--out", str(stats), "--feature-extractor", yardstick]
        ),
    )


def test_fid_help_names_the_metrics_and_the_output_keys(capsys):
    with pytest.raises(SystemExit):
        main(["diffusion", "fid", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for word in ("FID", "sFID", "IS", "precision", "recall", "KID", "JSON", "feature_space", "num_reference"):
        assert re.search(rf"\b{word}\b", text), word


def test_unreadable_images_are_skipped_and_named(tmp_path, yardstick):
    ref = write_set(tmp_path / "ref", 0, 8, size=32)
    samples = write_set(tmp_path / "samples", 1, 8, size=32, shift=40)
    clean = compute_fid(samples, ref, feature_extractor=yardstick, cache_dir=tmp_path / "c1", num_samples=6)
    (samples / "00.png").write_bytes((samples / "001.png").read_bytes()[:200])  # truncated, sorted first
    (samples / "002a.png").write_bytes(b"")
    (ref / "004a.png").write_bytes(b"not an image")
    with pytest.warns(UserWarning) as caught:
        skipped = compute_fid(samples, ref, feature_extractor=yardstick, cache_dir=tmp_path / "c2", num_samples=6)
    messages = [str(w.message) for w in caught]
    assert any(re.search(r"skipped 2 unreadable image\(s\) in .*samples: 00\.png, 002a\.png$", m) for m in messages)
    assert any(re.search(r"skipped 1 unreadable image\(s\) in .*ref: 004a\.png$", m) for m in messages)
    assert skipped == pytest.approx(clean) and skipped["num_samples"] == 6  # the next readable images fill in


def test_bad_counts_and_devices_are_refused_in_one_line(tmp_path, monkeypatch, cli_error):
    ref = write_set(tmp_path / "ref", 0, 4, size=32)
    fid = ["diffusion", "fid", str(ref), "--reference", str(ref), "--feature-extractor", "yardstick"]
    assert "--num-samples must be a positive integer, got -1" in cli_error([*fid, "--num-samples", "-1"])
    assert "--batch-size must be a positive integer, got 0" in cli_error([*fid, "--batch-size", "0"])
    fid_ref = ["diffusion", "fid-ref", str(ref), "--out", str(tmp_path / "s.npz"), "--feature-extractor", "yardstick"]
    assert "--batch-size must be a positive integer, got -2" in cli_error([*fid_ref, "--batch-size", "-2"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for argv in (fid, fid_ref):
        assert "--device cuda was asked for but no GPU is visible" in cli_error([*argv, "--device", "cuda"])
    assert not list(tmp_path.glob("s*.npz"))


def test_unusable_files_are_one_line_errors(tmp_path, yardstick, cli_error):
    ref = write_set(tmp_path / "ref", 0, 4, size=32)
    big = write_set(tmp_path / "big", 0, 4, size=64)
    (tmp_path / "text.npz").write_text("not an archive")
    np.savez(tmp_path / "whole.npz", arr_0=np.zeros((2, 8, 8, 3), np.uint8))
    (tmp_path / "cut.npz").write_bytes((tmp_path / "whole.npz").read_bytes()[:300])
    np.savez(tmp_path / "objects.npz", arr_0=np.array([{"a": 1}, None], dtype=object))
    np.savez(tmp_path / "latents.npz", arr_0=np.zeros((2, 4, 8, 8), np.float16))
    np.savez(tmp_path / "empty.npz", arr_0=np.zeros((0, 8, 8, 3), np.uint8))
    np.savez(tmp_path / "other.npz", labels=np.zeros(3))
    fid = ["diffusion", "fid", "--reference", str(ref), "--feature-extractor", yardstick, "--cache-dir", str(tmp_path)]
    for name in ("text", "cut", "objects"):
        assert re.search(
            rf"{name}\.npz is no readable \.npz of plain arrays", cli_error([*fid, str(tmp_path / f"{name}.npz")])
        )
    assert "arr_0 must be uint8 [N, H, W, 3] with N > 0, got float16 [2, 4, 8, 8]" in cli_error(
        [*fid, str(tmp_path / "latents.npz")]
    )
    assert "with N > 0, got uint8 [0, 8, 8, 3]" in cli_error([*fid, str(tmp_path / "empty.npz")])
    assert "holds no images (arr_0; it has labels)" in cli_error([*fid, str(tmp_path / "other.npz")])
    assert "spatial features of different sizes (1792 vs 448 values)" in cli_error([*fid, str(big)])

    weights = ["diffusion", "fid", str(ref), "--reference", str(ref), "--cache-dir", str(tmp_path)]
    (tmp_path / "notes.pth").write_text("not weights")
    torch.save({"fc.weight": torch.zeros(2, 2)}, tmp_path / "other.pth")
    for name in ("notes.pth", "other.pth"):
        line = cli_error([*weights, "--inception-weights", str(tmp_path / name)])
        assert f"{name} holds no Inception-v3 weights" in line and "weights-inception-2015-12-05" in line

    fid_ref = ["diffusion", "fid-ref", str(ref), "--feature-extractor", yardstick]
    (tmp_path / "stats").mkdir()
    for out in (tmp_path / "stats", tmp_path / "stats.json"):
        assert "must name an .npz file" in cli_error([*fid_ref, "--out", str(out)])
    assert list((tmp_path / "stats").iterdir()) == [] and not list(tmp_path.glob("*.tmp.npz"))


def test_fid_leaves_no_cache_in_the_working_directory(tmp_path, monkeypatch, capsys):
    run = digits_classifier(tmp_path / "clf", **RGB_DATA)
    ref = write_set(tmp_path / "ref", 0, 5)
    samples = write_set(tmp_path / "samples", 1, 5)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    main(["diffusion", "fid", str(samples), "--reference", str(ref), "--feature-extractor", run])
    assert "fid" in json.loads(capsys.readouterr().out)
    assert list(work.iterdir()) == [] and len(list((tmp_path / "xdg" / "lightvision" / "fid").glob("ref-*.npz"))) == 1


def test_offline_without_inception_weights_is_one_line(tmp_path, no_hub_weights, cli_error):
    import torch_fidelity.feature_extractor_inceptionv3 as fe_mod

    ref = write_set(tmp_path / "ref", 0, 3)
    offline = urllib.error.URLError("[Errno -3] Temporary failure in name resolution")
    with mock.patch.object(fe_mod, "load_state_dict_from_url", side_effect=offline):
        message = cli_error(["diffusion", "fid", str(ref), "--reference", str(ref), "--cache-dir", str(tmp_path / "c")])
    assert "--inception-weights FILE" in message and "URLError" in message
    with mock.patch.object(fe_mod, "load_state_dict_from_url", side_effect=offline):  # a wrong reference comes first
        message = cli_error(["diffusion", "fid", str(ref), "--reference", str(tmp_path / "nowhere")])
    assert "reference" in message and "nowhere' does not exist" in message
    assert re.search(
        "Inception weights '.*missing.pth' not found",
        cli_error(
            [
                "diffusion",
                "fid",
                str(ref),
                "--reference",
                str(ref),
                "--inception-weights",
                str(tmp_path / "missing.pth"),
            ]
        ),
    )


def test_cifar_sized_images_default_to_the_packaged_yardstick(
    tmp_path, yardstick, no_hub_weights, monkeypatch, cli_error
):
    import lightvision.engine.yardstick_net as ys

    ref = write_set(tmp_path / "ref", 0, 5, size=32)
    assert re.search(
        "no packaged CIFAR-10 yardstick",
        cli_error(["diffusion", "fid", str(ref), "--reference", str(ref), "--feature-extractor", "yardstick"]),
    )
    monkeypatch.setattr(ys, "PACKAGED", __import__("pathlib").Path(yardstick))
    out = compute_fid(ref, ref, cache_dir=tmp_path / "c")
    assert out["feature_space"].startswith("yardstick-") and abs(out["fid"]) < 1e-6
    named = compute_fid(ref, ref, cache_dir=tmp_path / "c", feature_extractor="yardstick")
    assert named["feature_space"] == out["feature_space"]


def test_one_channel_classifier_features(tmp_path):
    run = digits_classifier(tmp_path / "digits")
    ref = write_set(tmp_path / "ref", 0, 20)
    shifted = write_set(tmp_path / "shifted", 0, 20, shift=60)
    close = compute_fid(ref, ref, feature_extractor=run, cache_dir=tmp_path / "c")
    far = compute_fid(shifted, ref, feature_extractor=run, cache_dir=tmp_path / "c")
    assert abs(close["fid"]) < 1e-6 and far["fid"] > 1e-3


def test_classifier_feature_space(tmp_path):
    run = digits_classifier(tmp_path / "clf", **RGB_DATA)
    ref = write_set(tmp_path / "ref", 0, 40)
    same = write_set(tmp_path / "same", 0, 40)
    shifted = write_set(tmp_path / "shifted", 0, 40, shift=60)
    cache = tmp_path / "cache"
    close = compute_fid(same, ref, feature_extractor=run, cache_dir=cache)
    far = compute_fid(shifted, ref, feature_extractor=run, cache_dir=cache)
    assert abs(close["fid"]) < 1e-4 and far["fid"] > 1e3 * max(abs(close["fid"]), 1e-4)
    stats = next(cache.glob("ref-*.npz"))  # cached statistics double as a reference
    assert compute_fid(shifted, stats, feature_extractor=run)["fid"] == pytest.approx(far["fid"])
