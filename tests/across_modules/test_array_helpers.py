"""The shared checks of :mod:`gma_ref._array` that every entry point runs: finiteness and the value scale; the
bytes of a dtype's element, by which the fast path sizes its token blocks.

Both read the array through two reductions (its largest and smallest entries) rather than an element-wise
pass: a NaN or an infinity anywhere must still be found, and finite arrays whose *sum* would overflow must
still pass (the reductions never add).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from array_api_compat import array_namespace

from gma_ref._array import check_finite, item_bytes, scale_from_extremes, value_scale

xp = array_namespace(np.zeros(1))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", [0, 17, -1])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_check_finite_finds_one_bad_entry_anywhere(bad, where, dtype):
    """One NaN, +inf or −inf, first, inside or last: a ValueError naming the array and counting 1 entry."""
    a = np.random.default_rng(0).normal(size=(5, 7)).astype(dtype)
    a.reshape(-1)[where] = bad
    with pytest.raises(ValueError, match=r"^x must be finite, got 1 NaN/Inf entries of 35"):
        check_finite(xp, "x", a)


def test_check_finite_counts_every_bad_entry():
    a = np.zeros((4, 4))
    a[0, 0], a[1, 2], a[3, 3] = np.nan, np.inf, -np.inf
    with pytest.raises(ValueError, match="got 3 NaN/Inf entries of 16"):
        check_finite(xp, "a", a)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_check_finite_passes_finite_arrays_whose_sum_would_overflow(dtype):
    """Entries at half the float maximum, of both signs: finite, so no error (nor a warning: the suite turns
    warnings into errors), although their sum is not."""
    half = float(np.finfo(dtype).max) / 2
    a = np.array([[half, half, half], [-half, -half, 1.0]], dtype=dtype)
    check_finite(xp, "a", a)
    check_finite(xp, "empty", np.zeros((0, 3), dtype=dtype))
    check_finite(xp, "ints", np.arange(6).reshape(2, 3))


def test_value_scale_reads_the_largest_magnitude_of_either_sign():
    """The scale is decided by max |V|: a large negative entry counts as a large positive one; NaN or an
    infinity needs no scale (the checks upstream report them); the scale is a power of two."""
    big = float(np.finfo(np.float64).max) / 8
    for v in (np.array([[1.0, -big]]), np.array([[big, 1.0]])):
        s = value_scale(xp, v, 4)
        assert s > 1.0 and math.frexp(s)[0] == 0.5  # a power of two
        assert np.all(np.isfinite(np.sum(v / s, axis=0) * 10))
    assert value_scale(xp, np.array([[1.0, -2.0]]), 4) == 1.0
    assert value_scale(xp, np.array([[np.nan, -big]]), 4) == 1.0
    assert value_scale(xp, np.array([[np.inf, 1.0]]), 4) == 1.0
    assert value_scale(xp, np.zeros((0, 2)), 4) == 1.0


def test_scale_from_extremes_is_value_scale_and_needs_none_for_a_nan_at_either_end():
    """From an array's extremes, the scale value_scale finds from the array; a NaN at either end (the
    extremes of an array holding a NaN, whichever reduction shows it) needs no scale, even beside an extreme
    that alone would."""
    big = float(np.finfo(np.float64).max) / 8
    for v in (np.array([[1.0, -big]]), np.array([[big, 1.0]]), np.array([[1.0, 2.0]])):
        assert scale_from_extremes(xp, v.dtype, float(v.min()), float(v.max()), 4) == value_scale(xp, v, 4)
    assert scale_from_extremes(xp, np.float64, math.nan, big, 4) == 1.0
    assert scale_from_extremes(xp, np.float64, -big, math.nan, 4) == 1.0


def test_value_scale_threshold_and_power_pinned():
    """No scale while max |V| · (n_terms + 1) < max float / 4, a scale from that value on; the scale is
    2^(e − 512) for max |V| = m · 2^e (frexp), so that |V / s| < 2^512."""
    top = float(np.finfo(np.float64).max)
    edge = top / 16  # exact: a power-of-two division; edge · 4 = top / 4 exactly
    assert value_scale(xp, np.array([[edge]]), 3) != 1.0  # at the threshold: scaled
    assert value_scale(xp, np.array([[-edge]]), 3) != 1.0
    assert value_scale(xp, np.array([[np.nextafter(edge, 0.0)]]), 3) == 1.0  # just below: not
    assert value_scale(xp, np.array([[edge * 0.75]]), 3) == 1.0
    assert value_scale(xp, np.array([[edge * 0.75]]), 5) != 1.0  # (n + 1) = 6 times 0.75 top / 16 > top / 4
    assert value_scale(xp, np.array([[2.0 ** 1000]]), 1 << 30) == 2.0 ** 489  # frexp: 2^1000 = 0.5 · 2^1001
    assert value_scale(xp, np.array([[3.0 * 2.0 ** 1000]]), 1 << 30) == 2.0 ** 490


@pytest.mark.parametrize(("dtype", "size"), [("float64", 8), ("float32", 4), ("float16", 2), ("complex128", 16),
                                             ("complex64", 8), ("int64", 8), ("int32", 4), ("int8", 1),
                                             ("uint16", 2), ("bool", 1)])
def test_item_bytes_is_the_itemsize_of_every_kind_of_dtype(dtype, size):
    """Floating (from finfo, twice for complex), integer (iinfo) and boolean dtypes: NumPy's own itemsize, and
    the same under array_api_strict (which has no float16), whose dtypes carry no itemsize."""
    got = item_bytes(xp, getattr(np, dtype))
    assert type(got) is int and got == size == np.dtype(dtype).itemsize  # a count of bytes, not 8.0
    strict = pytest.importorskip("array_api_strict")
    if dtype != "float16":
        got = item_bytes(strict, getattr(strict, dtype))
        assert type(got) is int and got == size
