"""Accuracy metric and the per-dtype tolerances of the oracle.

For a tensor T with candidate values a and float64 reference r (evaluated on
the candidate's own rounded inputs), two figures are computed:

* the **norm error** e = ‖a − r‖₂ / (max(‖r‖₂, √n · f_T) + ‖G_T‖₂ / ν), the RMS error ratio,
  with f_T the tensor's cancellation-free scale (:mod:`gma_ref.testing.core.reference`);
* the **element error** e_∞ = max_i |a_i − r_i| / (|r_i| + s_T + G_T,i / ν), s_T = max(RMS(r), f_T):
  a relative error for large elements and an absolute one, at the tensor's own
  scale, for elements near 0. Its argmax is the reported worst element.

Both are compared with a bound that scales with the dtype and the problem::

    bound = τ · ν,   ν = u_store + u_acc · κ + t_store · λ

where u_store is the unit roundoff of the dtype under test (2⁻⁵³, 2⁻²⁴, 2⁻¹¹,
2⁻⁸ for float64, float32, float16, bfloat16), u_acc that of the precision a
correct kernel accumulates and evaluates scores in (float64 for float64
inputs, float32 otherwise), κ the score condition factor of the case, t_store
half the smallest subnormal of the dtype (its smallest normal number for a kernel
that declares ``flush_subnormals``) and λ the read condition of the case
(:mod:`gma_ref.testing.core.reference`). τ (``TOLERANCES``) was set at a multiple of the largest value observed for
correct implementations over ≥ 200 generated cases per dtype (see
docs/oracle/metric-and-tolerances.md and :func:`gma_ref.testing.calibration.measure.calibrate`).

**The granularity term G.** The model ``fl(x ∘ y) = (x ∘ y)(1 + δ)``, |δ| ≤ u, behind
u_acc · κ and the floors holds in the normal range only. In general (IEEE arithmetic)

    fl(x ∘ y) = (x ∘ y)(1 + δ) + θ,    |δ| ≤ u,  |θ| ≤ η,

with η the absolute granularity of the precision: half its subnormal spacing with
gradual underflow (the whole spacing is used: :data:`SUBNORMAL_SPACING`), or its
smallest normal number when subnormals are flushed to zero (:data:`SMALLEST_NORMAL`;
the inputs' subnormals are then read as 0 too). θ does not scale with the value, so
it is invisible in ν · scale when the values are large, and it is all there is when
they are tiny: in the backward pass every value is proportional to the cotangent g,
and with g at the subnormal edge (the ``tiny_grad`` regime) the θ of the many
intermediates that fall below the normal range are as large as the values. One θ
introduced at an intermediate y moves a gradient T by |∂T/∂y| θ; over all the
intermediates a correct kernel forms,

    |a_T − r_T| ≤ τ ν · scale_T + G_T,    G_T = η Σ_y |∂T/∂y|   (+ η_store when flushing),

summed linearly (a flush errs towards 0 every time, so the θ need not cancel).
G_T is the cancellation-free magnitude of T (the floors' chain: |Γ|, |v|, |r|, 1/D)
carried from η instead of from the values — the same condition terms as the relative
rounding — elementwise, in units of η_acc (:mod:`gma_ref.testing.core.reference` documents
each step). The intermediates counted are the adjoints the chain rule defines
(∂L/∂num = g/D, ∂L/∂D, ∂L/∂A, ∂L/∂Γ, δ, the terms of the score gradients) and the
products of the cotangent formed *before* the read's division by D (g·v, g·O), whose θ
the division amplifies by 1/D: so the read divided before or after its products, with
or without the shift of Eq. 18, flushed or not, is covered.

A product with the *unnormalised* numerator num = D · O is of size |g| D; forming it
and dividing by D² amplifies its θ by 1/D² rather than 1/D — **amplified underflow**,
fla's normalise backward −Σ(do · o)/D². The textbook induced-weights backward does the
same for one term; its excess over G is a factor ~1/D in one query's ∂L/∂D. The
multiple m = :data:`GRAIN_MULTIPLE` of G is calibrated on a family of correct kernels
that round differently (:mod:`gma_ref.testing.calibration.rounding_family`) at the default ε = 1e-6
(D ≥ 1e-6), where that kernel stays a factor ~2 inside the bound over the default and 200
generated cases (m = 64 leaves it at 0.89 of it in float64; m = 16, which suffices for the
default cases alone, fails one generated case at 3.2×); at fla's ε = 1e-10 (D ≈ 6e-9) the
same form fails it by ~2e2 in float32 (tests/support/planted_impls.py ``FlaNormaliseBackward``).
The line between bounded noise and amplified underflow is thus drawn by m, and
moves with it as 1/m. So the bound is::

    |a − r| ≤ τ (ν · scale + G),   G = m · grain · η_acc (+ η_store when flushing)

i.e. G / ν is added to the scales of both figures. Without flushing, the rounding of
a stored result (η_store / 2) is already inside τ ν t_store / u_store, the scale below
which no tensor is compared.

Both figures must be within their bound, and any non-finite value where the
reference is finite fails outright. NumPy is used for host-side reduction of
the error figures (the arrays themselves stay in the reference namespace).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ..._array import Array

__all__ = [
    "UNIT_ROUNDOFF",
    "UNDERFLOW",
    "TINY_ACC",
    "SMALLEST_NORMAL",
    "SUBNORMAL_SPACING",
    "NU_MAX",
    "TOLERANCES",
    "TF32_UNIT_ROUNDOFF",
    "TF32_TOLERANCE",
    "GRAIN_MULTIPLE",
    "LAYER_TOLERANCES",
    "Tolerance",
    "Comparison",
    "unit_scale",
    "granularity",
    "t_store",
    "compare_tensor",
]

#: Half the smallest subnormal t of each dtype: the absolute error of a stored value that underflows.
UNDERFLOW: dict[str, float] = {
    "float64": 2.0**-1075,
    "float32": 2.0**-150,
    "float16": 2.0**-25,
    "bfloat16": 2.0**-134,
}

#: Smallest normal number of the precision a correct kernel computes in (float64 for float64 inputs, float32
#: otherwise): below it an intermediate (a score gradient δ for a tiny cotangent) is held only to an absolute
#: t = u · tiny, which the gradient floors account for (:func:`gma_ref.testing.core.reference.reference`).
TINY_ACC: dict[str, float] = {"float64": 2.0**-1022, "float32": 2.0**-126, "float16": 2.0**-126,
                              "bfloat16": 2.0**-126}

#: Spacing of the subnormal numbers of each dtype (its smallest subnormal): the granularity of a kernel that keeps
#: subnormals (one rounding errs by half of it; the whole spacing is used, since half of float64's is not a float64).
SUBNORMAL_SPACING: dict[str, float] = {
    "float64": 2.0**-1074,
    "float32": 2.0**-149,
    "float16": 2.0**-24,
    "bfloat16": 2.0**-133,
}

#: Smallest normal number of each dtype: what a value below it loses when the kernel flushes subnormals to 0.
SMALLEST_NORMAL: dict[str, float] = {
    "float64": 2.0**-1022,
    "float32": 2.0**-126,
    "float16": 2.0**-14,
    "bfloat16": 2.0**-126,
}

#: Unit roundoff u = 2^-p of each dtype (p = significand bits including the implicit one), i.e. half of ε_mach.
UNIT_ROUNDOFF: dict[str, float] = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
}


#: Largest ν at which a case is checked: beyond it the dtype cannot resolve the case to better than
#: ~1 % (first-order error analysis breaks down), so the case is skipped and listed, never passed.
NU_MAX: float = 2.0**-7


@dataclass(frozen=True)
class Tolerance:
    """Multipliers τ of ν for the norm error and the element error of one dtype."""

    norm: float
    elem: float


#: τ per dtype (norm error, element error), in units of ν = u_store + u_acc·κ. See docs/oracle/metric-and-tolerances.md.
TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(norm=64.0, elem=64.0),
    "float32": Tolerance(norm=16.0, elem=64.0),
    "float16": Tolerance(norm=16.0, elem=64.0),
    "bfloat16": Tolerance(norm=8.0, elem=128.0),
}


#: Unit roundoff of a TF32 operand (10 mantissa bits plus the implicit one): what a float32 matrix product with
#: TF32 products (``Declaration(tf32=True)``, or probed) rounds its operands to. It is added to ν (:func:`unit_scale`).
TF32_UNIT_ROUNDOFF: float = 2.0**-11

#: τ of float32 checks with TF32 products, in units of ν = u_store + u_tf32 + u_acc·κ + t_store·λ: 8× the largest
#: error/ν of the correct float32 kernels with TF32-rounded matrix operands
#: (gma_ref.testing.calibration.emulated.NumpyKernel
#: and the rounding family with ``tf32=True``) over the default and 200 generated cases, rounded up to a power of two
#: (docs/oracle/metric-and-tolerances.md, "TF32 products").
TF32_TOLERANCE: Tolerance = Tolerance(norm=16.0, elem=128.0)


#: Multiple m of the propagated granularity allowance (G = m · grain · η_acc): the smallest power of two that leaves
#: every correct kernel of gma_ref.testing.calibration.rounding_family below 1/2 of the threshold over the default and
#: 200
#: generated cases of float64, float32 and bfloat16 (docs/oracle/metric-and-tolerances.md, "The tolerance table
#: and how it was derived").
GRAIN_MULTIPLE: float = 128.0


#: τ per dtype for layer mode (``check(..., mode='layer')``): the larger of :data:`TOLERANCES` and 8× the largest
#: error/ν measured for correct layers over ≥ 200 layer cases (rounded up to a power of two).
#: See docs/oracle/layer-mode.md.
LAYER_TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(norm=64.0, elem=64.0),
    "float32": Tolerance(norm=16.0, elem=64.0),
    "float16": Tolerance(norm=32.0, elem=64.0),
    "bfloat16": Tolerance(norm=16.0, elem=128.0),
}


def unit_scale(dtype: str, kappa: float, read_condition: float = 0.0, proj_condition: float = 0.0,
               flush_subnormals: bool = False, tf32: bool = False) -> float:
    """ν = u_store + u_acc · κ + t_store · λ (+ u_store · κ_P in layer mode) for ``dtype``.

    κ is the score condition factor, λ the read condition and κ_P the projection
    condition factor of a layer case (the routing vectors X W are formed by the
    candidate and stored at its precision; 0 in the attention mode). With
    ``flush_subnormals`` a stored value below the normal range loses all of it, so
    t_store is the smallest normal number instead of half the smallest subnormal. With ``tf32``
    (float32 only: TF32 rounds float32 operands) the operands of the matrix products (Γ, V, the
    state, the adjoints of the read) hold 11 significant bits: ν gains u_tf32 =
    :data:`TF32_UNIT_ROUNDOFF`, not amplified by κ (the scores are elementwise, not products).
    """
    u_store = UNIT_ROUNDOFF[dtype]
    u_acc = UNIT_ROUNDOFF["float64"] if dtype == "float64" else UNIT_ROUNDOFF["float32"]
    if tf32 and dtype == "float32":
        u_store += TF32_UNIT_ROUNDOFF
    return (u_store + u_acc * max(float(kappa), 1.0) + t_store(dtype, flush_subnormals) * float(read_condition)
            + u_store * float(proj_condition))


def t_store(dtype: str, flush_subnormals: bool = False) -> float:
    """Absolute error of a stored value below the normal range: half the smallest subnormal, or (flushed) the
    smallest normal number. Raises ``KeyError`` for an unknown dtype."""
    return SMALLEST_NORMAL[dtype] if flush_subnormals else UNDERFLOW[dtype]


def granularity(dtype: str, flush_subnormals: bool = False) -> tuple[float, float]:
    """(η_store, η_acc): the absolute error of one rounding at the bottom of ``dtype`` and of its compute precision.

    Rounding to nearest in the subnormal range errs by at most half the subnormal
    spacing (:data:`SUBNORMAL_SPACING`, used whole); a kernel that flushes subnormals to
    0 (and reads subnormal inputs as 0) errs by up to the smallest normal number
    (:data:`SMALLEST_NORMAL`). The compute precision is float64 for float64 and
    float32 otherwise. Raises ``KeyError`` for an unknown dtype.
    """
    table = SMALLEST_NORMAL if flush_subnormals else SUBNORMAL_SPACING
    return table[dtype], table["float64" if dtype == "float64" else "float32"]


@dataclass
class Comparison:
    """Result of comparing one tensor: both error figures, their bounds, the worst element."""

    tensor: str
    norm_error: float
    norm_bound: float
    elem_error: float
    elem_bound: float
    worst_index: tuple[int, ...] | None
    worst_actual: float | None
    worst_expected: float | None
    nonfinite: int
    passed: bool

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        d = asdict(self)
        d["worst_index"] = list(self.worst_index) if self.worst_index is not None else None
        return d


def _to_host(a: Array) -> Any:
    import numpy as np

    if type(a).__module__.startswith("cupy"):
        return a.get()
    return np.asarray(a, dtype=np.float64)


def _norm(a: Any) -> float:
    """‖a‖₂ of a host float64 array, scaled by max |a| first: never 0 for a nonzero array (no underflow)."""
    import numpy as np

    m = float(np.max(np.abs(a))) if a.size else 0.0
    if m == 0.0 or not math.isfinite(m):
        return m
    return m * math.sqrt(float(np.sum((a / m) ** 2)))


def compare_tensor(
    name: str,
    actual: Array,
    expected: Array,
    *,
    dtype: str,
    kappa: float = 1.0,
    read_condition: float = 0.0,
    floor: float = 0.0,
    tolerance: Tolerance | None = None,
    proj_condition: float = 0.0,
    grain: Any = 0.0,
    flush_subnormals: bool = False,
    tf32: bool = False,
) -> Comparison:
    """Compare ``actual`` with the float64 reference ``expected`` (same shape, same namespace).

    ``dtype`` names the dtype under test (a key of :data:`TOLERANCES`), ``kappa`` the
    case's score condition factor, ``read_condition`` its λ, ``floor`` the tensor's cancellation-free scale.
    ``tolerance`` overrides the calibrated τ; ``proj_condition`` is κ_P of a layer case. ``grain`` is the
    absolute error a correct kernel may make in the tensor from the granularity of floating point, in
    units of η_acc (a float, or an array of the tensor's shape:
    :attr:`~gma_ref.testing.core.reference.Reference.grains`): G = m · grain · η_acc (+ η_store with
    ``flush_subnormals``: a stored result below the normal range may be 0), with m = :data:`GRAIN_MULTIPLE`
    and η_store, η_acc from :func:`granularity`. ``tf32`` (a float32 tensor from TF32 products) adds
    :data:`TF32_UNIT_ROUNDOFF` to ν and takes, unless ``tolerance`` is given, τ = :data:`TF32_TOLERANCE`.
    The error is then bounded by τ (ν · scale + G), i.e. G / ν is added to the scales of both
    figures. Returns
    :class:`Comparison`; a shape mismatch raises ``ValueError``.
    """
    import numpy as np

    if tuple(actual.shape) != tuple(expected.shape):
        raise ValueError(f"{name}: shape {tuple(actual.shape)} does not match the reference {tuple(expected.shape)}")
    tf32 = tf32 and dtype == "float32"
    tol = tolerance if tolerance is not None else (TF32_TOLERANCE if tf32 else TOLERANCES[dtype])
    nu = unit_scale(dtype, kappa, read_condition, proj_condition, flush_subnormals, tf32)
    a, r = _to_host(actual), _to_host(expected)
    eta_store, eta_acc = granularity(dtype, flush_subnormals)
    units = np.broadcast_to(_to_host(grain) if hasattr(grain, "shape") else np.float64(grain), r.shape)
    # G / ν, formed without subnormal products. Without flushing, the rounding of the stored result (η_store / 2) is
    # already within τ ν · t_store / u_store, the scale below which no tensor is compared (below)
    grain_nu = GRAIN_MULTIPLE * units * (eta_acc / nu) + (eta_store / nu if flush_subnormals else 0.0)
    n = r.size
    if n == 0:
        return Comparison(name, 0.0, tol.norm * nu, 0.0, tol.elem * nu, None, None, None, 0, True)
    ref_finite = np.isfinite(r)
    bad = ref_finite & ~np.isfinite(a)
    nonfinite = int(bad.sum())
    diff = np.where(ref_finite, a - r, 0.0)
    diff = np.where(bad, np.inf, diff)
    # a value stored in the dtype under test errs by up to t_store in absolute terms (a subnormal or a
    # flushed 0), i.e. by u_store relative to t_store / u_store (the smallest normal number): no tensor is
    # compared at a scale below that
    floor = max(float(floor), UNDERFLOW[dtype] / UNIT_ROUNDOFF[dtype])
    r0 = np.where(ref_finite, r, 0.0)
    ref_norm = _norm(r0)
    tiny = float(np.finfo(np.float64).smallest_subnormal)
    # the granularity allowance G (absolute) enters as G / ν on top of each scale: |a − r| ≤ τ (ν · scale + G)
    scale_norm = max(ref_norm, math.sqrt(n) * floor, tiny) + _norm(grain_nu)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        norm_error = _norm(diff) / scale_norm
        s_t = max(ref_norm / math.sqrt(n), floor, tiny)
        elem = np.abs(diff) / (np.abs(r0) + s_t + grain_nu)
    flat = int(np.argmax(elem))
    idx = tuple(int(i) for i in np.unravel_index(flat, r.shape))
    elem_error = float(elem.reshape(-1)[flat])
    norm_bound, elem_bound = tol.norm * nu, tol.elem * nu
    passed = nonfinite == 0 and norm_error <= norm_bound and elem_error <= elem_bound
    if math.isnan(norm_error) or math.isnan(elem_error):
        passed = False
    return Comparison(
        tensor=name, norm_error=norm_error, norm_bound=norm_bound, elem_error=elem_error, elem_bound=elem_bound,
        worst_index=idx, worst_actual=float(a.reshape(-1)[flat]), worst_expected=float(r.reshape(-1)[flat]),
        nonfinite=nonfinite, passed=passed,
    )
