"""Interpretability diagnostics of a responsibility tensor (§5.4, Eqs. 24–34, App. F.3).

The input is a query responsibility tensor Γ^Q of shape ``(S, H, L, K)``
(samples, heads, tokens, components) or an already head-averaged and flattened
``(T, K)`` matrix whose rows lie on the simplex. The diagnostics are::

    γ̄_{s,ℓ,k} = (1/H) Σ_h γ_{s,h,ℓ,k}                       (Eq. 24; flattened to t = s·L + ℓ)
    p_k        = (1/T) Σ_t γ̄_{t,k}                           (Eq. 25, marginal usage)
    H_usage    = −Σ_k p_k log p_k / log K                     (Eq. 26)
    H_token    = (1/T) Σ_t (−Σ_k γ̄_tk log γ̄_tk) / log K       (Eq. 27)
    R_max      = (1/T) Σ_t max_k γ̄_tk                         (Eq. 28)
    z_t        = argmax_k γ̄_tk                                (Eq. 29)
    n_kc       = #{t : z_t = k, c_t = c},  n_k = Σ_c n_kc      (Eq. 30)
    purity(k)  = max_c n_kc / n_k                             (Eq. 31, for n_k > 0)
    purity_w   = Σ_{k: n_k>0} (n_k / T) purity(k)             (Eq. 32)
    I(Z;C)     = Σ_kc p(k,c) log[p(k,c) / (p(k) p(c))]        (Eq. 33, nats)
    NMI        = I(Z;C) / min{H(Z), H(C)}                     (Eq. 34)

and the permutation baseline of App. F.3 (shuffle the categories c_t, keep the
assignments z_t, report mean ± sd of purity_w and I(Z;C) over permutations).

Conventions (the paper leaves these open):

* 0 · log 0 = 0 in every entropy, computed without producing NaN or warnings.
* K = 1: log K = 0, and the normalised entropies (Eqs. 26, 27) are defined as 0.
* Ties in Eq. 29 go to the lowest component index (the array API ``argmax`` rule).
* Empty components (n_k = 0) have purity NaN in :func:`component_purity` and are
  left out of Eq. 32, as in the paper.
* NMI is defined as 0 when min{H(Z), H(C)} = 0, i.e. when only one category (or only
  one component) occurs: then I(Z;C) = 0 as well.
* Categories are integer codes ``0 … C−1``; :func:`encode_categories` turns any
  labels (strings, ...) into codes on the host.

Soft diagnostics (Eqs. 24–28) are computed in the dtype of ``gamma_q``; count-based
ones (Eqs. 30–34) in float64 (counts are exact integers up to 2**53). Everything is
array-API code except two documented host-side steps: :func:`encode_categories`
(``numpy.unique``) and the random permutations of :func:`permutation_baseline`
(``numpy.random.Generator``; the standard has no random numbers). The report
(:func:`diagnostics_report`) converts its scalars to Python floats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import array_api_compat
import numpy as np

from ._array import Array, check_floating, check_positive_int, n_elements, namespace
from ._array import check_finite as _check_finite

__all__ = [
    "head_average",
    "token_responsibilities",
    "marginal_usage",
    "usage_entropy",
    "token_entropy",
    "mean_max_responsibility",
    "hard_assignments",
    "encode_categories",
    "contingency_counts",
    "component_purity",
    "weighted_purity",
    "mutual_information",
    "normalized_mutual_information",
    "PermutationBaseline",
    "permutation_baseline",
    "DiagnosticsReport",
    "diagnostics_report",
]


# --------------------------------------------------------------------------- input checks


def _simplex_tol(xp: Any, dtype: Any, k: int) -> float:
    return 100.0 * max(k, 1) * float(xp.finfo(dtype).eps)


def _check_gamma(xp: Any, gamma_q: Array, check_finite: bool, check_simplex: bool) -> None:
    check_floating(xp, "gamma_q", gamma_q)
    if gamma_q.ndim not in (2, 4):
        raise ValueError(
            "gamma_q must have shape (S, H, L, K) or head-averaged (T, K), "
            f"got shape {tuple(gamma_q.shape)}"
        )
    k = gamma_q.shape[-1]
    if k < 1:
        raise ValueError(f"gamma_q must have K >= 1 components, got shape {tuple(gamma_q.shape)}")
    if n_elements(gamma_q) == 0:
        raise ValueError(f"gamma_q must hold at least one token, got shape {tuple(gamma_q.shape)}")
    if check_finite:
        _check_finite(xp, "gamma_q", gamma_q)
    if check_simplex:
        if not bool(xp.all(gamma_q >= 0)):
            raise ValueError(
                f"gamma_q must be non-negative (rows on the simplex), got min {float(xp.min(gamma_q))}; "
                "pass check_simplex=False to skip this check"
            )
        dev = float(xp.max(xp.abs(xp.sum(gamma_q, axis=-1) - 1.0)))
        tol = _simplex_tol(xp, gamma_q.dtype, k)
        if not dev <= tol:
            raise ValueError(
                f"gamma_q rows must sum to 1 over K, got max |row sum - 1| = {dev:.3g} > {tol:.3g}; "
                "pass check_simplex=False to skip this check"
            )


def _check_labels(xp: Any, name: str, a: Array, size: int | None, size_name: str) -> int:
    """Check a 1-D integer label array with values in [0, size); return the size used."""
    if not xp.isdtype(a.dtype, "integral"):
        raise TypeError(f"{name} must have an integer dtype (codes 0, 1, ...), got {a.dtype}")
    if a.ndim != 1:
        raise ValueError(f"{name} must have shape (T,), got shape {tuple(a.shape)}")
    if a.shape[0] < 1:
        raise ValueError(f"{name} must hold at least one token, got shape {tuple(a.shape)}")
    lo, hi = int(xp.min(a)), int(xp.max(a))
    if lo < 0:
        raise ValueError(f"{name} must be >= 0, got min {lo}")
    if size is None:
        return hi + 1
    size = check_positive_int(size_name, size)
    if hi >= size:
        raise ValueError(f"{name} must be < {size}, got max {hi}")
    return size


# --------------------------------------------------------------------------- soft diagnostics


def head_average(gamma_q: Array, *, check_finite: bool = True, check_simplex: bool = True) -> Array:
    """Head-averaged responsibilities γ̄_{s,ℓ,k} = (1/H) Σ_h γ_{s,h,ℓ,k} (Eq. 24).

    Parameters
    ----------
    gamma_q : array, shape ``(S, H, L, K)``
        Responsibilities (samples, heads, tokens, components), real floating dtype,
        rows on the simplex over K.
    check_finite, check_simplex : bool
        Raise on NaN/Inf, on negative entries or on rows not summing to 1 (tolerance
        ``100·K·eps`` of the dtype). Default ``True``.

    Returns
    -------
    gamma_bar : array, shape ``(S, L, K)``, dtype of ``gamma_q``.

    Raises
    ------
    TypeError
        ``gamma_q`` is not a real floating array.
    ValueError
        ``gamma_q`` is not 4-D, has K < 1 or no tokens, or fails the checks above.
    """
    xp = namespace(gamma_q=gamma_q)
    _check_gamma(xp, gamma_q, check_finite, check_simplex)
    if gamma_q.ndim != 4:
        raise ValueError(f"gamma_q must have shape (S, H, L, K), got shape {tuple(gamma_q.shape)}")
    # [eq:24]
    return xp.mean(gamma_q, axis=1)
    # [/eq:24]


def token_responsibilities(
    gamma_q: Array, *, check_finite: bool = True, check_simplex: bool = True
) -> Array:
    """The T × K matrix γ̄_t of §5.4: Eq. 24 followed by flattening (s, ℓ) → t = s·L + ℓ.

    ``gamma_q`` of shape ``(S, H, L, K)`` is averaged over heads and reshaped to
    ``(S·L, K)`` (sample-major); a ``(T, K)`` input is taken as already head-averaged
    and returned unchanged after the checks. Dtype is preserved. Raises as
    :func:`head_average` (a ``gamma_q`` that is neither 2-D nor 4-D raises ``ValueError``).
    """
    xp = namespace(gamma_q=gamma_q)
    _check_gamma(xp, gamma_q, check_finite, check_simplex)
    if gamma_q.ndim == 2:
        return gamma_q
    # [eq:24token]
    s, _, l_len, k = gamma_q.shape
    return xp.reshape(xp.mean(gamma_q, axis=1), (s * l_len, k))
    # [/eq:24token]


def _entropy_nats(xp: Any, p: Array, axis: int = -1) -> Array:
    """−Σ p log p along ``axis`` with 0 · log 0 = 0 (no NaN, no warning)."""
    # [eq:entropy]
    positive = p > 0
    safe = xp.where(positive, p, xp.ones_like(p))
    return -xp.sum(xp.where(positive, p * xp.log(safe), xp.zeros_like(p)), axis=axis)
    # [/eq:entropy]


def marginal_usage(gamma_q: Array, *, check_finite: bool = True, check_simplex: bool = True) -> Array:
    """Marginal component usage p_k = (1/T) Σ_t γ̄_tk (Eq. 25).

    ``gamma_q``: ``(S, H, L, K)`` or head-averaged ``(T, K)`` (see
    :func:`token_responsibilities`). Returns shape ``(K,)`` in the dtype of
    ``gamma_q``; it sums to 1. Raises as :func:`token_responsibilities`.
    """
    xp = namespace(gamma_q=gamma_q)
    g = token_responsibilities(gamma_q, check_finite=check_finite, check_simplex=check_simplex)
    # [eq:25]
    return xp.mean(g, axis=0)
    # [/eq:25]


def usage_entropy(gamma_q: Array, *, check_finite: bool = True, check_simplex: bool = True) -> Array:
    """Normalised usage entropy H_usage = −Σ_k p_k log p_k / log K (Eq. 26).

    ``gamma_q``: ``(S, H, L, K)`` or ``(T, K)``. Returns a 0-d array in the dtype of
    ``gamma_q``, in [0, 1]: 1 for uniform usage, 0 when one component takes all mass.
    0 · log 0 = 0. For K = 1 (log K = 0) the value is defined as 0. Raises as
    :func:`token_responsibilities`.
    """
    xp = namespace(gamma_q=gamma_q)
    p = marginal_usage(gamma_q, check_finite=check_finite, check_simplex=check_simplex)
    # [eq:26]
    k = p.shape[0]
    h = _entropy_nats(xp, p)
    if k == 1:
        return xp.zeros_like(h)
    return h / math.log(k)
    # [/eq:26]


def token_entropy(gamma_q: Array, *, check_finite: bool = True, check_simplex: bool = True) -> Array:
    """Normalised mean token entropy (1/T) Σ_t (−Σ_k γ̄_tk log γ̄_tk) / log K (Eq. 27).

    ``gamma_q``: ``(S, H, L, K)`` or ``(T, K)``. Returns a 0-d array in the dtype of
    ``gamma_q``, in [0, 1]: 0 for one-hot rows, 1 for uniform rows. 0 · log 0 = 0.
    For K = 1 the value is defined as 0. Raises as :func:`token_responsibilities`.
    """
    xp = namespace(gamma_q=gamma_q)
    g = token_responsibilities(gamma_q, check_finite=check_finite, check_simplex=check_simplex)
    # [eq:27]
    k = g.shape[-1]
    h = xp.mean(_entropy_nats(xp, g, axis=-1))
    if k == 1:
        return xp.zeros_like(h)
    return h / math.log(k)
    # [/eq:27]


def mean_max_responsibility(
    gamma_q: Array, *, check_finite: bool = True, check_simplex: bool = True
) -> Array:
    """Mean maximum responsibility R_max = (1/T) Σ_t max_k γ̄_tk (Eq. 28).

    ``gamma_q``: ``(S, H, L, K)`` or ``(T, K)``. Returns a 0-d array in the dtype of
    ``gamma_q``, in [1/K, 1]. Raises as :func:`token_responsibilities`.
    """
    xp = namespace(gamma_q=gamma_q)
    g = token_responsibilities(gamma_q, check_finite=check_finite, check_simplex=check_simplex)
    # [eq:28]
    return xp.mean(xp.max(g, axis=-1))
    # [/eq:28]


def hard_assignments(gamma_q: Array, *, check_finite: bool = True, check_simplex: bool = True) -> Array:
    """Hard assignments z_t = argmax_k γ̄_tk (Eq. 29).

    ``gamma_q``: ``(S, H, L, K)`` (head-averaged and flattened first) or ``(T, K)``.
    Returns an integer array of shape ``(T,)`` (the namespace's default index dtype)
    with values in ``0 … K−1``. Ties go to the lowest component index. Raises as
    :func:`token_responsibilities`.
    """
    xp = namespace(gamma_q=gamma_q)
    g = token_responsibilities(gamma_q, check_finite=check_finite, check_simplex=check_simplex)
    # [eq:29]
    return xp.argmax(g, axis=-1)
    # [/eq:29]


# --------------------------------------------------------------------------- hard diagnostics


def encode_categories(labels: Sequence[Any] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes for arbitrary category labels (host-side bookkeeping, NumPy).

    ``labels`` is any 1-D sequence of sortable labels (strings such as ``"punctuation"``,
    integers, ...), one per token t. Returns ``(codes, names)``: ``codes`` is a NumPy
    int64 array of shape ``(T,)`` with ``names[codes[t]] == labels[t]``, and ``names``
    the sorted distinct labels (``numpy.unique``). Convert ``codes`` to your array
    namespace with ``xp.asarray`` before passing it to :func:`contingency_counts`.

    Raises ``ValueError`` when ``labels`` is not 1-D or is empty.
    """
    arr = np.asarray(labels)
    if arr.ndim != 1 or arr.shape[0] < 1:
        raise ValueError(f"labels must be a non-empty 1-D sequence, got shape {arr.shape}")
    names, codes = np.unique(arr, return_inverse=True)
    return codes.reshape(-1).astype(np.int64), names


def _one_hot(xp: Any, labels: Array, size: int) -> Array:
    dev = array_api_compat.device(labels)
    cols = xp.arange(size, dtype=labels.dtype, device=dev)
    return xp.astype(xp.reshape(labels, (-1, 1)) == xp.reshape(cols, (1, -1)), xp.float64)


def contingency_counts(
    assignments: Array,
    categories: Array,
    *,
    n_components: int | None = None,
    n_categories: int | None = None,
) -> Array:
    """Contingency table n_kc = Σ_t 1{z_t = k, c_t = c} (Eq. 30); n_k is its row sum.

    Parameters
    ----------
    assignments : integer array, shape ``(T,)``
        Hard assignments z_t in ``0 … K−1`` (:func:`hard_assignments`).
    categories : integer array, shape ``(T,)``, same namespace
        Category codes c_t in ``0 … C−1`` (:func:`encode_categories` for labels).
    n_components, n_categories : int, optional
        K and C; default ``max + 1`` of the respective array. Passing K keeps
        components that received no token as zero rows.

    Returns
    -------
    counts : float64 array, shape ``(K, C)``
        Exact integer counts (float64 so the Eq. 31–34 arithmetic needs no casts),
        computed as ``one_hot(z)ᵀ one_hot(c)``.

    Raises
    ------
    TypeError
        Non-integer dtypes, or arrays of different namespaces.
    ValueError
        Not 1-D, empty, lengths differ, negative codes, codes ≥ K or ≥ C, or
        ``n_components``/``n_categories`` < 1.
    """
    xp = namespace(assignments=assignments, categories=categories)
    k = _check_labels(xp, "assignments", assignments, n_components, "n_components")
    c = _check_labels(xp, "categories", categories, n_categories, "n_categories")
    if assignments.shape[0] != categories.shape[0]:
        raise ValueError(
            f"assignments and categories must have the same length T, got {assignments.shape[0]} "
            f"and {categories.shape[0]}"
        )
    # [eq:30]
    return xp.matmul(xp.matrix_transpose(_one_hot(xp, assignments, k)), _one_hot(xp, categories, c))
    # [/eq:30]


def _check_counts(xp: Any, counts: Array) -> None:
    if not xp.isdtype(counts.dtype, ("integral", "real floating")):
        raise TypeError(f"counts must have an integer or real floating dtype, got {counts.dtype}")
    if counts.ndim != 2:
        raise ValueError(f"counts must have shape (K, C), got shape {tuple(counts.shape)}")
    if counts.shape[0] < 1 or counts.shape[1] < 1:
        raise ValueError(f"counts must have K >= 1 and C >= 1, got shape {tuple(counts.shape)}")
    if not bool(xp.all(counts >= 0)):
        raise ValueError(f"counts must be non-negative, got min {float(xp.min(counts))}")
    if not float(xp.sum(counts)) > 0:
        raise ValueError("counts must hold at least one token (T = Σ n_kc > 0), got T = 0")


def _as_float_counts(xp: Any, counts: Array) -> Array:
    _check_counts(xp, counts)
    if xp.isdtype(counts.dtype, "integral"):
        return xp.astype(counts, xp.float64)
    return counts


def component_purity(counts: Array) -> Array:
    """Per-component purity max_c n_kc / n_k (Eq. 31).

    ``counts``: ``(K, C)`` contingency table (:func:`contingency_counts`), integer
    or real floating. Returns shape ``(K,)`` (float64 for integer counts, else the
    counts' dtype). Components with n_k = 0 get NaN (purity is undefined there).
    Raises ``ValueError`` for a table that is not 2-D, is negative or empty.
    """
    xp = namespace(counts=counts)
    n = _as_float_counts(xp, counts)
    # [eq:31]
    n_k = xp.sum(n, axis=1)
    used = n_k > 0
    ratio = xp.max(n, axis=1) / xp.where(used, n_k, xp.ones_like(n_k))
    return xp.where(used, ratio, xp.full_like(ratio, math.nan))
    # [/eq:31]


def weighted_purity(counts: Array) -> Array:
    """Weighted purity Σ_{k: n_k>0} (n_k / T) purity(k) = Σ_k max_c n_kc / T (Eq. 32).

    ``counts``: ``(K, C)``. Returns a 0-d array (float64 for integer counts). It is
    at least the majority baseline max_c n_c / T and at most 1. Raises as
    :func:`component_purity`.
    """
    xp = namespace(counts=counts)
    n = _as_float_counts(xp, counts)
    # [eq:32]
    n_k = xp.sum(n, axis=1)
    used = n_k > 0
    zeros = xp.zeros_like(n_k)
    purity = xp.where(used, component_purity(n), zeros)  # NaN rows (n_k = 0) are left out
    return xp.sum(xp.where(used, n_k * purity, zeros)) / xp.sum(n_k)
    # [/eq:32]


def mutual_information(counts: Array) -> Array:
    """Mutual information I(Z;C) = Σ_kc p(k,c) log[p(k,c) / (p(k) p(c))] in nats (Eq. 33).

    ``counts``: ``(K, C)``, with p(k,c) = n_kc / T. Cells with n_kc = 0 contribute 0.
    Returns a 0-d array (float64 for integer counts), ≥ 0 up to rounding. Raises as
    :func:`component_purity`.
    """
    xp = namespace(counts=counts)
    n = _as_float_counts(xp, counts)
    # [eq:33]
    t = xp.sum(n)
    n_k = xp.sum(n, axis=1, keepdims=True)
    n_c = xp.sum(n, axis=0, keepdims=True)
    positive = n > 0
    ones = xp.ones_like(n)
    # log[p(k,c) / (p(k) p(c))] = log[n_kc T / (n_k n_c)]; n_k, n_c > 0 wherever n_kc > 0.
    denom = xp.where(positive, n_k * n_c, ones)  # no 0/0 in empty cells
    ratio = xp.where(positive, n * t / denom, ones)
    return xp.sum(xp.where(positive, n * xp.log(ratio), xp.zeros_like(n))) / t
    # [/eq:33]


def normalized_mutual_information(counts: Array) -> Array:
    """Normalised mutual information I(Z;C) / min{H(Z), H(C)} (Eq. 34).

    ``counts``: ``(K, C)``; H(Z), H(C) are the entropies (nats) of the row and column
    marginals. Returns a 0-d array (float64 for integer counts) in [0, 1] up to
    rounding. When min{H(Z), H(C)} = 0 (a single category, or a single used
    component) I(Z;C) = 0 too and NMI is defined as 0. Raises as
    :func:`component_purity`.
    """
    xp = namespace(counts=counts)
    n = _as_float_counts(xp, counts)
    # [eq:34]
    t = xp.sum(n)
    h_z = _entropy_nats(xp, xp.sum(n, axis=1) / t)
    h_c = _entropy_nats(xp, xp.sum(n, axis=0) / t)
    denom = xp.minimum(h_z, h_c)
    mi = mutual_information(n)
    has = denom > 0
    return xp.where(has, mi / xp.where(has, denom, xp.ones_like(denom)), xp.zeros_like(mi))
    # [/eq:34]


# --------------------------------------------------------------------------- permutation baseline


@dataclass(frozen=True)
class PermutationBaseline:
    """Permutation baseline of App. F.3 (see :func:`permutation_baseline`).

    ``purity`` and ``mutual_information`` hold the per-permutation values (NumPy
    float64, shape ``(n_permutations,)``); the means and sample standard deviations
    (``ddof=1``) summarise them.
    """

    n_permutations: int
    purity_mean: float
    purity_std: float
    mutual_information_mean: float
    mutual_information_std: float
    purity: np.ndarray
    mutual_information: np.ndarray


def permutation_baseline(
    assignments: Array,
    categories: Array,
    *,
    n_permutations: int = 100,
    seed: int | np.random.Generator | None = None,
    n_components: int | None = None,
    n_categories: int | None = None,
) -> PermutationBaseline:
    """Permutation baseline of App. F.3: shuffle the categories, keep the assignments.

    For each permutation j the category codes are reordered as
    ``categories[perm_j]``, where ``perm_j = rng.permutation(T)`` is drawn in order
    j = 0, 1, … from ``rng = numpy.random.default_rng(seed)``. This keeps both
    marginals (the counts n_k and n_c) and destroys their association; weighted
    purity (Eq. 32) and I(Z;C) (Eq. 33) are recomputed for every permutation.

    Parameters
    ----------
    assignments, categories : integer arrays, shape ``(T,)``, one namespace
        As in :func:`contingency_counts`.
    n_permutations : int
        Number of permutations, ≥ 2 (the standard deviation uses ``ddof=1``).
    seed : int, numpy.random.Generator or None
        Seed or generator for the permutations; the same seed gives the same result.
        The permutations are drawn on the host with NumPy (the array API has no
        random numbers) and moved to the arrays' namespace and device.
    n_components, n_categories : int, optional
        As in :func:`contingency_counts`.

    Returns
    -------
    PermutationBaseline
        Means, sample standard deviations and the per-permutation values.

    Raises
    ------
    TypeError, ValueError
        As :func:`contingency_counts`; ``ValueError`` if ``n_permutations`` < 2.
    """
    xp = namespace(assignments=assignments, categories=categories)
    if isinstance(n_permutations, bool) or not isinstance(n_permutations, int):
        raise TypeError(f"n_permutations must be an integer >= 2, got {n_permutations!r}")
    if n_permutations < 2:
        raise ValueError(f"n_permutations must be an integer >= 2, got {n_permutations!r}")
    # Validates both arrays and fixes K, C so every permutation uses the same table shape.
    observed = contingency_counts(
        assignments, categories, n_components=n_components, n_categories=n_categories
    )
    k, c = observed.shape
    t = categories.shape[0]
    rng = np.random.default_rng(seed)
    dev = array_api_compat.device(categories)
    purity = np.empty(n_permutations, dtype=np.float64)
    mi = np.empty(n_permutations, dtype=np.float64)
    for j in range(n_permutations):
        perm = xp.asarray(rng.permutation(t).astype(np.int64), device=dev)  # host RNG -> namespace
        shuffled = xp.take(categories, perm, axis=0)
        counts = contingency_counts(assignments, shuffled, n_components=k, n_categories=c)
        purity[j] = float(weighted_purity(counts))
        mi[j] = float(mutual_information(counts))
    return PermutationBaseline(
        n_permutations=n_permutations,
        purity_mean=float(np.mean(purity)),
        purity_std=float(np.std(purity, ddof=1)),
        mutual_information_mean=float(np.mean(mi)),
        mutual_information_std=float(np.std(mi, ddof=1)),
        purity=purity,
        mutual_information=mi,
    )


# --------------------------------------------------------------------------- report


@dataclass(frozen=True)
class DiagnosticsReport:
    """All §5.4 diagnostics at once (:func:`diagnostics_report`); scalars are Python floats.

    ``usage`` is p_k (Eq. 25) as a NumPy array of shape ``(K,)``. The category-based
    fields (``weighted_purity`` … ``permutation``) are ``None`` when no categories were
    given; ``permutation`` is ``None`` when ``n_permutations`` = 0.
    ``n_active_components`` counts components with at least one hard assignment;
    ``majority_baseline`` is max_c n_c / T (the paper's footnote 19).
    """

    n_tokens: int
    n_components: int
    usage: np.ndarray
    usage_entropy: float
    token_entropy: float
    mean_max_responsibility: float
    n_active_components: int
    weighted_purity: float | None = None
    mutual_information: float | None = None
    normalized_mutual_information: float | None = None
    majority_baseline: float | None = None
    permutation: PermutationBaseline | None = None


def _to_host(a: Array) -> np.ndarray:
    """Copy an array of any namespace to NumPy (report output only)."""
    if isinstance(a, np.ndarray):
        return a
    if hasattr(a, "get") and type(a).__module__.startswith("cupy"):
        return a.get()
    if type(a).__module__.startswith("torch"):
        return a.detach().cpu().numpy()
    return np.asarray(np.from_dlpack(a))


def diagnostics_report(
    gamma_q: Array,
    categories: Array | None = None,
    *,
    n_permutations: int = 0,
    seed: int | np.random.Generator | None = None,
    n_categories: int | None = None,
    check_finite: bool = True,
    check_simplex: bool = True,
) -> DiagnosticsReport:
    """Compute Eqs. 24–34 and (optionally) the App. F.3 permutation baseline at once.

    Parameters
    ----------
    gamma_q : array, shape ``(S, H, L, K)`` or ``(T, K)``
        Responsibilities (see :func:`token_responsibilities`).
    categories : integer array, shape ``(T,)``, optional
        Category codes in token order t = s·L + ℓ. Without it only Eqs. 24–29 are
        reported.
    n_permutations : int
        0 (default) for no baseline, else ≥ 2 permutations (:func:`permutation_baseline`).
    seed : int, numpy.random.Generator or None
        Seed for the permutations.
    n_categories : int, optional
        C; default ``max(categories) + 1``.
    check_finite, check_simplex : bool
        As in :func:`head_average`.

    Returns
    -------
    DiagnosticsReport

    Raises
    ------
    TypeError, ValueError
        As the individual diagnostics; ``ValueError`` if ``categories`` does not have
        length T, ``n_permutations`` is 1 or negative, or ``n_permutations`` > 0
        without ``categories``.
    """
    xp = namespace(gamma_q=gamma_q, categories=categories)
    g = token_responsibilities(gamma_q, check_finite=check_finite, check_simplex=check_simplex)
    t, k = g.shape
    kw = {"check_finite": False, "check_simplex": False}
    z = hard_assignments(g, **kw)
    active = xp.sum(xp.astype(xp.sum(_one_hot(xp, z, k), axis=0) > 0, xp.int64))
    fields: dict[str, Any] = {
        "n_tokens": int(t),
        "n_components": int(k),
        "usage": _to_host(marginal_usage(g, **kw)),
        "usage_entropy": float(usage_entropy(g, **kw)),
        "token_entropy": float(token_entropy(g, **kw)),
        "mean_max_responsibility": float(mean_max_responsibility(g, **kw)),
        "n_active_components": int(active),
    }
    if isinstance(n_permutations, bool) or not isinstance(n_permutations, int):
        raise TypeError(f"n_permutations must be 0 or an integer >= 2, got {n_permutations!r}")
    if n_permutations < 0 or n_permutations == 1:
        raise ValueError(f"n_permutations must be 0 or an integer >= 2, got {n_permutations!r}")
    if n_permutations and categories is None:
        raise ValueError(f"n_permutations={n_permutations} needs categories, got categories=None")
    if categories is not None:
        if categories.ndim != 1 or categories.shape[0] != t:
            raise ValueError(
                f"categories must have shape (T,) = ({t},), got shape {tuple(categories.shape)}"
            )
        counts = contingency_counts(z, categories, n_components=k, n_categories=n_categories)
        fields["weighted_purity"] = float(weighted_purity(counts))
        fields["mutual_information"] = float(mutual_information(counts))
        fields["normalized_mutual_information"] = float(normalized_mutual_information(counts))
        fields["majority_baseline"] = float(xp.max(xp.sum(counts, axis=0))) / t
        if n_permutations:
            fields["permutation"] = permutation_baseline(
                z,
                categories,
                n_permutations=n_permutations,
                seed=seed,
                n_components=k,
                n_categories=counts.shape[1],
            )
    return DiagnosticsReport(**fields)
