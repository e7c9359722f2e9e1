"""FID: the Frechet distance against closed forms; torch-fidelity with generated Inception weights; classifier features."""

from unittest import mock

import numpy as np
import pytest
import torch
from PIL import Image

from lightvision.diffusion.fid import compute_fid, frechet_distance


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


@pytest.fixture(scope="module")
def inception_weights(tmp_path_factory):
    """Randomly initialised torch-fidelity InceptionV3 weights (Kaiming convs so that features are not degenerate)."""
    import torch_fidelity.feature_extractor_inceptionv3 as fe_mod

    with mock.patch.object(fe_mod, "load_state_dict_from_url", lambda *a, **k: {}), \
         mock.patch.object(fe_mod.FeatureExtractorInceptionV3, "load_state_dict", lambda self, sd: None):
        torch.manual_seed(0)
        net = fe_mod.FeatureExtractorInceptionV3("inception-v3-compat", ["2048"])
    for m in net.modules():
        if isinstance(m, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
    path = tmp_path_factory.mktemp("inception") / "weights.pth"
    torch.save(net.state_dict(), path)
    return str(path)


def test_torch_fidelity_path_with_generated_weights(tmp_path, inception_weights):
    ref = write_set(tmp_path / "ref", 0, 3)  # Inception runs at 299 px: keep the CPU test to a few images
    same = write_set(tmp_path / "same", 0, 3)
    shifted = write_set(tmp_path / "shifted", 0, 3, shift=60)
    cache = tmp_path / "cache"
    close = compute_fid(same, ref, inception_weights=inception_weights, cache_dir=cache)
    far = compute_fid(shifted, ref, inception_weights=inception_weights, cache_dir=cache)
    assert abs(close["fid"]) < 1e-3 and far["fid"] > 1.0 and {"isc", "kid"} <= set(far)
    cached = sorted(p.name for p in cache.rglob("*") if p.is_file())
    assert cached and all("ref-" in name for name in cached)
    renamed = ref.rename(tmp_path / "renamed")  # same content, other name: the cache answers
    again = compute_fid(shifted, renamed, inception_weights=inception_weights, cache_dir=cache)
    assert again["fid"] == pytest.approx(far["fid"]) and sorted(p.name for p in cache.rglob("*") if p.is_file()) == cached
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no images"):
        compute_fid(tmp_path / "empty", renamed, inception_weights=inception_weights)
    with pytest.raises(FileNotFoundError, match="Inception weights"):
        compute_fid(same, renamed, inception_weights=str(tmp_path / "missing.pth"))


def test_classifier_feature_space(tmp_path):
    from lightvision.classify.deit import create_from_config
    from lightvision.engine.checkpoint import CheckpointManager

    torch.manual_seed(0)
    config = {"name": "lightnet_deit_tiny_patch16_224", "num_classes": 10, "in_chans": 3, "img_size": 16,
              "args": {"patch_size": 4, "depth": 1}}
    model = create_from_config(config)
    CheckpointManager(tmp_path / "clf").save(1, models={"model": model, "ema": model}, model_config=config,
                                             train_state={"step": 1}, config={"data": {"mean": [0.5] * 3, "std": [0.5] * 3}})
    ref = write_set(tmp_path / "ref", 0, 40)
    same = write_set(tmp_path / "same", 0, 40)
    shifted = write_set(tmp_path / "shifted", 0, 40, shift=60)
    cache = tmp_path / "cache"
    close = compute_fid(same, ref, feature_extractor=str(tmp_path / "clf"), cache_dir=cache)
    far = compute_fid(shifted, ref, feature_extractor=str(tmp_path / "clf"), cache_dir=cache)
    assert abs(close["fid"]) < 1e-4 and far["fid"] > 1e3 * max(abs(close["fid"]), 1e-4)
    stats = next(cache.glob("ref-*.npz"))  # cached statistics double as a reference
    assert compute_fid(shifted, stats, feature_extractor=str(tmp_path / "clf"))["fid"] == pytest.approx(far["fid"])
