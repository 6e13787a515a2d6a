"""The pipeline's latent core (:mod:`gma_ref.fast.latent`) against the reader's (:mod:`gma_ref.bidirectional`).

The fast path computes the latent form's output and its VJP in token blocks on the block threads, with
∂L/∂Γ formed component-major. Here, on inputs cut into several blocks: forward first, then the three
cotangents for a random cotangent, agree with ``gma_bidirectional`` / ``latent_vjp`` to rounding, with batch
axes, N_q ≠ N_k, in float64 and float32; the results are bit for bit the same on 1, 2 and 3 threads; a
stale, mistyped or misshapen saved output is refused as the reader refuses it; the cases the blocked form
does not take (ε = 0, broadcast batch axes, V near the float maximum, no keys) are the reader's form itself.
"""

from __future__ import annotations

import numpy as np
import pytest

import gma_ref.fast.blocks as blocks
import gma_ref.fast.latent as lf
from gma_ref.bidirectional import gma_bidirectional, latent_vjp


def _inputs(rng, batch=(2,), n_q=37, n_k=29, k=5, d_v=3, dtype=np.float64):
    gq = rng.dirichlet(np.ones(k), size=batch + (n_q,))
    gk = rng.dirichlet(np.ones(k), size=batch + (n_k,))
    v = rng.normal(size=batch + (n_k, d_v)) + 3.0  # an offset, which the centring of V takes out
    d_out = rng.normal(size=batch + (n_q, d_v))
    return tuple(a.astype(dtype) for a in (gq, gk, v, d_out))


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of a few tokens, so that every sum over tokens spans several blocks."""
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 40 * 8)
    monkeypatch.setattr(blocks, "MIN_BLOCK_ROWS", 1)


def _close(a, b, dtype, name=""):
    """Agreement to rounding, relative to the largest entry: ∂L/∂Γ^Q = P Ṽ_cᵀ + c Zᵀ cancels to small entries."""
    scale = float(np.max(np.abs(b))) if b.size else 1.0
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * scale, err_msg=name)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("batch", [(), (2,), (2, 3)])
def test_blocked_latent_core_agrees_with_the_reader(small_blocks, dtype, batch):
    """Forward (asserted first), then ∂L/∂Γ^Q, ∂L/∂Γ^K, ∂L/∂V for a random cotangent, each of its input's
    shape and dtype, equal to the reader's to rounding."""
    gq, gk, v, d_out = _inputs(np.random.default_rng(len(batch)), batch, dtype=dtype)
    assert len(blocks.token_blocks(np, gq.shape[-2], 5 + 2 * 3)) > 2
    out = lf.latent_forward(gq, gk, v, 1e-6)
    want_out = gma_bidirectional(gq, gk, v, 1e-6, check_finite=False)
    assert out.dtype == want_out.dtype and out.shape == want_out.shape
    _close(out, want_out, dtype)
    got = lf.latent_backward(gq, gk, v, d_out, 1e-6, out, "saved.out", "saved=None")
    want = latent_vjp(gq, gk, v, d_out, 1e-6, want_out, False)
    for name, a, b, x in zip(("d_gamma_q", "d_gamma_k", "d_v"), got, want, (gq, gk, v), strict=True):
        assert a.shape == x.shape and a.dtype == x.dtype, name
        _close(a, b, dtype, name)


def test_blocked_latent_core_is_the_same_on_any_number_of_threads(small_blocks, monkeypatch):
    """The blocks' sums are added in block order: 1, 2 and 3 threads give the same bits."""
    pytest.importorskip("threadpoolctl")
    gq, gk, v, d_out = _inputs(np.random.default_rng(3), (2,))
    results = []
    for threads in (1, 2, 3):
        monkeypatch.setattr(blocks, "worker_count", lambda threads=threads: threads)
        out = lf.latent_forward(gq, gk, v, 1e-6)
        results.append((out, *lf.latent_backward(gq, gk, v, d_out, 1e-6, out, "saved.out", "saved=None")))
    for other in results[1:]:
        for a, b in zip(other, results[0], strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("batch", "n_q", "n_k"), [((), 37, 29), ((2,), 37, 29), ((2, 3), 37, 29), ((2,), 1, 29),
                                                  ((2,), 37, 1)])
def test_the_cotangents_of_gamma_are_component_major_views(batch, n_q, n_k):
    """∂L/∂Γ come back as (..., N, K) arrays whose last two axes, swapped, are contiguous (K, N) rows: what the
    score VJPs read one block of tokens at a time; with batch axes and for a single query or a single key too
    (the blocked form's cases: the reader's form returns (..., N, K) rows, whose swap is not contiguous for
    N > 1)."""
    gq, gk, v, d_out = _inputs(np.random.default_rng(4), batch, n_q=n_q, n_k=n_k)
    out = lf.latent_forward(gq, gk, v, 1e-6)
    d_gq, d_gk, _ = lf.latent_backward(gq, gk, v, d_out, 1e-6, out, "saved.out", "saved=None")
    assert d_gq.shape == gq.shape and np.swapaxes(d_gq, -1, -2).flags.c_contiguous
    assert d_gk.shape == gk.shape and np.swapaxes(d_gk, -1, -2).flags.c_contiguous


