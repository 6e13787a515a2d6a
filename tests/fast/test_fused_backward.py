"""The pipeline's latent backward with ∂L/∂Γ handed over block by block (:class:`gma_ref.fast.latent.LatentBackward`
driving :func:`gma_ref.fast.matmul_scores.responsibilities_backward_blocks`).

With the forward's saved arrays, ``gma_attention_backward`` never forms ∂L/∂Γ^Q or ∂L/∂Γ^K as N × K arrays: each
token block of the score VJP asks the latent core for its block of ∂L/∂Γ and uses it at once. Here, on inputs cut
into many blocks: the six gradients equal those of the same steps composed through whole arrays
(:func:`~gma_ref.fast.latent.latent_backward`, then
:func:`~gma_ref.fast.matmul_scores.responsibilities_backward_guarded` on each side) to rounding (the latent core's
sums over query tokens are cut at the score VJP's blocks instead of its own), with batch and head axes, per-head
mixtures, rows the rounding guard sends to the direct form, and in float32; the same on 1, 2 and 3 threads; ε = 0
(the reader's core, handed out by slices) as without the saved arrays; a stale saved output is refused with the
reader's message. ``LatentBackward`` itself: blocks taken in any order give the same cotangents as in token order,
bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

import gma_ref.fast.attention as attention
import gma_ref.fast.blocks as blocks
import gma_ref.fast.latent as lf
from gma_ref.fast import gma_attention, gma_attention_backward
from gma_ref.fast.matmul_scores import responsibilities_backward_guarded
from gma_ref.mixture import log_priors_from_logits, variances_from_omega


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of a few tokens, so that every sum over tokens spans several blocks."""
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 60 * 8)
    monkeypatch.setattr(blocks, "MIN_BLOCK_ROWS", 1)


def _inputs(rng, batch=(2, 3), n_q=37, n_k=29, k=5, d_r=4, d_v=3, mixture=(3,), clustered=False, dtype=np.float64):
    means = rng.normal(size=mixture + (k, d_r))
    omega = rng.normal(size=mixture + (k, d_r))
    logits = rng.normal(size=mixture + (k,))
    q = rng.normal(size=batch + (n_q, d_r))
    key = rng.normal(size=batch + (n_k, d_r))
    if clustered:  # tight, far-apart components: the guard sends the rows near them to the direct form
        means = 100.0 * means
        omega = np.full(mixture + (k, d_r), -6.0)  # σ² = softplus(−6) + ε_σ ≈ 2.6e-3
        q[..., ::2, :] = means[..., :1, :] + 0.01 * q[..., ::2, :]
        key[..., 1::2, :] = means[..., 1:2, :] + 0.01 * key[..., 1::2, :]
    v = rng.normal(size=batch + (n_k, d_v)) + 2.0
    d_out = rng.normal(size=batch + (n_q, d_v))
    return tuple(a.astype(dtype) for a in (q, key, v, means, omega, logits, d_out))


def _composed(args, saved, eps):
    """The same steps through whole arrays: the latent VJP, then each side's score VJP."""
    q, key, v, means, omega, logits, d_out = args
    var, lp = variances_from_omega(omega), log_priors_from_logits(logits)
    d_gq, d_gk, d_v = lf.latent_backward(saved.gamma_q, saved.gamma_k, v, d_out, eps, saved.out, "saved.out", "x")
    side_q = responsibilities_backward_guarded(q, means, var, saved.gamma_q, d_gq, lp, saved.direct_rows_q)
    side_k = responsibilities_backward_guarded(key, means, var, saved.gamma_k, d_gk, lp, saved.direct_rows_k)
    return side_q.d_x, side_k.d_x, d_v, side_q.d_means + side_k.d_means


