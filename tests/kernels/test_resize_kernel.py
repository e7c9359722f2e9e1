"""The batched resized-crop program (lightvision.kernels.resize) against its reference, F.interpolate with
antialiasing per crop: shrinking and enlarging crops, odd sizes, one and three channels, flips, NaN-poisoned
outputs. On CPU the program runs in the Triton interpreter."""

import pytest
import torch

from lightvision.kernels import _launch
from lightvision.kernels.resize import resized_crops, resized_crops_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setattr(_launch, "POISON_OUTPUTS", True)


def _batch(channels: int, seed: int = 0):
    """Images of different sizes (smooth and noisy) and crop boxes that shrink, enlarge and stretch them."""
    g = torch.Generator().manual_seed(seed)
    sizes = [(37, 50), (29, 23), (61, 44), (8, 9), (40, 40)]
    images = []
    for i, (h, w) in enumerate(sizes):
        img = torch.randint(0, 256, (channels, h, w), generator=g, dtype=torch.uint8)
        if i % 2:  # a smooth image beside the noisy ones
            ramp = torch.linspace(0, 255, w).expand(channels, h, w)
            img = (ramp + torch.linspace(0, 40, h)[:, None]).clamp(0, 255).to(torch.uint8)
        images.append(img.to(DEVICE))
    boxes = torch.tensor([[0, 0, 37, 50], [3, 4, 20, 17], [10, 2, 51, 7], [1, 1, 7, 8], [5, 9, 3, 31]])
    flip = torch.tensor([False, True, True, False, True])
    return images, boxes, flip


@pytest.mark.parametrize("mode", ["bicubic", "bilinear"])
@pytest.mark.parametrize("size", [13, 32], ids=lambda s: f"S={s}")
@pytest.mark.parametrize("channels", [1, 3], ids=lambda c: f"C={c}")
def test_matches_reference(mode, size, channels):
    images, boxes, flip = _batch(channels)
    out = resized_crops(images, boxes, flip, size, mode, backend="triton")
    ref = resized_crops_reference(images, boxes, flip, size, mode)
    assert out.shape == (len(images), channels, size, size) and out.dtype == torch.float32
    assert not out.isnan().any()  # every output pixel written (outputs start as NaN)
    assert (out - ref).abs().max() < 2e-3  # 0..255 scale: float summation order only
    rounded = out.round().clamp(0, 255).to(torch.uint8)
    assert (rounded.int() - ref.round().clamp(0, 255).int()).abs().max() <= 1


@pytest.mark.parametrize("mode", ["bicubic", "bilinear"])
def test_rounded_output_is_the_float_output_rounded(mode):
    """``rounded``: the program stores uint8 rounded half to even and clipped, exactly what rounding its float output
    gives (ties included: a crop that copies its image resamples to exact integers and halves); the reference
    likewise."""
    images, boxes, flip = _batch(3, seed=2)
    images.append(torch.arange(64, dtype=torch.uint8).view(1, 8, 8).expand(3, 8, 8).contiguous().to(DEVICE))
    boxes = torch.cat([boxes, torch.tensor([[0, 0, 8, 8]])])
    flip = torch.cat([flip, torch.tensor([False])])
    for size in (8, 16, 13):
        out = resized_crops(images, boxes, flip, size, mode, backend="triton", rounded=True)
        floats = resized_crops(images, boxes, flip, size, mode, backend="triton")
        assert out.dtype == torch.uint8 and out.shape == floats.shape
        assert torch.equal(out, floats.round().clamp(0, 255).to(torch.uint8))
        ref = resized_crops_reference(images, boxes, flip, size, mode, rounded=True)
        assert torch.equal(ref, resized_crops_reference(images, boxes, flip, size, mode).round().clamp(0, 255).byte())
        assert (out.int() - ref.int()).abs().max() <= 1


def test_output_tile_does_not_change_the_result():
    """The program's output tile (rows, columns) is a speed setting: any tile writes the same values."""
    images, boxes, flip = _batch(3, seed=4)
    chosen = resized_crops(images, boxes, flip, 20, backend="triton", rounded=True)
    for tile in ((8, 32), (16, 64), (32, 128)):
        assert torch.equal(resized_crops(images, boxes, flip, 20, backend="triton", rounded=True, tile=tile), chosen)


def test_single_image_and_auto_backend():
    images, boxes, flip = _batch(3, seed=1)
    one = resized_crops(images[:1], boxes[:1], flip[:1], 16, backend="triton")
    torch.testing.assert_close(one, resized_crops_reference(images[:1], boxes[:1], flip[:1], 16), atol=2e-3, rtol=0)
    auto = resized_crops(images, boxes, flip, 16, "nearest")  # not a kernel mode: the reference, on any device
    assert torch.equal(auto, resized_crops_reference(images, boxes, flip, 16, "nearest"))


