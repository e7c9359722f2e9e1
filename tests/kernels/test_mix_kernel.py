"""The batch-with-its-reverse mix program (lightvision.kernels.mix) against its reference: mixup weights, CutMix
boxes (inside, on the border, empty, the whole image), odd and even batches, one image, NaN-poisoned outputs. On CPU
the program runs in Triton's interpreter."""

import pytest
import torch

from lightvision.kernels import _launch
from lightvision.kernels.mix import mix_reversed, mix_reversed_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setattr(_launch, "POISON_OUTPUTS", True)


def _scalars(lam: float, cut: bool, box: tuple[int, int, int, int]):
    return (
        torch.tensor(lam, dtype=torch.float64, device=DEVICE),
        torch.tensor(cut, device=DEVICE),
        torch.tensor(box, dtype=torch.float64, device=DEVICE),  # as DeviceMixup computes it: integral float64
    )


@pytest.mark.parametrize("shape", [(5, 3, 13, 17), (4, 3, 32, 32), (1, 3, 8, 8), (2, 1, 7, 40)], ids=str)
@pytest.mark.parametrize(
    "lam, cut, box",
    [
        (0.3718, False, (0, 0, 0, 0)),  # mixup
        (1.0, False, (0, 0, 0, 0)),  # not mixed
        (0.6, True, (2, 6, 3, 11)),  # cutmix box inside
        (0.6, True, (0, 99, 5, 99)),  # a box past the border (clipped by the comparison)
        (1.0, True, (4, 4, 2, 9)),  # an empty box
        (0.0, True, (0, 99, 0, 99)),  # the whole image
    ],
)
def test_matches_reference(shape, lam, cut, box):
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=g).to(DEVICE)
    args = _scalars(lam, cut, box)
    out = mix_reversed(x, *args, backend="triton")
    ref = mix_reversed_reference(x, *args)
    assert not out.isnan().any()  # every value written (outputs start as NaN)
    assert torch.equal(out, ref)  # the same float32 products and sum
    if not cut and lam == 1.0:
        assert torch.equal(out, x)
    if cut and box == (0, 99, 0, 99):
        assert torch.equal(out, x.flip(0))


def test_bad_arguments_named():
    x = torch.zeros((2, 3, 4, 4), device=DEVICE)
    args = _scalars(0.5, False, (0, 0, 0, 0))
    with pytest.raises(ValueError, match="backend must be"):
        mix_reversed(x, *args, backend="cuda")
    with pytest.raises(ValueError, match="needs a float32"):
        mix_reversed(x.double(), *args, backend="triton")
