"""The fast path's causal core (:mod:`gma_ref.fast.causal_batched`, the chunks batched in groups) gives the
reader's chunked form (:mod:`gma_ref.causal`) bit for bit, and falls back to it where it does not apply."""

from __future__ import annotations

import numpy as np
import pytest

import gma_ref.fast.causal_batched as cf
from gma_ref.causal import gma_causal_chunked, gma_causal_chunked_backward


def _inputs(rng, batch, n, k=5, d_v=3, dtype=np.float64):
    gq = rng.dirichlet(np.ones(k), size=batch + (n,))
    gk = rng.dirichlet(np.ones(k), size=batch + (n,))
    v, d_out = rng.normal(size=batch + (n, d_v)), rng.normal(size=batch + (n, d_v))
    return tuple(a.astype(dtype) for a in (gq, gk, v, d_out))


def _assert_the_loop_bit_for_bit(gq, gk, v, d_out, eps):
    """The batched forward and backward (C = 8) equal the reader's chunked form bit for bit, dtypes and shapes too."""
    out = cf.chunked_forward(gq, gk, v, eps, 8)
    np.testing.assert_array_equal(out, gma_causal_chunked(gq, gk, v, eps, 8))
    got = cf.chunked_backward(gq, gk, v, d_out, eps=eps, chunk_size=8)
    want = gma_causal_chunked_backward(gq, gk, v, d_out, eps=eps, chunk_size=8)
    for a, b in zip(got[:3], want[:3], strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("batch", [(), (2, 3)])
@pytest.mark.parametrize("n", [8, 40, 64, 37])
@pytest.mark.parametrize("group_elements", [1 << 20, 30, 1])
@pytest.mark.parametrize("eps", [1e-6, 0.0])
def test_batched_chunks_give_the_loop_bit_for_bit(monkeypatch, batch, n, group_elements, eps):
    monkeypatch.setattr(cf, "GROUP_ELEMENTS", group_elements)  # 30: groups of 2 chunks; 1: one chunk a group
    gq, gk, v, d_out = _inputs(np.random.default_rng(n), batch, n)
    if eps == 0.0:
        gk[..., :9, :] = 0.0  # early queries see no mass: their rows are 0
    _assert_the_loop_bit_for_bit(gq, gk, v, d_out, eps)


def test_groups_cover_the_tokens_in_whole_chunks(monkeypatch):
    assert cf._groups(64, 8, 5, 3) == [(0, 64)]
    monkeypatch.setattr(cf, "GROUP_ELEMENTS", 128)  # max(K d_v, C²) = 64: two chunks a group
    assert cf._groups(40, 8, 5, 3) == [(0, 16), (16, 32), (32, 40)]
    monkeypatch.setattr(cf, "GROUP_ELEMENTS", 30)  # max(K d_v, C²) = K d_v = 15: two chunks of 2 a group
    assert cf._groups(10, 2, 5, 3) == [(0, 4), (4, 8), (8, 10)]
    monkeypatch.setattr(cf, "GROUP_ELEMENTS", 1)
    assert cf._groups(24, 8, 5, 3) == [(0, 8), (8, 16), (16, 24)]


def test_the_default_group_holds_the_documented_elements():
    assert cf.GROUP_ELEMENTS == 1 << 20


@pytest.mark.parametrize("n", [0, 21, 24])
def test_non_finite_values_pass_through_unchecked(n):
    """The pipeline validated its inputs (or was told not to): a NaN in V (an infinity in ∂L/∂O) gives
    NaN rows, no error, on the batched path (N = 24) and on the loop's (N = 21); N = 0 gives an empty
    output."""
    gq, gk, v, d_out = _inputs(np.random.default_rng(9), (), n)
    if n:
        v[-1, 0] = np.nan
        d_out[-1, 1] = np.inf
    # 0 · ∞ in a product: whether NumPy warns of it follows the CPU's BLAS kernel (its invalid flag is raised on an
    # AVX-512 OpenBLAS kernel, not on others); the values below are what is asserted, not NumPy's warning
    with np.errstate(invalid="ignore"):
        out = cf.chunked_forward(gq, gk, v, 1e-6, 8)
        got = cf.chunked_backward(gq, gk, v, d_out, eps=1e-6, chunk_size=8)
    assert out.shape == (n, 3) and got.d_v.shape == (n, 3)
    if n:  # the last chunk's rows read the NaN (0 · NaN in its products), the earlier chunks' do not
        assert np.isnan(out[-1, 0]) and np.all(np.isfinite(out[:16]))
        assert np.any(np.isnan(got.d_gamma_q))
        np.testing.assert_array_equal(out, gma_causal_chunked(gq, gk, v, 1e-6, 8, check_finite=False))


@pytest.mark.parametrize("case", ["ragged", "broadcast", "huge_v", "float32"])
def test_other_cases_match_the_loop(case):
    """N not a multiple of C, batch axes that broadcast, V near the float maximum: the reader's form."""
    rng = np.random.default_rng(7)
    gq, gk, v, d_out = _inputs(rng, (2,), 24, dtype=np.float32 if case == "float32" else np.float64)
    if case == "ragged":
        gq, gk, v, d_out = (a[..., :21, :] for a in (gq, gk, v, d_out))
    if case == "broadcast":
        v, d_out = v[:1], d_out
    if case == "huge_v":
        v = v * 1e307
    assert cf._batched(np, gq, gk, v, 8) == (case == "float32")
    np.testing.assert_array_equal(cf.chunked_forward(gq, gk, v, 1e-6, 8), gma_causal_chunked(gq, gk, v, 1e-6, 8))
    got = cf.chunked_backward(gq, gk, v, d_out, eps=1e-6, chunk_size=8)
    want = gma_causal_chunked_backward(gq, gk, v, d_out, eps=1e-6, chunk_size=8)
    for a, b in zip(got[:3], want[:3], strict=True):
        np.testing.assert_array_equal(a, b)


def test_inputs_are_checked_as_the_loop_checks_them():
    gq, gk, v, d_out = _inputs(np.random.default_rng(8), (), 16)
    with pytest.raises(ValueError):
        cf.chunked_forward(-gq, gk, v, 1e-6, 8)  # Γ must be non-negative
    with pytest.raises(ValueError, match="d_out"):
        cf.chunked_backward(gq, gk, v, d_out[:8], eps=1e-6, chunk_size=8)


def test_arrays_on_another_device_stay_there():
    """array_api_strict inputs on Device('device1'): the batched core (and the loop it falls back to)
    makes every array on that device, and gives the NumPy values."""
    import array_api_strict as xs  # noqa: PLC0415

    dev = xs.Device("device1")
    for n in (24, 21):  # batched, then the loop
        arrays = _inputs(np.random.default_rng(10), (2,), n)
        gq, gk, v, d_out = (xs.asarray(a, device=dev) for a in arrays)
        out = cf.chunked_forward(gq, gk, v, 1e-6, 8)
        grad = cf.chunked_backward(gq, gk, v, d_out, eps=1e-6, chunk_size=8)
        want_out = cf.chunked_forward(*arrays[:3], 1e-6, 8)
        want = cf.chunked_backward(*arrays, eps=1e-6, chunk_size=8)
        for got, ref in zip((out, *grad[:3]), (want_out, *want[:3]), strict=True):
            assert got.device == dev
            host = np.asarray(xs.asarray(got, device=xs.Device("CPU_DEVICE")))
            np.testing.assert_allclose(host, ref, rtol=1e-13, atol=1e-13)


def test_parts_cut_a_group_into_nearly_equal_runs_of_chunks(monkeypatch):
    """A group's chunks go to the block threads in at most PARTS parts of at least MIN_PART_CHUNKS chunks,
    whose sizes differ by at most one chunk (NumPy); other namespaces take the group whole."""
    import array_api_strict
    from array_api_compat import array_namespace

    xp = array_namespace(np.zeros(1))
    assert cf.PARTS == 4 and cf.MIN_PART_CHUNKS == 4
    assert cf._parts(xp, 7) == [(0, 7)]
    assert cf._parts(xp, 8) == [(0, 4), (4, 8)]
    assert cf._parts(xp, 13) == [(0, 4), (4, 8), (8, 13)]
    assert cf._parts(xp, 128) == [(0, 32), (32, 64), (64, 96), (96, 128)]
    assert cf._parts(array_api_strict, 128) == [(0, 128)]
    for g in range(1, 70):
        parts = cf._parts(xp, g)
        assert [i for lo, hi in parts for i in range(lo, hi)] == list(range(g))
        sizes = [hi - lo for lo, hi in parts]
        assert max(sizes) - min(sizes) <= 1 and (len(parts) == 1 or min(sizes) >= cf.MIN_PART_CHUNKS)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("eps", [1e-6, 0.0])
def test_parts_on_threads_give_the_loop_bit_for_bit(monkeypatch, threads, eps):
    """Chunks in parts of one or two on 1, 2 or 3 threads, in groups of three chunks: the reader's chunked
    form bit for bit, forward and backward (each chunk's terms are the same products whatever its part)."""
    pytest.importorskip("threadpoolctl")
    import gma_ref.fast.blocks as blocks

    monkeypatch.setattr(blocks, "worker_count", lambda: threads)
    monkeypatch.setattr(cf, "MIN_PART_CHUNKS", 1)
    monkeypatch.setattr(cf, "PARTS", 2)
    monkeypatch.setattr(cf, "GROUP_ELEMENTS", 3 * 64)  # max(K d_v, C²) = 64: three chunks a group
    gq, gk, v, d_out = _inputs(np.random.default_rng(11), (2,), 56)
    if eps == 0.0:
        gk[..., :9, :] = 0.0
    _assert_the_loop_bit_for_bit(gq, gk, v, d_out, eps)


def test_component_major_responsibilities_give_the_loop_bit_for_bit():
    """Γ laid out component-major, as the pipeline's scores leave it ((K, N) arrays seen transposed): the
    reader's chunked form on the same arrays, bit for bit (and, to rounding, Γ in token-major order)."""
    gq, gk, v, d_out = _inputs(np.random.default_rng(12), (), 64)
    gq_t, gk_t = np.ascontiguousarray(gq.T).T, np.ascontiguousarray(gk.T).T
    out = cf.chunked_forward(gq_t, gk_t, v, 1e-6, 8)
    np.testing.assert_array_equal(out, gma_causal_chunked(gq_t, gk_t, v, 1e-6, 8))
    np.testing.assert_allclose(out, gma_causal_chunked(gq, gk, v, 1e-6, 8), rtol=1e-13, atol=1e-15)
    got = cf.chunked_backward(gq_t, gk_t, v, d_out, eps=1e-6, chunk_size=8)
    want = gma_causal_chunked_backward(gq_t, gk_t, v, d_out, eps=1e-6, chunk_size=8)
    for a, b in zip(got[:3], want[:3], strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_batched_path_keeps_float32():
    """float32 inputs on the batched path (N a multiple of C, one batch shape): the output and the three
    cotangents are float32, as the reader's are, and equal to them bit for bit."""
    gq, gk, v, d_out = _inputs(np.random.default_rng(13), (2,), 48, dtype=np.float32)
    assert cf._batched(__import__("array_api_compat").array_namespace(gq), gq, gk, v, 8)
    out = cf.chunked_forward(gq, gk, v, 1e-6, 8)
    want = gma_causal_chunked(gq, gk, v, 1e-6, 8)
    assert out.dtype == want.dtype == np.float32
    np.testing.assert_array_equal(out, want)
    got = cf.chunked_backward(gq, gk, v, d_out, eps=1e-6, chunk_size=8)
    ref = gma_causal_chunked_backward(gq, gk, v, d_out, eps=1e-6, chunk_size=8)
    for a, b in zip(got[:3], ref[:3], strict=True):
        assert a.dtype == b.dtype == np.float32
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("wide", ["gamma_k", "gamma_q", "v", "d_out"])
@pytest.mark.parametrize("namespace", ["numpy", "array_api_strict"])
def test_mixed_precisions_give_the_loop_bit_for_bit(wide, namespace):
    """One of Γ^Q, Γ^K, V, ∂L/∂O in float64, the rest float32: the sums carried from chunk to chunk are then wider
    than some chunks' terms, and the prefix and suffix sums are written into arrays of the carried dtype (NumPy
    overwrites a chunk's terms in place only where the dtypes agree): the loop's values and dtypes, bit for bit."""
    names = ("gamma_q", "gamma_k", "v", "d_out")
    arrays = [a.astype(np.float64 if name == wide else np.float32)
              for name, a in zip(names, _inputs(np.random.default_rng(15), (2,), 48), strict=True)]
    if namespace == "array_api_strict":
        xp = pytest.importorskip("array_api_strict")
        arrays = [xp.asarray(a) for a in arrays]
    gq, gk, v, d_out = arrays
    out = cf.chunked_forward(gq, gk, v, 1e-6, 8)
    want = gma_causal_chunked(gq, gk, v, 1e-6, 8)
    assert out.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want))
    got = cf.chunked_backward(gq, gk, v, d_out, eps=1e-6, chunk_size=8)
    ref = gma_causal_chunked_backward(gq, gk, v, d_out, eps=1e-6, chunk_size=8)
    for a, b in zip(got[:3], ref[:3], strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("batch", [(), (2, 3)])
def test_the_cotangents_of_gamma_are_component_major_views(batch):
    """∂L/∂Γ^Q and ∂L/∂Γ^K come back as (..., N, K) arrays whose last two axes, swapped, are contiguous (K, N)
    rows (what the score VJPs read a block of tokens at a time, reducing over K down the rows), with the loop's
    values bit for bit; ∂L/∂V as (..., N, d_v) rows."""
    gq, gk, v, d_out = _inputs(np.random.default_rng(14), batch, 40)
    got = cf.chunked_backward(gq, gk, v, d_out, eps=1e-6, chunk_size=8)
    assert np.swapaxes(got.d_gamma_q, -1, -2).flags.c_contiguous
    assert np.swapaxes(got.d_gamma_k, -1, -2).flags.c_contiguous
    assert got.d_v.flags.c_contiguous
    _assert_the_loop_bit_for_bit(gq, gk, v, d_out, 1e-6)


def test_negative_responsibilities_are_refused_unless_the_caller_checked_them(monkeypatch):
    """On the batched path a negative γ is refused as the loop refuses it, forward and backward, unless the
    caller says it checked Γ (``gamma_checked``, the pipeline's softmaxes): then Γ is not passed over for
    negative entries at all."""
    import gma_ref._core_checks as core_checks

    gq, gk, v, d_out = _inputs(np.random.default_rng(16), (), 16)
    bad = gk.copy()
    bad[3, 1] = -1e-300
    with pytest.raises(ValueError, match="^gamma_k must be non-negative"):
        cf.chunked_forward(gq, bad, v, 1e-6, 8)
    with pytest.raises(ValueError, match="^gamma_k must be non-negative"):
        cf.chunked_backward(gq, bad, v, d_out, eps=1e-6, chunk_size=8)
    looked_at = []
    real = core_checks.check_nonnegative_array
    monkeypatch.setattr(core_checks, "check_nonnegative_array",
                        lambda xp, name, a, what: (looked_at.append(name), real(xp, name, a, what)))
    cf.chunked_forward(gq, gk, v, 1e-6, 8, gamma_checked=True)
    cf.chunked_backward(gq, gk, v, d_out, eps=1e-6, chunk_size=8, gamma_checked=True)
    assert looked_at == []


def test_values_that_need_scaling_take_the_loop_unless_the_caller_found_them_unscaled(monkeypatch):
    """V near the float maximum: the backward takes the loop (which scales V), unless told V's scale is 1."""
    gq, gk, v, d_out = _inputs(np.random.default_rng(17), (), 16)
    v = v * (np.finfo(np.float64).max / 64)
    taken = []
    monkeypatch.setattr(cf, "_backward", lambda *a: taken.append("batched") or gma_causal_chunked_backward(
        a[1], a[2], a[3], a[4], eps=a[5], chunk_size=a[6]))
    cf.chunked_backward(gq, gk, v, d_out, eps=1e-6, chunk_size=8)
    assert taken == []
    cf.chunked_backward(gq, gk, v, d_out, eps=1e-6, chunk_size=8, v_unscaled=True)
    assert taken == ["batched"]



def test_no_tokens_give_the_loops_empty_arrays():
    """N = 0: the loop's empty output and cotangents (shapes and dtypes); the batched forms themselves, with no
    group to run, give the same."""
    import array_api_compat

    gq, gk, v, d_out = _inputs(np.random.default_rng(18), (2,), 0)
    xp = array_api_compat.array_namespace(gq)
    want = gma_causal_chunked(gq, gk, v, 1e-6, 8)
    want_grads = gma_causal_chunked_backward(gq, gk, v, d_out, eps=1e-6, chunk_size=8)
    for out in (cf.chunked_forward(gq, gk, v, 1e-6, 8), cf._forward(xp, gq, gk, v, 1e-6, 8, False)):
        assert out.shape == want.shape and out.dtype == want.dtype
    for got in (cf.chunked_backward(gq, gk, v, d_out, eps=1e-6, chunk_size=8),
                cf._backward(xp, gq, gk, v, d_out, 1e-6, 8, False)):
        for a, b in zip(got[:3], want_grads[:3], strict=True):
            assert a.shape == b.shape and a.dtype == b.dtype