@pytest.mark.parametrize("change", ["stale", "dtype", "shape"])
def test_a_wrong_saved_output_is_refused_as_the_reader_refuses_it(small_blocks, change):
    """The identity Σ_i (u_i + ε) O_i = (1ᵀ Γ^Q) Ṽ summed over the query blocks: a stale output (one entry
    moved by 1e-3) is a ValueError naming it and its remedy; a wrong dtype a TypeError, a wrong shape a
    ValueError, with the reader's messages."""
    gq, gk, v, d_out = _inputs(np.random.default_rng(5), (2,))
    out = lf.latent_forward(gq, gk, v, 1e-6)
    bad = {"stale": out + np.where(np.arange(out.size).reshape(out.shape) == 7, 1e-3, 0.0),
           "dtype": out.astype(np.int64), "shape": out[..., :-1, :]}[change]
    kind = TypeError if change == "dtype" else ValueError
    with pytest.raises(kind) as fast:
        lf.latent_backward(gq, gk, v, d_out, 1e-6, bad, "saved.out", "saved=None to recompute it")
    with pytest.raises(kind) as reader:
        latent_vjp(gq, gk, v, d_out, 1e-6, bad, False, "saved.out", "saved=None to recompute it")
    assert str(fast.value) == str(reader.value)
    assert "saved.out" in str(fast.value)


@pytest.mark.parametrize("case", ["eps_zero", "broadcast", "huge_v", "no_keys", "no_queries"])
def test_other_cases_are_the_readers_form(small_blocks, case):
    """ε = 0 (rows that see no mass), batch axes that broadcast, V near the float maximum (scaled), no keys, no
    queries: the blocked form does not apply and the results are the reader's, bit for bit."""
    gq, gk, v, d_out = _inputs(np.random.default_rng(6), (2,))
    eps = 0.0 if case == "eps_zero" else 1e-6
    if case == "eps_zero":
        gk[..., :, 0] = 0.0
        gk /= gk.sum(-1, keepdims=True)
        gq[..., :3, :] = 0.0
        gq[..., :3, 0] = 1.0  # these queries see no key mass: their rows are 0
    if case == "broadcast":
        gk, v = gk[:1], v[:1]
    if case == "huge_v":
        v = v * 1e306
    if case == "no_keys":
        gk, v = gk[..., :0, :], v[..., :0, :]
    if case == "no_queries":
        gq, d_out = gq[..., :0, :], d_out[..., :0, :]
    out = lf.latent_forward(gq, gk, v, eps)
    np.testing.assert_array_equal(out, gma_bidirectional(gq, gk, v, eps, check_finite=False))
    got = lf.latent_backward(gq, gk, v, d_out, eps, out, "saved.out", "saved=None")
    want = latent_vjp(gq, gk, v, d_out, eps, out, False)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("case", ["blocked", "eps_zero", "broadcast"])
def test_non_finite_inputs_pass_unchecked(small_blocks, case):
    """Both steps are the reader's with ``check_finite=False`` (the pipeline checks its inputs once, before):
    a NaN in V reaches the output and the gradients, and a NaN or an infinity in ∂L/∂O the gradients, with no
    error, on the blocked form and on the reader's alike."""
    gq, gk, v, d_out = _inputs(np.random.default_rng(7), (2,))
    eps = 0.0 if case == "eps_zero" else 1e-6
    if case == "broadcast":
        gk, v = gk[:1], v[:1]
    out = lf.latent_forward(gq, gk, v, eps)
    bad_v = v.copy()
    bad_v[..., 4, 1] = np.nan
    with np.errstate(invalid="ignore"):  # NaN and ∞ in the products: the values are what is asserted
        bad_out = lf.latent_forward(gq, gk, bad_v, eps)
    assert np.isnan(bad_out[..., 1]).all() and np.isfinite(np.delete(bad_out, 1, axis=-1)).all()
    bad_d_out = d_out.copy()
    bad_d_out[0, 2, 0] = np.nan
    bad_d_out[-1, 5, 2] = np.inf
    with np.errstate(invalid="ignore"):
        got = lf.latent_backward(gq, gk, v, bad_d_out, eps, out, "saved.out", "saved=None")
    assert all(not np.isfinite(a).all() for a in got)
    # a NaN in V with the output of the finite V: the saved output's identity cannot tell (its right side is
    # NaN), and V itself is not checked either
    with np.errstate(invalid="ignore"):
        got = lf.latent_backward(gq, gk, bad_v, d_out, eps, out, "saved.out", "saved=None")
    assert np.isnan(got[0]).any() and np.isnan(got[1]).any()


