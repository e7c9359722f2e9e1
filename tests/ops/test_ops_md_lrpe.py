"""MD-LRPE (docs/spec.md 1.2): angle layout, the [x cos, x sin] form, relative-position property."""

import itertools
import math

import pytest
import torch

from lightvision.ops import lrpe_angles, lrpe_group_sizes, md_lrpe
from lightvision.ops.md_lrpe import LRPE_VARIANTS, lrpe_frequencies, lrpe_variant

F64 = torch.float64


def _spectrum(variant, size, start, dim):
    """The frequencies of one axis group of ``size`` features starting at feature ``start`` (docs/spec.md 1.2)."""
    i = torch.arange(size, dtype=F64)
    return 10000.0 ** (-2.0 * (start + i) / dim) if variant == "global" else 10000.0 ** (-2.0 * i / size)


@pytest.mark.parametrize("variant", ["per_axis", "global"])
@pytest.mark.parametrize(
    "grid,dim,prefix",
    [((7, 11), 6, 1), ((3, 4, 5), 8, 2), ((13,), 5, 0), ((4, 6), 7, 0)],
    ids=["7x11-d6-p1", "3x4x5-d8-p2", "13-d5", "4x6-d7"],
)
def test_angles_layout(grid, dim, prefix, variant):
    ang = lrpe_angles(grid, dim, prefix, variant=variant)
    assert ang.shape == (math.prod(grid) + prefix, dim) and ang.dtype == torch.float32
    assert (ang[:prefix] == 0).all()
    sizes = lrpe_group_sizes(dim, len(grid))
    assert sum(sizes) == dim and max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    coords = list(itertools.product(*[range(g) for g in grid]))  # row-major
    start = 0
    for axis, size in enumerate(sizes):
        theta = _spectrum(variant, size, start, dim)
        for t, c in enumerate(coords):
            want = c[axis] * theta
            torch.testing.assert_close(ang[prefix + t, start : start + size].double(), want, rtol=1e-6, atol=1e-6)
        start += size
    assert lrpe_angles(grid, dim, prefix, dtype=F64).dtype == F64


def test_mixed_directions():
    """mixed: feature r of axis group j turns along angle j pi / 2 + r * golden angle with the per_axis spectrum;
    on a 1-D grid it is per_axis."""
    dim, grid = 10, (3, 4)
    freq = lrpe_frequencies(dim, 2, "mixed")
    golden = math.pi * (3 - math.sqrt(5))
    for j in range(2):
        for r in range(5):
            phi = j * math.pi / 2 + r * golden
            want = 10000.0 ** (-2.0 * r / 5) * torch.tensor([math.cos(phi), math.sin(phi)], dtype=F64)
            torch.testing.assert_close(freq[5 * j + r], want)
    coords = torch.tensor(list(itertools.product(range(3), range(4))), dtype=F64)
    torch.testing.assert_close(lrpe_angles(grid, dim, 1, dtype=F64, variant="mixed")[1:], coords @ freq.T)
    torch.testing.assert_close(lrpe_angles((9,), 6, variant="mixed"), lrpe_angles((9,), 6, variant="per_axis"))


def test_global_spectrum_starves_the_last_axis():
    """The trap of the printed Eq. 14 (docs/spec.md 1.2): at a 16 x 16 grid, d = 64, the global spectrum turns the
    second
    axis group by at most ~0.0015 rad across the grid; per_axis gives it the full spectrum (1 rad per token)."""
    span = {v: lrpe_angles((16, 16), 64, variant=v)[-1, 32:].abs().max().item() for v in ("global", "per_axis")}
    assert span["global"] < 2e-3 and span["per_axis"] == pytest.approx(15.0)


def test_md_lrpe_form_and_prefix():
    x = torch.randn(2, 3, 1 + 20, 6, dtype=F64)
    y = md_lrpe(x, (4, 5), num_prefix_tokens=1)
    ang = lrpe_angles((4, 5), 6, 1, dtype=F64)
    assert y.shape == (2, 3, 21, 12) and y.dtype == F64
    torch.testing.assert_close(y, torch.cat([x * torch.cos(ang), x * torch.sin(ang)], -1))
    torch.testing.assert_close(y[..., 0, :6], x[..., 0, :])
    assert (y[..., 0, 6:] == 0).all()
    assert md_lrpe(x.to(torch.bfloat16), (4, 5), 1).dtype == torch.bfloat16


_OFFSET_CASES = [((7, 11), 1, 8, v) for v in LRPE_VARIANTS] + [((3, 4, 5), 0, 9, v) for v in ("per_axis", "global")]


@pytest.mark.parametrize(
    "grid,prefix,dim,variant", _OFFSET_CASES, ids=[f"{'x'.join(map(str, c[0]))}-{c[3]}" for c in _OFFSET_CASES]
)
def test_scores_depend_only_on_offsets(grid, prefix, dim, variant):
    """q~_s . k~_t for tokens carrying the same q and k vectors is a function of the per-axis offsets s - t."""
    n = math.prod(grid) + prefix
    q = torch.randn(dim, dtype=F64).expand(n, dim)
    k = torch.randn(dim, dtype=F64).expand(n, dim)
    scores = md_lrpe(q, grid, prefix, variant=variant) @ md_lrpe(k, grid, prefix, variant=variant).T
    coords = list(itertools.product(*[range(g) for g in grid]))
    by_offset = {}
    for s, cs in enumerate(coords):
        for t, ct in enumerate(coords):
            off = tuple(a - b for a, b in zip(cs, ct))
            val = float(scores[prefix + s, prefix + t])
            by_offset.setdefault(off, val)
            assert abs(by_offset[off] - val) < 1e-12
    assert len(set(round(v, 6) for v in by_offset.values())) > 1  # it does vary with the offset
    torch.testing.assert_close(scores[:prefix, :prefix], (q @ k.T)[:prefix, :prefix])  # prefix: no rotation


def test_errors():
    with pytest.raises(ValueError, match="sequence has N=10"):
        md_lrpe(torch.randn(10, 4), (3, 3))
    with pytest.raises(ValueError, match="at least one feature per grid axis"):
        lrpe_angles((2, 2, 2), 2)
    with pytest.raises(ValueError, match="grid must be"):
        lrpe_angles(5, 4)
    with pytest.raises(ValueError, match="unknown MD-LRPE variant 'diagonal'; valid: 'per_axis', 'global', 'mixed'"):
        lrpe_angles((3, 3), 4, variant="diagonal")
    with pytest.raises(ValueError, match="'mixed' directions are defined for 1-D and 2-D grids"):
        md_lrpe(torch.randn(24, 6), (2, 3, 4), variant="mixed")
    assert [lrpe_variant(v) for v in (True, False, None, "none", "global")] == ["per_axis", None, None, None, "global"]
