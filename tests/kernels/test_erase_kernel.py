"""The normalise-and-erase program (lightvision.kernels.erase) against its reference: per-pixel, per-image and zero
fills, boxes that overlap, touch the border or are empty, odd sizes, one image, NaN-poisoned outputs; mixed with the
reversed batch (mixup and CutMix) in the same pass; the fill drawn in the program from per-image seeds. On CPU the
program runs in Triton's interpreter."""

import pytest
import torch

from lightvision.kernels import _launch
from lightvision.kernels.erase import normalize_erase, normalize_erase_reference
from lightvision.kernels.mix import mix_reversed_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MEAN = torch.tensor([0.485, 0.456, 0.406], device=DEVICE)
STD = torch.tensor([0.229, 0.224, 0.225], device=DEVICE)


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setattr(_launch, "POISON_OUTPUTS", True)


def _close(out: torch.Tensor, ref: torch.Tensor) -> None:
    """Equal on the CPU (the interpreter divides as PyTorch's CPU kernels do); within a float32 rounding on CUDA,
    where PyTorch divides by 255 as a product with its reciprocal."""
    assert not out.isnan().any()  # every value written (outputs start as NaN)
    if DEVICE == "cpu":
        assert torch.equal(out, ref)
    else:
        torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)


def _boxes(n: int, height: int, width: int, count: int, g: torch.Generator) -> torch.Tensor:
    """int64 [n, count, 4] boxes inside the image, about a third of them empty (height 0)."""
    top = torch.randint(0, height, (n, count), generator=g)
    left = torch.randint(0, width, (n, count), generator=g)
    bh = (torch.randint(1, height + 1, (n, count), generator=g)).minimum(height - top)
    bw = (torch.randint(1, width + 1, (n, count), generator=g)).minimum(width - left)
    bh = bh * (torch.rand((n, count), generator=g) > 0.3)
    return torch.stack([top, left, bh, bw], -1)


@pytest.mark.parametrize("shape", [(5, 3, 13, 17), (1, 3, 32, 32), (2, 1, 7, 40)], ids=str)
@pytest.mark.parametrize("fill", ["pixel", "rand", "const"])
@pytest.mark.parametrize("count", [1, 3])
def test_matches_reference(shape, fill, count):
    g = torch.Generator().manual_seed(sum(shape) + count)
    n, c, height, width = shape
    x = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8).to(DEVICE)
    boxes = _boxes(n, height, width, count, g)
    boxes[0, 0] = torch.tensor([0, 0, height, width])  # one image erased whole
    noise = {
        "pixel": torch.randn(shape, generator=g),
        "rand": torch.randn((n, c, 1, 1), generator=g),
        "const": torch.zeros((1, 1, 1, 1)),
    }[fill].to(DEVICE)
    mean, std = MEAN[:c], STD[:c]
    out = normalize_erase(x, mean, std, boxes.to(DEVICE), noise, backend="triton")
    ref = normalize_erase_reference(x, mean, std, boxes.to(DEVICE), noise)
    _close(out, ref)
    assert torch.equal(out[0], noise.expand(shape)[0])  # the fill itself where erased
    if n > 1:  # the others partly erased, partly not
        untouched = normalize_erase_reference(x, mean, std)
        assert (out[1:] != untouched[1:]).any() and (out[1:] == untouched[1:]).any()