@pytest.mark.parametrize("clustered", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_block_by_block_equals_whole_arrays(small_blocks, clustered, dtype):
    """d_q, d_k, d_v, d_means equal the whole-array composition to rounding (a few units in the last place of
    the largest entry); the guard flagged rows where the data is clustered."""
    args = _inputs(np.random.default_rng(1), clustered=clustered, dtype=dtype)
    out, saved = gma_attention(*args[:6], return_saved=True)
    assert bool(np.any(saved.direct_rows_q)) == clustered and bool(np.any(saved.direct_rows_k)) == clustered
    grads = gma_attention_backward(*args, saved=saved)
    want = _composed(args, saved, 1e-6)
    assert len(blocks.token_blocks(np, args[0].shape[-2], 5 + 2 * 4 + 1)) > 3
    for name, a, b in zip(("d_q", "d_k", "d_v", "d_means"), grads[:4], want, strict=True):
        assert a.dtype == np.dtype(dtype) and a.shape == b.shape, name
        ulp = float(np.finfo(dtype).eps) * float(np.max(np.abs(b)))
        np.testing.assert_allclose(a, b, rtol=0, atol=16 * ulp, err_msg=name)


def test_the_saved_latent_backward_forms_no_whole_cotangent_of_gamma(small_blocks, monkeypatch):
    """With the saved arrays, neither the whole-array latent VJP nor the whole-array score VJP runs."""
    args = _inputs(np.random.default_rng(2))
    _, saved = gma_attention(*args[:6], return_saved=True)
    want = gma_attention_backward(*args, saved=saved)

    def refuse(*a, **kw):
        raise AssertionError("a whole ∂L/∂Γ was formed")

    monkeypatch.setattr(lf, "latent_backward", refuse)
    monkeypatch.setattr(attention, "responsibilities_backward_guarded", refuse)
    monkeypatch.setattr(attention, "gma_bidirectional_backward", refuse)
    got = gma_attention_backward(*args, saved=saved)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_the_same_bits_on_any_number_of_threads(small_blocks, monkeypatch, workers):
    args = _inputs(np.random.default_rng(3), clustered=True)
    _, saved = gma_attention(*args[:6], return_saved=True)
    monkeypatch.setattr(blocks, "worker_count", lambda: 1)
    want = gma_attention_backward(*args, saved=saved)
    monkeypatch.setattr(blocks, "worker_count", lambda: workers)
    got = gma_attention_backward(*args, saved=saved)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_eps_zero_takes_the_readers_core_by_slices(small_blocks):
    """At ε = 0 the latent core is the reader's (formed whole, handed out by slices): the gradients equal those
    computed without the saved arrays to rounding."""
    args = _inputs(np.random.default_rng(4))
    _, saved = gma_attention(*args[:6], eps=0.0, return_saved=True)
    got = gma_attention_backward(*args, eps=0.0, saved=saved)
    want = gma_attention_backward(*args, eps=0.0)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12 * float(np.max(np.abs(b))))


def test_a_stale_output_is_refused(small_blocks):
    """A saved output moved in one entry is a ValueError naming saved.out, as without the blocks."""
    args = _inputs(np.random.default_rng(5))
    out, saved = gma_attention(*args[:6], return_saved=True)
    stale = saved._replace(out=out.copy())
    stale.out[1, 2, 7, 1] += 1e-3
    with pytest.raises(ValueError, match="saved.out"):
        gma_attention_backward(*args, saved=stale)


def test_latent_backward_blocks_in_any_order(small_blocks):
    """The query blocks' sums are added in token order whatever order the blocks ran in."""
    rng = np.random.default_rng(6)
    gq = rng.dirichlet(np.ones(5), size=(2, 37))
    gk = rng.dirichlet(np.ones(5), size=(2, 29))
    v, d_out = rng.normal(size=(2, 29, 3)), rng.normal(size=(2, 37, 3))
    out = lf.latent_forward(gq, gk, v, 1e-6)
    runs = []
    for order in (1, -1):
        lat = lf.LatentBackward(gq, gk, v, d_out, 1e-6, out, "saved.out", "x")
        cuts_q = blocks.token_blocks(np, 37, 11)[::order]
        cuts_k = blocks.token_blocks(np, 29, 11)[::order]
        d_q = {a: lat.queries(a, b) for a, b in cuts_q}
        lat.end_queries()
        d_k = {a: lat.keys(a, b) for a, b in cuts_k}
        runs.append((np.concatenate([d_q[a] for a in sorted(d_q)], axis=-1),
                     np.concatenate([d_k[a] for a in sorted(d_k)], axis=-1), lat.d_values))
    assert len(blocks.token_blocks(np, 37, 11)) > 3
    for a, b in zip(*runs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_each_side_is_cut_at_the_score_vjps_row_width(monkeypatch):
    """The backward's passes over tokens: the write step's sums over the keys at K + d_v (Γ^K and V rows), then
    the query side and the key side each at the score VJP's row width K + 2 d_r + 1 (K = 5, d_r = 4, d_v = 3;
    N_q = 37, N_k = 29)."""
    import gma_ref.fast.matmul_scores as fast

    args = _inputs(np.random.default_rng(7))
    _, saved = gma_attention(*args[:6], return_saved=True)
    cuts = []

    def spy(xp, n, width, itemsize):
        cuts.append((n, width, itemsize))
        return blocks.token_blocks(xp, n, width, itemsize)

    monkeypatch.setattr(fast, "token_blocks", spy)
    monkeypatch.setattr(lf, "token_blocks", spy)
    gma_attention_backward(*args, saved=saved)
    assert cuts == [(29, 8, 8), (37, 14, 8), (29, 14, 8)]
