"""Eq. 18 from the dominant component: δ of a nearly one-hot row is exact, row by row.

``scores_cotangent`` shifts ∂L/∂Γ in each row to 0 at that row's largest responsibility before
forming δ_ik = γ_ik (g_ik − Σ_j γ_ij g_ij). Compared with exact rational arithmetic: a row whose
largest γ is below the largest γ of another row still gets its own shift (no cancellation of
g_im against Σ_j γ_ij g_ij), and K = 0 components give an empty δ as before.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from gma_ref.posterior import scores_cotangent


def _exact_delta(gamma: np.ndarray, g: np.ndarray) -> np.ndarray:
    out = np.empty(gamma.shape)
    for i in range(gamma.shape[0]):
        gr = [Fraction(float(a)) for a in gamma[i]]
        gg = [Fraction(float(a)) for a in g[i]]
        centre = sum(a * b for a, b in zip(gr, gg, strict=True))
        out[i] = [float(a * (b - centre)) for a, b in zip(gr, gg, strict=True)]
    return out


def test_each_row_is_shifted_at_its_own_largest_responsibility():
    """Row 0 has γ = (1 − 2^-50, 2^-50), row 1 γ = (1 − 2^-40, 2^-40), whose maximum is below row
    0's (both rows sum to 1 exactly): every δ, including row 1's dominant one (≈ 2e-13, a
    difference of two numbers ≈ 1/3; unshifted it is 20 % off), matches exact arithmetic to 1e-12."""
    gamma = np.array([[1.0 - 2.0**-50, 2.0**-50], [1.0 - 2.0**-40, 2.0**-40]])
    g = np.array([[1 / 3, 0.1], [1 / 3, 0.1]])
    exact = _exact_delta(gamma, g)
    got = scores_cotangent(gamma, g)
    np.testing.assert_allclose(got, exact, rtol=1e-12, atol=0.0)


def test_no_components_give_an_empty_delta():
    """K = 0: δ is the empty (N, 0) array, no error."""
    d = scores_cotangent(np.zeros((3, 0)), np.zeros((3, 0)))
    assert d.shape == (3, 0)
