"""MD-LRPE (SPEC 1.2): angle layout, the [x cos, x sin] form, relative-position property."""

import itertools
import math

import pytest
import torch

from lightvision.ops import lrpe_angles, lrpe_group_sizes, md_lrpe

F64 = torch.float64


@pytest.mark.parametrize("grid,dim,prefix", [((7, 11), 6, 1), ((3, 4, 5), 8, 2), ((13,), 5, 0), ((4, 6), 7, 0)])
def test_angles_layout(grid, dim, prefix):
    ang = lrpe_angles(grid, dim, prefix)
    assert ang.shape == (math.prod(grid) + prefix, dim) and ang.dtype == torch.float32
    assert (ang[:prefix] == 0).all()
    sizes = lrpe_group_sizes(dim, len(grid))
    assert sum(sizes) == dim and max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    theta = 10000.0 ** (-2.0 * torch.arange(dim, dtype=F64) / dim)
    coords = list(itertools.product(*[range(g) for g in grid]))  # row-major
    start = 0
    for axis, size in enumerate(sizes):
        for t, c in enumerate(coords):
            want = c[axis] * theta[start:start + size]
            torch.testing.assert_close(ang[prefix + t, start:start + size].double(), want, rtol=1e-6, atol=1e-6)
        start += size
    assert lrpe_angles(grid, dim, prefix, dtype=F64).dtype == F64


def test_md_lrpe_form_and_prefix():
    x = torch.randn(2, 3, 1 + 20, 6, dtype=F64)
    y = md_lrpe(x, (4, 5), num_prefix_tokens=1)
    ang = lrpe_angles((4, 5), 6, 1, dtype=F64)
    assert y.shape == (2, 3, 21, 12) and y.dtype == F64
    torch.testing.assert_close(y, torch.cat([x * torch.cos(ang), x * torch.sin(ang)], -1))
    torch.testing.assert_close(y[..., 0, :6], x[..., 0, :])
    assert (y[..., 0, 6:] == 0).all()
    assert md_lrpe(x.to(torch.bfloat16), (4, 5), 1).dtype == torch.bfloat16


@pytest.mark.parametrize("grid,prefix,dim", [((7, 11), 1, 8), ((3, 4, 5), 0, 9)])
def test_scores_depend_only_on_offsets(grid, prefix, dim):
    """q~_s . k~_t for tokens carrying the same q and k vectors is a function of the per-axis offsets s - t."""
    n = math.prod(grid) + prefix
    q = torch.randn(dim, dtype=F64).expand(n, dim)
    k = torch.randn(dim, dtype=F64).expand(n, dim)
    scores = md_lrpe(q, grid, prefix) @ md_lrpe(k, grid, prefix).T
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
