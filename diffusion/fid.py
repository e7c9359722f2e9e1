"""Sample-quality metrics with the ADM evaluator's conventions: FID, sFID, IS, precision / recall (and KID).

In a feature network's space (:mod:`lightvision.diffusion.features`; Inception-v3 by default):

* FID (Heusel et al. 2017) of the ``pool`` features; sFID (Nash et al. 2021) the same distance of the ``spatial``
  features (Inception: mixed_6/conv[..., :7], flattened). The Frechet distance of two Gaussians,

      FID = ||mu_1 - mu_2||^2 + tr(S_1) + tr(S_2) - 2 tr((S_1^{1/2} S_2 S_1^{1/2})^{1/2}),

  is computed with symmetric eigen-decompositions (S_1^{1/2} S_2 S_1^{1/2} is symmetric PSD, so the trace of its
  square root is the sum of the square roots of its eigenvalues; ~1 s at 2048 dims on a CPU).
* precision / recall (Kynkaanniemi et al. 2019, k = 3; torch-fidelity's ``prc``): the fraction of samples inside
  the reference manifold (the union of balls reaching each reference point's 3rd nearest neighbour), and of
  reference points inside the samples' manifold; ``pool`` features.
* IS (Salimans et al. 2016; torch-fidelity's ``isc`` per split) of the Inception logits (Inception only): the mean
  over consecutive splits of 5000 samples, the last one shorter, as in ADM.
* KID (Binkowski et al. 2018; torch-fidelity's ``kid``) of the ``pool`` features.

The reference side is an image folder, an ``.npz`` image batch in the ADM layout (``arr_0``: uint8 [N, H, W, 3]) or
a statistics ``.npz`` (:func:`save_statistics`: ``mu``, ``sigma``, ``mu_s``, ``sigma_s``, the reference ``features``
for precision / recall and KID, ``feature_space``). Statistics of images are computed once and cached, named by the
content hash of the images and the network's weights (``lightvision diffusion fid-ref`` writes them on purpose).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import sys
import zipfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import torch

from lightvision.engine.data import read_rgb, warn_skipped

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
ADM_NUM_SAMPLES = 50_000
IS_SPLIT_SIZE = 5000  # ADM: IS over consecutive splits of 5000 samples
STORED_GAUSSIANS = (("mu", "sigma"), ("mu_s", "sigma_s"))  # what an ADM reference batch stores beside arr_0
PRC_NEIGHBOURHOOD = 3
SAMPLE_IMAGES, SAMPLE_SUMMARY = "images", "summary.json"  # what `lightvision diffusion sample --out` writes

FeatureNet = Callable[[torch.Tensor], "dict[str, torch.Tensor]"]


def check_counts(**counts: int | None) -> None:
    """Refuse, in one line naming the command-line option, a count that is not a positive integer (None: not set)."""
    for name, value in counts.items():
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")


def default_cache_dir() -> Path:
    """Where reference statistics are cached: ``$XDG_CACHE_HOME/lightvision/fid`` (default ``~/.cache``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lightvision" / "fid"


def image_files(folder: str | Path) -> list[Path]:
    """Image files under ``folder`` (recursive, sorted); raises if it is missing or holds none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"image folder {str(folder)!r} does not exist")
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
    if not files:
        raise ValueError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) found under {str(folder)!r}")
    return files


def content_hash(paths: list[Path]) -> str:
    """sha256 over the sorted sha256 digests of the files' bytes: independent of names and order."""
    digests = sorted(hashlib.sha256(p.read_bytes()).hexdigest() for p in paths)
    return hashlib.sha256("".join(digests).encode()).hexdigest()[:24]


def read_npz(path: str | Path, keys: Iterable[str] | None = None) -> tuple[list[str], dict[str, np.ndarray]]:
    """The array names of an ``.npz`` and those of its arrays named in ``keys`` (None: all); a file numpy cannot read
    as plain arrays (not a zip, truncated, pickled objects) raises one ValueError naming it."""
    try:
        with np.load(path) as f:
            names = list(f.files)
            return names, {k: f[k] for k in (names if keys is None else [k for k in keys if k in names])}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        raise ValueError(
            f"{path} is no readable .npz of plain arrays ({type(err).__name__}): an image batch holds arr_0, uint8 "
            "[N, H, W, 3] (numpy.savez); statistics come from `lightvision diffusion fid-ref`"
        ) from None


def is_statistics(path: str | Path) -> bool:
    """Whether ``path`` is a statistics ``.npz`` (arrays ``mu`` and ``sigma``, no images)."""
    path = Path(path)
    if not (path.is_file() and path.suffix == ".npz"):
        return False
    names = set(read_npz(path, ())[0])
    return "arr_0" not in names and {"mu", "sigma"} <= names


class ImageSet:
    """Images of a folder (RGB files, one size) or of an ADM ``.npz`` batch (``arr_0``: uint8 [N, H, W, 3]; an ADM
    reference batch also stores the evaluator's Inception Gaussians ``mu``, ``sigma``, ``mu_s``, ``sigma_s``, kept in
    ``stored``). A folder written by ``lightvision diffusion sample`` (its ``summary.json`` beside ``images/``) means
    its ``images/``: the grid beside them is no sample. Unreadable files of a folder are skipped (``skipped``, one
    warning naming the first ones).

    Args:
        source: the folder or ``.npz`` file.
        limit: use the first ``limit`` (readable) images only (sorted file order / array order).
    """

    def __init__(self, source: str | Path, limit: int | None = None):
        self.source, self.limit = Path(source), limit
        if (self.source / SAMPLE_SUMMARY).is_file() and (self.source / SAMPLE_IMAGES).is_dir():
            self.source = self.source / SAMPLE_IMAGES
        self.skipped: list[str] = []
        if self.source.is_dir():
            self.files: list[Path] | None = image_files(self.source)
            self.array, self.stored = None, {}
            first = next((img for img in map(read_rgb, self.files) if img is not None), None)
            if first is None:
                raise ValueError(f"none of the {len(self.files)} image files under {str(self.source)!r} is readable")
        elif self.source.is_file() and self.source.suffix == ".npz":
            names, arrays = read_npz(self.source, ["arr_0", *(k for pair in STORED_GAUSSIANS for k in pair)])
            if "arr_0" not in arrays:
                raise ValueError(
                    f"{self.source} holds no images (arr_0; it has {', '.join(names) or 'no arrays'}): an image batch "
                    "is uint8 [N, H, W, 3]"
                )
            self.array = arrays["arr_0"][:limit]
            self.stored = {k: arrays[k] for pair in STORED_GAUSSIANS if set(pair) <= set(arrays) for k in pair}
            if self.array.dtype != np.uint8 or self.array.ndim != 4 or self.array.shape[3] != 3 or not len(self.array):
                raise ValueError(
                    f"{self.source}: arr_0 must be uint8 [N, H, W, 3] with N > 0, got {self.array.dtype} "
                    f"{list(self.array.shape)}"
                )
            self.files, first = None, self.array[0]
        else:
            raise FileNotFoundError(f"{str(self.source)!r} is neither an image folder nor an .npz image batch")
        self.size = tuple(first.shape[:2])

    def _read(self) -> Iterator[np.ndarray]:
        """The folder's readable images [H, W, 3] in order, at most ``limit``; unreadable files go to ``skipped``."""
        self.skipped, count = [], 0
        for path in self.files:
            if self.limit is not None and count == self.limit:
                break
            img = read_rgb(path)
            if img is None:
                self.skipped.append(str(path.relative_to(self.source)))
                continue
            if img.shape[:2] != self.size:
                raise ValueError(
                    f"{path} is {img.shape[0]} x {img.shape[1]} px, the images before it {self.size[0]} x "
                    f"{self.size[1]} px: every image of {self.source} must have one size"
                )
            count += 1
            yield img
        warn_skipped(self.skipped, self.source)

    def batches(self, batch_size: int) -> Iterator[torch.Tensor]:
        """uint8 batches [B, 3, H, W] in order."""
        if self.files is None:
            parts = (self.array[i : i + batch_size] for i in range(0, len(self.array), batch_size))
        else:
            images = self._read()
            parts = iter(lambda: list(itertools.islice(images, batch_size)), [])
        for part in parts:
            yield torch.from_numpy(np.ascontiguousarray(np.stack(part))).permute(0, 3, 1, 2)

    def content_hash(self) -> str:
        """Hash of the images' bytes (folder: independent of file names; ``.npz``: the array)."""
        if self.files is not None:
            return content_hash(self.files)
        return hashlib.sha256(np.ascontiguousarray(self.array).tobytes()).hexdigest()[:24]


def extract_features(images: ImageSet, net: FeatureNet, batch_size: int = 64) -> dict[str, np.ndarray]:
    """Every output of ``net`` over the image set, concatenated: {name: [N, D]}."""
    out: dict[str, list[np.ndarray]] = {}
    for batch in images.batches(batch_size):
        for name, value in net(batch).items():
            out.setdefault(name, []).append(value.numpy())
    return {name: np.concatenate(parts) for name, parts in out.items()}


def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray) -> float:
    """FID of N(mu1, sigma1) and N(mu2, sigma2) (formula above), in float64."""
    mu1, mu2, sigma1, sigma2 = (np.asarray(a, dtype=np.float64) for a in (mu1, mu2, sigma1, sigma2))
    if mu1.shape != mu2.shape or sigma1.shape != sigma2.shape:
        raise ValueError(f"statistics of different feature sizes: {mu1.shape} vs {mu2.shape}")
    w, v = np.linalg.eigh((sigma1 + sigma1.T) / 2)
    root1 = (v * np.sqrt(np.clip(w, 0, None))) @ v.T
    inner = root1 @ sigma2 @ root1
    tr_sqrt = np.sqrt(np.clip(np.linalg.eigvalsh((inner + inner.T) / 2), 0, None)).sum()
    diff = mu1 - mu2
    return float(diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2.0 * tr_sqrt)


