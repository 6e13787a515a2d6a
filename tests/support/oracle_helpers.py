"""Helpers shared by the oracle's tests: a declared function, the float32 NumPy kernel, a case's routed mass."""

from __future__ import annotations

import numpy as np

from gma_ref.testing import Declaration
from gma_ref.testing.calibration.emulated import NumpyKernel
from gma_ref.testing.cases.sets import case_arrays


def declared(fn, **decl):
    """``fn`` with ``gma_declaration = Declaration(**decl)`` attached."""
    fn.gma_declaration = Declaration(**decl)
    return fn


K32 = NumpyKernel("float32")
"""The correct NumPy kernel in float32: the base most misbehaving candidates wrap."""


def routed_mass(case):
    """u_i = Σ_j A_ij of every query, float64 on the host."""
    from gma_ref.mixture import log_priors_from_logits, variances_from_omega
    from gma_ref.posterior import responsibilities

    a = case_arrays(case)
    var = variances_from_omega(a["omega"], case.eps_sigma)
    lp = log_priors_from_logits(a["prior_logits"])
    gq, gk = (responsibilities(a[n], a["means"], var, lp) for n in ("q", "k"))
    aff = gq @ np.swapaxes(gk, -1, -2)
    if case.causal:
        aff = aff * np.tril(np.ones((case.n_q, case.n_k)))
    return aff.sum(-1)


TWO_DTYPES = NumpyKernel("float64")
"""The correct NumPy kernel computing in float64, declared for float64 and float32 (outputs in the input's dtype)."""
TWO_DTYPES.gma_declaration = Declaration(dtypes=("float64", "float32"), grad=True, namespace="numpy",
                                         returns_state=False, accepts_chunk_size=True)
