"""pytest-friendly assertion: one implementation call on given inputs, checked against the reference."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..calling.adapters import device_name, dtype_name, reference_namespace, to_reference
from ..core.compare import NU_MAX, TINY_ACC, UNDERFLOW, Tolerance, compare_tensor, unit_scale
from ..core.reference import GRAD_NAMES, INPUT_NAMES, reference

__all__ = ["assert_gma_close"]


def assert_gma_close(
    impl: Callable[..., Any],
    q: Any,
    k: Any,
    v: Any,
    means: Any,
    omega: Any,
    prior_logits: Any,
    *,
    causal: bool = False,
    eps: float = 1e-6,
    eps_sigma: float = 1e-4,
    d_out: Any = None,
    vjp: Callable[..., dict[str, Any]] | None = None,
    tolerance: Tolerance | None = None,
    **options: Any,
) -> None:
    """Assert that ``impl`` matches the float64 reference on these inputs (output and, with ``vjp``, gradients).

    The inputs are arrays of the implementation's own kind (NumPy, PyTorch,
    JAX, CuPy, array_api_strict); the reference runs on them upcast to float64
    (NumPy, or CuPy for CUDA arrays), so input rounding is not blamed on
    ``impl``. The tolerance is the calibrated one of the inputs' dtype
    (:data:`~gma_ref.testing.core.compare.TOLERANCES`). ``vjp(q, k, v, means, omega,
    prior_logits, d_out, **options)`` (e.g. :func:`~gma_ref.testing.torch_autograd`)
    enables the gradient comparison; ``d_out`` defaults to ones. Extra
    ``options`` are passed to ``impl``. Raises ``AssertionError`` listing every
    failing tensor with its worst element; an input too ill-conditioned for its
    dtype (ν > NU_MAX) raises ``AssertionError`` only if the output is not finite
    (use ``hypothesis.assume`` on :func:`~gma_ref.testing.core.reference` to skip those).
    """
    inputs = dict(zip(INPUT_NAMES, (q, k, v, means, omega, prior_logits), strict=True))
    dtype = dtype_name(q)
    device = device_name(q)
    xp = reference_namespace("cuda" if device == "cuda" else "cpu")
    ref_in = {n: to_reference(a, xp) for n, a in inputs.items()}
    opts = {"causal": causal, "eps": eps, "eps_sigma": eps_sigma, **options}
    out = impl(*inputs.values(), **opts)
    if isinstance(out, (tuple, list)):
        out = out[0]
    d_ref = None
    if vjp is not None:
        if d_out is None:
            d_out = _ones_like_out(out)
        d_ref = to_reference(d_out, xp)
    ref = reference(xp, ref_in, causal=causal, eps=eps, eps_sigma=eps_sigma, d_out=d_ref,
                    underflow=UNDERFLOW.get(dtype, 0.0),
                    tiny=TINY_ACC.get(dtype, 0.0), grains=True)
    actual = {"out": out}
    if vjp is not None:
        grads = vjp(*inputs.values(), d_out, **opts)
        actual.update({n: grads.get(n) for n in GRAD_NAMES})
    problems = []
    ill = unit_scale(dtype, ref.kappa, ref.read_condition) > NU_MAX if dtype in UNDERFLOW else False
    for name, a in actual.items():
        if a is None:
            problems.append(f"{name}: missing from the vjp result")
            continue
        if tuple(a.shape) != tuple(ref.tensors[name].shape):
            problems.append(f"{name}: shape {tuple(a.shape)}, expected {tuple(ref.tensors[name].shape)}")
            continue
        c = compare_tensor(name, to_reference(a, xp), ref.tensors[name], dtype=dtype if dtype in UNDERFLOW else
                           "float64", kappa=ref.kappa, read_condition=ref.read_condition,
                           floor=ref.floors.get(name, 0.0), tolerance=tolerance, grain=ref.grains.get(name, 0.0))
        if c.nonfinite or (not ill and not c.passed):
            problems.append(
                f"{name}: norm error {c.norm_error:.3g} (bound {c.norm_bound:.3g}), element error "
                f"{c.elem_error:.3g} (bound {c.elem_bound:.3g}) at {list(c.worst_index or ())}: "
                f"{c.worst_actual!r} vs reference {c.worst_expected!r}; {c.nonfinite} NaN/Inf")
    if problems:
        raise AssertionError(f"GMA mismatch ({dtype}, causal={causal}, eps={eps}, eps_sigma={eps_sigma}, "
                             f"kappa={ref.kappa:.3g}):\n  " + "\n  ".join(problems))


def _ones_like_out(out: Any) -> Any:
    import array_api_compat

    xp = array_api_compat.array_namespace(out)
    return xp.ones_like(out)