def gaussian(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """mu [D] and unbiased covariance sigma [D, D] of features [N, D] (float64)."""
    features = np.asarray(features, dtype=np.float64)
    if features.shape[0] < 2:
        raise ValueError("FID needs at least two images per set")
    return features.mean(0), np.cov(features, rowvar=False)


def statistics(
    features: dict[str, np.ndarray], feature_space: str, image_size: tuple[int, int] | None = None
) -> dict[str, np.ndarray]:
    """What a reference needs: ``mu`` / ``sigma`` (pool), ``mu_s`` / ``sigma_s`` (spatial, when the network has
    it), the pool ``features`` (float32, for precision / recall and KID), ``feature_space``, ``num_images`` and, when
    given, the images' ``image_size`` (H, W)."""
    mu, sigma = gaussian(features["pool"])
    stats = {
        "mu": mu,
        "sigma": sigma,
        "features": features["pool"].astype(np.float32),
        "feature_space": np.array(feature_space),
        "num_images": np.array(len(features["pool"])),
    }
    if "spatial" in features:
        stats["mu_s"], stats["sigma_s"] = gaussian(features["spatial"])
    if image_size is not None:
        stats["image_size"] = np.array(image_size)
    return stats


def with_stored_gaussians(stats: dict[str, np.ndarray], images: ImageSet) -> dict[str, np.ndarray]:
    """``stats`` of ``images`` in Inception space with the Gaussians an ADM reference batch stores in place of those
    computed from its images, as the ADM evaluator uses them for FID / sFID (its features still serve precision /
    recall and KID); ``stats`` unchanged for other sources or feature spaces."""
    if not images.stored or not str(stats["feature_space"]).startswith("inception-"):
        return stats
    for key in images.stored:
        if key in stats and images.stored[key].shape != stats[key].shape:
            raise ValueError(
                f"{images.source}: stored {key!r} has shape {list(images.stored[key].shape)}, the Inception features "
                f"give {list(stats[key].shape)}: remove the stored statistics to compute them from arr_0"
            )
    return {**stats, **images.stored}


def save_statistics(stats: dict[str, np.ndarray], path: str | Path) -> Path:
    """Write statistics as ``.npz`` atomically (a partial file is never left under ``path``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    try:
        np.savez(tmp, **stats)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def load_statistics(path: str | Path, feature_space: str | None = None) -> dict[str, np.ndarray]:
    """Statistics of an ``.npz``; with ``feature_space``, refuses a file written in another space."""
    _, stats = read_npz(path)
    if not {"mu", "sigma"} <= set(stats):
        raise ValueError(f"{path} is not a statistics file (needs arrays 'mu' and 'sigma')")
    saved = str(stats["feature_space"]) if "feature_space" in stats else None
    if feature_space is not None and saved is not None and saved != feature_space:
        raise ValueError(
            f"{path} holds statistics of feature space {saved!r}, not {feature_space!r}: "
            "recompute them with `lightvision diffusion fid-ref` and the same feature network"
        )
    return stats


def check_reference(reference: str | Path) -> Path:
    """``reference`` as a Path; FileNotFoundError saying what it may be when it does not exist."""
    reference = Path(reference)
    if not reference.exists():
        raise FileNotFoundError(
            f"reference {str(reference)!r} does not exist (an image folder, an .npz image batch "
            "or statistics from `lightvision diffusion fid-ref`)"
        )
    return reference


def reference_statistics(
    reference: str | Path, net: FeatureNet, cache_dir: str | Path | None = None, batch_size: int = 64
) -> dict[str, np.ndarray]:
    """Statistics of ``reference`` in ``net``'s space: a statistics file as is, images through the cache
    (``cache_dir``/ref-<images hash>-<network id>.npz; None: :func:`default_cache_dir`), with the Gaussians an ADM
    reference batch stores (:func:`with_stored_gaussians`)."""
    reference = check_reference(reference)
    if is_statistics(reference):
        return load_statistics(reference, net.id)
    images = ImageSet(reference)
    cache = Path(cache_dir or default_cache_dir()) / f"ref-{images.content_hash()}-{net.id}.npz"
    if cache.is_file():
        stats = load_statistics(cache, net.id)
    else:
        stats = statistics(extract_features(images, net, batch_size), net.id, images.size)
        save_statistics(stats, cache)
    return with_stored_gaussians(stats, images)


def precision_recall(
    samples: np.ndarray, reference: np.ndarray, device: str | torch.device = "cpu"
) -> dict[str, float]:
    """Improved precision / recall (k = 3) of sample features [N, D] against reference features [M, D]."""
    from torch_fidelity.metric_prc import prc_features_to_metric

    if min(len(samples), len(reference)) <= PRC_NEIGHBOURHOOD:
        raise ValueError(f"precision / recall need more than {PRC_NEIGHBOURHOOD} images per set")
    out = prc_features_to_metric(
        torch.as_tensor(samples, device=device).float(),
        torch.as_tensor(reference, device=device).float(),
        prc_neighborhood=PRC_NEIGHBOURHOOD,
        prc_batch_size=2048,
        save_cpu_ram=True,
        verbose=False,
    )
    return {"precision": out["precision"], "recall": out["recall"]}


def inception_score(logits: np.ndarray, split_size: int = IS_SPLIT_SIZE) -> float:
    """IS of Inception logits [N, 1008]: the mean over consecutive splits of ``split_size`` samples, the last one
    shorter (ADM: 12,000 samples -> 5000 / 5000 / 2000)."""
    from torch_fidelity.metric_isc import isc_features_to_metric

    parts = torch.as_tensor(logits).split(split_size)
    return float(np.mean([isc_features_to_metric(p, splits=1, shuffle=False)["inception_score_mean"] for p in parts]))


def kernel_distance(samples: np.ndarray, reference: np.ndarray, subset_size: int = 1000) -> dict[str, float]:
    """KID (mean and std over 100 subsets) of sample and reference features."""
    from torch_fidelity.metric_kid import kid_features_to_metric

    size = min(subset_size, len(samples), len(reference))
    out = kid_features_to_metric(
        torch.as_tensor(samples), torch.as_tensor(reference), kid_subset_size=size, verbose=False
    )
    return {"kid": out["kernel_inception_distance_mean"], "kid_std": out["kernel_inception_distance_std"]}


def metrics(
    features: dict[str, np.ndarray], reference: dict[str, np.ndarray], device: str | torch.device = "cpu"
) -> dict[str, float]:
    """Every metric the two sides allow: fid always; sfid with spatial statistics on both sides; isc with logits;
    precision, recall and kid with the reference features (absent from plain mu / sigma files)."""
    mu, sigma = gaussian(features["pool"])
    out = {"fid": frechet_distance(mu, sigma, reference["mu"], reference["sigma"])}
    if "spatial" in features and "mu_s" in reference:
        if features["spatial"].shape[1] != reference["mu_s"].shape[0]:
            size = reference.get("image_size")
            raise ValueError(
                f"samples and reference{f' ({size[0]} x {size[1]} px)' if size is not None else ''} give spatial "
                f"features of different sizes ({features['spatial'].shape[1]} vs {reference['mu_s'].shape[0]} "
                "values): this feature network's spatial map follows the image size, so sFID needs one image size "
                "on both sides; resize one set to the other's size"
            )
        mu_s, sigma_s = gaussian(features["spatial"])
        out["sfid"] = frechet_distance(mu_s, sigma_s, reference["mu_s"], reference["sigma_s"])
    if "logits" in features:
        out["isc"] = inception_score(features["logits"])
    if "features" in reference:
        out.update(precision_recall(features["pool"], reference["features"], device))
        out.update(kernel_distance(features["pool"], reference["features"]))
    return out


def compute_fid(
    samples: str | Path,
    reference: str | Path,
    *,
    inception_weights: str | None = None,
    feature_extractor: str | None = None,
    cache_dir: str | Path | None = None,
    device: str = "cpu",
    batch_size: int = 64,
    num_samples: int | None = ADM_NUM_SAMPLES,
) -> dict:
    """Metrics of ``samples`` (image folder or ``.npz`` batch; the first ``num_samples``) against ``reference``.

    Args:
        samples: folder or ADM ``.npz``; fewer than ``num_samples`` images are used with a warning on stderr (as are
            the unreadable files of a folder, which are skipped).
        reference: folder, ADM ``.npz`` or statistics ``.npz`` in the same feature space.
        inception_weights / feature_extractor: the feature network
            (:func:`~lightvision.diffusion.features.feature_network`).
        cache_dir: cache of reference statistics (None: :func:`default_cache_dir`).
        num_samples: how many samples to evaluate (None: all).
    Returns:
        {"fid", "sfid", "isc", "precision", "recall", "kid", "kid_std" (as :func:`metrics` allows), "feature_space",
        "num_samples", "num_reference"}.
    """
    from lightvision.diffusion.features import feature_network
    from lightvision.engine.device import resolve_device

    check_counts(num_samples=num_samples, batch_size=batch_size)
    device = resolve_device(device)
    images = ImageSet(samples, num_samples)
    check_reference(reference)  # before the feature network, which may try to download Inception's weights
    net = feature_network(
        feature_extractor=feature_extractor, inception_weights=inception_weights, image_size=images.size, device=device
    )
    ref = reference_statistics(reference, net, cache_dir, batch_size)
    features = extract_features(images, net, batch_size)
    count = len(features["pool"])
    if num_samples is not None and count < num_samples:
        print(
            f"warning: {count} samples in {samples} (fewer than {num_samples}; ADM reports use {ADM_NUM_SAMPLES})",
            file=sys.stderr,
        )
    out = metrics(features, ref, device)
    return {**out, "feature_space": net.id, "num_samples": count, "num_reference": int(ref.get("num_images", -1))}


def write_reference(
    images: str | Path,
    out: str | Path,
    *,
    inception_weights: str | None = None,
    feature_extractor: str | None = None,
    device: str = "cpu",
    batch_size: int = 64,
) -> dict:
    """Compute a reference's statistics once (:func:`statistics`) and save them to ``out`` for later evaluations;
    returns a summary (path, feature space, number of images, which metrics the file supports)."""
    from lightvision.diffusion.features import feature_network
    from lightvision.engine.device import resolve_device

    check_counts(batch_size=batch_size)
    device = resolve_device(device)
    if Path(out).suffix != ".npz" or Path(out).is_dir():
        example = Path(out) / "reference.npz" if Path(out).is_dir() else Path(out).with_suffix(".npz")
        raise ValueError(f"--out {out} must name an .npz file to write, e.g. {example}")
    image_set = ImageSet(images)
    net = feature_network(
        feature_extractor=feature_extractor,
        inception_weights=inception_weights,
        image_size=image_set.size,
        device=device,
    )
    features = extract_features(image_set, net, batch_size)
    stats = with_stored_gaussians(statistics(features, net.id, image_set.size), image_set)
    save_statistics(stats, out)
    supports = ["fid", "precision", "recall", "kid"] + (["sfid"] if "mu_s" in stats else [])
    count = int(stats["num_images"])
    return {"statistics": str(out), "feature_space": net.id, "num_images": count, "metrics": supports}


def plot_metric(points: list[tuple[int, float]], name: str, path: str | Path, title: str = "") -> Path:
    """Line plot of (step, value) points (sorted by step) saved as a PNG; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, values = zip(*sorted(points)) if points else ((), ())
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(steps, values, "o-")
    ax.set(xlabel="training step", ylabel=name, title=title or f"{name} vs steps")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