def _mix(kind: str, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lam, cut, box) of a mixup or of a CutMix whose box touches the border."""
    lam = torch.tensor(0.3141592653589793, dtype=torch.float64, device=DEVICE)
    box = torch.tensor([1, height, 2, width - 3], device=DEVICE)
    return lam, torch.tensor(kind == "cutmix", device=DEVICE), box


@pytest.mark.parametrize("shape", [(5, 3, 13, 17), (1, 3, 8, 8), (4, 1, 7, 40)], ids=str)
@pytest.mark.parametrize("kind", ["mixup", "cutmix"])
@pytest.mark.parametrize("erased", [True, False])
def test_mixed_in_the_same_pass(shape, kind, erased):
    """The program's mix equals the reference's erase, then mix_reversed: per-pixel fill or no boxes, odd batch, one
    image."""
    g = torch.Generator().manual_seed(sum(shape))
    n, c, height, width = shape
    x = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8).to(DEVICE)
    boxes, noise = _boxes(n, height, width, 2, g).to(DEVICE), torch.randn(shape, generator=g).to(DEVICE)
    if not erased:
        boxes = noise = None
    mix = _mix(kind, height, width)
    out = normalize_erase(x, MEAN[:c], STD[:c], boxes, noise, mix=mix, backend="triton")
    ref = normalize_erase_reference(x, MEAN[:c], STD[:c], boxes, noise, mix=mix)
    _close(out, ref)
    assert torch.equal(ref, mix_reversed_reference(normalize_erase_reference(x, MEAN[:c], STD[:c], boxes, noise), *mix))
    if n > 1:  # the images changed by the mix
        assert not torch.equal(out, normalize_erase(x, MEAN[:c], STD[:c], boxes, noise, backend="triton"))


@pytest.mark.parametrize("mixed", [False, True])
def test_seeded_fill_is_the_reference_with_the_programs_draws(mixed):
    """The fill drawn from seeds: what an image erased whole shows is the noise the reference needs to give the same
    output with other boxes, mixed or not; the same seeds draw the same, others differ."""
    g = torch.Generator().manual_seed(3)
    shape = (3, 3, 11, 23)
    n, c, height, width = shape
    x = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8).to(DEVICE)
    seeds = torch.tensor([5, 2**52 + 11, 77], device=DEVICE)
    whole = torch.tensor([0, 0, height, width], device=DEVICE).expand(n, 1, 4)
    noise = normalize_erase(x, MEAN, STD, whole, seeds=seeds, backend="triton")
    boxes = _boxes(n, height, width, 2, g).to(DEVICE)
    boxes[1, 0] = torch.tensor([0, 0, height, width])
    mix = _mix("mixup", height, width) if mixed else None
    out = normalize_erase(x, MEAN, STD, boxes, mix=mix, seeds=seeds, backend="triton")
    _close(out, normalize_erase_reference(x, MEAN, STD, boxes, noise, mix))
    assert torch.equal(out, normalize_erase(x, MEAN, STD, boxes, mix=mix, seeds=seeds, backend="triton"))
    other = normalize_erase(x, MEAN, STD, whole, seeds=seeds + 1, backend="triton")
    assert not (other == noise).any()


def test_seeded_fill_is_standard_normal():
    """Per pixel: mean 0 and variance 1 over 4 x 3 x 64 x 64 draws, uncorrelated neighbours and channels; per image
    and channel: one value across the image, different across channels and images."""
    n, c, size = 4, 3, 64
    x = torch.zeros((n, c, size, size), dtype=torch.uint8, device=DEVICE)
    whole = torch.tensor([0, 0, size, size], device=DEVICE).expand(n, 1, 4)
    seeds = torch.arange(n, device=DEVICE) * 1_000_003 + 12345
    fill = normalize_erase(x, MEAN, STD, whole, seeds=seeds, backend="triton").double()
    assert abs(fill.mean()) < 0.03 and abs(fill.var() - 1) < 0.03  # 49,152 draws: sd of the mean 0.0045
    assert abs((fill[..., 1:] * fill[..., :-1]).mean()) < 0.03
    assert abs((fill[:, 1:] * fill[:, :-1]).mean()) < 0.03
    plain = normalize_erase(x, MEAN, STD, whole, seeds=seeds, per_pixel=False, backend="triton")
    assert torch.equal(plain, plain[..., :1, :1].expand_as(plain))
    assert plain[:, :, 0, 0].unique().numel() == n * c


def test_seeded_fill_needs_the_program():
    x = torch.zeros((1, 3, 4, 4), dtype=torch.uint8, device=DEVICE)
    boxes = torch.zeros((1, 1, 4), dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="from seeds in its Triton program only"):
        normalize_erase(x, MEAN, STD, boxes, seeds=torch.zeros(1, dtype=torch.int64, device=DEVICE), backend="torch")


def test_without_boxes_is_normalisation():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (3, 3, 9, 11), generator=g, dtype=torch.uint8).to(DEVICE)
    out = normalize_erase(x, MEAN, STD, backend="triton")
    ref = (x.float() / 255.0 - MEAN.view(1, 3, 1, 1)) / STD.view(1, 3, 1, 1)
    _close(out, ref)
    assert torch.equal(normalize_erase(x, MEAN, STD, backend="torch"), ref)


def test_bad_arguments_named():
    x = torch.zeros((1, 3, 4, 4), dtype=torch.uint8, device=DEVICE)
    with pytest.raises(ValueError, match="backend must be"):
        normalize_erase(x, MEAN, STD, backend="cuda")
    with pytest.raises(ValueError, match="needs uint8"):
        normalize_erase(x.float(), MEAN, STD, backend="triton")
