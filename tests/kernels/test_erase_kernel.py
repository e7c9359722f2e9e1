"""The normalise-and-erase program (lightvision.kernels.erase) against its reference: per-pixel, per-image and zero
fills, boxes that overlap, touch the border or are empty, odd sizes, one image, NaN-poisoned outputs. On CPU the
program runs in Triton's interpreter."""

import pytest
import torch

from lightvision.kernels import _launch
from lightvision.kernels.erase import normalize_erase, normalize_erase_reference

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
