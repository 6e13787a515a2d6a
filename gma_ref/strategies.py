"""Hypothesis strategies for GMA inputs, for any array-API namespace.

Built on :mod:`hypothesis.extra.array_api`, so the arrays are drawn directly in
the namespace under test (NumPy ≥ 2, array_api_strict, CuPy, PyTorch via
array-api-compat …)::

    import numpy as np
    from hypothesis import given
    from gma_ref.strategies import gma_inputs
    from gma_ref.testing import assert_gma_close

    @given(gma_inputs(np, dtype="float32"))
    def test_my_kernel(inputs):
        assert_gma_close(my_kernel, **inputs)

Each example is a dict with ``q``, ``k``, ``v``, ``means``, ``omega``,
``prior_logits`` and the options ``causal``, ``eps``, ``eps_sigma`` (and
``d_out`` with ``with_cotangent=True``), ready to be splatted into
:func:`gma_ref.testing.assert_gma_close`. Requires hypothesis (the ``test``
extra); importing :mod:`gma_ref` does not import this module.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.extra.array_api import make_strategies_namespace

__all__ = ["gma_shapes", "gma_inputs"]

_VARIANTS = ("bidirectional", "causal", "cross")


@st.composite
def gma_shapes(
    draw: Any,
    *,
    variant: str | None = None,
    max_batch: int = 2,
    max_heads: int = 2,
    max_tokens: int = 12,
    max_components: int = 6,
    max_d_r: int = 8,
    max_d_v: int = 8,
) -> dict[str, Any]:
    """Draw a variant and the sizes ``B, H, N_q, N_k, K, d_r, d_v`` (all ≥ 1; N_q ≠ N_k allowed for cross)."""
    var = draw(st.sampled_from(_VARIANTS)) if variant is None else variant
    if var not in _VARIANTS:
        raise ValueError(f"variant must be one of {_VARIANTS}, got {var!r}")
    n_q = draw(st.integers(1, max_tokens))
    n_k = draw(st.integers(1, max_tokens)) if var == "cross" else n_q
    return {
        "variant": var, "batch": draw(st.integers(1, max_batch)), "heads": draw(st.integers(1, max_heads)),
        "n_q": n_q, "n_k": n_k, "n_components": draw(st.integers(1, max_components)),
        "d_r": draw(st.integers(1, max_d_r)), "d_v": draw(st.integers(1, max_d_v)),
    }


@st.composite
def gma_inputs(
    draw: Any,
    xp: Any,
    *,
    dtype: str = "float32",
    variant: str | None = None,
    with_cotangent: bool = False,
    scale: float = 3.0,
    **shape_bounds: int,
) -> dict[str, Any]:
    """Draw one set of GMA inputs as arrays of namespace ``xp``.

    Parameters
    ----------
    xp : array-API namespace (``numpy``, ``array_api_strict``, ``cupy`` …)
    dtype : ``'float64'``, ``'float32'`` or ``'float16'`` (float16 where the namespace has it,
        drawn as float16-representable float32 and cast; the array API has no bfloat16)
    variant : ``'bidirectional'``, ``'causal'``, ``'cross'`` or ``None`` (drawn)
    with_cotangent : bool
        Also draw ``d_out`` ``(B, H, N_q, d_v)``.
    scale : float
        Routing vectors, means and values lie in [−scale, scale]; ω in [−6, 3]
        (variances from the ε_σ floor to ~3), α in [−3, 3].
    shape_bounds
        ``max_batch``, ``max_heads``, ``max_tokens``, ``max_components``, ``max_d_r``, ``max_d_v``.

    Shapes: q ``(B, H, N_q, d_r)``, k ``(B, H, N_k, d_r)``, v ``(B, H, N_k, d_v)``,
    means/omega ``(H, K, d_r)``, prior_logits ``(H, K)``.
    """
    xps = make_strategies_namespace(xp)
    if dtype not in ("float64", "float32", "float16"):
        raise ValueError(f"dtype must be float64, float32 or float16, got {dtype!r}")
    if dtype == "float16" and not hasattr(xp, "float16"):
        raise ValueError(f"{getattr(xp, '__name__', xp)} has no float16")
    # The array API (and hypothesis.extra.array_api) has no float16: draw float16-representable
    # float32 values and cast.
    dt = xp.float32 if dtype == "float16" else getattr(xp, dtype)
    width = {"float64": 64, "float32": 32, "float16": 16}[dtype]
    s = draw(gma_shapes(variant=variant, **shape_bounds))

    def arr(shape: tuple[int, ...], lo: float, hi: float) -> Any:
        elems = st.floats(lo, hi, width=width, allow_nan=False, allow_infinity=False, allow_subnormal=False)
        a = draw(xps.arrays(dt, shape, elements=elems))
        return xp.astype(a, xp.float16) if dtype == "float16" else a

    b, h, kk, d_r, d_v = s["batch"], s["heads"], s["n_components"], s["d_r"], s["d_v"]
    out: dict[str, Any] = {
        "q": arr((b, h, s["n_q"], d_r), -scale, scale),
        "k": arr((b, h, s["n_k"], d_r), -scale, scale),
        "v": arr((b, h, s["n_k"], d_v), -scale, scale),
        "means": arr((h, kk, d_r), -scale, scale),
        "omega": arr((h, kk, d_r), -6.0, 3.0),
        "prior_logits": arr((h, kk), -3.0, 3.0),
        "causal": s["variant"] == "causal",
        "eps": draw(st.sampled_from((1e-6, 1e-6, 1e-3, 1e-12))),
        "eps_sigma": 1e-4,
    }
    if with_cotangent:
        out["d_out"] = arr((b, h, s["n_q"], d_v), -1.0, 1.0)
    return out