def test_one_tensor_of_images_equals_the_list():
    """A uint8 [N, C, H, W] batch (read in place) gives what the list of its images gives, exactly."""
    g = torch.Generator().manual_seed(3)
    stack = torch.randint(0, 256, (3, 3, 21, 17), generator=g, dtype=torch.uint8).to(DEVICE)
    boxes = torch.tensor([[0, 0, 21, 17], [2, 3, 11, 9], [1, 7, 4, 10]])
    flip = torch.tensor([True, False, True])
    out = resized_crops(stack, boxes, flip, 13, backend="triton")
    assert not out.isnan().any()
    assert torch.equal(out, resized_crops(list(stack), boxes, flip, 13, backend="triton"))


def test_bad_arguments_named():
    images, boxes, flip = _batch(3)
    with pytest.raises(ValueError, match="mode must be one of"):
        resized_crops(images, boxes, flip, 16, "lanczos")
    with pytest.raises(ValueError, match="backend must be"):
        resized_crops(images, boxes, flip, 16, backend="cuda")
    with pytest.raises(ValueError, match="bicubic / bilinear"):
        resized_crops(images, boxes, flip, 16, "nearest", backend="triton")


def test_packed_images_are_read_in_place_like_the_list():
    """PackedImages (the workers' decoded batch): views per image, the same crops as the list (program and
    reference), page-locked whole, a buffer of the wrong length refused."""
    from lightvision.kernels.resize import PackedImages, image_sizes

    images, boxes, flip = _batch(3, seed=2)
    packed = PackedImages.pack(images)
    assert len(packed) == len(images) and all(torch.equal(a, b) for a, b in zip(packed, images, strict=True))
    assert torch.equal(image_sizes(packed), image_sizes(images)) and packed[-1].shape == images[-1].shape
    out = resized_crops(packed, boxes, flip, 15, backend="triton")
    assert not out.isnan().any() and torch.equal(out, resized_crops(images, boxes, flip, 15, backend="triton"))
    ref = resized_crops(packed, boxes, flip, 15, backend="torch")
    assert torch.equal(ref, resized_crops_reference(images, boxes, flip, 15))
    if torch.cuda.is_available():
        host = PackedImages.pack([img.cpu() for img in images]).pin_memory()
        assert host.data.is_pinned() and torch.equal(host.on(torch.device(DEVICE)).data, packed.data)
    with pytest.raises(ValueError, match="PackedImages: 10 values for images of"):
        PackedImages(torch.zeros(10, dtype=torch.uint8), packed.sizes)
    with pytest.raises(IndexError):
        packed[len(images)]


def _most_taps(widths: int, size: int, radius: int) -> list[int]:
    """For each width W in 0..widths - 1, the most input columns one output column reads over every crop 1..W wide
    resized to ``size``, by the program's window in float32 (``_taps``: [int(c - R s + 0.5), int(c + R s + 0.5))
    clipped to the crop)."""
    import numpy as np

    most = [0]
    out = np.arange(size, dtype=np.float32) + np.float32(0.5)
    for crop in range(1, widths):
        scale = np.float32(crop) / np.float32(size)
        support = np.float32(radius) * max(scale, np.float32(1.0))
        center = scale * out
        lo = np.maximum((center - support + np.float32(0.5)).astype(np.int32), 0)
        hi = np.minimum((center + support + np.float32(0.5)).astype(np.int32), crop)
        most.append(max(most[-1], int((hi - lo).max())))
    return most


@pytest.mark.parametrize("mode", ["bicubic", "bilinear"])
@pytest.mark.parametrize("size", [16, 23])
def test_taps_are_the_least_power_of_two_over_the_bound(mode, size):
    """``horizontal_taps``: the least power of two at least floor(2 R max(W / S, 1)) + 1, which no crop of a W-wide
    image exceeds; a batch whose bound is exactly a power of two (8 for bicubic crops of 1.75..2 x S wide images)
    gets that power, not the next, and its crops still match the reference."""
    from lightvision.kernels.resize.op import KERNEL_MODES, horizontal_taps

    radius = KERNEL_MODES[mode]
    most = _most_taps(5 * size, size, radius)
    for width in range(1, 5 * size):
        taps = horizontal_taps(torch.tensor([[size, width]]), size, mode)
        bound = int(2 * radius * max(width / size, 1.0)) + 1
        assert taps >= bound >= most[width] and taps & (taps - 1) == 0 and taps < 2 * bound
    width = size * 15 // 8  # bicubic: 4 x 15 / 8 = 7.5, so 8 taps
    g = torch.Generator().manual_seed(5)
    img = torch.randint(0, 256, (3, size, width), generator=g, dtype=torch.uint8).to(DEVICE)
    if mode == "bicubic":
        assert horizontal_taps(torch.tensor([[size, width]]), size, mode) == 8
    boxes, flip = torch.tensor([[0, 0, size, width], [1, 0, size - 2, width]]), torch.tensor([False, True])
    out = resized_crops([img, img], boxes, flip, size, mode, backend="triton")
    assert not out.isnan().any()
    assert (out - resized_crops_reference([img, img], boxes, flip, size, mode)).abs().max() < 2e-3