def test_each_pass_is_cut_at_its_row_width(monkeypatch):
    """Each pass over tokens is cut by ``token_blocks`` at the row width of its block's intermediates: K + d_v
    for the write step (a key's Γ^K and V rows) and the read step (a query's Γ^Q row and output row), K + 2 d_v
    for the VJP's passes (a query's Γ^Q, O and ∂L/∂O rows; a key's Γ^K, V and ∂L/∂V rows). Batch axes (2, 4),
    K = 5, d_v = 3, N_q = 37, N_k = 29: no two of these sizes are equal."""
    gq, gk, v, d_out = _inputs(np.random.default_rng(8), (2, 4))
    cuts = []

    def spy(xp, n, width, itemsize):
        cuts.append((n, width, itemsize))
        return blocks.token_blocks(xp, n, width, itemsize)

    monkeypatch.setattr(lf, "token_blocks", spy)
    out = lf.latent_forward(gq, gk, v, 1e-6)
    assert cuts == [(29, 8, 8), (37, 8, 8)]
    cuts.clear()
    lf.latent_backward(gq, gk, v, d_out, 1e-6, out, "saved.out", "saved=None")
    assert cuts == [(29, 8, 8), (37, 11, 8), (29, 11, 8)]


@pytest.mark.parametrize("shape", [(2, 38, 3), (2, 37, 4), (2, 37, 1), (1, 37, 3)])
def test_a_misshapen_cotangent_is_refused_as_the_reader_refuses_it(small_blocks, shape):
    """∂L/∂O of another shape than the output's (a row or a column too many, one column that would broadcast,
    a batch axis that would) is a ValueError with the reader's message, before any block reads it."""
    gq, gk, v, d_out = _inputs(np.random.default_rng(9), (2,))
    out = lf.latent_forward(gq, gk, v, 1e-6)
    bad = np.random.default_rng(10).normal(size=shape)
    with pytest.raises(ValueError, match="d_out") as fast:
        lf.latent_backward(gq, gk, v, bad, 1e-6, out, "saved.out", "saved=None")
    with pytest.raises(ValueError) as reader:
        latent_vjp(gq, gk, v, bad, 1e-6, out, False, "saved.out", "saved=None")
    assert str(fast.value) == str(reader.value)


def test_a_stale_output_is_found_at_its_own_columns_scale(small_blocks):
    """The saved output's identity is checked column by column, each at its own scale: with a first column of V
    10⁶ times the others, a stale entry in the last column (moved by 1e-4, far below the first column's
    rounding) is still a ValueError, as the reader finds it."""
    gq, gk, v, d_out = _inputs(np.random.default_rng(11), (2,))
    v[..., 0] *= 1e6
    out = lf.latent_forward(gq, gk, v, 1e-6)
    lf.latent_backward(gq, gk, v, d_out, 1e-6, out, "saved.out", "saved=None")  # the fresh output passes
    bad = out.copy()
    bad[1, 5, 2] += 1e-4
    with pytest.raises(ValueError, match="saved.out") as fast:
        lf.latent_backward(gq, gk, v, d_out, 1e-6, bad, "saved.out", "saved=None")
    with pytest.raises(ValueError) as reader:
        latent_vjp(gq, gk, v, d_out, 1e-6, bad, False, "saved.out", "saved=None")
    assert str(fast.value) == str(reader.value)


def test_arrays_it_makes_live_on_the_inputs_device(small_blocks):
    """array_api_strict arrays on a second device: the forward, the three cotangents (the arrays the passes write
    into included) live there and equal the reader's to rounding."""
    import array_api_strict as xs

    dev = xs.Device("device1")
    gq, gk, v, d_out = (xs.asarray(a, device=dev) for a in _inputs(np.random.default_rng(12), (2,)))
    out = lf.latent_forward(gq, gk, v, 1e-6)
    got = lf.latent_backward(gq, gk, v, d_out, 1e-6, out, "saved.out", "saved=None")
    want = latent_vjp(gq, gk, v, d_out, 1e-6, out, False)
    for a, b in zip(got, want, strict=True):
        assert a.device == dev
        _close(np.asarray(xs.asarray(a, device=xs.Device("CPU_DEVICE"))), np.asarray(
            xs.asarray(b, device=xs.Device("CPU_DEVICE"))), np.float64)


def test_responsibilities_are_checked_for_negative_entries_unless_the_caller_did(rng, monkeypatch):
    """By default the blocked forward refuses a negative responsibility as the reader does; with ``checked=True``
    (the pipeline, whose Γ are softmaxes) it does not pass over Γ for negative entries, and gives the same
    output for valid Γ."""
    import gma_ref._core_checks as core_checks  # noqa: PLC0415

    gq, gk, v, _ = _inputs(rng)
    bad = gq.copy()
    bad[0, 3, 1] = -1e-300
    with pytest.raises(ValueError, match="^gamma_q must be non-negative"):
        lf.latent_forward(bad, gk, v, 1e-6)
    want = lf.latent_forward(gq, gk, v, 1e-6)
    looked_at = []
    real = core_checks.check_nonnegative_array
    monkeypatch.setattr(core_checks, "check_nonnegative_array",
                        lambda xp, name, a, what: (looked_at.append(name), real(xp, name, a, what)))
    np.testing.assert_array_equal(lf.latent_forward(gq, gk, v, 1e-6, checked=True), want)
    assert looked_at == []
    lf.latent_forward(gq, gk, v, 1e-6)
    assert looked_at == ["gamma_q", "gamma_k"]
